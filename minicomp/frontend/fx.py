"""The torch.fx frontend: capture a Python function or `nn.Module` as a minicomp Graph.

How capture works, and why:

- **An eager tracer first, make_fx with fake tensors where it declines.** Both record
  aten-level ops, a closed and documented set, after PyTorch's own Python decompositions,
  so `nn.LayerNorm`, `F.gelu`, `x.float()`, `masked_fill` and friends all arrive in a
  handful of spellings, and every node carries `meta["val"]`, a tensor with the exact shape
  and dtype aten computed. The eager tracer (`fx_eager.py`) runs the function once on its
  real inputs under a recording dispatch mode. make_fx (`make_fx(fn, tracing_mode="fake",
  _allow_non_fake_inputs=True)` under `torch.no_grad()`) runs it on fake tensors. They
  record the same graph; `tests/test_fx_eager.py` compares the IR of both.
  The eager tracer exists because fake tensors, make_fx and even meta tensors import
  `torch._dynamo` and about 900 modules with it, 3-4 s of a fresh process's first compile
  where bytecode caches are missing. It declines whatever would let a value decide the graph
  or write to the caller's tensors, and make_fx then captures with its exact semantics and
  errors. `capture(..., tracer="fake")` (`MINICOMP_CAPTURE=fake`, via the Target) skips it.
  `torch.fx.symbolic_trace` (Python-level calls, no shapes) and torch.export (heavier and
  stricter) were rejected. Symbolic sizes: make_fx over fake inputs (fx_symbolic.py).
- **functionalize** (`torch.func.functionalize(..., remove="mutations")`) turns the user's
  in-place ops (`y.add_(1)`, `y[:, 0] = 0`) into pure ones. In-place ops that a
  decomposition emits below functionalization (rms_norm's `add_`) are lowered to their
  pure form and the mutated value is rebound (`_Lowering._call`); mutating an input or a view
  is refused with a clear error, so no mutation ever reaches the IR.
- **Interception before decomposition.** A `TorchFunctionMode` is active while tracing. It
  redirects three calls to minicomp's own traceable ops (`torch.library.custom_op`, with
  fake implementations; the eager tracer calls their Python implementations) so they stay
  whole: `F.scaled_dot_product_attention` (which otherwise
  decomposes to a device-specific aten op, `_scaled_dot_product_flash_attention_for_cpu` on
  CPU and others on CUDA) becomes `minicomp::sdpa` -> `composites.attention`; `matmul`/`@`
  (which otherwise becomes expand/view/bmm/view) becomes `minicomp::matmul` -> one batched
  `matmul` node; `F.linear` becomes `minicomp::linear` -> `composites.linear` (matmul + bias
  add at the input's rank, no flattening reshapes). The planner then sees the shapes the user
  wrote.
- **Origins.** The same mode stamps every aten node with the user's frame (the innermost
  frame outside torch, this module and the standard library) through
  `torch.fx.traceback.set_stack_trace`; make_fx's own `record_stack_traces` keeps only frames
  named `forward`, so plain functions would get none. `Node.origin` is `file:line`.
- **Weights are inputs.** Parameters, buffers and tensors read from globals or closures
  arrive as `get_attr` nodes; each becomes a graph input after the function's own arguments,
  named for where it lives (`ln_1.weight`), and `graph.binding` reads it again at every call
  (params.py, binding.py). With `capture(..., freeze=True)` they are constants holding the
  module's tensors, as they once always were, and the binding guards them instead. Tensors
  the function makes itself (`torch.tensor(...)`) are constants either way.
- **No side effects.** Capture refuses in-place writes to the caller's tensors before they
  happen and undoes, then refuses, Python attribute and global writes (effects.py), so a
  refused capture leaves everything as it was.
- **Outputs alias as eager's** (fx_alias.py): `graph.out_alias` says which outputs eager
  returns as an input itself or a view of one.

Lowering: each aten call goes through `fx_ops.LOWERINGS` (registry ops and composites);
anything else, or a call whose lowering does not reproduce aten's shape and dtype exactly,
becomes an `opaque` node that calls the aten op with the captured non-tensor arguments.
Multi-output ops read through `getitem` get one opaque node per output used.

Invariants of the result: inputs are named after the function's parameters, then one per
weight; the graph is pure (no mutation), every node's shape and dtype equal what eager
PyTorch produces, and nodes that do not feed an output are removed.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import networkx as nx
import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from minicomp.errors import CaptureRefused, MinicompError
from minicomp.frontend import fx_ops, fx_ops_indexing
from minicomp.frontend.binding import Binding
from minicomp.frontend.effects import Snapshot, refusal
from minicomp.frontend.fx_alias import AtenCall, _Slot, check_mutation, functional_variant, output_aliases
from minicomp.frontend.fx_table import Ctx, T, Unmapped
from minicomp.frontend.fx_ops_shapes import lower_sdpa
from minicomp.frontend.fx_trace import (LINEAR, MATMUL, SDPA, def_origin, describe, input_names, origin_of,
                                        trace)
from minicomp.frontend.fx_symbolic import Symbols, no_symbols, shape_of
from minicomp.frontend.params import Walk, distinct, walk
from minicomp.frontend.ran import recorded
from minicomp.ir.graph import Graph

# minicomp's traced stand-ins lower like the calls they stand for
fx_ops.register(SDPA, lower_sdpa)
fx_ops.register(MATMUL, fx_ops.LOWERINGS[torch.ops.aten.mm.default])
fx_ops.register(LINEAR, fx_ops.LOWERINGS[torch.ops.aten.linear.default])

# --------------------------------------------------------------------------- lowering


@dataclass
class _Multi:
    """A multi-output op's lowering: ids per output (None: compute with an opaque node if read)."""
    node: fx.Node
    items: list[int | None]


def _opaque(g: Graph, node: fx.Node, target: Any, args: tuple, kwargs: dict, output: int | None,
            origin: str | None) -> int:
    """An opaque node computing `target(*args, **kwargs)` (output `output` of it, if given)."""
    operands: list[int] = []

    def slot(a):
        if isinstance(a, T):
            operands.append(a.id)
            return _Slot(len(operands) - 1)
        if isinstance(a, _Multi):
            raise MinicompError(f"{origin or node.name}: {node.target} takes the tuple result of another op")
        return a

    call = AtenCall(target, fx.node.map_aggregate(args, slot), fx.node.map_aggregate(kwargs, slot), output)
    fx.node.map_aggregate((call.args, call.kwargs), no_symbols)   # an aten call takes ints, not Exprs
    val = node.meta.get("val")
    if output is not None:
        val = val[output]
    if not isinstance(val, torch.Tensor):
        raise CaptureRefused(f"{origin or node.name}: cannot capture {node.target}: it returns "
                            f"{type(val).__name__}, not a tensor")
    return g.add("opaque", *operands, fn=call, target=call.__name__, out_shape=shape_of(g, val),
                 out_dtype=val.dtype, origin=origin)


def _bind(target: Any, args: tuple, kwargs: dict) -> list[Any] | None:
    """Arguments in schema order with defaults filled in; None if they do not fit the schema."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    out, args = [], list(args)
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            return None
    return out


def _matches(g: Graph, nid: Any, val: Any) -> bool:
    return (isinstance(nid, int) and isinstance(val, torch.Tensor) and g.node(nid).shape == shape_of(g, val)
            and g.node(nid).dtype == val.dtype)


def _lower_mapped(g: Graph, node: fx.Node, target: Any, args: tuple, kwargs: dict, origin: str | None):
    """The handler's result if it reproduces aten exactly, else None (the caller goes opaque)."""
    handler = fx_ops.LOWERINGS.get(target)
    bound = _bind(target, args, kwargs) if handler else None
    if bound is None:
        return None
    val = node.meta.get("val")
    try:
        out = handler(Ctx(g, origin, val), *bound)
    except (Unmapped, ValueError, TypeError):  # ValueError: registry inference refused the operands
        return None
    if isinstance(out, list):
        if not isinstance(val, (list, tuple)) or len(val) != len(out):
            return None
        return _Multi(node, [o if o is not None and _matches(g, o, v) else None for o, v in zip(out, val)])
    return T(out) if _matches(g, out, val) else None


# torch.tensor(...) inside the function: a tensor made by the call itself, a true constant
_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def _input_name(label: str) -> str:
    """A weight input's name: its label (`ln_1.weight`), with anything unusual replaced."""
    return label if _SAFE_NAME.match(label) else "w_" + re.sub(r"[^A-Za-z0-9_.]", "_", label)


class _Lowering:
    def __init__(self, gm: fx.GraphModule, g: Graph, input_names: list[str], input_origin: str | None,
                 found: Walk | None, freeze: bool, device: torch.device | None):
        self.gm, self.g = gm, g
        self.input_names = input_names
        self.input_origin = input_origin
        self.found, self.freeze, self.device = found, freeze, device
        self.env: dict[fx.Node, Any] = {}
        self.constants: dict[int, T] = {}   # id(tensor) -> its node: a tied weight is one input or constant
        self.input_position: dict[fx.Node, int] = {}     # placeholders and weight get_attrs -> graph input
        self.weights: list[tuple[torch.Tensor, str]] = []   # weight inputs, in graph-input order
        self.frozen: list[tuple[torch.Tensor, str]] = []    # weights folded in as guarded constants

    def value(self, a: Any) -> Any:
        return self.env[a] if isinstance(a, fx.Node) else a

    def run(self) -> None:
        nodes = list(self.gm.graph.nodes)
        k = 0
        for node in (n for n in nodes if n.op == "placeholder"):   # the arguments come first
            val = node.meta["val"]
            if isinstance(val, torch.SymInt):     # a size Dynamo passes: a dim, not an input
                self.env[node] = self.g.symbols.dim(val)
                continue
            self.env[node] = T(self.g.add_input(self.input_names[k], shape_of(self.g, val), val.dtype,
                                                origin=self.input_origin))
            self.input_position[node] = k
            k += 1
        for node in nodes:
            if node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                self._outputs(node)

    def _get_attr(self, node: fx.Node) -> None:
        """A tensor read from outside the arguments: a weight input, or a (guarded) constant.

        Weights (parameters, buffers, tensors of globals and closures, any tensor the function
        did not make) are graph inputs, read again at every call; with `freeze` they are
        constants, and the binding guards them. A tensor the function made itself
        (`torch.tensor(...)`) is a plain constant; so is a 0-d CPU tensor read by a function
        of CUDA tensors (eager treats it as a scalar; one input device is the rule).
        """
        tensor = _fetch_attr(self.gm, node.target)
        if id(tensor) not in self.constants:
            src = self.found.sources.get(id(tensor)) if self.found is not None else None
            label = src.label if src is not None else node.target
            fresh = bool(node.users) and all(u.target in _LIFTS for u in node.users)
            elsewhere = tensor.dim() == 0 and self.device is not None and tensor.device != self.device
            if self.found is None or fresh:
                nid = self.g.constant(tensor, label=label, origin=origin_of(node))
            elif self.freeze or elsewhere:
                nid = self.g.constant(tensor, label=label, origin=origin_of(node))
                self.frozen.append((tensor, label))
            else:
                nid = self.g.add_input(_input_name(label), tuple(tensor.shape), tensor.dtype, origin=origin_of(node))
                self.g.node(nid).attrs["label"] = label
                self.weights.append((tensor, label))
            self.constants[id(tensor)] = T(nid)
        if self.g.node(self.constants[id(tensor)].id).op == "input":
            self.input_position[node] = self.g.inputs.index(self.constants[id(tensor)].id)
        self.env[node] = self.constants[id(tensor)]

    def _call(self, node: fx.Node) -> None:
        if isinstance(node.meta.get("val"), torch.SymInt):   # a size (sym_size, size arithmetic): a dim
            self.env[node] = self.g.symbols.dim(node.meta["val"])
            return
        origin = origin_of(node)
        args = fx.node.map_aggregate(node.args, self.value)
        kwargs = fx.node.map_aggregate(node.kwargs, self.value)
        if node.target is operator.getitem:
            self.env[node] = self._getitem(node, args, origin)
            return
        target = node.target
        fx_ops_indexing.refuse_data_dependent(self.g, node, args, origin)   # x[mask]: a clear error
        pure = functional_variant(target)
        if pure is not None:
            check_mutation(node, origin)
            target = pure
        out = _lower_mapped(self.g, node, target, args, kwargs, origin)
        if out is None:
            val = node.meta.get("val")
            if isinstance(val, (list, tuple)):
                out = _Multi(node, [None] * len(val))
            else:
                out = T(_opaque(self.g, node, target, args, kwargs, None, origin))
        self.env[node] = out
        if pure is not None:  # later readers of the mutated tensor see the new value
            self.env[node.args[0]] = out

    def _getitem(self, node: fx.Node, args: tuple, origin: str | None) -> T:
        src, index = args
        if not isinstance(src, _Multi):
            raise MinicompError(f"{origin or node.name}: indexing a non-tuple value is not supported")
        if src.items[index] is None:
            parent = src.node
            p_args = fx.node.map_aggregate(parent.args, self.value)
            p_kwargs = fx.node.map_aggregate(parent.kwargs, self.value)
            target = functional_variant(parent.target) or parent.target
            src.items[index] = _opaque(self.g, parent, target, p_args, p_kwargs, index, origin_of(parent))
        return T(src.items[index])

    def _outputs(self, node: fx.Node) -> None:
        flat, self.g.out_spec = pytree.tree_flatten(node.args[0])
        outs = []
        for item in flat:
            v = self.value(item)
            if not isinstance(v, T):
                raise CaptureRefused(f"{self.g.name} returns {type(v).__name__} ({v!r}); "
                                     "a captured function must return tensors only")
            outs.append(v.id)
        self.g.set_outputs(outs)
        self.g.out_alias = output_aliases(flat, self.input_position)


def _fetch_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _prune(g: Graph) -> None:
    """Drop nodes no output depends on (unused multi-output parts, dead views, stale values)."""
    live = set(g.outputs) | set(g.inputs)
    for o in g.outputs:
        live |= nx.ancestors(g.nx, o)
    for nid in reversed(g.topo_order()):
        if nid not in live:
            g.remove(nid)


def capture(fn_or_module: Callable | nn.Module, example_inputs: Sequence[torch.Tensor], name: str | None = None,
            *, freeze: bool = False, tracer: str = "eager", on_tracer: Callable[[str], None] | None = None) -> Graph:
    """Trace `fn_or_module(*example_inputs)` into a verified-shape minicomp Graph.

    Inputs are named after the function's (or `forward`'s) parameters, followed by one input
    per weight the function read (`ln_1.weight`; see `_Lowering._get_attr`), in order of
    first use. `graph.binding` (a `binding.Binding`) reads those weights again and checks the
    function's Python state at every call (`graph.binding.read()` gives the current weight
    tensors); with `freeze=True` weights are constants instead, guarded by the binding.
    `graph.outputs` are the returned tensors in pytree order, `graph.out_spec` the structure
    that `tree_unflatten` rebuilds from them, `graph.out_alias` how eager's outputs alias the
    inputs (fx_alias.py), `graph.random_ops` the random aten ops it calls (`tracer`: as `trace`).

    No state of the caller's is changed: tensor writes are refused before they happen, and
    Python attribute or global writes are undone and refused (effects.py). Raises
    MinicompError (SourceError at the user's line where one is known) for anything the
    user's code or inputs cause.
    """
    inputs = list(example_inputs)
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            raise MinicompError(f"example input {i} of {describe(fn_or_module)} is {type(t).__name__}; "
                                "capture takes tensors only")
    found = walk(fn_or_module)
    before = Snapshot(found)
    try:
        with recorded() as ran:
            gm, out_spec = trace(fn_or_module, distinct(found, inputs), tracer=tracer, on_tracer=on_tracer)
    finally:
        changes = before.undo()
    if changes:
        raise refusal(describe(fn_or_module), changes)
    # the binding guards what the functions that ran read (ran.py); tensors keep every place found
    guards = walk(fn_or_module, ran=ran) if ran is not None else found
    g = lower(gm, name or describe(fn_or_module), input_names(fn_or_module, len(inputs)),
              def_origin(fn_or_module), found=found, guards=guards, freeze=freeze,
              device=inputs[0].device if inputs else None)
    g.out_spec = out_spec
    return g


def lower(gm: fx.GraphModule, name: str, input_names: Sequence[str] | None = None,
          input_origin: str | None = None, *, found: Walk | None = None, guards: Walk | None = None,
          freeze: bool = False, device: torch.device | None = None) -> Graph:
    """The Graph of an aten-level fx GraphModule (what `trace` returns); capture = trace + lower.

    `graph.out_spec` is the pytree structure of the GraphModule's result: the flat
    `graph.outputs` rebuild it with `torch.utils._pytree.tree_unflatten`. Without `found`
    (a `params.walk` of the traced function) every tensor the GraphModule holds is a
    constant and `graph.binding` is None. `guards` (default `found`) is the walk whose equality
    and identity guards the binding checks (capture's walk of the functions that ran).
    """
    count = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    names = list(input_names) if input_names is not None else [f"arg{i}" for i in range(count)]
    g = Graph(name)
    g.symbols = Symbols()          # PyTorch's SymInts as dims, for graphs traced over symbolic sizes
    lowering = _Lowering(gm, g, names, input_origin, found, freeze, device)
    lowering.run()
    _prune(g)
    g.binding = (Binding.build(found, lowering.weights, lowering.frozen, guards=guards)
                 if found is not None else None)
    g.random_ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                           and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())})
    return g


def call_inputs(g: Graph, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """All the inputs of a captured graph for a call on `args`: them, then its weights as they are now."""
    weights = g.binding.read() if getattr(g, "binding", None) is not None else []
    if weights is None:
        raise MinicompError(f"{g.name}: the state it was captured with has changed; capture it again")
    return list(args) + weights


def opaque_nodes(g: Graph) -> list[str]:
    """`%7 (aten.cumsum.default) from model.py:12` for each opaque node, for the CLI's listing."""
    return [f"%{n.id} ({n.attrs['target']})" + (f" from {n.origin}" if n.origin else "")
            for n in g.nodes() if n.op == "opaque"]

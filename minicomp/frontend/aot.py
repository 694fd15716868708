"""Graphs from AOTAutograd (what `torch.compile(..., backend="minicomp")` is handed), made
ready for `fx.lower`.

AOTAutograd gives the backend a functional aten graph whose placeholders are the user's
tensors, the lifted parameters and buffers, and (with dynamic shapes) SymInts; its outputs
are tensors, and in a training forward also the SymInts and tensors saved for the backward.
`fx.lower` takes tensor placeholders and tensor outputs of concrete shape, so:

- `is_symbolic(example_inputs)`: whether the graph has symbolic sizes. minicomp's IR has
  concrete sizes (a later issue makes it symbolic), so such a graph is compiled once per
  concrete signature it is called with: `specialise(gm, args)` traces it again with make_fx
  on fake copies of the actual arguments, SymInt inputs baked in as the ints they were,
  giving a graph of concrete shapes with only tensor placeholders.
- `split_outputs(gm)`: the graph with only its tensor outputs, and an `OutputLayout` that
  puts the others (ints, None) back at run time.
- `rewrite_sdpa(gm)`: the device-specific SDPA ops that `F.scaled_dot_product_attention`
  decomposes to on CUDA (flash, efficient, cuDNN) become `minicomp::sdpa` when only their
  attention output is read, so they lower to minicomp's attention like the CPU op does;
  where the backward reads their other outputs (logsumexp, seeds) they stay as they are.
- `keep_sdpa(gm, example_inputs)`: before AOTAutograd, on Dynamo's graph, the calls of
  `F.scaled_dot_product_attention` become `minicomp::sdpa` when no gradient is needed.
  AOTAutograd otherwise decomposes the call to whichever kernel PyTorch picks while tracing,
  and with a mask that was the math path: q, k and v cast to fp32, two bmms and a softmax
  (transformers' BERT under Dynamo, H100, PyTorch 2.11), which minicomp then computed as
  such. A custom op has no derivative, so a graph that needs one keeps PyTorch's.
- `host_scalars(gm, example_inputs)` and `bake_scalars(gm, values)`: numbers Dynamo hands
  over as 0-d CPU tensors (a float it does not specialise on; a CPU scalar beside CUDA
  tensors), found on Dynamo's graph with their values, and a copy of AOTAutograd's graph
  with them as constants (`dynamo_run.HostScalars` checks the values at each call).
- `aten_calls(gm)`: the aten calls of a graph (and how many are views), the denominators of
  the backend's "fraction compiled".

Invariant: every function here returns a graph computing exactly what its input computed,
with node `meta["val"]` set on every node `fx.lower` reads.
"""

from __future__ import annotations

import copy
import inspect
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from minicomp.frontend.fx_trace import SDPA, sdpa_call

aten = torch.ops.aten


def is_symbolic(example_inputs: Sequence[Any]) -> bool:
    """True when any example input is a SymInt or a tensor with a symbolic size or stride."""
    for a in example_inputs:
        if isinstance(a, torch.SymInt):
            return True
        if isinstance(a, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in (*a.shape, *a.stride(), a.storage_offset())):
                return True
    return False


def specialise(gm: fx.GraphModule, args: Sequence[Any]) -> tuple[fx.GraphModule, list[int]]:
    """`gm` traced again for the concrete `args` it is being called with: a graph of concrete
    shapes whose placeholders are only the tensor arguments (returned: their positions in
    `args`); int arguments are baked in as the values they have now."""
    from torch.fx.experimental.proxy_tensor import make_fx

    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    fixed = list(args)

    def with_tensors(*tensors: torch.Tensor) -> Any:
        full = list(fixed)
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        return gm(*full)

    tensors = [args[i] for i in tensor_pos]
    with torch.no_grad():
        traced = make_fx(with_tensors, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
    return traced, tensor_pos


def host_scalars(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[int, Any]:
    """The inputs of Dynamo's graph `gm` that are numbers held in 0-d CPU tensors, with their
    values now, by position among the inputs AOTAutograd gives the compiler (after the
    graph's own parameters and buffers). Two kinds:

    - a Python float Dynamo passes as a tensor so as not to specialise on it (its GraphArg's
      `pass_arg_as_tensor`): under dynamic shapes every float a model reads (transformers'
      GPT-2 GELU computes `math.sqrt(2.0 / math.pi)` from one);
    - any 0-d CPU tensor of a graph whose other tensors are on a GPU: PyTorch reads it as a
      number there, and a GPU kernel cannot read CPU memory.

    Left out: a tensor that needs a gradient (its value is not a constant of the graph)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    on_gpu = any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in example_inputs)
    offset = (len(dict(gm.named_parameters(remove_duplicate=False)))
              + len(dict(gm.named_buffers(remove_duplicate=False))))
    found: dict[int, Any] = {}
    for i, (node, a) in enumerate(zip(placeholders, example_inputs)):
        if not (isinstance(a, torch.Tensor) and a.dim() == 0 and a.device.type == "cpu") or a.requires_grad:
            continue
        if not (on_gpu or getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)):
            continue
        try:
            found[offset + i] = a.item()
        except Exception:  # noqa: BLE001 -- a fake tensor has no value: it stays an input
            continue
    return found


def bake_scalars(gm: fx.GraphModule, values: dict[int, Any]) -> tuple[fx.GraphModule, list[int]]:
    """A copy of `gm` in which the placeholders at `values`' positions are constants of those
    values (`aten.scalar_tensor`, in the placeholder's dtype) and no longer inputs; returned
    with the positions of the inputs it still takes."""
    work = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    placeholders = [n for n in work.graph.nodes if n.op == "placeholder"]
    first = next((n for n in work.graph.nodes if n.op != "placeholder"), None)
    for pos, value in values.items():
        node = placeholders[pos]
        dtype = node.meta["val"].dtype
        with work.graph.inserting_before(first):
            const = work.graph.call_function(aten.scalar_tensor.default, (value,), {"dtype": dtype})
        const.meta["val"] = torch.scalar_tensor(value, dtype=dtype)
        node.replace_all_uses_with(const)
        work.graph.erase_node(node)
    work.recompile()
    return work, [i for i in range(len(placeholders)) if i not in values]


@dataclass
class OutputLayout:
    """Where the compiled graph's tensor outputs go among the original graph's outputs."""
    count: int                       # outputs of the original graph
    tensor_pos: list[int]            # positions the compiled outputs fill, in order
    others: dict[int, Any]           # position -> the non-tensor value (int, None) it always is
    # position -> how to compute a size it returns from the call's arguments: a size Dynamo
    # passed in, or arithmetic on such sizes (a symbolic graph returns the sequence length it
    # was given, or that length + 1; transformers' sliding-window models)
    sizes: dict[int, Callable[[Sequence[Any]], int]] = field(default_factory=dict)

    def merge(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        """The original graph's outputs: the compiled `tensors` and the constants (the inputs
        it returns are the caller's to put in: it has the call's arguments)."""
        out: list[Any] = [None] * self.count
        for pos, t in zip(self.tensor_pos, tensors):
            out[pos] = t
        for pos, v in self.others.items():
            out[pos] = v
        return out


def _is_tensor_node(a: Any) -> bool:
    return isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)


def split_outputs(gm: fx.GraphModule) -> tuple[fx.GraphModule, OutputLayout]:
    """`gm` (changed in place) returning only its tensor outputs, as a flat tuple.

    A non-tensor output must be a constant (a concrete graph's ints and Nones): a SymInt
    node would need the graph to compute it, which only a symbolic graph does, and those are
    specialised first."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    result = out_node.args[0]
    flat = list(result) if isinstance(result, (tuple, list)) else [result]
    placeholders = {n: k for k, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    tensor_pos, others, sizes = [], {}, {}
    for i, a in enumerate(flat):
        if _is_tensor_node(a):
            tensor_pos.append(i)
        elif isinstance(a, fx.Node) and (size := _size_of_arguments(a, placeholders)) is not None:
            sizes[i] = size
        elif isinstance(a, fx.Node):
            raise ValueError(f"output {i} of the graph is {a.format_node()} ({type(a.meta.get('val')).__name__}), "
                             "not a tensor or a constant")
        else:
            others[i] = a
    out_node.args = (tuple(flat[i] for i in tensor_pos),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, OutputLayout(len(flat), tensor_pos, others, sizes)


_SIZE_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                              operator.neg})


def _size_of_arguments(node: fx.Node, placeholders: dict[fx.Node, int]) -> Callable[[Sequence[Any]], int] | None:
    """A function of the call's arguments computing the int or SymInt `node` is: an argument
    itself, or `+ - * // %` and negation of arguments and ints. None for anything else."""
    if not isinstance(node.meta.get("val"), (int, torch.SymInt)):
        return None
    if node in placeholders:
        k = placeholders[node]
        return lambda args: args[k]
    if node.op != "call_function" or node.kwargs or node.target not in _SIZE_ARITHMETIC:
        return None
    fn = node.target
    parts = []
    for a in node.args:
        if isinstance(a, fx.Node):
            part = _size_of_arguments(a, placeholders)
            if part is None:
                return None
            parts.append(part)
        elif type(a) is int:
            parts.append(lambda args, v=a: v)
        else:
            return None
    return lambda args: fn(*(p(args) for p in parts))


def carry_sizes(gm: fx.GraphModule, inputs: list[Any]) -> tuple[fx.GraphModule, list[Any], list[int]]:
    """`gm` (changed in place) and its example inputs with each size argument that no tensor
    argument has as a dimension (a sliding-window cache's length: its tensors are the window's)
    taken in through a "carrier", an empty tensor of shape (size, 0), whose dimension the
    compiled module reads as it reads every size. Returns the carriers' positions: the caller
    makes `torch.empty_strided((n, 0), (1, 1))` of each such argument `n` at every call (no
    memory, no launch)."""
    carried = {d.node.expr for a in inputs if isinstance(a, torch.Tensor) for d in a.shape
               if isinstance(d, torch.SymInt)}
    positions = [k for k, a in enumerate(inputs)
                 if isinstance(a, torch.SymInt) and a.node.expr.is_symbol and a.node.expr not in carried]
    fake_mode = torch._guards.detect_fake_mode(inputs) if positions else None
    device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), None)
    if fake_mode is None or device is None:
        return gm, inputs, []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(inputs)
    for k in positions:
        node, size = placeholders[k], inputs[k]
        with fake_mode:
            carrier = torch.empty_strided((size, 0), (1, 1), device=device)
        with gm.graph.inserting_after(node):
            read = gm.graph.call_function(aten.sym_size.int, (node, 0))
        read.meta["val"] = size
        node.replace_all_uses_with(read, delete_user_cb=lambda user: user is not read)
        node.meta["val"] = carrier
        inputs[k] = carrier
    gm.recompile()
    return gm, inputs, positions


# The CUDA SDPA ops F.scaled_dot_product_attention decomposes to; their schemas name the
# mask `attn_bias` (the flash op takes none).
_SDPA_VARIANTS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention")


def _bound(node: fx.Node) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def rewrite_sdpa(gm: fx.GraphModule) -> int:
    """Replace CUDA SDPA calls whose only reader is `getitem(call, 0)` by `minicomp::sdpa`;
    returns how many were replaced (`gm` is changed in place)."""
    variants = {getattr(aten, n).default for n in _SDPA_VARIANTS if hasattr(aten, n)}
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in variants:
            continue
        users = list(node.users)
        if not users or any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
            continue
        a = _bound(node)
        q, k = (a[n].meta.get("val") for n in ("query", "key"))
        # the CUDA kernels take fewer KV heads than query heads as grouped-query attention
        gqa = q is not None and k is not None and q.dim() >= 3 and q.shape[-3] != k.shape[-3]
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(SDPA, (a["query"], a["key"], a["value"], a.get("attn_bias"),
                                                float(a.get("dropout_p", 0.0)), bool(a.get("is_causal", False)),
                                                a.get("scale"), bool(gqa)))
        new.meta = dict(users[0].meta)
        for u in users:
            u.replace_all_uses_with(new)
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


_SDPA_CALL = inspect.signature(sdpa_call)     # F.scaled_dot_product_attention's parameters


def keep_sdpa(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """Replace the `F.scaled_dot_product_attention` calls of Dynamo's graph `gm` by
    `minicomp::sdpa`, unless a gradient may flow through the graph (grad mode on and an input
    that requires grad); returns how many were replaced (`gm` is changed in place). The call's
    arguments bind as the eager tracer's stand-in (`fx_trace.sdpa_call`) takes them; a call
    they do not bind to, or whose flags are graph values (a traced dropout probability), stays."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs):
        return 0
    functional = torch.nn.functional.scaled_dot_product_attention
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not functional:
            continue
        try:
            bound = _SDPA_CALL.bind(*node.args, **node.kwargs)
        except TypeError:
            continue       # names this PyTorch's SDPA has and minicomp::sdpa lacks
        bound.apply_defaults()
        q, k, v, mask, dropout_p, is_causal, scale, gqa = bound.arguments.values()
        if any(isinstance(f, fx.Node) for f in (dropout_p, is_causal, scale, gqa)):
            continue
        node.target, node.kwargs = SDPA, {}
        node.args = (q, k, v, mask, float(dropout_p), bool(is_causal), None if scale is None else float(scale),
                     bool(gqa))
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def aten_calls(gm: fx.GraphModule) -> tuple[int, int]:
    """The calls of aten (and minicomp::) operators in `gm`, what the backend's fraction counts,
    and how many of them are views (no computation: index arithmetic inside kernels)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    views = sum(1 for n in calls if n.target._schema.returns and n.target._schema.returns[0].alias_info is not None
                and not n.target._schema.is_mutable)
    return len(calls), views

"""The eager tracer: capture by running the function once on its real inputs.

Why it exists: make_fx and FakeTensorMode import `torch._dynamo`, and so do meta tensors,
whose kernels are Python references wrapped in `torch._disable_dynamo`. With that import
come sympy, torch.distributed and torch.onnx: about 900 modules. When a process imports them
for the first time, that costs 1.1 s with bytecode caches. Without caches it costs 3-4 s: a
read-only site-packages, like the GPU host's, keeps none. This was most of a fresh process's
first compile of a block.

Real tensors need none of those imports. Running the function once, under `no_grad`, costs
one eager forward: milliseconds on a GPU for the blocks here.

How it works:

- The function runs under `torch.func.functionalize` and `_Recorder`, a `TorchDispatchMode`.
  Every aten call that reaches the Python key runs as usual, after autograd, functionalization
  and PyTorch's decompositions: the same calls make_fx records. The mode records each call
  as a `call_function` node.
- A node's `meta["val"]` is a meta tensor with the result's shape, strides and dtype, so
  intermediates are freed as eagerly as the function frees them.
- The example inputs become placeholders. Other real tensors met as operands become `get_attr`
  nodes holding the tensor itself, one node per tensor object, as make_fx makes them:
  weights, buffers, and tensors closed over or built with `torch.tensor` (fx.py turns the
  first three into weight inputs read at every call).

Running on real values must not let a value decide the graph, or touch what the caller owns.
So the tracer declines (raises `Declined`) before any of these happen:

- a value read: `.item()`, `bool(t)`, `.tolist()`, `.numpy()`, `data_ptr()`, ...;
- an op whose result's shape depends on values (`nonzero`, boolean indexing, ...);
- a random op (eager would draw from the caller's generator);
- an in-place write to an input, a weight or any tensor the function did not make;
- a result it cannot describe.

Any other failure while running (the user's own error, a missing kernel, running out of
memory on a forward whose intermediates do not fit) is treated the same way.

`fx_trace.trace` then captures with make_fx as before. That path is slower to start, but it
has fake tensors' exact semantics and the existing errors for each of these cases. So this
tracer either records the graph make_fx would record, or it declines; it never guesses.
"""

from __future__ import annotations

import collections
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


class Declined(Exception):
    """The eager tracer will not capture this function; capture falls back to make_fx."""


def _plain(t: torch.Tensor) -> bool:
    """A dense tensor (or Parameter) the tracer can stand in for with a meta twin."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


# Tensor methods that hand a tensor's values to Python
_VALUE_READS = {getattr(torch.Tensor, n) for n in (
    "item", "tolist", "numpy", "__array__", "__bool__", "__int__", "__float__", "__index__", "__complex__",
    "data_ptr", "untyped_storage", "storage", "__dlpack__")}
_REFUSED_TAGS = {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output, torch.Tag.nondeterministic_seeded}
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}


def _stamp(node: fx.Node) -> None:
    """The user's frame, which fx_trace's interception mode sets as the current stack trace."""
    stack = fx_traceback.get_current_meta().get("stack_trace")
    if stack:
        node.meta["stack_trace"] = stack


class _NoValueReads(TorchFunctionMode):
    """Declines before the function reads a value (Python sees tensors' values only here)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _VALUE_READS:
            raise Declined(f"the function reads a tensor's value ({func.__name__})")
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    """Runs each aten call and appends it to `graph` (see the module docstring)."""

    def __init__(self, graph: fx.Graph, root: torch.nn.Module, direct: dict[Any, Callable]):
        super().__init__()
        self.graph, self.root, self.direct = graph, root, direct
        self.made: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor the function made -> its node
        self.fixed: dict[int, tuple[fx.Node, torch.Tensor]] = {}  # id(input or constant) -> node, tensor
        self.counts: collections.Counter = collections.Counter()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo, which
        # imports torch._dynamo at the first call: the import this tracer exists to avoid.
        # Nothing here runs under dynamo.
        return False

    def placeholder(self, t: torch.Tensor, name: str) -> None:
        node = self.graph.placeholder(name)
        node.meta["val"] = _meta_like(t)
        self.fixed[id(t)] = (node, t)

    def node_of(self, t: torch.Tensor, *, written: bool = False) -> fx.Node:
        node = self.made.get(t)
        if node is not None:
            return node
        if written:
            raise Declined("an in-place write to an input, a weight or a tensor made outside the function")
        if id(t) not in self.fixed:
            if not _plain(t):
                raise Declined(f"a {type(t).__name__} ({t.layout}) operand")
            kind = "param" if isinstance(t, torch.nn.Parameter) else "tensor"
            name = f"_{kind}_constant{self.counts[kind]}"     # make_fx's names
            self.counts[kind] += 1
            setattr(self.root, name, t)
            node = self.graph.get_attr(name)
            node.meta["val"] = _meta_like(t)
            _stamp(node)
            self.fixed[id(t)] = (node, t)
        return self.fixed[id(t)][0]

    def _check(self, func: Any, args: tuple, kwargs: dict) -> None:
        refused = _REFUSED_TAGS.intersection(func.tags)
        if refused:
            raise Declined(f"{func} ({', '.join(t.name for t in refused)})")
        if func in _INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise Declined(f"{func} with a boolean mask: its result's shape depends on values")
        schema = func._schema
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
                for t in pytree.tree_leaves(value):
                    if isinstance(t, torch.Tensor):
                        self.node_of(t, written=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._check(func, args, kwargs)
        record = lambda a: self.node_of(a) if isinstance(a, torch.Tensor) else a  # noqa: E731
        node = self.graph.call_function(func, tuple(pytree.tree_map(record, list(args))),
                                        pytree.tree_map(record, dict(kwargs)))
        out = self.direct.get(func, func)(*args, **kwargs)
        outs = [out] if isinstance(out, torch.Tensor) else out
        if not isinstance(outs, (tuple, list)) or not all(isinstance(o, torch.Tensor) for o in outs):
            raise Declined(f"{func} returns {type(out).__name__}")
        _stamp(node)
        if isinstance(out, torch.Tensor):
            node.meta["val"] = _meta_like(out)
            self.made[out] = node
            return out
        node.meta["val"] = tuple(_meta_like(o) for o in outs)
        for i, o in enumerate(outs):
            item = self.graph.call_function(operator.getitem, (node, i))
            item.meta["val"] = node.meta["val"][i]
            _stamp(item)
            self.made[o] = item
        return out


def eager_trace(fn: Callable, example_inputs: Sequence[torch.Tensor],
                direct: dict[Any, Callable] | None = None) -> fx.GraphModule:
    """The aten GraphModule of `fn(*example_inputs)`, or `Declined`.

    `fn` must already be wrapped by the caller in functionalize and whatever else it needs
    (no_grad, interception modes). The caller's tensors are read, never written. `direct`
    maps custom ops to the Python functions that implement them. Those functions are called
    as they are, because `torch.library` wraps a custom op's kernels in `torch._disable_dynamo`.
    """
    graph, root = fx.Graph(), torch.nn.Module()
    recorder = _Recorder(graph, root, direct or {})
    for i, t in enumerate(example_inputs):
        if not _plain(t):
            raise Declined(f"input {i} is a {type(t).__name__} ({t.layout})")
        recorder.placeholder(t, f"arg{i}_1")
    with _NoValueReads(), recorder:
        out = fn(*example_inputs)
    graph.output(pytree.tree_map(lambda o: recorder.node_of(o) if isinstance(o, torch.Tensor) else o, out))
    graph.eliminate_dead_code()
    return fx.GraphModule(root, graph)

"""`torch.compile(model, backend="minicomp")`: Dynamo captures, AOTAutograd functionalises,
minicomp compiles each graph it is handed.

    cm = torch.compile(model, backend="minicomp", options={"verify_target": "off"})
    cm(input_ids)
    print(minicomp.backend_report(cm).table())   # graphs, kernels, ops that ran through PyTorch

The backend is registered as the `minicomp` entry point of the `torch_dynamo_backends` group
(pyproject.toml), so the name works after `pip install` with no import. `options` takes the
names `minicomp.compile(**options)` takes. `minicomp.backend(**options)` makes a backend
object of one's own, whose `report()` lists only what it compiled.

How a graph goes through, and why:

- Dynamo does graph breaks, guards and recompiles; what it cannot trace runs in Python
  between graphs. Each graph goes to `aot_autograd`, which functionalises it (in-place
  updates of buffers and inputs, such as a static KV cache, come back as extra outputs and
  AOTAutograd writes them back after the call), lifts parameters and buffers to inputs (so
  weights are read at every call) and decomposes it to aten ops. That aten graph is lowered
  by the same `fx.lower` as minicomp's own capture (`frontend/aot.py` prepares it) and
  compiled by `api.compile_graph`.
- Anything minicomp cannot lower stays an opaque node run by PyTorch; a graph minicomp cannot
  compile at all runs eagerly, with a warning, and its record says why: a model never fails
  because of one op.
- Grad: where a graph needs grad, minicomp compiles AOTAutograd's forward (which also returns
  what the backward saves) and the backward graph runs through PyTorch as traced, so
  gradients are PyTorch's own.
- Symbolic sizes: minicomp's IR has concrete sizes. When Dynamo hands over a graph with
  symbolic sizes (after a shape change it marks dimensions dynamic), the graph is compiled
  once per concrete signature it is called with, keyed by every argument's shape, strides,
  dtype and device and every int argument's value. Global Dynamo settings are left alone.
- Outputs: a result minicomp made an alias of an input or of another output, where the
  graph's own output is not, is copied; a result whose strides differ from the graph's is
  copied into the graph's strides (a backward graph traced on those strides may view it).
  Which outputs need this is worked out at the first call of each compiled graph.
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from minicomp.api import Compiled, Options, compile_graph
from minicomp.dynamo_run import HostScalars, _expected_outputs, _Run
from minicomp.errors import MinicompError
from minicomp.frontend import aot


@dataclass
class GraphRecord:
    """One graph the backend was handed, and what became of it."""
    index: int
    origin: str | None                 # the user line the graph starts at
    mode: str                          # "inference", or "forward" (its backward runs in PyTorch)
    aten_calls: int = 0                # aten calls in the graph AOTAutograd handed over
    view_calls: int = 0                # of which views (no computation of their own)
    pytorch_calls: int = 0             # of which run through PyTorch (opaque nodes)
    kernels: int = 0                   # Triton kernels generated
    pytorch_ops: list[str] = field(default_factory=list)   # "aten.embedding.default (file.py:12)"
    compile_seconds: float = 0.0
    shapes: int = 0                    # concrete signatures compiled (a symbolic graph: one per shape)
    symbolic: bool = False
    per_shape: str = ""            # why a graph of symbolic sizes is compiled per concrete shape ("": it is not)
    error: str | None = None           # set when minicomp could not compile it: it ran eagerly
    graphs: list = field(default_factory=list)   # mode="reduce-overhead": each compiled shape's GraphStatus

    def update(self, compiled: Compiled, aten_calls: tuple[int, int]) -> None:
        from minicomp.frontend.fx import opaque_nodes
        ops = [n.attrs["target"] + (f" ({n.origin})" if n.origin else "")
               for n in compiled.graph.nodes() if n.op == "opaque"]
        groups = [f"group {gid} runs through PyTorch: {why}" for gid, why in compiled.forced.items()]
        (self.aten_calls, self.view_calls), self.pytorch_calls = aten_calls, len(opaque_nodes(compiled.graph))
        self.kernels = len(compiled.generated.kernel_names)
        self.pytorch_ops = ops + groups
        self.compile_seconds += compiled.compile_seconds
        self.shapes += 1


@dataclass
class BackendReport:
    """What a backend compiled: `graphs` in the order Dynamo handed them over."""
    graphs: list[GraphRecord]

    @property
    def kernels(self) -> int:
        return sum(g.kernels for g in self.graphs)

    @property
    def aten_calls(self) -> int:
        return sum(g.aten_calls for g in self.graphs)

    @property
    def view_calls(self) -> int:
        return sum(g.view_calls for g in self.graphs)

    @property
    def pytorch_calls(self) -> int:
        return sum(g.pytorch_calls for g in self.graphs)

    @property
    def fraction_computed_in_kernels(self) -> float:
        """Of the aten calls that compute (views left out), the fraction run by minicomp's kernels."""
        computing = self.aten_calls - self.view_calls
        return 1.0 - self.pytorch_calls / computing if computing else 1.0

    @property
    def fraction_compiled(self) -> float:
        """Of the aten calls in the graphs handed over, the fraction that did not run through
        PyTorch (views count as compiled: they become index arithmetic in kernels)."""
        return 1.0 - self.pytorch_calls / self.aten_calls if self.aten_calls else 1.0

    @property
    def pytorch_ops(self) -> Counter:
        """aten op -> how many of its calls ran through PyTorch."""
        return Counter(op.split(" ")[0] for g in self.graphs for op in g.pytorch_ops if op.startswith("aten."))

    @property
    def failures(self) -> list[GraphRecord]:
        return [g for g in self.graphs if g.error]

    def table(self) -> str:
        rows = ["| graph | from | mode | aten calls | through PyTorch | kernels | shapes |",
                "|---|---|---|---|---|---|---|"]
        for g in self.graphs:
            rows.append(f"| {g.index} | {g.origin or '?'} | {g.mode} | {g.aten_calls} | {g.pytorch_calls} | "
                        f"{g.kernels} | {g.shapes}{' (symbolic)' if g.symbolic else ''} |")
        lines = ["\n".join(rows), f"{len(self.graphs)} graph(s), {self.kernels} kernel(s), "
                 f"{self.fraction_compiled:.1%} of {self.aten_calls} aten calls compiled "
                 f"({self.fraction_computed_in_kernels:.1%} of the {self.aten_calls - self.view_calls} that are not views)"]
        for g in self.graphs:
            if g.error:
                lines.append(f"graph {g.index} ran eagerly: {g.error}")
            for op in g.pytorch_ops:
                lines.append(f"graph {g.index}: through PyTorch: {op}")
            for status in g.graphs:
                lines.append(f"graph {g.index} {status.describe()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _options(options: dict | None, base: Options) -> Options:
    if not options:
        return base
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise MinicompError(f"unknown minicomp option(s) {', '.join(unknown)} in torch.compile(options=...); "
                            f"known: {', '.join(sorted(known))}")
    return Options(**{**base.__dict__, **options})


def _origin(gm: fx.GraphModule) -> str | None:
    from minicomp.frontend.fx_trace import origin_of
    for node in gm.graph.nodes:
        if node.op == "call_function" and origin_of(node):
            return origin_of(node)
    return None


class Backend:
    """A Dynamo backend (`torch.compile(m, backend=minicomp.backend(...))`) that records
    what it compiles; `report()` returns the records."""

    def __init__(self, **options: Any):
        self.options = _options(options, Options())
        self._records: list[GraphRecord] = []
        self._lock = threading.Lock()

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                 mode: str | None = None, **kwargs: Any) -> Callable:
        from torch._dynamo.backends.common import aot_autograd

        # torch.compile(m, backend="minicomp", mode="reduce-overhead") hands a mode other than
        # "default" to the backend as `mode`; options={"mode": ...} says the same
        opts = _options({**(options or {}), **({"mode": mode} if mode else {})}, self.options)
        origin = _origin(gm)
        host = aot.host_scalars(gm, example_inputs)   # read now: AOTAutograd hands fake tensors on

        def compiler(mode: str) -> Callable:
            def compile_fn(aot_gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable:
                with self._lock:
                    record = GraphRecord(len(self._records), origin, mode)
                    self._records.append(record)
                from torch._subclasses.fake_tensor import unset_fake_temporarily
                with unset_fake_temporarily():   # AOTAutograd calls us under its fake mode
                    if host:
                        return HostScalars(aot_gm, list(inputs), host, _static_inputs(),
                                           lambda g, ins, static: _compile(g, ins, opts, record, static))
                    return _compile(aot_gm, inputs, opts, record, _static_inputs())
            return compile_fn

        aot.keep_sdpa(gm, example_inputs)     # AOTAutograd would decompose it (math path with a mask)
        return aot_autograd(fw_compiler=compiler("forward"), inference_compiler=compiler("inference"),
                            bw_compiler=_eager_backward)(gm, example_inputs)

    def report(self) -> BackendReport:
        with self._lock:
            return BackendReport(list(self._records))

    def clear(self) -> None:
        # not `reset`: torch._dynamo.reset() calls a backend's reset(), and the report outlives it
        with self._lock:
            self._records.clear()


def _eager_backward(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The backward graph, run by PyTorch as AOTAutograd traced it."""
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(gm)


def _eager(gm: fx.GraphModule, record: GraphRecord, exc: BaseException) -> Callable:
    """`gm` run by PyTorch after minicomp failed to compile it, said once."""
    from torch._functorch.aot_autograd import make_boxed_func
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    record.error = f"{type(exc).__name__}: {text}"
    warnings.warn(f"minicomp backend: graph {record.index} (from {record.origin or '?'}) runs through PyTorch: "
                  f"{record.error}", stacklevel=2)
    return make_boxed_func(gm)


def _static_inputs() -> frozenset[int]:
    """Positions of the graph's parameters and buffers (AOTAutograd's `static_input_indices`):
    under mode="reduce-overhead" they are read in place by a CUDA graph, not copied."""
    try:
        from torch._guards import TracingContext
        return frozenset(TracingContext.try_get().fw_metadata.static_input_indices or ())
    except Exception:  # noqa: BLE001 -- no such record in this torch: Parameters are found at the first call
        return frozenset()


def _compile(gm: fx.GraphModule, inputs: Sequence[Any], opts: Options, record: GraphRecord,
             static: frozenset[int] = frozenset()) -> Callable:
    if aot.is_symbolic(inputs):
        record.symbolic = True
        try:
            return _over_symbols(gm, list(inputs), opts, record, static)
        except Exception as exc:   # noqa: BLE001 -- not over symbols: one compile per concrete signature
            record.per_shape = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            return _PerShape(gm, opts, record, static)
    try:
        return _concrete(gm, list(inputs), opts, record, static)
    except Exception as exc:   # noqa: BLE001 -- any failure to compile one graph: it runs eagerly
        return _eager(gm, record, exc)


def _concrete(gm: fx.GraphModule, inputs: list[torch.Tensor], opts: Options, record: GraphRecord,
              static: frozenset[int] = frozenset()) -> "_Run":
    """Compile a graph of concrete shapes whose placeholders are all tensors."""
    from minicomp.frontend.fx import lower
    bad = [type(a).__name__ for a in inputs if not isinstance(a, torch.Tensor)]
    if bad:
        raise MinicompError(f"graph inputs that are not tensors ({', '.join(sorted(set(bad)))})")
    start = time.perf_counter()
    work = fx.GraphModule(gm, copy.deepcopy(gm.graph))   # node meta shared; `gm` stays as AOTAutograd made it
    work, layout = aot.split_outputs(work)
    aot.rewrite_sdpa(work)
    calls = aot.aten_calls(work)
    graph = lower(work, f"dynamo_graph_{record.index}")
    compiled = compile_graph(graph, inputs, opts)
    compiled.compile_seconds = time.perf_counter() - start
    record.update(compiled, calls)
    return _Run(compiled, layout, _expected_outputs(work), record, opts.graphs, static)


def _over_symbols(gm: fx.GraphModule, inputs: list[Any], opts: Options, record: GraphRecord,
                  static: frozenset[int] = frozenset()) -> Callable:
    """Compile a graph of symbolic sizes once (codegen/sizes.py): its SymInt placeholders are
    dims, the module reads the sizes from the tensors. Non-tensor outputs (sizes) and graphs
    the compile cannot take over symbols raise: the caller compiles per concrete shape."""
    from minicomp.frontend.fx import lower
    start = time.perf_counter()
    work = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    work, layout = aot.split_outputs(work)
    if layout.others:
        raise MinicompError("a graph over symbolic sizes that returns constants or computed sizes")
    aot.rewrite_sdpa(work)
    calls = aot.aten_calls(work)
    work, inputs, carriers = aot.carry_sizes(work, inputs)
    graph = lower(work, f"dynamo_graph_{record.index}")
    if not graph.symbolic:
        raise MinicompError("every size was fixed while lowering")
    tensor_pos = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
    compiled = compile_graph(graph, [inputs[i] for i in tensor_pos], opts)
    compiled.compile_seconds = time.perf_counter() - start
    record.update(compiled, calls)
    run = _Run(compiled, layout, _expected_outputs(work), record, opts.graphs,
               frozenset(k for k, i in enumerate(tensor_pos) if i in static))
    if not layout.sizes and not carriers:
        return _Boxed(lambda args: run([args[i] for i in tensor_pos]))
    device = inputs[carriers[0]].device if carriers else None
    carried = frozenset(carriers)

    def with_sizes(args: list) -> list:       # sizes in and out, from the call's arguments
        out = run([torch.empty_strided((args[i], 0), (1, 1), device=device) if i in carried else args[i]
                   for i in tensor_pos])
        for pos, size in layout.sizes.items():
            out[pos] = size(args)
        return out
    return _Boxed(with_sizes)


class _Boxed:
    _boxed_call = True

    def __init__(self, fn: Callable[[list], list]):
        self.fn = fn

    def __call__(self, args: list) -> list:
        return self.fn(args)


class _PerShape:
    """A graph of symbolic sizes, compiled for each concrete signature it is called with."""
    _boxed_call = True

    def __init__(self, gm: fx.GraphModule, opts: Options, record: GraphRecord, static: frozenset[int] = frozenset()):
        self.gm, self.opts, self.record, self.static = gm, opts, record, static
        self.cache: dict[tuple, Callable[[list], list]] = {}

    def __call__(self, args: list) -> list:
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
                    for a in args)
        run = self.cache.get(key)
        if run is None:
            run = self.cache[key] = self._specialise(args)
        return run(args)

    def _specialise(self, args: list) -> Callable[[list], list]:
        try:
            concrete, tensor_pos = aot.specialise(self.gm, args)
            inner = _concrete(concrete, [args[i] for i in tensor_pos], self.opts, self.record,
                              frozenset(k for k, i in enumerate(tensor_pos) if i in self.static))
        except Exception as exc:  # noqa: BLE001 -- this shape runs eagerly
            eager = _eager(self.gm, self.record, exc)
            return eager
        return lambda a: inner([a[i] for i in tensor_pos])


DEFAULT = Backend()


def minicomp_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
    """The `minicomp` entry point of `torch_dynamo_backends`: the process's shared backend."""
    return DEFAULT(gm, example_inputs, **kwargs)


def backend(**options: Any) -> Backend:
    """A backend object of one's own: `torch.compile(m, backend=minicomp.backend(**options))`."""
    return Backend(**options)


def _backend_of(compiled: Any) -> Backend | None:
    """The minicomp Backend a `torch.compile` result compiles with, found down the chain of
    `_torchdynamo_orig_backend` wrappers (convert_frame.py documents the chain)."""
    ctx = getattr(compiled, "dynamo_ctx", None)
    obj = getattr(ctx, "callback", None)
    if obj is None:   # a compiled function keeps its callback in the wrapper's closure
        for cell in getattr(compiled, "__closure__", None) or ():
            contents = cell.cell_contents
            if hasattr(contents, "_torchdynamo_orig_backend"):
                obj = contents
                break
    for _ in range(16):
        if isinstance(obj, Backend):
            return obj
        if obj is minicomp_backend:
            return DEFAULT
        nxt = getattr(obj, "_torchdynamo_orig_backend", None) or getattr(obj, "compiler_fn", None)
        if nxt is None or nxt is obj:
            return None
        obj = nxt
    return None


def backend_report(compiled: Any = None) -> BackendReport:
    """What the minicomp backend compiled: for `torch.compile(..., backend=minicomp.backend())`
    results, that backend's graphs; for `backend="minicomp"` (and with no argument), every graph
    the shared backend compiled in this process (`minicomp.dynamo.DEFAULT.clear()` clears it)."""
    if compiled is None:
        return DEFAULT.report()
    found = _backend_of(compiled)
    if found is None:
        raise MinicompError(f"{type(compiled).__name__} was not made by torch.compile with the minicomp backend")
    return found.report()

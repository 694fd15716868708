"""CUDA graphs for compiled calls: `minicomp.compile(fn, mode="reduce-overhead")`.

A small model at batch 1 launches tens of kernels per call, each a few microseconds of GPU
work after tens of microseconds of Python. A CUDA graph records the whole call once and
replays it with one launch. `GraphedCall` wraps a generated module's `call(*inputs)` (the
api's `Specialisation.launch`, or the Dynamo backend's compiled graph) and keeps one graph per
input layout:

- **Warm first.** The first call of each layout runs as usual (Triton compiles and autotunes,
  cuBLAS makes its workspace, the Launcher keeps its fast launchers); the next one captures:
  nothing that compiles or times may run inside a capture.
- **Copied inputs** (the call's arguments) are copied into static buffers the graph reads; the
  caller passes new tensors each call. A buffer has the argument's shape and strides, so the
  module reads it as it read the argument; an argument whose elements overlap (an `expand`)
  gets a buffer over the same span of memory, copied as one span. Arguments that alias one
  another (one tensor passed twice, views of one tensor) are copied apart: a compiled graph is
  pure (it writes no input; frontend/fx.py, AOTAutograd's functionalisation), so what it
  computes does not depend on their sharing memory.
- **Live inputs** (weights: parameters and buffers, read again at every call) are not copied:
  the graph reads them where they were at capture. Each replay first compares their
  `data_ptr()`s with the captured ones; a weight replaced (`p.data = new`, a new Parameter)
  captures again. An in-place update (`p.add_(1)`, `p.copy_(...)`) keeps the pointer and the
  graph reads the new values. After `MAX_RECAPTURES` captures for replaced weights the call
  stops capturing (a weight that moves at every call gains nothing from a graph).
- **Outputs** are copied out of the graph's memory after each replay (same shapes and
  strides), so a caller may keep a result across calls (the next replay overwrites the
  graph's own outputs). Cost, estimated from the H200's figures (not measured yet; the
  lead's GPU run times the whole call): one allocation and one copy kernel per output, ~5 us
  of launch at batch 1 (a 16 x 32000 fp32 logits tensor is 2 MiB, under 1 us at 4.8 TB/s),
  against the tens of launches a replay saves.
- **Kernels compiling in the background.** While one still compiles (runtime/background.py:
  call() runs eager's lines for its group, codegen/first_calls.py, which a capture would keep
  for good) calls run uncaptured; the first capture comes after the compiles, so replays run
  the kernels call() would run.
- **Capture safety.** Before capturing, `hazards()` reads the compiled graph for what cannot
  run inside a capture (a host sync such as `.item()`, an op whose output shape depends on
  values, an op torch tags `cudagraph_unsafe`, a call that moves a tensor to the CPU; the
  scalar constants PyTorch lines read are made on the device once, at the uncaptured first
  call, and kept (runtime/checks.scalar); the loader puts tensor constants on the device; and
  the api refuses arguments and weights on two devices);
  where it finds one, the call runs uncaptured and `status.reason` says why. A capture that
  fails anyway (an opaque Python callable that syncs) is caught: the call runs uncaptured
  from then on, with the error as its reason, and the caller's stream is restored. A capture
  never changes a result; nor the user's RNG (a failed capture leaves PyTorch's CUDA generators
  in capture mode, where torch.randn raises: a one-op capture afterwards takes them out).

- **cuBLAS's workspace.** PyTorch keeps one workspace per (cuBLAS handle, stream) for as long as
  the process runs, made at the first matmul on that stream. The warm-up on the capturing stream
  makes it outside any graph's pool, so a capture that kept it would bake an address the graph
  does not own: when `torch._C._cuda_clearCublasWorkspaces()` drops it (torch.compile's
  reduce-overhead mode does so around each of its own warm-ups and recordings) and a capture's
  `torch.cuda.empty_cache()` then frees the memory, the next replay's matmuls write to memory
  that is gone (session 28, H100: `illegal memory access` at minicomp's replay of Llama 1 x 16
  once torch.compile's reduce-overhead mode had run in the process). So `CudaApi.capture`
  clears the workspaces after the warm-up and again after the capture, as torch.compile's CUDA
  graph trees do: the capture's matmuls take a workspace from the graph's own pool, and no
  later matmul outside the graph takes that one.

Invariants: a replay reads only the static buffers, the memory of the live weights at the
capture (a replay whose weights' pointers differ captures again instead) and the graph's
private memory pool (cuBLAS's workspace included); calls of one GraphedCall are serialised by
its lock, and a replay on another stream than the last waits for the last; `status` always says
whether calls run as a graph.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

WARMUP_CALLS = 1        # uncaptured calls of a layout before it is captured
MAX_GRAPHS = 32         # layouts captured per call (each graph holds a memory pool)
MAX_RECAPTURES = 8      # captures for replaced weights before the call stops capturing


@dataclass
class GraphStatus:
    """Whether a compiled call runs as a CUDA graph, and why not (for explain())."""
    reason: str | None = None       # None: it captures (or will, after its warm-up); else why it does not
    captures: int = 0               # graphs captured (layouts, and again for replaced weights)
    replays: int = 0
    copied: int = 0                 # inputs copied into static buffers at each replay (the arguments)
    in_place: int = 0               # inputs the graph reads where they are (the weights)
    notes: list[str] = field(default_factory=list)   # what happened on the way (a capture retried, ...)

    def describe(self) -> str:
        if self.reason is not None:
            return f"runs without CUDA graphs: {self.reason}"
        if not self.captures:
            return "runs as a CUDA graph from its next call with the same layout (the first call warms up)"
        text = (f"runs as a CUDA graph: {self.captures} capture(s), {self.replays} replay(s); "
                f"{self.copied} input(s) copied in, {self.in_place} read in place")
        return text + "".join(f"; {n}" for n in self.notes)


# ------------------------------------------------------------------ what cannot run in a capture

# aten ops that read a value back to the host or size their output by values: a capture
# cannot hold them (torch's tags catch most; this list names the ones it may not tag)
_HOST_OPS = ("_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique", "_unique2",
             "unique_consecutive", "unique_dim", "bincount", "histc", "repeat_interleave", "cpu", "tolist")
_UNSAFE_TAGS = tuple(getattr(torch.Tag, t) for t in ("cudagraph_unsafe", "dynamic_output_shape", "data_dependent_output")
                     if hasattr(torch.Tag, t))


def _op_hazard(fn: Any, target: str) -> str | None:
    """Why the PyTorch call `fn` (an opaque node's `AtenCall`, or another callable) cannot be
    captured, or None (a Python callable minicomp cannot see into is left to the capture)."""
    op = getattr(fn, "target", fn)
    tags = getattr(op, "tags", ()) or ()
    found = [t.name for t in _UNSAFE_TAGS if t in tags]
    if found:
        return f"{target} is tagged {', '.join(found)} by PyTorch"
    name = getattr(getattr(op, "_schema", None), "name", "") or target
    base = name.split("::")[-1].split(".")[0]
    if base in _HOST_OPS:
        return f"{target} reads values back to the host or sizes its output by them"
    captured = [*getattr(fn, "args", ()), *(getattr(fn, "kwargs", None) or {}).values()]
    if any(isinstance(a, torch.device) and a.type == "cpu" for a in captured):
        return f"{target} moves a tensor to the CPU"
    return None


def hazards(compiled: Any) -> list[str]:
    """What in `compiled` (an api.Compiled) cannot run inside a CUDA graph capture: one line
    each, naming the node or group; empty when the compiled call may be captured."""
    try:
        return _hazards(compiled)
    except Exception as exc:  # noqa: BLE001 -- a graph this check cannot read is not captured, never a crash
        return [f"its graph could not be checked for capture safety ({type(exc).__name__}: {exc})"]


def _hazards(compiled: Any) -> list[str]:
    found: list[str] = []
    gen = compiled.generated
    if gen.device_type != "cuda":
        return [f"its kernels run on {gen.device_type} (CUDA graphs need CUDA tensors)"]
    graph = compiled.graph
    for n in graph.nodes():
        if n.op == "opaque":
            why = _op_hazard(n.attrs.get("fn"), str(n.attrs.get("target", "?")))
            if why:
                found.append(f"%{n.id} ({n.origin or '?'}): {why}")
    return found


# ------------------------------------------------------------------ static buffers

def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of `t` share memory (a stride-0 `expand`), or torch cannot tell."""
    return torch._debug_has_internal_overlap(t) != 0


def _span(t: torch.Tensor) -> int:
    """Elements from `t`'s first to its last addressed element."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


def _copy_out(t: torch.Tensor) -> torch.Tensor:
    """A copy of a graph output with its very shape and strides (a transposed or expanded output
    stays so: the Dynamo backend planned its stride fixes on the first, uncaptured call)."""
    if t.is_contiguous() or not t.numel():
        return t.clone()
    n = _span(t)
    flat = torch.empty(n, dtype=t.dtype, device=t.device)
    flat.copy_(t.as_strided((n,), (1,)))
    return flat.as_strided(tuple(t.shape), t.stride())


@dataclass
class _Static:
    """One copied input's buffer: `tensor` is what the graph reads; `copy_from` fills it."""
    tensor: torch.Tensor
    flat: torch.Tensor | None        # an overlapping input's whole span, copied as one

    @classmethod
    def like(cls, t: torch.Tensor) -> "_Static":
        if t.numel() and _overlaps(t):
            n = _span(t)
            flat = torch.empty(n, dtype=t.dtype, device=t.device)
            return cls(flat.as_strided(tuple(t.shape), t.stride()), flat)
        return cls(torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device), None)

    def copy_from(self, t: torch.Tensor) -> None:
        if self.flat is not None:
            self.flat.copy_(t.as_strided((self.flat.numel(),), (1,)))
        elif t.numel():
            self.tensor.copy_(t)


@dataclass
class _Graph:
    graph: Any                       # torch.cuda.CUDAGraph
    static: list[_Static]
    ptrs: list[int]                  # where the live weights were at capture: the memory it reads
    outputs: list[torch.Tensor]
    device: int


def background_pending() -> bool:
    """Whether a kernel still compiles in the background (runtime/background.py: until it is
    done, call() runs the group's other form, and a capture would keep that)."""
    from minicomp.runtime import background
    return background.any_pending()


def clear_blas_workspaces() -> None:
    """Drop PyTorch's cuBLAS (and cuBLASLt) workspaces, per handle and stream; the next matmul on
    a stream makes its own again, inside the capturing graph's pool when one is capturing."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


class CudaApi:
    """The torch.cuda calls a GraphedCall makes, in one place (CPU tests hand it a fake that
    "captures" by keeping the call and "replays" by running it into the captured outputs)."""

    def __init__(self) -> None:
        self._sides: dict[int, Any] = {}     # device -> the side stream that warms and captures there
        self.scratch = lambda: torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))

    def new_graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def capture(self, graph: Any, thunk: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
        # PyTorch's recipe: run once on the side stream that captures (one per device, kept),
        # so state made lazily per stream (cuBLAS's or cuDNN's workspace of a PyTorch line)
        # exists before the capture
        device = torch.cuda.current_device()
        side = self._sides.get(device)
        if side is None:
            side = self._sides[device] = torch.cuda.Stream(device)
        current = torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.no_grad(), torch.cuda.stream(side):
            thunk()
        current.wait_stream(side)
        clear_blas_workspaces()     # the capture's matmuls take a workspace from the graph's pool
        # thread_local: another thread's unsafe call (a sync) does not break this capture
        try:
            with torch.no_grad(), torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                outs = list(thunk())
        except Exception:
            torch.cuda.set_stream(current)
            self.end_generator_capture(side)
            raise
        finally:
            # where the capture fails, torch.cuda.graph's exit raises before it restores the
            # caller's stream: the caller's later work must not run on the side stream
            torch.cuda.set_stream(current)
            clear_blas_workspaces()     # and no matmul outside the graph takes that workspace
        current.wait_stream(side)
        return outs

    def end_generator_capture(self, side: Any) -> None:
        """After a failed capture (its end raises before the generators' epilogue), a one-op capture
        that succeeds takes PyTorch's CUDA generators out of capture mode, offsets unmoved."""
        try:
            with torch.no_grad(), torch.cuda.graph(torch.cuda.CUDAGraph(), stream=side, capture_error_mode="thread_local"):
                self.scratch().add_(1)
        except Exception as exc:  # noqa: BLE001 -- the capture's own error is the one to report
            warnings.warn(f"minicomp: PyTorch's CUDA generators stay in capture mode ({exc}): torch.randn on CUDA may raise")

    def replay(self, graph: Any) -> None:
        graph.replay()

    def device(self) -> int:
        return torch.cuda.current_device()

    def stream(self) -> Any:
        return torch.cuda.current_stream()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def layout_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """Shapes and strides of the copied inputs: a module over symbolic sizes serves several."""
    return tuple((t.shape, t.stride()) for t in tensors)


class GraphedCall:
    """`call(*inputs) -> list[Tensor]` replayed as CUDA graphs (see the module docstring).

    `launch` is the module's call; inputs at positions in `live` are weights read in place,
    every other input is copied; `by_layout` keys graphs by the copied inputs' shapes and
    strides (a module over symbolic sizes), else one graph serves every call (the caller's
    guards fixed the layout). `hazards` are `hazards(compiled)`'s findings."""

    def __init__(self, launch: Callable[..., list[torch.Tensor]], n_inputs: int, live: Sequence[int], *,
                 by_layout: bool = False, found: Sequence[str] = (), name: str = "function",
                 cuda: CudaApi | None = None):
        self.launch, self.name, self.by_layout = launch, name, by_layout
        self.cuda = cuda or CudaApi()
        live_set = set(live)
        self.copied = [i for i in range(n_inputs) if i not in live_set]
        self.live = sorted(live_set)
        self.graphs: dict[tuple, _Graph] = {}
        self.seen: dict[tuple, int] = {}          # layout -> uncaptured calls so far
        self.recaptures = 0
        self.status = GraphStatus(reason="; ".join(found) if found else None, copied=len(self.copied),
                                  in_place=len(self.live))
        self._lock = threading.Lock()
        self._stream: Any = None

    def warmed(self, inputs: Sequence[torch.Tensor]) -> None:
        """Count a call made before this wrapper existed (the specialisation's first call)."""
        key = self._key(inputs)
        self.seen[key] = self.seen.get(key, 0) + 1

    def _key(self, inputs: Sequence[torch.Tensor]) -> tuple:
        return layout_key([inputs[i] for i in self.copied]) if self.by_layout else ()

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if self.status.reason is not None:
            return self.launch(*inputs)
        with self._lock:
            key = self._key(inputs)
            g = self.graphs.get(key)
            if g is not None and [inputs[i].data_ptr() for i in self.live] != g.ptrs:
                g = self._replaced(key)
                if self.status.reason is not None:
                    return self.launch(*inputs)
            if g is None:
                if self.seen.get(key, 0) < WARMUP_CALLS or len(self.graphs) >= MAX_GRAPHS or background_pending():
                    self.seen[key] = self.seen.get(key, 0) + 1
                    full = f"layouts past the first {MAX_GRAPHS} run uncaptured"
                    if len(self.graphs) >= MAX_GRAPHS and full not in self.status.notes:
                        self.status.notes.append(full)
                    return self.launch(*inputs)
                g = self._capture(key, inputs)
                if g is None:
                    return self.launch(*inputs)
            if self.cuda.device() != g.device:    # replays go where the graph was captured
                return self.launch(*inputs)
            return self._replay(g, inputs)

    def _replay(self, g: _Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        stream = self.cuda.stream()
        if self._stream is not None and stream != self._stream:
            stream.wait_stream(self._stream)     # the last replay's reads of the buffers come first
        self._stream = stream
        for s, i in zip(g.static, self.copied):
            s.copy_from(inputs[i])
        self.cuda.replay(g.graph)
        self.status.replays += 1
        return [_copy_out(o) for o in g.outputs]

    def _replaced(self, key: tuple) -> _Graph | None:
        """A weight of graph `key` was replaced: forget the graph (the next call captures again)."""
        del self.graphs[key]
        self.recaptures += 1
        if self.recaptures > MAX_RECAPTURES:
            self.status.reason = (f"its weights were replaced (not updated in place) {self.recaptures} times, "
                                  "each a new capture: it stopped capturing")
            self.graphs.clear()
        elif "captured again after a weight was replaced" not in self.status.notes:
            self.status.notes.append("captured again after a weight was replaced")
        return None

    def _capture(self, key: tuple, inputs: Sequence[torch.Tensor]) -> _Graph | None:
        static = [_Static.like(inputs[i]) for i in self.copied]
        for s, i in zip(static, self.copied):
            s.copy_from(inputs[i])
        args = list(inputs)
        for s, i in zip(static, self.copied):
            args[i] = s.tensor
        graph = self.cuda.new_graph()
        try:
            outs = self.cuda.capture(graph, lambda: self.launch(*args))
        except Exception as exc:  # noqa: BLE001 -- what cannot be captured runs uncaptured, said once
            cause = _root(exc)
            text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            self.status.reason = f"its capture failed ({type(cause).__name__}: {text})"
            self.graphs.clear()
            self.cuda.synchronize()
            warnings.warn(f"minicomp: {self.name}: mode='reduce-overhead' runs it without CUDA graphs: "
                          f"{self.status.reason}", stacklevel=4)
            return None
        g = _Graph(graph, static, [inputs[i].data_ptr() for i in self.live], outs, self.cuda.device())
        self.graphs[key] = g
        self.status.captures += 1
        return g


def _root(exc: BaseException) -> BaseException:
    """The first error of a failed capture (ending it raises again, the body's error its context)."""
    while exc.__context__ is not None and "capture" in str(exc).lower() and exc.__context__ is not exc:
        exc = exc.__context__
    return exc

"""The stages wired for one graph: `compile_graph` (passes -> plan -> layout -> generated
module -> loaded call), `plan_only` (no code: dumps over symbolic sizes), and `run_compiled`
(a kernel Triton rejects at its first launch runs through PyTorch instead). `Options` are the
compile options, `Compiled` what one specialisation produced. `minicomp.api` re-exports them;
this module imports nothing of the api package.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from minicomp.errors import MinicompError, ModeError
from minicomp.ir import dims
from minicomp.ir.graph import Graph
from minicomp.ir.verify import verify
from minicomp.target import LIBRARY_MODES, RowForm, Target


MODES = ("default", "reduce-overhead")


@dataclass
class Options:
    passes: Sequence[str] | None = None      # None: the default pipeline
    machine: str = "h200"
    print_after_all: bool = False
    dump_dir: str | None = None
    time_passes: bool = False
    verify_target: str | None = None         # "cuda:90": also compile every kernel for that GPU (None: $MINICOMP_VERIFY_TARGET)
    freeze: bool = False                     # fold weights into the kernels (guarded: a changed weight recompiles)
    row_form: RowForm | None = None          # row-kernel form knobs (None: RowForm(); tests force the looped form)
    dynamic: bool | None = None              # symbolic sizes: None after a size changes, True always, False never (api/dynamic.py)
    mode: str = "default"                    # "reduce-overhead": replay each call as a CUDA graph (runtime/cuda_graphs.py)
    library: str | None = None               # which GEMMs call cuBLAS on CUDA: "off", "on", "all" (None: $MINICOMP_LIBRARY_GEMM)

    def __post_init__(self) -> None:
        if self.library is not None and self.library not in LIBRARY_MODES:
            raise ModeError(f"library={self.library!r}: expected one of {', '.join(map(repr, LIBRARY_MODES))}")
        if self.mode not in MODES:
            raise ModeError(f"unknown mode {self.mode!r}; minicomp's modes are {', '.join(map(repr, MODES))} "
                            "('reduce-overhead' replays each call on CUDA as a CUDA graph)")

    @property
    def graphs(self) -> bool:
        """Whether calls should run as CUDA graphs (where the device and the graph allow)."""
        return self.mode == "reduce-overhead"


@dataclass
class Compiled:
    """Everything one specialisation produced."""
    graph: Graph                 # after passes and layout assignment
    plan: Any                    # minicomp.plan.Plan
    generated: Any               # minicomp.codegen.GeneratedModule
    call: Callable[..., list[torch.Tensor]]
    pass_records: list = field(default_factory=list)
    compile_seconds: float = 0.0  # capture to loaded module, excluding Triton's JIT (lazy, at first launch)
    forced: dict[int, str] = field(default_factory=dict)  # group id -> why it runs through PyTorch after all


def run_compiled(compiled: Compiled, tensors: Sequence[torch.Tensor]) -> tuple[Compiled, list[torch.Tensor]]:
    """Run `compiled` on `tensors`; when Triton's compiler rejects one of its kernels on this
    device (found at the kernel's first launch on a GPU), generate the module again with that
    kernel's group run through PyTorch, say so once, and run that: the answer is eager's, never
    a Triton traceback. Returns the Compiled that ran (the same one unless a kernel failed).

    Rerunning the whole call is safe: kernels only write buffers the call allocated."""
    from minicomp.runtime.launcher import KernelCompileError

    while True:
        try:
            return compiled, compiled.call(*tensors)
        except KernelCompileError as exc:
            if exc.kernel not in compiled.generated.kernel_groups:
                raise
            compiled = _without_kernel(compiled, exc.kernel, exc.cause)


def _without_kernel(compiled: Compiled, kernel: str, cause: str) -> Compiled:
    """`compiled` generated again with `kernel`'s group run through PyTorch."""
    import warnings

    from minicomp.codegen import generate
    from minicomp.runtime import load

    gen = compiled.generated
    # a kernel the same up to names serves several groups (codegen/dedup.py): each runs through PyTorch
    gids = gen.kernel_users.get(kernel) or [gen.kernel_groups[kernel]]
    first = cause.strip().splitlines()[0] if cause.strip() else "(no message)"
    reason = f"kernel {kernel} was rejected by Triton's compiler on {compiled.call.device}: {first}"
    which = f"group {gids[0]}" if len(gids) == 1 else f"groups {', '.join(map(str, gids))}"
    warnings.warn(f"minicomp: {compiled.graph.name}: {which} run{'s' if len(gids) == 1 else ''} through PyTorch: "
                  f"{reason}", stacklevel=3)
    forced = {**compiled.forced, **{gid: reason for gid in gids}}
    target = replace(gen.target, verify_arch=None)   # the check already ran on this plan
    generated = generate(compiled.graph, compiled.plan, target, forced_fallbacks=forced)
    call = load(generated, compiled.call.device)
    return replace(compiled, generated=generated, call=call, forced=forced)


def set_input_layouts(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    """Record the actual strides of the inputs: kernels read them as they are, no copies.

    Strides of size-1 dimensions never address anything; they are normalised (as the
    runtime's `Signature` does) so `x[:, None]` and `x.unsqueeze(1).contiguous()` share a kernel.
    An input of symbolic shape (or given as None: `load=False`) is contiguous.
    """
    from minicomp.ir.graph import contiguous_strides
    from minicomp.runtime.guards import TensorSig
    for nid, t in zip(graph.inputs, inputs):
        node = graph.node(nid)
        symbolic = t is None or dims.any_symbolic(node.shape)   # over symbols: contiguous (copied if not)
        stride = None if symbolic else _int_strides(TensorSig.of(t).stride)
        node.layout = contiguous_strides(node.shape) if stride is None else stride


def _int_strides(stride: tuple) -> tuple[int, ...] | None:
    """Strides as ints; None where one is a size over symbols (a fake tensor of fixed shape in
    a symbolic graph may carry SymInt strides, most of them constants)."""
    if not any(isinstance(s, torch.SymInt) for s in stride):
        return stride
    if any(isinstance(s, torch.SymInt) and not s.node.expr.is_number for s in stride):
        return None
    return tuple(int(s.node.expr) if isinstance(s, torch.SymInt) else s for s in stride)


def optimise(graph: Graph, options: Options) -> tuple[Graph, list]:
    from minicomp.passes.manager import run_pipeline
    return run_pipeline(graph, options.passes, print_after_all=options.print_after_all,
                        dump_dir=options.dump_dir, time_passes=options.time_passes)


def _not_loaded(*inputs: Any) -> list[torch.Tensor]:
    raise MinicompError("this graph was compiled with load=False: its module was generated, not loaded")


def plan_only(graph: Graph, options: Options | None = None) -> tuple[Graph, Any]:
    """Graph -> passes -> plan -> layout, no code: the CLI's dumps of a program whose sizes are
    symbolic (codegen takes concrete sizes so far; `compile_graph` needs them bound)."""
    from minicomp.plan import assign_layout, plan_graph

    options = options or Options()
    verify(graph)
    set_input_layouts(graph, [None] * len(graph.inputs))
    captured = graph
    graph, _ = optimise(graph, options)
    plan = plan_graph(graph, options.machine, baseline=captured)
    return assign_layout(graph, plan), plan


_gc_lock = threading.Lock()
_gc_pauses = [0, False]      # compiles inside `gc_paused` now, and whether the collector was on at the first


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a compile runs, as it was before afterwards.

    A compile allocates many small objects (nodes, plan states, syntax trees), so the collector's
    full passes come often, and each one walks every object the process holds: with transformers
    and torch loaded, some 400,000. A 12-layer BERT's compile (passes, plan, generate) took
    1.62-1.89 s with it on and 1.32-1.36 s with it off on the 2-core CPU machine (session 29).
    What a compile leaves in cycles is collected at the next pass after it. Nested and concurrent
    compiles count: the last one out puts the collector back as the first one in found it."""
    with _gc_lock:
        if _gc_pauses[0] == 0:
            _gc_pauses[1] = gc.isenabled()
            gc.disable()
        _gc_pauses[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses[0] -= 1
            if _gc_pauses[0] == 0 and _gc_pauses[1]:
                gc.enable()


def compile_graph(graph: Graph, inputs: Sequence[torch.Tensor], options: Options | None = None, *,
                  device: str | torch.device | None = None, load: bool = True,
                  target: Target | None = None) -> Compiled:
    """Graph (fresh from a frontend) -> passes -> plan -> layout -> generated module -> loaded call.

    `inputs` give the shapes, dtypes and strides to specialise on; `device` (default: the inputs',
    else cuda when present) the target, `target` its record (default: `Target.for_options`, read now).
    `load=False` stops at the generated module (`call` raises) and takes meta tensors as `inputs`
    (the CLI's dumps and `--emit`, which run nothing). The garbage collector pauses meanwhile
    (`gc_paused`)."""
    with gc_paused():
        return _compile_graph(graph, inputs, options, device=device, load=load, target=target)


def _compile_graph(graph: Graph, inputs: Sequence[torch.Tensor], options: Options | None, *,
                   device: str | torch.device | None, load: bool, target: Target | None) -> Compiled:
    from minicomp.codegen import generate, library_plan
    from minicomp.plan import assign_layout, plan_graph
    from minicomp.runtime import load as load_module

    options = options or Options()
    start = time.perf_counter()
    if device is not None:
        device = torch.device(device)
    else:
        device = inputs[0].device if inputs else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if target is None or target.device_type != device.type:
        target = Target.for_options(device.type, options)
    if load:
        from minicomp.runtime.prime import prime_triton
        prime_triton(device, target.prime_triton)   # Triton's one-time state, built while the passes run
    verify(graph)
    set_input_layouts(graph, inputs)
    captured = graph
    graph, records = optimise(graph, options)   # the manager works on a copy: `captured` stays as it was
    # the unfused baseline is the user's program as written (before attention matching); the
    # matmuls cuBLAS computes whatever follows them keep groups of their own (codegen/library_plan.py)
    plan = plan_graph(graph, options.machine, baseline=captured, library=library_plan.planned(graph, target))
    graph = assign_layout(graph, plan)            # strides of what the plan's kernels write
    generated = generate(graph, plan, target)     # with the GPU-true check when the target asks for it
    call = load_module(generated, device) if load else _not_loaded
    return Compiled(graph, plan, generated, call, records, time.perf_counter() - start)

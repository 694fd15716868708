"""A compiled Triton kernel's launch without Triton's per-launch Python: what `Launcher` keeps
for every kernel after its first launch (runtime/launcher.py). Split from launcher.py, which
re-exports it."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def direct(compiled: Any, grid: tuple, device: int) -> Callable | None:
    """A launcher of `compiled` over `grid` on `device` that calls the compiled kernel's `run` as
    Triton's own runner (`compiled[grid]`, Triton 3.6 to 3.9) does, less its per-launch lookups
    of the device (the Launcher checked it) and of launch metadata (None without a launch hook);
    with a launch hook set (a profiler), Triton's runner serves. None where this Triton's kernel
    lacks what it calls (another layout: the runner serves).

    Triton's hooks are `HookChain`s, never None: "no hook" is a chain with no calls (`_hooked`).
    The runner's own test is `is None`, so it builds launch metadata and calls both empty chains
    at every launch; measured on the H100, every launch of BERT's 123 a call took that path
    until this test read the chain (results/2026-12-05).

    Where `run` is Triton 3.6's launcher and the kernel needs no profile scratch, the launch goes
    to its C function itself (`c_launcher`), without `run`'s Python frame; a kernel that needs
    global scratch (TMA descriptors built on the device) keeps one buffer per stream
    (`_with_scratch`)."""
    try:
        from torch._C import _cuda_getCurrentRawStream as stream_of
        from triton import knobs
        compiled._init_handles()
        run, function, packed, runtime = compiled.run, compiled.function, compiled.packed_metadata, knobs.runtime
        runtime.launch_enter_hook, runtime.launch_exit_hook  # noqa: B018  (both readable)
    except (ImportError, AttributeError):
        return None
    runner, (g0, g1, g2) = compiled[grid], grid
    c = c_launcher(run)
    if c is not None and c[3]:
        return _with_scratch(c, runner, grid, device, function, packed, runtime, stream_of)
    if c is not None:
        c_launch, coop, pdl, _ = c

        def launch(*args: Any) -> None:
            if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
                return runner(*args)
            c_launch(g0, g1, g2, stream_of(device), function, coop, pdl, None, None, packed, None, None, None, *args)
        return launch

    def launch(*args: Any) -> None:
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            return runner(*args)
        run(g0, g1, g2, stream_of(device), function, packed, None, None, None, *args)
    return launch


# Triton 3.6's CudaLauncher: `__call__(gridX, gridY, gridZ, stream, function, *args)` allocates
# the kernel's global and profile scratch (None where their sizes are 0) and calls its C
# function `launch(gridX, gridY, gridZ, stream, function, launch_cooperative_grid, launch_pdl,
# global_scratch, profile_scratch, *args)`, where args are the packed metadata, the launch
# metadata, both hooks and the kernel's arguments (triton/backends/nvidia/driver.py, 3.6.0).
# 3.8 and 3.9 take other arguments there (a generic C launcher with the signature passed in), so
# only that version's layout, recognised by __call__'s parameters, goes to the C function.
_C_LAUNCH_PARAMS = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")


def c_launcher(run: Any) -> tuple | None:
    """(C launch function, launch_cooperative_grid, launch_pdl, global scratch) of a Triton 3.6
    kernel launcher `run` that needs no profile scratch; the global scratch is None, or (bytes a
    program, alignment) for a kernel that builds TMA descriptors on the device. None for any
    other launcher (its `__call__` serves)."""
    try:
        call = type(run).__call__
        params = tuple(inspect.signature(call).parameters)
        if params != _C_LAUNCH_PARAMS or not call.__module__.startswith("triton.backends.nvidia"):
            return None
        if run.profile_scratch_size:
            return None
        scratch = (run.global_scratch_size * run.num_ctas, run.global_scratch_align) if run.global_scratch_size else None
        return run.launch, run.launch_cooperative_grid, run.launch_pdl, scratch
    except (AttributeError, TypeError, ValueError):
        return None


def _with_scratch(c: tuple, runner: Callable, grid: tuple, device: int, function: Any, packed: Any, runtime: Any,
                  stream_of: Callable) -> Callable:
    """The C launch of a kernel that writes its TMA descriptors to global scratch memory (each
    program its own bytes): Triton's `__call__` allocates that scratch at every launch (BERT-base
    launched 36 such GEMMs a call); here each stream gets one buffer, allocated by Triton's
    allocator at its first launch and kept. Launches on one stream run in order, so the next
    launch on that stream rewrites the descriptors only after the last one's kernel has read
    them. A launch while the stream is being captured into a CUDA graph goes through Triton's
    runner: a graph keeps the address it captured, and could replay on another stream while this
    launcher writes that buffer."""
    from torch._C import _cuda_isCurrentStreamCapturing as capturing   # torch.cuda.is_current_stream_capturing's own call
    from triton.runtime import _allocation

    c_launch, coop, pdl, (per_program, align) = c
    (g0, g1, g2), kept = grid, {}
    size = g0 * g1 * g2 * per_program

    def launch(*args: Any) -> None:
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook) or capturing():
            return runner(*args)
        stream = stream_of(device)
        scratch = kept.get(stream)
        if scratch is None:
            scratch = kept[stream] = _allocation._allocator.get()(size, align, stream)
        c_launch(g0, g1, g2, stream, function, coop, pdl, scratch, None, packed, None, None, None, *args)
    return launch


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is set: a callable, or a `HookChain` holding one (Triton 3.5
    and newer keep an empty chain where no hook is set)."""
    return hook is not None and bool(getattr(hook, "calls", True))

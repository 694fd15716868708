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

    Where `run` is Triton 3.6's launcher and the kernel needs no scratch memory, the launch goes
    to its C function itself (`c_launcher`), without `run`'s Python frame."""
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
    if c is not None:
        c_launch, coop, pdl = c

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
    """(C launch function, launch_cooperative_grid, launch_pdl) of a Triton 3.6 kernel launcher
    `run` that allocates no scratch; None for any other (its `__call__` serves)."""
    try:
        call = type(run).__call__
        params = tuple(inspect.signature(call).parameters)
        if params != _C_LAUNCH_PARAMS or not call.__module__.startswith("triton.backends.nvidia"):
            return None
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        return run.launch, run.launch_cooperative_grid, run.launch_pdl
    except (AttributeError, TypeError, ValueError):
        return None


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is set: a callable, or a `HookChain` holding one (Triton 3.5
    and newer keep an empty chain where no hook is set)."""
    return hook is not None and bool(getattr(hook, "calls", True))

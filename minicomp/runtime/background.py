"""Background compiles: the kernels of a module's `_LATER` list compile on a pool of threads
while call() runs another form of their groups (eager's lines, cuBLAS, SDPA, or a block-language
attention kernel in front of the Gluon one: codegen/first_calls.py, codegen `Ready`).

A kernel's state turns from "held" (marked compiling, its compile not yet started) to
"pending", then to "done" or to "failed" (the other form serves for good, and a warning says
so), once; `compiled(k)` is what generated modules test (`_rt.compiled`), and
`wait_compiled()` (also `minicomp.wait_compiled`) waits for every compile this process started.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_BACKGROUND: dict[Any, str] = {}
_BACKGROUND_FUTURES: list = []
_BACKGROUND_LEFT: dict[Any, int] = {}     # an autotuned kernel's configs still compiling
_BACKGROUND_LOCK = threading.Lock()
_background_pool = None


def compiled(kernel: Any) -> bool:
    """Whether call() may launch `kernel`: its background compile has finished, or it never had
    one (no background pool: it compiles at its first launch, as any kernel)."""
    return _BACKGROUND.get(kernel, "done") == "done"


def any_pending() -> bool:
    """Whether some background compile of this process has not finished (a CUDA graph captured
    now would keep the other form: runtime/cuda_graphs.py captures only once none is)."""
    return any(state in ("held", "pending") for state in list(_BACKGROUND.values()))


def failed_kernels() -> list[str]:
    """The names of the kernels whose background compile failed (eager serves their groups)."""
    return [_kernel_name(k) for k, state in list(_BACKGROUND.items()) if state == "failed"]


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait for every background compile this process started; True when none is left."""
    import time
    from concurrent.futures import wait
    end = None if timeout is None else time.monotonic() + timeout
    while True:        # a compile's job adds its kernel's other configs before it ends: wait for those too
        with _BACKGROUND_LOCK:
            futures = list(_BACKGROUND_FUTURES)
        _, pending = wait(futures, timeout=None if end is None else max(0.0, end - time.monotonic()))
        if pending:
            return False
        with _BACKGROUND_LOCK:
            if len(_BACKGROUND_FUTURES) == len(futures):
                return True


def hold(later: list) -> list:
    """Mark the kernels of `later` that no compile has claimed yet as compiling ("held"), so
    that call() runs their groups' other form, without starting their compile
    (`compile_later(held)` does); returns those entries."""
    with _BACKGROUND_LOCK:
        held = [entry for entry in later if entry[0] not in _BACKGROUND]
        for kernel, _, _ in held:
            _BACKGROUND[kernel] = "held"
    return held


def compile_later(later: list, stubs: Callable | None = None, threads: int = 1) -> None:
    """Start the background compile of every (kernel, arguments, keywords) of `later` on a pool
    of `threads` threads (made at the first call; `CompilingAtOnce` sizes it: one while kernels
    compile for the first call too, so that the background takes no CPU from them). An
    autotuned kernel compiles each config as a job of its own, and is done when all are: its
    first config alone, then the others at once (the first fills the JIT function's per-device
    caches, which concurrent first compiles would each make and one would lose). A kernel that
    fails stays "failed" (eager serves its group for good) and says so once."""
    global _background_pool
    from concurrent.futures import Future, ThreadPoolExecutor

    def finish(kernel: Any, error: BaseException | None) -> None:
        with _BACKGROUND_LOCK:
            if _BACKGROUND.get(kernel) != "pending":
                return
            left = _BACKGROUND_LEFT[kernel] = _BACKGROUND_LEFT.get(kernel, 1) - 1
            if error is None and left > 0:
                return
            _BACKGROUND[kernel] = "done" if error is None else "failed"
        if error is not None:
            import warnings
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"minicomp: kernel {_kernel_name(kernel)} did not compile in the background ({first}): "
                          "PyTorch keeps answering for its group", RuntimeWarning, stacklevel=2)

    def build(kernel: Any, fn: Any, args: tuple, kwargs: dict, rest: list = ()) -> None:
        try:
            compiled = fn.warmup(*args, grid=(1,), **kwargs)   # no AsyncCompileMode on this thread
            for one in (compiled if isinstance(compiled, list) else [compiled]) if stubs else []:
                done: Future = Future()
                done.set_result(one)
                stubs(done)
        except Exception as e:  # noqa: BLE001 - the other form serves; the kernel is never launched
            finish(kernel, e)
            return
        with _BACKGROUND_LOCK:
            _BACKGROUND_FUTURES.extend(_background_pool.submit(build, kernel, f, args, kw) for f, kw in rest)
        finish(kernel, None)

    with _BACKGROUND_LOCK:
        if _background_pool is None:
            _background_pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="minicomp-later")
        for kernel, args, kwargs in later:
            if _BACKGROUND.get(kernel, "held") != "held":
                continue
            configs = getattr(kernel, "configs", None)      # an autotuned kernel: one job per config
            jobs = [(kernel.fn, {**kwargs, **c.all_kwargs()}) for c in configs] if configs else [(kernel, kwargs)]
            _BACKGROUND[kernel], _BACKGROUND_LEFT[kernel] = "pending", len(jobs)
            (fn, kw), rest = jobs[0], jobs[1:]
            _BACKGROUND_FUTURES.append(_background_pool.submit(build, kernel, fn, args, kw, rest))


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", None) or repr(kernel)

"""What generated modules import to run: launches, the first call's compiles, input checks.

Generated modules hold their kernels and a `call()`; the machinery around them is this
ordinary module (tested like any code, `tests/test_launch.py`), bound in each module as
`_launch = Launcher(globals())`, `_check = check_input`, ... (codegen/module.py).

**Launches** (`Launcher`). A launch through Triton (`kernel[grid](*args)`) binds every
argument, computes specialisation keys, looks the kernel up in its cache and, for autotuned
kernels, builds a tuning key: tens of microseconds of Python, longer than a memory-bound
kernel over 128 MiB takes on an H200 (~70 us). So the first launch of each kernel goes
through Triton (autotuning, JIT compilation, caches) and returns the compiled kernel, whose
own launcher (`compiled[grid](*all_args)`) is then kept with the arguments that never change
in the module (sizes, block sizes, the autotuned config) and the grid evaluated once. Later
launches call it directly. What keeps this exact:
- every integer argument of a generated kernel is a literal of its module, and the
  autotuner's key is made of them, so the config and the compiled specialisation cannot
  change between calls; a module over symbolic sizes (codegen/sizes.py) passes sizes as
  integer arguments, and its `Launcher(by_sizes=True)` keeps a fast launcher per kernel and
  integer arguments instead, so a new size goes through Triton once;
- pointer alignment could change the specialisation (Triton specialises on 16-byte alignment): a
  generated CUDA module's Launcher (`aligned=True`) trusts its launches' tensors aligned, since
  run() copies misaligned inputs to aligned memory first (`as_layouts`) and its buffers,
  constants and cuBLAS results are aligned; a launch with a tensor PyTorch made goes through
  `checked`, which tests each and sends a misaligned one through Triton (as every launch of an
  untrusting Launcher does);
- the launch is on the current CUDA device, as Triton's own is; another current device goes
  through Triton;
- a Triton whose compiled-kernel launcher takes its arguments otherwise raises TypeError
  before launching; the module then keeps to Triton's path for that kernel.
A kernel Triton's compiler rejects (found at its first launch) raises `KernelCompileError`
naming it; `minicomp.api.run_compiled` then runs that group through PyTorch instead.

**The first call compiles everything at once** (`CompilingAtOnce`). Triton compiles a kernel
on its first launch, and an autotuner each config as it first times it: one after another,
39 compiles for llama_block. A module lists every launch in `_WARM` (the kernel, its
arguments with each tensor as its dtype, which `JITFunction.warmup` takes, and keyword
arguments), and its first `call()` runs itself again inside `CompilingAtOnce(_WARM)`, which
submits every (kernel, config) through Triton's own `AsyncCompileMode` to a pool of threads
(Triton releases the GIL in its MLIR and LLVM passes and in ptxas). The mode stays open while
that call runs: a launch of a kernel still compiling waits for that compile alone, so the
kernels before the attention run while the Gluon attention kernel (the longest) compiles.
Each compile's thread also builds the kernel's launcher stub (`launcher_stubs`, a C extension
Triton 3.6 otherwise builds with gcc at the kernel's first load, ~0.25 s each). The warm-up
reports nothing: a failed compile raises at that kernel's launch. Measurements behind these
choices are in BENCHMARKS.md. `MINICOMP_COMPILE_THREADS=1` turns it off; a Triton without
`triton.runtime._async_compile` (private; 3.6 through 3.9 have it) skips it.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any, Callable

import torch

# generated modules call these as `_rt.` helpers: input checks and layouts, sizes, index checks
from minicomp.runtime import checks, index_guard
from minicomp.runtime.checks import aligned, allocator, as_layout, as_layouts, bind_size, check_input, next_pow2, scalar  # noqa: F401
from minicomp.runtime.tuning import fit_buckets, tune_bench, tune_options  # noqa: F401  (generated autotuners' `_rt.` helpers)
from minicomp.runtime.tma import align16, sm_count, tma_ready  # noqa: F401  (generated modules' `_rt.` helpers)
from minicomp.runtime.direct import _C_LAUNCH_PARAMS, c_launcher, direct  # noqa: F401  (a fast launcher's call)
# background compiles (codegen `Ready`: generated modules test `_rt.compiled(k)`)
from minicomp.runtime.background import _BACKGROUND, any_pending, compile_later, compiled, hold, wait_compiled  # noqa: F401


class KernelCompileError(RuntimeError):
    """Triton's compiler rejected kernel `kernel` of a generated module on this device."""

    def __init__(self, kernel: str, cause: BaseException | str):
        self.kernel = kernel
        self.cause = cause if isinstance(cause, str) else f"{type(cause).__name__}: {str(cause).strip()}"
        super().__init__(f"Triton's compiler rejected kernel {kernel}: {self.cause}")


def in_triton_compiler(exc: BaseException) -> bool:
    """Whether `exc` was raised while Triton compiled a kernel (its frontend, MLIR passes or
    ptxas, or a resource check of the result), not by a launch of a compiled kernel."""
    if type(exc).__name__ in ("CompilationError", "OutOfResources", "PTXASError", "CompileTimeAssertionFailure"):
        return True
    return any("/triton/compiler/" in f.filename.replace(os.sep, "/") for f in traceback.extract_tb(exc.__traceback__))


def _aligned(args: tuple) -> bool:
    """Whether every tensor argument starts on 16 bytes (what Triton specialises on); a loop,
    not `all()` over a generator: 0.9 against 1.3 us for nine arguments on the 2-core CPU
    machine, at every launch."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.data_ptr() & 15:
            return False
    return True


_device_now = checks.cuda_device_now     # read at every launch of a fast launcher


FAST_LAUNCHERS_KEPT = 4096     # (kernel, sizes) fast paths one module keeps


class Launcher:
    """`launch(kernel, grid, *args, **kwargs)`: through Triton the first time, then straight
    through the compiled kernel's own launcher. One per generated module (`namespace` is its
    globals, to name a kernel in errors). `Launcher.through_triton` counts the launches of the
    process that took Triton's path (benchmarks read it: steady calls should add none)."""

    through_triton = 0

    def __init__(self, namespace: dict | None = None, current_device: Callable[[], int] | None = None,
                 by_sizes: bool = False, aligned: bool = False):
        self.namespace = namespace if namespace is not None else {}
        self.current_device = current_device or _device_now
        # a module over symbolic sizes passes sizes as arguments: its fast launchers are kept per
        # kernel and integer arguments (the grid, the config and the specialisation follow them)
        self.by_sizes = by_sizes
        # `aligned`: the caller vouches that every tensor of a launch starts 16-byte aligned, as a
        # generated CUDA module does (its inputs laid out aligned, its own buffers), except in the
        # launches it makes through `checked`; the tensors are not tested again at each launch
        # (~7 pointers a launch, 77 launches a BERT call)
        self.trusted = aligned
        # kernel -> (launcher, arguments after the positional ones, device), or False: Triton's path
        self.fast: dict[Any, Any] = {}
        self.sites: set = set()        # kernels several groups launch (codegen/dedup.py): `by_site`

    def by_site(self, *kernels: Any) -> None:
        """Kernels launched by several groups of the module with other sizes, configs or dtypes
        (one kernel the same up to names): their fast launchers are kept per argument values
        (scalars, keyword arguments and tensor dtypes), not per kernel."""
        self.sites.update(kernels)

    def __call__(self, kernel: Any, grid: Any, *args: Any, _site: str | None = None, **kwargs: Any) -> None:
        # `_site`: a static module's launch line passes its fast launcher's key, its kernel's name
        # and a digest of its dtypes and literal arguments written at codegen (codegen/launch.py
        # `site_key`), so no key is built from the arguments at each call (~2 us a launch)
        if _site is not None:
            key: Any = _site
        elif kernel in self.sites:
            key = (kernel, tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args),
                   tuple(kwargs.items()))
        elif self.by_sizes:
            key = (kernel, tuple(a for a in args if type(a) is int))
        else:
            key = kernel
        fast = self.fast.get(key)
        if fast and fast[2] == self.current_device() and (self.trusted or _aligned(args)):
            try:
                fast[0](*args, *fast[1])
                return
            except TypeError:  # this Triton's launcher takes its arguments otherwise: keep to Triton's path
                self.fast[key] = False
        self._through_triton(kernel, grid, args, kwargs, key, fast, self.trusted or _aligned(args))

    def checked(self, kernel: Any, grid: Any, *args: Any, _site: str | None = None, **kwargs: Any) -> None:
        """A launch whose tensors the caller cannot vouch for (one PyTorch made: a view at an
        offset, a fallback's result): through the fast launcher when all are aligned, else through
        Triton (a specialisation for them), keeping no fast launcher."""
        if _aligned(args):
            return self(kernel, grid, *args, _site=_site, **kwargs)
        self._through_triton(kernel, grid, args, kwargs, None, None, keep=False)

    def _through_triton(self, kernel: Any, grid: Any, args: tuple, kwargs: dict, key: Any, fast: Any,
                        keep: bool) -> None:
        """Triton's launch (its JIT and autotuner), then, where none was kept for `key` and `keep`
        says the tensors are aligned, the compiled kernel's own launcher kept for the next ones."""
        Launcher.through_triton += 1
        try:
            compiled = kernel[grid](*args, **kwargs)
            if hasattr(compiled, "result"):  # Triton 3.9 inside AsyncCompileMode returns the pending compile
                compiled = compiled.result()
        except Exception as exc:
            if not fast and in_triton_compiler(exc):
                raise KernelCompileError(self.name_of(kernel), exc) from exc
            raise
        if fast is None and keep:
            if len(self.fast) >= FAST_LAUNCHERS_KEPT:
                self.fast.pop(next(iter(self.fast)))     # the oldest size goes first
            self.fast[key] = self.fast_launcher(kernel, compiled, grid, args, kwargs)

    def name_of(self, kernel: Any) -> str:
        return next((k for k, v in self.namespace.items() if v is kernel), getattr(kernel, "__name__", "?"))

    def fast_launcher(self, kernel: Any, compiled: Any, grid: Any, args: tuple, kwargs: dict):
        """The compiled kernel's launcher for `grid`, with every argument after the positional ones."""
        try:
            named = dict(kwargs)
            config = getattr(kernel, "best_config", None)  # an autotuned kernel's chosen config
            if config is not None:
                named.update(config.kwargs)
            names = list(kernel.arg_names)
            tail = [named[n] for n in names[len(args):]]
            if callable(grid):
                grid = grid({**dict(zip(names, args)), **named})
            grid = tuple(grid) + (1,) * (3 - len(grid))
            device = self.current_device()
            return direct(compiled, grid, device) or compiled[grid], tail, device
        except Exception:  # anything unexpected: Triton's path, as before
            return False


_index_launch = Launcher(by_sizes=True)     # check_index's kernel, per (size, range)


def check_index(t: torch.Tensor, lo: int, hi: int, dim: int, size: int, error: str, what: str) -> None:
    """`checks.check_index`; a CUDA tensor on the current device is checked by one kernel and a
    device-side assertion (runtime/index_guard.py) where PyTorch ops took five dispatches and four
    kernels (a tensor on another device keeps those: they run on the tensor's own device)."""
    if t.is_cuda and t.numel() and t.get_device() == _device_now():   # Triton launches on the current device
        index_guard.assert_in_range(t, lo, hi, checks.index_message(what, dim, size), _index_launch)
        return
    checks.check_index(t, lo, hi, dim, size, error, what)


class CompilingAtOnce:
    """While open, every (kernel, config) of `warm` compiles on a pool of threads, and a launch
    waits for its own kernel's compile only (Triton's AsyncCompileMode hands a launch of a kernel
    still compiling that compile's result). Closing waits for any compile left. The kernels of
    `later` are marked compiling on entry (`hold`: the call launches their groups' other form)
    and start compiling in the background on closing (`compile_later`), which does not wait for
    them: started at entry, their threads took the interpreter lock from the call's own eager
    lines. `warm` and `later` are emptied on entry, so a module starts them once; it never
    raises on its own."""

    def __init__(self, warm: list, threads: int | None = None, environ: dict | None = None,
                 later: list | None = None):
        self.warm, self.threads, self.later = warm, threads, later if later is not None else []
        self.environ = os.environ if environ is None else environ

    def __enter__(self) -> "CompilingAtOnce":
        self.pool = self.mode = None
        self.held: list = []
        jobs, self.warm[:] = list(self.warm), []
        later, self.later[:] = list(self.later), []
        try:
            from concurrent.futures import ThreadPoolExecutor

            from triton.runtime._async_compile import AsyncCompileMode
        except ImportError:  # a Triton without asynchronous compilation: each kernel compiles on its first launch
            return self
        if later and compile_threads(self.environ) >= 2:
            self.held = hold(later)
        work = []
        for kernel, args, kwargs in jobs:
            configs = getattr(kernel, "configs", None)  # an autotuned kernel: warm its JIT function per config
            for config in configs or [None]:
                work.append((kernel.fn if configs else kernel, args,
                             {**kwargs, **(config.all_kwargs() if config else {})}))
        threads = min(len(work), self.threads if self.threads is not None else compile_threads(self.environ))
        if threads < 2:
            return self
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="minicomp-compile")
        try:
            mode = AsyncCompileMode(self.pool, ignore_errors=True)
            mode.__enter__()
        except RuntimeError:  # the caller's own AsyncCompileMode is open: compile on first launch
            self.pool.shutdown(wait=False)
            self.pool = None
            return self
        self.mode = mode
        stubs = launcher_stubs(self.environ)
        for fn, args, kwargs in work:
            try:
                pending = fn.warmup(*args, grid=(1,), **kwargs)
            except Exception:  # the launch compiles it again and reports what went wrong
                continue
            future = getattr(pending, "future", None)  # Triton's FutureKernel
            if stubs is not None and future is not None:
                future.add_done_callback(stubs)      # in the thread that compiled the kernel, once it has
        return self

    def __exit__(self, *exc: Any) -> bool:
        try:
            if self.mode is not None:
                self.mode.__exit__(None, None, None)
        finally:
            if self.held:   # half the compile threads: the other half serve later modules' first calls
                compile_later(self.held, launcher_stubs(self.environ), threads=compile_threads(self.environ) // 2)
            if self.pool is not None:
                self.pool.shutdown(wait=True)
        return False


def warm_up(warm: list, threads: int | None = None, environ: dict | None = None) -> None:
    """Compile every (kernel, config) of `warm` at once and wait for all of them."""
    with CompilingAtOnce(warm, threads, environ):
        pass


def launcher_stubs(environ: dict | None = None) -> Callable | None:
    """A callback for a compile's future that builds the compiled kernel's launcher stub (a C
    extension Triton compiles the first time it loads a kernel of a new signature), leaving it
    in Triton's cache for that load to find; one build per signature. None where Triton's driver
    has no launcher class, or MINICOMP_WARM_LAUNCHERS=0."""
    env = os.environ if environ is None else environ
    if env.get("MINICOMP_WARM_LAUNCHERS") == "0":
        return None
    try:
        from triton.runtime.driver import driver
        launcher_cls = driver.active.launcher_cls
    except Exception:
        return None
    built, lock = set(), threading.Lock()

    def build(future: Any) -> None:
        try:
            compiled = future.result()
            src = compiled.src
            key = repr((sorted(src.signature.items(), key=repr), sorted(getattr(src, "constants", {}).items(), key=repr),
                        getattr(compiled.metadata, "tensordesc_meta", None)))
            with lock:
                if key in built:
                    return
                built.add(key)
            launcher_cls(src, compiled.metadata)
        except Exception:  # the first launch builds it, and reports what went wrong
            pass
    return build


def compile_threads(environ: dict | None = None) -> int:
    """MINICOMP_COMPILE_THREADS, else the CPUs this process may use, at most 16."""
    env = os.environ if environ is None else environ
    try:
        return int(env["MINICOMP_COMPILE_THREADS"])
    except (KeyError, ValueError):
        pass
    try:
        return min(16, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this OS
        return min(16, os.cpu_count() or 1)

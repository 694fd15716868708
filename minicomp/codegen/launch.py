"""Kernel launches in generated CUDA modules: Triton's path once, the compiled launcher after.

A launch through Triton (`kernel[grid](*args)`) binds every argument, computes
specialisation keys, looks the kernel up in its cache and, for autotuned kernels, builds a
tuning key: tens of microseconds of Python per launch, which is longer than a memory-bound
kernel over 128 MiB takes on an H200 (~70 us). Measured with `triton.testing.do_bench`
(which flushes L2 with a ~65 us kernel before each run) the GPU then sits waiting for the
host, and softmax over 16384x4096 timed 0.18 ms for a 0.07 ms kernel.

So a generated CUDA module launches through `_launch(kernel, grid, *args, **kwargs)`
(`LAUNCH_HELPER`, written into the module so that it still runs on its own). The first
launch of each kernel goes through Triton: autotuning, JIT compilation, caches. It returns
the compiled kernel, whose own launcher (`compiled[grid](*all_args)`) is then kept with
the arguments that never change in this module (sizes, block sizes, the autotuned
config) and the grid evaluated once. Later launches call it directly.

What keeps this exact:
- Every integer argument of a generated kernel is a literal of the module, and the
  autotuner's key is made of them, so the config and the compiled specialisation cannot
  change between calls. Pointer alignment can: Triton specialises on 16-byte alignment, so
  a call with a tensor that is not 16-byte aligned (a view at an odd offset) goes through
  Triton again, every time. (Generated modules copy misaligned inputs, weights and fallback
  outputs to aligned memory before any kernel sees them, `_as_layout`, so this is a net.)
- The launch is on the current CUDA device, as Triton's own is; a call made with another
  current device goes through Triton.
- A Triton whose compiled-kernel launcher does not take the arguments this way raises
  TypeError before launching; the module then keeps to Triton's path for that kernel.

Compiling at once (`WARM_HELPER`, `warm_entries`). Triton compiles a kernel on its first
launch, and an autotuner compiles each of its configs as it first benchmarks it: one after
another, 39 compiles for llama_block. A generated CUDA module therefore lists every launch
in `_WARM` -- the kernel, its arguments with each tensor written as its dtype (what
`JITFunction.warmup` takes: a dtype stands for an aligned tensor, which every tensor here
is), and its keyword arguments. The first `call()` runs itself again inside
`_compiling_at_once()`, which submits every (kernel, config) through Triton's own
`AsyncCompileMode` to a pool of threads (Triton releases the GIL in its MLIR and LLVM
passes and in ptxas, so the compiles overlap; 2.26 -> 1.31 s for four GEMM configs on this
2-core machine). Measured on the H200 with
`benchmarks/first_call.py` (fresh process, empty caches): llama_block's first call went
from 29.6 s to 18.6 s, gpt_block's from 18.6 s to 12.7 s; most of what was left was the
autotuners timing each config, which `_tune_bench` (module.py) then cut.

Each compile's thread then also builds the kernel's launcher stub (`_launcher_stubs`): a
small C extension per kernel signature that Triton 3.6 compiles with gcc when it first
loads a kernel, ~0.25 s each, which the first call otherwise paid one after another
(1.4 s of llama_block's).

The mode stays open while that first call runs: a launch of a kernel still compiling waits
for that compile alone (Triton keys its pending compiles by cache key and hands the launch
the same future), so the kernels before the attention run, and their autotuners time their
configs on the GPU, while the Gluon attention kernel (~4.5 s to compile on the H200's host,
the longest) is still compiling. Waiting for every compile first (`_warm_up()`, which
`benchmarks/first_call.py --apart` calls to time the two apart) left the GPU idle for that
time: `benchmarks/warm_up_timeline.py` showed llama_block's other 35 compiles done at
3.1 s of a 4.85 s warm-up, then 0.81 s of autotuning after it.

The warm-up itself reports nothing: a compile that failed raises its error at that
kernel's launch, as a launch that compiled it would (and an autotuner benchmarking that
config handles it as it handles a compile of its own). `MINICOMP_COMPILE_THREADS=1` turns it off, and a Triton without
`triton.runtime._async_compile` (a private module, present in 3.6 through 3.9) skips it.
"""

from __future__ import annotations

import ast
from typing import Callable

LAUNCH_HELPER = '''\
_FAST = {}  # kernel -> (launcher, arguments after the positional ones, device), or False: Triton's path


def _aligned(args):
    return all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))


def _launch(kernel, grid, *args, **kwargs):
    """Launch `kernel` over `grid`: through Triton the first time, then straight through the
    compiled kernel's own launcher (see minicomp/codegen/launch.py)."""
    fast = _FAST.get(kernel)
    if fast and fast[2] == torch.cuda.current_device() and _aligned(args):
        try:
            fast[0](*args, *fast[1])
            return
        except TypeError:  # this Triton's launcher takes its arguments otherwise: keep to Triton's path
            _FAST[kernel] = False
    try:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):  # Triton 3.9 inside AsyncCompileMode (the first call) returns the pending compile
            compiled = compiled.result()
    except Exception as exc:
        if not fast and _in_triton_compiler(exc):
            name = next((k for k, v in globals().items() if v is kernel), getattr(kernel, "__name__", "?"))
            raise KernelCompileError(name, exc) from exc
        raise
    if fast is None and _aligned(args):
        _FAST[kernel] = _fast_launcher(kernel, compiled, grid, args, kwargs)


class KernelCompileError(RuntimeError):
    """Triton's compiler rejected kernel `kernel` of this module on this device: minicomp runs
    its group through PyTorch instead (api.py); run on its own, the module stops here."""

    def __init__(self, kernel, cause):
        self.kernel = kernel
        self.cause = f"{type(cause).__name__}: {str(cause).strip()}"
        super().__init__(f"Triton's compiler rejected kernel {kernel}: {self.cause}")


def _in_triton_compiler(exc):
    """Whether `exc` was raised while Triton compiled a kernel (its frontend, MLIR passes or
    ptxas, or a resource check of the result), not by a launch of a compiled kernel."""
    import traceback
    if type(exc).__name__ in ("CompilationError", "OutOfResources", "PTXASError", "CompileTimeAssertionFailure"):
        return True
    return any("/triton/compiler/" in f.filename.replace(os.sep, "/") for f in traceback.extract_tb(exc.__traceback__))


def _fast_launcher(kernel, compiled, grid, args, kwargs):
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
        return compiled[grid], tail, torch.cuda.current_device()
    except Exception:  # anything unexpected: Triton's path, as before
        return False'''


WARM_HELPER = '''\
class _compiling_at_once:
    """While open, every (kernel, config) of `_WARM` compiles on a pool of threads, and a
    launch waits for its own kernel's compile only: Triton's AsyncCompileMode hands a launch
    of a kernel still compiling that compile's result (see minicomp/codegen/launch.py).
    Closing waits for any compile left. Starts once per module; never raises on its own."""

    def __enter__(self):
        self.pool = self.mode = None
        jobs, _WARM[:] = list(_WARM), []
        try:
            from concurrent.futures import ThreadPoolExecutor
            from triton.runtime._async_compile import AsyncCompileMode
        except ImportError:  # a Triton without asynchronous compilation: each kernel compiles on its first launch
            return self
        work = []
        for kernel, args, kwargs in jobs:
            configs = getattr(kernel, "configs", None)  # an autotuned kernel: warm its JIT function per config
            for config in configs or [None]:
                work.append((kernel.fn if configs else kernel, args, {**kwargs, **(config.all_kwargs() if config else {})}))
        threads = min(len(work), _compile_threads())
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
        stubs = _launcher_stubs()
        for fn, args, kwargs in work:
            try:
                pending = fn.warmup(*args, grid=(1,), **kwargs)
            except Exception:  # the launch compiles it again and reports what went wrong
                continue
            future = getattr(pending, "future", None)  # Triton's FutureKernel
            if stubs is not None and future is not None:
                # in the thread that compiled the kernel, once it has
                future.add_done_callback(stubs)
        return self

    def __exit__(self, *exc):
        try:
            if self.mode is not None:
                self.mode.__exit__(None, None, None)
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
        return False


def _warm_up():
    """Compile every (kernel, config) of `_WARM` at once and wait for all of them. Runs once."""
    with _compiling_at_once():
        pass


def _launcher_stubs():
    """A callback for a compile's future that builds the compiled kernel's launcher stub, a C
    extension Triton compiles with the host's C compiler the first time it loads a kernel of a
    new signature (~0.25 s each on the H200's host, one after another on the first call
    otherwise). Building it here leaves it in Triton's cache for that load to find; one build
    per signature. None where Triton's driver has no launcher class, or
    MINICOMP_WARM_LAUNCHERS=0."""
    if os.environ.get("MINICOMP_WARM_LAUNCHERS") == "0":
        return None
    try:
        import threading
        from triton.runtime.driver import driver
        launcher_cls = driver.active.launcher_cls
    except Exception:
        return None
    built, lock = set(), threading.Lock()

    def build(future):
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


def _compile_threads():
    """MINICOMP_COMPILE_THREADS, else the CPUs this process may use, at most 16."""
    try:
        return int(os.environ["MINICOMP_COMPILE_THREADS"])
    except (KeyError, ValueError):
        pass
    try:
        return min(16, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this OS
        return min(16, os.cpu_count() or 1)'''


def _launch_call(line: str, kernel_name: str) -> ast.Call | None:
    """The call `kernel_name[grid](args)` that `line` is, or None."""
    try:
        tree = ast.parse(line.strip(), mode="eval").body
    except SyntaxError:
        return None
    if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Subscript)
            and isinstance(tree.func.value, ast.Name) and tree.func.value.id == kernel_name):
        return tree
    return None


def via_launch_helper(lines: list[str], kernel_name: str) -> list[str]:
    """Rewrite each `kernel_name[grid](args)` launch line as `_launch(kernel_name, grid, args)`."""
    out = []
    for line in lines:
        tree = _launch_call(line, kernel_name)
        if tree is None:
            out.append(line)
            continue
        stripped = line.strip()
        grid = ast.get_source_segment(stripped, tree.func.slice)
        rest = [ast.get_source_segment(stripped, a) for a in tree.args]
        rest += [f"{k.arg}={ast.get_source_segment(stripped, k.value)}" for k in tree.keywords]
        indent = line[:len(line) - len(line.lstrip())]
        out.append(f"{indent}_launch({', '.join([kernel_name, grid] + rest)})")
    return out


def warm_entries(lines: list[str], kernel_name: str, dtype_of: Callable[[str], str | None]) -> list[str]:
    """`_WARM` entries for the launches of `kernel_name` among `lines`: `(kernel, args, kwargs)`
    with each tensor argument written as its dtype, which is what Triton's `warmup` takes.

    `dtype_of("buf7")` is the dtype text of that tensor ("torch.bfloat16"), or None. An argument
    that is neither a tensor (`bufN`, `_align16(bufN)`) nor a literal makes the launch
    unwarmable: it compiles on its first launch, as without warm-up."""
    def value(node: ast.expr) -> str | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_align16" \
                and len(node.args) == 1 and not node.keywords:
            node = node.args[0]
        if isinstance(node, ast.Name):
            return dtype_of(node.id)
        try:
            ast.literal_eval(node)
        except ValueError:
            return None
        return ast.unparse(node)

    out = []
    for line in lines:
        tree = _launch_call(line, kernel_name)
        if tree is None:
            continue
        args = [value(a) for a in tree.args]
        kwargs = {k.arg: value(k.value) for k in tree.keywords}
        if None in args or None in kwargs.values() or None in kwargs:
            continue
        items = ", ".join(f"{k!r}: {v}" for k, v in kwargs.items())
        out.append(f"({kernel_name}, ({', '.join(args)}{',' if len(args) == 1 else ''}), {{{items}}}),")
    return out

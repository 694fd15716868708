"""The GPU-true check's worker: compiles a generated CUDA module's kernels for a GPU target.

Run as a script (`python target_worker.py`) by `target_check.py`, never imported by minicomp:
it must run without Triton's interpreter, and a process that imported minicomp on a machine
without CUDA has the interpreter on (it decides when `triton.language` is first imported).
It sets TRITON_INTERPRET=0 before anything imports triton; the modules it loads import
minicomp's runtime, which leaves an explicit setting alone.

Protocol: one JSON object per line on stdin, `{"source": <module text>, "arch": 90,
"depth": "full"}`; one JSON object per line on stdout, `{"results": [...], "seconds": {...}}`
with an entry per (kernel, config) compiled: `{"kernel", "config", "error", "resources",
"shared", "digest", "stage"}`, and the seconds spent compiling to each stage. `error` is None
or Triton's message; `resources` says the failure was a resource limit (an autotuner skips
such a config).

How a kernel is compiled: the module's `_WARM` list holds every launch with its tensors
written as dtypes, which is what `JITFunction.warmup` takes. A stub driver answers Triton's
questions about the current device with the target, so `warmup` binds and specialises the
arguments exactly as a launch would, then compiles through Triton's own stages down to a
cubin (ptxas included). Triton's disk cache makes a kernel seen before cost milliseconds.

Depth "full" compiles every (kernel, config) to a cubin. Depth "sampled" (the test suite's)
compiles a kernel's least demanding config all the way down to a cubin (its shared memory
measured) and a sample of its other configs through Triton's frontend and TritonGPU passes,
which is where a kernel's text and a config's layout are checked: the opposite corner (the
most demanding config) and the first and the last of the autotuner's table (`sample`). A
text bug fails every config, so a sample finds it; a layout that only one middle config
trips is "full"'s to find. Measured (2 cores, cold cache): a config costs about 0.45 s to a
cubin, 0.13 s to the TritonGPU passes; an 8-config row kernel took 1.4 s when all 7 others
went to the TritonGPU passes. The shorter pipeline is cut with Triton's
`add_stages_inspection_hook`, whose key is part of Triton's cache key (Triton 3.9), so a cut
compile is never served to a launch; a Triton that does not key it compiles "sampled" as "full".
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import linecache
import os
import sys
import time
import traceback
import types

os.environ["TRITON_INTERPRET"] = "0"

# Most shared memory one program may use, by compute capability (CUDA's documented limits).
MAX_SHARED = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


class StubDriver:
    """What `JITFunction.run(warmup=True)` asks of the active driver, answered for `target`."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _is_resource_error(exc: BaseException) -> bool:
    """A limit of the device (shared memory, registers), not a fault of the kernel's text."""
    name, text = type(exc).__name__, str(exc).lower()
    return name == "OutOfResources" or (name == "PTXASError" and ("shared" in text or "registers" in text))


def _config_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def _demand(config) -> int:
    """How much of the device a config asks for (blocks x warps x stages): the "sampled"
    depth compiles the least demanding config of a kernel to a cubin."""
    if config is None:
        return 0
    size = 1
    for value in config.kwargs.values():
        size *= value if isinstance(value, int) and value > 0 else 1
    return size * config.num_warps * max(config.num_stages, 1)


def sample(configs: list) -> list:
    """The configs the "sampled" depth compiles, least demanding first (it goes to a cubin):
    the least and the most demanding (the corners of the table, where a layout is thinnest
    or widest) and the first and the last the table lists. `[None]` for an untuned kernel."""
    if not configs:
        return [None]
    least, most = min(configs, key=_demand), max(configs, key=_demand)
    picked = [least]
    for config in (most, configs[0], configs[-1]):
        if all(config is not p for p in picked):
            picked.append(config)
    return picked


def _cut_after_ttgir(*args):
    """Triton's stage hook: called bare for the cache key, else with the stage table to edit.
    The LLVM, PTX and ptxas stages give way to one that ends the pipeline with an empty binary
    and the metadata fields Triton's kernel record reads (`shared` None: not measured)."""
    if not args:
        return "minicomp-check-ttgir", "minicomp-check-ttgir-1"
    stages = args[1]
    for name in [n for n in stages if n in ("llir", "ptx", "cubin")]:
        del stages[name]

    def end(src, metadata):
        metadata.setdefault("name", "kernel")
        metadata.setdefault("shared", None)
        return b""
    stages["cubin"] = end


@functools.lru_cache(maxsize=None)
def _cut_is_keyed() -> bool:
    """Whether this Triton puts the stage hook's key into its kernel cache keys (3.9 does;
    older releases call the hook only to edit the stages, and a cut compile would then be
    cached under a launch's key). Without it, "sampled" is compiled as "full"."""
    try:
        from triton.runtime.jit import JITFunction
        return "add_stages_inspection_hook()" in inspect.getsource(JITFunction.run)
    except (ImportError, OSError, TypeError, AttributeError):
        return False


def check_module(source: str, arch: int, counter: list[int], depth: str = "full",
                 seconds: dict | None = None) -> list[dict]:
    """One entry per (kernel, config) compiled for `sm_<arch>` at `depth`; `seconds` (when
    given) gains the time spent compiling to each stage."""
    seconds = {} if seconds is None else seconds
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(StubDriver(GPUTarget("cuda", arch, 32)))
    counter[0] += 1
    filename = f"<minicomp-target-check-{counter[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"minicomp_target_check_{counter[0]}")
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    names = {id(value): name for name, value in vars(module).items()}  # a library kernel is bound under the group's name
    if depth != "full" and not _cut_is_keyed():
        depth = "full"
    work = []
    for kernel, args, kwargs in getattr(module, "_WARM", []) + getattr(module, "_LATER", []):
        configs = getattr(kernel, "configs", None)
        fn = kernel.fn if configs else kernel
        name = names.get(id(kernel), fn.__name__)
        text = inspect.getsource(fn.fn).replace(fn.__name__, "KERNEL", 1)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        chosen = sample(configs) if depth == "sampled" else (configs or [None])
        least = chosen[0] if depth == "sampled" else None
        for config in chosen:
            full = {**kwargs, **(config.all_kwargs() if config else {})}
            stage = "cubin" if depth == "full" or config is least else "ttgir"
            entry = {"kernel": name, "config": _config_text(full), "error": None, "resources": False,
                     "shared": None, "digest": digest, "stage": stage}
            work.append((entry, fn, args, full))
    started = time.perf_counter()
    done = _compile_all([w for w in work if w[0]["stage"] == "cubin"])
    seconds["cubin"] = seconds.get("cubin", 0.0) + time.perf_counter() - started
    cut = [w for w in work if w[0]["stage"] == "ttgir"]
    if cut:
        from triton import knobs
        started = time.perf_counter()
        knobs.runtime.add_stages_inspection_hook = _cut_after_ttgir
        try:
            done += _compile_all(cut)
        finally:
            knobs.runtime.add_stages_inspection_hook = None
        seconds["ttgir"] = seconds.get("ttgir", 0.0) + time.perf_counter() - started
    for entry, compiled in done:
        if isinstance(compiled, BaseException):
            entry["error"] = _message(compiled)
            entry["resources"] = _is_resource_error(compiled)
            continue
        shared = getattr(getattr(compiled, "metadata", None), "shared", None)
        entry["shared"] = shared
        limit = MAX_SHARED.get(arch)
        if shared is not None and limit is not None and shared > limit:
            entry["error"] = f"OutOfResources: needs {shared} bytes of shared memory, sm_{arch} has {limit}"
            entry["resources"] = True
    return [entry for entry, *_ in work]


def _compile_all(work: list) -> list:
    """(entry, compiled kernel or the exception its compile raised) for each item of `work`.
    Compiles run on a pool of threads through Triton's AsyncCompileMode where this Triton has
    it (its MLIR and LLVM passes and ptxas release the GIL), else one after another."""
    def one(fn, args, kwargs):
        try:
            return fn.warmup(*args, grid=(1,), **kwargs)
        except Exception as exc:  # Triton's rejection is the result we report
            return exc

    threads = min(len(work), os.cpu_count() or 1)
    try:
        from concurrent.futures import ThreadPoolExecutor
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        threads = 1
    if threads < 2:
        return [(entry, one(fn, args, kwargs)) for entry, fn, args, kwargs in work]
    out = []
    with ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool, ignore_errors=True):
        pending = [(entry, one(fn, args, kwargs)) for entry, fn, args, kwargs in work]
        for entry, p in pending:
            if hasattr(p, "result") and not isinstance(p, BaseException):
                try:
                    p = p.result()
                except Exception as exc:  # the compile in the pool failed
                    p = exc
                if p is None:          # a second wait on a compile that failed before
                    p = RuntimeError("compile failed (reported for another config with the same key)")
            out.append((entry, p))
    return out


def main() -> None:
    counter = [0]
    out = sys.stdout
    sys.stdout = sys.stderr          # nothing Triton prints may corrupt the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            seconds: dict[str, float] = {}
            reply = {"results": check_module(request["source"], int(request["arch"]), counter,
                                             request.get("depth", "full"), seconds), "seconds": seconds}
        except Exception:            # the module itself failed: report it whole
            reply = {"failure": traceback.format_exc(limit=8)}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

"""When each compile of a generated module's first call ran, in a fresh process with empty caches.

    python benchmarks/ablations/warm_up_timeline.py [--apart] [NAME]     (default llama_block; needs CUDA)

The first call (`CompilingAtOnce`, runtime/launcher.py) submits every (kernel, config) to a
pool of threads and launches each kernel once its compile is done. This prints, relative to
the call's start: when the main thread finished submitting, each compile's start and end on
its thread, and the sum of the compiles' own times against the wall time (the ratio is how
many ran at once, on average). `--apart` compiles everything first (`launcher.warm_up(_WARM)`) and times
the call after it separately, as before the launches overlapped the compiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def child(name: str, apart: bool) -> None:
    import torch
    import triton.compiler
    import triton.compiler.compiler as compiler

    from benchmarks.workloads import WORKLOADS
    events: list[tuple[str, str, float, float]] = []
    submitted: list[float] = []
    original = compiler.compile

    def timed_compile(src, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(src, *args, **kwargs)
        finally:
            events.append((getattr(src, "name", "?"), threading.current_thread().name, t0, time.perf_counter()))
    compiler.compile = triton.compiler.compile = timed_compile

    from triton.runtime import _async_compile
    submit = _async_compile.AsyncCompileMode.submit

    def timed_submit(self, *args, **kwargs):
        out = submit(self, *args, **kwargs)
        submitted.append(time.perf_counter())
        return out
    _async_compile.AsyncCompileMode.submit = timed_submit

    import minicomp
    built = WORKLOADS[name].build("cuda", torch.bfloat16, False)
    torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))
    torch.cuda.synchronize()
    fn = minicomp.compile(built.fn)
    t = time.perf_counter()
    module = fn.compile_for(*built.inputs).call.module
    own = time.perf_counter() - t
    start = time.perf_counter()
    if apart:
        module._rt.warm_up(module._WARM)
    warmed = time.perf_counter()
    fn(*built.inputs)
    torch.cuda.synchronize()
    end = time.perf_counter()
    print(f"{name}: own compile {own:.2f} s; " + (f"warm-up {warmed - start:.2f} s, then " if apart else "")
          + f"first call {end - warmed:.2f} s")
    if submitted:
        print(f"first submit at {submitted[0] - start:.2f} s, last at {submitted[-1] - start:.2f} s "
              f"({len(submitted)} compiles)")
    busy = sum(e - s for _, _, s, e in events)
    print(f"compiles: {len(events)}, their own times sum to {busy:.2f} s over a {end - start:.2f} s wall "
          f"({busy / max(end - start, 1e-9):.1f} at once on average)")
    for kernel, thread, s, e in sorted(events, key=lambda ev: ev[2]):
        print(f"  {s - start:6.2f} -> {e - start:6.2f}  ({e - s:5.2f} s)  {thread:22s} {kernel}")
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2:] == ["--apart"])
        return 0
    apart = "--apart" in argv
    names = [a for a in argv if a != "--apart"]
    name = names[0] if names else "llama_block"
    with tempfile.TemporaryDirectory(prefix="warm-up-") as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=f"{tmp}/triton", MINICOMP_CACHE_DIR=f"{tmp}/minicomp",
                   PYTHONUNBUFFERED="1")
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name]
                              + (["--apart"] if apart else []), env=env,
                              capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    if proc.returncode:
        print(proc.stderr[-5000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

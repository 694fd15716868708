"""Where a workload's first call in a fresh process goes, with and without compiling at once.

    python benchmarks/ablations/first_call.py [--threads 1,16] [--apart] [--profile] NAME [NAME ...]

For each workload and each `--threads` value (MINICOMP_COMPILE_THREADS: 1 turns the
warm-up off, so every kernel compiles on its first launch, one after another), a fresh
child process with empty Triton and minicomp caches measures, in order:

- `import_s`: importing minicomp (torch and triton are imported before the clock starts);
- `own_s`: capture to loaded module (minicomp's own compile, no Triton);
- `warm_up_s`: with `--apart` only, `launcher.warm_up(module._WARM)`: every (kernel,
  config) compiled on a pool of threads before the call (0 with one thread);
- `first_call_s`: the call itself: without `--apart`, as a user's first call runs, the
  compiles on the pool with each launch waiting for its own kernel; then the autotuning
  sweeps (benchmarking each config), loading the compiled kernels, and the launches;
- `total_s`: the sum, which is what `benchmarks/run.py` reports as the first call;
- `tracer`: which tracer captured (`eager`, or `fake` where the eager tracer declined or
  `MINICOMP_CAPTURE=fake`), and `dynamo`: whether anything imported `torch._dynamo` by the end.

`--profile` adds the child's top cProfile entries (by cumulative time) for its own compile
and for the first call.
The run.py suite's fresh-process figure also includes CUDA context set-up; this one warms
the context before the clock, as run.py does. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "FIRST_CALL "


def child(name: str, profile: bool, apart: bool) -> None:
    import torch
    import triton  # noqa: F401  (imported before the clock, as torch is)

    from benchmarks.workloads import WORKLOADS
    built = WORKLOADS[name].build("cuda", torch.bfloat16, False)
    torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))
    torch.cuda.synchronize()
    rec = {}
    t0 = time.perf_counter()
    import minicomp
    rec["import_s"] = time.perf_counter() - t0
    fn = minicomp.compile(built.fn)
    prof = start_profile() if profile else None
    t0 = time.perf_counter()
    module = fn.compile_for(*built.inputs).call.module
    rec["own_s"] = time.perf_counter() - t0
    if prof:
        print_profile(prof, "own compile")
    rec["kernels"] = len(getattr(module, "_WARM", []))
    rec["configs"] = sum(len(getattr(k, "configs", None) or [None]) for k, _, _ in getattr(module, "_WARM", []))
    t0 = time.perf_counter()
    if apart and hasattr(module, "_WARM"):
        module._rt.warm_up(module._WARM)
    rec["warm_up_s"] = time.perf_counter() - t0
    prof = start_profile() if profile else None
    t0 = time.perf_counter()
    out = fn(*built.inputs)
    torch.cuda.synchronize()
    rec["first_call_s"] = time.perf_counter() - t0
    if prof:
        print_profile(prof, "first call")
    rec["total_s"] = rec["import_s"] + rec["own_s"] + rec["warm_up_s"] + rec["first_call_s"]
    rec["tracer"] = fn.tracer
    rec["dynamo"] = "yes" if "torch._dynamo" in sys.modules else "no"    # imported by anything so far
    del out
    print(MARKER + json.dumps(rec), flush=True)
    os._exit(0)


def start_profile():
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    return prof


def print_profile(prof, what: str) -> None:
    import io
    import pstats
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
    print(f"--- {what}, by cumulative time\n{text.getvalue()}", file=sys.stderr)


def run_child(name: str, threads: int, profile: bool, apart: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="first-call-") as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=f"{tmp}/triton", MINICOMP_CACHE_DIR=f"{tmp}/minicomp",
                   MINICOMP_COMPILE_THREADS=str(threads), PYTHONUNBUFFERED="1")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name] + (["--profile"] if profile else []) \
            + (["--apart"] if apart else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if profile or proc.returncode != 0:
        print(proc.stderr[-20000:], file=sys.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        return {"error": f"child exited {proc.returncode}"}
    return json.loads(lines[-1][len(MARKER):])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+")
    p.add_argument("--threads", default="1,16", help="comma-separated MINICOMP_COMPILE_THREADS values")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--apart", action="store_true", help="compile every kernel before the first call, timed apart")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.names[0], args.profile, args.apart)
        return 0
    keys = ("kernels", "configs", "import_s", "own_s", "warm_up_s", "first_call_s", "total_s", "tracer", "dynamo")
    print(f"{'workload':<14} {'threads':>7} " + " ".join(f"{k:>12}" for k in keys))
    for name in args.names:
        for threads in (int(t) for t in args.threads.split(",")):
            rec = run_child(name, threads, args.profile, args.apart)
            if "error" in rec:
                print(f"{name:<14} {threads:>7} {rec['error']}")
                continue
            cells = [f"{rec[k]:>12.2f}" if isinstance(rec[k], float) else f"{rec[k]:>12}" for k in keys]
            print(f"{name:<14} {threads:>7} " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

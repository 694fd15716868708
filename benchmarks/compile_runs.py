"""The suite's compile-time runs: each workload's first call through a backend, in a fresh
process with empty temporary cache directories for Inductor, Triton and minicomp.

`compile_time_runs` starts `run.py --compile-time-child NAME --backend B` per (workload,
backend), `--compile-jobs` at a time, within what is left of the run's budget; the child
(`child_main`) builds the workload, times its first call and prints one `CHILD_MARKER` line
of JSON, which becomes the workload's `compile_time` record (or an error record). Issue 22's
workloads (those with a `group`) get none, to keep the whole run inside one device call.
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
from typing import Any, Callable

from benchmarks.measure import DTYPES, sync
from benchmarks.workloads_models import minicomp_backend

CHILD_MARKER = "BENCH_CHILD_RESULT "
RUN = Path(__file__).resolve().with_name("run.py")


def child_main(args: argparse.Namespace) -> int:
    """First call of one workload through one backend, in this fresh process."""
    import torch
    from benchmarks.workloads import WORKLOADS
    dtype = getattr(torch, DTYPES[args.dtype])
    built = WORKLOADS[args.compile_time_child].build(args.device, dtype, args.tiny)
    # Context and cuBLAS handle are process set-up, not compilation: warm them for both.
    torch.mm(torch.ones(8, 8, device=args.device), torch.ones(8, 8, device=args.device))
    sync(args.device)
    result: dict[str, Any] = {}
    t0 = time.perf_counter()
    if args.backend in ("inductor", "minicomp_dynamo"):
        fn = torch.compile(built.fn, **({"backend": minicomp_backend()} if args.backend == "minicomp_dynamo" else {}))
        fn(*built.inputs)
        sync(args.device)
        result["first_call_s"] = time.perf_counter() - t0
    else:
        import minicomp                                   # import counted: Inductor's are too
        fn = minicomp.compile(built.fn)
        fn(*built.inputs)
        sync(args.device)
        result["first_call_s"] = time.perf_counter() - t0
        result["compile_seconds"] = fn.compile_for(*built.inputs).compile_seconds
    print(CHILD_MARKER + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)          # skip interpreter teardown (Inductor's worker pool): it is not compile time


def compile_time_runs(names: list[str], args, record: dict, started: float, save: Callable) -> None:
    """Fresh-process first calls, `--compile-jobs` at a time (1: no contention between them)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from benchmarks.workloads import WORKLOADS
    lock = threading.Lock()                  # workers write records while the main thread saves
    backends = ["minicomp", "inductor"] if args.compile_time == "all" else ["minicomp"]
    jobs = []
    for name in names:
        wrec = next(r for r in record["workloads"] if r["name"] == name)
        ct = wrec.setdefault("compile_time", {})
        if WORKLOADS[name].group:            # issue 22's: the whole run must fit one 10-minute call
            ct.update({b: {"skipped": "no fresh-process run for issue 22's workloads"} for b in backends})
            continue
        # the library="all" variant is an experiment on steady-state time: no fresh-process run
        extras = [b for b in WORKLOADS[name].extra_backends if b not in backends and b != "minicomp_cublas"]
        for backend in backends + extras:
            if backend in wrec["backends"]:
                jobs.append((name, backend, ct))
            else:
                ct[backend] = {"skipped": "failed or not run in the main run"}

    def one(job) -> None:
        name, backend, ct = job
        left = args.budget_s - (time.perf_counter() - started)
        if left < 20:
            with lock:
                ct[backend] = {"skipped": f"over the run's budget of {args.budget_s:.0f} s"}
            return
        result = fresh_process_first_call(name, backend, args, timeout=min(left, 240.0))
        with lock:
            ct[backend] = result
        print(f"  compile-time {name:14s} {backend:9s} {result}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.compile_jobs)) as pool:
        for _ in pool.map(one, jobs):
            with lock:
                save()


def fresh_process_first_call(name: str, backend: str, args, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ct-") as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton",
                   MINICOMP_CACHE_DIR=f"{tmp}/minicomp", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, str(RUN), "--compile-time-child", name,
               "--backend", backend, "--device", args.device, "--dtype", args.dtype]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"child timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith(CHILD_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": f"child exited {proc.returncode}: {tail[-1] if tail else ''}"[:400],
                "stderr_tail": "\n".join(tail[-15:])[-3000:]}
    return {**json.loads(lines[-1][len(CHILD_MARKER):]), "process_s": wall}

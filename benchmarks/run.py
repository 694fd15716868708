"""The benchmark suite: eager vs torch.compile vs minicomp, in one run, on one device.

    python benchmarks/run.py --out DIR [--only NAME,...] [--quick] [--device cuda|cpu] [--reps N]

Invariants:
- Nothing runs at import time; `main()` does the work.
- Correctness is checked before timing: each backend's first-call outputs are compared with
  eager's by `torch.testing.assert_close` at the recorded tolerance. A failed check is
  reported in the table and its workload's speed is left out of ratios, targets and the
  geometric mean; the time is still recorded for whoever tunes it.
- Bytes and flops come from minicomp's own plan (the ledger); ceilings (copy bandwidth,
  cuBLAS bf16 matmul) are measured in the same run, so percentages compare like with like.
- A workload or backend that fails (build, capture, compile, run, timeout) is recorded with
  its error string and the run continues. bench.json/bench.md are rewritten after every
  workload, so a run cut short still leaves its results.
- Compile time is measured in fresh child processes (`--compile-time-child`) with empty
  temporary cache directories for Inductor, Triton and minicomp.
- On CUDA, times are `triton.testing.do_bench` medians (CUDA events, L2 flushed between
  repetitions). On CPU (Triton interpreter, tiny shapes) they are `time.perf_counter` medians
  and mean nothing about speed: that mode exists to check the suite end to end.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
CHILD_MARKER = "BENCH_CHILD_RESULT "
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# The same tolerances as tests/conftest.py.
TOLERANCES = {"bfloat16": dict(atol=2e-2, rtol=2e-2), "float16": dict(atol=2e-3, rtol=2e-3),
              "float32": dict(atol=1e-4, rtol=1e-4)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for bench.json and bench.md")
    p.add_argument("--only", help="comma-separated workload names")
    p.add_argument("--quick", action="store_true", help="a smaller subset, shorter timing")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--reps", type=int, default=None, help="least timed repetitions per measurement")
    p.add_argument("--warmup-ms", type=float, default=None, help="do_bench warm-up (ms)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench repetition time (ms)")
    p.add_argument("--backends", help="comma-separated: eager,inductor,minicomp "
                   "(default: all three on cuda; eager,minicomp on cpu)")
    p.add_argument("--compile-time", choices=["all", "minicomp", "none"], default=None,
                   help="fresh-process compile-time runs (default: all on cuda, minicomp on cpu)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="wall-clock budget; compile-time runs that would overrun it are skipped")
    p.add_argument("--step-timeout-s", type=float, default=None,
                   help="limit for one backend's compile + check + timing of one workload")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--compile-time-child", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=["minicomp", "inductor"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    args.tiny = not gpu
    args.reps = args.reps or (20 if gpu else 3)
    args.warmup_ms = args.warmup_ms or (10.0 if args.quick else 25.0)
    args.rep_ms = args.rep_ms or (50.0 if args.quick else 100.0)
    args.step_timeout_s = args.step_timeout_s or (180.0 if gpu else 120.0)
    args.backends = (args.backends or ("eager,inductor,minicomp" if gpu else "eager,minicomp")).split(",")
    args.compile_time = args.compile_time or ("all" if gpu else "minicomp")
    if not args.list and not args.compile_time_child and not args.out:
        p.error("--out DIR is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        # Read by Triton when kernels are defined: set before any generated module loads.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.compile_time_child:
        return child_main(args)
    from benchmarks.workloads import WORKLOADS
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:16s} {w.kind:10s} {w.title}  full={w.full}")
        return 0
    return suite_main(args)


# ----------------------------------------------------------------------------------------
# Small helpers.

class StepTimeout(Exception):
    pass


@contextmanager
def deadline(seconds: float):
    """Raise StepTimeout in the main thread after `seconds` (checked between bytecodes)."""
    def on_alarm(signum, frame):
        raise StepTimeout(f"timed out after {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def error_text(e: BaseException) -> str:
    """One readable line for the table; the last frames go to the JSON for the tuner."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:400]


def error_record(e: BaseException) -> dict:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {"error": error_text(e), "traceback": "".join(tb[-6:])[-4000:]}


def flat_tensors(out: Any) -> list:
    import torch
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# ----------------------------------------------------------------------------------------
# Timing and checking.

def time_fn(fn: Callable[[], Any], args: argparse.Namespace) -> dict:
    """Median and spread of `fn()`; on CUDA through do_bench, at least `args.reps` timed runs."""
    if args.device == "cuda":
        from triton.testing import do_bench
        sync("cuda")
        t0 = time.perf_counter()
        fn()
        sync("cuda")
        estimate_ms = (time.perf_counter() - t0) * 1e3
        rep_ms = min(max(args.rep_ms, args.reps * estimate_ms), 3000.0)
        try:
            times = do_bench(fn, warmup=args.warmup_ms, rep=rep_ms, return_mode="all")
        except (AssertionError, TypeError):       # a Triton without return_mode="all"
            p20, p50, p80 = do_bench(fn, warmup=args.warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
            return {"ms": p50, "p20_ms": p20, "p80_ms": p80, "n": None, "rep_ms": rep_ms,
                    "method": "triton.testing.do_bench quantiles"}
        method = "triton.testing.do_bench"
    else:
        fn()
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        method = "time.perf_counter"
        rep_ms = None
    times = sorted(times)
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    return {"ms": statistics.median(times), "p20_ms": q(0.2), "p80_ms": q(0.8),
            "n": len(times), "rep_ms": rep_ms, "method": method}


def compare(outs: Any, refs: Any, tol: dict) -> dict:
    """assert_close against eager, plus the size of the difference (for the tuner)."""
    import torch
    outs, refs = flat_tensors(outs), flat_tensors(refs)
    rec: dict[str, Any] = {"ok": True, "atol": tol["atol"], "rtol": tol["rtol"], "outputs": len(refs)}
    if len(outs) != len(refs):
        return {**rec, "ok": False, "error": f"{len(outs)} outputs, eager gives {len(refs)}"}
    max_abs, rel_l2, bad = 0.0, 0.0, 0.0
    for o, r in zip(outs, refs):
        if o.shape == r.shape:
            d = (o.float() - r.float())
            max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
            rel_l2 = max(rel_l2, float(d.norm() / r.float().norm().clamp_min(1e-30)))
            close = torch.isclose(o.float(), r.float(), rtol=tol["rtol"], atol=tol["atol"], equal_nan=True)
            bad = max(bad, float((~close).float().mean()))
        try:
            torch.testing.assert_close(o, r, **tol)
        except AssertionError as e:
            rec["ok"] = False
            rec.setdefault("error", " ".join(str(e).split())[:400])
    rec.update(max_abs=finite(max_abs), rel_l2=finite(rel_l2), mismatch_frac=bad)
    return rec


def io_bytes(built, outs) -> int:
    """The seeds' floor: every input (parameters too) read once, every output written once."""
    import torch
    tensors = list(built.inputs)
    if isinstance(built.fn, torch.nn.Module):
        tensors += list(built.fn.parameters()) + list(built.fn.buffers())
    seen, total = set(), 0
    for t in tensors + flat_tensors(outs):
        key = (t.data_ptr(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def ledger(plan) -> dict:
    groups = [{"id": g.id, "kind": g.kind, "name": g.name, "bytes_in": g.bytes_in,
               "bytes_out": g.bytes_out, "flops": g.flops, "lower_bound_us": g.lower_bound_us,
               "bound": g.bound, "fallback": g.fallback} for g in plan.groups]
    return {"bytes": plan.total_bytes, "flops": plan.total_flops, "unfused_bytes": plan.unfused_bytes,
            "lower_bound_us": sum(g.lower_bound_us for g in plan.groups), "groups": groups,
            "kinds": plan.kinds(), "fallbacks": [g for g in groups if g["fallback"]]}


# ----------------------------------------------------------------------------------------
# Ceilings.

def measure_ceilings(args: argparse.Namespace) -> dict:
    import torch
    gpu = args.device == "cuda"
    n_copy = (1 << 30) if gpu else (1 << 22)         # bf16 elements: 2 GiB on the GPU
    n_mm = 8192 if gpu else 256
    src = torch.randn(n_copy, device=args.device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy = time_fn(lambda: dst.copy_(src), args)
    del src, dst
    a = torch.randn(n_mm, n_mm, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(n_mm, n_mm, device=args.device, dtype=torch.bfloat16)
    mm = time_fn(lambda: torch.mm(a, b), args)
    del a, b
    copy_gbps = 2 * n_copy * 2 / (copy["ms"] * 1e6)
    mm_tflops = 2 * n_mm ** 3 / (mm["ms"] * 1e9)
    return {"copy": {"bytes": 2 * n_copy * 2, "what": f"copy_ of {n_copy * 2 >> 20} MiB bf16, read+write",
                     "gbps": copy_gbps, **copy},
            "matmul": {"what": f"torch.mm bf16 {n_mm}^3" + (" (cuBLAS)" if gpu else ""), "tflops": mm_tflops, **mm},
            "balance_flop_per_byte": mm_tflops * 1e12 / (copy_gbps * 1e9)}


# ----------------------------------------------------------------------------------------
# One workload.

def make_backend(name: str, built) -> Callable:
    import torch
    if name == "eager":
        return built.fn
    if name == "inductor":
        return torch.compile(built.fn)
    if name == "minicomp":
        import minicomp
        return minicomp.compile(built.fn)
    if built.reference and name == built.reference[0]:
        return built.reference[1]
    raise ValueError(f"unknown backend {name!r}")


def run_backend(name: str, built, ref, args, tol) -> dict:
    """Compile (minicomp: with its plan), first call, check against eager, then time."""
    rec: dict[str, Any] = {}
    fn = make_backend(name, built)
    if name == "minicomp":
        t0 = time.perf_counter()
        compiled = fn.compile_for(*built.inputs)
        rec["compile_for_s"] = time.perf_counter() - t0          # capture included, no Triton JIT
        rec["compile_seconds"] = compiled.compile_seconds         # minicomp's own figure
        rec["ledger"] = ledger(compiled.plan)
        rec["kernels"] = list(getattr(compiled.generated, "kernel_names", []))
    sync(args.device)
    t0 = time.perf_counter()
    out = fn(*built.inputs)
    sync(args.device)
    rec["first_call_s"] = time.perf_counter() - t0               # in this (warm) process
    rec["check"] = compare(out, ref, tol) if ref is not None else {"ok": True, "reference": True}
    del out
    rec.update(time_fn(lambda: fn(*built.inputs), args))
    return rec


def run_workload(w, args) -> dict:
    import torch
    dtype = getattr(torch, DTYPES[args.dtype])
    tol = TOLERANCES[DTYPES[args.dtype]]
    rec: dict[str, Any] = {"name": w.name, "kind": w.kind, "title": w.title, "dtype": DTYPES[args.dtype],
                           "backends": {}, "errors": {}, "notes": []}
    try:
        with deadline(args.step_timeout_s):
            built = w.build(args.device, dtype, args.tiny)
            ref = built.fn(*built.inputs)
            sync(args.device)
    except Exception as e:
        rec["errors"]["build"] = error_record(e)
        return rec
    rec.update(shapes=built.shapes, sizes=built.sizes, notes=built.notes, io_bytes=io_bytes(built, ref),
               analytic_flops=w.flops(built.sizes) if w.flops else None)
    names = [b for b in args.backends if b in ("eager", "inductor", "minicomp")]
    if built.reference:
        names.append(built.reference[0])
    for name in names:
        try:
            with deadline(args.step_timeout_s):
                rec["backends"][name] = run_backend(name, built, None if name == "eager" else ref, args, tol)
        except Exception as e:
            rec["errors"][name] = error_record(e)
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        status = rec["backends"].get(name, {})
        print(f"  {w.name:14s} {name:9s} "
              + (f"{status['ms']:.4f} ms  check={'ok' if status['check']['ok'] else 'FAIL'}"
                 if status else f"error: {rec['errors'][name]['error']}"), flush=True)
    del built, ref
    torch._dynamo.reset()
    return rec


# ----------------------------------------------------------------------------------------
# Compile time in fresh processes.

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
    if args.backend == "inductor":
        fn = torch.compile(built.fn)
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
    return 0


def compile_time_runs(names: list[str], args, record: dict, started: float, save: Callable) -> None:
    backends = ["minicomp", "inductor"] if args.compile_time == "all" else ["minicomp"]
    for name in names:
        wrec = next(r for r in record["workloads"] if r["name"] == name)
        ct = wrec.setdefault("compile_time", {})
        for backend in backends:
            if backend not in wrec["backends"]:
                ct[backend] = {"skipped": "failed or not run in the main run"}
                continue
            left = args.budget_s - (time.perf_counter() - started)
            if left < 20:
                ct[backend] = {"skipped": f"over the run's budget of {args.budget_s:.0f} s"}
                continue
            ct[backend] = fresh_process_first_call(name, backend, args, timeout=min(left, 240.0))
            print(f"  compile-time {name:14s} {backend:9s} {ct[backend]}", flush=True)
        save()


def fresh_process_first_call(name: str, backend: str, args, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ct-") as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton",
                   MINICOMP_CACHE_DIR=f"{tmp}/minicomp", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-time-child", name,
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


# ----------------------------------------------------------------------------------------
# The run.

def environment(args: argparse.Namespace) -> dict:
    import torch
    import triton
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "device": args.device, "gpu": None, "dtype": DTYPES[args.dtype],
        "triton_interpret": os.environ.get("TRITON_INTERPRET"), "argv": sys.argv[1:],
        "timing": {"method": "triton.testing.do_bench (CUDA events, L2 flushed, median)"
                   if args.device == "cuda" else "time.perf_counter median (interpreter: not a speed)",
                   "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "min_reps": args.reps},
        "tolerance": {"check": "torch.testing.assert_close against eager, before timing",
                      **TOLERANCES[DTYPES[args.dtype]]},
        "sizes": "tiny (CPU interpreter)" if args.tiny else "full (ceilings.md anchors)",
    }
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2**30, 1))
        env["driver"] = _quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    env["git_commit"] = _quiet(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return env


def _quiet(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def select(args: argparse.Namespace) -> list[str]:
    from benchmarks.workloads import CPU_QUICK, QUICK, WORKLOADS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in WORKLOADS]
        if unknown:
            raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
        return names
    if args.quick:
        return QUICK if args.device == "cuda" else CPU_QUICK
    return list(WORKLOADS)


def suite_main(args: argparse.Namespace) -> int:
    from benchmarks import report
    from benchmarks.workloads import WORKLOADS
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = select(args)
    record: dict[str, Any] = {"environment": environment(args), "workloads": [], "ceilings": None}

    def save() -> None:
        record["summary"] = report.summarize(record)
        record["wall_s"] = time.perf_counter() - started
        (out / "bench.json").write_text(json.dumps(report.json_safe(record), indent=1) + "\n")
        (out / "bench.md").write_text(report.markdown(record))

    print(f"minicomp benchmarks on {record['environment']['gpu'] or args.device}: {', '.join(names)}", flush=True)
    try:
        record["ceilings"] = measure_ceilings(args)
    except Exception as e:
        record["ceilings"] = error_record(e)
    print(f"  ceilings: {report.ceilings_line(record['ceilings'])}", flush=True)
    for name in names:
        record["workloads"].append(run_workload(WORKLOADS[name], args))
        save()
    if args.compile_time != "none":
        compile_time_runs(names, args, record, started, save)
    save()
    print(report.markdown(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
- A backend that does not apply (minicomp's reduce-overhead mode while its API refuses the
  option) is recorded under `not_applicable` and shown as "n/a", not as an error.
- `--only` takes workload names and group names (workloads.GROUPS), comma-separated.
- Compile time is measured in fresh child processes (`--compile-time-child`) with empty
  temporary cache directories for Inductor, Triton and minicomp.
- On CUDA, times are `triton.testing.do_bench` medians (CUDA events, L2 flushed between
  repetitions), of runs taken in `--rounds` rounds that take turns between the backends of a
  workload (measure.time_interleaved): the GPU's clock drifts during a run, and timing one
  backend after the other let a GEMM's ratio to torch.compile swing by 10% between runs.
  On CPU (Triton interpreter, tiny shapes) they are `time.perf_counter` medians and mean
  nothing about speed: that mode exists to check the suite end to end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:            # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.backends import (NotApplicable, backend_names, check_after_timing,  # noqa: E402
                                 prepare_backend)
from benchmarks.measure import (TOLERANCES, deadline, error_record, error_text, io_bytes, kernel_us,  # noqa: E402
                                measure_ceilings, sync, time_fn, time_interleaved)
from benchmarks.compile_runs import child_main, compile_time_runs  # noqa: E402
from benchmarks.measure import DTYPES  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for bench.json and bench.md")
    p.add_argument("--only", help="comma-separated workload or group names (groups: suite, models, "
                   "weak, decode, small_batch, blocks_sweep, issue22: all four)")
    p.add_argument("--quick", action="store_true", help="a smaller subset, shorter timing")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--reps", type=int, default=None, help="least timed repetitions per measurement")
    p.add_argument("--warmup-ms", type=float, default=None, help="do_bench warm-up (ms)")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench repetition time (ms)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timing rounds that take turns between a workload's backends (default 5 on cuda)")
    p.add_argument("--backends", help="comma-separated: eager,inductor,minicomp "
                   "(default: all three on cuda; eager,minicomp on cpu)")
    p.add_argument("--compile-time", choices=["all", "minicomp", "none"], default=None,
                   help="fresh-process compile-time runs (default: all on cuda, minicomp on cpu)")
    p.add_argument("--compile-jobs", type=int, default=None,
                   help="fresh-process compile-time runs at once (default 2 on cuda, to fit the "
                        "suite in one 10-minute device call; 1 for no contention between them)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="wall-clock budget; compile-time runs that would overrun it are skipped")
    p.add_argument("--step-timeout-s", type=float, default=None,
                   help="limit for one backend's compile + check + timing of one workload")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--compile-time-child", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=["minicomp", "inductor", "minicomp_dynamo"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    args.tiny = not gpu
    args.reps = args.reps or (20 if gpu else 3)
    args.warmup_ms = args.warmup_ms or (10.0 if args.quick else 25.0)
    args.rep_ms = args.rep_ms or (50.0 if args.quick else 100.0)
    args.rounds = args.rounds or (5 if gpu else 1)
    args.step_timeout_s = args.step_timeout_s or (180.0 if gpu else 120.0)
    args.backends = (args.backends or ("eager,inductor,minicomp" if gpu else "eager,minicomp")).split(",")
    unknown = set(args.backends) - {"eager", "inductor", "minicomp"}
    if unknown:
        p.error(f"unknown backend(s) {', '.join(sorted(unknown))}; known: eager, inductor, minicomp")
    args.compile_time = args.compile_time or ("all" if gpu else "minicomp")
    args.compile_jobs = args.compile_jobs or (2 if gpu else 1)
    if not args.list and not args.compile_time_child and not args.out:
        p.error("--out DIR is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        # Read by Triton when kernels are defined: set before any generated module loads.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.compile_time_child:
        return child_main(args)
    from benchmarks.workloads import WORKLOADS
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:20s} {w.group or 'suite':12s} {w.kind:10s} {w.title}  full={w.full}")
        return 0
    return suite_main(args)


# ----------------------------------------------------------------------------------------
# One workload.

def run_workload(w, args, ends_at: float) -> dict:
    """All backends of one workload. No step runs past `ends_at` (perf_counter seconds) by
    more than a few seconds of cleanup, nor longer than --step-timeout-s; the workload's
    `context` (fp32 IEEE: TF32 off) holds for all of it."""
    with (w.context() if w.context else contextlib.nullcontext()):
        return _run_workload(w, _timing_args(w, args), ends_at)


def _timing_args(w, args: argparse.Namespace) -> argparse.Namespace:
    """The run's arguments with the workload's own (smaller) rounds and repetition window."""
    out = argparse.Namespace(**vars(args))
    if w.rounds:
        out.rounds = min(args.rounds, w.rounds)
    if w.rep_ms:
        out.rep_ms = min(args.rep_ms, w.rep_ms)
    return out


def _kernel_times(rec: dict, calls: dict[str, Callable], limit: Callable[[], float],
                  by_kernel: bool = False) -> None:
    """Each timed backend's CUDA kernel time per call (`measure.kernel_us`, host excluded) into
    its record (`kernel_us`), and one note comparing them: wall times of whole models move with
    the host's pace, kernel times do not (BENCHMARKS.md session 18). With `by_kernel` (the GEMM
    workloads: a few kernels each) one more note per backend lists each kernel's time, so that a
    gap between two plans of the same kernels (swiglu: cuBLAS, cuBLAS, one pointwise, cuBLAS in
    both) shows which kernel it is in."""
    got = {}
    for name, call in calls.items():
        if name not in rec["backends"]:
            continue
        kernels: dict[str, float] = {}
        try:
            with deadline(limit()):
                got[name] = rec["backends"][name]["kernel_us"] = kernel_us(call, by_kernel=kernels)
        except Exception as e:            # a figure beside the timing: its failure fails nothing
            rec["notes"].append(f"kernel time of {name} not measured: {error_text(e)}")
            continue
        if by_kernel:
            rec["notes"].append(f"{name}'s kernels (us per call): "
                                + "; ".join(f"{k[:60]} {us:.1f}" for k, us in
                                            sorted(kernels.items(), key=lambda kv: -kv[1])))
    if got:
        text = ", ".join(f"{n} {us:.0f}" for n, us in got.items())
        ratio = (f"; torch.compile / minicomp {got['inductor'] / got['minicomp']:.3f}"
                 if got.get("inductor") and got.get("minicomp") else "")
        rec["notes"].append(f"CUDA kernel time per call, host excluded (us): {text}{ratio}")


def _run_workload(w, args, ends_at: float) -> dict:
    import torch

    def limit() -> float:
        return max(5.0, min(args.step_timeout_s, ends_at - time.perf_counter()))

    dtype_name = w.dtype or DTYPES[args.dtype]
    dtype = getattr(torch, dtype_name)
    tol = TOLERANCES[dtype_name]
    rec: dict[str, Any] = {"name": w.name, "kind": w.kind, "title": w.title, "dtype": dtype_name,
                           "group": w.group, "geomean": w.group is None, "backends": {}, "errors": {},
                           "not_applicable": {}, "notes": []}
    if w.target:
        rec["target"] = {"baseline": w.target.baseline, "min_speed": w.target.min_speed, "what": w.target.what,
                         "compared": w.target.compared}
    if w.peak_tflops:
        rec["peak_tflops"] = w.peak_tflops
    if w.rounds or w.rep_ms:
        rec["timing"] = {"rounds": args.rounds, "rep_ms": args.rep_ms}
    try:
        with deadline(limit()):
            built = w.build(args.device, dtype, args.tiny)
            ref = built.fn(*built.inputs)
            built.wide_out = built.wide() if built.wide is not None and dtype != torch.float32 else None
            sync(args.device)
    except Exception as e:
        rec["errors"]["build"] = error_record(e)
        return rec
    rec.update(shapes=built.shapes, sizes=built.sizes, notes=built.notes, io_bytes=io_bytes(built, ref),
               analytic_flops=w.flops(built.sizes) if w.flops else None)
    names = backend_names(w, built, args.backends)
    fns: dict[str, Callable] = {}
    for name in names:                    # compile, first call and check, one backend at a time
        try:
            with deadline(limit()):
                rec["backends"][name], fns[name] = prepare_backend(name, built, None if name == "eager" else ref,
                                                                   args, tol)
        except NotApplicable as e:
            rec["not_applicable"][name] = str(e)
        except Exception as e:
            rec["errors"][name] = error_record(e)
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    calls = {n: (lambda f=f, a=built.inputs: f(*a)) for n, f in fns.items()}
    try:                                  # then all of them timed in rounds that take turns
        with deadline(limit()):
            timed = time_interleaved(calls, args, args.rounds)
    except Exception:                     # one backend failed while timed: time them one by one
        timed = {}
        for name, call in calls.items():
            try:
                with deadline(limit()):
                    timed[name] = time_fn(call, args)
            except Exception as e:
                rec["errors"][name] = error_record(e)
                rec["backends"].pop(name, None)
    for name, times in timed.items():
        rec["backends"][name].update(times)
        try:
            with deadline(limit()):
                check_after_timing(rec["backends"][name], fns[name], built, None if name == "eager" else ref, tol)
        except Exception as e:
            rec["errors"][name] = error_record(e)
            rec["backends"].pop(name, None)
    if args.device == "cuda" and w.kind in ("block", "gemm"):
        _kernel_times(rec, calls, limit, by_kernel=w.kind == "gemm")
    for name in names:
        status = rec["backends"].get(name, {})
        print(f"  {w.name:14s} {name:9s} "
              + (f"{status['ms']:.4f} ms  check={'ok' if status['check']['ok'] else 'FAIL'}" if status
                 else f"n/a: {rec['not_applicable'][name]}" if name in rec["not_applicable"]
                 else f"error: {rec['errors'][name]['error']}"), flush=True)
    del built, ref, fns
    torch._dynamo.reset()
    return rec


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
                   "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "min_reps": args.reps,
                   "rounds": args.rounds},
        "compile_time": {"fresh_process": args.compile_time, "jobs_at_once": args.compile_jobs},
        "tolerance": {"check": "torch.testing.assert_close against eager, before timing",
                      **TOLERANCES[DTYPES[args.dtype]]},
        "sizes": "tiny (CPU interpreter)" if args.tiny else "full (ceilings.md anchors)",
    }
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2**30, 1))
        env["driver"] = _quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    # The caller passes the commit in BENCH_GIT_COMMIT, which wins over git: the device machine's
    # copy of .git can be older than its working tree (runs have recorded a stale HEAD that way).
    env["git_commit"] = (os.environ.get("BENCH_GIT_COMMIT")
                         or _quiet(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]))
    return env


def _quiet(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def warm_minicomp(device: str) -> float | None:
    """Compile (capture to loaded module, no kernel run) one small function with a group of
    each kind first, so no workload's own compile time carries the process's one-time costs:
    imports (minicomp's stages, what torch.fx capture pulls in, Gluon for Hopper attention)
    and first runs of each emitter's code."""
    t0 = time.perf_counter()
    try:
        import minicomp
        from benchmarks.workloads import warm_up_fn, warm_up_inputs
        minicomp.compile(warm_up_fn).compile_for(*warm_up_inputs(device))
    except Exception:
        return None                      # the workloads will record the error
    return time.perf_counter() - t0


def select(args: argparse.Namespace) -> list[str]:
    from benchmarks.workloads import CPU_QUICK, GROUPS, QUICK, WORKLOADS
    if args.only:
        names: list[str] = []
        for n in (n.strip() for n in args.only.split(",")):
            for name in GROUPS.get(n, [n] if n else []):     # a group name stands for its workloads
                if name not in names:
                    names.append(name)
        unknown = [n for n in names if n not in WORKLOADS]
        if unknown:
            raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}; "
                             f"groups: {', '.join(GROUPS)}")
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

    if "minicomp" in args.backends:
        record["environment"]["minicomp_warmup_s"] = warm_minicomp(args.device)
    print(f"minicomp benchmarks on {record['environment']['gpu'] or args.device}: {', '.join(names)}", flush=True)
    try:
        record["ceilings"] = measure_ceilings(args)
    except Exception as e:
        record["ceilings"] = error_record(e)
    print(f"  ceilings: {report.ceilings_line(record['ceilings'])}", flush=True)
    # The main run may overrun the budget by 90 s; compile-time runs only use what is left.
    ends_at = started + args.budget_s + 90
    for name in names:
        t0 = time.perf_counter()
        if t0 > started + args.budget_s:
            record["workloads"].append({"name": name, "kind": WORKLOADS[name].kind, "backends": {},
                                        "notes": [], "errors": {"build": {
                                            "error": f"skipped: over the run's budget of {args.budget_s:.0f} s"}}})
            continue
        record["workloads"].append(run_workload(WORKLOADS[name], args, ends_at))
        record["workloads"][-1]["wall_s"] = time.perf_counter() - t0
        save()
    if args.compile_time != "none":
        compile_time_runs(names, args, record, started, save)
    save()
    print(report.markdown(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

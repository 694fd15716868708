"""Measuring: timing, checking against eager, the ledger, the ceilings, error records.

Invariants:
- CUDA times are `triton.testing.do_bench` medians (CUDA events, L2 flushed before every
  repetition) with at least `args.reps` timed runs; CPU times are `time.perf_counter` medians.
- the backends of one workload are timed in rounds that take turns (`time_interleaved`), so
  a drift of the GPU's clock during the run falls on all of them alike.
- `compare` is the correctness gate: `torch.testing.assert_close` (dtypes must match eager's),
  plus the size of any difference, so a failure can be judged from the record alone.
- torch and triton are imported inside functions: the caller sets TRITON_INTERPRET first.
"""

from __future__ import annotations

import math
import signal
import statistics
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable

# The same tolerances as tests/conftest.py.
TOLERANCES = {"bfloat16": dict(atol=2e-2, rtol=2e-2), "float16": dict(atol=2e-3, rtol=2e-3),
              "float32": dict(atol=1e-4, rtol=1e-4)}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}   # --dtype -> torch's name

# ----------------------------------------------------------------------------------------
# Small helpers.

class StepTimeout(Exception):
    pass


@contextmanager
def deadline(seconds: float):
    """Raise StepTimeout in the main thread after `seconds` (checked between bytecodes)."""
    def on_alarm(signum, frame):
        raise StepTimeout(f"timed out after {seconds:.1f} s")
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

def time_fn(fn: Callable[[], Any], args) -> dict:
    """Median and spread of `fn()`; on CUDA through do_bench, at least `args.reps` timed runs."""
    return time_interleaved({"fn": fn}, args, rounds=1)["fn"]


def time_interleaved(fns: dict[str, Callable[[], Any]], args, rounds: int) -> dict[str, dict]:
    """Median and spread of each `fns[name]()`, timed in `rounds` rounds that take turns.

    The H200's clock moves during a run (a GEMM's timed runs can split between two modes 6%
    apart), so timing one backend after another can credit one with the fast mode. Here every
    round times every function (starting with a different one each round) for 1/rounds of the
    repetition time, and each record pools its rounds' runs; `rounds_ms` keeps each round's
    median, so the drift is visible in the record.
    """
    names = list(fns)
    runs: dict[str, list[float]] = {n: [] for n in names}
    medians: dict[str, list[float]] = {n: [] for n in names}
    rep: dict[str, float | None] = {}
    for n in names:                       # one untimed call each; on CUDA it sizes the repetitions
        sync(args.device)
        t0 = time.perf_counter()
        fns[n]()
        sync(args.device)
        estimate_ms = (time.perf_counter() - t0) * 1e3
        rep[n] = min(max(args.rep_ms, args.reps * estimate_ms), 3000.0) / rounds if args.device == "cuda" else None
    import minicomp
    minicomp.wait_compiled()              # kernels compiling in the background (tiered attention): time the settled ones
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times = _one_round(fns[n], args, rep[n], rounds)
            runs[n] += times
            medians[n].append(statistics.median(times))
    out = {}
    for n in names:
        times = sorted(runs[n])
        q = lambda f: times[min(len(times) - 1, int(f * len(times)))]  # noqa: E731
        method = "triton.testing.do_bench" if args.device == "cuda" else "time.perf_counter"
        out[n] = {"ms": statistics.median(times), "p20_ms": q(0.2), "p80_ms": q(0.8), "n": len(times),
                  "rep_ms": rep[n] * rounds if rep[n] else None, "rounds": rounds,
                  "rounds_ms": medians[n],
                  "method": method + (f", {rounds} rounds taking turns" if rounds > 1 else "")}
    return out


def _one_round(fn: Callable[[], Any], args, rep_ms: float | None, rounds: int) -> list[float]:
    """Timed runs of `fn()` for one round: do_bench's on CUDA, perf_counter's on the CPU."""
    if args.device == "cuda":
        from triton.testing import do_bench
        return list(do_bench(fn, warmup=args.warmup_ms, rep=rep_ms, return_mode="all"))
    times = []
    for _ in range(max(1, -(-args.reps // rounds))):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def settle(fn: Callable[[], Any], timeout: float = 600.0) -> Any:
    """Call `fn` until what it launches is minicomp's kernels, and return the last call's result.

    A generated module answers a group's first calls with eager PyTorch while its kernel compiles
    in the background (codegen/first_calls.py); the first call after the compile autotunes it. So
    a module imported by hand and timed at once times PyTorch's lines: session 31's skinny-GEMM
    figures for "ours" were cuBLAS, PyTorch's epilogue kernel and a copy into the kernel's buffer.
    This calls once (starting the compiles), waits for them, raises where one is still running or
    failed, then calls once more (the autotuning). A callable that launches no kernel of ours
    passes straight through (two calls)."""
    import torch
    import minicomp
    from minicomp.runtime import background
    wait = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    before = set(background.failed_kernels())
    fn()
    wait()
    if not minicomp.wait_compiled(timeout):
        raise RuntimeError(f"background compiles still running after {timeout:.0f} s: eager would be timed")
    failed = [name for name in background.failed_kernels() if name not in before]
    if failed:
        raise RuntimeError(f"kernels failed to compile, eager serves their groups: {', '.join(failed)}")
    out = fn()
    wait()
    return out


def kernel_us(fn: Callable[[], Any], calls: int = 5, by_kernel: dict | None = None) -> float:
    """CUDA kernel time of one `fn()` in microseconds: the profiler's device time of every kernel
    over `calls` calls, divided. Host time is left out, so this is what a plan's kernels cost
    where a wall time also holds the host's pace (torch.compile's and the Dynamo backend's
    calls spend as long on the host as on the GPU for a 4-layer Llama at 4 x 512, and their
    do_bench times moved by 5-35% between runs of one plan, BENCHMARKS.md session 18).
    `by_kernel`, when given, receives each kernel name's microseconds per call."""
    import torch
    from torch.autograd import DeviceType
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            total += e.device_time
            if by_kernel is not None:
                by_kernel[e.name] = by_kernel.get(e.name, 0.0) + e.device_time / calls
    return total / calls


def compare(outs: Any, refs: Any, tol: dict, wide: Any = None) -> dict:
    """assert_close against eager, plus the size of the difference (for the tuner).

    With `wide` (the computation in fp32: whole models, whose bf16 logits after several layers
    differ from eager's by more than bf16's tolerance for any compiler, torch.compile's
    included), an output that fails assert_close still passes when it is no further from
    `wide` than eager is: largest and root-mean-square error at most 1.25x eager's plus atol
    (the real-models issue's rule). Both errors are recorded."""
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
    if wide is not None and len(flat_tensors(wide)) == len(outs):
        rec["vs_fp32"] = []
        near = True
        for o, r, w in zip(outs, refs, flat_tensors(wide)):
            mine, theirs = (o.float() - w.float()).abs(), (r.float() - w.float()).abs()
            rms = lambda e: float(e.square().mean().sqrt())
            entry = {"max": float(mine.max()), "eager_max": float(theirs.max()),
                     "rms": rms(mine), "eager_rms": rms(theirs)}
            rec["vs_fp32"].append(entry)
            near &= (entry["max"] <= 1.25 * entry["eager_max"] + tol["atol"]
                     and entry["rms"] <= 1.25 * entry["eager_rms"] + tol["atol"])
        if not rec["ok"] and near:
            rec.update(ok=True, rule="no further from fp32 than eager", assert_close_error=rec.pop("error", ""))
    return rec


def poison_allocator(refs: Any) -> None:
    """Leave NaN-filled blocks of the outputs' sizes in the caching allocator, so an output
    buffer that a kernel fails to write holds NaN (and fails the check), not a stale copy of
    a previous backend's correct result."""
    import torch
    blocks = []
    for r in flat_tensors(refs):
        fill = float("nan") if r.is_floating_point() else 7
        blocks.append(torch.full(r.shape, fill, dtype=r.dtype, device=r.device))
    del blocks


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


def ledger(plan, fallbacks: dict[int, str], library: dict[int, str] | None = None) -> dict:
    """The plan's ledger as a record; `fallbacks`: the generated module's (group id -> reason),
    `library`: its GEMMs with nothing to fuse that call cuBLAS (group id -> reason)."""
    library = library or {}
    groups = [{"id": g.id, "kind": g.kind, "name": g.name, "bytes_in": g.bytes_in,
               "bytes_out": g.bytes_out, "flops": g.flops, "lower_bound_us": g.lower_bound_us,
               "bound": g.bound, "fallback": fallbacks.get(g.id), "library": library.get(g.id)} for g in plan.groups]
    return {"bytes": plan.total_bytes, "flops": plan.total_flops, "unfused_bytes": plan.unfused_bytes,
            "lower_bound_us": sum(g.lower_bound_us for g in plan.groups), "groups": groups,
            "kinds": plan.kinds(), "fallbacks": [g for g in groups if g["fallback"]]}


# ----------------------------------------------------------------------------------------
# Ceilings.

def measure_ceilings(args) -> dict:
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

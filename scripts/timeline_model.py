"""Where a whole model's call loses time between its kernels, minicomp against torch.compile.

    python scripts/timeline_model.py [bert|gpt2|llama|qwen2] [--batch 4 --seq 512] [--backend]

Runs calls back to back as the benchmark's do_bench does (an L2 flush, then the call, no
synchronisation between calls), records torch.profiler's timeline and reads it per call:
- kernels: how many, their summed time, and the span from the first one's start to the last
  one's end;
- each gap between two consecutive kernels of the call, charged to the host when the second
  kernel's launch returned only after the first had ended (the GPU waited for Python), else to
  the GPU (the kernel was queued and still started late: launch latency, stream ordering);
- the largest gaps with the kernels on either side.
It also prints do_bench's time of a call (no profiler) and the kernels' time without the L2
flush, so that a wall time splits into the cold-L2 cost of the kernels, the gaps, and the GPU's
idle wait for the host (session 24: minicomp's Qwen2 and Llama lost 95 us a call more than
torch.compile's between kernel time and wall time, undivided). A model whose wall time exceeds
its kernel time by the host-charged gaps needs fewer or cheaper host operations; one whose gaps are GPU-charged needs fewer kernels. The profiler slows the host
(every operation is recorded), so host-charged gaps here are an upper bound: compare the enqueue
time of scripts/host_profile.py, which runs without it.
"""
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import triton.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workloads_models  # noqa: E402

import minicomp  # noqa: E402

CALLS, SKIP = 12, 4          # calls recorded; the first SKIP are not counted (queue filling)
DEVICE_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def timeline(f, ins, flush_l2: bool = True) -> list[dict]:
    """The chrome-trace events of CALLS back-to-back calls, each under a "call" annotation (each
    after an L2 flush, as do_bench times them, unless `flush_l2` is off)."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            if flush_l2:
                flush.zero_()
            with torch.profiler.record_function("call"):
                f(*ins)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        prof.export_chrome_trace(tmp.name)
        return json.loads(Path(tmp.name).read_text())["traceEvents"]


def per_call(events: list[dict]) -> list[dict]:
    """Each counted call's kernels (with their launch's host end time) and its host span."""
    launches = {e["args"]["correlation"]: e for e in events        # cudaLaunchKernel and cuLaunchKernelEx alike
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"),
                     key=lambda e: e["ts"])
    calls = sorted((e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "call"),
                   key=lambda e: e["ts"])
    out = []
    for c in calls[SKIP:]:
        lo, hi = c["ts"], c["ts"] + c["dur"]
        ks = []
        for k in kernels:
            launch = launches.get(k.get("args", {}).get("correlation"))
            if launch is not None and lo <= launch["ts"] <= hi:
                ks.append(dict(name=k["name"], start=k["ts"], end=k["ts"] + k["dur"], dur=k["dur"],
                               launched=launch["ts"] + launch["dur"], launch_start=launch["ts"]))
        if ks:
            before = [k["ts"] + k["dur"] for k in kernels if k["ts"] + k["dur"] <= ks[0]["start"]]
            idle = ks[0]["start"] - max(before) if before else 0.0
            out.append(dict(host=c["dur"], kernels=ks, lead=ks[0]["launch_start"] - lo, idle_before=idle))
    return out


def report(name: str, calls: list[dict], rows: int, wall_ms: float, warm: list[dict]) -> None:
    spans, busy, host_gap, gpu_gap, host = [], [], [], [], []
    lead = [c["lead"] for c in calls]
    idle = [c["idle_before"] for c in calls]
    gaps = []
    for c in calls:
        ks = c["kernels"]
        spans.append(ks[-1]["end"] - ks[0]["start"])
        busy.append(sum(k["dur"] for k in ks))
        host.append(c["host"])
        h = g = 0.0
        for a, b in zip(ks, ks[1:]):
            gap = b["start"] - a["end"]
            if b["launched"] > a["end"]:
                h += gap
            else:
                g += gap
            gaps.append((gap, "host" if b["launched"] > a["end"] else "gpu", a["name"][:44], b["name"][:44]))
        host_gap.append(h)
        gpu_gap.append(g)
    med = statistics.median
    n = len(calls[0]["kernels"])
    print(f"==== {name}: {n} kernels a call; kernel time {med(busy):.0f} us, span {med(spans):.0f} us, "
          f"host time to enqueue a call {med(host):.0f} us")
    print(f"     gaps inside a call: {med(host_gap):.0f} us charged to the host, {med(gpu_gap):.0f} us to the GPU "
          f"({med(gpu_gap) / max(n - 1, 1):.2f} us a boundary)")
    print(f"     host time from the call's start to its first launch {med(lead):.0f} us; the GPU idle "
          f"before the call's first kernel {med(idle):.0f} us")
    warm_busy = med([sum(k["dur"] for k in c["kernels"]) for c in warm])
    print(f"     do_bench (L2 flushed, no profiler) {wall_ms * 1e3:.0f} us a call; kernel time without "
          f"the flush {warm_busy:.0f} us (so the flush costs the kernels {med(busy) - warm_busy:.0f} us)")
    gaps.sort(reverse=True)
    per = len(calls)
    for gap, who, a, b in gaps[:rows * per:per]:
        print(f"     {gap:7.1f} us {who:4s}  {a}  ->  {b}")


def main() -> None:
    args, sizes, built = workloads_models.model_from_args(__doc__, rows=8)
    print(f"{args.family}: {sizes}")
    fn, ins = built.fn, built.inputs
    ours = torch.compile(fn, backend=minicomp.backend()) if args.backend else minicomp.compile(fn)
    backends = {"torch.compile": torch.compile(fn),
                "minicomp" + (" (backend)" if args.backend else ""): ours}
    with torch.no_grad():
        for name, f in backends.items():
            for _ in range(3):
                f(*ins)
            minicomp.wait_compiled()
            torch.cuda.synchronize()
            wall = triton.testing.do_bench(lambda f=f: f(*ins), warmup=25, rep=100)
            report(name, per_call(timeline(f, ins)), args.rows, wall, per_call(timeline(f, ins, flush_l2=False)))


if __name__ == "__main__":
    main()

"""Where a compiled model's host time goes on the GPU machine: cProfile over steady calls.

    python scripts/host_profile.py [bert|gpt2|llama|qwen2] [--batch 4 --seq 512] [--backend]

Builds the benchmark's model (workloads_models.PREFILL geometry), compiles it with
`minicomp.compile` (or, with --backend, `torch.compile(backend="minicomp")`), warms it up, then
prints: the wall time of a call (synchronised), the host time to enqueue one (not
synchronised: when it is as long as the wall time, the call is host-bound), and cProfile's
functions by their own time over 20 calls. At batch 4 x 512 BERT-base ran at 3.27 ms a call
with 1.58 ms of GPU time (results/2026-12-05): the host is the bound, and this says where.
"""
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workloads_models  # noqa: E402

import minicomp  # noqa: E402



def _time_to_first_launch(f, ins, prof: cProfile.Profile | None = None) -> float:
    """Median host time from the call's start to its first Triton launch or index check, with
    both wrapped to note the time of the first (the wrappers cost well under a microsecond).
    With `prof`, that profiler runs over each call's lead alone (its times are then inflated)."""
    import statistics

    from minicomp.runtime import launcher
    first: list[float] = []
    launch, check = launcher.Launcher.__call__, launcher.check_index

    def noted(real):
        def call(*a, **k):
            if not first:
                first.append(time.perf_counter())
                if prof is not None:
                    prof.disable()
            return real(*a, **k)
        return call
    launcher.Launcher.__call__, launcher.check_index = noted(launch), noted(check)
    try:
        leads = []
        for _ in range(50):
            first.clear()
            torch.cuda.synchronize()
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            f(*ins)
            leads.append(first[0] - t0)
        return statistics.median(leads)
    finally:
        launcher.Launcher.__call__, launcher.check_index = launch, check


args, sizes, built = workloads_models.model_from_args(__doc__, rows=28)
fn, ins = built.fn, built.inputs
f = torch.compile(fn, backend=minicomp.backend()) if args.backend else minicomp.compile(fn)
name = "torch.compile(backend=minicomp)" if args.backend else "minicomp.compile"
with torch.no_grad():
    for _ in range(5):
        f(*ins)
    minicomp.wait_compiled()
    for _ in range(5):
        f(*ins)
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        f(*ins)
    enqueue = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n
    print(f"{args.family} {sizes} through {name}: {wall * 1e3:.3f} ms a call (synchronised), "
          f"{enqueue * 1e3:.3f} ms to enqueue one")
    specs = [s for entries in getattr(f, "_fast", {}).values() for s in entries]
    if specs:                # minicomp.compile's fast path: what it checks before the first launch
        s = specs[0]
        t0 = time.perf_counter()
        for _ in range(200):
            s.binding.read()
        read = (time.perf_counter() - t0) / 200
        b = s.binding
        print(f"binding.read {read * 1e6:.1f} us a call ({len(b.equal)} equality guards in "
              f"{len(b._equal_reads)} reads, {len(b.same)} identity guards in "
              f"{len(b._same_reads) + len(b._same_groups)} reads, {len(b.reads)} weights)")
        lead = _time_to_first_launch(f, ins)
        print(f"host time from a call's start to its first launch or index check: {lead * 1e6:.1f} us (median "
              f"of 50; the GPU idles that long after the L2 flush a timed call follows, less the flush's own time)")
        lead_prof = cProfile.Profile()
        _time_to_first_launch(f, ins, lead_prof)
        print("cProfile over the lead alone (50 calls; call start to first launch):")
        pstats.Stats(lead_prof).sort_stats("tottime").print_stats(args.rows)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        f(*ins)
    torch.cuda.synchronize()
    prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(args.rows)

"""How much of a whole model's timed call is the GPU waiting for the host: the default mode
against the same compiled call replayed as CUDA graphs.

    python benchmarks/ablations/host_share.py [--families llama,qwen2] [--batch 4 --seq 512] [--rounds 2]

For each model (benchmarks/workloads_models.py, bf16 on CUDA) this compiles
`minicomp.compile(fn)` and `minicomp.compile(fn, mode="reduce-overhead")`, waits for their
background compiles, checks both against eager, then times with `do_bench` (L2 flushed, as
benchmarks/run.py does), torch.compile's default beside them:
- the default call and the replayed graph: a graph replays the same kernels with no Python
  between them, so the difference is what the host costs the timed call (its lead after the
  flush, launches slower than the kernels they follow, and any synchronisation);
- the replayed graph as planned by default (cuBLAS for few-rows GEMMs from
  `library_plan.GRAPH_LIBRARY_ROWS` rows on), with our fused GEMMs at every row count
  (MINICOMP_GRAPH_FEW_ROWS=0), with cuBLAS at every few-rows GEMM (MINICOMP_GRAPH_FEW_ROWS=1;
  the default before session 29), and torch.compile's default and reduce-overhead modes
  (until session 30 a form without programmatic dependent launch, MINICOMP_PDL=0, stood where
  the "our GEMMs" form stands: PDL under graphs was worth ~1%, session 29);
- the host's time to enqueue one call (no synchronisation) and the wall time of a call
  (synchronised after each): a call whose enqueue time nears its wall time is host-bound.
`--no-tc` leaves torch.compile out of the process. A form's switches are set around each of its
calls (minicomp's compile cache keys on them); the others hold as the process has them.

Session 28 (H100; results/2026-12-07/session28-host-share-*): at 4 x 512 Llama's call took 1.825
ms, its graph replay (then without PDL) 1.923, torch.compile's 2.220, and the host enqueued a call
in 0.687 ms: nothing in the default call waits for Python. At 1 x 16 the replay took 0.3599 ms;
the "no PDL" form beside it (0.3603) had PDL after all: this script then set the switch only for
its first call, and the calls after it compiled again under the process's default (the cache
keys on the switches), so that was no A/B. With torch.compile's reduce-overhead form in the same process, the
first timing of minicomp's replay died with an illegal memory access. The likely cause: our
capture kept the cuBLAS workspace the warm-up had made outside the graph's pool
(runtime/cuda_graphs.py; the fix, a12daed, is not GPU-run yet).
Session 29 (H100; results/2026-12-07/session29-host-share-*, tree c92d846, where the graph plan
still sent few-rows GEMMs to cuBLAS): at 1 x 16 with two rounds in reversed order, Llama's replay
took 0.3585 / 0.3580 ms with PDL, 0.3619 / 0.3620 without, and 0.3361 / 0.3360 with our fused
GEMMs; Qwen2's 0.3617 / 0.3607, 0.3635 / 0.3635 and 0.3552 / 0.3551. Our GEMMs became the graph
plan's default. With torch.compile's forms in the process every form ran (the workspace fix
holds): Llama's graphs with our GEMMs 0.3294 ms, torch.compile reduce-overhead 0.3985.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _enqueue_and_wall(f, ins, n: int = 30) -> tuple[float, float]:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f(*ins)
    enqueue = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f(*ins)
        torch.cuda.synchronize()
    return enqueue * 1e3, (time.perf_counter() - t0) / n * 1e3


# each form's switches, set around every one of its calls: minicomp's compile cache keys on them
# (target.codegen_switches), so a form called under other switches compiles again under those
SWITCHES = {"graphs, our GEMMs": {"MINICOMP_GRAPH_FEW_ROWS": "0"},
            "graphs, few rows cuBLAS": {"MINICOMP_GRAPH_FEW_ROWS": "1"}}
KEYS = ("MINICOMP_PDL", "MINICOMP_GRAPH_FEW_ROWS")


def _with_switches(f, settings: dict):
    """`f` called with `settings` in the environment and the other KEYS as the process had them."""
    if not settings:
        return f

    def call(*args):
        saved = {k: os.environ.get(k) for k in KEYS}
        os.environ.update(settings)
        try:
            return f(*args)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="llama,qwen2")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--no-tc", action="store_true", help="minicomp's forms only")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every form this many times, the order reversed each round (the GPU's clock "
                         "falls as it heats: a form timed first gains, see attention_spread.py)")
    args = ap.parse_args()

    import torch
    from triton.testing import do_bench

    import minicomp
    from benchmarks import workloads_models
    from benchmarks.measure import TOLERANCES, compare

    for family in args.families.split(","):
        sizes = dict(workloads_models.PREFILL[family])
        sizes.update({k: v for k, v in (("batch", args.batch), ("seq", args.seq)) if v is not None})
        built = workloads_models.make_model(family)("cuda", torch.bfloat16, sizes, torch.Generator().manual_seed(0))
        fn, ins = built.fn, built.inputs
        forms = {"minicomp": minicomp.compile(fn), "minicomp graphs": minicomp.compile(fn, mode="reduce-overhead"),
                 "graphs, our GEMMs": minicomp.compile(fn, mode="reduce-overhead"),
                 "graphs, few rows cuBLAS": minicomp.compile(fn, mode="reduce-overhead"),
                 "torch.compile": torch.compile(fn),
                 "tc reduce-overhead": torch.compile(fn, mode="reduce-overhead")}
        if args.no_tc:
            forms = {k: v for k, v in forms.items() if not k.startswith(("tc", "torch"))}
        forms = {name: _with_switches(f, SWITCHES.get(name, {})) for name, f in forms.items()}
        with torch.no_grad():
            want, wide = fn(*ins), built.wide()
            for f in forms.values():
                f(*ins)
            minicomp.wait_compiled(600)
            for name, f in forms.items():
                for _ in range(3):
                    got = f(*ins)
                # run.py's check: bf16's tolerance, or no further from the fp32 model than eager is
                check = compare(got, want, TOLERANCES["bfloat16"], wide)
                if not check["ok"]:
                    raise AssertionError(f"{family}, {name}: {check}")
            print(f"== {family} {sizes['batch']} x {sizes['seq']}: every form checked as run.py checks", flush=True)
            for r in range(args.rounds):
                order = list(forms.items())
                for name, f in order if r % 2 == 0 else order[::-1]:
                    ms = do_bench(lambda f=f: f(*ins), warmup=25, rep=200)
                    enqueue, wall = _enqueue_and_wall(f, ins)
                    print(f"round {r} {name:24s} do_bench {ms:.4f} ms; enqueue {enqueue:.3f} ms a call, "
                          f"wall {wall:.3f} (synchronised each call)", flush=True)


if __name__ == "__main__":
    main()

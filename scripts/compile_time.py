"""minicomp's own compile time on the CPU, no GPU needed: passes, plan and generated source of the
benchmark's whole models for an sm_90 target, the way `compile_for` runs them after capture.

    .venv/bin/python scripts/compile_time.py [bert llama qwen2 gpt2] [--runs 5] [--gc-on] [--layers 32]

Each model has its benchmark geometry (benchmarks/workloads_models.PREFILL) at batch 1 x 16 tokens
in bf16 on CPU tensors (capture runs the model eagerly: small inputs keep that short); `--layers`
sets the depth (the benchmark's is 4, BERT's 12; real models have 24-32). The script
captures once, then times `compile_graph(..., load=False)` over meta tensors `--runs` times in one
process and prints each time and the median. `--gc-on` keeps Python's garbage collector running
during the compiles (by default `compile_graph` pauses it: `api.pipeline.gc_paused`), for that A/B.

Session 29 (2-core CPU machine, idle), median of 5, c463e3c against 91d82ea (the collector pause,
one parse per kernel in dedup, the plan search's caches): BERT 1.348 -> 1.043 s, Qwen2 0.978 ->
0.776, Llama 0.630 -> 0.569, GPT-2 0.360 -> 0.356.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("families", nargs="*", default=["bert", "llama", "qwen2", "gpt2"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gc-on", action="store_true", help="leave the garbage collector on while compiling")
    ap.add_argument("--layers", type=int, default=None, help="the models' depth (default: the benchmark's)")
    args = ap.parse_args()

    import torch

    from benchmarks import workloads_models
    from minicomp.api import pipeline
    from minicomp.frontend.fx import call_inputs, capture
    from minicomp.target import Target

    if args.gc_on:
        pipeline.gc_paused = contextlib.nullcontext
    target = Target("cuda", (9, 0), pdl=True)
    for family in args.families:
        sizes = dict(workloads_models.PREFILL[family], batch=1, seq=16)
        if args.layers is not None:
            sizes["layers"] = args.layers
        built = workloads_models.make_model(family)("cpu", torch.bfloat16, sizes, torch.Generator().manual_seed(0))
        graph = capture(built.fn, built.inputs)
        metas = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in call_inputs(graph, built.inputs)]
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            compiled = pipeline.compile_graph(graph, metas, device="cuda", load=False, target=target)
            times.append(time.perf_counter() - t0)
        print(f"{family:6s} {sizes['layers']:3d} layers {len(compiled.plan.groups):4d} groups: " + " ".join(f"{t:.3f}" for t in times)
              + f" s; median {statistics.median(times):.3f}", flush=True)


if __name__ == "__main__":
    main()

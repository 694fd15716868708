"""Where a whole model's time goes on CUDA, minicomp against torch.compile: torch.profiler over
a few calls of one of the suite's model workloads, kernels by CUDA time, and the host's share.
    python scripts/profile_model.py [bert|gpt2|llama|qwen2] [--batch 4 --seq 512]
(issue 22: BERT-base ran at 1.37x torch.compile's time; this says whether the gap is GPU time
in some kernels or host time between launches)."""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workloads_models  # noqa: E402
from benchmarks.workloads import Built  # noqa: E402,F401  (the model builder returns one)

import minicomp  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("family", nargs="?", default="bert")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
args = p.parse_args()
sizes = dict(batch=args.batch, seq=args.seq, width=768, layers=12, heads=12, kv_heads=12, hidden=3072, vocab=30522)
built = workloads_models.make_model(args.family)("cuda", torch.bfloat16, sizes, torch.Generator().manual_seed(0))
fn, ins = built.fn, built.inputs
backends = {"torch.compile": torch.compile(fn), "minicomp": minicomp.compile(fn)}
with torch.no_grad():
    for name, f in backends.items():
        for _ in range(3):
            f(*ins)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                f(*ins)
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu = sum(e.self_device_time_total for e in events) / 5 / 1e3
        wall = max(e.cpu_time_total for e in events) / 5 / 1e3
        print(f"==== {name}: GPU busy {gpu:.3f} ms per call; longest host span {wall:.3f} ms per call")
        print(events.table(sort_by="self_cuda_time_total", row_limit=16, max_name_column_width=50))

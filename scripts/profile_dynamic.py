"""Where the time of a Llama decoder layer compiled over symbolic lengths goes, on CUDA:
torch.profiler over a few calls at one length, against the static specialisation.
    python scripts/profile_dynamic.py [LENGTH]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from dynamic_lengths import build  # noqa: E402

import minicomp  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
step, inputs = build(2048, "cuda", torch.bfloat16)
dyn, static = minicomp.compile(step, dynamic=True), minicomp.compile(step, dynamic=False)
x = inputs(2, n)
with torch.no_grad():
    for name, f in (("symbolic", dyn), ("static", static)):
        for _ in range(3):
            f(*x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                f(*x)
            torch.cuda.synchronize()
        print(f"==== {name}: fallbacks {f._last.generated.fallbacks}")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=60))

"""Where a whole model's time goes on CUDA, minicomp against torch.compile: torch.profiler over
a few calls of one of the suite's model workloads, kernels by CUDA time, and the host's share.
    python scripts/profile_model.py [bert|gpt2|llama|qwen2] [--batch 4 --seq 512] [--rows 16]
The model has the benchmark's geometry for its family (workloads_models.PREFILL); --batch and
--seq override its batch and length (--batch 1 --seq 16 is the small-batch workload).
(issue 22: BERT-base ran at 1.37x torch.compile's time; this says whether the gap is GPU time
in some kernels or host time between launches)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workloads_models  # noqa: E402

import minicomp  # noqa: E402

args, sizes, built = workloads_models.model_from_args(__doc__, rows=16)
print(f"{args.family}: {sizes}")
fn, ins = built.fn, built.inputs
ours = torch.compile(fn, backend=minicomp.backend()) if args.backend else minicomp.compile(fn)
backends = {"torch.compile": torch.compile(fn), "minicomp" + (" (backend)" if args.backend else ""): ours}
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
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=50))

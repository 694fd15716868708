"""Does a short do_bench right after the GPU sat idle time the kernel at idle clocks?

Autotuning times every config right after compiling them, a second or more in which the GPU
has nothing to do. This times a 256 MiB copy (the size of the memory-bound anchors) with the
autotuner's timing (5 ms warm-up, 20 ms of runs) after an idle pause, then again at once, and
with a longer warm-up after the same pause. It also runs minicomp's layernorm anchor module,
freshly imported, several times and prints the config its autotuner chose each time.

    python3 benchmarks/ablations/idle_clock.py [--trials 5] [--idle-s 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--idle-s", type=float, default=2.0)
    args = p.parse_args()
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    run = lambda: y.copy_(x)  # noqa: E731
    run()
    torch.cuda.synchronize()
    print(f"{'after idle, 5 ms warm-up':>28} {'at once after':>14} {'after idle, 50 ms warm-up':>26}")
    for _ in range(args.trials):
        time.sleep(args.idle_s)
        cold = do_bench(run, warmup=5, rep=20)
        warm = do_bench(run, warmup=5, rep=20)
        time.sleep(args.idle_s)
        long = do_bench(run, warmup=50, rep=20)
        print(f"{cold:28.4f} {warm:14.4f} {long:26.4f}  ms", flush=True)

    import minicomp
    from benchmarks.workloads import WORKLOADS
    from minicomp.runtime.loader import import_source
    built = WORKLOADS["layernorm"].build("cuda", torch.bfloat16, False)
    compiled = minicomp.compile(built.fn).compile_for(*built.inputs)
    for i in range(args.trials):
        mod = import_source(compiled.generated.source, f"idle_clock_layernorm_{i}", interpret=False)
        mod.CONSTANTS[:] = list(compiled.call.module.CONSTANTS)
        time.sleep(args.idle_s)
        measure.settle(lambda: mod.call(*built.inputs))   # compiled and autotuned, not eager's stand-in
        kernel = next(v for v in vars(mod).values() if hasattr(v, "best_config"))
        ms = do_bench(lambda: mod.call(*built.inputs), warmup=25, rep=100)
        print(f"layernorm module {i}: autotuner chose {kernel.best_config}, then ran at {ms:.4f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

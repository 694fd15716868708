"""Run the attention anchor (causal, B4 H32 S4096 d128, bf16) a few times, for a profiler.

    ncu --kernel-name regex:attn --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        --section WarpStateStats python3 benchmarks/ablations/profile_attention.py --config 64,64,3,4

`--config BLOCK_M,BLOCK_N,stages,warps` runs minicomp's generated kernel under that one
config; `--variant` one of benchmarks/ablations/matmul.py's text edits of it; `--sdpa` runs
F.scaled_dot_product_attention instead. The answer is checked against SDPA first, so a
profile is never taken of a wrong kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402
from benchmarks.ablations.harness import check, with_one_config  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="64,64,3,4", help="BLOCK_M,BLOCK_N,stages,warps")
    p.add_argument("--variant", default="shipped")
    p.add_argument("--sdpa", action="store_true", help="profile F.scaled_dot_product_attention instead")
    p.add_argument("--runs", type=int, default=4)
    args = p.parse_args()
    import minicomp
    from benchmarks import workloads as W
    from benchmarks.ablations.matmul import _attention_variants
    B, H, S, D = 4, 32, 4096, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = sdpa(q, k, v, is_causal=True)
    if args.sdpa:
        run = lambda: sdpa(q, k, v, is_causal=True)  # noqa: E731
    else:
        import triton
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        compiled = minicomp.compile(W.make_causal_attention(S, D, "cuda"))
        compiled.compile_for(q, k, v)
        bm, bn, st, wp = (int(x) for x in args.config.split(","))
        one = f'triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}}}, num_stages={st}, num_warps={wp}),'
        source = _attention_variants(compiled.source)[args.variant]
        mod = with_one_config(source, one, f"prof_{args.variant}_{bm}_{bn}_{st}_{wp}")
        run = lambda: mod.call(q, k, v)[0]  # noqa: E731
    check(measure.settle(run), ref, args.variant)   # the kernel compiled, not eager's stand-in
    for _ in range(args.runs):
        run()
    torch.cuda.synchronize()
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

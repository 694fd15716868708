"""minicomp's two attention kernels side by side on Hopper: the Gluon kernel
(codegen/attention_hopper_kernel.py) and the block-language one (codegen/attention.py, what
MINICOMP_HOPPER_ATTENTION=0 leaves) and the non-persistent prototype the first grew from
(benchmarks/prototypes/gluon_attention_pp.py), on hand-written causal attention at the suite's anchor
and at the attention shapes of samples/gpt_block.py and samples/llama_block.py, against SDPA.

Each is checked against SDPA first, then the three are timed in rounds that take turns
(`benchmarks/measure.py`). Run on the device:

    python3 benchmarks/ablations/attention_hopper_ab.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (label, batch, query heads, KV heads, sequence, head dim)
SHAPES = [("anchor B4 H32 S4096 d128", 4, 32, 32, 4096, 128),
          ("gpt_block B8 H16 S1024 d128", 8, 16, 16, 1024, 128),
          ("llama_block B4 H32/8 S2048 d128", 4, 32, 8, 2048, 128)]


def hand_written(seq: int, d: int, groups: int):
    """Causal attention as matmul/scale/mask/softmax/matmul (KV heads repeated for GQA)."""
    scale = 1.0 / math.sqrt(d)

    def attention(q, k, v):
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=q.device))
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    return attention


def compiled(fn, inputs, hopper: bool):
    import minicomp
    from minicomp.codegen import attention_hopper
    old = os.environ.get(attention_hopper.ENV_VAR)
    os.environ[attention_hopper.ENV_VAR] = "" if hopper else "0"
    try:
        c = minicomp.compile(fn)
        c(*inputs)
    finally:
        if old is None:
            os.environ.pop(attention_hopper.ENV_VAR)
        else:
            os.environ[attention_hopper.ENV_VAR] = old
    return c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import triton

    from benchmarks.measure import time_interleaved
    # TMA descriptors built in a kernel take scratch memory from Triton's allocator (the
    # prototype needs one; minicomp's modules install theirs)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    for label, b, hq, hkv, s, d in SHAPES:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
        fn = hand_written(s, d, hq // hkv)
        fns = {"SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)}
        if hq == hkv:   # the non-persistent prototype the kernel grew from (no GQA)
            from benchmarks.prototypes import gluon_attention_pp as PP
            torch.testing.assert_close(PP.attention(q, k, v, 2), ref, atol=2e-2, rtol=2e-2)
            fns["gluon non-persistent (benchmarks/prototypes/gluon_attention_pp.py)"] = lambda: PP.attention(q, k, v, 2)
        for name, hopper in (("gluon", True), ("block-language", False)):
            c = compiled(fn, (q, k, v), hopper)
            kernels = [n for n in c.compile_for(q, k, v).generated.kernel_names if "attn" in n]
            torch.testing.assert_close(c(q, k, v), ref, atol=2e-2, rtol=2e-2)
            fns[f"{name} ({', '.join(kernels) or 'no attention kernel'})"] = lambda c=c: c(q, k, v)
        t = time_interleaved(fns, argparse.Namespace(device="cuda", reps=20, warmup_ms=25.0, rep_ms=100.0),
                             rounds=args.rounds)
        sdpa_ms = t["SDPA"]["ms"]
        print(f"{label}:")
        for name, rec in t.items():
            rounds = " ".join(f"{m:.3f}" for m in rec["rounds_ms"])
            print(f"  {name:58s} {rec['ms']:.3f} ms  x{rec['ms'] / sdpa_ms:.3f} SDPA  (rounds {rounds})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

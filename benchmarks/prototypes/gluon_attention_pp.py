"""The non-persistent form of codegen's Hopper attention kernel, kept to compare against:
one program per 128 query rows of one (batch, head), warp-specialised like
benchmarks/prototypes/gluon_attention_ws.py (a TMA loader warp, two consumer warpgroups of 64 rows),
with 128-key blocks and the softmax of block j+1 overlapping P @ V of block j
(FlashAttention-3's intra-warpgroup overlap). Each trip is

    issue S[j+1] = Q @ K[j+1]^T;  issue acc += P[j] @ V[j]     (both async)
    wait until S[j+1] is done (P[j] @ V[j] stays in flight)
    softmax of S[j+1] -> P[j+1], alpha
    wait until P[j] @ V[j] is done; acc *= alpha

so one score tile is live (gluon_attention_ws.py held two, so its key blocks had to be 64
wide) and nothing is in flight across the loop's back edge. The consumers run codegen's
`_hopper_attn_rows` (minicomp/codegen/attention_hopper_kernel.py) with the ring starting
at slot 0; the loader is gluon_attention_ws.py's.

Made persistent, this is the kernel codegen ships; what each of its options measured on the
H200 is in BENCHMARKS.md, "The Gluon attention prototypes".

Scope: causal, contiguous [B, H, S, D] bf16/fp16, S a multiple of 128, D 64 or 128.

    python3 benchmarks/prototypes/gluon_attention_pp.py [--stages 2,3]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.prototypes.gluon_attention_ws import _loader  # noqa: E402
from minicomp.codegen.attention_hopper_kernel import _hopper_attn_rows  # noqa: E402


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, o_base, row0, n_blocks,
              qk_scale, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.wait(q_bar, 0)
    _hopper_attn_rows(q_smem, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, o_ptr, o_base, row0, n_blocks, 0,
                      qk_scale, D, BM, BN, D, STAGES, True)


@gluon.jit
def attn_fwd_pp(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, ROWS: gl.constexpr, S: gl.constexpr, D: gl.constexpr,
                STAGES: gl.constexpr):
    BM: gl.constexpr = 64
    BN: gl.constexpr = 128
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)      # longest rows first
    bh = gl.program_id(1)
    kv_row = bh * S
    q_row = kv_row + pid_m * BN
    q_desc = tma.make_tensor_descriptor(q_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D], layout=smem)
    k_desc = tma.make_tensor_descriptor(k_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)
    v_desc = tma.make_tensor_descriptor(v_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)

    q_smem0 = gl.allocate_shared_memory(dtype, [BM, D], smem)
    q_smem1 = gl.allocate_shared_memory(dtype, [BM, D], smem)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)            # both consumers release a slot
        mbarrier.init(v_empty.index(i), count=2)

    o_base = kv_row.to(gl.int64) * D
    gl.warp_specialize([
        (_consumer, (q_smem0, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, o_base, pid_m * BN,
                     pid_m + 1, qk_scale, BM, BN, D, STAGES)),
        (_consumer, (q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, o_base,
                     pid_m * BN + BM, pid_m + 1, qk_scale, BM, BN, D, STAGES)),
        (_loader, (q_desc, k_desc, v_desc, q_smem0, q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty,
                   v_empty, q_row, kv_row, pid_m + 1, BM, BN, STAGES)),
    ], [4, 1], [240, 24])


def attention(q, k, v, stages: int = 2):
    """Causal attention of contiguous [B, H, S, D] q, k, v (one dtype)."""
    B, H, S, D = q.shape
    assert k.shape == q.shape == v.shape and S % 128 == 0 and D in (64, 128)
    o = torch.empty_like(q)
    attn_fwd_pp[(S // 128, B * H)](q, k, v, o, 1.0 / math.sqrt(D) * 1.4426950408889634, ROWS=B * H * S, S=S, D=D,
                                   STAGES=stages, num_warps=4)
    return o


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="2,3")
    args = p.parse_args()
    from benchmarks.prototypes import gluon_attention as G
    from benchmarks.prototypes import gluon_attention_ws as WS

    def candidates(q, k, v):
        out = [("gluon ws (64-key, two S) stages=3", lambda: WS.attention(q, k, v, 3))]
        for st in (int(x) for x in args.stages.split(",")):
            out.append((f"gluon pp stages={st}", lambda st=st: attention(q, k, v, st)))
        return out

    G.check_and_time(candidates)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Causal attention in Gluon, warp-specialised, with 128-key blocks and the softmax of block
j+1 overlapping P @ V of block j (FlashAttention-3's intra-warpgroup overlap), optionally with
the two consumer warpgroups taking turns to issue their MMAs (its "ping-pong").

benchmarks/gluon_attention_ws.py overlaps the softmax of block j with both Q @ K^T of j+1
and P @ V of j-1. That holds two score tiles in registers, so its key blocks are 64 wide:
with 128 keys a 64-row consumer needs 64 registers per score tile, 64 for the output and
32 for P, and two score tiles do not fit. Per 64 keys it then pays the acc rescale (64
multiplies a thread), the row max/sum shuffles and two barrier waits. Here each trip is

    issue S[j+1] = Q @ K[j+1]^T;  issue acc += P[j] @ V[j]     (both async)
    wait until S[j+1] is done (P[j] @ V[j] stays in flight)
    softmax of S[j+1] -> P[j+1], alpha
    wait until P[j] @ V[j] is done; acc *= alpha

so one score tile is live, Q @ K^T overlaps the other consumer's softmax only, and nothing
is in flight across the loop's back edge (ptxas keeps the wgmma pipeline: no C7511-C7514).

With PINGPONG the consumers pass a turn through two mbarriers: a consumer waits for its turn
before issuing a trip's two MMAs and hands the turn over right after, so one warpgroup's
MMAs run during the other's softmax instead of both queueing at once.

Scope as the other prototypes: causal, contiguous [B, H, S, D] bf16/fp16, S a multiple of
128, D 64 or 128.

    python3 benchmarks/gluon_attention_pp.py [--bn 64,128] [--stages 2,3] [--pingpong 0,1]

On the H200 (B4 H32 S4096 d128 causal bf16, three medians each; SDPA 1.01-1.04 ms, the
block-language kernel 1.24-1.26 and gluon_attention_ws.py 1.14-1.17 in the same run;
results/2026-11-29-s5/gluon-attention-pp.txt): 128-key blocks 1.07-1.10 ms (2 stages) and
1.06-1.12 (3), 64-key blocks 1.15-1.18; ping-pong 1.10-1.13, slower. The 128-key kernel,
made persistent, is codegen's Hopper attention kernel (minicomp/codegen/attention_hopper_kernel.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gluon_attention import _softmax, _tma_load  # noqa: E402


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem0, q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty,
            q_row, kv_row, n_blocks, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Producer warp: both 64-row Q tiles, then K[j] and V[j] into slot j % STAGES once both
    consumers released the slot's previous tenant (the first pass waits on nothing)."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem0)
    _tma_load(q_desc, [q_row + BM, 0], q_bar, q_smem1)
    for j in range(0, n_blocks):
        slot = j % STAGES
        phase = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [kv_row + j * BN, 0], k_ready.index(slot), k_ring.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [kv_row + j * BN, 0], v_ready.index(slot), v_ring.index(slot))


@gluon.jit
def _trip(j, p, acc, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty, turn_mine, turn_other,
          qk_scale, rows, cols0, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
          BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, PINGPONG: gl.constexpr):
    """P[j] (given, in registers) @ V[j] in flight while S[j+1] becomes P[j+1]."""
    nxt = j + 1
    if PINGPONG:
        mbarrier.wait(turn_mine, j & 1)
    mbarrier.wait(k_ready.index(nxt % STAGES), (nxt // STAGES) & 1)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(nxt % STAGES).permute((1, 0)),
                                 gl.full([BM, BN], 0.0, gl.float32, layout=s_layout),
                                 use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p, v_ring.index(j % STAGES), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn_other)
    s = hopper.warpgroup_mma_wait(1, deps=[s_tok])                       # S[j+1] done, P[j] @ V[j] not
    mbarrier.arrive(k_empty.index(nxt % STAGES))
    p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, nxt * BN + cols0, MASKED)
    acc, p = hopper.warpgroup_mma_wait(0, deps=[acc_tok, p])
    mbarrier.arrive(v_empty.index(j % STAGES))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p = gl.convert_layout(p_new.to(p.dtype), p_layout)
    return p, acc, m_i, l_i


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, turn_mine, turn_other, o_ptr,
              q_row, tile, n_blocks, qk_scale, FIRST: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              D: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """One 64-row query tile (`tile`-th of its sequence) over key blocks 0 .. n_blocks-1, the
    last on the diagonal (masked)."""
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = tile * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BM], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.full([BM, D], 0.0, gl.float32, layout=o_layout)
    if PINGPONG:
        if not FIRST:
            mbarrier.arrive(turn_other)        # the first consumer goes first

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)),
                                 gl.full([BM, BN], 0.0, gl.float32, layout=s_layout), use_acc=False, is_async=True)
    s = hopper.warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0))
    if n_blocks == 1:
        p32, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, cols0, True)
    else:
        p32, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, cols0, False)
    p = gl.convert_layout(p32.to(q_smem.dtype), p_layout)

    for j in range(0, n_blocks - 2):
        p, acc, m_i, l_i = _trip(j, p, acc, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty,
                                 turn_mine, turn_other, qk_scale, rows, cols0, s_layout, o_layout, p_layout,
                                 BM, BN, STAGES, False, PINGPONG)
    if n_blocks >= 2:
        p, acc, m_i, l_i = _trip(n_blocks - 2, p, acc, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring, v_ready,
                                 v_empty, turn_mine, turn_other, qk_scale, rows, cols0, s_layout, o_layout,
                                 p_layout, BM, BN, STAGES, True, PINGPONG)

    last = n_blocks - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p, v_ring.index(last % STAGES), acc, is_async=True)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc_tok])
    mbarrier.arrive(v_empty.index(last % STAGES))
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    orow = q_row + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    ocol = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + orow[:, None] * D + ocol[None, :], o.to(q_smem.dtype))


@gluon.jit
def attn_fwd_pp(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, ROWS: gl.constexpr, S: gl.constexpr, D: gl.constexpr,
                BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)      # longest rows first
    bh = gl.program_id(1)
    q_row = bh * S + pid_m * 2 * BM                         # two 64-row tiles per program
    kv_row = bh * S
    n0 = (pid_m * 2 * BM + BM + BN - 1) // BN               # key blocks up to each tile's diagonal
    n1 = (pid_m * 2 * BM + 2 * BM + BN - 1) // BN
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
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)            # both consumers release a slot
        mbarrier.init(v_empty.index(i), count=2)

    gl.warp_specialize([
        (_consumer, (q_smem0, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, turn.index(0),
                     turn.index(1), o_ptr, q_row, 2 * pid_m, n0, qk_scale, True, BM, BN, D, STAGES, PINGPONG)),
        (_consumer, (q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, turn.index(1),
                     turn.index(0), o_ptr, q_row + BM, 2 * pid_m + 1, n1, qk_scale, False, BM, BN, D, STAGES,
                     PINGPONG)),
        (_loader, (q_desc, k_desc, v_desc, q_smem0, q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty,
                   v_empty, q_row, kv_row, n1, BM, BN, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def attention(q, k, v, bn: int = 128, stages: int = 2, pingpong: bool = False, loader_regs: int = 24,
              consumer_regs: int = 240):
    """Causal attention of contiguous [B, H, S, D] q, k, v (one dtype)."""
    B, H, S, D = q.shape
    BM = 64
    assert k.shape == q.shape == v.shape and S % (2 * BM) == 0 and D in (64, 128) and bn in (64, 128)
    assert not (pingpong and bn != 2 * BM), "turns need both consumers to run the same number of trips"
    o = torch.empty_like(q)
    attn_fwd_pp[(S // (2 * BM), B * H)](q, k, v, o, 1.0 / math.sqrt(D) * 1.4426950408889634, ROWS=B * H * S, S=S,
                                        D=D, BM=BM, BN=bn, STAGES=stages, LOADER_REGS=loader_regs,
                                        CONSUMER_REGS=consumer_regs, PINGPONG=pingpong, num_warps=4)
    return o


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bn", default="128")
    p.add_argument("--stages", default="2,3")
    p.add_argument("--pingpong", default="0,1")
    args = p.parse_args()
    from benchmarks import gluon_attention as G
    from benchmarks import gluon_attention_ws as WS

    def candidates(q, k, v):
        out = [("gluon ws (64-key, two S) stages=3", lambda: WS.attention(q, k, v, 3))]
        for bn in (int(x) for x in args.bn.split(",")):
            for st in (int(x) for x in args.stages.split(",")):
                for pp in (int(x) for x in args.pingpong.split(",")):
                    if pp and bn != 128:
                        continue
                    out.append((f"gluon pp bn={bn} stages={st} pingpong={pp}",
                                lambda bn=bn, st=st, pp=pp: attention(q, k, v, bn, st, bool(pp))))
        return out

    G.check_and_time(candidates)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

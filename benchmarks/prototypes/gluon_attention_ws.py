"""The Gluon attention prototype (benchmarks/prototypes/gluon_attention.py) warp-specialised as cuDNN's
kernel is: Gluon's `warp_specialize` runs the TMA loads of Q, K and V in one producer warp,
and two consumer warpgroups (the default partition and a worker of 4 warps) each compute a
64-row query tile of the program's 128 rows, sharing the K/V ring. Registers move from the
producer (24) to the consumers.

The two sides hand K/V ring slots over through mbarriers: `ready` (the loader's TMA landed)
and `empty` (the consumer's MMA that read the slot is done). The consumer's loop is the
prototype's: two key blocks per loop trip, Q @ K^T of the next block and P @ V of the last
in flight during the softmax, nothing in flight at the end of a trip.

    python3 benchmarks/prototypes/gluon_attention_ws.py [--stages 2,3]
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

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.prototypes.gluon_attention import _finish, _softmax, _start, _tma_load  # noqa: E402


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty,
            q_row, kv_row, n_total, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Producer warp: both Q tiles once, then K[j] and V[j] into slot j % STAGES once both
    consumers have released the slot's previous tenant (the first pass waits on nothing).
    The first consumer needs one block fewer; the producer never waits on that last slot."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    _tma_load(q_desc, [q_row + BM, 0], q_bar, q_smem1)
    for j in range(0, n_total):
        slot = j % STAGES
        phase = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [kv_row + j * BN, 0], k_ready.index(slot), k_ring.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [kv_row + j * BN, 0], v_ready.index(slot), v_ring.index(slot))


@gluon.jit
def _step(j, s, acc_tok, p_prev, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty,
          qk_scale, rows, cols0, zero_s, o_layout: gl.constexpr, p_layout: gl.constexpr, BN: gl.constexpr,
          STAGES: gl.constexpr, SETTLE: gl.constexpr, PREV_SETTLED: gl.constexpr):
    """One unmasked key block j, as gluon_attention._step, releasing slots instead of
    refilling them: K[j+1]'s once S[j+1] is done, V[j-1]'s once P[j-1] @ V[j-1] is (here if
    the step before left it in flight, else that step's settle did)."""
    nxt = j + 1
    mbarrier.wait(k_ready.index(nxt % STAGES), (nxt // STAGES) & 1)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(nxt % STAGES).permute((1, 0)), zero_s,
                                 use_acc=False, is_async=True)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, j * BN + cols0, False)
    acc, p_prev = hopper.warpgroup_mma_wait(1, deps=[acc_tok, p_prev])       # P[j-1] @ V[j-1] done
    if not PREV_SETTLED:
        mbarrier.arrive(v_empty.index((j - 1) % STAGES))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_prev = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p_prev, v_ring.index(j % STAGES), acc, is_async=True)
    s = hopper.warpgroup_mma_wait(1, deps=[s_tok])                           # S[j+1] done
    mbarrier.arrive(k_empty.index(nxt % STAGES))
    if SETTLE:
        acc, p_prev = hopper.warpgroup_mma_wait(0, deps=[acc_tok, p_prev])
        mbarrier.arrive(v_empty.index(j % STAGES))
        acc_tok = hopper.warpgroup_mma_init(acc)
    return s, acc_tok, p_prev, m_i, l_i


@gluon.jit
def _consumer(q_smem, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, q_row, pid_m, n_total,
              qk_scale, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    rows, cols0, m_i, l_i, zero_s, p_prev, s, acc_tok = _start(q_smem, k_ring, q_bar, k_ready, pid_m, s_layout,
                                                               o_layout, p_layout, BM, BN, D)
    mbarrier.arrive(k_empty.index(0))

    steps = n_total - 1
    if steps % 2 == 1:
        s, acc_tok, p_prev, m_i, l_i = _step(0, s, acc_tok, p_prev, m_i, l_i, q_smem, k_ring, k_ready, k_empty,
                                             v_ring, v_ready, v_empty, qk_scale, rows, cols0, zero_s, o_layout,
                                             p_layout, BN, STAGES, True, True)
    for j in range(steps % 2, steps, 2):
        s1, acc_tok, p_prev, m_i, l_i = _step(j, s, acc_tok, p_prev, m_i, l_i, q_smem, k_ring, k_ready, k_empty,
                                              v_ring, v_ready, v_empty, qk_scale, rows, cols0, zero_s, o_layout,
                                              p_layout, BN, STAGES, False, True)
        s, acc_tok, p_prev, m_i, l_i = _step(j + 1, s1, acc_tok, p_prev, m_i, l_i, q_smem, k_ring, k_ready, k_empty,
                                             v_ring, v_ready, v_empty, qk_scale, rows, cols0, zero_s, o_layout,
                                             p_layout, BN, STAGES, True, False)

    _finish(s, acc_tok, p_prev, m_i, l_i, n_total - 1, v_ring, v_ready, o_ptr, q_row, qk_scale, rows, cols0,
            o_layout, p_layout, BM, BN, D, STAGES)


@gluon.jit
def attn_fwd_ws(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, ROWS: gl.constexpr, S: gl.constexpr, D: gl.constexpr,
                BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                CONSUMER_REGS: gl.constexpr):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)      # longest rows first
    bh = gl.program_id(1)
    q_row = bh * S + pid_m * 2 * BM                         # two 64-row tiles per program
    kv_row = bh * S
    n_total = 2 * pid_m + 2          # causal: key blocks up to the second tile's diagonal
    q_desc = tma.make_tensor_descriptor(q_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D], layout=smem)
    k_desc = tma.make_tensor_descriptor(k_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)
    v_desc = tma.make_tensor_descriptor(v_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], smem)
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

    gl.warp_specialize([
        (_consumer, (q_smem, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, q_row, 2 * pid_m,
                     n_total - 1, qk_scale, BM, BN, D, STAGES)),
        (_consumer, (q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, q_row + BM,
                     2 * pid_m + 1, n_total, qk_scale, BM, BN, D, STAGES)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, q_smem1, k_ring, v_ring, q_bar, k_ready, v_ready, k_empty, v_empty,
                   q_row, kv_row, n_total, BM, BN, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def attention(q, k, v, stages: int = 3, loader_regs: int = 24, consumer_regs: int = 240):
    """Causal attention of contiguous [B, H, S, D] q, k, v (one dtype), warp-specialised."""
    B, H, S, D = q.shape
    BM = BN = 64
    assert k.shape == q.shape == v.shape and S % (2 * BM) == 0 and D in (64, 128)
    o = torch.empty_like(q)
    attn_fwd_ws[(S // (2 * BM), B * H)](q, k, v, o, 1.0 / math.sqrt(D) * 1.4426950408889634, ROWS=B * H * S, S=S,
                                        D=D, BM=BM, BN=BN, STAGES=stages, LOADER_REGS=loader_regs,
                                        CONSUMER_REGS=consumer_regs, num_warps=4)
    return o


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="2,3")
    p.add_argument("--loader-regs", default="24")
    p.add_argument("--consumer-regs", default="240")
    args = p.parse_args()
    from benchmarks.prototypes import gluon_attention as G

    def candidates(q, k, v):
        out = [("gluon, no loader warp, stages=3", lambda: G.attention(q, k, v, 3, 4))]
        for st in (int(x) for x in args.stages.split(",")):
            for regs in (int(x) for x in args.loader_regs.split(",")):
                for cregs in (int(x) for x in args.consumer_regs.split(",")):
                    out.append((f"gluon ws stages={st} regs={regs}/{cregs}",
                                lambda st=st, regs=regs, cregs=cregs: attention(q, k, v, st, regs, cregs)))
        return out

    G.check_and_time(candidates)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A prototype causal attention forward kernel in Gluon (Triton's lower-level dialect), for
Hopper, to measure what overlapping the softmax with the tensor cores is worth.

minicomp's attention kernel (codegen/attention.py) is written in Triton's block language, and
Triton 3.6 waits for every `tl.dot` of its key loop at once, so the tensor cores idle while
the softmax runs. Here the waits are explicit: while the softmax of key block j runs, the
scores of block j+1 (Q @ K^T) and the product of block j-1 (P @ V) are in flight:

    issue S[j+1] = Q @ K[j+1]^T          (async)
    softmax of S[j]  -> P[j], alpha
    wait until P[j-1] @ V[j-1] is done   (at most one group in flight: S[j+1])
    acc = acc * alpha; issue acc += P[j] @ V[j]   (async)
    wait until S[j+1] is done            (at most one in flight: P[j] @ V[j])

K and V stream through a ring of shared-memory slots filled by TMA, each slot refilled as
soon as the MMA that read it is done. One warpgroup (4 warps) per program, BLOCK_M = 64
query rows, BLOCK_N = 64 keys: 2 programs fit on an SM.

Scope of the prototype: causal, q/k/v/o contiguous [B, H, S, D] of one dtype (bf16/fp16),
S a multiple of 64, D 64 or 128, 4 warps. Run on the device:

    python3 benchmarks/prototypes/gluon_attention.py [--stages 2,3] [--warps 4]

It checks against SDPA first, then times against SDPA and minicomp's shipped kernel.

What it showed on the H200 (times, the variants tried and why ptxas serialised the wgmmas)
is in BENCHMARKS.md, "The Gluon attention prototypes".
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the online-softmax step and the TMA load (its name differs between Triton versions) are
# codegen's Hopper kernel's
from minicomp.codegen.attention_hopper_kernel import _hopper_attn_softmax as _softmax  # noqa: E402
from minicomp.codegen.attention_hopper_kernel import _tma_load  # noqa: E402


@gluon.jit
def _fill(desc, ring, bars, j, row0, BN: gl.constexpr, STAGES: gl.constexpr, pred):
    """Start the TMA load of key block j (rows row0 + j*BN ...) into ring slot j % STAGES."""
    slot = j % STAGES
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [row0 + j * BN, 0], bars.index(slot), ring.index(slot), pred=pred)


@gluon.jit
def _start(q_smem, k_ring, q_bar, k_bars, pid_m, s_layout: gl.constexpr, o_layout: gl.constexpr,
           p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr):
    """The running state of a 64-row tile and S[0] = Q @ K[0]^T (waited for; slot 0 of the K
    ring may be refilled after it)."""
    rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BM], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    zero_s = gl.full([BM, BN], 0.0, gl.float32, layout=s_layout)
    p_prev = gl.full([BM, BN], 0.0, q_smem.dtype, layout=p_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = hopper.warpgroup_mma_wait(0, deps=[s_tok])
    acc_tok = hopper.warpgroup_mma_init(gl.full([BM, D], 0.0, gl.float32, layout=o_layout))
    return rows, cols0, m_i, l_i, zero_s, p_prev, s, acc_tok


@gluon.jit
def _finish(s, acc_tok, p_prev, m_i, l_i, j, v_ring, v_bars, o_ptr, q_row, qk_scale, rows, cols0,
            o_layout: gl.constexpr, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
            STAGES: gl.constexpr):
    """The last key block j (on the diagonal: masked, nothing left to overlap), then O = acc / l
    stored to rows q_row ... q_row + BM of o ([rows, D], contiguous)."""
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, j * BN + cols0, True)
    acc, p_prev = hopper.warpgroup_mma_wait(0, deps=[acc_tok, p_prev])
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_prev = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    mbarrier.wait(v_bars.index(j % STAGES), (j // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p_prev, v_ring.index(j % STAGES), acc, is_async=True)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc_tok])
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    orow = q_row + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    ocol = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + orow[:, None] * D + ocol[None, :], o.to(p_prev.dtype))


@gluon.jit
def _step(j, s, acc_tok, p_prev, m_i, l_i, q_smem, k_desc, k_ring, k_bars, v_desc, v_ring, v_bars, kv_row, n_total,
          qk_scale, rows, cols0, zero_s, o_layout: gl.constexpr, p_layout: gl.constexpr, BN: gl.constexpr,
          STAGES: gl.constexpr, SETTLE: gl.constexpr):
    """One unmasked key block j: S[j] (given) -> P[j]; S[j+1] and P[j] @ V[j] left in flight
    around the softmax as the module docstring says. Returns S[j+1] and the running state."""
    nxt = j + 1
    mbarrier.wait(k_bars.index(nxt % STAGES), (nxt // STAGES) & 1)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(nxt % STAGES).permute((1, 0)), zero_s,
                                 use_acc=False, is_async=True)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, rows, j * BN + cols0, False)
    acc, p_prev = hopper.warpgroup_mma_wait(1, deps=[acc_tok, p_prev])       # P[j-1] @ V[j-1] done
    _fill(v_desc, v_ring, v_bars, j - 1 + STAGES, kv_row, BN, STAGES, (j >= 1) & (j - 1 + STAGES < n_total))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_prev = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    mbarrier.wait(v_bars.index(j % STAGES), (j // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p_prev, v_ring.index(j % STAGES), acc, is_async=True)
    s = hopper.warpgroup_mma_wait(1, deps=[s_tok])                           # S[j+1] done
    _fill(k_desc, k_ring, k_bars, nxt + STAGES, kv_row, BN, STAGES, nxt + STAGES < n_total)
    if SETTLE:   # nothing may stay in flight across the loop's back edge (see attn_fwd)
        acc, p_prev = hopper.warpgroup_mma_wait(0, deps=[acc_tok, p_prev])
        acc_tok = hopper.warpgroup_mma_init(acc)
    return s, acc_tok, p_prev, m_i, l_i


@gluon.jit
def attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, ROWS: gl.constexpr, S: gl.constexpr, D: gl.constexpr,
             BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)      # longest rows first
    bh = gl.program_id(1)
    q_row = bh * S + pid_m * BM
    kv_row = bh * S
    q_desc = tma.make_tensor_descriptor(q_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D], layout=smem)
    k_desc = tma.make_tensor_descriptor(k_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)
    v_desc = tma.make_tensor_descriptor(v_ptr, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D], layout=smem)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], smem)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    n_total = pid_m + 1                     # causal, BM == BN: key blocks up to the diagonal, the last masked
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _fill(k_desc, k_ring, k_bars, i, kv_row, BN, STAGES, i < n_total)
        _fill(v_desc, v_ring, v_bars, i, kv_row, BN, STAGES, i < n_total)

    rows, cols0, m_i, l_i, zero_s, p_prev, s, acc_tok = _start(q_smem, k_ring, q_bar, k_bars, pid_m, s_layout,
                                                               o_layout, p_layout, BM, BN, D)
    _fill(k_desc, k_ring, k_bars, STAGES, kv_row, BN, STAGES, STAGES < n_total)

    # S[j] is consumed one step after the step that issued it, and P[j] @ V[j] is waited for in
    # the next step. ptxas serialises every wgmma of the kernel (warnings C7511, C7514) when a
    # loop carries an accumulator it must copy at the back edge, so each loop trip runs two
    # steps (the two S buffers alternate inside it) and the second settles: nothing is in
    # flight when the trip ends.
    steps = n_total - 1
    if steps % 2 == 1:
        s, acc_tok, p_prev, m_i, l_i = _step(0, s, acc_tok, p_prev, m_i, l_i, q_smem, k_desc, k_ring, k_bars, v_desc,
                                             v_ring, v_bars, kv_row, n_total, qk_scale, rows, cols0, zero_s,
                                             o_layout, p_layout, BN, STAGES, True)
    for j in range(steps % 2, steps, 2):
        s1, acc_tok, p_prev, m_i, l_i = _step(j, s, acc_tok, p_prev, m_i, l_i, q_smem, k_desc, k_ring, k_bars, v_desc,
                                              v_ring, v_bars, kv_row, n_total, qk_scale, rows, cols0, zero_s,
                                              o_layout, p_layout, BN, STAGES, False)
        s, acc_tok, p_prev, m_i, l_i = _step(j + 1, s1, acc_tok, p_prev, m_i, l_i, q_smem, k_desc, k_ring, k_bars,
                                             v_desc, v_ring, v_bars, kv_row, n_total, qk_scale, rows, cols0, zero_s,
                                             o_layout, p_layout, BN, STAGES, True)

    _finish(s, acc_tok, p_prev, m_i, l_i, n_total - 1, v_ring, v_bars, o_ptr, q_row, qk_scale, rows, cols0,
            o_layout, p_layout, BM, BN, D, STAGES)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))


def attention(q, k, v, stages: int = 3, warps: int = 4):
    """Causal attention of contiguous [B, H, S, D] q, k, v (one dtype) with the prototype."""
    B, H, S, D = q.shape
    BM, BN = 16 * warps, 64
    assert warps == 4, "one warpgroup: the steps mask no block but the last, so BLOCK_M must equal BLOCK_N"
    assert k.shape == q.shape == v.shape and S % BM == 0 and S % BN == 0 and D in (64, 128)
    o = torch.empty_like(q)
    grid = (S // BM, B * H)
    attn_fwd[grid](q, k, v, o, 1.0 / math.sqrt(D) * 1.4426950408889634, ROWS=B * H * S, S=S, D=D,
                   BM=BM, BN=BN, STAGES=stages, num_warps=warps)
    return o


def check_and_time(candidates_for) -> None:
    """The anchor (causal B4 H32 S4096 d128 bf16): SDPA, minicomp's shipped kernel and
    `candidates_for(q, k, v)` (a list of (name, call)), each checked against SDPA, then timed
    (three do_bench medians); a candidate that fails is reported and skipped."""
    from triton.testing import do_bench

    import minicomp
    from benchmarks import workloads as W
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    B, H, S, D = 4, 32, 4096, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = sdpa(q, k, v, is_causal=True)
    flops = 4 * B * H * S * S * D / 2
    compiled = minicomp.compile(W.make_causal_attention(S, D, "cuda"))
    compiled(q, k, v)
    candidates = [("SDPA", lambda: sdpa(q, k, v, is_causal=True)), ("minicomp shipped", lambda: compiled(q, k, v))]
    for name, fn in candidates + candidates_for(q, k, v):
        try:
            torch.testing.assert_close(fn(), ref, atol=2e-2, rtol=2e-2)
            ms = [do_bench(fn, warmup=25, rep=100) for _ in range(3)]
            print(f"{name:36s} {' '.join(f'{m:.4f}' for m in ms)} ms  {flops / min(ms) / 1e9:.0f} TFLOP/s", flush=True)
        except Exception as e:   # report and go on to the next candidate
            print(f"{name:36s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="2,3")
    p.add_argument("--warps", default="4")
    args = p.parse_args()
    check_and_time(lambda q, k, v: [(f"gluon stages={st} warps={wp}", lambda st=st, wp=wp: attention(q, k, v, st, wp))
                                    for st in (int(x) for x in args.stages.split(","))
                                    for wp in (int(x) for x in args.warps.split(","))])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Hopper attention kernel, in Gluon: copied verbatim into generated modules that use it.

codegen/attention_hopper.py decides when a group uses this kernel and writes its launch; this
file is the kernel only, so that the text a module carries is the text tested here. Each
group binds its own `gluon.jit(attn_fwd_hopper)` (the launch helper keys compiled kernels by
function object) and specialises it through constexpr arguments.

A tile is 128 query rows of one (batch, head). The grid is persistent (at most one program
per SM, 196 KiB of shared memory each), and each program runs three warp-specialised
partitions (Gluon's `warp_specialize`, with registers moved by `setmaxnreg`):

- a loader warp (24 registers) that brings each tile's two 64-row Q tiles into one of two Q
  buffers by TMA, then K[j] and V[j] (128 keys each) into a ring of STAGES shared-memory
  slots, reusing a buffer or slot once both consumers released it. It runs ahead into the
  next tile's Q, K and V while the consumers finish this one;
- two consumer warpgroups (240 registers), each owning 64 query rows of the tile: an online
  softmax in base 2 over the key blocks up to its diagonal (causal) or all of them. Each
  trip issues S[j+1] = Q @ K[j+1]^T and acc += P[j] @ V[j] asynchronously, waits for S[j+1]
  only, runs its softmax while P[j] @ V[j] is still on the tensor cores, then waits for that
  and rescales acc. The other consumer's MMAs fill the tensor cores during this one's softmax.

Decisions, with what was measured on the H200 (hand-written causal attention, d128 bf16;
benchmarks/prototypes/gluon_attention_pp.py and benchmarks/ablations/attention_hopper_ab.py, each against SDPA in
the same run; benchmarks/results/2026-11-29-s5/):
- 128-key blocks over 64-key ones (B4 H32 S4096: 1.07-1.10 ms against 1.15-1.18, SDPA
  1.01-1.04): the acc rescale, the row max/sum shuffles and the barrier waits are paid once
  per 128 keys. One score tile is live (64 registers a thread): 168 registers, no spills;
- nothing is in flight across a loop's back edge: ptxas serialises every wgmma of a kernel
  whose loop carries an in-flight accumulator (warnings C7511-C7514);
- no ping-pong between the consumers (taking turns through mbarriers to issue MMAs was
  slower: 1.10-1.13 ms); 2 ring stages (3 measured the same, and do not fit beside two Q
  buffers);
- persistent, tiles head by head, dealt back and forth (`_hopper_attn_tile`). A program per
  tile waits for its first Q and K with nothing to overlap: 0.129-0.131 ms at B8 H16 S1024
  against 0.094 persistent. Persistent with the longest tiles of all heads first lost the
  L2 reuse of K and V (the 132 programs running at once read 132 heads' K/V): 1.195 ms at
  B4 H32 S4096, against 1.126 with a program per tile and 1.037 as here.

Addressing: Q, K and V are read by 2-D TMA descriptors over [rows, row stride] with the
element (b, h, s, d) at base + s * row_stride + d, base = C + b * SB + h * SH; the tile's
coordinates are (base // row_stride + s, base % row_stride). Codegen only uses the kernel
when every such tile lies inside one row (see attention_hopper.tma_view). The output is
stored through plain pointers with its strides.

Scope: causal (Sq == Sk) or not, q/k/v of one half dtype, Sq and Sk multiples of 128, head
dim 64 or 128 (the same for V), KV heads shared by G query heads (GQA), positive scale, no
mask tensor, no fused epilogue.

No `from __future__` import and no module-level name a generated module also defines: this
text is spliced into the middle of one.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

# Triton 3.6 names the TMA load async_copy_global_to_shared; later Gluon calls it async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _hopper_attn_tile(k, N_M: gl.constexpr, BH: gl.constexpr, H: gl.constexpr, G: gl.constexpr,
                      SK: gl.constexpr, CAUSAL: gl.constexpr, Q_C: gl.constexpr, Q_SB: gl.constexpr,
                      Q_SH: gl.constexpr, K_C: gl.constexpr, K_SB: gl.constexpr, K_SH: gl.constexpr,
                      V_C: gl.constexpr, V_SB: gl.constexpr, V_SH: gl.constexpr, O_C: gl.constexpr,
                      O_SB: gl.constexpr, O_SH: gl.constexpr, BN: gl.constexpr):
    """This program's k-th tile: whether it exists, its first query row, its number of key
    blocks and the element offsets of its (batch, head) in q, k, v and o.

    Tiles are numbered head by head, and within a head from the last query rows (the most
    keys, when causal) to the first, so the programs running at once share a few heads' K and
    V in L2. Round k gives tile k * P + pid to program pid, or k * P + P - 1 - pid in odd
    rounds: going back and forth evens out the work (every program gets long and short tiles)."""
    P = gl.num_programs(0)
    pid = gl.program_id(0)
    t = k * P + pid + (k % 2) * (P - 1 - 2 * pid)
    bh = (t // N_M).to(gl.int64)
    pid_m = N_M - 1 - t % N_M
    b = bh // H
    h = bh % H
    row0 = pid_m * BN
    if CAUSAL:
        n_blocks = pid_m + 1     # up to the tile's diagonal (both 64-row halves end in block pid_m)
    else:
        n_blocks = SK // BN
    return (t < N_M * BH, row0, n_blocks, Q_C + b * Q_SB + h * Q_SH, K_C + b * K_SB + (h // G) * K_SH,
            V_C + b * V_SB + (h // G) * V_SH, O_C + b * O_SB + h * O_SH)


@gluon.jit
def _hopper_attn_loader(q_desc, k_desc, v_desc, q_bufs, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty,
                        v_empty, N_M: gl.constexpr, BH: gl.constexpr, H: gl.constexpr, G: gl.constexpr,
                        SK: gl.constexpr, CAUSAL: gl.constexpr, Q_C: gl.constexpr, Q_SB: gl.constexpr,
                        Q_SH: gl.constexpr, Q_SS: gl.constexpr, K_C: gl.constexpr, K_SB: gl.constexpr,
                        K_SH: gl.constexpr, K_SS: gl.constexpr, V_C: gl.constexpr, V_SB: gl.constexpr,
                        V_SH: gl.constexpr, V_SS: gl.constexpr, O_C: gl.constexpr, O_SB: gl.constexpr,
                        O_SH: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Loader warp: for each of this program's tiles, its two Q tiles into Q buffer i % 2 once
    both consumers are done with that buffer's last tile, then K[j], V[j] into ring slot
    r % STAGES (r counts blocks over all tiles) once both consumers released its previous
    tenant. It runs ahead into the next tile while the consumers finish this one."""
    r = 0
    i = 0
    for k in range(0, gl.cdiv(N_M * BH, gl.num_programs(0))):
        valid, row0, n_blocks, q_base, k_base, v_base, o_base = _hopper_attn_tile(
            k, N_M, BH, H, G, SK, CAUSAL, Q_C, Q_SB, Q_SH, K_C, K_SB, K_SH, V_C, V_SB, V_SH, O_C, O_SB, O_SH, BN)
        if not valid:       # the last round may have no tile for this program
            n_blocks = 0
        qb = i % 2
        mbarrier.wait(q_empty.index(qb), ((i // 2) & 1) ^ 1, pred=valid)
        mbarrier.expect(q_ready.index(qb), 2 * q_desc.block_type.nbytes, pred=valid)
        q_row = (q_base // Q_SS + row0).to(gl.int32)
        q_col = (q_base % Q_SS).to(gl.int32)
        _tma_load(q_desc, [q_row, q_col], q_ready.index(qb), q_bufs.index(2 * qb), pred=valid)
        _tma_load(q_desc, [q_row + BM, q_col], q_ready.index(qb), q_bufs.index(2 * qb + 1), pred=valid)
        k_row = (k_base // K_SS).to(gl.int32)
        k_col = (k_base % K_SS).to(gl.int32)
        v_row = (v_base // V_SS).to(gl.int32)
        v_col = (v_base % V_SS).to(gl.int32)
        for j in range(0, n_blocks):
            slot = r % STAGES
            phase = ((r // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(slot), phase)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + j * BN, k_col], k_ready.index(slot), k_ring.index(slot))
            mbarrier.wait(v_empty.index(slot), phase)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [v_row + j * BN, v_col], v_ready.index(slot), v_ring.index(slot))
            r += 1
        i += 1


@gluon.jit
def _hopper_attn_softmax(s, m_i, l_i, qk_scale, rows, cols, MASKED: gl.constexpr):
    """Online-softmax step on one score tile: P (unnormalised, base 2), the new row max and
    sum, and alpha, which rescales what was accumulated under the old max. Unmasked, the
    row max of the raw scores is scaled once (max commutes with a positive scale)."""
    if MASKED:
        s = gl.where(rows[:, None] >= cols[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _hopper_attn_trip(j, r, p, acc, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring, v_ready, v_empty, qk_scale,
                      rows, cols0, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
                      BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr):
    """P[j] (in registers) @ V[j] in flight while S[j+1] becomes P[j+1]; key block j sits in
    ring slot r % STAGES."""
    nxt = r + 1
    mbarrier.wait(k_ready.index(nxt % STAGES), (nxt // STAGES) & 1)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(nxt % STAGES).permute((1, 0)),
                                 gl.full([BM, BN], 0.0, gl.float32, layout=s_layout), use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(r % STAGES), (r // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p, v_ring.index(r % STAGES), acc, is_async=True)
    s = hopper.warpgroup_mma_wait(1, deps=[s_tok])          # S[j+1] done; P[j] @ V[j] may not be
    mbarrier.arrive(k_empty.index(nxt % STAGES))
    p_new, m_i, l_i, alpha = _hopper_attn_softmax(s, m_i, l_i, qk_scale, rows, (j + 1) * BN + cols0, MASKED)
    acc, p = hopper.warpgroup_mma_wait(0, deps=[acc_tok, p])
    mbarrier.arrive(v_empty.index(r % STAGES))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p = gl.convert_layout(p_new.to(p.dtype), p_layout)
    return p, acc, m_i, l_i


@gluon.jit
def _hopper_attn_rows(q_smem, k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, o_ptr, o_base, row0, n_blocks, r0,
                      qk_scale, O_SS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                      STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Query rows row0 .. row0+63 (Q in q_smem) over key blocks 0 .. n_blocks-1, found in ring
    slots from r0 on (when causal, the last block holds the diagonal and is masked), stored
    at o_ptr + o_base + row * O_SS + d."""
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BM], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.full([BM, D], 0.0, gl.float32, layout=o_layout)

    mbarrier.wait(k_ready.index(r0 % STAGES), (r0 // STAGES) & 1)
    s_tok = hopper.warpgroup_mma(q_smem, k_ring.index(r0 % STAGES).permute((1, 0)),
                                 gl.full([BM, BN], 0.0, gl.float32, layout=s_layout), use_acc=False, is_async=True)
    s = hopper.warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(r0 % STAGES))
    if CAUSAL and n_blocks == 1:
        p32, m_i, l_i, alpha = _hopper_attn_softmax(s, m_i, l_i, qk_scale, rows, cols0, True)
    else:
        p32, m_i, l_i, alpha = _hopper_attn_softmax(s, m_i, l_i, qk_scale, rows, cols0, False)
    p = gl.convert_layout(p32.to(q_smem.dtype), p_layout)

    for j in range(0, n_blocks - 2):
        p, acc, m_i, l_i = _hopper_attn_trip(j, r0 + j, p, acc, m_i, l_i, q_smem, k_ring, k_ready, k_empty, v_ring,
                                             v_ready, v_empty, qk_scale, rows, cols0, s_layout, o_layout, p_layout,
                                             BM, BN, STAGES, False)
    if n_blocks >= 2:   # the last trip: the diagonal block when causal
        p, acc, m_i, l_i = _hopper_attn_trip(n_blocks - 2, r0 + n_blocks - 2, p, acc, m_i, l_i, q_smem, k_ring,
                                             k_ready, k_empty, v_ring, v_ready, v_empty, qk_scale, rows, cols0,
                                             s_layout, o_layout, p_layout, BM, BN, STAGES, CAUSAL)

    last = r0 + n_blocks - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc_tok = hopper.warpgroup_mma(p, v_ring.index(last % STAGES), acc, is_async=True)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc_tok])
    mbarrier.arrive(v_empty.index(last % STAGES))
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    orow = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    ocol = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + o_base + orow[:, None].to(gl.int64) * O_SS + ocol[None, :], o.to(q_smem.dtype))


@gluon.jit
def _hopper_attn_consumer(HALF: gl.constexpr, q_bufs, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty,
                          v_empty, o_ptr, qk_scale, N_M: gl.constexpr, BH: gl.constexpr, H: gl.constexpr,
                          G: gl.constexpr, SK: gl.constexpr, CAUSAL: gl.constexpr, Q_C: gl.constexpr,
                          Q_SB: gl.constexpr, Q_SH: gl.constexpr, K_C: gl.constexpr, K_SB: gl.constexpr,
                          K_SH: gl.constexpr, V_C: gl.constexpr, V_SB: gl.constexpr, V_SH: gl.constexpr,
                          O_C: gl.constexpr, O_SB: gl.constexpr, O_SH: gl.constexpr, O_SS: gl.constexpr,
                          BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup HALF (0 or 1): the 64-row half HALF of each of this program's tiles."""
    r = 0
    i = 0
    for k in range(0, gl.cdiv(N_M * BH, gl.num_programs(0))):
        valid, row0, n_blocks, q_base, k_base, v_base, o_base = _hopper_attn_tile(
            k, N_M, BH, H, G, SK, CAUSAL, Q_C, Q_SB, Q_SH, K_C, K_SB, K_SH, V_C, V_SB, V_SH, O_C, O_SB, O_SH, BN)
        if valid:
            qb = i % 2
            mbarrier.wait(q_ready.index(qb), (i // 2) & 1)
            _hopper_attn_rows(q_bufs.index(2 * qb + HALF), k_ring, v_ring, k_ready, v_ready, k_empty, v_empty, o_ptr,
                              o_base, row0 + HALF * BM, n_blocks, r, qk_scale, O_SS, BM, BN, D, STAGES, CAUSAL)
            mbarrier.arrive(q_empty.index(qb))
            r += n_blocks
            i += 1


def attn_fwd_hopper(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, BH: gl.constexpr, H: gl.constexpr, G: gl.constexpr,
                    SQ: gl.constexpr, SK: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                    Q_C: gl.constexpr, Q_SB: gl.constexpr, Q_SH: gl.constexpr, Q_SS: gl.constexpr,
                    Q_ROWS: gl.constexpr, K_C: gl.constexpr, K_SB: gl.constexpr, K_SH: gl.constexpr,
                    K_SS: gl.constexpr, K_ROWS: gl.constexpr, V_C: gl.constexpr, V_SB: gl.constexpr,
                    V_SH: gl.constexpr, V_SS: gl.constexpr, V_ROWS: gl.constexpr, O_C: gl.constexpr,
                    O_SB: gl.constexpr, O_SH: gl.constexpr, O_SS: gl.constexpr, STAGES: gl.constexpr):
    """Persistent: a 1-D grid of at most one program per SM, each taking tiles (128 query
    rows of one of the BH batch x heads) pid, pid + grid, ... Query head h of batch b reads
    KV head h // G; sizes and strides (in elements) are the tensors' as codegen found them."""
    BM: gl.constexpr = 64
    BN: gl.constexpr = 128
    N_M: gl.constexpr = SQ // BN
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc = tma.make_tensor_descriptor(q_ptr, shape=[Q_ROWS, Q_SS], strides=[Q_SS, 1], block_shape=[BM, D],
                                        layout=smem)
    k_desc = tma.make_tensor_descriptor(k_ptr, shape=[K_ROWS, K_SS], strides=[K_SS, 1], block_shape=[BN, D],
                                        layout=smem)
    v_desc = tma.make_tensor_descriptor(v_ptr, shape=[V_ROWS, V_SS], strides=[V_SS, 1], block_shape=[BN, D],
                                        layout=smem)

    q_bufs = gl.allocate_shared_memory(dtype, [4, BM, D], smem)    # two tiles' two halves
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BN, D], smem)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)            # both consumers release a Q buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)            # and a ring slot
        mbarrier.init(v_empty.index(i), count=2)

    gl.warp_specialize([
        (_hopper_attn_consumer, (0, q_bufs, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                                 o_ptr, qk_scale, N_M, BH, H, G, SK, CAUSAL, Q_C, Q_SB, Q_SH, K_C, K_SB, K_SH, V_C,
                                 V_SB, V_SH, O_C, O_SB, O_SH, O_SS, BM, BN, D, STAGES)),
        (_hopper_attn_consumer, (1, q_bufs, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                                 o_ptr, qk_scale, N_M, BH, H, G, SK, CAUSAL, Q_C, Q_SB, Q_SH, K_C, K_SB, K_SH, V_C,
                                 V_SB, V_SH, O_C, O_SB, O_SH, O_SS, BM, BN, D, STAGES)),
        (_hopper_attn_loader, (q_desc, k_desc, v_desc, q_bufs, k_ring, v_ring, q_ready, q_empty, k_ready, v_ready,
                               k_empty, v_empty, N_M, BH, H, G, SK, CAUSAL, Q_C, Q_SB, Q_SH, Q_SS, K_C, K_SB, K_SH,
                               K_SS, V_C, V_SB, V_SH, V_SS, O_C, O_SB, O_SH, BM, BN, STAGES)),
    ], [4, 1], [240, 24])

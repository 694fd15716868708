"""Ablation sweeps of the matmul kernels: attention configs and kernel variants, nn.Linear
configs, hand-written TMA GEMMs. Run through run.py.
"""

from __future__ import annotations

import math

import torch
import triton

from benchmarks.ablations.harness import ATTN_CONFIGS, ATTN_VARIANTS, Results, attempt, attempt_module, sm_count, with_one_config
from benchmarks.ablations.handwritten import gemm_tma_kernel


def attention_anchor(res: Results, group: str):
    """The attention anchor (causal, B4 H32 S4096 d128, bf16): SDPA timed into `group` as the
    reference row; returns (q, k, v), SDPA's answer, minicomp's compiled function (compiled for
    these inputs) and the flops."""
    import minicomp
    from benchmarks import workloads as W
    B, H, S, D = 4, 32, 4096, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = sdpa(q, k, v, is_causal=True)
    attempt(res, group, "F.scaled_dot_product_attention", None, lambda: sdpa(q, k, v, is_causal=True), ref)
    compiled = minicomp.compile(W.make_causal_attention(S, D, "cuda"))
    compiled.compile_for(q, k, v)
    return (q, k, v), ref, compiled, 4 * B * H * S * S * D / 2


def sweep_attention(res: Results):
    """minicomp's own attention kernel under a wide config space, one config at a time."""
    (q, k, v), ref, compiled, flops = attention_anchor(res, "attention")
    source = compiled.source
    configs = ([(128, bn, st, 8) for bn in (64, 128) for st in (2, 3, 4)] + [(128, 64, st, 4) for st in (2, 3, 4)]
               + [(64, bn, st, 4) for bn in (64, 128) for st in (2, 3)])
    constants = [c.to("cuda") for c in compiled._need().generated.constants]
    for bm, bn, st, wp in configs:
        one = f'triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}}}, num_stages={st}, num_warps={wp}),'
        attempt_module(res, "attention", f"BLOCK_M={bm} BLOCK_N={bn} stages={st} warps={wp}",
                       lambda: with_one_config(source, one, f"attn_{bm}_{bn}_{st}_{wp}", constants), (q, k, v),
                       ref, flops)


def sweep_linear(res: Results):
    """minicomp's GEMM on nn.Linear-layout weights ([N, K], read transposed) at gpt_block sizes,
    under a wider config space than its autotuner's, against cuBLAS."""
    import minicomp
    F = torch.nn.functional
    configs = ([(bm, bn, 64, st, 8) for bm, bn in ((128, 256), (256, 128)) for st in (3, 4)]
               + [(128, 128, bk, st, wp) for bk in (64, 128) for st in (3, 4) for wp in (4, 8)]
               + [(128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 128, 64, 5, 8)])
    for M, K, N in ((8192, 2048, 6144), (8192, 8192, 2048)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / math.sqrt(K)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, w, b)
        flops = 2 * M * N * K
        tag = f"{M}x{K}->{N}"
        attempt(res, "linear", f"{tag} cuBLAS F.linear", None, lambda: F.linear(x, w, b), ref, flops)
        c = minicomp.compile(lambda x, w, b: F.linear(x, w, b))
        c.compile_for(x, w, b)
        attempt(res, "linear", f"{tag} minicomp as shipped", None, lambda: c(x, w, b), ref, flops)
        source = c.source
        constants = [t.to("cuda") for t in c._need().generated.constants]
        for bm, bn, bk, st, wp in configs:
            one = (f'triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}, "BLOCK_K": {bk}, "GROUP_M": 8}}, '
                   f'num_stages={st}, num_warps={wp}),')
            attempt_module(res, "linear", f"{tag} BM={bm} BN={bn} BK={bk} stages={st} warps={wp}",
                           lambda: with_one_config(source, one, f"lin_{bm}_{bn}_{bk}_{st}_{wp}", constants),
                           (x, w, b), ref, flops)


def _attention_variants(source: str) -> dict[str, str]:
    """Text edits of minicomp's generated attention kernel (B4 H32 S4096 d128) for the ablation."""
    out = {"shipped": source}
    ws = source.replace("for start_n in range(0, hi_full, BLOCK_N):",
                        "for start_n in tl.range(0, hi_full, BLOCK_N, warp_specialize=True):")
    out["warp_specialize"] = ws
    base = "z0 * 16777216 + z1 * 524288"
    tma = source.replace(
        f"    v_cols = v_ptr + vd + {base}\n",
        f"    v_cols = v_ptr + vd + {base}\n"
        f"    k_desc = tl.make_tensor_descriptor(k_ptr + {base}, shape=[SK, 128], strides=[128, 1], "
        "block_shape=[BLOCK_N, 128])\n"
        f"    v_desc = tl.make_tensor_descriptor(v_ptr + {base}, shape=[SK, 128], strides=[128, 1], "
        "block_shape=[BLOCK_N, 128])\n")
    for old, new in (("k = tl.load(k_rows + kn * 128, mask=(kn < SK), other=0.0)", "k = k_desc.load([start_n, 0]).T"),
                     ("v = tl.load(v_cols + vn * 128, mask=(vn < SK), other=0.0)", "v = v_desc.load([start_n, 0])"),
                     ("k = tl.load(k_rows + kn * 128)", "k = k_desc.load([start_n, 0]).T"),
                     ("v = tl.load(v_cols + vn * 128)", "v = v_desc.load([start_n, 0])")):
        assert old in tma, old
        tma = tma.replace(old, new)
    out["tma_kv"] = tma
    out["tma_kv+warp_specialize"] = tma.replace("for start_n in range(0, hi_full, BLOCK_N):",
                                                "for start_n in tl.range(0, hi_full, BLOCK_N, warp_specialize=True):")
    # lazy rescaling: off the diagonal, keep the running max unless some row's grew by more than
    # 2^8 (then rescale the whole block, as always); p stays <= 256, fine in bf16 and fp32 sums
    old = ("        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)\n"
           "        p = tl.exp2(qk * qk_scale - m_new[:, None])\n"
           "        alpha = tl.exp2(m_i - m_new)\n"
           "        l_i = l_i * alpha + tl.sum(p, 1)\n"
           "        acc = acc * alpha[:, None]\n"
           "        v = tl.load(v_cols + vn * 128)\n"
           "        acc = tl.dot(p.to(tl.bfloat16), v, acc)\n"
           "        m_i = m_new\n")
    new = ("        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)\n"
           "        if tl.max(m_new - m_i, 0) > 8.0:\n"
           "            alpha = tl.exp2(m_i - m_new)\n"
           "            l_i = l_i * alpha\n"
           "            acc = acc * alpha[:, None]\n"
           "            m_i = m_new\n"
           "        p = tl.exp2(qk * qk_scale - m_i[:, None])\n"
           "        l_i = l_i + tl.sum(p, 1)\n"
           "        v = tl.load(v_cols + vn * 128)\n"
           "        acc = tl.dot(p.to(tl.bfloat16), v, acc)\n")
    assert old in source, "attention kernel text changed: update the lazy_rescale edit"
    out["lazy_rescale"] = source.replace(old, new)
    out["lazy_rescale+warp_specialize"] = out["lazy_rescale"].replace(
        "for start_n in range(0, hi_full, BLOCK_N):",
        "for start_n in tl.range(0, hi_full, BLOCK_N, warp_specialize=True):")
    return out


def sweep_attention_variants(res: Results):
    """Kernel-shape variants of minicomp's attention (TMA loads of K and V, warp specialisation),
    each under a few configs."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    (q, k, v), ref, compiled, flops = attention_anchor(res, "attn_var")
    for variant, source in _attention_variants(compiled.source).items():
        if ATTN_VARIANTS[0] and variant not in ATTN_VARIANTS[0]:
            continue
        configs = ATTN_CONFIGS[0] or ((64, 64, 3, 4), (128, 64, 3, 8), (128, 128, 2, 8), (128, 64, 4, 4), (128, 128, 3, 8))
        for bm, bn, st, wp in configs:
            one = f'triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}}}, num_stages={st}, num_warps={wp}),'
            attempt_module(res, "attn_var", f"{variant} BLOCK_M={bm} BLOCK_N={bn} stages={st} warps={wp}",
                           lambda: with_one_config(source, one, f"attv_{variant}_{bm}_{bn}_{st}_{wp}"), (q, k, v),
                           ref, flops)


def sweep_gemm_tma(res: Results):
    """Hand-written TMA GEMMs (one tile a program, or persistent) against cuBLAS and minicomp,
    for nn.Linear-layout weights and row-major ones."""
    import minicomp
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    F = torch.nn.functional
    for M, K, N in ((8192, 2048, 6144), (4096, 4096, 4096)):
        for w_kn in (0, 1):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(K)
            if not w_kn:
                w = w.t().contiguous()
            b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            fn = (lambda x, w, b: x @ w + b) if w_kn else (lambda x, w, b: F.linear(x, w, b))
            ref = fn(x, w, b)
            flops = 2 * M * N * K
            tag = f"{M}x{K}->{N} W {'[K,N]' if w_kn else '[N,K]'}"
            attempt(res, "gemm_tma", f"{tag} cuBLAS", None, lambda: fn(x, w, b), ref, flops)
            c = minicomp.compile(fn)
            attempt(res, "gemm_tma", f"{tag} minicomp as shipped", None, lambda: c(x, w, b), ref, flops)
            y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            for bm, bn, bk, st, wp in ((128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (128, 128, 64, 4, 4),
                                       (128, 128, 64, 4, 8), (128, 128, 64, 5, 8), (256, 128, 64, 3, 8)):
                for persist in (0, 1):
                    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
                    grid = (min(tiles, sm_count()),) if persist else (tiles,)

                    def run():
                        gemm_tma_kernel[grid](x, w, b, y, M, N, K, BM=bm, BN=bn, BK=bk, GROUP_M=8, PERSIST=persist,
                                              W_KN=w_kn, num_stages=st, num_warps=wp)
                        return y
                    attempt(res, "gemm_tma", f"{tag} TMA persist={persist} BM={bm} BN={bn} BK={bk} stages={st} "
                            f"warps={wp}", None, run, ref, flops)

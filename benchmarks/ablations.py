"""Ablations for the memory-bound and attention kernels: what each code-shape choice costs.

`benchmarks/run.py` says how fast minicomp is; this script says *why*, by timing hand-written
variants of the kernels minicomp generates, one knob at a time, on the anchor shapes of
`shared/ceilings.md`. Its findings are what the emitters' choices rest on (see the comments in
`minicomp/codegen/reduction.py`, `pointwise.py` and `attention.py`, and BENCHMARKS.md).

Knobs:
- row reductions (softmax, layernorm over 16384x4096 bf16): masked vs mask-free columns,
  divide vs multiply by a per-row reciprocal, one program per row block vs a persistent grid
  (weights loaded once per program), BLOCK_R and num_warps;
- pointwise (`gelu_tanh(x*w+b)` over 8192x8192): block size and warps, the tanh form vs the
  sigmoid form of gelu with an IEEE or an approximate division, 1-D vs 2-D tiles;
- attention (B4 H32 S4096 d128, causal): the autotuning space of minicomp's own kernel;
- a plain Triton copy of each shape: what any kernel of that shape can reach.

Every variant is checked against eager PyTorch before it is timed. CUDA only:
    python3 benchmarks/ablations.py --out DIR [--only softmax,layernorm,pointwise,attention]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ablation_kernels import (copy_kernel, gemm_tma_kernel, layernorm_kernel,  # noqa: E402
                                         pointwise_1d, pointwise_2d, softmax_kernel)


# ----------------------------------------------------------------------------------------
# Harness.

SMS = None


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def check(got, ref, name):
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")


class Results:
    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def add(self, group: str, variant: str, ms: float | None, nbytes: int | None = None,
            error: str | None = None, **extra):
        gbps = nbytes / (ms * 1e6) if ms and nbytes else None
        row = {"group": group, "variant": variant, "ms": ms, "gbps": gbps, "error": error, **extra}
        self.rows.append(row)
        shown = f"{ms:.4f} ms" if ms else "-"
        rate = f" {gbps:7.0f} GB/s" if gbps else ""
        print(f"{group:10s} {variant:58s} {shown}{rate}{'  ERROR ' + error if error else ''}", flush=True)
        (self.out / "ablations.json").write_text(json.dumps(self.rows, indent=1))


DEADLINE = [float("inf")]
ATTN_VARIANTS: list[set[str] | None] = [None]   # --attn-variants


def attempt(res: Results, group: str, variant: str, nbytes, run, ref=None, flops=None):
    """Check `run()` against `ref`, then time it; `flops` (if given) adds the achieved TFLOP/s."""
    if time.perf_counter() > DEADLINE[0]:
        return
    try:
        got = run()
        torch.cuda.synchronize()
        if ref is not None:
            check(got, ref, variant)
        ms = bench(run)
        res.add(group, variant, ms, nbytes, **({"tflops": flops / (ms * 1e9)} if flops else {}))
    except Exception as e:       # record and go on: one bad variant must not stop the sweep
        res.add(group, variant, None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        traceback.print_exc(limit=2)


def with_one_config(source: str, config: str, key: str, constants=()):
    """A generated module whose autotuning list is just `config` (a `triton.Config(...)` text), imported."""
    import re
    from minicomp.runtime.loader import import_source
    src = re.sub(r"(_configs = \[\n)(.*?)(\n\])", lambda m: m.group(1) + "    " + config + m.group(3), source,
                 count=1, flags=re.S)
    mod = import_source(src, key, interpret=False)
    mod.CONSTANTS[:] = list(constants)
    return mod


def attempt_module(res: Results, group: str, variant: str, make, args, ref, flops):
    """`attempt` on `make()`'s module called with `args`, recording a module that fails to build."""
    try:
        mod = make()
    except Exception as e:
        res.add(group, variant, None, error=f"{type(e).__name__}: {str(e)[:200]}")
        return
    attempt(res, group, variant, None, lambda: mod.call(*args)[0], ref, flops)


def pointwise_anchor():
    """The pointwise anchor's tensors: x 8192x8192, w and b 8192 (bf16), eager's answer, an output
    buffer and the ledger's bytes."""
    R = C = 8192
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(x * w + b, approximate="tanh")
    return x, w, b, ref, torch.empty_like(x), 2 * x.nbytes + w.nbytes + b.nbytes


def hand_pointwise(x, w, b, y, br: int, bc: int, warps: int):
    """The hand-written 2-D pointwise anchor kernel (tile br x bc, `warps` warps) as a call."""
    R, C = x.shape

    def run():
        pointwise_2d[(triton.cdiv(C, bc), triton.cdiv(R, br))](x, w, b, y, R, C=C, BR=br, BC=bc, FORM=0,
                                                                num_warps=warps)
        return y
    return run


def grid_for(n_blocks: int, persistent: int) -> tuple:
    return (min(n_blocks, SMS * persistent),) if persistent else (n_blocks,)


# ----------------------------------------------------------------------------------------
# Sweeps.

def sweep_copy(res: Results):
    for shape in [(16384, 4096), (8192, 8192), (1 << 30,)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        nbytes = 2 * x.nbytes
        attempt(res, "copy", f"torch copy_ {list(shape)}", nbytes, lambda: y.copy_(x))
        for block, warps in [(1024, 4), (2048, 8), (4096, 8), (8192, 16)]:
            n = x.numel()
            attempt(res, "copy", f"triton copy {list(shape)} BLOCK={block} warps={warps}", nbytes,
                    lambda: copy_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=warps) and y)
        del x, y


def sweep_softmax(res: Results):
    R, C = 16384, 4096
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    ref = torch.softmax(x.float(), -1).to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.nbytes
    for masked in (1, 0):
        for recip in (0, 1):
            for br in (1, 2, 4):
                for warps in (4, 8, 16, 32):
                    for persistent in (0, 8):
                        if br * C > 16384 or (persistent and (masked or warps == 32)) or (masked and warps == 32):
                            continue
                        nb = triton.cdiv(R, br)

                        def run():
                            softmax_kernel[grid_for(nb, persistent)](x, y, R, C, BLOCK_R=br, BLOCK_C=C, MASKED=masked,
                                                                     RECIP=recip, num_warps=warps)
                            return y
                        attempt(res, "softmax", f"masked={masked} recip={recip} BR={br} warps={warps} "
                                f"persistent={persistent}", nbytes, run, ref)


def sweep_layernorm(res: Results):
    R, C = 16384, 4096
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.layer_norm(x.float(), (C,), w.float(), b.float(), 1e-5).to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.nbytes + w.nbytes + b.nbytes
    for masked in (1, 0):
        for br in (1, 2, 4):
            for warps in (4, 8, 16):
                for persistent, hoist in ((0, 0), (4, 1), (8, 1)):
                    if br * C > 16384 or (masked and persistent):
                        continue
                    nb = triton.cdiv(R, br)

                    def run():
                        layernorm_kernel[grid_for(nb, persistent)](x, w, b, y, R, C, BLOCK_R=br, BLOCK_C=C,
                                                                   MASKED=masked, HOIST_W=hoist, num_warps=warps)
                        return y
                    attempt(res, "layernorm", f"masked={masked} BR={br} warps={warps} persistent={persistent} "
                            f"hoist_w={hoist}", nbytes, run, ref)


def sweep_pointwise(res: Results):
    x, w, b, ref, y, nbytes = pointwise_anchor()
    (R, C), n = x.shape, x.numel()
    for form in (0, 1, 2):
        for block, warps in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]:
            def run():
                pointwise_1d[(triton.cdiv(n, block),)](x, w, b, y, n, C=C, BLOCK=block, FORM=form, num_warps=warps)
                return y
            attempt(res, "pointwise", f"1d form={form} BLOCK={block} warps={warps}", nbytes, run, ref)
        for br, bc, warps in [(8, 512, 4), (16, 256, 4), (4, 1024, 4), (8, 1024, 8), (16, 512, 8), (32, 256, 8)]:
            def run():
                pointwise_2d[(triton.cdiv(C, bc), triton.cdiv(R, br))](x, w, b, y, R, C=C, BR=br, BC=bc, FORM=form,
                                                                        num_warps=warps)
                return y
            attempt(res, "pointwise", f"2d form={form} BR={br} BC={bc} warps={warps}", nbytes, run, ref)


def sweep_attention(res: Results):
    """minicomp's own attention kernel under a wide config space, one config at a time."""
    import minicomp
    from benchmarks import workloads as W
    B, H, S, D = 4, 32, 4096, 128
    fn = W.make_causal_attention(S, D, "cuda")
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    attempt(res, "attention", "F.scaled_dot_product_attention", None, lambda: torch.nn.functional
            .scaled_dot_product_attention(q, k, v, is_causal=True), ref)
    compiled = minicomp.compile(fn)
    compiled.compile_for(q, k, v)
    source = compiled.source
    flops = 4 * B * H * S * S * D / 2
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
        "for start_n in range(0, hi_full, BLOCK_N):", "for start_n in tl.range(0, hi_full, BLOCK_N, warp_specialize=True):")
    return out


def sweep_attention_variants(res: Results):
    """Kernel-shape variants of minicomp's attention (TMA loads of K and V, warp specialisation),
    each under a few configs."""
    import minicomp
    from benchmarks import workloads as W
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    B, H, S, D = 4, 32, 4096, 128
    fn = W.make_causal_attention(S, D, "cuda")
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    attempt(res, "attn_var", "F.scaled_dot_product_attention", None, lambda: torch.nn.functional
            .scaled_dot_product_attention(q, k, v, is_causal=True), ref)
    compiled = minicomp.compile(fn)
    compiled.compile_for(q, k, v)
    flops = 4 * B * H * S * S * D / 2
    for variant, source in _attention_variants(compiled.source).items():
        if ATTN_VARIANTS[0] and variant not in ATTN_VARIANTS[0]:
            continue
        for bm, bn, st, wp in ((64, 64, 3, 4), (128, 64, 3, 8), (128, 128, 2, 8), (128, 64, 4, 4), (128, 128, 3, 8)):
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
                    grid = (min(tiles, SMS),) if persist else (tiles,)

                    def run():
                        gemm_tma_kernel[grid](x, w, b, y, M, N, K, BM=bm, BN=bn, BK=bk, GROUP_M=8, PERSIST=persist,
                                              W_KN=w_kn, num_stages=st, num_warps=wp)
                        return y
                    attempt(res, "gemm_tma", f"{tag} TMA persist={persist} BM={bm} BN={bn} BK={bk} stages={st} "
                            f"warps={wp}", None, run, ref, flops)


def _pointwise_variants(source: str) -> dict[str, str]:
    """Text edits of minicomp's generated broadcast-tile pointwise kernel (8192x8192)."""
    out = {"shipped": source}
    const = (source.replace("col_blocks = tl.cdiv(n_cols, BLOCK_C)", "col_blocks = tl.cdiv(8192, BLOCK_C)")
             .replace("cols < n_cols", "cols < 8192").replace("rows < n_rows", "rows < 8192"))
    out["const_bounds"] = const
    two = {}
    for label, src in (("two_axes", source), ("two_axes+const_bounds", const)):
        t = src.replace("rows = (pid // col_blocks) * BLOCK_R", "rows = tl.program_id(1) * BLOCK_R")
        t = t.replace("cols = (pid % col_blocks) * BLOCK_C", "cols = tl.program_id(0) * BLOCK_C")
        t = t.replace("grid = lambda meta: (triton.cdiv(8192, meta['BLOCK_R']) * triton.cdiv(8192, meta['BLOCK_C']),)",
                      "grid = lambda meta: (triton.cdiv(8192, meta['BLOCK_C']), triton.cdiv(8192, meta['BLOCK_R']))")
        assert t != src
        two[label] = t
    out.update(two)
    out["triton_launch_path"] = source.replace("_launch(mc_pw_mul_add_gelu_0, grid, ", "mc_pw_mul_add_gelu_0[grid](")
    return out


def sweep_pointwise_variants(res: Results):
    import minicomp
    from benchmarks import workloads as W
    from minicomp.runtime.loader import import_source
    x, w, b, ref, y, nbytes = pointwise_anchor()
    attempt(res, "pw_var", "torch copy_ of x", 2 * x.nbytes, lambda: y.copy_(x))
    for br, bc, warps in ((16, 256, 4), (8, 512, 4)):
        attempt(res, "pw_var", f"ablation kernel BR={br} BC={bc} warps={warps}", nbytes,
                hand_pointwise(x, w, b, y, br, bc, warps), ref)
    c = minicomp.compile(W.gelu_tanh_affine)
    c.compile_for(x, w, b)
    for variant, src in _pointwise_variants(c.source).items():
        try:
            mod = import_source(src, f"pw_{variant}", interpret=False)
            attempt(res, "pw_var", variant, nbytes, lambda: mod.call(x, w, b)[0], ref)
            for name in dir(mod):
                k = getattr(mod, name)
                if (name.startswith("mc_pw") and getattr(k, "best_config", None) is not None
                        and res.rows[-1]["variant"] == variant):
                    res.rows[-1]["config"] = str(k.best_config)
        except Exception as e:
            res.add("pw_var", variant, None, error=f"{type(e).__name__}: {str(e)[:200]}")


def sweep_overhead(res: Results):
    """Launch cost of the compiled call vs the bare kernel, on the softmax anchor."""
    import minicomp
    from benchmarks import workloads as W
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    for name, t in (("16384x4096", x), ("64x256", small)):
        c = minicomp.compile(W.softmax_by_hand)
        ref = W.softmax_by_hand(t)
        attempt(res, "overhead", f"minicomp call softmax {name}", 2 * t.nbytes, lambda: c(t), ref)
        attempt(res, "overhead", f"eager softmax {name}", 2 * t.nbytes, lambda: W.softmax_by_hand(t), ref)
        for label, f in (("minicomp", lambda: c(t)), ("eager", lambda: W.softmax_by_hand(t))):
            res.add("overhead", f"host time per call {label} softmax {name}", host_ms_per_call(f))


def host_ms_per_call(fn, calls: int = 200) -> float:
    """Host-side milliseconds per call of `fn`: `calls` calls with no GPU wait between them."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return host


def bench_host_hidden(fn, reps: int = 100) -> float:
    """Median time of `fn()` as do_bench takes it (L2 flushed by zeroing 256 MB before each run),
    but with a ~0.5 ms GPU sleep enqueued before the flush, so the host has enqueued all of
    `fn`'s work before the GPU reaches it: the GPU time of `fn` alone, host time hidden."""
    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        torch.cuda._sleep(1_000_000)
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def sweep_host_hidden(res: Results):
    """Is a gap between a generated kernel and a hand-written one host time? Each callable timed
    as the suite does (do_bench) and with the host's time hidden (`bench_host_hidden`)."""
    import minicomp
    from benchmarks import workloads as W
    x, w, b, ref, y, nbytes = pointwise_anchor()
    s = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    soft = minicomp.compile(lambda t: torch.softmax(t, -1))
    pw = minicomp.compile(W.gelu_tanh_affine)
    check(pw(x, w, b), ref, "pointwise")
    check(soft(s), torch.softmax(s, -1), "softmax")

    hand = hand_pointwise(x, w, b, y, 8, 512, 4)
    check(hand(), ref, "hand pointwise")
    cases = [("torch copy_ 8192x8192", lambda: y.copy_(x), 2 * x.nbytes),
             ("hand pointwise kernel 8x512 w4", hand, nbytes),
             ("minicomp pointwise call", lambda: pw(x, w, b), nbytes),
             ("torch copy_ 16384x4096", lambda: torch.empty_like(s).copy_(s), 2 * s.nbytes),
             ("minicomp softmax call", lambda: soft(s), 2 * s.nbytes)]
    for label, fn, nb in cases:
        res.add("hidden", f"{label} do_bench", bench(fn), nb)
        res.add("hidden", f"{label} host hidden", bench_host_hidden(fn), nb)
    for label, fn, _ in cases:
        res.add("hidden", f"{label} host ms per call (200 calls, no sync)", host_ms_per_call(fn))


def sweep_pointwise_kernel(res: Results):
    """Where the generated pointwise kernel's gap to the hand-written one is: the generated
    kernel launched directly into a preallocated output (as the hand one is), into a fresh
    output per call, with its loads reordered, and the module's call, one config each."""
    import re

    import minicomp
    from benchmarks import workloads as W
    from minicomp.runtime.loader import import_source
    x, w, b, ref, y, nbytes = pointwise_anchor()
    R, C = x.shape
    c = minicomp.compile(W.gelu_tanh_affine)
    c.compile_for(x, w, b)
    src = c.source
    name = re.search(r"def (mc_pw_\w+)\(", src).group(1)
    reordered = re.sub(r"(    x = tl.load\(.*\n)((?:.*\n)*?)(    b = tl.load\(.*\n)",
                       lambda m: m.group(2).replace("    mul3 = x * w\n", "") + m.group(3) + m.group(1)
                       + "    mul3 = x * w\n", src, count=1)
    variants = {"generated": src, "loads w, b before x": reordered}
    for br, bc, warps in ((8, 512, 4), (16, 256, 4)):
        attempt(res, "pw_kernel", f"hand kernel {br}x{bc} w{warps}", nbytes, hand_pointwise(x, w, b, y, br, bc, warps),
                ref)
        for label, text in variants.items():
            mod = import_source(text, f"pwk_{label}".replace(" ", "_").replace(",", ""), interpret=False)
            fn = getattr(mod, name).fn
            grid = (triton.cdiv(R, br) * triton.cdiv(C, bc),)

            def direct(out=y):
                fn[grid](x, w, b, out, R, C, BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
                return out
            attempt(res, "pw_kernel", f"{label} {br}x{bc} w{warps}: direct, preallocated output", nbytes, direct, ref)
            attempt(res, "pw_kernel", f"{label} {br}x{bc} w{warps}: direct, fresh output", nbytes,
                    lambda: direct(torch.empty_like(x)), ref)
    for label, text in variants.items():
        mod = import_source(text, f"pwk_{label}".replace(" ", "_").replace(",", ""), interpret=False)
        attempt(res, "pw_kernel", f"{label}: module call, autotuned", nbytes, lambda: mod.call(x, w, b)[0], ref)
        res.rows[-1]["config"] = str(getattr(getattr(mod, name), "best_config", None))


def _hoist_column_loads(source: str) -> str:
    """The generated row-reduction kernels with their loads of column-only operands (norm
    weights) moved up to just before each kernel's first load of a whole tile."""
    import re
    chunks = re.split(r"(?m)^(?=def )", source)          # one chunk per top-level function
    out = []
    for chunk in chunks:
        lines = chunk.split("\n")
        full = [i for i, line in enumerate(lines) if "tl.load(" in line and "mask=mask" in line]
        hoist = [i for i, line in enumerate(lines)
                 if re.match(r"\s+\w+ = tl\.load\(\w+ \+ cols, mask=col_mask", line) and full and i > full[0]]
        if hoist:
            moved = [lines[i] for i in hoist]
            lines = [line for i, line in enumerate(lines) if i not in hoist]
            lines = lines[:full[0]] + moved + lines[full[0]:]
        out.append("\n".join(lines))
    return "".join(out)


def sweep_norm_variants(res: Results):
    """Row reductions with the norm weights loaded before the row (as the pointwise tiles do)."""
    import minicomp
    from benchmarks.workloads import WORKLOADS
    from minicomp.runtime.loader import import_source
    for wname in ("layernorm", "add_rmsnorm"):
        built = WORKLOADS[wname].build("cuda", torch.bfloat16, False)
        ref = built.fn(*built.inputs)
        ref0 = ref[0] if isinstance(ref, (list, tuple)) else ref
        nbytes = sum(t.nbytes for t in built.inputs) + sum(
            t.nbytes for t in (ref if isinstance(ref, (list, tuple)) else [ref]))
        c = minicomp.compile(built.fn)
        compiled = c.compile_for(*built.inputs)
        for label, src in (("shipped", compiled.generated.source),
                           ("weights loaded first", _hoist_column_loads(compiled.generated.source))):
            mod = import_source(src, f"norm_{wname}_{label}".replace(" ", "_"), interpret=False)
            mod.CONSTANTS[:] = list(compiled.call.module.CONSTANTS)
            attempt(res, "norm_var", f"{wname} {label}", nbytes, lambda: mod.call(*built.inputs)[0], ref0)


SWEEPS = {"copy": sweep_copy, "softmax": sweep_softmax, "layernorm": sweep_layernorm,
          "pointwise": sweep_pointwise, "attention": sweep_attention,
          "linear": sweep_linear, "attn_var": sweep_attention_variants, "gemm_tma": sweep_gemm_tma,
          "pw_var": sweep_pointwise_variants,
          "overhead": sweep_overhead, "hidden": sweep_host_hidden,
          "pw_kernel": sweep_pointwise_kernel, "norm_var": sweep_norm_variants}


def main() -> int:
    global SMS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--only", default="softmax,layernorm,pointwise,attention,linear,overhead,copy")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no variant after this many seconds")
    p.add_argument("--attn-variants", help="comma-separated attention variants for attn_var (default: all)")
    args = p.parse_args()
    ATTN_VARIANTS[0] = set(args.attn_variants.split(",")) if args.attn_variants else None
    DEADLINE[0] = time.perf_counter() + args.budget_s
    if not torch.cuda.is_available():
        print("ablations need a CUDA device")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    res = Results(args.out)
    res.add("env", f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__} "
            f"SMs {SMS}", None)
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            SWEEPS[name](res)
        except Exception:
            traceback.print_exc()
        print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Attention groups: a FlashAttention-2 style forward kernel.

One program per (query block, batch x head): it keeps its [BLOCK_M, D] query tile in
registers and streams K and V in BLOCK_N blocks, with an online softmax (running max
`m_i` and sum `l_i` in fp32, base-2 exponentials on scores pre-scaled by scale*log2(e)),
so the [Sq, Sk] score matrix never reaches memory.

The node's meaning, attribute by attribute, is attention_ref.py's; the body (scores,
masks, block ranges, the online softmax) is attention_body.py, whose docstring says why
masked kernels keep their scores in natural units.

Invariants and decisions:
- blocks that need no per-element mask (every key exists and, when causal, precedes every
  query of the block; with a sliding window, lies inside every query's band) run without
  one; the rest (the diagonal, the window's left edge, the ragged last block) mask per
  element. Causal blocks entirely above the diagonal (or left of the window) are never
  visited; causal programs start with the longest rows (reversed query-block order);
- causal masking is PyTorch's `is_causal`: top-left aligned, key j visible to query i iff j <= i;
- a boolean mask keeps True (masked scores become `mask_fill`, -inf by default), a float
  mask of any float dtype is added to the scores; either is loaded through its strides
  with broadcasting over batch, heads and queries (and may itself be computed by nodes of
  the group); rows with no visible key give 0 (SDPA) or NaN (`empty_rows="nan"`);
- soft-capping (`cap * tanh(scores / cap)`) is applied before the mask, on every block;
- grouped KV heads: query head h reads KV head h // (Hq // Hkv); a single KV head
  (multi-query attention) is read by every query head, with or without enable_gqa;
- q/k/v are read where they lie (permuted views fold into strides; casts applied after
  the load); head dims are padded to a power of two with masks;
- fp32 uses full-precision dots unless PyTorch allows TF32; under the CPU interpreter
  half operands are widened to fp32 (its bf16 dot is wrong);
- the attention result (`o`, fp32) is a leaf of codegen's pointwise lowering, so a fused
  epilogue (cast, scale, residual) is applied before the single store.

Where the time goes on Hopper (Triton 3.6; benchmarks/results/2026-11-29-s4/README.md): each
`tl.dot` of the key loop is waited for at once (`wgmma.wait_group 0`: the accumulator is
rescaled between the two dots, so Triton cannot leave the P @ V dot in flight), so a
block's tensor cores idle while its softmax runs and only a second resident block fills that
time. That is why 64x64 tiles with 4 warps (167 registers and 112 KiB of shared memory: two
blocks per SM) are as fast as 128x128 with 8 warps (one block). Issuing the next block's
Q @ K^T before this block's softmax does not help: Triton waits for it at once too. cuDNN's
kernel (SDPA's default here) overlaps the two with warp-specialised warpgroups, which
`tl.range(warp_specialize=True)` does not produce for this loop on Hopper. So on an sm_90
GPU, groups that fit (no mask tensor, window or softcap, half dtypes, lengths a multiple of 128, no fused
epilogue: attention_hopper.why_not) run a Gluon kernel that does (attention_hopper.py); this
kernel takes the rest, and its source says why the Gluon kernel did not take the group. On
CUDA, a group of the rest with nothing to fuse (half dtypes, no mask or epilogue, more than 16
queries) calls PyTorch's SDPA instead, which is faster than this kernel (library_attention.py).

Over symbolic sizes (codegen/sizes.py) the query and key lengths are runtime arguments (SQ,
SK; the causal block bounds and the ragged-block tests are computed from them at run time)
and the autotune key holds their powers of two (`sq_bucket`, `sk_bucket`) instead; head dims
must be concrete (they size the tiles). A symbolic batch x heads shares the first grid axis
with the query blocks (the second axis holds at most 65535). The Gluon kernel keeps to static
graphs: its form is fixed per length (attention_hopper.why_not).

Index symbols: `qm`/`qd` (query tile), `kd`/`kn` (K tile, transposed), `vn`/`vd` (V tile),
`rm`/`rn` (score tile), `rm`/`od` (output tile), `z0`, `z1`... (batch and head).

Unsupported: dtypes other than fp32/fp16/bf16, masks other than bool or floating,
prologue ops other than views and casts, more than 65535 batch x heads, outputs of
another shape than the attention result.
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen import attention_decode, attention_hopper
from minicomp.codegen import indexing as ix
from minicomp.codegen.attention_body import Writer
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import (Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Unsupported, few_configs, group_spec,
                                     kernel_name, next_pow2)
from minicomp.codegen.epilogue import Operand, fold_operand
from minicomp.codegen.gemm_form import DOT_DTYPES, needs_int64
from minicomp.codegen.names import comment_text
from minicomp.codegen.sizes import bucket, jit_line, size_args, size_params, tune_tail
from minicomp.ir import dims
from minicomp.ir.attention_ref import EMPTY_ROWS, EXTRA_DEFAULTS
from minicomp.plan.specs import AttentionSpec

# (BLOCK_M, BLOCK_N, num_stages, num_warps); BLOCK_M is a multiple of BLOCK_N (causal block skipping)
HALF_CONFIGS = [(128, 64, 3, 4), (128, 64, 3, 8), (128, 128, 3, 8), (64, 64, 3, 4), (128, 32, 4, 4), (64, 32, 4, 4)]
FP32_CONFIGS = [(64, 32, 2, 4), (64, 64, 2, 4), (32, 32, 2, 4)]
# long sequences: the two that took turns being fastest on the H200 (benchmarks/ablations/run.py,
# B4 H32 S4096 d128 causal: 1.15-1.20 ms, with (128, 64, 3, 8) in between; (128, 64, 3, 4) took
# 1.55); each config autotuned is a compile of several seconds on the first call
LONG_SEQ = 1024
LONG_CONFIGS = [(128, 128, 3, 8), (64, 64, 3, 4)]

class Spec:
    """What one attention group computes (its `AttentionSpec`, the plan's), with the operands
    folded to memory."""

    def __init__(self, ctx: KernelCtx):
        g = ctx.graph
        form = group_spec(ctx, AttentionSpec)
        node = g.node(form.node)
        self.node = node
        q, k, v = g.node(form.q), g.node(form.k), g.node(form.v)
        self.mask = g.node(form.mask) if form.mask is not None else None
        if q.dtype not in DOT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            raise Unsupported(f"{node.describe()}: attention over {q.dtype}/{k.dtype}/{v.dtype}")
        if self.mask is not None and not (self.mask.dtype == torch.bool or self.mask.dtype.is_floating_point):
            raise Unsupported(f"{node.describe()}: attention mask of dtype {self.mask.dtype}")
        for out in ctx.group.outputs:
            if g.node(out).shape != node.shape:
                raise Unsupported(f"{g.node(out).describe()}: output shape differs from the attention's")
        self.batch = form.batch
        self.sq, self.d = form.sq, form.d
        self.sk, self.dv = form.sk, form.dv
        self.scale = form.scale
        self.causal = form.causal
        # node attributes, not derived (attention_ref.py defines them); absent ones mean SDPA's
        extra = {k: node.attrs.get(k, d) for k, d in EXTRA_DEFAULTS.items()}
        self.softcap, self.window = float(extra["softcap"]), int(extra["window"])
        self.mask_fill, self.score_dtype = float(extra["mask_fill"]), extra["score_dtype"]
        self.empty_rows = extra["empty_rows"]
        if self.window and not self.causal:
            raise Unsupported(f"{node.describe()}: a sliding window without is_causal")
        if self.empty_rows not in EMPTY_ROWS or self.softcap < 0 or self.window < 0:
            raise Unsupported(f"{node.describe()}: attributes {extra}")
        if dims.any_symbolic((self.d, self.dv)):
            raise Unsupported(f"{node.describe()}: a symbolic head dim (the kernel's tiles are sized by it)")
        nbh = math.prod(self.batch)
        # symbolic batch x heads may exceed the second grid axis (65535): one axis holds both
        self.flat = dims.is_symbolic(nbh)
        if not self.flat and nbh > 65535:
            raise Unsupported(f"{node.describe()}: {nbh} batch x heads exceed one grid axis")
        zs = [ix.sym(f"z{i}", b) for i, b in enumerate(self.batch)]
        kv_batch, kv_zs = list(self.batch), list(zs)
        if form.kv_groups is None:
            raise Unsupported(f"{node.describe()}: {q.shape[-3]} query heads over {k.shape[-3]} KV heads")
        self.groups = groups = form.kv_groups         # query heads per KV head
        if groups != 1:
            kv_batch[-1] = k.shape[-3]
            kv_zs[-1] = ix.floordiv(zs[-1], groups)   # query head h reads KV head h // groups
        self.q = self._fold(ctx, q, self.batch, zs, ("qm", self.sq), ("qd", self.d))
        self.k = self._fold(ctx, k, kv_batch, kv_zs, ("kn", self.sk), ("kd", self.d))
        self.v = self._fold(ctx, v, kv_batch, kv_zs, ("vn", self.sk), ("vd", self.dv))
        self.mask_idx = ix.dims_index(self.batch + (self.sq, self.sk), zs + [ix.sym("rm", self.sq),
                                                                            ix.sym("rn", self.sk)])
        self.out_idx = ix.dims_index(node.shape, zs + [ix.sym("rm", self.sq), ix.sym("od", self.dv)])

    @staticmethod
    def _fold(ctx: KernelCtx, node, batch, zs, rows: tuple[str, int], cols: tuple[str, int]) -> Operand:
        full = ix.dims_index(tuple(batch) + (rows[1], cols[1]), list(zs) + [ix.sym(*rows), ix.sym(*cols)])
        return fold_operand(ctx, node.id, ix.broadcast(full, node.shape))


def _cap(size, least: int) -> float:
    """The largest block worth trying along a length: its size rounded up to a power of two (at
    least `least`); a symbolic length caps nothing (the autotuner picks per size bucket)."""
    return float("inf") if dims.is_symbolic(size) else max(least, next_pow2(size))


def configs(spec: Spec, device_type: str) -> list[tuple[int, int, int, int]]:
    if device_type != "cuda":
        bm = min(_cap(spec.sq, 16), 64)
        return [(bm, min(bm, _cap(spec.sk, 16), 32), 1, 4)]
    if dims.any_symbolic((spec.sq, spec.sk)):
        # every length: LONG_CONFIGS first (all a long bucket times, `long_from`), then the two
        # short sequences' winners; cut only by a concrete length. Each config is a compile of
        # about a second on the first call, so not the whole table
        table = FP32_CONFIGS if spec.q.dtype == torch.float32 else (
            LONG_CONFIGS + [c for c in HALF_CONFIGS if c not in LONG_CONFIGS][:2])
        fit = [c for c in table if c[0] <= _cap(spec.sq, 64) and c[1] <= _cap(spec.sk, 32)]
        return fit or [table[-1]]
    if spec.q.dtype != torch.float32 and min(spec.sq, spec.sk) >= LONG_SEQ and max(spec.d, spec.dv) <= 128:
        return LONG_CONFIGS
    table = FP32_CONFIGS if spec.q.dtype == torch.float32 else HALF_CONFIGS
    fit = [c for c in table if c[0] <= max(64, next_pow2(spec.sq)) and c[1] <= max(32, next_pow2(spec.sk))]
    return fit or [table[-1]]


def long_from(spec: Spec, cfgs: list) -> tuple[int, dict[str, int]] | None:
    """Over symbolic lengths in half precision: from which buckets on a sweep times only
    LONG_CONFIGS, the long sequences' winners (`sizes.tune_tail`'s `top`)."""
    if spec.q.dtype == torch.float32 or max(spec.d, spec.dv) > 128 or cfgs[:len(LONG_CONFIGS)] != LONG_CONFIGS:
        return None
    lengths = {f"{d.lower()}_bucket": LONG_SEQ for d, v in (("SQ", spec.sq), ("SK", spec.sk)) if dims.is_symbolic(v)}
    return (len(LONG_CONFIGS), lengths) if lengths else None


def emit(ctx: KernelCtx) -> Kernel:
    spec = Spec(ctx)
    decode_reason = attention_decode.why_not(spec)
    if decode_reason is None:
        return attention_decode.emit(ctx, spec)
    hopper_reason = attention_hopper.why_not(ctx, spec)
    if hopper_reason is None:
        kernel, hopper_reason = attention_hopper.emit(ctx, spec)
        if kernel is not None:
            if not ctx.target.tiered:
                return kernel
            first = _block_language(ctx, spec, "it serves the calls before the Gluon kernel has compiled "
                                               "(attention_hopper.tiered)")
            return attention_hopper.tiered(kernel, first)
    return _block_language(ctx, spec, hopper_reason)


def _block_language(ctx: KernelCtx, spec: Spec, hopper_reason: str) -> Kernel:
    """The group's block-language kernel (`hopper_reason`: why the Gluon one is not the one launched)."""
    name = kernel_name(ctx, "attn")
    cfgs = few_configs(ctx, configs(spec, ctx.device_type), lambda c: -(-spec.sq // c[0]) * math.prod(spec.batch))
    body = CodeBuilder()
    writer = Writer(ctx, spec, body)
    writer.write(needs_int64(ctx))
    low = writer.low

    g = ctx.graph
    cuda = ctx.device_type == "cuda"
    sizes = (("SQ", spec.sq), ("SK", spec.sk))
    tuned = cuda and len(cfgs) > 1
    # over symbolic lengths the autotuner keys on their power-of-two buckets (gemm.py does the same)
    buckets = tuple((f"{d.lower()}_bucket", bucket(v))
                    for d, v in sizes if dims.is_symbolic(v)) if tuned else ()
    src = CodeBuilder()
    if tuned:       # one config is no choice: the launch passes it
        with src.block(f"{name}_configs = ["):
            for bm, bn, stages, warps in cfgs:
                src.writeline(f"triton.Config({{\"BLOCK_M\": {bm}, \"BLOCK_N\": {bn}}}, "
                              f"num_stages={stages}, num_warps={warps}),")
        src.writeline("]")
        src.writeline("")
        src.writeline("")
        key = ", ".join(f"\"{f'{d.lower()}_bucket' if dims.is_symbolic(v) else d}\"" for d, v in sizes)
        fit = {block: (f"{d.lower()}_bucket", least) for (d, v), block, least in zip(sizes, ("BLOCK_M", "BLOCK_N"), (64, 32))
               if dims.is_symbolic(v)}
        src.writeline(f"@triton.autotune(configs={name}_configs, key=[{key}], {tune_tail(fit, long_from(spec, cfgs))})")
    pointers = list(low.pointers.values())
    touched = list(ctx.group.nodes) + list(ctx.group.inputs)
    params = ([p.name for p in pointers] + size_params(g, touched)
              + [d if dims.is_symbolic(v) else f"{d}: tl.constexpr" for d, v in sizes]
              + [b for b, _ in buckets] + [f"{d}: tl.constexpr" for d in ("BLOCK_M", "BLOCK_N")])
    src.writeline(jit_line(g, touched, params, free=("SQ", "SK")))
    nbh = math.prod(spec.batch)
    with src.block(f"def {name}({', '.join(params)}):"):
        what = "causal " if spec.causal else ""
        what += f"sliding-window ({spec.window}) " if spec.window else ""
        what += "masked " if spec.mask is not None else ""
        what += f"soft-capped ({spec.softcap:g}) " if spec.softcap else ""
        src.writeline(f"# {what}attention: softmax(q @ k^T * {spec.scale:.6g}) @ v over {nbh} batch x head(s), "
                      f"Sq={spec.sq}, Sk={spec.sk}, D={spec.d}, Dv={spec.dv}")
        reads = ", ".join(g.node(p.nid).type for p in pointers if p.nid not in ctx.group.outputs)
        writes = ", ".join(g.node(o).type for o in ctx.group.outputs)
        src.writeline(f"# reads {reads}; writes {writes}")
        if cuda:
            src.writeline(f"# not on the Hopper kernel (attention_hopper.py): {comment_text(hopper_reason)}")
        src.splice(body.getvalue())

    args = tuple(Buf(p.nid) for p in pointers) + size_args(g, touched)
    sizes += buckets
    bm, bn, stages, warps = cfgs[0]
    # query blocks on the first axis, batch x heads on the second; flattened into the first where
    # batch x heads is symbolic (`Spec.flat`)
    grid = Grid.of((Blocks(spec.sq, "BLOCK_M"), nbh)) if spec.flat else Grid.of(Blocks(spec.sq, "BLOCK_M"), nbh)
    if cuda:
        one = (("BLOCK_M", bm), ("BLOCK_N", bn), ("num_stages", stages), ("num_warps", warps))
        fixed = one if len(cfgs) == 1 else ()
        launch = Launch(grid, args, sizes + fixed)
    elif dims.is_symbolic(spec.sq) or spec.flat:
        launch = Launch(grid, args, sizes + (("BLOCK_M", bm), ("BLOCK_N", bn)))
    else:
        launch = Launch(Grid.of(-(-spec.sq // bm), nbh), args, sizes + (("BLOCK_M", bm), ("BLOCK_N", bn)))
    return Kernel(name, src.getvalue(), [launch])


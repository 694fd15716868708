"""Attention groups: a FlashAttention-2 style forward kernel.

One program per (query block, batch x head): it keeps its [BLOCK_M, D] query tile in
registers and streams K and V in BLOCK_N blocks, with an online softmax (running max
`m_i` and sum `l_i` in fp32, base-2 exponentials on scores pre-scaled by scale*log2(e)),
so the [Sq, Sk] score matrix never reaches memory.

Invariants and decisions:
- two loops over key blocks: blocks that need no mask (every key exists and, when causal,
  precedes every query of the block) run without one; the rest (the diagonal blocks, the
  ragged last block) mask per element. Causal blocks entirely above the diagonal are never
  visited; causal programs start with the longest rows (reversed query-block order);
- causal masking is PyTorch's `is_causal`: top-left aligned, key j visible to query i iff j <= i;
- a boolean mask keeps True, another mask is added to the scores; either is loaded through
  its strides with broadcasting (and may itself be computed by nodes of the group);
  rows with no visible key give 0, as PyTorch does;
- grouped KV heads: query head h reads KV head h // (Hq // Hkv);
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
GPU, groups that fit (no mask tensor, half dtypes, lengths a multiple of 128, no fused
epilogue: attention_hopper.why_not) run a Gluon kernel that does (attention_hopper.py); this
kernel takes the rest, and its source says why the Gluon kernel did not take the group.

Index symbols: `qm`/`qd` (query tile), `kd`/`kn` (K tile, transposed), `vn`/`vd` (V tile),
`rm`/`rn` (score tile), `rm`/`od` (output tile), `z0`, `z1`... (batch and head).

Unsupported: dtypes other than fp32/fp16/bf16, masks other than bool or floating,
prologue ops other than views and casts, more than 65535 batch x heads, outputs of
another shape than the attention result.
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen import attention_hopper
from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import (Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Unsupported, group_spec, kernel_name,
                                     next_pow2)
from minicomp.codegen.epilogue import (LOG2E, Operand, TileLowering, cast_operand, dot_precision, fold_operand,
                                       split_offset)
from minicomp.codegen.gemm_form import DOT_DTYPES, needs_int64
from minicomp.codegen.tlexpr import Val, storage_tl
from minicomp.codegen.names import comment_text
from minicomp.plan.specs import AttentionSpec

# (BLOCK_M, BLOCK_N, num_stages, num_warps); BLOCK_M is a multiple of BLOCK_N (causal block skipping)
HALF_CONFIGS = [(128, 64, 3, 4), (128, 64, 3, 8), (128, 128, 3, 8), (64, 64, 3, 4), (128, 32, 4, 4), (64, 32, 4, 4)]
FP32_CONFIGS = [(64, 32, 2, 4), (64, 64, 2, 4), (32, 32, 2, 4)]
# long sequences: the two that took turns being fastest on the H200 (benchmarks/ablations.py,
# B4 H32 S4096 d128 causal: 1.15-1.20 ms, with (128, 64, 3, 8) in between; (128, 64, 3, 4) took
# 1.55); each config autotuned is a compile of several seconds on the first call
LONG_SEQ = 1024
LONG_CONFIGS = [(128, 128, 3, 8), (64, 64, 3, 4)]
LOCALS = ("q", "k", "v", "o", "qk", "s", "p", "acc", "m_i", "l_i", "m_new", "m_safe", "alpha", "qk_scale",
          "pid_m", "pid_bh", "start_n", "hi", "hi_full", "offs_m", "offs_n", "offs_nn", "offs_d", "offs_dv",
          "mask_m", "qm", "qd", "kd", "kn", "vn", "vd", "rm", "rn", "od", "k_rows", "v_cols",
          "SQ", "SK", "BLOCK_M", "BLOCK_N", "min", "range", "float")


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
        if math.prod(self.batch) > 65535:
            raise Unsupported(f"{node.describe()}: {math.prod(self.batch)} batch x heads exceed one grid axis")
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


def configs(spec: Spec, device_type: str) -> list[tuple[int, int, int, int]]:
    if device_type != "cuda":
        bm = min(max(next_pow2(spec.sq), 16), 64)
        return [(bm, min(bm, max(next_pow2(spec.sk), 16), 32), 1, 4)]
    if spec.q.dtype != torch.float32 and min(spec.sq, spec.sk) >= LONG_SEQ and max(spec.d, spec.dv) <= 128:
        return LONG_CONFIGS
    table = FP32_CONFIGS if spec.q.dtype == torch.float32 else HALF_CONFIGS
    fit = [c for c in table if c[0] <= max(64, next_pow2(spec.sq)) and c[1] <= max(32, next_pow2(spec.sk))]
    return fit or [table[-1]]


class _Writer:
    def __init__(self, ctx: KernelCtx, spec: Spec, body: CodeBuilder):
        self.ctx, self.spec, self.body = ctx, spec, body
        self.block_d, self.block_dv = max(16, next_pow2(spec.d)), max(16, next_pow2(spec.dv))
        self.d_mask = "kd < {}".format(spec.d) if self.block_d != spec.d else None
        self.dv_mask = "vd < {}".format(spec.dv) if self.block_dv != spec.dv else None
        masks = {"rm": "mask_m[:, None]"}
        if self.block_dv != spec.dv:
            masks["od"] = f"od < {spec.dv}"
        reserved = LOCALS + tuple(f"z{i}" for i in range(len(spec.batch)))
        self.low = TileLowering(ctx, body, masks, reserved=reserved)
        cuda = ctx.device_type == "cuda"
        self.precision = dot_precision(spec.q.dtype if cuda else torch.float32)
        self.p_dtype = storage_tl(spec.v.dtype) if cuda else "tl.float32"

    def write(self, wide: bool) -> None:
        b, s, low = self.body, self.spec, self.low
        w = ".to(tl.int64)" if wide else ""
        if s.causal:
            b.writeline("# longest rows first: causal work grows with the query block")
            b.writeline("pid_m = tl.num_programs(0) - 1 - tl.program_id(0)")
        else:
            b.writeline("pid_m = tl.program_id(0)")
        if s.batch:
            b.writeline("pid_bh = tl.program_id(1)")
            for i, size in enumerate(s.batch):
                below = math.prod(s.batch[i + 1:])
                text = "pid_bh" + (f" // {below}" if below > 1 else "") + (f" % {size}" if i else "")
                b.writeline(f"z{i} = ({text}){w}")
        b.writeline(f"offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){w}")
        b.writeline(f"offs_n = tl.arange(0, BLOCK_N){w}")
        b.writeline(f"offs_d = tl.arange(0, {self.block_d}){w}")
        b.writeline(f"offs_dv = tl.arange(0, {self.block_dv}){w}")
        b.writeline("mask_m = offs_m < SQ")
        b.writeline("qm = offs_m[:, None]")
        b.writeline("rm = offs_m[:, None]")
        b.writeline("qd = offs_d[None, :]")
        b.writeline("kd = offs_d[:, None]")
        b.writeline("vd = offs_dv[None, :]")
        b.writeline("od = offs_dv[None, :]")
        q_mask = "mask_m[:, None]" + (f" & (qd < {s.d})" if self.d_mask else "")
        b.writeline(f"q = tl.load({low.pointer(s.q.leaf)} + {low.offset_text(s.q.offset, ('qm', 'qd'))}, "
                    f"mask={q_mask}, other=0.0)")
        self._cast("q", s.q)
        k_out, self.k_in = split_offset(s.k.offset, {"kn"})
        v_out, self.v_in = split_offset(s.v.offset, {"vn"})
        b.writeline(f"k_rows = {low.pointer(s.k.leaf)} + {low.offset_text(k_out, ('kd',))}")
        b.writeline(f"v_cols = {low.pointer(s.v.leaf)} + {low.offset_text(v_out, ('vd',))}")
        b.writeline("m_i = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)")
        b.writeline("l_i = tl.zeros([BLOCK_M], dtype=tl.float32)")
        b.writeline(f"acc = tl.zeros([BLOCK_M, {self.block_dv}], dtype=tl.float32)")
        b.writeline(f"qk_scale = {s.scale * LOG2E!r}  # scale * log2(e): softmax in base 2")
        if s.causal:
            b.writeline("# key blocks before hi_full need no mask: all keys exist and precede every query here")
            b.writeline("hi_full = min((SK // BLOCK_N) * BLOCK_N, (pid_m * BLOCK_M // BLOCK_N) * BLOCK_N)")
        else:
            b.writeline("# key blocks before hi_full need no mask: all their keys exist")
            b.writeline("hi_full = (SK // BLOCK_N) * BLOCK_N")
        with b.block("for start_n in range(0, hi_full, BLOCK_N):"):
            self._block(masked=False)
        if s.causal:
            b.writeline("# the diagonal blocks (and a ragged last block): per-element masks")
            b.writeline("hi = min(SK, (pid_m + 1) * BLOCK_M)")
            with b.block("for start_n in range(hi_full, hi, BLOCK_N):"):
                self._block(masked=True)
        else:
            with b.block("if SK % BLOCK_N != 0:"):
                b.writeline("# the ragged last block: mask keys past the end")
                with b.block("for start_n in range(hi_full, SK, BLOCK_N):"):
                    self._block(masked=True)
        if s.mask is not None:
            b.writeline("l_i = tl.where(l_i == 0.0, 1.0, l_i)  # no visible key: output 0, as PyTorch")
        b.writeline("o = acc / l_i[:, None]")
        low.leaves[s.node.id] = (s.out_idx, Val("o", s.node.dtype, frozenset({"rm", "od"})))
        store_mask = "mask_m[:, None]" + (f" & (od < {s.dv})" if self.dv_mask else "")
        for out in self.ctx.group.outputs:
            low.store(out, s.out_idx, ("rm", "od"), store_mask)

    def _cast(self, var: str, op: Operand) -> None:
        text = cast_operand(var, op, self.ctx.device_type)
        if text:
            self.body.writeline(f"{var} = {text}")

    def _block(self, masked: bool) -> None:
        """One key block: scores, mask, online-softmax update, accumulate P @ V."""
        b, s, low = self.body, self.spec, self.low
        with low.scope():
            low.masks.pop("rn", None)
            if masked:
                low.masks["rn"] = "rn < SK"
            b.writeline("offs_nn = start_n + offs_n")
            b.writeline("kn = offs_nn[None, :]")
            b.writeline("vn = offs_nn[:, None]")
            b.writeline("rn = offs_nn[None, :]")
            k_mask = [m for m in (self.d_mask, "kn < SK" if masked else None) if m]
            v_mask = [m for m in (self.dv_mask, "vn < SK" if masked else None) if m]
            b.writeline(self._load("k", "k_rows", self.k_in, ("kn",), k_mask))
            self._cast("k", s.k)
            b.writeline(f"qk = tl.dot(q, k{self.precision})")
            if not masked and s.mask is None and s.scale > 0:
                # the row max of the raw scores, scaled once: max commutes with a positive scale,
                # and qk * qk_scale - m becomes one FMA per score instead of a multiply and a subtract
                b.writeline("m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)")
                b.writeline("p = tl.exp2(qk * qk_scale - m_new[:, None])")
                self._update(v_mask)
                return
            b.writeline("s = qk * qk_scale")
            if s.mask is not None:
                mval = low.value(s.mask.id, ix.broadcast(s.mask_idx, s.mask.shape))
                if s.mask.dtype == torch.bool:
                    b.writeline(f"s = tl.where({mval.code}, s, float(\"-inf\"))")
                else:
                    b.writeline(f"s = s + {mval.code} * {LOG2E!r}")
            if masked:
                cond = "(rn < SK) & (rm >= rn)" if s.causal else "rn < SK"
                b.writeline(f"s = tl.where({cond}, s, float(\"-inf\"))")
            b.writeline("m_new = tl.maximum(m_i, tl.max(s, 1))")
            m = "m_new"
            if s.mask is not None:
                b.writeline("m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)  # no visible key yet")
                m = "m_safe"
            b.writeline(f"p = tl.exp2(s - {m}[:, None])")
            self._update(v_mask, m)

    def _update(self, v_mask: list[str], m: str = "m_new") -> None:
        """Rescale the running sum and accumulator by the new max, then accumulate P @ V."""
        b, s = self.body, self.spec
        b.writeline(f"alpha = tl.exp2(m_i - {m})")
        b.writeline("l_i = l_i * alpha + tl.sum(p, 1)")
        b.writeline("acc = acc * alpha[:, None]")
        b.writeline(self._load("v", "v_cols", self.v_in, ("vn",), v_mask))
        self._cast("v", s.v)
        b.writeline(f"acc = tl.dot(p.to({self.p_dtype}), v, acc{self.precision})")
        b.writeline("m_i = m_new")

    def _load(self, var: str, base: str, inner: ix.Expr, need: tuple[str, ...], masks: list[str]) -> str:
        ptrs = f"{base} + {self.low.offset_text(inner, need)}"
        if masks:
            return f"{var} = tl.load({ptrs}, mask={' & '.join(f'({m})' for m in masks)}, other=0.0)"
        return f"{var} = tl.load({ptrs})"


def emit(ctx: KernelCtx) -> Kernel:
    spec = Spec(ctx)
    hopper_reason = attention_hopper.why_not(ctx, spec)
    if hopper_reason is None:
        kernel, hopper_reason = attention_hopper.emit(ctx, spec)
        if kernel is not None:
            return kernel
    name = kernel_name(ctx, "attn")
    cfgs = configs(spec, ctx.device_type)
    body = CodeBuilder()
    writer = _Writer(ctx, spec, body)
    writer.write(needs_int64(ctx))
    low = writer.low

    g = ctx.graph
    cuda = ctx.device_type == "cuda"
    src = CodeBuilder()
    if cuda:
        with src.block(f"{name}_configs = ["):
            for bm, bn, stages, warps in cfgs:
                src.writeline(f"triton.Config({{\"BLOCK_M\": {bm}, \"BLOCK_N\": {bn}}}, "
                              f"num_stages={stages}, num_warps={warps}),")
        src.writeline("]")
        src.writeline("")
        src.writeline("")
        src.writeline(f"@triton.autotune(configs={name}_configs, key=[\"SQ\", \"SK\"], do_bench=_tune_bench)")
    src.writeline("@triton.jit")
    pointers = list(low.pointers.values())
    params = [p.name for p in pointers] + [f"{d}: tl.constexpr" for d in ("SQ", "SK", "BLOCK_M", "BLOCK_N")]
    nbh = math.prod(spec.batch)
    with src.block(f"def {name}({', '.join(params)}):"):
        what = "causal " if spec.causal else ""
        what += "masked " if spec.mask is not None else ""
        src.writeline(f"# {what}attention: softmax(q @ k^T * {spec.scale:.6g}) @ v over {nbh} batch x head(s), "
                      f"Sq={spec.sq}, Sk={spec.sk}, D={spec.d}, Dv={spec.dv}")
        reads = ", ".join(g.node(p.nid).type for p in pointers if p.nid not in ctx.group.outputs)
        writes = ", ".join(g.node(o).type for o in ctx.group.outputs)
        src.writeline(f"# reads {reads}; writes {writes}")
        if cuda:
            src.writeline(f"# not on the Hopper kernel (attention_hopper.py): {comment_text(hopper_reason)}")
        src.splice(body.getvalue())

    args = tuple(Buf(p.nid) for p in pointers)
    sizes = (("SQ", spec.sq), ("SK", spec.sk))
    if cuda:
        launch = Launch(Grid.of(Blocks(spec.sq, "BLOCK_M"), nbh), args, sizes)
    else:
        bm, bn, _, _ = cfgs[0]
        launch = Launch(Grid.of(-(-spec.sq // bm), nbh), args, sizes + (("BLOCK_M", bm), ("BLOCK_N", bn)))
    return Kernel(name, src.getvalue(), [launch])

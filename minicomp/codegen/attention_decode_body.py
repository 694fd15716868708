"""The bodies of the decode attention kernels (attention_decode.py has the plan and the launches).

`PartialWriter` writes pass 1 (one KV chunk of one batch x KV head: online softmax over its key
blocks, partials to scratch), `combine_body` pass 2 (merge the chunks, epilogue, store); with
one chunk (`PartialWriter.direct`) pass 1 ends with `finish`, the combine's tail, instead. The
score units and the empty-row rules are attention_body.py's; its docstring says why a kernel
with a mask tensor keeps natural units (a `finfo.min` mask times log2(e) overflows to -inf).

Scratch layout (one fp32 buffer, written whole by pass 1 for the rows that exist, read by
pass 2), for KV program kv, chunk c, row r:
- `ACC[((kv * NCH + c) * R + r) * Dv + d]`: the unnormalised accumulator;
- from `ML = ACC + (KV programs x NCH x R x Dv)` on, `ML[((kv * NCH + c) * R + r) * 2]`: the
  row max m (in the kernel's score units), and `ML[... * 2 + 1]`: the row sum l.
A chunk in which a row sees no key keeps m = -inf and l = 0.
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.attention_body import load_line, open_key_block
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, group_spec, next_pow2
from minicomp.codegen.epilogue import LOG2E, Operand, TileLowering, cast_operand, dot_precision, fold_operand, \
    split_offset
from minicomp.codegen.tlexpr import Val, convert, py_literal, round_to, storage_tl
from minicomp.plan.specs import AttentionSpec

LOCALS = ("q", "k", "v", "o", "qk", "s", "p", "acc", "m_i", "l_i", "m_new", "m_safe", "m_c", "l_c", "w", "alpha",
          "qk_scale", "pid_c", "pid_kv", "start_n", "lo", "hi", "hi_full", "chunk", "base", "offs_r", "mask_r",
          "offs_n", "offs_nn", "c", "offs_d", "offs_dv", "qg", "qi", "qd", "kd", "kn", "vn", "vd", "rn", "od", "zk",
          "k_rows", "v_cols", "ACC", "ML", "SK", "sk_bucket", "BLOCK_N", "min", "max", "range", "float")


class PartialWriter:
    """Pass 1, and the index forms pass 2 shares (rows, output index, block sizes)."""

    def __init__(self, ctx: KernelCtx, spec, kv_batch: tuple[int, ...], split: tuple[int, int | None, int],
                 body: CodeBuilder):
        """`split`: (NCH, the chunk length or None: computed from SK, the chunks' alignment)."""
        self.ctx, self.spec, self.kv_batch = ctx, spec, kv_batch
        self.nch, self.chunk, self.align = split
        g = ctx.graph
        form = group_spec(ctx, AttentionSpec)
        self.rows = spec.groups * spec.sq
        self.ml_offset = math.prod(kv_batch) * self.nch * self.rows * spec.dv   # ML = ACC + this
        self.block_r = max(16, next_pow2(self.rows))
        self.block_d, self.block_dv = max(16, next_pow2(spec.d)), max(16, next_pow2(spec.dv))
        lead = [ix.sym(f"z{i}", b) for i, b in enumerate(kv_batch[:-1])]
        zk = ix.sym("zk", kv_batch[-1])
        qg, qi = ix.sym("qg", spec.groups), ix.sym("qi", spec.sq)
        head = zk * spec.groups + qg if spec.groups != 1 else zk    # query head of each row
        batch = tuple(spec.batch)
        q, k, v = g.node(form.q), g.node(form.k), g.node(form.v)
        kv_shape = tuple(kv_batch) if spec.groups != 1 else batch

        def fold(node, shape, zs, rows, cols) -> Operand:
            full = ix.dims_index(tuple(shape) + (rows[1], cols[1]), list(zs) + [ix.sym(*rows), ix.sym(*cols)])
            return fold_operand(ctx, node.id, ix.broadcast(full, node.shape))

        qfull = ix.dims_index(batch + (spec.sq, spec.d), lead + [head, qi, ix.sym("qd", spec.d)])
        self.q = fold_operand(ctx, q.id, ix.broadcast(qfull, q.shape))
        self.k = fold(k, kv_shape, lead + [zk], ("kn", spec.sk), ("kd", spec.d))
        self.v = fold(v, kv_shape, lead + [zk], ("vn", spec.sk), ("vd", spec.dv))
        self.mask_idx = ix.dims_index(batch + (spec.sq, spec.sk), lead + [head, qi, ix.sym("rn", spec.sk)])
        self.out_idx = ix.dims_index(spec.node.shape, lead + [head, qi, ix.sym("od", spec.dv)])
        cuda = ctx.device_type == "cuda"
        self.cpu = not cuda
        self.precision = dot_precision(self.q.dtype if cuda else torch.float32)
        self.p_dtype = storage_tl(self.v.dtype) if cuda else "tl.float32"
        self.natural = spec.mask is not None                # natural-unit scores (attention_body.py)
        self.safe = spec.mask is not None or spec.causal    # a visited block may hide a whole row
        self.masks = {"qg": "mask_r[:, None]", "qi": "mask_r[:, None]"}
        if self.block_dv != spec.dv:
            self.masks["od"] = f"(od < {spec.dv})"
        self.dv_store_mask = "mask_r[:, None]" + (f" & (od < {spec.dv})" if self.block_dv != spec.dv else "")
        self.direct = self.nch == 1            # one chunk: pass 1 finishes and stores (no scratch, no pass 2)
        reserved = LOCALS + tuple(f"z{i}" for i in range(len(kv_batch)))
        self.body = body
        self.low = TileLowering(ctx, body, self.masks, reserved=reserved)

    # ------------------------------------------------------------------ shared prelude
    def prelude(self, b: CodeBuilder, pid: str, wide: bool) -> None:
        """Batch coordinates from `pid` (batch x KV head), the row symbols, the column ranges."""
        w = ".to(tl.int64)" if wide else ""
        for i, size in enumerate(self.kv_batch):
            below = math.prod(self.kv_batch[i + 1:])
            text = pid + (f" // {below}" if below != 1 else "") + (f" % {size}" if i else "")
            var = "zk" if i == len(self.kv_batch) - 1 else f"z{i}"
            b.writeline(f"{var} = ({text}){w}")
        b.writeline(f"offs_r = tl.arange(0, {self.block_r})")
        b.writeline(f"mask_r = offs_r < {self.rows}  # rows: {self.spec.groups} head(s) x {self.spec.sq} quer(ies)")
        b.writeline(f"qg = (offs_r // {self.spec.sq})[:, None]{w}  # the row's query head within the group")
        b.writeline(f"qi = (offs_r % {self.spec.sq})[:, None]{w}  # the row's query")
        b.writeline(f"offs_dv = tl.arange(0, {self.block_dv}){w}")
        b.writeline("od = offs_dv[None, :]")

    def write(self, wide: bool) -> None:
        b, s, low = self.body, self.spec, self.low
        w = ".to(tl.int64)" if wide else ""
        b.writeline("pid_c = tl.program_id(0)")
        b.writeline("pid_kv = tl.program_id(1)")
        self.prelude(b, "pid_kv", wide)
        b.writeline(f"offs_d = tl.arange(0, {self.block_d}){w}")
        b.writeline(f"offs_n = tl.arange(0, BLOCK_N){w}")
        for line in ("qd = offs_d[None, :]", "kd = offs_d[:, None]", "vd = offs_dv[None, :]"):
            b.writeline(line)
        self.d_mask = f"kd < {s.d}" if self.block_d != s.d else None
        self.dv_mask = f"vd < {s.dv}" if self.block_dv != s.dv else None
        q_mask = "mask_r[:, None]" + (f" & (qd < {s.d})" if self.d_mask else "")
        b.writeline(f"q = tl.load({low.pointer(self.q.leaf)} + {low.offset_text(self.q.offset, ('qg', 'qi', 'qd'))}, "
                    f"mask={q_mask}, other=0.0)")
        self._cast(b, "q", self.q)
        k_out, self.k_in = split_offset(self.k.offset, {"kn"})
        v_out, self.v_in = split_offset(self.v.offset, {"vn"})
        b.writeline(f"k_rows = {low.pointer(self.k.leaf)} + {low.offset_text(k_out, ('kd',))}")
        b.writeline(f"v_cols = {low.pointer(self.v.leaf)} + {low.offset_text(v_out, ('vd',))}")
        b.writeline(f"m_i = tl.full([{self.block_r}], float(\"-inf\"), tl.float32)")
        b.writeline(f"l_i = tl.zeros([{self.block_r}], dtype=tl.float32)")
        b.writeline(f"acc = tl.zeros([{self.block_r}, {self.block_dv}], dtype=tl.float32)")
        if self.natural:
            b.writeline(f"qk_scale = {s.scale!r}  # scores in natural units (a mask is added): exp2((t - m) * log2(e))")
        else:
            b.writeline(f"qk_scale = {s.scale * LOG2E!r}  # scale * log2(e): softmax in base 2")
        if not self.direct:
            b.writeline(f"ML = ACC + {self.ml_offset}  # the (max, sum) pairs follow the accumulators")
        b.writeline(f"# this program's chunk of the keys: [lo, hi), a multiple of BLOCK_N long ({self.nch} chunks)")
        if self.chunk is not None:
            b.writeline(f"chunk = {self.chunk}")
        else:
            n, a = self.nch, self.align
            b.writeline(f"chunk = ((SK + {n - 1}) // {n} + {a - 1}) // {a} * {a}")
        b.writeline("lo = pid_c * chunk")
        hi = "min(SK, lo + chunk)"
        if s.causal:
            hi = f"min({s.sq}, {hi})"
            b.writeline("# is_causal (top-left): query i sees keys j <= i, so no key at or past Sq")
        b.writeline(f"hi = max(lo, {hi})")
        if s.causal:
            b.writeline("hi_full = lo  # every block masks per element")
        else:
            b.writeline("hi_full = lo + (hi - lo) // BLOCK_N * BLOCK_N")
            with b.block("for start_n in range(lo, hi_full, BLOCK_N):"):
                self._block(b, masked=False)
        b.writeline("# the ragged last block (and, when causal, every block): per-element masks")
        with b.block("for start_n in range(hi_full, hi, BLOCK_N):"):
            self._block(b, masked=True)
        if self.direct:
            b.writeline("# one chunk covers the keys: this program's softmax is complete, no partials to merge")
            finish(self.ctx, s, self, b, low)
            return
        b.writeline(f"base = (pid_kv * {self.nch} + pid_c) * {self.rows}")
        b.writeline(f"tl.store(ACC + (base + offs_r[:, None]) * {s.dv} + od, acc, mask={self.dv_store_mask})")
        b.writeline("tl.store(ML + (base + offs_r) * 2, m_i, mask=mask_r)")
        b.writeline("tl.store(ML + (base + offs_r) * 2 + 1, l_i, mask=mask_r)")

    def _cast(self, b: CodeBuilder, var: str, op: Operand) -> None:
        text = cast_operand(var, op, self.ctx.device_type)
        if text:
            b.writeline(f"{var} = {text}")

    def _block(self, b: CodeBuilder, masked: bool) -> None:
        """One key block: scores, masks, online-softmax update, accumulate P @ V."""
        s, low = self.spec, self.low
        with low.scope():
            k_mask, v_mask = open_key_block(b, low, "hi" if masked else None, self.d_mask, self.dv_mask)
            b.writeline(self._load("k", "k_rows", self.k_in, ("kn",), k_mask))
            self._cast(b, "k", self.k)
            b.writeline(f"qk = tl.dot(q, k{self.precision})")
            if not masked and s.mask is None and not s.softcap and s.scale > 0:
                # max commutes with a positive scale: one FMA per score (attention_body.py)
                b.writeline("m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)")
                b.writeline("p = tl.exp2(qk * qk_scale - m_new[:, None])")
                self._update(b, v_mask, "m_new")
                return
            if s.softcap:
                # cap * tanh(x / cap) as attention_body.py writes it: saturates without overflow
                cap = s.softcap if self.natural else s.softcap * LOG2E
                b.writeline(f"s = {cap!r} * (1.0 - 2.0 / (tl.exp2(qk * {2 * s.scale / s.softcap * LOG2E!r}) + 1.0))"
                            f"  # softcap {s.softcap!r}")
            else:
                b.writeline("s = qk * qk_scale")
            if s.mask is not None:
                self._mask(b)
            if masked:
                cond = "(rn < hi)" + (" & (qi >= rn)" if s.causal else "")
                b.writeline(f"s = tl.where({cond}, s, float(\"-inf\"))")
            b.writeline("m_new = tl.maximum(m_i, tl.max(s, 1))")
            m = "m_new"
            if self.safe:
                b.writeline("m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)  # no visible key yet")
                m = "m_safe"
            b.writeline(f"p = tl.exp2((s - {m}[:, None]) * {LOG2E!r})" if self.natural
                        else f"p = tl.exp2(s - {m}[:, None])")
            self._update(b, v_mask, m)

    def _mask(self, b: CodeBuilder) -> None:
        s, low = self.spec, self.low
        mval = low.value(s.mask.id, ix.broadcast(self.mask_idx, s.mask.shape))
        if s.mask.dtype == torch.bool:
            b.writeline(f"s = tl.where({convert(mval, torch.bool)}, s, {py_literal(s.mask_fill, torch.float32)})")
        else:
            b.writeline(f"s = s + {convert(mval, torch.float32)}")
        if s.score_dtype is not None:
            b.writeline(f"s = {round_to('s', s.score_dtype, self.cpu)}  # eager adds the mask in {s.score_dtype}")

    def _update(self, b: CodeBuilder, v_mask: list[str], m: str) -> None:
        b.writeline(f"alpha = tl.exp2((m_i - {m}) * {LOG2E!r})" if self.natural else f"alpha = tl.exp2(m_i - {m})")
        b.writeline("l_i = l_i * alpha + tl.sum(p, 1)")
        b.writeline("acc = acc * alpha[:, None]")
        b.writeline(self._load("v", "v_cols", self.v_in, ("vn",), v_mask))
        self._cast(b, "v", self.v)
        b.writeline(f"acc = tl.dot(p.to({self.p_dtype}), v, acc{self.precision})")
        b.writeline("m_i = m_new")

    def _load(self, var: str, base: str, inner: ix.Expr, need: tuple[str, ...], masks: list[str]) -> str:
        return load_line(self.low, var, base, inner, need, masks)


def combine_body(ctx: KernelCtx, spec, part: PartialWriter, b: CodeBuilder, wide: bool) -> TileLowering:
    """Pass 2 into `b`: per row, M = max_c m_c, out = sum_c w_c acc_c / sum_c w_c l_c with
    w_c = 2^(m_c - M) (natural units: e^(m_c - M)); returns its lowering (its pointers)."""
    low = TileLowering(ctx, b, part.masks, reserved=LOCALS + tuple(f"z{i}" for i in range(len(part.kv_batch))))
    rows, nch = part.rows, part.nch
    b.writeline("pid_kv = tl.program_id(0)")
    part.prelude(b, "pid_kv", wide)
    b.writeline(f"ML = ACC + {part.ml_offset}  # the (max, sum) pairs follow the accumulators")
    b.writeline(f"base = pid_kv * {nch * rows}")
    b.writeline(f"m_c = tl.full([{part.block_r}], float(\"-inf\"), tl.float32)")
    with b.block(f"for c in range({nch}):"):
        b.writeline(f"m_c = tl.maximum(m_c, tl.load(ML + (base + c * {rows} + offs_r) * 2, mask=mask_r, "
                    "other=float(\"-inf\")))")
    b.writeline("m_safe = tl.where(m_c == float(\"-inf\"), 0.0, m_c)  # no chunk saw a key: every weight 0")
    b.writeline(f"l_i = tl.zeros([{part.block_r}], dtype=tl.float32)")
    b.writeline(f"acc = tl.zeros([{part.block_r}, {part.block_dv}], dtype=tl.float32)")
    dv_mask = part.dv_store_mask
    with b.block(f"for c in range({nch}):"):
        b.writeline(f"m_i = tl.load(ML + (base + c * {rows} + offs_r) * 2, mask=mask_r, other=float(\"-inf\"))")
        b.writeline(f"l_c = tl.load(ML + (base + c * {rows} + offs_r) * 2 + 1, mask=mask_r, other=0.0)")
        b.writeline(f"w = tl.exp2((m_i - m_safe) * {LOG2E!r})" if part.natural else "w = tl.exp2(m_i - m_safe)")
        b.writeline("l_i = l_i + w * l_c")
        b.writeline(f"acc = acc + w[:, None] * tl.load(ACC + (base + c * {rows} + offs_r[:, None]) * {spec.dv} + od, "
                    f"mask={dv_mask}, other=0.0)")
    finish(ctx, spec, part, b, low)
    return low


def finish(ctx: KernelCtx, spec, part: PartialWriter, b: CodeBuilder, low: TileLowering) -> None:
    """`o = acc / l_i` with the empty-row rule, then the fused epilogue and the stores of the
    group's outputs through `low`: the combine's tail, or pass 1's when one chunk covers the keys."""
    if part.safe and spec.empty_rows == "zero":
        b.writeline("l_i = tl.where(l_i == 0.0, 1.0, l_i)  # no visible key: output 0, as SDPA")
    elif part.safe:
        b.writeline("# no visible key: 0 / 0 = NaN, as a softmax over -inf scores gives")
    b.writeline("o = acc / l_i[:, None]")
    low.leaves[spec.node.id] = (part.out_idx, Val("o", spec.node.dtype, frozenset({"qg", "qi", "od"})))
    for out in ctx.group.outputs:
        low.store(out, part.out_idx, ("qg", "qi", "od"), part.dv_store_mask)

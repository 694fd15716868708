"""The body of the flash-attention kernel (codegen/attention.py has the spec and the launch).

Score units. Without a mask tensor the scores are kept in base 2 (`qk * scale * log2(e)`,
then `exp2`), and a key block that needs no per-element mask costs one FMA per score. With
a mask tensor the scores stay in natural units until the exponent:

    t = qk * scale [softcapped] + mask   (or where(mask, t, mask_fill))
    p = exp2((t - m) * log2(e))          m: the running row max, in natural units

because a mask of `finfo(float32).min` (what transformers builds) times log2(e) overflows
fp32 to -inf, which turns a row whose keys are all masked into zeros instead of eager's
average over its keys. Here nothing overflows that eager does not: t is what eager adds
(rounded once more, in fp32); `t - m` is <= 0 and can only overflow towards -inf where t
lies below m by more than FLT_MAX, i.e. where eager's exp(t - m) underflows to 0 anyway;
(t - m) * log2(e) likewise overflows only below -FLT_MAX / 1.44, again an exact 0 after
exp2. A fully masked row of finite scores has t == m for its largest key, so it sums to
>= 1 and the output is eager's weighted average. The cost is the same op count as the
base-2 form (an FMA and a subtract-multiply per score instead of a multiply, an FMA and a
subtract) and it only applies to kernels that load a mask.

Rows with no visible key at all (every t is -inf) give 0 (`empty_rows="zero"`, SDPA's
answer) or NaN ("nan", what a hand-written softmax gives): acc and l_i both stay 0 and
0 / 0 is NaN unless l_i is replaced by 1.

Key-block ranges (causal): blocks wholly above the diagonal are never visited; with a
sliding window of width W (key j visible to query i iff i - W < j <= i) neither are blocks
wholly left of the band. Three loops: [lo, mid) the band's left edge (masked per element),
[mid, hi_full) blocks inside the band for every query of the block (no mask), [hi_full, hi)
the diagonal (masked). Rows that see no key in a visited block keep m = -inf: `m_safe`
keeps exp2 from computing -inf - -inf there.
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, next_pow2
from minicomp.codegen.epilogue import LOG2E, Operand, TileLowering, cast_operand, dot_precision, split_offset
from minicomp.codegen.tlexpr import Val, convert, py_literal, round_to, storage_tl

LOCALS = ("q", "k", "v", "o", "qk", "s", "p", "acc", "m_i", "l_i", "m_new", "m_safe", "alpha", "qk_scale",
          "pid_m", "pid_bh", "start_n", "lo", "lo_full", "mid", "hi", "hi_full", "offs_m", "offs_n", "offs_nn",
          "offs_d", "offs_dv", "mask_m", "qm", "qd", "kd", "kn", "vn", "vd", "rm", "rn", "od", "k_rows", "v_cols",
          "SQ", "SK", "BLOCK_M", "BLOCK_N", "min", "max", "range", "float", "num_pid_m") + tuple(
    f"{v}{i}" for v in ("q", "k", "v", "acc", "o", "k_rows", "v_cols") for i in range(4))


def head_pieces(d: int) -> list[tuple[int, int]]:
    """(offset, size) pieces a head dim is computed in: one power-of-two tile, padded with masks,
    or, for a multiple of 16 that is no power of two (80, 96, 160, 192...), its binary
    decomposition (96 = 64 + 32), so no dot multiplies padding (96 padded to 128 wastes a
    quarter of the QK^T work and of the accumulator's registers); a piece is at least 16 wide,
    tl.dot's least. At most 4 pieces (any multiple of 16 up to 256 has at most 4 set bits)."""
    if d < 16 or d % 16 or d & (d - 1) == 0:
        return [(0, max(16, next_pow2(d)))]
    pieces, off = [], 0
    for bit in reversed(range(d.bit_length())):
        if d & (1 << bit):
            pieces.append((off, 1 << bit))
            off += 1 << bit
    return pieces if len(pieces) <= 4 else [(0, next_pow2(d))]



def load_line(low, var: str, base: str, inner: ix.Expr, need: tuple[str, ...], masks: list[str]) -> str:
    """`var = tl.load(base + offset)`, masked (other 0) by the conjunction of `masks` if any;
    shared by the prefill and split-KV decode writers."""
    ptrs = f"{base} + {low.offset_text(inner, need)}"
    if masks:
        return f"{var} = tl.load({ptrs}, mask={' & '.join(f'({m})' for m in masks)}, other=0.0)"
    return f"{var} = tl.load({ptrs})"


def open_key_block(b: CodeBuilder, low, bound: str | None, d_mask: str | None,
                   dv_mask: str | None) -> tuple[list[str], list[str]]:
    """The lines that start one key block (`offs_nn` and the K, V and score column indices);
    with `bound` (the key count's name) a masked block: the scores' columns and the K and V
    loads are masked past it. Returns the K and V loads' masks. Shared by the prefill and the
    split-KV decode kernels (attention_decode_body.py); inside the caller's `low.scope()`."""
    low.masks.pop("rn", None)
    if bound:
        low.masks["rn"] = f"(rn < {bound})"
    b.writeline("offs_nn = start_n + offs_n")
    b.writeline("kn = offs_nn[None, :]")
    b.writeline("vn = offs_nn[:, None]")
    b.writeline("rn = offs_nn[None, :]")
    return ([m for m in (d_mask, f"kn < {bound}" if bound else None) if m],
            [m for m in (dv_mask, f"vn < {bound}" if bound else None) if m])

class Writer:
    def __init__(self, ctx: KernelCtx, spec, body: CodeBuilder):
        self.ctx, self.spec, self.body = ctx, spec, body
        self.block_d, self.block_dv = max(16, next_pow2(spec.d)), max(16, next_pow2(spec.dv))
        self.d_parts, self.dv_parts = head_pieces(spec.d), head_pieces(spec.dv)
        if len(self.d_parts) > 1:
            self.block_d = spec.d
        if len(self.dv_parts) > 1:
            self.block_dv = spec.dv
        self.d_mask = "kd < {}".format(spec.d) if self.block_d != spec.d else None
        self.dv_mask = "vd < {}".format(spec.dv) if self.block_dv != spec.dv else None
        # bounds masks of the tile symbols, each parenthesised: the lowering joins them with `&`,
        # which binds tighter than `<` (`mask_m[:, None] & rn < SK` reads rows past SQ)
        masks = {"rm": "mask_m[:, None]"}
        if self.block_dv != spec.dv:
            masks["od"] = f"(od < {spec.dv})"
        reserved = LOCALS + tuple(f"z{i}" for i in range(len(spec.batch)))
        self.low = TileLowering(ctx, body, masks, reserved=reserved)
        cuda = ctx.device_type == "cuda"
        self.cpu = not cuda
        self.precision = dot_precision(spec.q.dtype if cuda else torch.float32)
        self.p_dtype = storage_tl(spec.v.dtype) if cuda else "tl.float32"
        self.natural = spec.mask is not None         # natural-unit scores (see the module docstring)
        self.safe = spec.mask is not None or spec.window > 0   # a visited block may hide a whole row

    def write(self, wide: bool) -> None:
        b, s, low = self.body, self.spec, self.low
        w = ".to(tl.int64)" if wide else ""
        if s.flat:
            # batch x heads is symbolic: one grid axis holds (batch x head, query block), query
            # blocks innermost
            b.writeline("num_pid_m = tl.cdiv(SQ, BLOCK_M)")
            b.writeline("pid_bh = tl.program_id(0) // num_pid_m")
            if s.causal:
                b.writeline("# longest rows first: causal work grows with the query block")
                b.writeline("pid_m = num_pid_m - 1 - tl.program_id(0) % num_pid_m")
            else:
                b.writeline("pid_m = tl.program_id(0) % num_pid_m")
        elif s.causal:
            b.writeline("# longest rows first: causal work grows with the query block")
            b.writeline("pid_m = tl.num_programs(0) - 1 - tl.program_id(0)")
        else:
            b.writeline("pid_m = tl.program_id(0)")
        if s.batch:
            if not s.flat:
                b.writeline("pid_bh = tl.program_id(1)")
            for i, size in enumerate(s.batch):
                below = math.prod(s.batch[i + 1:])
                text = "pid_bh" + (f" // {ix.size_text(below)}" if below != 1 else "") + (
                    f" % {ix.size_text(size)}" if i else "")
                b.writeline(f"z{i} = ({text}){w}")
        b.writeline(f"offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){w}")
        b.writeline(f"offs_n = tl.arange(0, BLOCK_N){w}")
        k_out, self.k_in = split_offset(s.k.offset, {"kn"})
        v_out, self.v_in = split_offset(s.v.offset, {"vn"})
        if len(self.d_parts) == 1 and len(self.dv_parts) == 1:
            b.writeline(f"offs_d = tl.arange(0, {self.block_d}){w}")
            b.writeline(f"offs_dv = tl.arange(0, {self.block_dv}){w}")
            b.writeline("mask_m = offs_m < SQ")
            for line in ("qm = offs_m[:, None]", "rm = offs_m[:, None]", "qd = offs_d[None, :]", "kd = offs_d[:, None]",
                         "vd = offs_dv[None, :]", "od = offs_dv[None, :]"):
                b.writeline(line)
            q_mask = "mask_m[:, None]" + (f" & (qd < {s.d})" if self.d_mask else "")
            b.writeline(f"q = tl.load({low.pointer(s.q.leaf)} + {low.offset_text(s.q.offset, ('qm', 'qd'))}, "
                        f"mask={q_mask}, other=0.0)")
            self._cast("q", s.q)
            b.writeline(f"k_rows = {low.pointer(s.k.leaf)} + {low.offset_text(k_out, ('kd',))}")
            b.writeline(f"v_cols = {low.pointer(s.v.leaf)} + {low.offset_text(v_out, ('vd',))}")
        else:
            self._pieces(w, k_out, v_out)
        b.writeline("m_i = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)")
        b.writeline("l_i = tl.zeros([BLOCK_M], dtype=tl.float32)")
        for var, (_, size) in zip(self._names("acc", self.dv_parts), self.dv_parts):
            b.writeline(f"{var} = tl.zeros([BLOCK_M, {size}], dtype=tl.float32)")
        if self.natural:
            b.writeline(f"qk_scale = {s.scale!r}  # scores in natural units (a mask is added): exp2((t - m) * log2(e))")
        else:
            b.writeline(f"qk_scale = {s.scale * LOG2E!r}  # scale * log2(e): softmax in base 2")
        self._loops()
        if self.safe and s.empty_rows == "zero":
            b.writeline("l_i = tl.where(l_i == 0.0, 1.0, l_i)  # no visible key: output 0, as SDPA")
        elif self.safe:
            b.writeline("# no visible key: 0 / 0 = NaN, as a softmax over -inf scores gives")
        store_mask = "mask_m[:, None]" + (f" & (od < {s.dv})" if self.dv_mask else "")
        if len(self.dv_parts) == 1:
            b.writeline("o = acc / l_i[:, None]")
            low.leaves[s.node.id] = (s.out_idx, Val("o", s.node.dtype, frozenset({"rm", "od"})))
            for out in self.ctx.group.outputs:
                low.store(out, s.out_idx, ("rm", "od"), store_mask)
            return
        # a split head dim: the epilogue and the stores run once per piece of the output columns
        for i, (off, size) in enumerate(self.dv_parts):
            with low.scope():
                b.writeline(f"od = {_cols(off, size)}[None, :]{w}")
                b.writeline(f"o{i} = acc{i} / l_i[:, None]")
                low.leaves[s.node.id] = (s.out_idx, Val(f"o{i}", s.node.dtype, frozenset({"rm", "od"})))
                for out in self.ctx.group.outputs:
                    low.store(out, s.out_idx, ("rm", "od"), store_mask)

    @staticmethod
    def _names(var: str, parts: list) -> list[str]:
        return [var] if len(parts) == 1 else [f"{var}{i}" for i in range(len(parts))]

    def _pieces(self, w: str, k_out: ix.Expr, v_out: ix.Expr) -> None:
        """The prologue of a split head dim (`head_pieces`): a q tile and K/V row pointers per piece."""
        b, s, low = self.body, self.spec, self.low
        b.writeline("mask_m = offs_m < SQ")
        b.writeline("qm = offs_m[:, None]")
        b.writeline("rm = offs_m[:, None]")
        for i, (off, size) in enumerate(self.d_parts):
            var = self._names("q", self.d_parts)[i]
            b.writeline(f"qd = {_cols(off, size)}[None, :]{w}")
            q_mask = "mask_m[:, None]" + (f" & (qd < {s.d})" if self.d_mask else "")
            b.writeline(f"{var} = tl.load({low.pointer(s.q.leaf)} + {low.offset_text(s.q.offset, ('qm', 'qd'))}, "
                        f"mask={q_mask}, other=0.0)")
            self._cast(var, s.q)
            b.writeline(f"kd = {_cols(off, size)}[:, None]{w}")
            b.writeline(f"{self._names('k_rows', self.d_parts)[i]} = {low.pointer(s.k.leaf)} + "
                        f"{low.offset_text(k_out, ('kd',))}")
        for i, (off, size) in enumerate(self.dv_parts):
            b.writeline(f"vd = {_cols(off, size)}[None, :]{w}")
            b.writeline(f"{self._names('v_cols', self.dv_parts)[i]} = {low.pointer(s.v.leaf)} + "
                        f"{low.offset_text(v_out, ('vd',))}")
        if len(self.dv_parts) == 1:
            b.writeline("od = vd")

    def _loops(self) -> None:
        b, s = self.body, self.spec
        if not s.causal:
            b.writeline("# key blocks before hi_full need no mask: all their keys exist")
            b.writeline("hi_full = (SK // BLOCK_N) * BLOCK_N")
            with b.block("for start_n in range(0, hi_full, BLOCK_N):"):
                self._block(masked=False)
            with b.block("if SK % BLOCK_N != 0:"):
                b.writeline("# the ragged last block: mask keys past the end")
                with b.block("for start_n in range(hi_full, SK, BLOCK_N):"):
                    self._block(masked=True)
            return
        b.writeline("# key blocks before hi_full need no mask: all keys exist and precede every query here")
        b.writeline("hi_full = min((SK // BLOCK_N) * BLOCK_N, (pid_m * BLOCK_M // BLOCK_N) * BLOCK_N)")
        b.writeline("hi = min(SK, (pid_m + 1) * BLOCK_M)")
        start = "0"
        if s.window:
            w = s.window
            b.writeline(f"# sliding window of {w}: keys before lo are outside the band of every query here; from")
            b.writeline("# mid on, every key of a block is inside the band of every query of this block")
            b.writeline(f"lo = (max(0, pid_m * BLOCK_M - {w - 1}) // BLOCK_N) * BLOCK_N")
            b.writeline(f"lo_full = ((max(0, pid_m * BLOCK_M + BLOCK_M - {w}) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N")
            b.writeline("mid = max(lo, min(lo_full, hi_full))")
            with b.block("for start_n in range(lo, mid, BLOCK_N):"):
                self._block(masked=True)
            start = "mid"
            b.writeline("hi_full = max(mid, hi_full)")
        with b.block(f"for start_n in range({start}, hi_full, BLOCK_N):"):
            self._block(masked=False)
        b.writeline("# the diagonal blocks (and a ragged last block): per-element masks")
        with b.block("for start_n in range(hi_full, hi, BLOCK_N):"):
            self._block(masked=True)

    def _cast(self, var: str, op: Operand) -> None:
        text = cast_operand(var, op, self.ctx.device_type)
        if text:
            self.body.writeline(f"{var} = {text}")

    def _scores(self) -> None:
        """s = the scores of this block (base 2, or natural units with a mask), softcapped and masked."""
        b, s, low = self.body, self.spec, self.low
        if s.softcap:
            # cap * tanh(x / cap), tanh(y) = 1 - 2 / (e^2y + 1): saturates to +-1 without overflow
            cap = s.softcap if self.natural else s.softcap * LOG2E
            b.writeline(f"s = {cap!r} * (1.0 - 2.0 / (tl.exp2(qk * {2 * s.scale / s.softcap * LOG2E!r}) + 1.0))"
                        f"  # softcap {s.softcap!r}")
        else:
            b.writeline("s = qk * qk_scale")
        if s.mask is None:
            return
        mval = low.value(s.mask.id, ix.broadcast(s.mask_idx, s.mask.shape))
        if s.mask.dtype == torch.bool:
            b.writeline(f"s = tl.where({convert(mval, torch.bool)}, s, {py_literal(s.mask_fill, torch.float32)})")
        else:
            b.writeline(f"s = s + {convert(mval, torch.float32)}")
        if s.score_dtype is not None:
            b.writeline(f"s = {round_to('s', s.score_dtype, self.cpu)}  # eager adds the mask in {s.score_dtype}")

    def _block(self, masked: bool) -> None:
        """One key block: scores, mask, online-softmax update, accumulate P @ V."""
        b, s, low = self.body, self.spec, self.low
        with low.scope():
            k_mask, v_mask = open_key_block(b, low, "SK" if masked else None, self.d_mask, self.dv_mask)
            qs, ks, rows = (self._names(v, self.d_parts) for v in ("q", "k", "k_rows"))
            for i, (kvar, base) in enumerate(zip(ks, rows)):
                b.writeline(self._load(kvar, base, self.k_in, ("kn",), k_mask))
                self._cast(kvar, s.k)
                acc = ", qk" if i else ""    # a split head dim: the pieces' products summed in the dot
                b.writeline(f"qk = tl.dot({qs[i]}, {kvar}{acc}{self.precision})")
            if not masked and s.mask is None and not s.softcap and s.scale > 0:
                # the row max of the raw scores, scaled once: max commutes with a positive scale,
                # and qk * qk_scale - m becomes one FMA per score instead of a multiply and a subtract
                b.writeline("m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)")
                b.writeline("p = tl.exp2(qk * qk_scale - m_new[:, None])")
                self._update(v_mask)
                return
            self._scores()
            if masked:
                cond = "rn < SK"
                if s.causal:
                    cond = "(rn < SK) & (rm >= rn)" + (f" & (rm - rn < {s.window})" if s.window else "")
                b.writeline(f"s = tl.where({cond}, s, float(\"-inf\"))")
            b.writeline("m_new = tl.maximum(m_i, tl.max(s, 1))")
            m = "m_new"
            if self.safe and (masked or s.mask is not None):   # a block without masks sees every key
                b.writeline("m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)  # no visible key yet")
                m = "m_safe"
            if self.natural:
                b.writeline(f"p = tl.exp2((s - {m}[:, None]) * {LOG2E!r})")
            else:
                b.writeline(f"p = tl.exp2(s - {m}[:, None])")
            self._update(v_mask, m)

    def _update(self, v_mask: list[str], m: str = "m_new") -> None:
        """Rescale the running sum and accumulator by the new max, then accumulate P @ V."""
        b, s = self.body, self.spec
        if self.natural:
            b.writeline(f"alpha = tl.exp2((m_i - {m}) * {LOG2E!r})")
        else:
            b.writeline(f"alpha = tl.exp2(m_i - {m})")
        b.writeline("l_i = l_i * alpha + tl.sum(p, 1)")
        names = zip(*(self._names(v, self.dv_parts) for v in ("acc", "v", "v_cols")))
        if len(self.dv_parts) > 1:
            b.writeline(f"p = p.to({self.p_dtype})")
        for acc, var, base in names:
            b.writeline(f"{acc} = {acc} * alpha[:, None]")
            b.writeline(self._load(var, base, self.v_in, ("vn",), v_mask))
            self._cast(var, s.v)
            p = "p" if len(self.dv_parts) > 1 else f"p.to({self.p_dtype})"
            b.writeline(f"{acc} = tl.dot({p}, {var}, {acc}{self.precision})")
        b.writeline("m_i = m_new")

    def _load(self, var: str, base: str, inner: ix.Expr, need: tuple[str, ...], masks: list[str]) -> str:
        return load_line(self.low, var, base, inner, need, masks)


def _cols(off: int, size: int) -> str:
    """The column range [off, off + size) of one head-dim piece."""
    return f"tl.arange(0, {size})" if off == 0 else f"({off} + tl.arange(0, {size}))"

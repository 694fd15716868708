"""The reductions of a row kernel: each op's accumulator, in the single-pass and looped forms.

`reduce(k, nid, pending)` writes reduction `nid` into row kernel `k` (codegen/reduction.py)
and records its value, shaped [BLOCK_R, 1], in `k.reduced`. In the single-pass form a
reduction is one `tl.sum/tl.reduce` over the tile already in registers; in the looped form
it is a loop over column blocks that folds each block into a [BLOCK_R, BLOCK_C] accumulator,
then one reduction of the accumulator across its lanes. Padding lanes hold the op's
neutral element.

Values one reduction computes that another needs are computed once (`k.shared`, keyed by
(op, operand)): argmax's pass gives the max too (`max.dim`), var's mean is the mean
(`var_mean`). An amax waiting for its argmax partner lets it run first.

Accumulators are the compute type of the result (fp32 for half types; int64 for sums of
integers); bool inputs of max/min/any/all fold as int32 (no reduction over i1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.common import Unsupported
from minicomp.codegen.tlexpr import NAN_ALL, Val, compute_tl, convert
from minicomp.ir import dims
from minicomp.ir.dims import SymbolicDim

REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "prod", "any", "all", "argmax", "argmin", "logsumexp")
INT32_MAX = 2**31 - 1
INF, NINF = "float('inf')", "-float('inf')"


@dataclass(frozen=True)
class Fold:
    """How one reduction folds values: accumulator type, padding value, elementwise update and
    the reduction of a [BLOCK_R, BLOCK_C] tile over its columns (texts over {a}, {b} / {t})."""
    acc_tl: str
    neutral: str
    update: str
    row: str


def _extreme(dtype: torch.dtype, largest: bool) -> str:
    if dtype.is_floating_point:
        return INF if largest else NINF
    info = torch.iinfo(dtype)
    return str(info.max if largest else info.min)


def fold_of(kind: str, dtype: torch.dtype) -> Fold:
    """The fold of `kind` ("sum", "prod", "max", "min") over values held as `dtype`."""
    acc = compute_tl(dtype)
    zero, one = ("0.0", "1.0") if dtype.is_floating_point else ("0", "1")
    nan = NAN_ALL if dtype.is_floating_point else ""
    if kind == "sum":
        return Fold(acc, zero, "{a} + {b}", "tl.sum({t}, axis=1)")
    if kind == "prod":
        return Fold(acc, one, "{a} * {b}", "tl.reduce({t}, 1, _mul_combine)")
    largest = kind == "max"
    fn = "maximum" if largest else "minimum"
    # tl.max / tl.min drop NaN; torch.amax/amin keep it
    row = f"tl.reduce({{t}}, 1, _{kind}_nan)" if nan else f"tl.{kind}({{t}}, axis=1)"
    return Fold(acc, _extreme(dtype, not largest), f"tl.{fn}({{a}}, {{b}}{nan})", row)


def fold(k, name: str, term_of, f: Fold) -> str:
    """Fold `term_of(x)` (x: the operand's value at the element) over the row: the name of a
    [BLOCK_R, 1] value. `term_of` is called inside the loop in the looped form."""
    low = k.low
    out = low.names.fresh(name)
    if k.single:
        term = term_of()
        k.main.writeline(f"{out} = {f.row.format(t=f'tl.where(mask, {term}, {f.neutral})')}[:, None]")
        return out
    acc = low.names.fresh(f"acc_{name}")
    k.main.writeline(f"{acc} = tl.full([BLOCK_R, BLOCK_C], {f.neutral}, {f.acc_tl})")
    loop = k.open_loop()
    term = term_of()
    loop.writeline(f"{acc} = {f.update.format(a=acc, b=f'tl.where(mask, {term}, {f.neutral})')}")
    k.close_loop()
    k.main.writeline(f"{out} = {f.row.format(t=acc)}[:, None]")
    return out


def operand(k, node) -> Val:
    """The operand at the element (rows, cols); an empty domain has no element to evaluate (its
    index would divide by a size 0): zeros stand for it, and every lane is padding."""
    if math.prod(k.dom.shape) == 0:
        dt = k.ctx.graph.node(node.args[0]).dtype
        return Val(f"tl.zeros([BLOCK_R, BLOCK_C], dtype={compute_tl(dt)})", dt, frozenset({"rows", "cols"}))
    return k.low.value(node.args[0], k.s_index)


def _row(name: str, dtype: torch.dtype) -> Val:
    return Val(name, dtype, frozenset({"rows"}))


# --------------------------------------------------------------------------- the ops


def reduce(k, nid: int, pending: list[int]) -> None:
    """Write reduction `nid`; `pending` are the reductions still to write (a partner may run now)."""
    g = k.ctx.graph
    node = g.node(nid)
    op, arg = node.op, node.args[0]
    if (op, arg) in k.shared:
        k.reduced[nid] = k.shared[(op, arg)]
        return
    if op in ("amax", "amin"):
        partner = next((p for p in pending if g.node(p).op == "arg" + op[1:] and g.node(p).args[0] == arg), None)
        if partner is not None and g.node(arg).dtype != torch.bool:
            pending.remove(partner)
            reduce(k, partner, pending)
            k.reduced[nid] = k.shared[(op, arg)]
            return
    k.reduced[nid] = _WRITERS[op](k, node)


def _sum_like(k, node) -> Val:
    dt = node.dtype
    total = fold(k, f"{node.op}{node.id}", lambda: convert(operand(k, node), dt), fold_of("sum", dt))
    if node.op == "sum":
        return _row(total, dt)
    mean = k.low.emit(f"mean{node.id}", f"{total} / {_count(k.dom.n_cols)}", dt, frozenset({"rows"}))
    k.shared[("mean", node.args[0])] = mean
    return mean


def _prod(k, node) -> Val:
    dt = node.dtype
    k.helpers = True
    return _row(fold(k, f"prod{node.id}", lambda: convert(operand(k, node), dt), fold_of("prod", dt)), dt)


def _max_min(k, node) -> Val:
    dt = node.dtype
    kind = "max" if node.op == "amax" else "min"
    if dt == torch.bool:     # as int32: no reduction over i1
        r = fold(k, f"{node.op}{node.id}", lambda: convert(operand(k, node), torch.int32), fold_of(kind, torch.int32))
        return k.low.emit(f"{node.op}{node.id}_b", f"{r} != 0", dt, frozenset({"rows"}))
    return _row(fold(k, f"{node.op}{node.id}", lambda: convert(operand(k, node), dt), fold_of(kind, dt)), dt)


def _any_all(k, node) -> Val:
    kind = "max" if node.op == "any" else "min"
    x_dtype = k.ctx.graph.node(node.args[0]).dtype
    truth = lambda: f"({convert(operand(k, node), x_dtype)} != 0).to(tl.int32)"  # noqa: E731  (NaN is true)
    f = fold_of(kind, torch.int32)
    # truth values are 0 and 1: an empty row is any() False, all() True
    r = fold(k, f"{node.op}{node.id}", truth, Fold(f.acc_tl, "0" if kind == "max" else "1", f.update, f.row))
    text = f"{r} != 0" if node.dtype == torch.bool else f"{r}.to({compute_tl(node.dtype)})"
    return k.low.emit(f"{node.op}{node.id}_v", text, node.dtype, frozenset({"rows"}))


def _var(k, node) -> Val:
    dt = node.dtype
    arg = node.args[0]
    mean = k.shared.get(("mean", arg))
    if mean is None:
        total = fold(k, f"sum{node.id}", lambda: convert(operand(k, node), dt), fold_of("sum", dt))
        mean = k.low.emit(f"mean{node.id}", f"{total} / {_count(k.dom.n_cols)}", dt, frozenset({"rows"}))
        k.shared[("mean", arg)] = mean

    def square() -> str:
        diff = k.low.names.fresh(f"diff{node.id}")
        k.col_builder().writeline(f"{diff} = tl.where(mask, {convert(operand(k, node), dt)} - {mean.code}, 0.0)")
        return f"{diff} * {diff}"

    sq = fold(k, f"sq{node.id}", square, fold_of("sum", dt))
    denom = k.dom.n_cols - node.attrs["correction"]
    if dims.is_symbolic(denom):     # n - correction >= 2 - 1 > 0 over the symbol's range, or it says not
        if not denom >= 1:
            raise SymbolicDim(f"var over {k.dom.n_cols} elements with correction {node.attrs['correction']}")
        return k.low.emit(f"var{node.id}", f"{sq} / {_count(denom)}", dt, frozenset({"rows"}))
    return k.low.emit(f"var{node.id}", f"{sq} / {float(max(denom, 0))!r}", dt, frozenset({"rows"}))


def _count(n) -> str:
    """An element count as a divisor in kernel text: a float literal, or (a symbolic count) the
    expression over the kernel's integer size arguments (fp32 / int divides in fp32)."""
    return ix.size_text(n) if dims.is_symbolic(n) else repr(float(n))


def _arg(k, node) -> Val:
    """argmax/argmin: (value, index) pairs, first index on ties, NaN first (row_lib's combine)."""
    x_dtype = k.ctx.graph.node(node.args[0]).dtype
    if x_dtype == torch.bool:
        raise Unsupported(f"{node.op} of bool (eager refuses it)")
    largest = node.op == "argmax"
    combine = "_argmax_combine" if largest else "_argmin_combine"
    k.helpers = True
    low, main = k.low, k.main
    neutral = _extreme(x_dtype, not largest)
    acc_tl = compute_tl(x_dtype)
    v, i = low.names.fresh(f"{node.op}{node.id}_v"), low.names.fresh(f"{node.op}{node.id}_i")
    if k.single:
        x = convert(operand(k, node), x_dtype)
        main.writeline(f"{v}, {i} = tl.reduce((tl.where(mask, {x}, {neutral}), "
                       f"tl.broadcast_to(cols, [BLOCK_R, BLOCK_C])), 1, {combine})")
    else:
        av, ai = low.names.fresh(f"acc{node.id}_v"), low.names.fresh(f"acc{node.id}_i")
        main.writeline(f"{av} = tl.full([BLOCK_R, BLOCK_C], {neutral}, {acc_tl})")
        # an index no column has: the accumulator's start loses every tie
        main.writeline(f"{ai} = tl.full([BLOCK_R, BLOCK_C], {INT32_MAX}, tl.int32)")
        loop = k.open_loop()
        x = convert(operand(k, node), x_dtype)
        loop.writeline(f"{av}, {ai} = {combine}({av}, {ai}, tl.where(mask, {x}, {neutral}), "
                       f"tl.broadcast_to(cols, [BLOCK_R, BLOCK_C]))")
        k.close_loop()
        main.writeline(f"{v}, {i} = tl.reduce(({av}, {ai}), 1, {combine})")
    k.shared[("amax" if largest else "amin", node.args[0])] = _row(f"{v}[:, None]", x_dtype)
    return low.emit(f"{node.op}{node.id}", f"{i}[:, None].to(tl.int64)", node.dtype, frozenset({"rows"}))


def online_max_sumexp(k, value, acc_tl: str, m: str, s: str, what: str) -> None:
    """The looped form's one pass for a row's max `m` and sum of exp(x - m) `s` (softmax and
    logsumexp): each lane keeps its running max and rescales its sum by exp(old - new).
    `value()` writes the row's element (its loads land inside the loop); -inf lanes add 0
    and NaN spreads to the max, as eager's."""
    low, main = k.low, k.main
    m_acc, s_acc = low.names.fresh(f"{m}_acc"), low.names.fresh(f"{s}_acc")
    main.writeline(f"# online {what}: max and sum of exp in one pass over the row")
    main.writeline(f"{m_acc} = tl.full([BLOCK_R, BLOCK_C], {NINF}, {acc_tl})")
    main.writeline(f"{s_acc} = tl.zeros([BLOCK_R, BLOCK_C], dtype={acc_tl})")
    loop = k.open_loop()
    x = value()
    xm, m_new = low.names.fresh("x_masked"), low.names.fresh("m_new")
    loop.writeline(f"{xm} = tl.where(mask, {x}, {NINF})")
    loop.writeline(f"{m_new} = tl.maximum({m_acc}, {xm}{NAN_ALL})")
    loop.writeline(f"{s_acc} = {s_acc} * tl.where({m_acc} == {NINF}, 0.0, tl.exp({m_acc} - {m_new})) "
                   f"+ tl.where({xm} == {NINF}, 0.0, tl.exp({xm} - {m_new}))")
    loop.writeline(f"{m_acc} = {m_new}")
    k.close_loop()
    main.writeline(f"{m} = tl.reduce({m_acc}, 1, _max_nan)[:, None]")  # NaN in a row: NaN, as eager
    main.writeline(f"{s} = tl.sum(tl.where({m_acc} == {NINF}, 0.0, {s_acc} * tl.exp({m_acc} - {m})), "
                   "axis=1)[:, None]")


def _logsumexp(k, node) -> Val:
    """log(sum(exp(x - m))) + m with m the row's max: +inf and -inf rows are themselves, NaN
    rows NaN (eager's guard on an infinite max). Looped: one pass, each lane keeping its
    running max and rescaling its sum (as online softmax does)."""
    dt = node.dtype
    acc_tl = compute_tl(dt)
    low, main = k.low, k.main
    m, s = low.names.fresh(f"max{node.id}"), low.names.fresh(f"sumexp{node.id}")
    if k.single:
        x = convert(operand(k, node), dt)
        main.writeline(f"{m} = tl.reduce(tl.where(mask, {x}, {NINF}), 1, _max_nan)[:, None]")
        main.writeline(f"{s} = tl.sum(tl.where(mask, tl.exp({x} - {m}), 0.0), axis=1)[:, None]")
    else:
        online_max_sumexp(k, lambda: convert(operand(k, node), dt), acc_tl, m, s, "logsumexp")
    text = f"tl.where({m} == {INF}, {INF}, tl.where({m} == {NINF}, {NINF}, tl.log({s}) + {m}))"
    return low.emit(f"logsumexp{node.id}", text, dt, frozenset({"rows"}))


_WRITERS = {"sum": _sum_like, "mean": _sum_like, "prod": _prod, "amax": _max_min, "amin": _max_min,
            "any": _any_all, "all": _any_all, "var": _var, "argmax": _arg, "argmin": _arg,
            "logsumexp": _logsumexp}

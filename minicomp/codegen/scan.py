"""Scans in a row kernel: cumsum, cumprod, cummax/cummin (values and indices), logcumsumexp.

A scan's value is per element of the domain (rows x cols, cols along the scanned axis), so
the row kernel (codegen/reduction.py) asks for it like any element value, through its
lowering: `scan_value(k, node, idx)` writes it where the element is being computed.

- single pass: the row is one tile; `tl.associative_scan` over axis 1 gives every prefix;
- looped (a long row, or the columns form): each column block is scanned on its own and
  combined with a carry, the running value of the blocks before it ([BLOCK_R, 1], set to
  the neutral element before the loop), which then takes the block's last column. Every
  loop that needs the scan (a reduction's, the output loop) carries its own, so a scan may
  feed a reduction of the same kernel as well as be stored.
Padding columns lie after the real ones, so they never reach a real prefix; the carry is
read from the last column of a full block, exact (where + sum picks one value).

cummax and cummax_index over one operand are one scan of (value, index) pairs; the second
is found in the lowering's memo. Combine functions are minicomp/runtime/row_lib.py's.
"""

from __future__ import annotations

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.common import Unsupported
from minicomp.codegen.row_reduce import NINF, _extreme
from minicomp.codegen.tlexpr import Val, compute_tl, convert

SCANS = ("cumsum", "cumprod", "cummax", "cummin", "cummax_index", "cummin_index", "logcumsumexp")
_PAIRED = {"cummax": "cummax_index", "cummin": "cummin_index", "cummax_index": "cummax", "cummin_index": "cummin"}
_COMBINE = {"cumsum": "_add_combine", "cumprod": "_mul_combine", "logcumsumexp": "_logaddexp_combine",
            "cummax": "_cummax_combine", "cummin": "_cummin_combine"}


def _held(dtype: torch.dtype) -> torch.dtype:
    """What a scan computes in: bool as int32 (no scan over i1)."""
    return torch.int32 if dtype == torch.bool else dtype


def _neutral(op: str, dtype: torch.dtype) -> str:
    if op == "cumsum":
        return "0.0" if dtype.is_floating_point else "0"
    if op == "cumprod":
        return "1.0" if dtype.is_floating_point else "1"
    if op == "logcumsumexp":
        return NINF
    return _extreme(dtype, largest=(op == "cummin"))


def scan_value(k, node, idx: ix.Index) -> Val:
    """The value of scan `node` at the element `idx` of the domain, written into `k`."""
    if idx.key() != k.s_index.key():
        raise Unsupported(f"{node.describe()} is read at another element than its own (a view across the scan)")
    g = k.ctx.graph
    x_dtype = g.node(node.args[0]).dtype
    values = node.op.replace("_index", "")
    dt = _held(x_dtype if values in ("cummax", "cummin") else node.dtype)
    acc_tl = compute_tl(dt)
    low = k.low
    b = k.col_builder()
    xv = low.value(node.args[0], k.s_index)
    x = convert(xv, dt)
    if not {"rows", "cols"} <= xv.syms:   # a constant or a per-row value: the scan takes a whole tile
        x = f"({x} + tl.zeros([BLOCK_R, BLOCK_C], dtype={acc_tl}))"
    combine = _COMBINE[values]
    k.helpers = True
    paired = values in ("cummax", "cummin")
    neutral = _neutral(values, dt)
    s = low.names.fresh(f"{values}{node.id}")
    si = low.names.fresh(f"{values}{node.id}_i") if paired else None
    cols = "tl.broadcast_to(cols, [BLOCK_R, BLOCK_C])"
    if paired:
        b.writeline(f"{s}, {si} = tl.associative_scan(({x}, {cols}), 1, {combine})")
    else:
        b.writeline(f"{s} = tl.associative_scan({x}, 1, {combine})")
    if not k.single:
        # the carry: the running value of the blocks before this one
        carry = low.names.fresh(f"carry{node.id}")
        last = low.names.fresh(f"last{node.id}")
        k.main.writeline(f"{carry} = tl.full([BLOCK_R, 1], {neutral}, {acc_tl})")
        b.writeline(f"{last} = cols == c0 + BLOCK_C - 1")
        zero = "0.0" if dt.is_floating_point else "0"
        if paired:
            carry_i = low.names.fresh(f"carry{node.id}_i")
            k.main.writeline(f"{carry_i} = tl.zeros([BLOCK_R, 1], dtype=tl.int32)")
            b.writeline(f"{s}, {si} = {combine}({carry}, {carry_i}, {s}, {si})")
            b.writeline(f"{carry_i} = tl.sum(tl.where({last}, {si}, 0), axis=1)[:, None]")
        else:
            b.writeline(f"{s} = {combine}({carry}, {s})")
        b.writeline(f"{carry} = tl.sum(tl.where({last}, {s}, {zero}), axis=1)[:, None]")
    syms = frozenset({"rows", "cols"})
    value = Val(s if x_dtype != torch.bool or not paired else f"({s} != 0)", x_dtype, syms) if paired else \
        Val(s, node.dtype, syms)
    if not paired:
        return value
    index = low.emit(f"{values}_index{node.id}", f"{si}.to(tl.int64)", torch.int64, syms)
    mine, other = (index, value) if node.op.endswith("_index") else (value, index)
    partner = next((p for p in k.dom.scans if g.node(p).op == _PAIRED[node.op]
                    and g.node(p).args[0] == node.args[0] and p in low.computed), None)
    if partner is not None:
        low.memo[(partner, k.s_index.key(), ())] = other
    return mine

"""Scans along one `axis` (non-negative; 0 for a 0-d operand): every prefix of a row, kept.

A scan's output has its operand's shape. The planner gives a scan the row kernel of a
reduction over the same axis (domain S = the operand's shape, A = (axis,)); there, unlike a
reduction's, its value is per element of S. codegen/scan.py writes it with
`tl.associative_scan`, carrying the running value between column blocks of a long row.

`cummax`/`cummin` return values and indices in eager: here they are two ops over the same
operand (`cummax` and `cummax_index`), which the row kernel computes in one scan of
(value, index) pairs. On ties the later index wins and a NaN is the maximum (and the
minimum), as eager's cummax/cummin do. Dtypes follow eager: cumsum and cumprod of integers
or bool are int64; the index ops are int64; logcumsumexp takes floats only.
"""

from __future__ import annotations

import torch

from minicomp.ir.dtypes import INT_DTYPES
from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import FLOATS


def _cumsum(x, *, axis):
    return torch.cumsum(x, axis)


def _cumprod(x, *, axis):
    return torch.cumprod(x, axis)


def _cummax(x, *, axis):
    return torch.cummax(x, axis).values


def _cummin(x, *, axis):
    return torch.cummin(x, axis).values


def _cummax_index(x, *, axis):
    return torch.cummax(x, axis).indices


def _cummin_index(x, *, axis):
    return torch.cummin(x, axis).indices


def _logcumsumexp(x, *, axis):
    if not x.dtype.is_floating_point:      # eager's kernels refuse it; its meta kernel does not
        raise ValueError(f"logcumsumexp takes floating point tensors, not {x.dtype} (eager refuses it)")
    return torch.logcumsumexp(x, axis)


_INTEGERS = (torch.bool, *INT_DTYPES)


def _scan_rule(index: bool = False, accumulates: bool = False, floats_only: bool = False):
    """The operand's shape, and eager's dtype: int64 for the index ops, and for a sum or product
    (`accumulates`) of integers or bools; otherwise the operand's (None where eager refuses)."""
    def rule(operands, attrs):
        ((shape, dt),) = operands
        axis = attrs["axis"]
        if not isinstance(axis, int) or not -max(len(shape), 1) <= axis < max(len(shape), 1):
            return None
        if dt in FLOATS:
            return tuple(shape), torch.int64 if index else dt
        if floats_only or dt not in _INTEGERS:    # narrow floats, uint16..64: left to eager's meta
            return None
        return tuple(shape), torch.int64 if index or accumulates else dt
    return rule


def scan(name: str, ref, *, aten: tuple[str, ...] = (), index: bool = False, flops: float = 1.0,
         pytorch: str | None = None, accumulates: bool = False, floats_only: bool = False) -> OpDef:
    return register(OpDef(name, "scan", ref, flops_per_element=flops, attrs=("axis",), emitter="scan",
                          shape=_scan_rule(index, accumulates, floats_only), aten=aten,
                          pytorch=pytorch or f"torch.{name}({{0}}, {{axis}})"))


scan("cumsum", _cumsum, aten=("cumsum.default",), accumulates=True)
scan("cumprod", _cumprod, aten=("cumprod.default",), accumulates=True)
scan("cummax", _cummax, aten=("cummax.default",), pytorch="torch.cummax({0}, {axis}).values")
scan("cummin", _cummin, aten=("cummin.default",), pytorch="torch.cummin({0}, {axis}).values")
scan("cummax_index", _cummax_index, index=True, pytorch="torch.cummax({0}, {axis}).indices")
scan("cummin_index", _cummin_index, index=True, pytorch="torch.cummin({0}, {axis}).indices")
scan("logcumsumexp", _logcumsumexp, flops=4, aten=("logcumsumexp.default",), floats_only=True)

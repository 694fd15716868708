"""Rounding and integer-valued arithmetic: floor, ceil, trunc, frac, round, sign, signbit,
floor division, truncating division, remainder, fmod.

Each form is exact, and follows eager's kernels where their special cases matter: floor
division and remainder take the sign rules of Python (`-7 // 2 == -4`, `-7 % 2 == 1`) on
integers and eager's fmod-based formula on floats; round is half to even with the sign of
zero kept. On integer and bool operands the rounding functions are the identity.
`mathtext.py` holds the texts; this file says which applies to which dtype.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir.ops import OpDef, TritonForm, register
from minicomp.ir.ops.mathtext import (fdiv, float_floor_div, float_remainder, fmod, int_div, round_half_even,
                                      signbit, trunc, unsigned)
from minicomp.ir.ops.rules import LOGICAL, SAME_FLOAT, elementwise, same_float
from minicomp.ir.ops.text import Let, Unsupported, as_tensor, compute_tl, py_literal


def _rounding(name: str, float_text) -> TritonForm:
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
        return float_text(x[0]) if dtype.is_floating_point else x[0]
    form.__name__ = f"_{name}"
    return form


def unary(name: str, ref, triton, *, shape=SAME_FLOAT, flops: float = 1, **extra) -> OpDef:
    return register(OpDef(name, "pointwise", ref, flops_per_element=flops, triton=triton, shape=shape,
                          pytorch=extra.pop("pytorch", f"torch.{name}({{0}})"),
                          aten=extra.pop("aten", (f"{name}.default",)), **extra))


unary("floor", torch.floor, _rounding("floor", lambda v: f"tl.floor({v})"))
unary("ceil", torch.ceil, _rounding("ceil", lambda v: f"tl.ceil({v})"))
unary("trunc", torch.trunc, _rounding("trunc", trunc), aten=("trunc.default", "fix.default"))
unary("frac", torch.frac, _rounding("frac", lambda v: f"{v} - {trunc(v)}"), flops=2)


def _round_ref(x, *, decimals: int):
    return torch.round(x, decimals=decimals)


def _round(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    (v,) = x
    if not dtype.is_floating_point:
        return v
    let = Let()
    d = int(attrs["decimals"])
    if d == 0:
        return let.done(round_half_even(let, v))
    # as eager: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d, 10^d in the compute type
    ten = float(10.0 ** abs(d)) if compute_tl(dtype) == "tl.float64" else float(torch.tensor(10.0 ** abs(d)))
    t = as_tensor(py_literal(ten, dtype), dtype)
    if d > 0:
        r = round_half_even(let, let("scaled", f"{v} * {t}"))
        return let.done(fdiv(r, t, dtype))
    r = round_half_even(let, let("scaled", fdiv(v, t, dtype)))
    return let.done(f"{r} * {t}")


def _round_rule(operands, attrs):
    return same_float(operands, attrs) if isinstance(attrs.get("decimals"), int) else None


# round.default lowers with decimals=0 (frontend/fx_ops_pointwise.py)
unary("round", _round_ref, _round, flops=4, attrs=("decimals",), shape=elementwise(_round_rule),
      pytorch="torch.round({0}, decimals={decimals})", aten=("round.default", "round.decimals"))


def _sign(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    (v,) = x
    if dtype == torch.bool:
        return v
    t = compute_tl(dtype)
    if unsigned(dtype):
        return f"({v} > 0).to({t})"
    # (x > 0) - (x < 0): 0 for NaN and for both zeros, as eager
    return f"({v} > 0).to({t}) - ({v} < 0).to({t})"


unary("sign", torch.sign, _sign, flops=2, aten=("sign.default", "sgn.default"))


def _signbit(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    return signbit(x[0], dtype)      # `dtype` is the operand's ("own" operands)


unary("signbit", torch.signbit, _signbit, shape=LOGICAL, operands="own")


# --------------------------------------------------------------------------- division


def _division(name: str, float_text, int_mode: str) -> TritonForm:
    """A division-like op: `float_text(let, a, b, dtype)` on floats, `int_div` in `int_mode` on integers."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
        if dtype == torch.bool:
            raise Unsupported(f"{name} on bool tensors")
        let = Let()
        if dtype.is_floating_point:
            a, b = as_tensor(x[0], dtype), as_tensor(x[1], dtype)
            return let.done(float_text(let, a, b, dtype))
        try:
            return let.done(int_div(let, x[0], x[1], dtype, int_mode))
        except ZeroDivisionError:
            raise Unsupported(f"{name}: integer division by zero (eager raises ZeroDivisionError)") from None
    form.__name__ = f"_{name}"
    return form


def binary(name: str, ref, triton, *, pytorch: str, aten: tuple[str, ...], flops: float = 1) -> OpDef:
    return register(OpDef(name, "pointwise", ref, arity=2, flops_per_element=flops, triton=triton,
                          shape=SAME_FLOAT, pytorch=pytorch, aten=aten))


def _div_trunc_ref(a, b):
    return torch.div(a, b, rounding_mode="trunc")


# floor_divide.default and div with rounding_mode="floor"/"trunc" have handlers (fx_ops_pointwise.py)
binary("floor_divide", torch.floor_divide, _division("floor_divide", float_floor_div, "floor"), flops=6,
       pytorch="torch.floor_divide({0}, {1})", aten=("floor_divide.default", "floor_divide.Scalar"))
binary("div_trunc", _div_trunc_ref,
       _division("div_trunc", lambda let, a, b, dt: trunc(let("quot", fdiv(a, b, dt))), "trunc"), flops=2,
       pytorch="torch.div({0}, {1}, rounding_mode='trunc')", aten=())
binary("remainder", torch.remainder, _division("remainder", float_remainder, "mod"),
       flops=3, pytorch="torch.remainder({0}, {1})",
       aten=("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor"))
binary("fmod", torch.fmod, _division("fmod", fmod, "fmod"),
       pytorch="torch.fmod({0}, {1})", aten=("fmod.Tensor", "fmod.Scalar"))

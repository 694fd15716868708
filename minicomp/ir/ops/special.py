"""Special functions and float predicates: expm1, log1p, log2, erfc, erfinv, isnan, isinf,
nan_to_num, xlogy, lerp, and pow with a tensor exponent.

On integer operands the math functions compute in the float type inference gave the node
(`expm1(int32)` is f32, as eager); the predicates look at the operand in its own type (an
integer is never NaN). The texts of the functions Triton lacks are in `mathtext.py`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.mathtext import INF, NAN, erfc, erfinv, expm1, log1p, pow_float, pow_int_tensor
from minicomp.ir.ops.rules import FLOATS, LOGICAL, SAME_FLOAT, broadcast
from minicomp.ir.ops.text import Let, Unsupported, py_literal


def op(name: str, ref, triton, *, arity: int = 1, flops: float = 1, shape=SAME_FLOAT, pytorch: str | None = None,
       aten: tuple[str, ...] | None = None, **extra) -> OpDef:
    operands = ", ".join(f"{{{i}}}" for i in range(arity))
    return register(OpDef(name, "pointwise", ref, arity=arity, flops_per_element=flops, triton=triton, shape=shape,
                          pytorch=pytorch or f"torch.{name}({operands})",
                          aten=(f"{name}.default",) if aten is None else aten, **extra))


def _steps(fn):
    """A form from `fn(let, operand, dtype) -> text` (the texts of mathtext.py)."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
        let = Let()
        return let.done(fn(let, x[0], dtype))
    form.__name__ = f"_{fn.__name__}"
    return form


op("expm1", torch.expm1, _steps(lambda let, v, dt: expm1(let, v)), flops=4)
op("log1p", torch.log1p, _steps(lambda let, v, dt: log1p(let, v)), flops=4)
op("log2", torch.log2, "tl.log2({0})")
op("erfc", torch.special.erfc, _steps(erfc), flops=30, pytorch="torch.special.erfc({0})")
op("erfinv", torch.special.erfinv, _steps(erfinv), flops=80, pytorch="torch.special.erfinv({0})")


# --------------------------------------------------------------------------- predicates and repairs

def _isinf(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    (v,) = x
    return f"tl.abs({v}) == {INF}" if dtype.is_floating_point else f"{v} != {v}"


# `dtype` is the operand's ("own" operands): x != x is the NaN test, and False for any integer
op("isnan", torch.isnan, "{0} != {0}", shape=LOGICAL, operands="own")
op("isinf", torch.isinf, _isinf, shape=LOGICAL, operands="own")


def _nan_to_num_ref(x, *, nan, posinf, neginf):
    return torch.nan_to_num(x, nan, posinf, neginf)


def _nan_to_num(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    (v,) = x
    if not dtype.is_floating_point:
        return v
    big = torch.finfo(dtype).max              # of the node's dtype: f16's is 65504
    nan, pos, neg = (py_literal(default if attrs[k] is None else attrs[k], dtype)
                     for k, default in (("nan", 0.0), ("posinf", big), ("neginf", -big)))
    return f"tl.where({v} != {v}, {nan}, tl.where({v} == {INF}, {pos}, tl.where({v} == -{INF}, {neg}, {v})))"


op("nan_to_num", _nan_to_num_ref, _nan_to_num, flops=3, attrs=("nan", "posinf", "neginf"),
   pytorch="torch.nan_to_num({0}, {nan}, {posinf}, {neginf})")


# --------------------------------------------------------------------------- binary and ternary

def _xlogy(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    a, b = x
    # as eager: NaN where y is NaN, else 0 where x is 0 (even if log y is -inf or NaN)
    return f"tl.where({b} != {b}, {NAN}, tl.where({a} == 0.0, 0.0, {a} * tl.log({b})))"


op("xlogy", torch.xlogy, _xlogy, arity=2, flops=3, operands="tensors",
   aten=("xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other"))


def _lerp(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    a, b, w = x
    if not dtype.is_floating_point:
        raise Unsupported(f"lerp of {dtype} tensors")
    # eager's two forms: exact at w = 0 (from a) and at w = 1 (from b)
    return f"tl.where(tl.abs({w}) < 0.5, {a} + {w} * ({b} - {a}), {b} - ({b} - {a}) * (1.0 - {w}))"


def _lerp_rule(operands, attrs):
    # lerp does not promote: end and weight must have the input's dtype
    dtypes = {d for _, d in operands}
    shape = broadcast(*(s for s, _ in operands))
    return None if len(dtypes) != 1 or dtypes & set(FLOATS) != dtypes or shape is None else (shape, dtypes.pop())


# lerp.Scalar's weight becomes a constant of the input's dtype (fx_ops_pointwise.py)
op("lerp", torch.lerp, _lerp, arity=3, flops=4, operands="tensors", shape=_lerp_rule,
   aten=("lerp.Scalar", "lerp.Tensor"))


def _pow_tensor(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    a, e = x
    let = Let()
    if dtype.is_floating_point:
        return let.done(pow_float(let, a, e, dtype))
    if dtype == torch.bool:
        raise Unsupported("pow of bool tensors")
    return let.done(pow_int_tensor(let, a, e, dtype))


# pow.Scalar (a number to a tensor power) makes the base a constant (fx_ops_pointwise.py)
op("pow_tensor", torch.pow, _pow_tensor, arity=2, flops=6, operands="tensors", pytorch="torch.pow({0}, {1})",
   aten=("pow.Tensor_Tensor", "pow.Scalar"))

"""Unary pointwise ops: math functions and activations, some with attributes (gelu, pow, clamp).

Each operand arrives converted to the node's compute type (fp32 for half types), so a form
is written once for every float dtype. Forms that are more than a template say why. An
integer node (abs, neg, clamp, pow of an integer tensor) computes in its own type and wraps.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import LOGICAL, SAME_FLOAT, elementwise, same_float
from minicomp.ir.ops.mathtext import int_power, pow_float_scalar, tanh_steps
from minicomp.ir.ops.text import Let, Unsupported, nan_arg, py_literal, zero_literal


def unary(name: str, ref, triton, *, flops: float = 1, shape=SAME_FLOAT, pytorch: str | None = None,
          aten: tuple[str, ...] | None = None, **extra) -> OpDef:
    """A unary pointwise op; by default `torch.<name>(x)` in PyTorch and `aten.<name>.default`."""
    return register(OpDef(name, "pointwise", ref, arity=1, flops_per_element=flops, triton=triton, shape=shape,
                          pytorch=pytorch or f"torch.{name}({{0}})",
                          aten=(f"{name}.default",) if aten is None else aten, **extra))


def _tanh(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    let = Let()
    return let.done(tanh_steps(let, x[0], dtype))


def sqrt_text(v: str, dtype: torch.dtype) -> str:
    # tl.sqrt_rn (correctly rounded) takes fp32 only; fp64's tl.sqrt is correctly rounded already
    return f"tl.sqrt({v})" if dtype == torch.float64 else f"tl.sqrt_rn({v})"


def _sqrt(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    return sqrt_text(x[0], dtype)


def _relu(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    return f"tl.maximum({x[0]}, {zero_literal(dtype)}{nan_arg(dtype)})"


unary("neg", torch.neg, "-{0}")
unary("abs", torch.abs, "tl.abs({0})")
unary("exp", torch.exp, "tl.exp({0})")
unary("log", torch.log, "tl.log({0})")
unary("sqrt", torch.sqrt, _sqrt)
unary("rsqrt", torch.rsqrt, "tl.rsqrt({0})")
unary("sin", torch.sin, "tl.sin({0})")
unary("cos", torch.cos, "tl.cos({0})")
unary("erf", torch.erf, "tl.erf({0})")
unary("tanh", torch.tanh, _tanh)
unary("sigmoid", torch.sigmoid, "1.0 / (1.0 + tl.exp(-{0}))", flops=3)
unary("relu", torch.relu, _relu)
unary("silu", F.silu, "{0} / (1.0 + tl.exp(-{0}))", flops=4, pytorch="torch.nn.functional.silu({0})")
# the operand stays in its own dtype: "is zero" is exact in every type
unary("logical_not", torch.logical_not, "{0} == 0", shape=LOGICAL, operands="own", aten=("logical_not.default",))


# --------------------------------------------------------------------------- gelu


def _gelu_ref(x, *, approximate: str):
    return F.gelu(x, approximate=approximate)


def _gelu_rule(operands, attrs):
    return same_float(operands, attrs) if attrs.get("approximate") in ("none", "tanh") else None


def _gelu(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    (v,) = x
    if attrs["approximate"] == "tanh":
        # tanh(u) as 1 - 2 / (e^{2u} + 1), folded into 0.5 * x * (1 + tanh(u))
        inner = f"0.7978845608028654 * ({v} + 0.044715 * {v} * {v} * {v})"
        return f"0.5 * {v} * (2.0 - 2.0 / (tl.exp(2.0 * ({inner})) + 1.0))"
    return f"0.5 * {v} * (1.0 + tl.erf({v} * 0.7071067811865476))"


unary("gelu", _gelu_ref, _gelu, flops=8, attrs=("approximate",), shape=elementwise(_gelu_rule),
      pytorch="torch.nn.functional.gelu({0}, approximate={approximate})")


# --------------------------------------------------------------------------- pow


def _pow_ref(x, *, exponent: float):
    return torch.pow(x, exponent)


def _pow(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    (v,) = x
    e = attrs["exponent"]
    let = Let()
    if not dtype.is_floating_point:
        # an integer result: an integer to a non-negative integer power, by repeated squaring
        # (eager raises for a negative one; the frontend has refused it: this is a guard)
        if dtype == torch.bool or isinstance(e, float) or e < 0:
            raise Unsupported(f"pow of a {dtype} tensor to the power {e!r}")
        return let.done(int_power(let, v, int(e), dtype))
    return let.done(pow_float_scalar(let, v, float(e), dtype))


# pow.Tensor_Scalar has a handler in fx_ops.py: a complex exponent is not lowered
unary("pow", _pow_ref, _pow, attrs=("exponent",), pytorch="torch.pow({0}, {exponent})",
      aten=("pow.Tensor_Scalar",))


# --------------------------------------------------------------------------- clamp


def _clamp_ref(x, *, min: float | None, max: float | None):
    return torch.clamp(x, min=min, max=max)


def _clamp_rule(operands, attrs):
    both_none = attrs.get("min") is None and attrs.get("max") is None
    return None if both_none else same_float(operands, attrs)


def _clamp(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    out, nan = x[0], nan_arg(dtype)
    if attrs["min"] is not None:
        out = f"tl.maximum({out}, {py_literal(attrs['min'], dtype)}{nan})"
    if attrs["max"] is not None:
        out = f"tl.minimum({out}, {py_literal(attrs['max'], dtype)}{nan})"
    return out


# clamp with tensor bounds lowers to maximum/minimum (composite.py)
unary("clamp", _clamp_ref, _clamp, flops=2, attrs=("min", "max"), shape=elementwise(_clamp_rule),
      pytorch="torch.clamp({0}, min={min}, max={max})",
      aten=("clamp.default", "clamp_min.default", "clamp_max.default"))

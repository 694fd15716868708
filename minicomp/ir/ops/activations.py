"""Activations: elu (selu and celu are elus), leaky_relu, hardswish, hardsigmoid, hardtanh,
softplus, mish, logit.

Each is written the way eager's CPU kernel writes it (which branch a boundary value takes,
which operation comes first), so NaN and the infinities come out as eager's: `elu` takes
its negative branch for x <= 0, `softplus` switches to x above its threshold, `hardtanh` is
a clamp (min then max, NaN kept). Operands arrive in the compute type (fp32 for half types);
attributes are literals of it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.mathtext import INF, expm1, log1p, tanh_steps
from minicomp.ir.ops.rules import SAME_FLOAT
from minicomp.ir.ops.text import Let, Unsupported, nan_arg, py_literal


def _floats_only(name: str, dtype: torch.dtype) -> None:
    if not dtype.is_floating_point:
        raise Unsupported(f"{name} of {dtype} tensors")


def activation(name: str, ref, triton, *, attrs: tuple[str, ...] = (), flops: float = 4, pytorch: str | None = None,
               aten: tuple[str, ...] | None = None) -> OpDef:
    shown = "".join(f", {{{a}}}" for a in attrs)
    return register(OpDef(name, "pointwise", ref, flops_per_element=flops, triton=triton, attrs=attrs,
                          shape=SAME_FLOAT, pytorch=pytorch or f"torch.nn.functional.{name}({{0}}{shown})",
                          aten=(f"{name}.default",) if aten is None else aten))


def _elu_ref(x, *, alpha, scale, input_scale):
    return torch.ops.aten.elu(x, alpha, scale, input_scale)


def _elu(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    _floats_only("elu", dtype)
    (v,) = x
    lit = lambda k: py_literal(attrs[k], dtype)  # noqa: E731
    let = Let()
    neg = expm1(let, let("z", f"{v} * {lit('input_scale')}"))
    negcoef = py_literal(float(attrs["alpha"]) * float(attrs["scale"]), dtype)
    return let.done(f"tl.where({v} <= 0.0, {neg} * {negcoef}, {v} * {lit('scale')})")


# celu is elu(x, alpha, 1, 1 / alpha), as eager computes it (frontend/fx_ops_pointwise.py)
activation("elu", _elu_ref, _elu, attrs=("alpha", "scale", "input_scale"), flops=5,
           pytorch="torch.ops.aten.elu({0}, {alpha}, {scale}, {input_scale})", aten=("elu.default", "celu.default"))


def _leaky_relu_ref(x, *, negative_slope):
    return F.leaky_relu(x, negative_slope)


def _leaky_relu(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    _floats_only("leaky_relu", dtype)
    (v,) = x
    return f"tl.where({v} > 0.0, {v}, {v} * {py_literal(attrs['negative_slope'], dtype)})"


activation("leaky_relu", _leaky_relu_ref, _leaky_relu, attrs=("negative_slope",), flops=2)


def _hard_sigmoid_text(v: str) -> str:
    nan = nan_arg(torch.float32)
    return f"tl.minimum(tl.maximum({v} + 3.0, 0.0{nan}), 6.0{nan}) / 6.0"


def _hardsigmoid(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    _floats_only("hardsigmoid", dtype)
    return _hard_sigmoid_text(x[0])


def _hardswish(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    _floats_only("hardswish", dtype)
    return f"{x[0]} * {_hard_sigmoid_text(x[0])}"


activation("hardsigmoid", F.hardsigmoid, _hardsigmoid)
activation("hardswish", F.hardswish, _hardswish, flops=5)


def _hardtanh_ref(x, *, min_val, max_val):
    # aten's: F.hardtanh refuses min_val > max_val before aten sees it; the op is a clamp
    return torch.ops.aten.hardtanh.default(x, min_val, max_val)


def _hardtanh(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    if dtype == torch.bool:
        raise Unsupported("hardtanh of bool tensors")
    # eager's hardtanh is clamp(x, min_val, max_val): max first, then min
    nan = nan_arg(dtype)
    lo, hi = py_literal(attrs["min_val"], dtype), py_literal(attrs["max_val"], dtype)
    return f"tl.minimum(tl.maximum({x[0]}, {lo}{nan}), {hi}{nan})"


activation("hardtanh", _hardtanh_ref, _hardtanh, attrs=("min_val", "max_val"), flops=2)


def _softplus_ref(x, *, beta, threshold):
    return F.softplus(x, beta, threshold)


def _softplus(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    _floats_only("softplus", dtype)
    (v,) = x
    beta, threshold = py_literal(attrs["beta"], dtype), py_literal(attrs["threshold"], dtype)
    let = Let()
    z = let("z", f"{v} * {beta}")
    soft = log1p(let, let("e", f"tl.exp({z})"))
    return let.done(f"tl.where({z} > {threshold}, {v}, {soft} / {beta})")


activation("softplus", _softplus_ref, _softplus, attrs=("beta", "threshold"), flops=5)


def _mish(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    _floats_only("mish", dtype)
    (v,) = x
    let = Let()
    sp = log1p(let, let("e", f"tl.exp({v})"))
    return let.done(f"{v} * {tanh_steps(let, sp, dtype)}")


activation("mish", F.mish, _mish, flops=8)


def _logit_ref(x, *, eps):
    return torch.logit(x, eps)


def _logit(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
    _floats_only("logit", dtype)
    (v,) = x
    let = Let()
    eps = attrs["eps"]
    if eps is not None and eps >= 0:       # eager clamps to [eps, 1 - eps], both in the input's dtype
        lo = float(torch.tensor(float(eps), dtype=dtype))
        hi = float(torch.tensor(1.0, dtype=dtype) - lo)
        lo, hi = py_literal(lo, dtype), py_literal(hi, dtype)
        v = let("z", f"tl.where({v} < {lo}, {lo}, tl.where({v} > {hi}, {hi}, {v}))")
    return let.done(f"tl.where({v} == 1.0, {INF}, tl.log({v} / (1.0 - {v})))")


activation("logit", _logit_ref, _logit, attrs=("eps",), flops=3, pytorch="torch.logit({0}, {eps})")

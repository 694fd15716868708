"""aten handlers for pointwise ops that need more than the generic lowering: integer checks,
rounding modes, pow, index remaps, and the composites (glu, batch norm, the losses).

Same contract as `fx_ops`: handlers get a `Ctx` and schema-ordered arguments (tensors as `T`)
and return a node id, a list of ids for multi-output ops, or raise `Unmapped`.

Eager refuses some calls that fake tensors accept (capture may run on fake tensors: make_fx,
when the eager tracer declines), and minicomp would then compute an answer where eager has
none: an integer to a negative integer power, an integer division by a constant zero, a fill
value or bound that does not fit the dtype (`Ctx.fitting`), rounding an integer to decimals.
Those raise `MinicompError` here, at the user's line, with eager's reason.
"""

from __future__ import annotations

import torch

from minicomp.frontend.fx_table import Ctx, Handler, T, Unmapped, lowers
from minicomp.frontend.fx_ops_shapes import _slice
from minicomp.ir import composites
from minicomp.ir.dtypes import HALF_DTYPES


def _integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _has_zero(cx: Ctx, nid: int) -> bool:
    """Whether node `nid` is a constant (or `full`) holding a zero."""
    n = cx.graph.node(nid)
    if n.op == "constant":
        v = n.attrs["value"]
        return bool((v == 0).any()) if isinstance(v, torch.Tensor) else v == 0
    return n.op == "full" and n.attrs["value"] == 0


def _divide(cx: Ctx, op: str, x, other) -> int:
    a, b = cx.operand(x), cx.operand(other)
    if _integer(cx.out_dtype) and _has_zero(cx, b):
        raise cx.refuse(f"{op}: integer division by zero (eager raises RuntimeError: ZeroDivisionError)")
    return cx.add(op, a, b)


def _division(op: str) -> Handler:
    def lower(cx: Ctx, x, other):
        return _divide(cx, op, x, other)
    return lower


lowers("floor_divide.default", "floor_divide.Scalar")(_division("floor_divide"))
lowers("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor")(_division("remainder"))
lowers("fmod.Tensor", "fmod.Scalar")(_division("fmod"))

_ROUNDING = {None: "div", "floor": "floor_divide", "trunc": "div_trunc"}


@lowers("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx: Ctx, x, other, rounding_mode=None):
    if rounding_mode not in _ROUNDING:
        raise Unmapped(f"div rounding_mode={rounding_mode!r}")
    if rounding_mode is None:
        return cx.add("div", cx.operand(x), cx.operand(other))
    return _divide(cx, _ROUNDING[rounding_mode], x, other)


@lowers("pow.Tensor_Scalar")
def _pow(cx: Ctx, x, exponent):
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise Unmapped("complex exponent")
    if _integer(cx.out_dtype):
        if exponent < 0:
            raise cx.refuse("pow: integers to negative integer powers are not allowed "
                            "(eager raises RuntimeError)")
        cx.fitting(exponent, cx.out_dtype, "pow exponent")
    return cx.add("pow", x, exponent=exponent)


@lowers("round.default")
def _round(cx: Ctx, x):
    return cx.add("round", x, decimals=0)


@lowers("round.decimals")
def _round_decimals(cx: Ctx, x, decimals=0):
    if decimals and not cx.dtype(x).is_floating_point:
        raise cx.refuse(f"round(decimals={decimals}) of a {cx.dtype(x)} tensor "
                        "(eager raises NotImplementedError)")
    return cx.add("round", x, decimals=decimals)


def _lerp_operands(cx: Ctx, x) -> None:
    if not cx.dtype(x).is_floating_point:
        raise cx.refuse(f"lerp of a {cx.dtype(x)} tensor (eager raises NotImplementedError)")


@lowers("lerp.Scalar")
def _lerp_scalar(cx: Ctx, x, end, weight):
    # the weight takes the input's dtype (lerp does not promote); kernels compute it in fp32
    _lerp_operands(cx, x)
    return cx.add("lerp", x, cx.operand(end), cx.const(weight, dtype=cx.dtype(x)))


@lowers("lerp.Tensor")
def _lerp_tensor(cx: Ctx, x, end, weight):
    _lerp_operands(cx, x)
    return cx.add("lerp", x, cx.operand(end), cx.operand(weight))


@lowers("celu.default")
def _celu(cx: Ctx, x, alpha=1.0):
    if alpha == 0:
        raise cx.refuse("celu: alpha cannot be 0 (eager raises RuntimeError: ZeroDivisionError)")
    return cx.add("elu", x, alpha=alpha, scale=1.0, input_scale=1.0 / float(alpha))


# --------------------------------------------------------------------------- index remaps

@lowers("flip.default")
def _flip(cx: Ctx, x, dims):
    rank = len(cx.shape(x))
    dims = tuple(sorted({d % rank for d in dims})) if rank else ()
    dims = tuple(d for d in dims if cx.shape(x)[d] > 1)
    return cx.add("flip", x, dims=dims) if dims else x.id


@lowers("roll.default")
def _roll(cx: Ctx, x, shifts, dims=()):
    rank = len(cx.shape(x))
    shifts, dims = tuple(int(s) for s in shifts), tuple(int(d) % max(rank, 1) for d in dims)
    if not rank or not any(shifts):
        return x.id
    return cx.add("roll", x, shifts=shifts, dims=dims)


@lowers("constant_pad_nd.default")
def _constant_pad(cx: Ctx, x, pad, value=0):
    pad = tuple(int(p) for p in pad)
    value = cx.fitting(value, cx.dtype(x), "constant_pad_nd value")
    return cx.add("constant_pad", x, pad=pad, value=value) if any(pad) else x.id


# --------------------------------------------------------------------------- composites

@lowers("glu.default")
def _glu(cx: Ctx, x, dim=-1):
    shape = cx.shape(x)
    d = dim % len(shape)
    half = shape[d] // 2
    a = _slice(cx, x.id, d, 0, half, 1)
    b = _slice(cx, x.id, d, half, shape[d], 1)
    return cx.add("mul", a, cx.add("sigmoid", b))


def _batch_norm(cx: Ctx, x: T, weight, bias, mean, var, eps: float) -> int:
    """Inference batch norm as eager's CPU kernel writes it: y = x * a + b, a = w / sqrt(var + eps),
    b = bias - mean * a, over statistics broadcast along dim 1; half types computed in fp32."""
    if mean is None or var is None:
        raise Unmapped("batch norm without running statistics")
    shape = cx.shape(x)
    stat = (1, shape[1]) + (1,) * (len(shape) - 2)
    dt = cx.dtype(x)
    f = torch.float32 if dt in HALF_DTYPES else dt
    up = lambda v: cx.reshape(cx.cast(v, f), stat)  # noqa: E731
    a = cx.add("rsqrt", cx.add("add", up(var), cx.const(float(eps))))
    if weight is not None:
        a = cx.add("mul", a, up(weight))
    b = cx.add("mul", up(mean), a)
    b = cx.add("sub", up(bias), b) if bias is not None else cx.add("mul", b, cx.const(-1.0))
    return cx.cast(cx.add("add", cx.add("mul", cx.cast(x, f), a), b), dt)


@lowers("native_batch_norm.default")
def _native_batch_norm(cx: Ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        raise Unmapped("batch norm in training mode")
    return [_batch_norm(cx, x, weight, bias, running_mean, running_var, eps), None, None]


@lowers("_native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(cx: Ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return [_batch_norm(cx, x, weight, bias, running_mean, running_var, eps), None, None]


def _reduce_loss(cx: Ctx, elementwise: int, reduction: int) -> int:
    """aten's reduction enum: 0 none, 1 mean, 2 sum (over every axis)."""
    rank = len(cx.graph.node(elementwise).shape)
    if reduction == 0 or rank == 0:
        return elementwise
    if reduction not in (1, 2):
        raise Unmapped(f"loss reduction {reduction}")
    return composites.reduce(cx.graph, "mean" if reduction == 1 else "sum", elementwise, tuple(range(rank)),
                             False, origin=cx.origin)


@lowers("mse_loss.default")
def _mse_loss(cx: Ctx, x, target, reduction=1):
    d = cx.add("sub", x, target)
    return _reduce_loss(cx, cx.add("mul", d, d), reduction)


def _quadratic_then_linear(cx: Ctx, x, target, width: float, scale_quadratic: bool) -> int:
    """|d| < width: 0.5 d^2 (/ width for smooth_l1); else linear in |d| (eager's formulas, its
    constants in the operands' dtype, so 0-d operands are not promoted)."""
    z = cx.add("abs", cx.add("sub", x, target))
    if width == 0:
        return z                        # smooth_l1 with beta 0 is l1
    dt = cx.graph.node(z).dtype
    c = lambda v: cx.const(float(torch.tensor(v, dtype=dt)), dtype=dt)  # noqa: E731
    quad = cx.add("mul", cx.add("mul", z, z), c(0.5))
    if scale_quadratic:
        quad = cx.add("div", quad, c(width))
        lin = cx.add("sub", z, c(0.5 * width))
    else:
        lin = cx.add("mul", cx.add("sub", z, c(0.5 * width)), c(width))
    return cx.add("where", cx.add("lt", z, c(width)), quad, lin)


@lowers("smooth_l1_loss.default")
def _smooth_l1_loss(cx: Ctx, x, target, reduction=1, beta=1.0):
    return _reduce_loss(cx, _quadratic_then_linear(cx, x, target, beta, True), reduction)


@lowers("huber_loss.default")
def _huber_loss(cx: Ctx, x, target, reduction=1, delta=1.0):
    if delta <= 0:
        raise cx.refuse(f"huber_loss: delta={delta} must be positive (eager raises RuntimeError)")
    return _reduce_loss(cx, _quadratic_then_linear(cx, x, target, delta, False), reduction)

"""The aten -> minicomp lowering table used by the torch.fx frontend (`fx.py`).

This file holds the table's machinery and the pointwise, cast and reduction lowerings;
`fx_ops_shapes.py` adds composites, views, GEMMs and generators to the same table.

`LOWERINGS` maps an aten `OpOverload` (or one of minicomp's own tracing ops,
`minicomp::sdpa|matmul|linear`, see fx.py) to a handler. A handler receives a `Ctx` and the
call's arguments bound to the op's schema, in schema order with defaults filled in; a traced
tensor arrives as a `T` (an IR node id), anything else as the Python value aten saw.

A handler returns:
- a node id (`int`) for a single-output op — possibly an operand's id (identity ops);
- a list of `int | None` for a multi-output op; a `None` entry means "that output is not
  expressible", and the frontend computes it with an opaque node if something reads it;
- or raises `Unmapped` when this call's arguments cannot be expressed (a rounding mode, a
  dropout in training...): the frontend then emits an opaque node for the whole call.

Invariant: the frontend checks every handler result against the shape and dtype aten
produced (`Ctx.val`, a fake or meta tensor); a mismatch also falls back to opaque, so a handler
bug costs speed, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from minicomp.ir import composites
from minicomp.ir.graph import Graph

aten = torch.ops.aten


@dataclass(frozen=True)
class T:
    """A traced tensor: the IR node that holds its value."""
    id: int


class Unmapped(Exception):
    """This call cannot be expressed with registry ops: the frontend makes it opaque."""


@dataclass
class Ctx:
    graph: Graph
    origin: str | None
    val: Any          # what aten produced for this node (a fake or meta tensor: shape/dtype truth)

    def add(self, op: str, *args: int | T, **attrs: Any) -> int:
        return self.graph.add(op, *(_id(a) for a in args), origin=self.origin, **attrs)

    def const(self, value: Any, dtype: torch.dtype | None = None) -> int:
        return self.graph.constant(value, dtype=dtype, origin=self.origin)

    def operand(self, v: Any) -> int:
        """A tensor operand's id; a Python scalar becomes a 0-d constant (PyTorch's promotion)."""
        if isinstance(v, T):
            return v.id
        if isinstance(v, (bool, int, float)):
            return self.const(v)
        raise Unmapped(f"operand {v!r}")

    def shape(self, v: T) -> tuple[int, ...]:
        return self.graph.node(v.id).shape

    def dtype(self, v: T) -> torch.dtype:
        return self.graph.node(v.id).dtype

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.val.shape)

    @property
    def out_dtype(self) -> torch.dtype:
        return self.val.dtype

    def reshape(self, x: T | int, shape: tuple[int, ...]) -> int:
        x = _id(x)
        return x if self.graph.node(x).shape == tuple(shape) else self.add("reshape", x, shape=tuple(shape))

    def cast(self, x: T | int, dtype: torch.dtype) -> int:
        x = _id(x)
        return x if self.graph.node(x).dtype == dtype else self.add("cast", x, dtype=dtype)


def _id(v: int | T) -> int:
    return v.id if isinstance(v, T) else v


Handler = Callable[..., Any]
LOWERINGS: dict[Any, Handler] = {}


def _resolve(name: str) -> Any | None:
    """`"add.Tensor"` -> aten.add.Tensor; None when this PyTorch has no such overload."""
    packet, _, overload = name.partition(".")
    try:
        return getattr(getattr(aten, packet), overload or "default")
    except AttributeError:
        return None


def lowers(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for name in names:
            op = _resolve(name)
            if op is not None:
                LOWERINGS[op] = fn
        return fn
    return deco


def register(target: Any, fn: Handler) -> None:
    LOWERINGS[target] = fn


def mapped_op_names() -> list[str]:
    """The lowered targets as strings (`aten.add.Tensor`, ...), for reports and tests."""
    return sorted(str(t) for t in LOWERINGS)


# --------------------------------------------------------------------------- pointwise

def _binary(op: str) -> Handler:
    def lower(cx: Ctx, x, other):
        return cx.add(op, cx.operand(x), cx.operand(other))
    return lower


for _name in ("mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"):
    lowers(f"{_name}.Tensor", f"{_name}.Scalar", f"{_name}.default")(_binary(_name))
lowers("max.other")(_binary("maximum"))
lowers("min.other")(_binary("minimum"))


@lowers("logical_xor.default")
def _logical_xor(cx: Ctx, x, other):
    # xor of truth values: compare them as booleans
    return cx.add("ne", cx.cast(cx.operand(x), torch.bool), cx.cast(cx.operand(other), torch.bool))


def _bitwise(op: str) -> Handler:
    def lower(cx: Ctx, x, other):
        a, b = cx.operand(x), cx.operand(other)
        if cx.graph.node(a).dtype != torch.bool or cx.graph.node(b).dtype != torch.bool:
            raise Unmapped("bitwise op on integers")
        return cx.add(op, a, b)
    return lower


lowers("bitwise_and.Tensor", "bitwise_and.Scalar")(_bitwise("logical_and"))
lowers("bitwise_or.Tensor", "bitwise_or.Scalar")(_bitwise("logical_or"))
lowers("bitwise_xor.Tensor", "bitwise_xor.Scalar")(_bitwise("ne"))


def _add_sub(op: str) -> Handler:
    def lower(cx: Ctx, x, other, alpha=1):
        b = cx.operand(other)
        if alpha != 1:
            b = cx.add("mul", b, cx.const(alpha))
        return cx.add(op, cx.operand(x), b)
    return lower


lowers("add.Tensor", "add.Scalar")(_add_sub("add"))
lowers("sub.Tensor", "sub.Scalar")(_add_sub("sub"))


@lowers("rsub.Tensor", "rsub.Scalar")
def _rsub(cx: Ctx, x, other, alpha=1):
    # other - alpha * x
    a = cx.operand(x)
    if alpha != 1:
        a = cx.add("mul", a, cx.const(alpha))
    return cx.add("sub", cx.operand(other), a)


@lowers("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode")
def _div(cx: Ctx, x, other, rounding_mode=None):
    if rounding_mode is not None:
        raise Unmapped(f"div rounding_mode={rounding_mode!r}")
    return cx.add("div", cx.operand(x), cx.operand(other))


_UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "tanh", "sigmoid",
          "relu", "silu", "logical_not")
for _name in _UNARY:
    lowers(f"{_name}.default")(lambda cx, x, _op=_name: cx.add(_op, x))


@lowers("bitwise_not.default")
def _bitwise_not(cx: Ctx, x):
    if cx.dtype(x) != torch.bool:
        raise Unmapped("bitwise_not on integers")
    return cx.add("logical_not", x)


@lowers("positive.default")
def _identity1(cx: Ctx, x, *_):
    return x.id


@lowers("reciprocal.default")
def _reciprocal(cx: Ctx, x):
    return cx.add("div", cx.const(1.0), x)


@lowers("square.default")
def _square(cx: Ctx, x):
    return cx.add("mul", x, x)


@lowers("gelu.default")
def _gelu(cx: Ctx, x, approximate="none"):
    return cx.add("gelu", x, approximate=approximate)


@lowers("pow.Tensor_Scalar")
def _pow(cx: Ctx, x, exponent):
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise Unmapped("complex exponent")
    return cx.add("pow", x, exponent=exponent)


@lowers("clamp.default")
def _clamp(cx: Ctx, x, min=None, max=None):
    if min is None and max is None:
        return x.id
    return cx.add("clamp", x, min=min, max=max)


@lowers("clamp_min.default")
def _clamp_min(cx: Ctx, x, min):
    return cx.add("clamp", x, min=min, max=None)


@lowers("clamp_max.default")
def _clamp_max(cx: Ctx, x, max):
    return cx.add("clamp", x, min=None, max=max)


@lowers("clamp.Tensor")
def _clamp_tensor(cx: Ctx, x, min=None, max=None):
    y = x.id
    if min is not None:
        y = cx.add("maximum", y, cx.operand(min))
    if max is not None:
        y = cx.add("minimum", y, cx.operand(max))
    return y


@lowers("where.self")
def _where(cx: Ctx, cond, a, b):
    return cx.add("where", cx.cast(cx.operand(cond), torch.bool), cx.operand(a), cx.operand(b))


@lowers("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx: Ctx, x, mask, value):
    # the fill value takes x's dtype (masked_fill never promotes)
    v = cx.cast(value, cx.dtype(x)) if isinstance(value, T) else cx.const(value, dtype=cx.dtype(x))
    return cx.add("where", mask, v, x)


@lowers("fill.Scalar", "fill.Tensor")
def _fill(cx: Ctx, x, value):
    if isinstance(value, T):
        return cx.add("expand", cx.cast(value, cx.dtype(x)), shape=cx.shape(x))
    return cx.add("full", shape=cx.shape(x), value=value, dtype=cx.dtype(x))


# --------------------------------------------------------------------------- casts and identities

@lowers("_to_copy.default")
def _to_copy(cx: Ctx, x, dtype=None, *_rest):
    # device moves are ignored: a graph runs on its inputs' device
    return cx.cast(x, dtype) if dtype is not None else x.id


@lowers("to.dtype")
def _to_dtype(cx: Ctx, x, dtype, *_rest):
    return cx.cast(x, dtype)


@lowers("to.dtype_layout", "to.device")
def _to_any(cx: Ctx, x, *_rest):
    return cx.cast(x, cx.out_dtype)


for _name in ("clone.default", "contiguous.default", "alias.default", "detach.default",
              "lift_fresh_copy.default", "lift_fresh.default", "_conj.default", "resolve_conj.default",
              "resolve_neg.default"):
    lowers(_name)(_identity1)


@lowers("dropout.default")
def _dropout(cx: Ctx, x, p, train):
    if train and p > 0:
        raise Unmapped("dropout in training mode")
    return x.id


@lowers("native_dropout.default")
def _native_dropout(cx: Ctx, x, p, train):
    if train and p > 0:
        raise Unmapped("dropout in training mode")
    return [x.id, None]


# --------------------------------------------------------------------------- reductions

def _axes(dim, ndim: int) -> tuple[int, ...]:
    # aten spells "all axes" as None or []
    return tuple(range(ndim)) if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else dim


def _reduction(op: str) -> Handler:
    def lower(cx: Ctx, x, dim=None, keepdim=False, dtype=None):
        src = cx.cast(x, dtype) if dtype is not None else x.id
        return composites.reduce(cx.graph, op, src, _axes(dim, len(cx.shape(x))), keepdim, origin=cx.origin)
    return lower


def _reduce_all(op: str) -> Handler:
    def lower(cx: Ctx, x, dtype=None):
        src = cx.cast(x, dtype) if dtype is not None else x.id
        return composites.reduce(cx.graph, op, src, tuple(range(len(cx.shape(x)))), False, origin=cx.origin)
    return lower


lowers("sum.dim_IntList")(_reduction("sum"))
lowers("mean.dim")(_reduction("mean"))
lowers("sum.default")(_reduce_all("sum"))
lowers("mean.default")(_reduce_all("mean"))
lowers("amax.default")(_reduction("amax"))
lowers("amin.default")(_reduction("amin"))
lowers("max.default")(_reduce_all("amax"))
lowers("min.default")(_reduce_all("amin"))


def _value_of_pair(op: str) -> Handler:
    # max.dim/min.dim return (values, indices): values are a reduction, indices stay opaque
    def lower(cx: Ctx, x, dim, keepdim=False):
        return [composites.reduce(cx.graph, op, x.id, dim, keepdim, origin=cx.origin), None]
    return lower


lowers("max.dim")(_value_of_pair("amax"))
lowers("min.dim")(_value_of_pair("amin"))


def _var(cx: Ctx, x, dim, correction, keepdim) -> int:
    correction = 1 if correction is None else correction
    return composites.reduce(cx.graph, "var", x.id, _axes(dim, len(cx.shape(x))), keepdim,
                             origin=cx.origin, correction=correction)


@lowers("var.correction")
def _var_correction(cx: Ctx, x, dim=None, correction=None, keepdim=False):
    return _var(cx, x, dim, correction, keepdim)


@lowers("var.dim")
def _var_dim(cx: Ctx, x, dim, unbiased=True, keepdim=False):
    return _var(cx, x, dim, int(unbiased), keepdim)


@lowers("var.default")
def _var_all(cx: Ctx, x, unbiased=True):
    return _var(cx, x, None, int(unbiased), False)


@lowers("std.correction")
def _std_correction(cx: Ctx, x, dim=None, correction=None, keepdim=False):
    return cx.add("sqrt", _var(cx, x, dim, correction, keepdim))


@lowers("std.dim")
def _std_dim(cx: Ctx, x, dim, unbiased=True, keepdim=False):
    return cx.add("sqrt", _var(cx, x, dim, int(unbiased), keepdim))


# The other half of the table registers itself into LOWERINGS on import.
from minicomp.frontend import fx_ops_shapes  # noqa: E402,F401

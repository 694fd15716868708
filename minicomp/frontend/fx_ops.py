"""The aten -> minicomp lowering table used by the torch.fx frontend (`fx.py`).

Which aten overloads lower, and to what, is the op table's (`minicomp/ir/ops`: `OpDef.aten`
and the composites' `aten`, collected in `ops.ATEN`). The machinery (`Ctx`, `T`, `Unmapped`,
`lowers`, `direct`) is `fx_table.py`'s, which every handler module imports; this file holds
the pointwise and cast handlers, imports the other handler modules and builds `LOWERINGS`:
- a name claimed by an op lowers generically (`direct`): the call's first `arity` arguments
  become the operands (a Python scalar becomes a 0-d constant, PyTorch's promotion) and the
  schema arguments named like the op's attributes become its attributes;
- a name with a handler (`@lowers`: pointwise and casts here, `fx_ops_pointwise.py` for
  rounding modes, pow, index remaps and the pointwise composites, `fx_ops_reductions.py`,
  `fx_ops_shapes.py` for composites, views, GEMMs and generators, `fx_ops_indexing.py` for
  embedding, indexing and gather) lowers through it: alpha
  arguments, rounding modes, axes, views, composites. `lowers` refuses a name the table does
  not claim, so every lowered aten op is listed in `docs/ops.md`.

A handler receives a `Ctx` and the call's arguments bound to the op's schema, in schema order
with defaults filled in; a traced tensor arrives as a `T` (an IR node id), anything else as
the Python value aten saw. It returns:
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

from typing import Any

import torch

# the machinery, read here too by the table's users (ops_doc, tests): this module is the table
from minicomp.frontend.fx_table import (HANDLERS, Ctx, Handler, T, Unmapped, build_lowerings, direct,  # noqa: F401
                                        lowers, resolve, table_name)

LOWERINGS: dict[Any, Handler] = {}     # OpOverload -> handler, built from the table at the end of this module


def register(target: Any, fn: Handler) -> None:
    LOWERINGS[target] = fn


def mapped_op_names() -> list[str]:
    """The lowered targets as strings (`aten.add.Tensor`, ...), for reports and tests."""
    return sorted(str(t) for t in LOWERINGS)


# --------------------------------------------------------------------------- pointwise
# Binary and unary ops without a handler here lower generically (`direct`).

@lowers("logical_xor.default")
def _logical_xor(cx: Ctx, x, other):
    # xor of truth values: compare them as booleans
    return cx.add("ne", cx.cast(cx.operand(x), torch.bool), cx.cast(cx.operand(other), torch.bool))


def _add_sub(op: str) -> Handler:
    def lower(cx: Ctx, x, other, alpha=1):
        b = cx.operand(other)
        cx.fitting(alpha, cx.out_dtype, f"{op} alpha")
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
    cx.fitting(alpha, cx.out_dtype, "rsub alpha")
    if alpha != 1:
        a = cx.add("mul", a, cx.const(alpha))
    return cx.add("sub", cx.operand(other), a)


# div with a rounding mode, and the integer checks of division, are in fx_ops_pointwise.py

@lowers("positive.default")
def _identity1(cx: Ctx, x, *_):
    return x.id


@lowers("reciprocal.default")
def _reciprocal(cx: Ctx, x):
    return cx.add("div", cx.const(1.0), x)


@lowers("square.default")
def _square(cx: Ctx, x):
    return cx.add("mul", x, x)


@lowers("clamp.default")
def _clamp(cx: Ctx, x, min=None, max=None):
    if min is None and max is None:
        return x.id
    cx.fitting(min, cx.out_dtype, "clamp min")
    cx.fitting(max, cx.out_dtype, "clamp max")
    return cx.add("clamp", x, min=min, max=max)


@lowers("clamp_min.default")
def _clamp_min(cx: Ctx, x, min):
    return cx.add("clamp", x, min=cx.fitting(min, cx.out_dtype, "clamp_min min"), max=None)


@lowers("clamp_max.default")
def _clamp_max(cx: Ctx, x, max):
    return cx.add("clamp", x, min=None, max=cx.fitting(max, cx.out_dtype, "clamp_max max"))


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
    v = (cx.cast(value, cx.dtype(x)) if isinstance(value, T)
         else cx.const(cx.fitting(value, cx.dtype(x), "masked_fill value"), dtype=cx.dtype(x)))
    return cx.add("where", mask, v, x)


@lowers("fill.Scalar", "fill.Tensor")
def _fill(cx: Ctx, x, value):
    if isinstance(value, T):
        return cx.add("expand", cx.cast(value, cx.dtype(x)), shape=cx.shape(x))
    return cx.add("full", shape=cx.shape(x), value=cx.fitting(value, cx.dtype(x), "fill value"), dtype=cx.dtype(x))


# --------------------------------------------------------------------------- casts and identities

@lowers("_to_copy.default")
def _to_copy(cx: Ctx, x, dtype=None, *_rest):
    # device moves are ignored: a graph runs on its inputs' device
    return cx.cast(x, dtype) if dtype is not None else x.id


@lowers("to.dtype", "prims::convert_element_type.default")
def _to_dtype(cx: Ctx, x, dtype, *_rest):
    return cx.cast(x, dtype)


@lowers("to.dtype_layout", "to.device")
def _to_any(cx: Ctx, x, *_rest):
    return cx.cast(x, cx.out_dtype)


# (not aten._conj: PyTorch calls it only for complex tensors, which it conjugates)
for _name in ("clone.default", "contiguous.default", "alias.default", "detach.default",
              "lift_fresh_copy.default", "lift_fresh.default", "resolve_conj.default", "resolve_neg.default"):
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


# The other handlers register themselves on import; then the table is complete.
from minicomp.frontend import fx_ops_indexing, fx_ops_pointwise, fx_ops_reductions, fx_ops_shapes  # noqa: E402,F401,I001

LOWERINGS.update(build_lowerings())

"""The aten -> minicomp lowering table used by the torch.fx frontend (`fx.py`).

Which aten overloads lower, and to what, is the op table's (`minicomp/ir/ops`: `OpDef.aten`
and the composites' `aten`, collected in `ops.ATEN`). This file builds `LOWERINGS` from it:
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

from dataclasses import dataclass
from typing import Any, Callable

import torch

from minicomp.errors import MinicompError
from minicomp.frontend import fx_trace  # noqa: F401  (defines the minicomp:: stand-ins the table names)
from minicomp.ir import ops
from minicomp.ir.graph import Graph
from minicomp.ir.ops.text import fits, wrap_int

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
        if isinstance(v, int) and not isinstance(v, bool) and not fits(v, torch.int64):
            # beside a float tensor it is that float; eager unpacks it as a 64-bit pattern for an
            # integer one (2**63 wraps to -2**63) and refuses it from 2**64 on
            if self.out_dtype.is_floating_point:
                return self.const(float(v))
            if not -2**63 <= v < 2**64:
                raise self.refuse(f"the scalar {v} does not fit 64 bits (eager raises RuntimeError: Overflow)")
            return self.const(wrap_int(v, torch.int64))
        if isinstance(v, (bool, int, float)):
            out = self.val.dtype if isinstance(self.val, torch.Tensor) and self.val.dim() == 0 else None
            if out is not None and out != torch.bool and _category(v) <= _category(out):
                # every operand is 0-d: a Python scalar must not promote them (int8[] << 3 is int8),
                # so it becomes a constant of the result's type, converted as eager converts it
                return self.const(wrap_int(v, out) if not out.is_floating_point else v, dtype=out)
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

    def refuse(self, what: str) -> MinicompError:
        """The error for a call eager refuses (fake tensors, which capture may run on, do not check)."""
        return MinicompError(f"{self.origin + ': ' if self.origin else ''}{what}")

    def fitting(self, value: Any, dtype: torch.dtype, what: str) -> Any:
        """`value`, if eager converts it to `dtype` (a fill value, a bound, alpha); else eager's error.
        Python scalars that are operands wrap instead (`int8 * 300`): those never come here."""
        if value is not None and not isinstance(value, T) and not fits(value, dtype):
            raise self.refuse(f"{what}={value!r} does not fit {dtype} (eager raises RuntimeError: value "
                              "cannot be converted without overflow)")
        return value


def _category(v: Any) -> int:
    """bool < int < float, for a Python scalar or a dtype."""
    if isinstance(v, torch.dtype):
        return 0 if v == torch.bool else 2 if v.is_floating_point or v.is_complex else 1
    return 0 if isinstance(v, bool) else 1 if isinstance(v, int) else 2


def _id(v: int | T) -> int:
    return v.id if isinstance(v, T) else v


Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}      # table name ("add.Tensor") -> the handler written for it
LOWERINGS: dict[Any, Handler] = {}     # OpOverload -> handler, built from the table below


def resolve(name: str) -> Any | None:
    """`"add.Tensor"` -> aten.add.Tensor, `"minicomp::sdpa.default"` -> its OpOverload; None
    when this PyTorch has no such overload."""
    namespace, _, rest = name.rpartition("::")
    packet, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace or "aten"), packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def table_name(target: Any) -> str:
    """How the op table spells an overload: `add.Tensor`, `minicomp::sdpa.default`."""
    ns = "" if target.namespace == "aten" else f"{target.namespace}::"
    return f"{ns}{target.overloadpacket.__name__}.{target._overloadname}"


def lowers(*names: str) -> Callable[[Handler], Handler]:
    """Write the handler for aten overloads the op table claims (`ops.ATEN`)."""
    def deco(fn: Handler) -> Handler:
        for name in names:
            if name not in ops.ATEN:
                raise KeyError(f"{name}: no op table entry claims it (add it to an OpDef's or Composite's aten)")
            HANDLERS[name] = fn
        return fn
    return deco


def register(target: Any, fn: Handler) -> None:
    LOWERINGS[target] = fn


def direct(d: ops.OpDef, target: Any) -> Handler:
    """The generic lowering of `target` to op `d`: its first `d.arity` arguments are the
    operands, the rest are `d`'s attributes by name."""
    schema = target._schema
    names = [a.name for a in schema.arguments]
    n = d.arity
    if (n is None or sorted(names[n:]) != sorted(d.attrs)
            or [str(r.type) for r in schema.returns] != ["Tensor"]):
        raise TypeError(f"{target} ({schema}) does not fit op {d.name!r} (operands then attributes "
                        f"{', '.join(d.attrs) or 'none'}); write its handler with @lowers")
    attr_names = names[n:]

    def lower(cx: Ctx, *args):
        operands = [cx.operand(a) for a in args[:n]]
        return cx.add(d.name, *operands, **dict(zip(attr_names, args[n:])))
    lower.__name__ = f"lower_{d.name}"
    return lower


def build_lowerings() -> dict[Any, Handler]:
    """Every overload the table claims that this PyTorch has -> its handler."""
    out: dict[Any, Handler] = {}
    for name, owner in ops.ATEN.items():
        target = resolve(name)
        if target is None:
            continue      # tests/test_optable.py checks that every claimed name resolves
        if name in HANDLERS:
            out[target] = HANDLERS[name]
        elif owner in ops.REGISTRY:
            out[target] = direct(ops.REGISTRY[owner], target)
        else:
            raise TypeError(f"{name} lowers to the composite {owner!r}, which needs a handler (@lowers)")
    return out


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


@lowers("to.dtype")
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

"""The machinery of the aten -> minicomp lowering table (`fx_ops.py` builds the table).

`Ctx` (what a handler is given), `T` (a traced tensor), `Unmapped` (this call is opaque), the
`lowers` decorator and its registry `HANDLERS` (table name -> handler), `direct` (the generic
lowering of an op the table claims) and `build_lowerings` (every claimed overload -> its
handler). The handler modules (`fx_ops.py` and `fx_ops_*.py`) import this module and register
their handlers; `fx_ops.py` imports them all and then builds `LOWERINGS`, so no module of the
table imports the one that imports it.

Invariant: `lowers` refuses a name the op table (`ops.ATEN`) does not claim.
"""


from dataclasses import dataclass
from typing import Any, Callable

import torch

from minicomp.errors import MinicompError
from minicomp.frontend import fx_trace  # noqa: F401  (defines the minicomp:: stand-ins the table names)
from minicomp.ir import dims, ops
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
        """A tensor operand's id; a Python scalar becomes a 0-d constant (PyTorch's promotion),
        a size over symbols (a SymInt: `arange(past, past + n)` decomposes to `arange(n) + past`)
        a 0-d int64 `size_value` that kernels compute from their size arguments."""
        if isinstance(v, T):
            return v.id
        if dims.is_symbolic(v):
            return self.add("size_value", value=v)
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
        symbols = getattr(self.graph, "symbols", None)      # SymInts as dims (fx_symbolic.py)
        return symbols.shape(self.val) if symbols is not None else tuple(int(d) for d in self.val.shape)

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

"""The DSL's builtin functions: each maps onto registry ops or `minicomp.ir.composites`.

A builtin is a Python function whose first parameter is the `Emit` context and whose
other parameters are the DSL-visible ones. Their annotations (`Tensor`, `int`, `Axes`,
`Shape`, `Dtype`, ...) are not decoration: `bind_call` reads them to convert and check
each argument, so `sum(x, axis=1.5)` fails with a message that names `axis` and points at
it. Every pointwise registry op without attributes (exp, maximum, where, ...) is a builtin
with no code here (`_register_pointwise`), except the registry's own spellings of what a
builtin writes (`dsl_hints.INTERNAL_OPS`: div_trunc is div's rounding_mode="trunc",
pow_tensor is pow with a tensor exponent), which are not DSL names.

Invariants:
- values flowing through the lowering are `TensorVal` (a graph node) or plain Python
  values known at compile time (int, float, bool, str, list, torch.dtype);
- pointwise ops whose operands are all Python numbers are folded (`dsl_limits.fold`: ints
  exactly, within 64 bits; floats in float64) and never reach the graph (`sqrt(D)` with
  a bound symbol D is a number);
- builtins report bad arguments with `CallError`; `Graph.add` reports operands that do
  not fit with ValueError. The lowering turns both into SourceError at the right column.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from minicomp.frontend.dsl_hints import INTERNAL_OPS, unknown_keyword
from minicomp.frontend.dsl_limits import division_by_zero, fold, kernel_refuses
from minicomp.ir import dims, ops
from minicomp.ir.dtypes import dtype_name
from minicomp.ir.graph import Graph, Node


@dataclass(frozen=True)
class TensorVal:
    """A tensor value: the graph node that computes it."""

    nid: int


Value = Any  # TensorVal | int | float | bool | str | list | torch.dtype | tuple (several returns)


class CallError(Exception):
    """A call's arguments are wrong; `arg` names the argument to point at (None: the call)."""

    def __init__(self, message: str, arg: str | None = None):
        super().__init__(message)
        self.message = message
        self.arg = arg


@dataclass
class Emit:
    """What a builtin needs to build nodes: the graph and the origin of the call."""

    g: Graph
    origin: str

    def add(self, op: str, *args: int, **attrs: Any) -> TensorVal:
        return TensorVal(self.g.add(op, *args, origin=self.origin, **attrs))

    def node(self, nid: int) -> Node:
        return self.g.node(nid)

    def rank(self, nid: int) -> int:
        return len(self.g.node(nid).shape)


def describe(v: Value, g: Graph) -> str:
    """How an error message names a value: `f32[4, 8]`, `int 3`, `string "tanh"`."""
    if isinstance(v, TensorVal):
        return g.node(v.nid).type
    if isinstance(v, dims.Expr):
        return f"the symbolic size {v} (a number only once --dim binds it)"
    if isinstance(v, bool):
        return f"bool {'true' if v else 'false'}"
    if isinstance(v, (int, float)):
        return f"{type(v).__name__} {v}"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, torch.dtype):
        return f"dtype {dtype_name(v)}"
    if isinstance(v, list):
        return "list [" + ", ".join(describe(x, g) for x in v) + "]"
    if isinstance(v, tuple):
        return f"{len(v)} values"
    return type(v).__name__


# ------------------------------------------------------------------ argument kinds

# Annotation names used as argument kinds (read from the signatures below).
Tensor = int          # a node id after conversion; Python numbers become constants
Axes = Any            # int or list of ints
Shape = tuple         # list of ints
Dtype = torch.dtype   # a bare dtype name in the source: cast(x, bf16)
Number = Any          # int, float or bool


def _is_int(v: Value) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Value) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _to_tensor(e: Emit, v: Value) -> int | None:
    if isinstance(v, TensorVal):
        return v.nid
    if isinstance(v, (bool, int, float)):
        return e.g.constant(v, origin=e.origin)
    return None


def _convert(e: Emit, kind: str, v: Value) -> tuple[bool, Any]:
    """(ok, converted value) for an argument of the given kind."""
    if kind.endswith(" | None"):
        if v is None:
            return True, None
        kind = kind[: -len(" | None")]
    if kind == "Tensor":
        nid = _to_tensor(e, v)
        return nid is not None, nid
    if kind == "list[Tensor]":
        if not isinstance(v, list) or not v:
            return False, None
        nids = [_to_tensor(e, x) for x in v]
        return all(n is not None for n in nids), nids
    if kind == "int":
        return _is_int(v), v
    if kind == "float":
        return _is_number(v), float(v) if _is_number(v) else None
    if kind == "Number":
        return isinstance(v, (int, float, bool)), v
    if kind == "bool":
        return isinstance(v, bool), v
    if kind == "str":
        return isinstance(v, str), v
    if kind == "Dtype":
        return isinstance(v, torch.dtype), v
    if kind == "Shape":      # sizes: ints, or symbolic sizes of a program planned over symbols
        ok = isinstance(v, list) and all(_is_int(x) or isinstance(x, dims.Expr) for x in v)
        return ok, tuple(v) if ok else None
    if kind == "Axes":
        if _is_int(v):
            return True, v
        ok = isinstance(v, list) and bool(v) and all(_is_int(x) for x in v)
        return ok, tuple(v) if ok else None
    if kind == "Value":
        return True, v
    raise AssertionError(f"unknown argument kind {kind!r}")


_KIND_WORDS = {
    "Tensor": "a tensor or a number", "list[Tensor]": "a list of tensors", "int": "an int",
    "float": "a number", "Number": "a number or a bool", "bool": "true or false", "str": "a string",
    "Dtype": "a dtype name (f32, bf16, ...)", "Shape": "a list of ints",
    "Axes": "an int or a list of ints",
}


# ------------------------------------------------------------------ the table


REQUIRED = inspect.Parameter.empty


@dataclass
class BParam:
    name: str
    kind: str
    default: Any = REQUIRED


@dataclass
class Builtin:
    name: str
    params: list[BParam]
    fn: Callable[..., Value]

    def signature(self) -> str:
        parts = [p.name if p.default is REQUIRED else f"{p.name}={_show_default(p.default)}"
                 for p in self.params]
        return f"{self.name}({', '.join(parts)})"


def _show_default(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return "none" if v is None else str(v)


BUILTINS: dict[str, Builtin] = {}


def builtin(name: str | None = None) -> Callable:
    """Register a Python function as a DSL builtin; its annotations give the argument kinds."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [BParam(p.name, str(p.annotation), p.default) for p in list(sig.parameters.values())[1:]]
        key = name or fn.__name__.lstrip("_")
        BUILTINS[key] = Builtin(key, params, fn)
        return fn

    return wrap


def bind_args(fname: str, names: Sequence[str], defaults: Sequence[Any],
              args: Sequence[Value], kwargs: Sequence[tuple[str, Value]]) -> dict[str, Value]:
    """Match positional and keyword arguments to parameter names (defaults fill the rest).

    `defaults[i]` is `inspect.Parameter.empty` for a required parameter. CallError names the
    offending argument: `arg` is the parameter name, or `#i` for an extra positional one.
    """
    if len(args) > len(names):
        raise CallError(f"{fname}() takes {_count(len(names), 'argument')} "
                        f"({', '.join(names)}), got {len(args)}", arg=f"#{len(names)}")
    bound = dict(zip(names, args))
    for key, v in kwargs:
        if key not in names:
            raise CallError(f"{fname}() has no argument named '{key}' (its arguments: "
                            f"{', '.join(names) or 'none'}){unknown_keyword(key, names)}", arg=key)
        if key in bound:
            raise CallError(f"{fname}() got argument '{key}' twice", arg=key)
        bound[key] = v
    missing = [n for n, d in zip(names, defaults) if n not in bound and d is REQUIRED]
    if missing:
        raise CallError(f"{fname}() is missing argument{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(m) for m in missing)}")
    for n, d in zip(names, defaults):
        bound.setdefault(n, d)
    return bound


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def call_builtin(e: Emit, b: Builtin, args: Sequence[Value], kwargs: Sequence[tuple[str, Value]]) -> Value:
    bound = bind_args(b.name, [p.name for p in b.params], [p.default for p in b.params], args, kwargs)
    converted = {}
    for p in b.params:
        v = bound[p.name]
        if v is p.default:  # defaults are trusted (None is a legal default)
            converted[p.name] = v
            continue
        ok, cv = _convert(e, p.kind, v)
        if not ok:
            want = _KIND_WORDS.get(p.kind.replace(" | None", ""), p.kind)
            raise CallError(f"argument '{p.name}' of {b.name}() must be {want}, got {describe(v, e.g)}",
                            arg=p.name)
        converted[p.name] = cv
    return b.fn(e, **converted)


# ------------------------------------------------------------------ pointwise (with folding)


def broadcast_error(g: Graph, nids: Sequence[int]) -> str | None:
    """A readable message when the operands' shapes do not broadcast, else None."""
    shapes = [g.node(n).shape for n in nids]
    rank = max(len(s) for s in shapes)
    for i in range(1, rank + 1):
        sizes = {s[-i] for s in shapes if len(s) >= i and s[-i] != 1}
        if len(sizes) > 1:
            types = " and ".join(g.node(n).type for n in nids)
            return f"shapes {types} do not broadcast (dimension {-i}: {' vs '.join(map(str, sorted(sizes)))})"
    return None


def pointwise(e: Emit, op: str, values: Sequence[Value], **attrs: Any) -> Value:
    """Apply a pointwise registry op to DSL values, folding when all are numbers."""
    if all(isinstance(v, (int, float, bool)) for v in values):
        return fold(op, list(values), attrs)
    nids = []
    for i, v in enumerate(values):
        nid = _to_tensor(e, v)
        if nid is None:
            raise CallError(f"expected a tensor or a number, got {describe(v, e.g)}", arg=f"#{i}")
        nids.append(nid)
    msg = broadcast_error(e.g, nids) or kernel_refuses(op, [e.node(n).dtype for n in nids], attrs)
    if msg:
        raise CallError(msg)
    out = e.add(op, *nids, **attrs)
    want = _weak_scalar_dtype(e, op, values, attrs)
    if want is not None and want != e.node(out.nid).dtype:
        out = e.add("cast", out.nid, dtype=want)
    if len(nids) == 2:  # a zero divisor known now: refused, as eager and the fx frontend refuse it
        d = e.node(nids[1])
        msg = division_by_zero(op, d.attrs if d.op in ("constant", "full") else None, e.node(out.nid).dtype)
        if msg:
            raise CallError(msg)
    return out


def _weak_scalar_dtype(e: Emit, op: str, values: Sequence[Value], attrs: dict[str, Any]) -> torch.dtype | None:
    """The dtype PyTorch gives `op` with its numbers as Python scalars, which never promote a
    tensor of their own kind: `x + 0.5` on an f16[] x is f16, though a 0-d f32 constant would
    make it f32 (tensor operands of rank > 0 already win). None when PyTorch cannot say."""
    if not any(isinstance(v, (bool, int, float)) for v in values):
        return None
    args = [torch.empty(dims.hints(e.node(v.nid).shape), dtype=e.node(v.nid).dtype, device="meta")
            if isinstance(v, TensorVal) else v for v in values]
    try:
        return ops.get(op).ref(*args, **attrs).dtype
    except (RuntimeError, TypeError, ValueError, OverflowError):
        return None


# The operands' names, by arity, and for the ops whose operands are not alike.
_POINTWISE_NAMES = {1: ("x",), 2: ("a", "b"), 3: ("a", "b", "c")}
_OPERAND_NAMES = {"where": ("cond", "a", "b"), "lerp": ("start", "end", "weight")}


def _register_pointwise() -> None:
    for name, d in ops.REGISTRY.items():
        if d.kind != "pointwise" or d.attrs or not d.arity or name in INTERNAL_OPS:
            continue
        params = [BParam(n, "Value") for n in _OPERAND_NAMES.get(name, _POINTWISE_NAMES[d.arity])]
        BUILTINS[name] = Builtin(name, params, lambda e, _op=name, **kw: pointwise(e, _op, list(kw.values())))


_register_pointwise()


@builtin()
def _gelu(e: Emit, x: Value, approximate: str = "none") -> Value:
    if approximate not in ("none", "tanh"):
        raise CallError(f'approximate must be "none" or "tanh", got "{approximate}"', arg="approximate")
    return pointwise(e, "gelu", [x], approximate=approximate)


_ROUNDING = {None: "div", "trunc": "div_trunc", "floor": "floor_divide"}


@builtin()
def _div(e: Emit, a: Value, b: Value, rounding_mode: str | None = None) -> Value:
    if rounding_mode not in _ROUNDING:
        raise CallError(f'rounding_mode must be "trunc" or "floor" (or left out), got "{rounding_mode}"',
                        arg="rounding_mode")
    return pointwise(e, _ROUNDING[rounding_mode], [a, b])


@builtin()
def _pow(e: Emit, x: Value, exponent: Value) -> Value:
    if isinstance(exponent, TensorVal):  # torch.pow(x, t) and torch.pow(2.0, t)
        return pointwise(e, "pow_tensor", [x, exponent])
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise CallError(f"argument 'exponent' of pow() must be a tensor, an int or a float, got "
                        f"{describe(exponent, e.g)}", arg="exponent")
    return pointwise(e, "pow", [x], exponent=exponent)


@builtin()
def _clamp(e: Emit, x: Value, min: float | None = None, max: float | None = None) -> Value:
    if min is None and max is None:
        raise CallError("clamp() needs min= or max=")
    return pointwise(e, "clamp", [x], min=min, max=max)


@builtin()
def _cast(e: Emit, x: Tensor, dtype: Dtype) -> Value:
    if e.node(x).dtype == dtype:  # `cast(h, f32)` on an f32 h: nothing to do
        return TensorVal(x)
    return e.add("cast", x, dtype=dtype)


@builtin()
def _type_as(e: Emit, x: Tensor, other: Tensor) -> Value:
    return _cast(e, x, e.node(other).dtype)


@builtin()
def _tril(e: Emit, x: Tensor, diagonal: int = 0) -> Value:
    return e.add("tril", x, diagonal=diagonal)


@builtin()
def _triu(e: Emit, x: Tensor, diagonal: int = 0) -> Value:
    return e.add("triu", x, diagonal=diagonal)


# ------------------------------------------------------------------ the rest, registered on import

from minicomp.frontend import dsl_nn, dsl_views  # noqa: E402,F401

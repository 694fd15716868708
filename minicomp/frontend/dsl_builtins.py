"""The DSL's builtin functions: each maps onto registry ops or `minicomp.ir.composites`.

A builtin is a Python function whose first parameter is the `Emit` context and whose
other parameters are the DSL-visible ones (the `builtin` decorator and the rest of the
table's machinery are `dsl_table.py`'s). Their annotations (`Tensor`, `int`, `Axes`,
`Shape`, `Dtype`, ...) are not decoration: `call_builtin` reads them to convert and check
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

from typing import Any, Sequence

import torch

from minicomp.frontend.dsl_hints import INTERNAL_OPS
from minicomp.frontend.dsl_limits import division_by_zero, fold, kernel_refuses
# the machinery (dsl_table.py), read here too by the table's users (dsl.py, dsl_doc.py, tests)
from minicomp.frontend.dsl_table import (BUILTINS, REQUIRED, BParam, Builtin, CallError, Dtype, Emit,  # noqa: F401
                                         Tensor, TensorVal, Value, _KIND_WORDS, _show_default, _to_tensor,
                                         bind_args, builtin, call_builtin, describe)
from minicomp.ir import dims, ops
from minicomp.ir.graph import Graph


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

"""The machinery of the DSL's builtin table (`dsl_builtins.py` is the table).

What a builtin is given and returns (`Emit`, `TensorVal`, `Value`), how it reports bad
arguments (`CallError`), the argument kinds its annotations name (`Tensor`, `Axes`, `Shape`,
`Dtype`, `Number`), the `builtin` decorator and its registry `BUILTINS`, and the binding of a
call's arguments to a builtin's parameters (`bind_args`, `call_builtin`). The builtin modules
(`dsl_builtins.py`, `dsl_nn.py`, `dsl_views.py`) import this module and register theirs;
`dsl_builtins.py` imports the others, so the table is complete once it is imported and no
module of the table imports the one that imports it.

Invariant: an annotation is an argument kind `_convert` knows; any other fails at the call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from minicomp.frontend.dsl_hints import unknown_keyword
from minicomp.ir import dims
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

"""Symbolic dims of the DSL: binding them (from `--dim` and example inputs) and checking types.

A type `bf16[M, N]` has a dtype and dims that are int literals or symbols. `unify` matches
a concrete (shape, dtype) against a type: literals must equal, a bound symbol must equal
its value, an unbound one is bound (remembering where from, for the message when another
tensor disagrees). The entry function's symbols are bound before lowering; an inlined
function binds its own from its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from minicomp.frontend.dsl_ast import FuncDef, Pos, Source, TypeSpec
from minicomp.frontend.dsl_limits import INT64_MAX, fits_int64, shown_int
from minicomp.ir import dims as dims_
from minicomp.ir.dtypes import NAME_TO_DTYPE, dtype_name, parse_dtype, type_str


@dataclass
class Bound:
    value: int
    source: str   # where the value came from: "--dim", "dim 0 of 'x'", "dim 1 of argument 't'"


class Mismatch(Exception):
    """A value does not fit a declared type. `detail` explains; `conflict`: a symbol disagrees."""

    def __init__(self, detail: str, pos: Pos, conflict: bool = False):
        super().__init__(detail)
        self.detail, self.pos, self.conflict = detail, pos, conflict


def unify(spec: TypeSpec, shape: tuple[int, ...], dtype: torch.dtype, symbols: dict[str, Bound], who: str) -> None:
    """Check (shape, dtype) against `spec`, binding its unbound symbols in `symbols`."""
    want = parse_dtype(spec.dtype)
    if dtype != want:
        raise Mismatch(f" (dtype {dtype_name(dtype)} is not {dtype_name(want)})", spec.pos)
    if len(shape) != len(spec.dims):
        raise Mismatch(f" (rank {len(shape)}, not {len(spec.dims)})", spec.pos)
    for i, (d, size) in enumerate(zip(spec.dims, shape)):
        if isinstance(d.value, int):
            if d.value != size:
                raise Mismatch(f" (dimension {i} is {size}, not {d.value})", d.pos)
            continue
        old = symbols.get(d.value)
        here = f"dim {i} of {who}"
        if old is None:
            symbols[d.value] = Bound(size, here)
        elif old.value != size:
            raise Mismatch(f"symbol {d.value} is bound inconsistently: {d.value}={old.value} from "
                           f"{old.source}, but {d.value}={size} from {here}", d.pos, conflict=True)


def shown(spec: TypeSpec, symbols: dict[str, Bound]) -> str:
    """`spec` with bound symbols replaced by their values: `bf16[4, N]`."""
    dims = [str(symbols[d.value].value) if isinstance(d.value, str) and d.value in symbols else str(d.value)
            for d in spec.dims]
    return f"{spec.dtype}[{', '.join(dims)}]"


def check_dtypes(src: Source, funcs: Iterable[FuncDef]) -> None:
    """Every dtype name in every signature is known."""
    for f in funcs:
        for spec in [p.type for p in f.params] + list(f.returns or []):
            if parse_dtype(spec.dtype) is None:
                known = ", ".join(NAME_TO_DTYPE)
                raise src.error(f"unknown dtype '{spec.dtype}' (known: {known})", spec.pos)


def _symbols_of(f: FuncDef) -> dict[str, Pos]:
    """The entry's parameter symbols, each with its first position, in order of appearance."""
    out: dict[str, Pos] = {}
    for p in f.params:
        for d in p.type.dims:
            if isinstance(d.value, str):
                out.setdefault(d.value, d.pos)
    return out


def bind_symbols(src: Source, f: FuncDef, dims: dict[str, int],
                 example_inputs: Sequence[torch.Tensor] | None, symbolic: bool = False) -> dict[str, Bound]:
    """Values for the entry function's symbols; SourceError if they disagree, or if one is
    missing and not `symbolic`. With `symbolic`, a symbol neither `--dim` nor an example input
    binds stays a symbol (`dims.sym`, range [2, 2**31 - 1]): the graph serves every size."""
    params = _symbols_of(f)
    returns_only = {d.value for t in (f.returns or []) for d in t.dims if isinstance(d.value, str)} - set(params)
    symbols: dict[str, Bound] = {}
    for name, value in dims.items():
        if name not in params and name not in returns_only:
            known = ", ".join(params) or "none"
            raise src.error(f"--dim {name}={value}: '{f.name}' has no symbol {name} (its symbols: {known})", f.pos)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise src.error(f"--dim {name}={value}: a dimension must be a non-negative integer", f.pos)
        if not fits_int64(value):
            raise src.error(f"--dim {name}={shown_int(value)}: a dimension must fit in 64 bits (at most "
                            f"{INT64_MAX})", f.pos)
        symbols[name] = Bound(value, "--dim")
    if example_inputs is not None:
        if len(example_inputs) != len(f.params):
            names = ", ".join(p.name for p in f.params)
            raise src.error(f"'{f.name}' takes {len(f.params)} input(s) ({names}), got "
                            f"{len(example_inputs)} example input(s)", f.pos)
        for p, t in zip(f.params, example_inputs):
            if not isinstance(t, torch.Tensor):
                raise src.error(f"example input for '{p.name}' must be a tensor, got {type(t).__name__}", p.pos)
            try:
                unify(p.type, tuple(t.shape), t.dtype, symbols, f"'{p.name}'")
            except Mismatch as m:
                msg = m.detail if m.conflict else (
                    f"example input '{p.name}' is {type_str(tuple(t.shape), t.dtype)}, but '{p.name}' is "
                    f"declared {p.type}{m.detail}")
                raise src.error(msg, m.pos) from None
    unbound = [s for s in params if s not in symbols]
    if unbound and symbolic:
        for s in unbound:           # a DSL symbol is an identifier (the grammar's NAME)
            symbols[s] = Bound(dims_.sym(s), "symbolic")
        return symbols
    if unbound:
        flags = " ".join(f"--dim {s}=VALUE" for s in unbound)
        plural = "s" if len(unbound) > 1 else ""
        raise src.error(f"unbound symbol{plural} {', '.join(unbound)}: give example inputs or {flags}",
                        params[unbound[0]])
    return symbols

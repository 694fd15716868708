"""Symbolic sizes from PyTorch: fake inputs with chosen dims dynamic, and PyTorch's SymInts as
minicomp's dims (minicomp/ir/dims.py).

Two sources hand minicomp graphs with symbolic sizes: `minicomp.compile(fn, dynamic=...)`,
which traces with make_fx over fake inputs whose chosen dimensions are dynamic
(`fake_inputs`), and the Dynamo backend, whose graphs Dynamo made dynamic after a shape
changed. Both carry `torch.SymInt`s, each an expression of PyTorch's ShapeEnv symbols
(`s0`, `s27`: sympy). `Symbols` turns them into `dims.Expr`s over `dims.Sym`s of the same
names, with the ShapeEnv's ranges and hints.

What a graph over symbols must not lose are the ShapeEnv's guards: facts the trace assumed
about the sizes (`Eq(s3, s5)` where two dims broadcast, `s3 > 64` where user code branched
on a size). A compiled module re-checks only what its shapes say (each input dim equal to
its expression, each symbol in its range), which covers equalities between symbols and
symbols equal to constants, and every fact the symbols' ranges imply (the ShapeEnv narrows a
symbol's range with a guard such as `s3 <= 512`), but no other fact. An equality that the ShapeEnv's replacements
make an identity (`Eq(s76 + 1, s30 + 1)` once s76 is replaced by s30) is such a fact too:
both dims are written over the one symbol. `check_guards` refuses any other guard, and the
caller compiles for concrete sizes instead. A disequality on one input size (`Ne(s, 3)`) can
be made such a fact: `narrowings` gives the range on the hint's side of it, and the caller
traces again over that range (`fake_inputs(..., ranges)`), where the ShapeEnv knows it holds.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from minicomp.ir import dims

_MAX = dims.INT_MAX


class Symbols:
    """PyTorch's SymInts and sympy expressions as `dims.Dim`s (one table per traced graph)."""

    def __init__(self) -> None:
        self.table: dict[str, dims.Sym] = {}

    def dim(self, v: Any) -> "dims.Dim":
        """An int, or the Expr of a SymInt (SymbolicDim for what is not a polynomial)."""
        if isinstance(v, bool):
            raise dims.SymbolicDim(f"a bool where a size was expected: {v}")
        if isinstance(v, int):
            return v
        if isinstance(v, torch.SymInt):
            node = v.node
            expr = node.shape_env.simplify(node.expr) if getattr(node, "shape_env", None) is not None else node.expr
            return self._convert(expr, node.shape_env)
        raise dims.SymbolicDim(f"{type(v).__name__} {v!r} is not a size")

    def shape(self, t: torch.Tensor) -> tuple:
        return tuple(self.dim(d) for d in t.shape)

    def _convert(self, e: Any, env: Any) -> "dims.Dim":
        import sympy
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return self._sym(e, env)
        if e.is_Add:
            out: dims.Dim = 0
            for a in e.args:
                out = out + self._convert(a, env)
            return out
        if e.is_Mul:
            out = 1
            for a in e.args:
                out = out * self._convert(a, env)
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base, out = self._convert(e.base, env), 1
            for _ in range(int(e.exp)):
                out = out * base
            return out
        raise dims.SymbolicDim(f"the size {e} is not a polynomial of the symbols (a {type(e).__name__})")

    def _sym(self, s: Any, env: Any) -> dims.Expr:
        name = str(s)
        if name not in self.table:
            lo, hi, hint = 2, _MAX, 1024
            if env is not None:
                lo, hi = _range(env, s)
                hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
                if s in hints:
                    hint = int(hints[s])
            hint = min(max(hint, lo), hi)
            if lo > hi:
                raise dims.SymbolicDim(f"symbol {name} ranges over [{lo}, {hi}]")
            self.table[name] = dims.Sym(name, lo, hi, hint)
        return dims.Expr({(self.table[name],): 1})


def _range(env: Any, s: Any) -> tuple[int, int]:
    """The ShapeEnv's range of symbol `s` as sizes: at least 2, at most INT_MAX."""
    vr = env.var_to_range.get(s)
    if vr is None:
        return 2, _MAX
    return max(2, _finite(vr.lower, 2)), min(_MAX, _finite(vr.upper, _MAX))


def _finite(v: Any, default: int) -> int:
    if getattr(v, "is_Integer", False) or isinstance(v, int):
        return int(v)
    return default                      # int_oo, sympy.oo: unbounded


def fake_inputs(tensors: Sequence[torch.Tensor], dynamic: Sequence[Iterable[int]],
                ranges: dict[tuple[int, int], tuple[int, int]] | None = None) -> list[torch.Tensor]:
    """Fake copies of `tensors` whose dims `dynamic[i]` are symbols (each its own: a trace
    that needs two equal finds out and says so in a guard); other dims stay as they are.
    `ranges` narrows the symbol of (input, dim) to [lo, hi] before anything is traced
    (`narrowings`: what a first trace's disequality guards ask)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    out = []
    for t, dyn in zip(tensors, dynamic):
        dyn = set(dyn)
        sizes = [DimDynamic.DYNAMIC if i in dyn and t.shape[i] >= 2 else DimDynamic.STATIC for i in range(t.dim())]
        out.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    for (i, d), (lo, hi) in (ranges or {}).items():
        size = out[i].shape[d]
        if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
            env.constrain_symbol_range(size.node.expr, lo, hi)
    return out


def narrowings(shape_env: Any, fakes: Sequence[torch.Tensor]) -> dict[tuple[int, int], tuple[int, int]]:
    """For each guard `Ne(s, c)` on one input symbol (`x[:, -3:]`: PyTorch asks whether the
    slice's stride equals its length, true only at s = 3), the range of s on the side of c its
    hint is on, keyed by the (input, dim) that holds s. A module over those ranges re-checks
    the guard (any s in them differs from c); a size on the other side compiles again. Empty
    when there is no such guard."""
    if shape_env is None:
        return {}
    import sympy
    where: dict[Any, tuple[int, int]] = {}
    for i, t in enumerate(fakes):
        for d, size in enumerate(t.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                where.setdefault(size.node.expr, (i, d))
    hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for guard in getattr(shape_env, "guards", ()):
        e = guard.expr
        excluded = _excluded_value(e) if isinstance(e, sympy.Ne) else None
        if excluded is None:
            continue
        sym, c = excluded
        if sym not in where or sym not in hints:
            continue
        key = where[sym]
        lo, hi = out.get(key) or _range(shape_env, sym)
        out[key] = (max(lo, int(c) + 1), hi) if int(hints[sym]) > int(c) else (lo, min(hi, int(c) - 1))
    return out


def shape_env_of(tensors: Sequence[torch.Tensor]) -> Any:
    for t in tensors:
        for d in t.shape:
            if isinstance(d, torch.SymInt):
                return d.node.shape_env
    return None


def _excluded_value(e: Any) -> tuple[Any, int] | None:
    """(s, c) when disequality `e` says only s != c for sizes (each symbol at least 2):
    `Ne(s49, 3)`, or `Ne(s36*s49, 3*s36)` (the same, times another size); else None."""
    import sympy
    factors = sympy.factor(e.args[0] - e.args[1]).as_ordered_factors()
    left = [f for f in factors if not (f.is_Symbol or (f.is_Integer and f != 0))]   # sizes and numbers are not 0
    if len(left) != 1 or len(left[0].free_symbols) != 1:
        return None
    (sym,) = left[0].free_symbols
    poly = sympy.Poly(left[0], sym)
    if poly.degree() != 1 or abs(poly.coeffs()[0]) != 1:
        return None
    a, b = poly.all_coeffs()
    c = -b / a
    return (sym, int(c)) if c.is_Integer else None


def check_guards(shape_env: Any) -> None:
    """SymbolicDim unless every guard the trace recorded is an equality a compiled module over
    symbols re-checks (a symbol equal to a symbol or to a constant)."""
    if shape_env is None:
        return
    import sympy
    for guard in getattr(shape_env, "guards", ()):
        e = guard.expr
        if isinstance(e, sympy.Eq) and all(a.is_Symbol or a.is_Integer for a in e.args):
            continue
        if isinstance(e, sympy.Eq) and sympy.expand(shape_env.simplify(e.args[0] - e.args[1])) == 0:
            # `Eq(s76 + 1, s30 + 1)` (two caches' lengths, each plus the new token): the ShapeEnv
            # replaced one symbol by the other, so both inputs' dims are written over one
            # symbol (`Symbols.dim` simplifies) and call() checks that they are equal
            continue
        if _within_ranges(e, shape_env):
            continue
        raise dims.SymbolicDim(f"the trace assumed {e} about the sizes (a module over symbols checks only "
                               "which sizes are equal and that each symbol is in its range)")


def _within_ranges(e: Any, shape_env: Any) -> bool:
    """Whether inequality `e` holds wherever each symbol is in the range the ShapeEnv keeps for
    it. A guard on one symbol (`s49 <= 512`, from `position_ids[:, :seq_len]`) refines that
    range; `Symbols` builds the module's ranges from those (or narrower ones) and call() checks
    them, so such a guard is re-checked."""
    import sympy
    from torch.utils._sympy.value_ranges import bound_sympy
    if not isinstance(e, sympy.core.relational.Relational):
        return False
    return bound_sympy(e, shape_env.var_to_range).lower is sympy.true     # true at both ends of every range


def symbolic_dims(shapes: Sequence[Sequence[int]]) -> list[set[int]]:
    """Which dims differ between the shapes a function has been called with (per argument)."""
    first = shapes[0]
    return [{i for i in range(len(s)) if any(len(o) == len(s) and o[i] != s[i] for o in shapes[1:])}
            for s in first]


def shape_of(g: Any, val: torch.Tensor) -> tuple:
    """`val`'s shape as dims (SymInts as Exprs: fx_symbolic.py)."""
    return g.symbols.shape(val) if getattr(g, "symbols", None) is not None else tuple(val.shape)


def no_symbols(a: Any) -> Any:
    if dims.is_symbolic(a):
        raise dims.SymbolicDim(f"an op minicomp runs through PyTorch takes the size {a}")
    return a

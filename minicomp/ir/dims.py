"""Dimensions: an int, or a polynomial over named size symbols with known ranges.

A graph whose inputs have symbolic sizes (a DSL program without `--dim`, a function compiled
with `dynamic=True`) carries `Expr`s in its shapes. One compiled plan then serves every size
in the symbols' ranges; the sizes reach the kernels as runtime arguments.

Invariants:
- a `Dim` is an `int` or an `Expr`; an expression that is a constant is always an `int` (every
  operation normalises), so `d == 3`, `isinstance(d, int)` and dict keys work as before;
- an `Expr` is a polynomial with integer coefficients over `Sym`s (sizes, element counts,
  contiguous strides and byte counts are all of that form: `B*S*2048`); floor division and
  remainder exist only where they are exact (`(B*S*H) // H == B*S`);
- a `Sym`'s range starts at 2 or above. Sizes 0 and 1 are never symbolic, as in Dynamo:
  broadcasting and empty tensors change the code, so a call with such a size gets a static
  compile of its own;
- equality is structural: `S == 64` is False (a special case for one size is not taken, and
  the general code serves every size); `S*H == H*S` is True;
- nothing silently picks a value: `int(e)`, `bool(e)` and orderings (`<`, `<=`) that the
  ranges do not decide raise `SymbolicDim`, naming the expression. Code that is not ready for symbols fails
  loudly, and the caller can specialise instead; `hint(d)` is the explicit way to ask for the
  representative value the cost model plans at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Union

from minicomp.errors import MinicompError

INT_MAX = 2**31 - 1        # the largest size a symbol ranges to by default (int32 kernel indices)


class SymbolicDim(MinicompError):
    """Code that needs a concrete size met a symbolic one (the message says which and where)."""


@dataclass(frozen=True, order=True)
class Sym:
    """A size symbol: its name, its range [lo, hi] and the hint the cost model plans at."""
    name: str
    lo: int = 2
    hi: int = INT_MAX
    hint: int = 1024

    def __post_init__(self) -> None:
        if not (2 <= self.lo <= self.hint <= self.hi):
            raise ValueError(f"symbol {self.name}: need 2 <= lo <= hint <= hi, got {self.lo}, {self.hint}, {self.hi}")


Monomial = tuple[Sym, ...]          # sorted, with repeats for powers; () is the constant term


def _mono_str(m: Monomial) -> str:
    return "*".join(s.name for s in m)


class Expr:
    """A non-constant polynomial in size symbols. Build with `sym(...)` and arithmetic."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms: tuple[tuple[Monomial, int], ...] = tuple(sorted(
            ((m, c) for m, c in terms.items() if c), key=lambda t: (-len(t[0]), t[0])))
        self._hash = hash(self.terms)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def make(terms: Mapping[Monomial, int]) -> "Dim":
        live = {m: c for m, c in terms.items() if c}
        if not live:
            return 0
        if set(live) == {()}:
            return live[()]
        return Expr(live)

    def _items(self) -> dict[Monomial, int]:
        return dict(self.terms)

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: "Dim") -> "Dim":
        out = self._items()
        for m, c in _terms(other).items():
            out[m] = out.get(m, 0) + c
        return Expr.make(out)

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return Expr.make({m: -c for m, c in self.terms})

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-other if isinstance(other, Expr) else -_num(other))

    def __rsub__(self, other: "Dim") -> "Dim":
        return (-self) + other

    def __mul__(self, other: "Dim") -> "Dim":
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(other).items():
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return Expr.make(out)

    __rmul__ = __mul__

    def __truediv__(self, other: float) -> "Expr":
        """Scaling by a number (the ledger's bytes / bandwidth); a size divides with //."""
        return Expr.make({m: c / _num(other) for m, c in self.terms})

    def __floordiv__(self, other: "Dim") -> "Dim":
        q = exact_div(self, other)
        if q is None:
            raise SymbolicDim(f"{self} // {other} is not exact: the size would depend on the symbols' values")
        return q

    def __mod__(self, other: "Dim") -> "Dim":
        if exact_div(self, other) is None:
            raise SymbolicDim(f"{self} % {other} is not known to be 0")
        return 0

    # ------------------------------------------------------------------ comparison
    def __eq__(self, other: object) -> bool:
        # structural: a symbol is never equal to a constant (constants are ints, never Exprs).
        # Code asking `d == 64` for a special case takes the general one, which serves every size.
        if isinstance(other, Expr):
            return self.terms == other.terms
        if isinstance(other, int):
            return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return self._hash

    def _cmp(self, other: "Dim", op: str) -> bool:
        lo, hi = bounds(self - other)       # decide the sign of the difference from the ranges
        verdicts = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0),
                    ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}
        yes, no = verdicts[op]
        if yes or no:
            return yes
        raise SymbolicDim(f"whether {self} {op} {other} depends on the symbols' values")

    def __lt__(self, other: "Dim") -> bool:
        return self._cmp(other, "<")

    def __le__(self, other: "Dim") -> bool:
        return self._cmp(other, "<=")

    def __gt__(self, other: "Dim") -> bool:
        return self._cmp(other, ">")

    def __ge__(self, other: "Dim") -> bool:
        return self._cmp(other, ">=")

    # ------------------------------------------------------------------ no silent values
    def __bool__(self) -> bool:
        lo, hi = bounds(self)
        if lo > 0 or hi < 0:
            return True
        raise SymbolicDim(f"whether {self} is 0 depends on the symbols' values")

    def __int__(self) -> int:
        raise SymbolicDim(f"a concrete size is needed here, and {self} is symbolic")

    __index__ = __int__

    # ------------------------------------------------------------------ text
    def __str__(self) -> str:
        parts: list[str] = []
        for m, c in self.terms:
            mag = abs(c)
            mag = int(mag) if isinstance(mag, float) and mag.is_integer() and mag < 2**53 else mag
            mag = f"{mag:.4g}" if isinstance(mag, float) else mag
            body = _mono_str(m) if m else str(mag)
            if m and mag != 1:
                body = f"{mag}*{body}"
            parts.append(("-" if c < 0 else "") + body if not parts else (" - " if c < 0 else " + ") + body)
        return "".join(parts)

    def __repr__(self) -> str:
        return str(self)         # valid Python over the symbols' names: tuples of dims print as code

    def __format__(self, spec: str) -> str:
        # a number's format (`.3f`) does not fit a polynomial: coefficients print to 4 digits
        return str(self)


Dim = Union[int, Expr]


def _int(d: object) -> int:
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"a dimension is an int or an Expr, not {type(d).__name__}")
    return d


def _num(d: object) -> float:
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        raise TypeError(f"a size is a number or an Expr, not {type(d).__name__}")
    return d


def _terms(d: "Dim | float") -> dict[Monomial, float]:
    return d._items() if isinstance(d, Expr) else {(): _num(d)}


def sym(name: str, lo: int = 2, hi: int = INT_MAX, hint: int | None = None) -> Expr:
    """The expression of one new symbol (`hint` defaults to 1024 clamped into the range)."""
    h = min(max(1024 if hint is None else hint, lo), hi)
    return Expr({(Sym(name, lo, hi, h),): 1})


def is_size(d: object) -> bool:
    """An int (not a bool) or a symbolic size."""
    return (isinstance(d, int) and not isinstance(d, bool)) or isinstance(d, Expr)


def lone_symbol(d: object) -> "Sym | None":
    """The symbol when `d` is exactly one symbol (`S`, not `2*S` or `S + 1`), else None."""
    if isinstance(d, Expr) and len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1:
        return d.terms[0][0][0]
    return None


def is_symbolic(d: object) -> bool:
    return isinstance(d, Expr)


def any_symbolic(dims) -> bool:
    return any(isinstance(d, Expr) for d in dims)


def symbols(*dims: Dim) -> tuple[Sym, ...]:
    """The symbols the dims use, sorted by name."""
    out: set[Sym] = set()
    for d in dims:
        if isinstance(d, Expr):
            for m, _ in d.terms:
                out.update(m)
    return tuple(sorted(out))


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The value of `d` with each symbol's value from `env` (by name)."""
    if not isinstance(d, Expr):
        return _int(d)
    return sum(c * math.prod(env[s.name] for s in m) for m, c in d.terms)


def hint(d: Dim) -> int:
    """The value the cost model plans at: every symbol at its hint."""
    if not isinstance(d, Expr):
        return _num(d)
    return sum(c * math.prod(s.hint for s in m) for m, c in d.terms)


def hints(shape) -> tuple[int, ...]:
    return tuple(hint(d) for d in shape)


def map_exprs(value, fn):
    """`value` with every Expr in it (nested in tuples, lists, dicts) replaced by `fn(expr)`."""
    if isinstance(value, Expr):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_exprs(v, fn) for v in value)
    if isinstance(value, list):
        return [map_exprs(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_exprs(v, fn) for k, v in value.items()}
    return value


def hinted(value):
    """`value` with every Expr in it replaced by its hint."""
    return map_exprs(value, hint)


def substitute(d: Dim, env: Mapping[Sym, "Dim"]) -> Dim:
    """`d` with each symbol in `env` replaced by its value there (an int or an expression)."""
    if not isinstance(d, Expr):
        return d
    out: Dim = 0
    for m, c in d.terms:
        term: Dim = c
        for s in m:
            term = term * (env[s] if s in env else Expr({(s,): 1}))
        out = out + term
    return out


def ratio(part: Dim, whole: Dim) -> float:
    """part / whole as a number: exact where the quotient is a constant, else at the hints."""
    if not whole:
        return 0.0
    q = exact_div(part, whole) if isinstance(part, Expr) or isinstance(whole, Expr) else None
    if q is not None and not isinstance(q, Expr):
        return float(q)
    return hint(part) / hint(whole)


def smin(a: "Dim | float", b: "Dim | float") -> "Dim | float":
    """min for sizes and ledger figures: decided by the ranges where they decide, else at the
    hints (ledger estimates only: never use it where the choice changes what code computes)."""
    try:
        return a if a <= b else b
    except SymbolicDim:
        return a if hint(a) <= hint(b) else b


def smax(a: "Dim | float", b: "Dim | float") -> "Dim | float":
    try:
        return a if a >= b else b
    except SymbolicDim:
        return a if hint(a) >= hint(b) else b


def bounds(d: Dim) -> tuple[float, float]:
    """The least and greatest values `d` takes over the symbols' ranges (hi may be inf only in
    principle: ranges are finite)."""
    if not isinstance(d, Expr):
        return _int(d), _int(d)
    lo = hi = 0
    for m, c in d.terms:
        tlo, thi = math.prod(s.lo for s in m), math.prod(s.hi for s in m)   # every symbol >= 2 > 0
        lo += c * (tlo if c > 0 else thi)
        hi += c * (thi if c > 0 else tlo)
    return lo, hi


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """a / b when it is exact for every value of the symbols (b a single term), else None."""
    bt = _terms(b)
    if len(bt) != 1:
        return a // b if not isinstance(a, Expr) and not isinstance(b, Expr) and b and a % b == 0 else None
    (bm, bc), = bt.items()
    if bc == 0:
        return None
    out: dict[Monomial, int] = {}
    for m, c in _terms(a).items():
        rest = list(m)
        for s in bm:
            if s not in rest:
                return None
            rest.remove(s)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return Expr.make(out)


def numel(shape) -> Dim:
    n: Dim = 1
    for d in shape:
        n = n * d
    return n


class _OwnNames(dict):
    def __missing__(self, key: str) -> str:
        return key          # generated code names each size after its module symbol (codegen/sizes.rename)


OWN_NAMES = _OwnNames()     # `py(d, OWN_NAMES)`: a size as generated code's text over its size names


def py(d: Dim, names: Mapping[str, str]) -> str:
    """Python text computing `d` from variables named `names[sym.name]` (never a user's name:
    the caller maps symbols to its own identifiers)."""
    if not isinstance(d, Expr):
        return str(_int(d))
    parts = []
    for m, c in d.terms:
        factors = [names[s.name] for s in m]
        if c != 1 or not factors:
            factors.insert(0, str(c))
        parts.append(" * ".join(factors))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]

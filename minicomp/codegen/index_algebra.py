"""The index expressions' algebra: atoms, `Expr`, simplification and rendering.

An `Expr` is an integer linear combination of atoms plus a constant. Atoms are `Sym`
(a kernel index variable: `offs`, `rows`, `cols`, with an exclusive bound), `FloorDiv`
and `Mod` of an Expr by a positive constant, and `Indirect`: a coordinate the kernel reads
from an index tensor. codegen/indexing.py builds `Index`es (and moves them through views)
from these; its docstring states the invariants both keep: simplification is exact inside
the valid domain, and over symbolic sizes a simplification is taken only where it holds for
every value of the sizes (`known`, `_divides`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

from minicomp.ir import dims as D


def known(thunk: Callable[[], bool]) -> bool:
    """Whether a comparison holds for every value of the symbolic sizes (False when they do
    not settle it: the caller keeps the general form)."""
    try:
        return bool(thunk())
    except D.SymbolicDim:
        return False


def _divides(c, k) -> bool:
    """c divides k for every value of the sizes."""
    if not D.is_symbolic(c) and not D.is_symbolic(k):
        return k % c == 0
    return D.exact_div(k, c) is not None


def _quot(k, c):
    """k / c where `_divides(c, k)`."""
    return k // c if not D.is_symbolic(c) and not D.is_symbolic(k) else D.exact_div(k, c)


@dataclass(frozen=True)
class Sym:
    name: str
    hi: int              # valid values are 0 .. hi-1


@dataclass(frozen=True)
class FloorDiv:
    arg: "Expr"
    div: int


@dataclass(frozen=True)
class Mod:
    arg: "Expr"
    div: int


@dataclass(frozen=True)
class Indirect:
    """A coordinate loaded at run time: the value of integer node `nid` at the element
    `dims` of its `shape` (one Expr per dim), brought into [0, `size`) by `wrap` ("none": it
    is there already; "wrap": negative values count from the end; "modulo": taken mod size).
    `cond` is the condition the load sits under (a `cat` piece), so the index tensor is read
    only where the value is. That the values do lie in range is the caller's promise: `call()`
    checks the index tensor first, or its static range says so (codegen/indirect.py)."""
    nid: int
    shape: tuple[int, ...]
    dims: tuple["Expr", ...]
    size: int
    wrap: str = "none"
    cond: object = None


Atom = Union[Sym, FloorDiv, Mod, Indirect]


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Atom, int], ...] = ()   # (atom, coefficient), sorted, no zero coefficients
    const: int = 0

    def __add__(self, other: "Expr | int") -> "Expr":
        other = as_expr(other)
        d = dict(self.terms)
        for a, k in other.terms:
            d[a] = d.get(a, 0) + k
        return make(d, self.const + other.const)

    def __sub__(self, other: "Expr | int") -> "Expr":
        return self + as_expr(other) * -1

    def __mul__(self, k: int) -> "Expr":
        return make({a: c * k for a, c in self.terms}, self.const * k)

    def is_const(self) -> bool:
        return not self.terms

    def single_atom(self) -> Atom | None:
        """The atom when the expr is exactly `1 * atom`."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None


def as_expr(x: "Expr | int") -> Expr:
    return x if isinstance(x, Expr) else Expr((), x if D.is_symbolic(x) else int(x))


def sym(name: str, hi: int) -> Expr:
    return Expr(((Sym(name, hi), 1),), 0)


def _atom_key(a: Atom) -> str:
    return repr(a)


def make(d: dict, const: int) -> Expr:
    d = {a: k for a, k in d.items() if k != 0}
    d, extra = _recombine(d)
    return Expr(tuple(sorted(d.items(), key=lambda t: _atom_key(t[0]))), const + extra)


def _recombine(d: dict) -> tuple[dict, int]:
    """x//c*c + x%c -> x, and (x//a % b)*a + x%a -> x % (a*b), with any common coefficient.

    Returns the new terms and the constant that expanding `x` contributed."""
    extra = 0
    changed = True
    while changed:
        changed = False
        for atom, k in list(d.items()):
            if not isinstance(atom, Mod) or atom not in d:
                continue
            x, c = atom.arg, atom.div
            fd = FloorDiv(x, c)
            if d.get(fd) == k * c:
                del d[atom], d[fd]
                for a2, k2 in x.terms:
                    d[a2] = d.get(a2, 0) + k * k2
                extra += k * x.const
                d = {a: kk for a, kk in d.items() if kk != 0}
                changed = True
                break
            # (x // a % b) * a  +  x % a  ->  x % (a*b)
            inner = x.single_atom()
            if isinstance(inner, FloorDiv):
                low = Mod(inner.arg, inner.div)
                if d.get(low) is not None and d.get(atom) == d[low] * inner.div:
                    kk = d[low]
                    del d[atom], d[low]
                    merged = Mod(inner.arg, inner.div * c)
                    d[merged] = d.get(merged, 0) + kk
                    changed = True
                    break
    return d, extra


def bounds(e: Expr) -> tuple[int, int]:
    """Inclusive (lo, hi) of `e` over the valid domain."""
    lo = hi = e.const
    for a, k in e.terms:
        alo, ahi = _atom_bounds(a)
        if known(lambda: k > 0):
            lo, hi = lo + k * alo, hi + k * ahi
        elif known(lambda: k < 0):
            lo, hi = lo + k * ahi, hi + k * alo
        else:
            raise D.SymbolicDim(f"the sign of the index coefficient {k} depends on the sizes")
    return lo, hi


def _atom_bounds(a: Atom) -> tuple[int, int]:
    if isinstance(a, Sym):
        return 0, (a.hi - 1 if D.is_symbolic(a.hi) else max(a.hi - 1, 0))    # a symbol is >= 2
    if isinstance(a, Indirect):
        return 0, (a.size - 1 if D.is_symbolic(a.size) else max(a.size - 1, 0))
    lo, hi = bounds(a.arg)
    if isinstance(a, FloorDiv):
        if not D.is_symbolic(a.div) and not D.is_symbolic(lo) and not D.is_symbolic(hi):
            return lo // a.div, hi // a.div
        least = D.bounds(a.div)[0]                   # the divisor is at least this (>= 1)
        if known(lambda: lo >= 0):
            low = 0
        elif not D.is_symbolic(lo):
            low = lo // least                        # lo < 0: x / c >= lo / c_min
        else:
            raise D.SymbolicDim(f"bounds of ({lo}..{hi}) // {a.div} over symbolic sizes")
        if known(lambda: hi >= 0):
            q = D.exact_div(hi, a.div)
            if q is None and D.exact_div(hi + 1, a.div) is not None:
                # hi + 1 == q1 * div (an index below a product of sizes): hi // div == q1 - 1, exactly
                return low, D.exact_div(hi + 1, a.div) - 1
            return low, q if q is not None else hi   # loose where not exact, never too small
        if not D.is_symbolic(hi):
            return low, -1                           # every value is negative: its floor quotient too
        raise D.SymbolicDim(f"bounds of ({lo}..{hi}) // {a.div} over symbolic sizes")
    if known(lambda: lo >= 0):
        if known(lambda: a.div - 1 <= hi):
            return 0, a.div - 1
        return 0, hi if known(lambda: hi <= a.div - 1) else a.div - 1
    return 0, a.div - 1


def _split(e: Expr, d: int) -> tuple[Expr, Expr] | None:
    """e = d*big + small with small in [0, d), or None."""
    big, small = {}, {}
    for a, k in e.terms:
        (big if _divides(d, k) else small)[a] = _quot(k, d) if _divides(d, k) else k
    if D.is_symbolic(e.const) or D.is_symbolic(d):
        if not (known(lambda: 0 <= e.const) and known(lambda: e.const < d)):
            return None
        q, r = 0, e.const                     # a constant already in [0, d)
    else:
        q, r = divmod(e.const, d)
    small_e = make(small, r)
    lo, hi = bounds(small_e)
    if not (known(lambda: lo >= 0) and known(lambda: hi < d)):
        return None
    return make(big, q), small_e


def _divisors_to_try(e: Expr, c: int) -> list[int]:
    if D.is_symbolic(c) or any(D.is_symbolic(k) for _, k in e.terms):
        # over symbolic sizes: the coefficients that divide c (a row's stride divides the
        # stride of the dimension above it), largest first by their value at the hints
        found = {k for _, k in e.terms if k != 1 and _divides(k, c)}
        return sorted(found, key=lambda k: (-D.hint(k), str(k)))
    return sorted({math.gcd(k, c) for _, k in e.terms} - {1}, reverse=True)


def floordiv(e: Expr, c: int) -> Expr:
    assert c > 0
    if c == 1:
        return e
    lo, hi = bounds(e)
    if known(lambda: lo >= 0) and known(lambda: hi < c):
        return Expr()
    if all(_divides(c, k) for _, k in e.terms) and _divides(c, e.const):
        return make({a: _quot(k, c) for a, k in e.terms}, _quot(e.const, c))
    if D.is_symbolic(c) or D.is_symbolic(e.const):
        # (x + c*y) // c == x // c + y, taking out only terms c divides and a constant that is
        # already in [0, c): what holds for every size
        taken = {a: _quot(k, c) for a, k in e.terms if _divides(c, k)}
        if taken and known(lambda: 0 <= e.const) and known(lambda: e.const < c):
            return make(taken, 0) + floordiv(make({a: k for a, k in e.terms if not _divides(c, k)}, e.const), c)
        for d in _divisors_to_try(e, c):
            parts = _split(e, d)
            if parts is not None:
                return floordiv(parts[0], _quot(c, d))
        return Expr(((FloorDiv(e, c), 1),), 0)
    # (x + c*y) // c == x // c + y for all integers: take out the terms c divides. A GEMM
    # reading attention's [B, S, H, D] output as [B*S, H*D] needs it: its A offset
    # (ak + 2048*am) // 128 % 16 * 128 + ak % 128 then folds to 2048*am + ak, a plain matrix
    if any(k % c == 0 for _, k in e.terms) or not 0 <= e.const < c:
        whole = make({a: k // c for a, k in e.terms if k % c == 0}, e.const // c)
        return whole + floordiv(make({a: k for a, k in e.terms if k % c != 0}, e.const % c), c)
    for d in _divisors_to_try(e, c):
        parts = _split(e, d)
        if parts is not None:
            return floordiv(parts[0], c // d)
    inner = e.single_atom()
    if isinstance(inner, FloorDiv):
        return floordiv(inner.arg, inner.div * c)
    return Expr(((FloorDiv(e, c), 1),), 0)


def mod(e: Expr, c: int) -> Expr:
    assert c > 0
    if c == 1:
        return Expr()
    if D.is_symbolic(c) or D.is_symbolic(e.const):
        if not (known(lambda: 0 <= e.const) and known(lambda: e.const < c)):
            return Expr(((Mod(e, c), 1),), 0)
        e = make({a: k for a, k in e.terms if not _divides(c, k)}, e.const)
    else:
        e = make({a: k for a, k in e.terms if not _divides(c, k)}, e.const % c)
    lo, hi = bounds(e)
    if known(lambda: lo >= 0) and known(lambda: hi < c):
        return e
    for d in _divisors_to_try(e, c):
        if d == c:
            continue
        parts = _split(e, d)
        if parts is not None:
            return mod(parts[0], _quot(c, d)) * d + parts[1]
    inner = e.single_atom()
    if isinstance(inner, Mod) and _divides(c, inner.div):
        return mod(inner.arg, c)
    return Expr(((Mod(e, c), 1),), 0)


def syms(e: Expr) -> frozenset[str]:
    out: set[str] = set()
    for a, _ in e.terms:
        out |= {a.name} if isinstance(a, Sym) else indirect_syms(a) if isinstance(a, Indirect) else syms(a.arg)
    return frozenset(out)


def indirect_syms(a: Indirect) -> frozenset[str]:
    """The kernel symbols an indirect coordinate depends on: its element's, and its condition's."""
    out = frozenset().union(*(syms(d) for d in a.dims)) if a.dims else frozenset()
    return out | getattr(a.cond, "syms", frozenset())


def render(e: Expr, name_of: Callable[[Atom], str]) -> str:
    """Python/Triton text of `e`; `name_of` names each FloorDiv/Mod atom (and may emit its definition)."""
    parts: list[str] = []
    for a, k in e.terms:
        name = a.name if isinstance(a, Sym) else name_of(a)
        if D.is_symbolic(k):
            parts.append(f"+ {name} * {size_text(k)}")
            continue
        term = name if abs(k) == 1 else f"{name} * {abs(k)}"
        parts.append(("- " if k < 0 else "+ ") + term)
    if D.is_symbolic(e.const):
        parts.append(f"+ {size_text(e.const)}")
    elif e.const or not parts:
        parts.append(("- " if e.const < 0 else "+ ") + str(abs(e.const)))
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def size_text(k) -> str:
    """A size in kernel text: an int, a size symbol's name (a kernel argument), or a
    parenthesised product or sum of them."""
    if not D.is_symbolic(k):
        return str(k)
    if D.lone_symbol(k) is not None:
        return str(k)
    return f"({k})"


def render_atom(a: FloorDiv | Mod, name_of: Callable[[Atom], str]) -> str:
    inner = render(a.arg, name_of)
    if len(a.arg.terms) + (a.arg.const != 0) > 1:
        inner = f"({inner})"
    return f"{inner} {'//' if isinstance(a, FloorDiv) else '%'} {size_text(a.div)}"

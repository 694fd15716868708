"""Index expressions, and how an index travels through views and broadcasting.

An `Expr` is an integer linear combination of atoms plus a constant. Atoms are `Sym`
(a kernel index variable: `offs`, `rows`, `cols`, with an exclusive bound), `FloorDiv`
and `Mod` of an Expr by a positive constant, and `Indirect`: a coordinate the kernel reads
from an index tensor (the value of an integer node at an index of its own), which lies in
[0, size) once wrapped as its op says. Exprs are immutable and hashable, so a
(node, index) pair can key the value memo of a kernel.

An `Index` names one element of a tensor of some shape, either as a row-major flat
position (`flat`) or per dimension (`dims`). A contiguous reshape keeps the flat form
untouched, which is how the fast path (every access `ptr + offs`) falls out by itself.

Invariants:
- simplification is exact for indices inside their valid domain (every Sym below its
  bound, every intermediate non-negative); lanes outside it are masked, so garbage
  indices there are never loaded or stored;
- an index into a dimension of size 1 is the constant 0, so broadcasting, keepdim and
  size-1 squeezes compare equal structurally;
- over symbolic sizes (minicomp/ir/dims.py) coefficients, divisors and bounds may be size
  expressions. A simplification is taken only where it holds for every value of the sizes
  (`known`, `_divides`); otherwise the general form stays, which is exact for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.codegen.index_algebra import (  # noqa: F401  (ix.* names)
    Atom, Expr, FloorDiv, Indirect, Mod, Sym, as_expr, bounds, floordiv, known,
    indirect_syms, make, mod, render, render_atom, size_text, sym, syms)
from minicomp.ir import dims
from minicomp.ir.graph import contiguous_strides


# --------------------------------------------------------------------------- Index


@dataclass(frozen=True)
class Index:
    shape: tuple[int, ...]
    flat: Expr | None = None
    dims: tuple[Expr, ...] | None = None

    def to_dims(self) -> tuple[Expr, ...]:
        if self.dims is not None:
            return self.dims
        strides = contiguous_strides(self.shape)
        return tuple(Expr() if size == 1 else mod(floordiv(self.flat, st), size)
                     for size, st in zip(self.shape, strides))

    def to_flat(self) -> Expr:
        if self.flat is not None:
            return self.flat
        return linear(self.dims, contiguous_strides(self.shape), self.shape)

    def key(self) -> tuple:
        return (self.shape, self.to_dims())


def dims_index(shape: tuple[int, ...], dims) -> Index:
    """An Index from per-dimension exprs; size-1 dimensions are pinned to 0."""
    return Index(tuple(shape), dims=tuple(Expr() if s == 1 else d for s, d in zip(shape, dims)))


def linear(dims, strides, shape) -> Expr:
    out = Expr()
    for d, st, size in zip(dims, strides, shape):
        if size != 1:
            out = out + d * st
    return out


def same_strides(shape, a, b) -> bool:
    """Strides agree on every dimension that has more than one element."""
    return all(size == 1 or x == y for size, x, y in zip(shape, a, b))


def offset(idx: Index, strides: tuple[int, ...]) -> Expr:
    """Element offset of `idx` in a tensor with `strides`; the flat form is kept when contiguous."""
    if idx.flat is not None and same_strides(idx.shape, strides, contiguous_strides(idx.shape)):
        return idx.flat
    return linear(idx.to_dims(), strides, idx.shape)


def broadcast(idx: Index, shape: tuple[int, ...]) -> Index:
    """Index into an operand of `shape` that broadcasts to `idx.shape` (numpy rules)."""
    shape = tuple(shape)
    if shape == idx.shape:
        return idx
    lead = len(idx.shape) - len(shape)
    dims = idx.to_dims()
    return dims_index(shape, [Expr() if s == 1 else dims[j + lead] for j, s in enumerate(shape)])


def reshape(idx: Index, shape: tuple[int, ...]) -> Index:
    return Index(tuple(shape), flat=idx.to_flat())


def stored_through(idx: Index, op: str, attrs, shape: tuple[int, ...]) -> Index:
    """Where the element at `idx` of a value lands in its view (a reshape or permute to
    `shape`): the index a kernel stores that view's output at (row kernels, GEMM tiles)."""
    if op == "reshape":
        return Index(tuple(shape), flat=idx.to_flat())
    dims = idx.to_dims()
    return dims_index(shape, [dims[p % len(dims)] for p in attrs["dims"]])


def permute(idx: Index, perm, shape: tuple[int, ...]) -> Index:
    """`idx` indexes x.permute(perm); returns the index into x (of `shape`)."""
    dims = idx.to_dims()
    out: list[Expr] = [Expr()] * len(shape)
    for k, p in enumerate(perm):
        out[p % len(shape)] = dims[k]
    return dims_index(shape, out)


def slice_range(size: int, start, end, step) -> tuple[int, int, int]:
    """Normalised (start, stop, step) as Python slicing does (negative bounds, clamping). Over
    symbols the IR's slice already holds bounds within [0, size] (ir/ops/views.py)."""
    if any(dims.is_symbolic(v) for v in (size, start, end)):
        return start, end, step
    return slice(start, end, step).indices(size)


def slice_(idx: Index, shape: tuple[int, ...], dim: int, start: int, step: int) -> Index:
    """`idx` indexes x[..., start::step, ...] along `dim`; returns the index into x."""
    dims = list(idx.to_dims())
    dim = dim % len(shape)
    dims[dim] = dims[dim] * step + start
    return dims_index(shape, dims)


def unit_stride_in(e: Expr, name: str, run: int = 16) -> bool:
    """True when consecutive values of symbol `name` step `e` by 1 for runs of at least `run`
    elements (`name`, or `name % k` with k >= run, appears with coefficient 1): loads along it coalesce."""
    for a, k in e.terms:
        if k != 1:
            continue
        if isinstance(a, Sym) and a.name == name:
            return True
        if isinstance(a, Mod) and known(lambda: a.div >= run) and _is_sym(a.arg, name):
            return True
    return False


def _is_sym(e: Expr, name: str) -> bool:
    atom = e.single_atom()
    return isinstance(atom, Sym) and atom.name == name

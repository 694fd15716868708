"""How an index travels through the views that copy in eager PyTorch: `cat` (which piece an
element comes from), `flip`, `roll` and `constant_pad_nd`. Each maps an Index into the view to
an Index into its source, with codegen/indexing.py's Expr algebra; they are split from it by
concern (the algebra and the plain views stay there).

Invariant: like indexing.py's maps, these are exact for indices inside the view's domain; the
caller masks lanes outside it.
"""

from __future__ import annotations

import math

from minicomp.codegen.indexing import Expr, Index, as_expr, dims_index, mod


def cat_pieces(idx: Index, shapes: list[tuple[int, ...]], dim: int) -> list[tuple[Index, int, int]]:
    """For each operand of a cat along `dim`: its index and the [lo, hi) range it covers."""
    dims = idx.to_dims()
    dim = dim % len(idx.shape)
    out, lo = [], 0
    for shape in shapes:
        hi = lo + shape[dim]
        piece = list(dims)
        piece[dim] = dims[dim] - lo
        out.append((dims_index(tuple(shape), piece), lo, hi))
        lo = hi
    return out


def flip(idx: Index, shape: tuple[int, ...], dims) -> Index:
    """`idx` indexes x.flip(dims) (x of `shape`); returns the index into x: n - 1 - i along each dim."""
    out = list(idx.to_dims())
    for d in {d % len(shape) for d in dims}:
        out[d] = as_expr(shape[d] - 1) - out[d]
    return dims_index(shape, out)


def roll(idx: Index, shape: tuple[int, ...], shifts, dims) -> Index:
    """`idx` indexes x.roll(shifts, dims); returns the index into x: (i - shift) mod n along each
    dim, or over the flattened tensor when `dims` is empty (as torch.roll)."""
    if not dims:
        n = math.prod(shape)
        if n == 0:
            return idx
        return Index(tuple(shape), flat=mod(idx.to_flat() + (-shifts[0]) % n, n))
    out = list(idx.to_dims())
    for s, d in zip(shifts, dims):
        d %= len(shape)
        if shape[d] > 1:
            out[d] = mod(out[d] + (-s) % shape[d], shape[d])
    return dims_index(shape, out)


def pad_source(idx: Index, shape: tuple[int, ...], pad) -> tuple[Index | None, list[tuple[Expr, str, int]]]:
    """`idx` indexes constant_pad_nd(x, pad) (x of `shape`; `pad` as aten spells it: (low, high)
    pairs from the last dimension back, negative ones crop). Returns the index into x and the
    tests `(expr, ">=" or "<", bound)` under which the element is x's, not the pad value; the
    index is None when a test fails for every element `idx` names (or x is empty)."""
    dims = list(idx.to_dims())
    src, tests = list(dims), []
    for k in range(len(pad) // 2):
        d, lo, hi = len(shape) - 1 - k, pad[2 * k], pad[2 * k + 1]
        src[d] = dims[d] - lo
        for rel, bound in ([(">=", lo)] if lo > 0 else []) + ([("<", lo + shape[d])] if hi > 0 else []):
            if not dims[d].is_const():
                tests.append((dims[d], rel, bound))
            elif not (dims[d].const >= bound if rel == ">=" else dims[d].const < bound):
                return None, []
    return (None, []) if 0 in shape else (dims_index(shape, src), tests)

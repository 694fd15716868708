"""The building blocks of the op table's shape and dtype rules (`OpDef.shape`).

A rule is `rule(operands, attrs) -> (shape, dtype) | None`, over `(shape, dtype)` pairs.
`minicomp/ir/shapes.py` says why rules exist and what they promise: a rule answers only
for operands it fully understands (float tensors, plus bool masks where an op takes one)
and returns None for anything else, including every case where PyTorch would raise; the
meta reference then decides. Rules that belong to one op sit beside that op's entry; the
ones many ops share are here.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

Shape = tuple[int, ...]
Operand = tuple[Shape, torch.dtype]
Result = Optional[tuple[Shape, torch.dtype]]
Rule = Callable[[Sequence[Operand], dict], Result]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def broadcast(*shapes: Shape) -> Shape | None:
    """NumPy broadcasting of `shapes`; None if they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def promote(*operands: Operand) -> torch.dtype:
    """PyTorch's promotion of float tensors; 0-d tensors rank below dimensioned ones."""
    dims = [d for s, d in operands if len(s)] or [d for _, d in operands]
    out = dims[0]
    for d in dims[1:]:
        out = torch.promote_types(out, d)
    return out


def _category(d: torch.dtype) -> int:
    return 0 if d == torch.bool else 2 if d.is_floating_point else 3 if d.is_complex else 1


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    # c10's combine_categories: a lower-priority operand counts only when its category is higher
    if higher is None:
        return lower
    if lower is None or _category(higher) >= 2:
        return higher
    if higher == torch.bool or _category(lower) >= 2:
        return torch.promote_types(higher, lower)
    return higher


def result_type(*operands: Operand, wrapped: Sequence[torch.dtype] = ()) -> torch.dtype:
    """torch.result_type of tensors of these (shape, dtype)s, any dtypes: dimensioned tensors
    decide, a 0-d one only where its category is higher (`int8 < 0-d int64` compares in int8,
    `int8 < 0-d float32` in float32), and `wrapped` (Python scalars) below those."""
    def promoted(ds: list[torch.dtype]) -> torch.dtype | None:
        out = None
        for d in ds:
            out = d if out is None else torch.promote_types(out, d)
        return out
    dims = promoted([d for s, d in operands if len(s)])
    zero = promoted([d for s, d in operands if not len(s)])
    out = _combine(dims, _combine(zero, promoted(list(wrapped))))
    assert out is not None, "result_type of no operands"
    return out


def floats(*operands: Operand) -> bool:
    return all(d in FLOATS for _, d in operands)


def norm_axes(axes: Any, rank: int) -> tuple[int, ...] | None:
    """Sorted non-negative axes, or None when one is out of range, repeated or not an int."""
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    if any(not isinstance(a, int) or not -max(rank, 1) <= a < max(rank, 1) for a in axes):
        return None
    norm = tuple(sorted({a % rank if rank else 0 for a in axes}))
    return norm if len(norm) == len(axes) else None


# --------------------------------------------------------------------------- elementwise

def elementwise(result_dtype: Callable[[Sequence[Operand], dict], torch.dtype | None]) -> Rule:
    """A broadcasting rule whose dtype is `result_dtype(operands, attrs)` (None: decline)."""
    def rule(operands: Sequence[Operand], attrs: dict) -> Result:
        shape = broadcast(*(s for s, _ in operands))
        dtype = result_dtype(operands, attrs)
        return None if shape is None or dtype is None else (shape, dtype)
    return rule


def same_float(operands: Sequence[Operand], attrs: dict) -> torch.dtype | None:
    return promote(*operands) if floats(*operands) else None


def to_bool(operands: Sequence[Operand], attrs: dict) -> torch.dtype | None:
    return torch.bool if floats(*operands) else None


def logical(operands: Sequence[Operand], attrs: dict) -> torch.dtype | None:
    return torch.bool if all(d in FLOATS or d == torch.bool for _, d in operands) else None


SAME_FLOAT = elementwise(same_float)     # float in, promoted float out
TO_BOOL = elementwise(to_bool)           # comparisons of floats
LOGICAL = elementwise(logical)           # truth values of floats or bools


# --------------------------------------------------------------------------- reductions

def reduce(operands: Sequence[Operand], attrs: dict, *, needs_elements: bool = False) -> Result:
    """A reduction over `attrs["axes"]` of a float tensor, keeping dims when `keepdim`."""
    ((shape, dtype),) = operands
    axes = norm_axes(attrs["axes"], len(shape))
    if dtype not in FLOATS or not axes or not shape:       # no axes means all of them to PyTorch
        return None
    if needs_elements and any(shape[a] == 0 for a in axes):   # amax/amin of nothing is an error
        return None
    if attrs.get("keepdim"):
        return tuple(1 if i in axes else s for i, s in enumerate(shape)), dtype
    return tuple(s for i, s in enumerate(shape) if i not in axes), dtype


def reduce_nonempty(operands: Sequence[Operand], attrs: dict) -> Result:
    """`reduce` for reductions with no identity (amax, amin): an empty axis declines."""
    return reduce(operands, attrs, needs_elements=True)

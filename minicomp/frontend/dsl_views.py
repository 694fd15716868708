"""The DSL's view builtins: reshape, expand, permute, transpose, unsqueeze, squeeze, slice, cat.

Every view is stored with concrete, non-negative attributes (a reshape's `-1` resolved, a
negative axis normalised, a slice's bounds clamped like Python's), so later stages never
re-derive what the user meant. Registered into the table (`dsl_table.BUILTINS`) when `dsl_builtins` imports this module.
"""

from __future__ import annotations

import torch

from minicomp.frontend.dsl_table import Axes, CallError, Emit, Shape, Tensor, TensorVal, Value, builtin
from minicomp.ir import dims


def _axis(e: Emit, x: int, axis: int, arg: str, extra: int = 0) -> int:
    """Normalise `axis` for a tensor of x's rank (+`extra` for a dim being inserted)."""
    rank = e.rank(x) + extra
    if not -rank <= axis < max(rank, 1):
        raise CallError(f"{arg}={axis} is out of range for a tensor of rank {rank - extra}", arg=arg)
    return axis % rank if rank else 0


def _resolved(x_shape: tuple[int, ...], shape: tuple[int, ...], how: str) -> tuple[int, ...]:
    """The concrete shape of reshape/expand (resolves -1); ValueError with PyTorch's reason."""
    if dims.any_symbolic(x_shape) or dims.any_symbolic(shape):
        return _resolved_symbolic(x_shape, shape, how)
    meta = torch.empty(x_shape, device="meta")
    try:
        out = meta.reshape(shape) if how == "reshape" else meta.expand(shape)
    except RuntimeError as err:
        raise ValueError(str(err).split("\n")[0]) from None
    return tuple(out.shape)


def _resolved_symbolic(x_shape: tuple, shape: tuple, how: str) -> tuple:
    """reshape/expand over symbolic sizes: what holds for every value of the symbols, else a
    ValueError that says so."""
    if how == "expand":
        lead = len(shape) - len(x_shape)
        if lead < 0:
            raise ValueError(f"expand to {list(shape)}: fewer dims than the tensor's {list(x_shape)}")
        out = list(shape[:lead])
        for d, want in zip(x_shape, shape[lead:]):
            if want != -1 and d != want and d != 1:
                raise ValueError(f"expand of {list(x_shape)} to {list(shape)}: {d} and {want} differ")
            out.append(d if want == -1 else want)
        return tuple(out)
    free = [i for i, d in enumerate(shape) if d == -1]
    known = dims.numel([d for d in shape if d != -1])
    total = dims.numel(x_shape)
    if len(free) > 1:
        raise ValueError("only one dimension can be -1")
    if free:
        rest = dims.exact_div(total, known)
        if rest is None:
            raise ValueError(f"reshape of {list(x_shape)} to {list(shape)}: {total} is not a multiple of {known} "
                             "for every value of the symbols")
        return tuple(rest if d == -1 else d for d in shape)
    if known != total:
        raise ValueError(f"reshape of {list(x_shape)} ({total} elements) to {list(shape)} ({known}): the counts "
                         "are not equal for every value of the symbols")
    return tuple(shape)


@builtin()
def _reshape(e: Emit, x: Tensor, shape: Shape) -> Value:
    return e.add("reshape", x, shape=_resolved(e.node(x).shape, shape, "reshape"))


@builtin()
def _expand(e: Emit, x: Tensor, shape: Shape) -> Value:
    return e.add("expand", x, shape=_resolved(e.node(x).shape, shape, "expand"))


@builtin()
def _permute(e: Emit, x: Tensor, dims: Shape) -> Value:
    rank = e.rank(x)
    norm = tuple(_axis(e, x, d, "dims") for d in dims)
    if sorted(norm) != list(range(rank)):
        raise CallError(f"dims={list(dims)} is not a permutation of the {rank} axes", arg="dims")
    return e.add("permute", x, dims=norm)


@builtin()
def _transpose(e: Emit, x: Tensor, dim0: int, dim1: int) -> Value:
    a, b = _axis(e, x, dim0, "dim0"), _axis(e, x, dim1, "dim1")
    dims = list(range(e.rank(x)))
    dims[a], dims[b] = dims[b], dims[a]
    return e.add("permute", x, dims=tuple(dims))


@builtin()
def _unsqueeze(e: Emit, x: Tensor, dim: int) -> Value:
    d = _axis(e, x, dim, "dim", extra=1)
    shape = list(e.node(x).shape)
    shape.insert(d, 1)
    return e.add("reshape", x, shape=tuple(shape))


@builtin()
def _squeeze(e: Emit, x: Tensor, dim: Axes | None = None) -> Value:
    shape = e.node(x).shape
    if dim is None:
        axes = {i for i, s in enumerate(shape) if s == 1}
    else:
        dims = (dim,) if isinstance(dim, int) else dim
        # like torch.squeeze: a named axis whose size is not 1 is left alone
        axes = {a for a in (_axis(e, x, d, "dim") for d in dims) if shape[a] == 1}
    return e.add("reshape", x, shape=tuple(s for i, s in enumerate(shape) if i not in axes))


@builtin()
def _contiguous(e: Emit, x: Tensor) -> Value:
    return TensorVal(x)  # values have no layout until the layout pass: nothing to do


@builtin("slice")
def _slice(e: Emit, x: Tensor, dim: int, start: int | None = None, end: int | None = None,
           step: int = 1) -> Value:
    d = _axis(e, x, dim, "dim")
    if step <= 0:
        raise CallError(f"step must be positive, got {step}", arg="step")
    size = e.node(x).shape[d]
    lo, hi, _ = slice(start, end, step).indices(size)
    # a step past the axis takes one element, as any such step does; a huge one would
    # overflow the strides of the view (step * stride) in 64 bits
    step = min(step, max(size, 1))
    return e.add("slice", x, dim=d, start=lo, end=max(hi, lo), step=step)


@builtin()
def _cat(e: Emit, tensors: list[Tensor], axis: int = 0) -> Value:
    return e.add("cat", *tensors, dim=_axis(e, tensors[0], axis, "axis"))

"""Views: reshape, permute, expand, slice; cat, flip, roll, constant_pad. They compute nothing in a kernel.

codegen/lowering.py reads a view by moving the index its reader asks for onto the view's
operand (`cat` picks the piece the index falls in, `constant_pad` the operand or its value),
and the layout pass folds transposes into strides. The fx frontend lowers every reshape-like
aten view to one `reshape` to the shape aten computed.

`STRIDED` are the views a tensor's strides can express (a GEMM's operand loads and a row
kernel fold them); the others re-index through a condition or a modulus, so the planner
materialises them where a strided view is needed, and eager copies them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from minicomp.ir import dims

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import FLOATS, norm_axes


def _reshape_ref(x, *, shape):
    return x.reshape(shape)


def _permute_ref(x, *, dims):
    return x.permute(dims)


def _expand_ref(x, *, shape):
    return x.expand(shape)


def _slice_ref(x, *, dim, start, end, step):
    index = [slice(None)] * x.dim()
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


def _cat_ref(*xs, dim):
    return torch.cat(xs, dim=dim)


def _flip_ref(x, *, dims):
    return torch.flip(x, dims)


def _roll_ref(x, *, shifts, dims):
    return torch.roll(x, shifts, dims)


def _pad_ref(x, *, pad, value):
    return torch.constant_pad_nd(x, pad, value)


STRIDED = ("reshape", "permute", "expand", "slice")


# --------------------------------------------------------------------------- shape rules

def _reshape_rule(operands, attrs):
    ((shape, dtype),) = operands
    new = list(attrs["shape"])
    if any(not dims.is_size(s) or s < -1 for s in new) or new.count(-1) > 1:
        return None
    known = math.prod(s for s in new if s != -1)
    size = math.prod(shape)
    if -1 in new:
        rest = dims.exact_div(size, known) if known != 0 else None    # exact for every value of the symbols
        if rest is None:
            return None
        new[new.index(-1)] = rest
    return (tuple(new), dtype) if math.prod(new) == size else None



def _permute_rule(operands, attrs):
    ((shape, dtype),) = operands
    dims = norm_axes(attrs["dims"], len(shape))
    if dims is None or len(dims) != len(shape):
        return None
    return tuple(shape[d % len(shape)] for d in attrs["dims"]), dtype


def _expand_rule(operands, attrs):
    ((shape, dtype),) = operands
    new = list(attrs["shape"])
    lead = len(new) - len(shape)
    if lead < 0 or any(not dims.is_size(s) or s < -1 for s in new) or -1 in new[:lead]:
        return None
    for i, s in enumerate(shape):
        want = new[lead + i]
        if want == -1:
            new[lead + i] = s
        elif s != want and s != 1:
            return None
    return tuple(new), dtype


def symbolic_slice_fits(size, start, end, step) -> bool:
    """Whether `x[start:end:step]` along a dim where the size or a bound is symbolic is taken as
    written: step 1 and bounds the symbols' ranges keep within [0, size] (no bound counted from
    the end, none clamped: Python's slicing does both, which the ranges cannot always decide)."""
    try:
        return step == 1 and start is not None and end is not None and 0 <= start <= end <= size
    except dims.SymbolicDim:
        return False


def _slice_rule(operands, attrs):
    ((shape, dtype),) = operands
    dim, start, end, step = attrs["dim"], attrs["start"], attrs["end"], attrs["step"]
    if not isinstance(dim, int) or not -len(shape) <= dim < len(shape) or not isinstance(step, int) or step < 1:
        return None
    if any(v is not None and not isinstance(v, (int, dims.Expr)) for v in (start, end)):
        return None
    dim %= len(shape)
    if any(dims.is_symbolic(v) for v in (shape[dim], start, end)):
        if not symbolic_slice_fits(shape[dim], start, end, step):
            return None
        return shape[:dim] + (end - start,) + shape[dim + 1:], dtype
    length = len(range(*slice(start, end, step).indices(shape[dim])))
    return shape[:dim] + (length,) + shape[dim + 1:], dtype


def _cat_rule(operands, attrs):
    shapes = [s for s, _ in operands]
    dtypes = {d for _, d in operands}
    dim = attrs["dim"]
    if not shapes or len(dtypes) != 1 or len({len(s) for s in shapes}) != 1 or not shapes[0]:
        return None
    rank = len(shapes[0])
    if not isinstance(dim, int) or not -rank <= dim < rank:
        return None
    dim %= rank
    if any(s[:dim] + s[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:] for s in shapes):
        return None
    out = list(shapes[0])
    out[dim] = sum(s[dim] for s in shapes)
    return tuple(out), dtypes.pop()


def _flip_rule(operands, attrs):
    ((shape, dtype),) = operands
    dims = attrs["dims"]
    if not isinstance(dims, (tuple, list)) or not shape or norm_axes(dims, len(shape)) is None:
        return None
    return shape, dtype


def _roll_rule(operands, attrs):
    ((shape, dtype),) = operands
    shifts, dims = tuple(attrs["shifts"]), tuple(attrs["dims"])
    if not shape or not shifts or any(not isinstance(v, int) for v in shifts + dims):
        return None
    if not (len(shifts) == len(dims) or (not dims and len(shifts) == 1)):
        return None
    return (shape, dtype) if all(-len(shape) <= d < len(shape) for d in dims) else None


def _pad_rule(operands, attrs):
    ((shape, dtype),) = operands
    pad, value = tuple(attrs["pad"]), attrs["value"]
    if len(pad) % 2 or len(pad) > 2 * len(shape) or any(not isinstance(p, int) for p in pad):
        return None
    if type(value) not in (bool, int, float) or dtype not in FLOATS:
        return None
    out = list(shape)
    for k in range(len(pad) // 2):
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if out[-1 - k] + min(lo, 0) + min(hi, 0) < 0:
            return None     # PyTorch crops first (negative pads), and refuses to crop below nothing
        out[-1 - k] += lo + hi
    return (tuple(out), dtype) if all(s > 0 for s in out) else None


# --------------------------------------------------------------------------- PyTorch text

def _slice_text(x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    parts = [":"] * (attrs["dim"] % max(len(shape), 1))
    fmt = lambda v: "" if v is None else str(v)  # noqa: E731
    parts.append(f"{fmt(attrs['start'])}:{fmt(attrs['end'])}:{fmt(attrs['step'])}")
    return f"{x[0]}[{', '.join(parts)}]"


def _cat_text(x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    return f"torch.cat([{', '.join(x)}], dim={attrs['dim']})"


def view(name: str, ref, *, attrs: tuple[str, ...], shape, pytorch, aten: tuple[str, ...], arity: int | None = 1):
    return register(OpDef(name, "view", ref, arity=arity, flops_per_element=0, attrs=attrs, emitter="view",
                          shape=shape, pytorch=pytorch, aten=aten))


view("reshape", _reshape_ref, attrs=("shape",), shape=_reshape_rule, pytorch="{0}.reshape({shape})",
     aten=("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default", "unsqueeze.default",
           "squeeze.default", "squeeze.dim", "squeeze.dims", "flatten.using_ints", "unflatten.int",
           "view_as.default"))
view("permute", _permute_ref, attrs=("dims",), shape=_permute_rule, pytorch="{0}.permute({dims})",
     aten=("permute.default", "transpose.int", "t.default", "numpy_T.default"))
# repeat and repeat_interleave are an expand between two reshapes; fill.Tensor expands its value
view("expand", _expand_ref, attrs=("shape",), shape=_expand_rule, pytorch="{0}.expand({shape})",
     aten=("expand.default", "repeat.default", "repeat_interleave.self_int", "fill.Tensor"))
# select, unbind and split are slices (then a reshape that drops the axis, for select/unbind)
view("slice", _slice_ref, attrs=("dim", "start", "end", "step"), shape=_slice_rule, pytorch=_slice_text,
     aten=("slice.Tensor", "narrow.default", "select.int", "unbind.int", "split.Tensor",
           "split_with_sizes.default"))
view("cat", _cat_ref, attrs=("dim",), arity=None, shape=_cat_rule, pytorch=_cat_text,
     aten=("cat.default", "stack.default"))
# index remaps: aten copies them; a kernel reads its operand at the moved index
view("flip", _flip_ref, attrs=("dims",), shape=_flip_rule, pytorch="torch.flip({0}, {dims})", aten=("flip.default",))
view("roll", _roll_ref, attrs=("shifts", "dims"), shape=_roll_rule, pytorch="torch.roll({0}, {shifts}, {dims})",
     aten=("roll.default",))
view("constant_pad", _pad_ref, attrs=("pad", "value"), shape=_pad_rule,
     pytorch="torch.constant_pad_nd({0}, {pad}, {value})", aten=("constant_pad_nd.default",))

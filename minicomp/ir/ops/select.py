"""Selection, casts and generators: where, cast, tril/triu, full, arange.

`cast` has no Triton form here: rounding a half-precision value the way eager does depends
on how the kernel holds it (codegen/tlexpr.py `cast_text`). tril, triu and arange depend on
the element's index and full is a literal, so codegen/lowering.py writes them; they keep
masks and ranges symbolic (`tril(full(S, S, True))` is "causal" to the planner, not 16 MiB).
"""

from __future__ import annotations

import math

import torch

from minicomp.ir import dims
from minicomp.ir.dtypes import INT_DTYPES

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import FLOATS, elementwise, promote, floats


def _where_rule(operands, attrs):
    cond, *values = operands
    return promote(*values) if cond[1] == torch.bool and floats(*values) else None


# masked_fill lowers to where(mask, value, x) (fx_ops.py)
register(OpDef("where", "pointwise", torch.where, arity=3, triton="tl.where({0}, {1}, {2})", operands="cond",
               shape=elementwise(_where_rule), pytorch="torch.where({0}, {1}, {2})",
               aten=("where.self", "masked_fill.Scalar", "masked_fill.Tensor")))


def _cast_ref(x, *, dtype: torch.dtype):
    return x.to(dtype)


def _cast_rule(operands, attrs):
    ((shape, _),) = operands
    return (shape, attrs["dtype"]) if isinstance(attrs["dtype"], torch.dtype) else None


register(OpDef("cast", "pointwise", _cast_ref, flops_per_element=0, attrs=("dtype",), emitter="cast",
               shape=_cast_rule, pytorch="{0}.to({dtype})",
               aten=("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device",
                     "prims::convert_element_type.default")))


def _tril_ref(x, *, diagonal: int):
    return torch.tril(x, diagonal)


def _triu_ref(x, *, diagonal: int):
    return torch.triu(x, diagonal)


def _tri_rule(operands, attrs):
    ((shape, dtype),) = operands
    return (shape, dtype) if len(shape) >= 2 and isinstance(attrs.get("diagonal"), int) else None


register(OpDef("tril", "pointwise", _tril_ref, flops_per_element=1, attrs=("diagonal",), indexed=True,
               emitter="index", shape=_tri_rule, pytorch="torch.tril({0}, {diagonal})", aten=("tril.default",)))
register(OpDef("triu", "pointwise", _triu_ref, flops_per_element=1, attrs=("diagonal",), indexed=True,
               emitter="index", shape=_tri_rule, pytorch="torch.triu({0}, {diagonal})", aten=("triu.default",)))


# --------------------------------------------------------------------------- generators
# No operands; values computed from the index, never stored as big constants.

def _full_ref(*, shape, value, dtype, device=None):
    return torch.full(shape, value, dtype=dtype, device=device)


def _full_rule(operands, attrs):
    shape, dtype, value = attrs.get("shape"), attrs.get("dtype"), attrs.get("value")
    if not isinstance(shape, (tuple, list)) or any(not dims.is_size(s) or s < 0 for s in shape):
        return None
    if (dtype in FLOATS or dtype == torch.bool) and type(value) in (bool, int, float) and math.isfinite(value):
        return tuple(shape), dtype
    if (dtype in INT_DTYPES and type(value) in (bool, int)
            and torch.iinfo(dtype).min <= value <= torch.iinfo(dtype).max):
        return tuple(shape), dtype      # an int that fits (eager refuses one that overflows)
    return None


def _arange_ref(*, start, end, step, dtype, device=None):
    return torch.arange(start, end, step, dtype=dtype, device=device)


def _arange_rule(operands, attrs):
    """Over symbols only (`torch.arange(seq_len)`): an int start and step 1, a symbolic end the
    ranges keep past start. Concrete bounds go to PyTorch's meta kernel (None here)."""
    start, end, step, dtype = attrs.get("start"), attrs.get("end"), attrs.get("step"), attrs.get("dtype")
    if not dims.is_symbolic(end) or type(start) is not int or step != 1 or not isinstance(dtype, torch.dtype):
        return None
    try:
        return ((end - start,), dtype) if end - start >= 1 else None
    except dims.SymbolicDim:
        return None


register(OpDef("full", "pointwise", _full_ref, arity=0, flops_per_element=0, attrs=("shape", "value", "dtype"),
               emitter="literal", shape=_full_rule,
               pytorch="torch.full({shape}, {value}, dtype={dtype}, device=device)",
               aten=("full.default", "new_full.default", "full_like.default", "ones.default", "ones_like.default",
                     "new_ones.default", "zeros.default", "zeros_like.default", "new_zeros.default",
                     "fill.Scalar")))


def _size_ref(*, value):
    return torch.tensor(int(value), dtype=torch.int64)    # over symbols: SymbolicDim (never folded)


def _size_rule(operands, attrs):
    return ((), torch.int64) if isinstance(attrs.get("value"), dims.Expr) else None


# a size over symbols as a 0-d int64 value (`arange(past, past + n)` decomposes to
# `arange(n) + past`, past a SymInt): kernels compute it from their size arguments
def _size_torch(x, attrs, shape) -> str:
    value = attrs["value"]
    text = dims.py(value, dims.OWN_NAMES) if isinstance(value, dims.Expr) else repr(value)
    return f"torch.full((), {text}, dtype=torch.int64, device=device)"   # a fill kernel, no copy from the host


register(OpDef("size_value", "pointwise", _size_ref, arity=0, flops_per_element=0, attrs=("value",),
               emitter="size", shape=_size_rule, pytorch=_size_torch))
register(OpDef("arange", "pointwise", _arange_ref, arity=0, flops_per_element=0,
               attrs=("start", "end", "step", "dtype"), indexed=True, emitter="index", shape=_arange_rule,
               pytorch="torch.arange({start}, {end}, {step}, dtype={dtype}, device=device)",
               aten=("arange.default", "arange.start", "arange.start_step")))

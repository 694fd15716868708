"""The DSL's neural-network builtins: reductions, softmax, norms, matmul/linear, attention,
and the builtins that make tensors (full, arange, causal_mask).

Composite operators go through `minicomp.ir.composites`, so the DSL and the fx frontend build
the same graphs for them. Registered into the table (`dsl_table.BUILTINS`) when `dsl_builtins` imports this module.
"""

from __future__ import annotations

from typing import Any

import torch

from minicomp.frontend.dsl_limits import fits_dtype
from minicomp.frontend.dsl_table import (Axes, CallError, Dtype, Emit, Number, Shape, Tensor, TensorVal, Value,
                                         builtin)
from minicomp.ir import composites
from minicomp.ir.dtypes import dtype_name


# ------------------------------------------------------------------ reductions and norms


def _reduce(e: Emit, op: str, x: int, axis: Any, keepdim: bool, **extra: Any) -> Value:
    if axis is None:
        axis = tuple(range(e.rank(x)))
    return TensorVal(composites.reduce(e.g, op, x, axis, keepdim=keepdim, origin=e.origin, **extra))


@builtin()
def _sum(e: Emit, x: Tensor, axis: Axes | None = None, keepdim: bool = False) -> Value:
    return _reduce(e, "sum", x, axis, keepdim)


@builtin()
def _mean(e: Emit, x: Tensor, axis: Axes | None = None, keepdim: bool = False) -> Value:
    return _reduce(e, "mean", x, axis, keepdim)


@builtin()
def _amax(e: Emit, x: Tensor, axis: Axes | None = None, keepdim: bool = False) -> Value:
    return _reduce(e, "amax", x, axis, keepdim)


@builtin()
def _amin(e: Emit, x: Tensor, axis: Axes | None = None, keepdim: bool = False) -> Value:
    return _reduce(e, "amin", x, axis, keepdim)


def _floating(e: Emit, what: str, **tensors: int) -> None:
    """PyTorch computes these in floating point only (its kernels refuse integer and bool
    tensors, though meta tensors accept them); a decomposition would quietly compute them."""
    for name, t in tensors.items():
        if not e.node(t).dtype.is_floating_point:
            raise CallError(f"{what} needs a floating-point tensor, got {e.node(t).type} (cast it first: "
                            f"cast({name}, f32))", arg=name)


@builtin()
def _var(e: Emit, x: Tensor, axis: Axes | None = None, keepdim: bool = False, correction: int = 1) -> Value:
    _floating(e, "var", x=x)
    return _reduce(e, "var", x, axis, keepdim, correction=correction)


def _empty_axis(e: Emit, x: int, axis: int) -> bool:
    """Whether `axis` of a floating x has size 0 (an out-of-range axis is left to the composite's error)."""
    shape = e.node(x).shape
    return e.node(x).dtype.is_floating_point and -len(shape) <= axis < len(shape) and shape[axis] == 0


@builtin()
def _softmax(e: Emit, x: Tensor, axis: int = -1) -> Value:
    _floating(e, "softmax", x=x)
    if _empty_axis(e, x, axis):  # eager gives x's (empty) shape; the decomposition's amax would refuse it
        return TensorVal(x)
    return TensorVal(composites.softmax(e.g, x, axis, origin=e.origin))


@builtin()
def _log_softmax(e: Emit, x: Tensor, axis: int = -1) -> Value:
    _floating(e, "log_softmax", x=x)
    if _empty_axis(e, x, axis):
        return TensorVal(x)
    return TensorVal(composites.log_softmax(e.g, x, axis, origin=e.origin))


@builtin()
def _layer_norm(e: Emit, x: Tensor, w: Tensor | None = None, b: Tensor | None = None,
                eps: float = 1e-5) -> Value:
    ndim = e.rank(w) if w is not None else 1  # normalise over as many trailing axes as w has
    return TensorVal(composites.layer_norm(e.g, x, ndim, w, b, eps, origin=e.origin))


@builtin()
def _rms_norm(e: Emit, x: Tensor, w: Tensor | None = None, eps: float | None = None) -> Value:
    ndim = e.rank(w) if w is not None else 1
    return TensorVal(composites.rms_norm(e.g, x, ndim, w, eps, origin=e.origin))


# ------------------------------------------------------------------ gemm and attention


def _same_dtype(e: Emit, what: str, **tensors: int) -> None:
    """PyTorch refuses mixed-dtype matmuls on real tensors (meta tensors let them pass), and
    matmuls of bool tensors."""
    dts = {name: e.node(n).dtype for name, n in tensors.items()}
    if len(set(dts.values())) > 1:
        listed = ", ".join(f"{k}: {e.node(tensors[k]).type}" for k in dts)
        raise CallError(f"{what} needs operands of one dtype, got {listed} (insert a cast)")
    if torch.bool in dts.values():
        raise CallError(f"{what} of b8 tensors is not supported, as in PyTorch (cast them to a number type)")


@builtin()
def _matmul(e: Emit, a: Tensor, b: Tensor) -> Value:
    for name, t in (("a", a), ("b", b)):
        if e.rank(t) == 0:
            raise CallError(f"matmul needs tensors of rank 1 or more, got {e.node(t).type}", arg=name)
    _same_dtype(e, "matmul", a=a, b=b)
    return e.add("matmul", a, b)


@builtin()
def _linear(e: Emit, x: Tensor, w: Tensor, b: Tensor | None = None) -> Value:
    if e.rank(w) not in (1, 2):  # as F.linear: matmul's batching would accept more, eager does not
        raise CallError(f"linear's w must be [out_features, in_features] or [in_features], got {e.node(w).type}",
                        arg="w")
    _same_dtype(e, "linear", x=x, w=w)
    return TensorVal(composites.linear(e.g, x, w, b, origin=e.origin))


@builtin()
def _attention(e: Emit, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               scale: float | None = None, is_causal: bool = False, enable_gqa: bool = False) -> Value:
    _same_dtype(e, "attention", q=q, k=k, v=v)
    _floating(e, "attention", q=q)
    if mask is not None and is_causal:
        raise CallError("attention() takes mask= or is_causal=true, not both", arg="mask")
    if scale is None and e.rank(q) and e.node(q).shape[-1] == 0:
        # head dim 0: every score is an empty sum (0) whatever the scale, so the default
        # 1/sqrt(0) is not needed; eager gives the mean of v's rows, and so does scale 1
        scale = 1.0
    return TensorVal(composites.attention(e.g, q, k, v, mask, scale, is_causal, enable_gqa, origin=e.origin))


@builtin()
def _causal_mask(e: Emit, sq: int, sk: int) -> Value:
    return TensorVal(composites.causal_mask(e.g, sq, sk, origin=e.origin))


# ------------------------------------------------------------------ making tensors


@builtin()
def _full(e: Emit, shape: Shape, value: Number, dtype: Dtype | None = None) -> Value:
    if dtype is None:  # like torch.full: the value's kind picks the dtype
        dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float32
    if not fits_dtype(value, dtype):
        raise CallError(f"value {value} does not fit in {dtype_name(dtype)}", arg="value")
    return e.add("full", shape=shape, value=value, dtype=dtype)


@builtin()
def _arange(e: Emit, start: int, end: int | None = None, step: int = 1, dtype: Dtype | None = None) -> Value:
    if end is None:
        start, end = 0, start
    if dtype == torch.bool:
        raise CallError("arange() makes numbers, not bools (compare the result to get bools)", arg="dtype")
    return e.add("arange", start=start, end=end, step=step, dtype=dtype or torch.int64)

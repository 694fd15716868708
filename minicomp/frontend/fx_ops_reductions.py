"""aten handlers for reductions and scans: sum, mean, prod, amax/amin (and max/min), any/all,
argmax/argmin, var and std (with their means), logsumexp, vector norms, cumsum and friends.

Same contract as `fx_ops`: handlers get a `Ctx` and schema-ordered arguments (tensors as
`T`) and return a node id, a list of ids for multi-output ops, or raise `Unmapped`. aten
spells "all axes" as None or []; the IR always gets the axes written out (`composites.reduce`),
and a 0-d tensor's are (0,), as PyTorch accepts. A multi-output op is one node per output
over the same operand (ir/ops/reductions.py says why): `max.dim` is [amax, argmax].
A `dtype=` argument casts the operand first, which is what eager's kernels do.
"""

from __future__ import annotations

import torch

from minicomp.frontend.fx_table import Ctx, Handler, Unmapped, lowers
from minicomp.ir import composites


def _axes(dim, ndim: int) -> tuple[int, ...]:
    # aten spells "all axes" as None or []
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim)) if ndim else (0,)
    return dim


def _src(cx: Ctx, x, dtype) -> int:
    return cx.cast(x, dtype) if dtype is not None else x.id


def _reduction(op: str) -> Handler:
    def lower(cx: Ctx, x, dim=None, keepdim=False, dtype=None):
        return composites.reduce(cx.graph, op, _src(cx, x, dtype), _axes(dim, len(cx.shape(x))), keepdim,
                                 origin=cx.origin)
    return lower


def _reduce_all(op: str) -> Handler:
    def lower(cx: Ctx, x, dtype=None):
        return composites.reduce(cx.graph, op, _src(cx, x, dtype), _axes(None, len(cx.shape(x))), False,
                                 origin=cx.origin)
    return lower


lowers("sum.dim_IntList")(_reduction("sum"))
lowers("mean.dim")(_reduction("mean"))
lowers("sum.default")(_reduce_all("sum"))
lowers("mean.default")(_reduce_all("mean"))
lowers("amax.default")(_reduction("amax"))
lowers("amin.default")(_reduction("amin"))
lowers("max.default")(_reduce_all("amax"))
lowers("min.default")(_reduce_all("amin"))
lowers("prod.default")(_reduce_all("prod"))
lowers("any.default")(_reduce_all("any"))
lowers("all.default")(_reduce_all("all"))
lowers("any.dim", "any.dims")(_reduction("any"))
lowers("all.dim", "all.dims")(_reduction("all"))
lowers("argmax.default")(_reduction("argmax"))
lowers("argmin.default")(_reduction("argmin"))


@lowers("prod.dim_int")
def _prod_dim(cx: Ctx, x, dim, keepdim=False, dtype=None):
    return composites.reduce(cx.graph, "prod", _src(cx, x, dtype), dim, keepdim, origin=cx.origin)


def _value_and_index(op: str) -> Handler:
    # max.dim/min.dim: (values, indices), as amax and argmax over the same operand
    def lower(cx: Ctx, x, dim, keepdim=False):
        shape = cx.shape(x)
        if shape and shape[dim] == 0:
            # aten's meta kernel lets an empty result through; eager's CPU and CUDA kernels refuse it
            raise cx.refuse(f"{op}(): Expected reduction dim {dim} to have non-zero size (eager raises IndexError)")
        values = composites.reduce(cx.graph, "a" + op, x.id, dim, keepdim, origin=cx.origin)
        # argmax refuses bool, max.dim does not: its indices are argmax's over the operand as
        # int32 (False < True, first index on ties), a cast the row kernel fuses
        src = cx.cast(x, torch.int32) if cx.dtype(x) == torch.bool else x.id
        return [values, composites.reduce(cx.graph, "arg" + op, src, dim, keepdim, origin=cx.origin)]
    return lower


lowers("max.dim")(_value_and_index("max"))
lowers("min.dim")(_value_and_index("min"))


@lowers("nansum.default")
def _nansum(cx: Ctx, x, dim=None, keepdim=False, dtype=None):
    # NaN counts as zero; integers have none
    src = _src(cx, x, dtype)
    if cx.graph.node(src).dtype.is_floating_point:
        src = cx.add("where", cx.add("isnan", src), cx.const(0.0, cx.graph.node(src).dtype), src)
    return composites.reduce(cx.graph, "sum", src, _axes(dim, len(cx.shape(x))), keepdim, origin=cx.origin)


def _count_nonzero(cx: Ctx, x, dim) -> int:
    nonzero = cx.cast(cx.add("ne", x.id, cx.const(0, cx.dtype(x))), torch.int64)
    return composites.reduce(cx.graph, "sum", nonzero, _axes(dim, len(cx.shape(x))), False, origin=cx.origin)


@lowers("count_nonzero.dim_IntList")
def _count_nonzero_dims(cx: Ctx, x, dim):
    return _count_nonzero(cx, x, dim)


@lowers("count_nonzero.default")
def _count_nonzero_one(cx: Ctx, x, dim=None):
    return _count_nonzero(cx, x, None if dim is None else [dim])


@lowers("aminmax.default")
def _aminmax(cx: Ctx, x, dim=None, keepdim=False):
    axes = _axes(dim, len(cx.shape(x)))
    return [composites.reduce(cx.graph, "amin", x.id, axes, keepdim, origin=cx.origin),
            composites.reduce(cx.graph, "amax", x.id, axes, keepdim, origin=cx.origin)]


@lowers("logsumexp.default")
def _logsumexp(cx: Ctx, x, dim, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        raise Unmapped("logsumexp over no dims")      # eager's own error
    src = x.id if cx.dtype(x).is_floating_point else cx.cast(x, torch.get_default_dtype())
    return composites.reduce(cx.graph, "logsumexp", src, dim, keepdim, origin=cx.origin)


@lowers("linalg_vector_norm.default")
def _vector_norm(cx: Ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    src = _src(cx, x, dtype)
    if not cx.graph.node(src).dtype.is_floating_point or isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise Unmapped("vector_norm of a non-float tensor, or a complex ord")   # eager raises
    return composites.vector_norm(cx.graph, src, ord, _axes(dim, len(cx.shape(x))), keepdim, origin=cx.origin)


# --------------------------------------------------------------------------- var, std, their means


def _var(cx: Ctx, x, dim, correction, keepdim) -> int:
    correction = 1 if correction is None else correction
    return composites.reduce(cx.graph, "var", x.id, _axes(dim, len(cx.shape(x))), keepdim,
                             origin=cx.origin, correction=correction)


@lowers("var.correction")
def _var_correction(cx: Ctx, x, dim=None, correction=None, keepdim=False):
    return _var(cx, x, dim, correction, keepdim)


@lowers("var.dim")
def _var_dim(cx: Ctx, x, dim, unbiased=True, keepdim=False):
    return _var(cx, x, dim, int(unbiased), keepdim)


@lowers("var.default")
def _var_all(cx: Ctx, x, unbiased=True):
    return _var(cx, x, None, int(unbiased), False)


@lowers("std.correction")
def _std_correction(cx: Ctx, x, dim=None, correction=None, keepdim=False):
    return cx.add("sqrt", _var(cx, x, dim, correction, keepdim))


@lowers("std.dim")
def _std_dim(cx: Ctx, x, dim, unbiased=True, keepdim=False):
    return cx.add("sqrt", _var(cx, x, dim, int(unbiased), keepdim))


def _with_mean(std: bool) -> Handler:
    # the mean first: the row kernel's variance then reuses it
    def lower(cx: Ctx, x, dim=None, correction=None, keepdim=False):
        mean = composites.reduce(cx.graph, "mean", x.id, _axes(dim, len(cx.shape(x))), keepdim, origin=cx.origin)
        var = _var(cx, x, dim, correction, keepdim)
        return [cx.add("sqrt", var) if std else var, mean]
    return lower


lowers("var_mean.correction")(_with_mean(False))
lowers("std_mean.correction")(_with_mean(True))


# --------------------------------------------------------------------------- scans


def _axis(cx: Ctx, x, dim: int) -> int:
    rank = len(cx.shape(x))
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise Unmapped(f"dim {dim} out of range")          # eager's IndexError
    return dim % rank if rank else 0


def _scan(op: str) -> Handler:
    def lower(cx: Ctx, x, dim, dtype=None):
        return cx.add(op, _src(cx, x, dtype), axis=_axis(cx, x, dim))
    return lower


lowers("cumsum.default")(_scan("cumsum"))
lowers("cumprod.default")(_scan("cumprod"))


@lowers("logcumsumexp.default")
def _logcumsumexp(cx: Ctx, x, dim):
    return cx.add("logcumsumexp", x, axis=_axis(cx, x, dim))


def _cum_extreme(op: str) -> Handler:
    # cummax/cummin: (values, indices), two scans of one operand, one (value, index) scan in the kernel
    def lower(cx: Ctx, x, dim):
        axis = _axis(cx, x, dim)
        return [cx.add(op, x, axis=axis), cx.add(f"{op}_index", x, axis=axis)]
    return lower


lowers("cummax.default")(_cum_extreme("cummax"))
lowers("cummin.default")(_cum_extreme("cummin"))

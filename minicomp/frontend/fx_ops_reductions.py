"""aten handlers for reductions: sum, mean, amax/amin (and max/min), var and std.

Same contract as `fx_ops`: handlers get a `Ctx` and schema-ordered arguments (tensors as
`T`) and return a node id, a list of ids for multi-output ops, or raise `Unmapped`. aten
spells "all axes" as None or []; the IR always gets the axes written out (`composites.reduce`).
"""

from __future__ import annotations

from minicomp.frontend.fx_ops import Ctx, Handler, lowers
from minicomp.ir import composites

def _axes(dim, ndim: int) -> tuple[int, ...]:
    # aten spells "all axes" as None or []
    return tuple(range(ndim)) if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else dim


def _reduction(op: str) -> Handler:
    def lower(cx: Ctx, x, dim=None, keepdim=False, dtype=None):
        src = cx.cast(x, dtype) if dtype is not None else x.id
        return composites.reduce(cx.graph, op, src, _axes(dim, len(cx.shape(x))), keepdim, origin=cx.origin)
    return lower


def _reduce_all(op: str) -> Handler:
    def lower(cx: Ctx, x, dtype=None):
        src = cx.cast(x, dtype) if dtype is not None else x.id
        return composites.reduce(cx.graph, op, src, tuple(range(len(cx.shape(x)))), False, origin=cx.origin)
    return lower


lowers("sum.dim_IntList")(_reduction("sum"))
lowers("mean.dim")(_reduction("mean"))
lowers("sum.default")(_reduce_all("sum"))
lowers("mean.default")(_reduce_all("mean"))
lowers("amax.default")(_reduction("amax"))
lowers("amin.default")(_reduction("amin"))
lowers("max.default")(_reduce_all("amax"))
lowers("min.default")(_reduce_all("amin"))


def _value_of_pair(op: str) -> Handler:
    # max.dim/min.dim return (values, indices): values are a reduction, indices stay opaque
    def lower(cx: Ctx, x, dim, keepdim=False):
        return [composites.reduce(cx.graph, op, x.id, dim, keepdim, origin=cx.origin), None]
    return lower


lowers("max.dim")(_value_of_pair("amax"))
lowers("min.dim")(_value_of_pair("amin"))


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

"""Reductions over `axes` (sorted, non-negative; `keepdim` keeps them as size 1).

codegen/reduction.py writes them as row kernels (codegen/row_reduce.py holds the
accumulator of each op). The frontends spell "all axes" explicitly, so an op never sees an
empty `axes`; a 0-d operand has `axes == (0,)` (PyTorch accepts dim 0 and -1 of a 0-d
tensor) and its row kernel has one row of one element.

Multi-output aten ops are several single-output ops, one node per output, each reading the
same operand: `max.dim` is `amax` and `argmax`, `aminmax` is `amin` and `amax`, `var_mean`
is `var` and `mean`. The planner puts readers of one tensor over one domain in one row
kernel, and the emitter computes what they share once (the value and index of a max in one
pass; var's mean is the mean). No op has several outputs, so no stage needs tuples. The
composites that spell these aten ops are registered here, beside the ops they lower to.

Dtypes follow eager: sum and prod of integers or bool are int64; any/all give bool (uint8
for uint8); argmax/argmin give int64 and refuse bool (eager does); mean, var and
logsumexp want floats (logsumexp of integers is float32, eager's default dtype).
"""

from __future__ import annotations

import torch

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.composite import Composite, composite
from minicomp.ir.ops.rules import FLOATS, norm_axes, reduce, reduce_nonempty


def _sum(x, *, axes, keepdim):
    return torch.sum(x, dim=axes, keepdim=keepdim)


def _mean(x, *, axes, keepdim):
    return torch.mean(x, dim=axes, keepdim=keepdim)


def _amax(x, *, axes, keepdim):
    return torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, *, axes, keepdim):
    return torch.amin(x, dim=axes, keepdim=keepdim)


def _floats_only(x: torch.Tensor, what: str) -> None:
    # eager's CPU and CUDA kernels refuse these dtypes; its meta kernels (shape inference) do not
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise ValueError(f"{what} takes floating point tensors, not {x.dtype} (eager refuses it)")


def _var(x, *, axes, keepdim, correction):
    _floats_only(x, "var")
    return torch.var(x, dim=axes, keepdim=keepdim, correction=correction)


def _prod(x, *, axes, keepdim):
    # torch.prod takes one dim: reduce the axes one at a time, innermost first
    if len(axes) == 1:
        return torch.prod(x, axes[0], keepdim=keepdim)
    out = x
    for a in sorted(axes, reverse=True):
        out = torch.prod(out, a, keepdim=True)
    return out if keepdim else out.squeeze(tuple(axes))


def _prod_text(x, attrs, shape) -> str:
    axes, keepdim = tuple(attrs["axes"]), bool(attrs["keepdim"])
    if len(axes) == 1:
        return f"torch.prod({x[0]}, {int(axes[0])}, keepdim={keepdim})"
    text = x[0]
    for a in sorted(axes, reverse=True):
        text = f"torch.prod({text}, {int(a)}, keepdim=True)"
    return text if keepdim else f"{text}.squeeze({tuple(int(a) for a in axes)!r})"


def _any(x, *, axes, keepdim):
    return torch.any(x, dim=axes, keepdim=keepdim)


def _all(x, *, axes, keepdim):
    return torch.all(x, dim=axes, keepdim=keepdim)


def _one_dim(x: torch.Tensor, axes) -> int | None:
    """The dim argument of torch.argmax for `axes`: the axis, or None for all of them."""
    if len(axes) != 1 and len(axes) != x.dim():
        raise ValueError(f"an index reduction reduces one axis or all of them, not {tuple(axes)}")
    return axes[0] if len(axes) == 1 else None


def _index_text(name: str):
    def text(x, attrs, shape) -> str:
        axes = tuple(attrs["axes"])
        dim = int(axes[0]) if len(axes) == 1 else None
        return f"torch.{name}({x[0]}, dim={dim!r}, keepdim={bool(attrs['keepdim'])})"
    return text


def _argmax(x, *, axes, keepdim):
    if x.dtype == torch.bool:
        raise ValueError("argmax of bool (eager refuses it)")
    return torch.argmax(x, dim=_one_dim(x, axes), keepdim=keepdim)


def _argmin(x, *, axes, keepdim):
    if x.dtype == torch.bool:
        raise ValueError("argmin of bool (eager refuses it)")
    return torch.argmin(x, dim=_one_dim(x, axes), keepdim=keepdim)


def _logsumexp(x, *, axes, keepdim):
    return torch.logsumexp(x, dim=axes, keepdim=keepdim)


# --------------------------------------------------------------------------- shape rules


def _reduced(shape, axes, keepdim):
    return tuple(1 if i in axes else s for i, s in enumerate(shape)) if keepdim else \
        tuple(s for i, s in enumerate(shape) if i not in axes)


def _to_dtype(dtype: torch.dtype, *, nonempty: bool = False, one_or_all: bool = False):
    """A rule for float operands with a fixed result dtype (None: declines everything else)."""
    def rule(operands, attrs):
        ((shape, dt),) = operands
        axes = norm_axes(attrs["axes"], len(shape))
        if dt not in FLOATS or not axes or not shape:
            return None
        if nonempty and any(shape[a] == 0 for a in axes):
            return None
        if one_or_all and len(axes) not in (1, len(shape)):
            return None
        return _reduced(shape, axes, attrs["keepdim"]), dtype
    return rule


# --------------------------------------------------------------------------- the ops


def reduction(name: str, ref, *, aten: tuple[str, ...], shape=reduce, flops: float = 1.0,
              attrs: tuple[str, ...] = ("axes", "keepdim"), pytorch=None) -> OpDef:
    """A reduction; by default `torch.<name>(x, dim=axes, keepdim=keepdim)` in PyTorch."""
    return register(OpDef(name, "reduction", ref, flops_per_element=flops, attrs=attrs, emitter="reduction",
                          shape=shape, aten=aten,
                          pytorch=pytorch or f"torch.{name}({{0}}, dim={{axes}}, keepdim={{keepdim}})"))


reduction("sum", _sum, aten=("sum.dim_IntList", "sum.default"))
reduction("mean", _mean, aten=("mean.dim", "mean.default"))
# max.dim/min.dim lower their values here and their indices to argmax/argmin
reduction("amax", _amax, shape=reduce_nonempty, aten=("amax.default", "max.default", "max.dim"))
reduction("amin", _amin, shape=reduce_nonempty, aten=("amin.default", "min.default", "min.dim"))
# std is sqrt(var)
reduction("var", _var, flops=3, attrs=("axes", "keepdim", "correction"),
          pytorch="torch.var({0}, dim={axes}, keepdim={keepdim}, correction={correction})",
          aten=("var.correction", "var.dim", "var.default", "std.correction", "std.dim"))
reduction("prod", _prod, aten=("prod.dim_int", "prod.default"),
          pytorch=_prod_text)
reduction("any", _any, shape=_to_dtype(torch.bool), aten=("any.dim", "any.dims", "any.default"))
reduction("all", _all, shape=_to_dtype(torch.bool), aten=("all.dim", "all.dims", "all.default"))
reduction("argmax", _argmax, shape=_to_dtype(torch.int64, nonempty=True, one_or_all=True), flops=2,
          aten=("argmax.default",), pytorch=_index_text("argmax"))
reduction("argmin", _argmin, shape=_to_dtype(torch.int64, nonempty=True, one_or_all=True), flops=2,
          aten=("argmin.default",), pytorch=_index_text("argmin"))
# log(sum(exp(x - m))) + m with m = amax(x) (0 where m is infinite), as eager computes it
reduction("logsumexp", _logsumexp, flops=4, aten=("logsumexp.default",))

composite(Composite("aminmax", "reduction", ("amin", "amax"), ("aminmax.default",),
                    "one node per output; a row kernel computes both"))
composite(Composite("var_mean", "reduction", ("var", "mean", "sqrt"), ("var_mean.correction", "std_mean.correction"),
                    "one node per output; the variance's mean is the mean"))
composite(Composite("vector_norm", "reduction", ("abs", "mul", "sum", "sqrt", "amax", "amin", "ne", "pow"),
                    ("linalg_vector_norm.default",), "ord 2, 1, inf, -inf, 0 and any other p; half types in fp32"))
composite(Composite("nansum", "reduction", ("isnan", "where", "sum"), ("nansum.default",),
                    "a sum with NaN as zero"))
composite(Composite("count_nonzero", "reduction", ("ne", "cast", "sum"),
                    ("count_nonzero.dim_IntList", "count_nonzero.default"), "a sum of x != 0 as int64"))

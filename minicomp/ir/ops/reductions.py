"""Reductions over `axes` (sorted, non-negative; `keepdim` keeps them as size 1).

codegen/reduction.py writes them as row kernels (its accumulators are per op there).
The frontends spell "all axes" explicitly, so an op never sees an empty `axes`.
"""

from __future__ import annotations

import torch

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import reduce, reduce_nonempty


def _sum(x, *, axes, keepdim):
    return torch.sum(x, dim=axes, keepdim=keepdim)


def _mean(x, *, axes, keepdim):
    return torch.mean(x, dim=axes, keepdim=keepdim)


def _amax(x, *, axes, keepdim):
    return torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, *, axes, keepdim):
    return torch.amin(x, dim=axes, keepdim=keepdim)


def _var(x, *, axes, keepdim, correction):
    return torch.var(x, dim=axes, keepdim=keepdim, correction=correction)


def reduction(name: str, ref, *, aten: tuple[str, ...], shape=reduce, flops: float = 1.0,
              attrs: tuple[str, ...] = ("axes", "keepdim"), pytorch: str | None = None) -> OpDef:
    """A reduction; by default `torch.<name>(x, dim=axes, keepdim=keepdim)` in PyTorch."""
    return register(OpDef(name, "reduction", ref, flops_per_element=flops, attrs=attrs, emitter="reduction",
                          shape=shape, aten=aten,
                          pytorch=pytorch or f"torch.{name}({{0}}, dim={{axes}}, keepdim={{keepdim}})"))


reduction("sum", _sum, aten=("sum.dim_IntList", "sum.default"))
reduction("mean", _mean, aten=("mean.dim", "mean.default"))
# max.dim/min.dim lower their values here; the indices stay opaque (fx_ops.py)
reduction("amax", _amax, shape=reduce_nonempty, aten=("amax.default", "max.default", "max.dim"))
reduction("amin", _amin, shape=reduce_nonempty, aten=("amin.default", "min.default", "min.dim"))
# std is sqrt(var)
reduction("var", _var, flops=3, attrs=("axes", "keepdim", "correction"),
          pytorch="torch.var({0}, dim={axes}, keepdim={keepdim}, correction={correction})",
          aten=("var.correction", "var.dim", "var.default", "std.correction", "std.dim"))

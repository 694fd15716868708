"""What the reduction and scan property tests draw: one `OpCase` per aten op, and random calls.

An `OpCase` names an op, the eager function a user would write (`call(x, dim, keepdim, extra)`),
the dtypes eager accepts for it (the tests also try the others and expect eager's error),
and how its `dim` is drawn: `one` axis, `many` (one, several, or None for all), `one_or_all`
(argmax: one axis or None) or a scan's single axis. `draw(case, rng)` builds one example:
a shape of rank 0-4 with odd and zero sizes, a dtype, values with NaN/inf where the dtype
has them, a non-contiguous input (a transpose or a strided slice) half the time, negative
axes, keepdim, and sometimes a pointwise prologue and epilogue the row kernel must fuse.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INTS = (torch.int32, torch.int64)
ALL = FLOATS + INTS + (torch.bool,)
SIZES = (1, 2, 3, 5, 7, 13, 33, 0)


@dataclass(frozen=True)
class OpCase:
    name: str
    call: Callable[..., Any]                 # call(x, dim, keepdim, extra) -> tensor or tuple
    dtypes: tuple[torch.dtype, ...]          # what eager accepts
    dims: str = "many"                       # "one", "many", "one_or_all", "scan"
    keepdim: bool = True                     # takes keepdim
    extras: tuple = (None,)                  # drawn extra argument (correction, ord)
    values: str = "normal"                   # "normal", "near_one" (products), "small" (ties)
    nan: bool = True                         # NaN/inf inputs compared (eager's NaN is defined)


def _sum(x, dim, keepdim, _):
    return x.sum(dim, keepdim=keepdim) if dim is not None else x.sum()


def _prod(x, dim, keepdim, _):
    return x.prod(dim, keepdim=keepdim) if dim is not None else x.prod()


CASES: list[OpCase] = [
    OpCase("sum", _sum, ALL),
    OpCase("mean", lambda x, d, k, _: x.mean(d, keepdim=k) if d is not None else x.mean(), FLOATS),
    OpCase("amax", lambda x, d, k, _: x.amax(d if d is not None else (), keepdim=k), ALL, values="small"),
    OpCase("amin", lambda x, d, k, _: x.amin(d if d is not None else (), keepdim=k), ALL, values="small"),
    OpCase("prod", _prod, ALL, dims="one", values="near_one"),
    OpCase("nansum", lambda x, d, k, _: torch.nansum(x, d, keepdim=k) if d is not None else torch.nansum(x), ALL),
    OpCase("count_nonzero", lambda x, d, k, _: torch.count_nonzero(x, d), ALL, keepdim=False, values="sparse"),
    OpCase("any", lambda x, d, k, _: x.any(d, keepdim=k) if d is not None else x.any(), ALL, values="sparse"),
    OpCase("all", lambda x, d, k, _: x.all(d, keepdim=k) if d is not None else x.all(), ALL, values="sparse"),
    OpCase("argmax", lambda x, d, k, _: x.argmax(d, keepdim=k), FLOATS + INTS, dims="one_or_all", values="small"),
    OpCase("argmin", lambda x, d, k, _: x.argmin(d, keepdim=k), FLOATS + INTS, dims="one_or_all", values="small"),
    OpCase("max.dim", lambda x, d, k, _: torch.max(x, d, keepdim=k), ALL, dims="one", values="small"),
    OpCase("min.dim", lambda x, d, k, _: torch.min(x, d, keepdim=k), ALL, dims="one", values="small"),
    OpCase("aminmax", lambda x, d, k, _: torch.aminmax(x, dim=d, keepdim=k), ALL, dims="one_or_all", values="small"),
    OpCase("var", lambda x, d, k, c: torch.var(x, d, correction=c, keepdim=k), FLOATS, extras=(0, 1, 2)),
    OpCase("std", lambda x, d, k, c: torch.std(x, d, correction=c, keepdim=k), FLOATS, extras=(0, 1)),
    OpCase("var_mean", lambda x, d, k, c: torch.var_mean(x, d, correction=c, keepdim=k), FLOATS, extras=(0, 1)),
    OpCase("std_mean", lambda x, d, k, c: torch.std_mean(x, d, correction=c, keepdim=k), FLOATS, extras=(0, 1)),
    OpCase("logsumexp", lambda x, d, k, _: torch.logsumexp(x, d if d is not None else tuple(range(x.dim())) or 0,
                                                           keepdim=k), ALL),
    OpCase("vector_norm", lambda x, d, k, o: torch.linalg.vector_norm(x, o, d, keepdim=k), FLOATS,
           extras=(2, 1, float("inf"), float("-inf"), 0, 3.0, 0.5)),
    OpCase("cumsum", lambda x, d, k, _: torch.cumsum(x, d), ALL, dims="scan", keepdim=False),
    OpCase("cumprod", lambda x, d, k, _: torch.cumprod(x, d), ALL, dims="scan", keepdim=False, values="near_one"),
    OpCase("cummax", lambda x, d, k, _: torch.cummax(x, d), ALL, dims="scan", keepdim=False, values="small"),
    OpCase("cummin", lambda x, d, k, _: torch.cummin(x, d), ALL, dims="scan", keepdim=False, values="small"),
    OpCase("logcumsumexp", lambda x, d, k, _: torch.logcumsumexp(x, d), FLOATS, dims="scan", keepdim=False),
]
BY_NAME = {c.name: c for c in CASES}


@dataclass
class Example:
    case: OpCase
    x: torch.Tensor
    dim: Any
    keepdim: bool
    extra: Any
    fused: bool                          # wrapped in a pointwise prologue and epilogue
    note: list[str] = field(default_factory=list)

    def fn(self) -> Callable:
        case, dim, keepdim, extra, fused = self.case, self.dim, self.keepdim, self.extra, self.fused

        def run(x):
            if fused:
                x = x * 2 if x.dtype != torch.bool else ~x
            out = case.call(x, dim, keepdim, extra)
            if fused:
                outs = list(out) if isinstance(out, tuple) else [out]
                outs = [o + 1 if o.dtype != torch.bool else ~o for o in outs]
                return tuple(outs) if isinstance(out, tuple) else outs[0]
            return out
        return run

    def describe(self) -> str:
        return (f"{self.case.name}(x: {self.x.dtype} {list(self.x.shape)} strides {self.x.stride()}, dim={self.dim}, "
                f"keepdim={self.keepdim}, extra={self.extra}, fused={self.fused}) {' '.join(self.note)}")


def _values(shape, dtype, how: str, rng: random.Random, special: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < (0.15 if how == "sparse" else 0.5)
    if not dtype.is_floating_point:
        lo, hi = {"near_one": (-2, 3), "small": (-3, 3), "sparse": (0, 2)}.get(how, (-9, 10))
        return torch.randint(lo, hi, shape, generator=gen).to(dtype)
    if how == "near_one":
        x = 1 + 0.1 * torch.randn(shape, generator=gen)
    elif how == "small":
        x = torch.randint(-3, 3, shape, generator=gen).float() * 0.5    # ties
    elif how == "sparse":
        x = torch.randn(shape, generator=gen) * (torch.rand(shape, generator=gen) < 0.2)
    else:
        x = torch.randn(shape, generator=gen) * 3
    if special and x.numel():
        flat = x.view(-1)
        for v in (float("nan"), float("inf"), float("-inf")):
            if rng.random() < 0.5:
                flat[rng.randrange(flat.numel())] = v
    return x.to(dtype)


def _shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
    sizes = [rng.choice(SIZES[:-1]) if rng.random() > 0.08 else 0 for _ in range(rank)]
    return tuple(sizes)


def _dim(case: OpCase, rank: int, rng: random.Random):
    span = max(rank, 1)
    one = rng.randrange(-span, span)
    if case.dims in ("one", "scan"):
        return one
    if case.dims == "one_or_all":
        return None if rng.random() < 0.3 else one
    r = rng.random()
    if r < 0.2 or rank == 0:
        return None
    if r < 0.6 or rank < 2:
        return one
    axes = rng.sample(range(rank), rng.randint(2, rank))
    return tuple(a - rank if rng.random() < 0.3 else a for a in axes)


def draw(case: OpCase, rng: random.Random, dtype: torch.dtype | None = None) -> Example:
    """One random example of `case` (of `dtype`, else one eager accepts)."""
    dtype = dtype or rng.choice(case.dtypes)
    shape = _shape(rng)
    special = case.nan and dtype.is_floating_point and rng.random() < 0.35
    note = []
    if len(shape) >= 2 and rng.random() < 0.3:
        base = _values(shape[::-1], dtype, case.values, rng, special)
        x = base.permute(*reversed(range(len(shape))))                   # transposed: not contiguous
        note.append("transposed")
    elif shape and rng.random() < 0.25:
        wide = shape[:-1] + (shape[-1] * 2,)
        x = _values(wide, dtype, case.values, rng, special)[..., ::2]    # strided
        note.append("strided")
    else:
        x = _values(shape, dtype, case.values, rng, special)
    if special:
        note.append("nan/inf")
    extra = rng.choice(case.extras)
    fused = rng.random() < 0.25
    return Example(case, x, _dim(case, len(shape), rng), case.keepdim and rng.random() < 0.4, extra, fused, note)

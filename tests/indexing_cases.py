"""Random indirect loads for tests/test_indirect_loads.py: embedding, x[...] with index tensors
and None slices, index_select, gather and take_along_dim, on every dtype of the gathered tensor,
int32 and int64 indices (negative ones where eager allows them), odd and zero sizes, transposed,
strided and expanded sources and index tensors, with a consumer to fuse with (pointwise, or a
softmax's row kernel).

`case(draw)` (a hypothesis strategy through `st.composite`) returns a `Case`: the function, its
arguments, and a label for failure messages. Every index it draws is valid for eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int8,
          torch.uint8, torch.bool]
INDEX_DTYPES = [torch.int64, torch.int32]


@dataclass
class Case:
    label: str
    fn: Callable
    args: tuple

    def __repr__(self) -> str:
        shapes = ", ".join(f"{tuple(a.shape)} {a.dtype} strides={a.stride()}" for a in self.args)
        return f"Case({self.label}: {shapes})"


def _values(draw, shape, dtype, gen) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    lo, hi = (0, 200) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def _layout(draw, t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in a layout drawn at random: contiguous, transposed storage, or every other
    element of a bigger buffer."""
    how = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if how == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "strided" and t.dim() >= 1 and t.numel():
        big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        big[..., ::2] = t
        return big[..., ::2]
    return t


def _indices(draw, shape, n: int, dtype, gen, negative: bool) -> torch.Tensor:
    """Valid indices into a dimension of size n (negative ones too when `negative`), laid out at
    random: maybe expanded from a smaller tensor (stride 0) or transposed."""
    lo = -n if negative else 0
    if draw(st.booleans()) and len(shape) >= 1 and shape[0] > 1:
        small = torch.randint(lo, n, (1,) + tuple(shape[1:]), generator=gen).to(dtype)
        return small.expand(shape)
    t = torch.randint(lo, n, shape, generator=gen).to(dtype)
    return _layout(draw, t)


def _consumer(draw, dtype):
    """An op after the gather, for it to fuse with: pointwise, or (floats) a softmax's row kernel."""
    if dtype == torch.bool:
        return lambda y: y.logical_not()
    if dtype.is_floating_point:
        if draw(st.booleans()):
            return lambda y: torch.softmax(y * 2, -1) if y.dim() else y * 2
        return lambda y: y * 2 + 1
    return lambda y: y + 3


dims = st.integers(1, 6)
sizes = st.integers(0, 4)


@st.composite
def case(draw) -> Case:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from(DTYPES))
    idt = draw(st.sampled_from(INDEX_DTYPES))
    after = _consumer(draw, dtype)
    kind = draw(st.sampled_from(["embedding", "index", "index_select", "gather", "take_along_dim"]))
    if kind == "embedding":
        v, d = draw(dims), draw(dims)
        w = _layout(draw, _values(draw, (v, d), dtype, gen))
        ishape = tuple(draw(st.lists(sizes, max_size=3)))
        ids = _indices(draw, ishape, v, idt, gen, False)
        return Case(f"embedding {dtype}", lambda w, ids: after(F.embedding(ids, w)), (w, ids))
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=4)))
    x = _layout(draw, _values(draw, shape, dtype, gen))
    if kind == "index":
        rank = len(shape)
        at = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=min(3, rank))))
        bshape = tuple(draw(st.lists(sizes, min_size=1, max_size=2)))
        idxs = []
        for d in at:
            # each index tensor broadcasts to bshape: some of its dims are 1, some dropped (never
            # all: PyTorch reads a 0-d index tensor into Python, which capture refuses)
            own = tuple(draw(st.sampled_from([s, 1])) for s in bshape)[draw(st.integers(0, len(bshape) - 1)):]
            idxs.append(_indices(draw, own, shape[d], draw(st.sampled_from(INDEX_DTYPES)), gen, True))

        def fn(x, *idxs):
            key = [slice(None)] * x.dim()
            for d, i in zip(at, idxs):
                key[d] = i
            return after(x[tuple(key)])
        return Case(f"x[...] at dims {at} {dtype}", fn, (x, *idxs))
    dim = draw(st.integers(0, len(shape) - 1))
    if kind == "index_select":
        n = draw(st.integers(0, 5))
        i = _indices(draw, (n,), shape[dim], idt, gen, False)
        return Case(f"index_select dim {dim} {dtype}", lambda x, i: after(torch.index_select(x, dim, i)), (x, i))
    ishape = tuple(draw(st.integers(0, s)) if k != dim else draw(sizes) for k, s in enumerate(shape))
    if kind == "gather":
        i = _indices(draw, ishape, shape[dim], idt, gen, False)
        return Case(f"gather dim {dim} {dtype}", lambda x, i: after(torch.gather(x, dim, i)), (x, i))
    # take_along_dim takes indices modulo the size (any value is valid); they broadcast with x
    ishape = tuple(s if k == dim else draw(st.sampled_from([shape[k], 1])) for k, s in enumerate(ishape))
    i = torch.randint(-2 * shape[dim], 2 * shape[dim], ishape, generator=gen)     # int64 only, as eager
    if draw(st.booleans()):
        return Case(f"take_along_dim dim {dim} {dtype}", lambda x, i: after(torch.take_along_dim(x, i, dim)), (x, i))
    flat = torch.randint(0, x.numel(), (draw(sizes),), generator=gen)
    # over the flattened tensor, which eager views: x must be contiguous (eager refuses others)
    return Case(f"take_along_dim flat {dtype}", lambda x, i: after(torch.take_along_dim(x, i)),
                (x.contiguous(), flat))

"""Composite operators, decomposed into registry primitives.

Both frontends call these, so `F.softmax(x, -1)`, a hand-written softmax and the DSL's
`softmax(x, axis=-1)` reach the passes as the same graph. Half-precision inputs are
upcast to fp32 for the statistics and the result cast back, which is what PyTorch's own
kernels do (so the decomposition matches eager to rounding).

Each function takes the Graph, node ids and Python attributes, and returns a node id.
"""

from __future__ import annotations

import math

import torch

from minicomp.ir.attention_ref import EXTRA_DEFAULTS
from minicomp.ir.dtypes import HALF_DTYPES
from minicomp.ir.graph import Graph


def norm_axes(axes, ndim: int) -> tuple[int, ...]:
    """Normalise an int or sequence of ints (negative allowed) to sorted non-negative axes."""
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):      # a 0-d tensor takes dim 0 and -1, as in PyTorch
            raise ValueError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def linear_bias(g: Graph, add: int, mm: int) -> int | None:
    """The bias when node `add` is matmul `mm` plus a [N] tensor of its dtype (F.linear's bias,
    the one addmm adds itself): not a Python scalar, the add of the matmul's shape; else None.
    The planner, the passes and the library GEMMs all ask this one question."""
    a, m = g.node(add), g.node(mm)
    if a.op != "add" or len(a.args) != 2 or mm not in a.args or a.args[0] == a.args[1]:
        return None
    bias = g.node(a.args[1] if a.args[0] == mm else a.args[0])
    if bias.op == "constant" and not isinstance(bias.attrs.get("value"), torch.Tensor):
        return None
    same = bias.dtype == m.dtype == a.dtype and tuple(a.shape) == tuple(m.shape)
    return bias.id if same and tuple(bias.shape) == tuple(m.shape[-1:]) else None


def _upcast(g: Graph, x: int, origin) -> tuple[int, torch.dtype]:
    dt = g.node(x).dtype
    if dt in HALF_DTYPES:
        return g.add("cast", x, dtype=torch.float32, origin=origin), dt
    return x, dt


def _downcast(g: Graph, x: int, dt: torch.dtype, origin) -> int:
    return g.add("cast", x, dtype=dt, origin=origin) if g.node(x).dtype != dt else x


def reduce(g: Graph, op: str, x: int, axes, keepdim: bool = False, origin=None, **extra) -> int:
    return g.add(op, x, axes=norm_axes(axes, len(g.node(x).shape)), keepdim=bool(keepdim), origin=origin, **extra)


def vector_norm(g: Graph, x: int, ord: float, axes, keepdim: bool = False, origin=None) -> int:
    """torch.linalg.vector_norm of a float tensor over `axes`: ord 2 sqrt(sum(x*x)), 1 sum(|x|),
    inf/-inf amax/amin(|x|), 0 the count of non-zeros, any other p sum(|x|^p)^(1/p). Half
    types are reduced in fp32 and rounded once, as eager's kernels do."""
    x32, dt = _upcast(g, x, origin)
    ord = float(ord)
    if ord == 2:
        y = g.add("sqrt", reduce(g, "sum", g.add("mul", x32, x32, origin=origin), axes, keepdim, origin), origin=origin)
    elif ord == 0:
        nonzero = g.add("ne", x32, g.constant(0.0), origin=origin)
        y = reduce(g, "sum", g.add("cast", nonzero, dtype=g.node(x32).dtype, origin=origin), axes, keepdim, origin)
    else:
        a = g.add("abs", x32, origin=origin)
        if math.isinf(ord):
            y = reduce(g, "amax" if ord > 0 else "amin", a, axes, keepdim, origin)
        elif ord == 1:
            y = reduce(g, "sum", a, axes, keepdim, origin)
        else:
            total = reduce(g, "sum", g.add("pow", a, exponent=ord, origin=origin), axes, keepdim, origin)
            y = g.add("pow", total, exponent=1.0 / ord, origin=origin)
    return _downcast(g, y, dt, origin)


def softmax(g: Graph, x: int, axis: int = -1, origin=None) -> int:
    x32, dt = _upcast(g, x, origin)
    m = reduce(g, "amax", x32, axis, keepdim=True, origin=origin)
    e = g.add("exp", g.add("sub", x32, m, origin=origin), origin=origin)
    s = reduce(g, "sum", e, axis, keepdim=True, origin=origin)
    return _downcast(g, g.add("div", e, s, origin=origin), dt, origin)


def safe_softmax(g: Graph, x: int, axis: int = -1, origin=None) -> int:
    """aten._safe_softmax (SDPA's math path): softmax, with 0 for a row whose every entry is
    -inf (where softmax gives NaN)."""
    x32, dt = _upcast(g, x, origin)
    m = reduce(g, "amax", x32, axis, keepdim=True, origin=origin)
    e = g.add("exp", g.add("sub", x32, m, origin=origin), origin=origin)
    s = reduce(g, "sum", e, axis, keepdim=True, origin=origin)
    empty = g.add("eq", m, g.constant(float("-inf")), origin=origin)
    out = g.add("where", empty, g.constant(0.0), g.add("div", e, s, origin=origin), origin=origin)
    return _downcast(g, out, dt, origin)


def log_softmax(g: Graph, x: int, axis: int = -1, origin=None) -> int:
    x32, dt = _upcast(g, x, origin)
    m = reduce(g, "amax", x32, axis, keepdim=True, origin=origin)
    shifted = g.add("sub", x32, m, origin=origin)
    s = reduce(g, "sum", g.add("exp", shifted, origin=origin), axis, keepdim=True, origin=origin)
    return _downcast(g, g.add("sub", shifted, g.add("log", s, origin=origin), origin=origin), dt, origin)


def layer_norm(g: Graph, x: int, ndim: int, weight: int | None, bias: int | None, eps: float,
               origin=None) -> int:
    """LayerNorm over the last `ndim` axes: (x - mean) * rsqrt(var + eps) * w + b."""
    rank = len(g.node(x).shape)
    axes = tuple(range(rank - ndim, rank))
    x32, dt = _upcast(g, x, origin)
    mean = reduce(g, "mean", x32, axes, keepdim=True, origin=origin)
    centred = g.add("sub", x32, mean, origin=origin)
    var = reduce(g, "mean", g.add("mul", centred, centred, origin=origin), axes, keepdim=True, origin=origin)
    inv = g.add("rsqrt", g.add("add", var, g.constant(float(eps)), origin=origin), origin=origin)
    y = g.add("mul", centred, inv, origin=origin)
    if weight is not None:
        y = g.add("mul", y, weight, origin=origin)
    if bias is not None:
        y = g.add("add", y, bias, origin=origin)
    return _downcast(g, y, dt, origin)


def group_norm(g: Graph, x: int, groups: int, weight: int | None, bias: int | None, eps: float,
               origin=None) -> int:
    """GroupNorm of x [N, C, *spatial]: each of `groups` groups of C // groups channels
    normalised over its channels and positions, then the per-channel affine. Computed on the
    view [N, G, C // G, HW] reduced over its last two axes (one row kernel: the weight and bias
    are read as [1, G, C // G, 1]); half types in fp32, rounded once, as eager's kernels do."""
    shape = tuple(g.node(x).shape)
    n, c = shape[0], shape[1]
    hw = math.prod(shape[2:])
    grouped = (n, groups, c // groups, hw)
    x32, dt = _upcast(g, g.add("reshape", x, shape=grouped, origin=origin), origin)
    mean = reduce(g, "mean", x32, (2, 3), keepdim=True, origin=origin)
    centred = g.add("sub", x32, mean, origin=origin)
    var = reduce(g, "mean", g.add("mul", centred, centred, origin=origin), (2, 3), keepdim=True, origin=origin)
    inv = g.add("rsqrt", g.add("add", var, g.constant(float(eps)), origin=origin), origin=origin)
    y = g.add("mul", centred, inv, origin=origin)
    per_channel = (1, groups, c // groups, 1)
    if weight is not None:
        y = g.add("mul", y, g.add("reshape", weight, shape=per_channel, origin=origin), origin=origin)
    if bias is not None:
        y = g.add("add", y, g.add("reshape", bias, shape=per_channel, origin=origin), origin=origin)
    return g.add("reshape", _downcast(g, y, dt, origin), shape=shape, origin=origin)


def rms_norm(g: Graph, x: int, ndim: int, weight: int | None, eps: float | None, origin=None) -> int:
    """RMSNorm over the last `ndim` axes: x * rsqrt(mean(x^2) + eps) * w (eps defaults to finfo.eps)."""
    rank = len(g.node(x).shape)
    axes = tuple(range(rank - ndim, rank))
    x32, dt = _upcast(g, x, origin)
    if eps is None:
        eps = torch.finfo(dt).eps
    ms = reduce(g, "mean", g.add("mul", x32, x32, origin=origin), axes, keepdim=True, origin=origin)
    inv = g.add("rsqrt", g.add("add", ms, g.constant(float(eps)), origin=origin), origin=origin)
    y = g.add("mul", x32, inv, origin=origin)
    y = _downcast(g, y, dt, origin)
    if weight is not None:
        y = g.add("mul", y, weight, origin=origin)
    return y


def linear(g: Graph, x: int, weight: int, bias: int | None, origin=None) -> int:
    """x @ weight.T + bias, as matmul + add so the planner sees a GEMM and its epilogue."""
    w = g.node(weight)
    wt = g.add("permute", weight, dims=tuple(range(len(w.shape) - 2)) + (len(w.shape) - 1, len(w.shape) - 2)
               if len(w.shape) >= 2 else (0,), origin=origin)
    y = g.add("matmul", x, wt, origin=origin)
    if bias is not None:
        y = g.add("add", y, bias, origin=origin)
    return y


def transpose(g: Graph, x: int, a: int, b: int, origin=None) -> int:
    rank = len(g.node(x).shape)
    dims = list(range(rank))
    a, b = a % rank, b % rank
    dims[a], dims[b] = dims[b], dims[a]
    return g.add("permute", x, dims=tuple(dims), origin=origin)


def causal_mask(g: Graph, sq: int, sk: int, origin=None) -> int:
    """Boolean [sq, sk] mask, True where attention is allowed: tril(full(True)) aligned top-left."""
    full = g.add("full", shape=(sq, sk), value=True, dtype=torch.bool, origin=origin)
    return g.add("tril", full, diagonal=0, origin=origin)


def attention(g: Graph, q: int, k: int, v: int, mask: int | None = None, scale: float | None = None,
              is_causal: bool = False, enable_gqa: bool = False, origin=None, **extra) -> int:
    """An `attention` node: SDPA's arguments, plus any of attention_ref.EXTRA_DEFAULTS
    (softcap, window, mask_fill, score_dtype, empty_rows; attention_ref.py defines them)."""
    unknown = set(extra) - set(EXTRA_DEFAULTS)
    if unknown:
        raise TypeError(f"attention() got unknown attribute(s) {sorted(unknown)}")
    if scale is None:
        scale = 1.0 / math.sqrt(g.node(q).shape[-1])
    attrs = {**EXTRA_DEFAULTS, **extra}
    attrs["softcap"], attrs["window"], attrs["mask_fill"] = (float(attrs["softcap"]), int(attrs["window"]),
                                                             float(attrs["mask_fill"]))
    args = (q, k, v) + ((mask,) if mask is not None else ())
    return g.add("attention", *args, scale=float(scale), is_causal=bool(is_causal),
                 enable_gqa=bool(enable_gqa), origin=origin, **attrs)

"""aten handlers for composites, views, GEMMs and generators (the rest of `fx_ops.HANDLERS`).

Same contract as `fx_ops`: handlers get a `Ctx` and schema-ordered arguments (tensors as
`T`) and return a node id, a list of ids for multi-output ops, or raise `Unmapped`. Each
name a handler is written for is claimed by an op table entry (`minicomp/ir/ops`).
View lowerings trust aten's result shape (`Ctx.out_shape`) rather than re-deriving it, so
`view(-1)`, `squeeze()` and `unflatten` all become one `reshape` to the shape aten computed.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from minicomp.frontend.fx_table import Ctx, Handler, T, Unmapped, lowers
from minicomp.frontend.fx_symbolic import shape_of
from minicomp.ir import composites, dims
from minicomp.ir.ops import views

# --------------------------------------------------------------------------- composites

def _softmax_like(fn) -> Handler:
    def lower(cx: Ctx, x, dim, half_to_float=False):
        src = cx.cast(x, torch.float32) if half_to_float else x.id
        return fn(cx.graph, src, dim, origin=cx.origin)
    return lower


def _softmax_dtype(fn) -> Handler:
    def lower(cx: Ctx, x, dim, dtype=None):
        src = cx.cast(x, dtype) if dtype is not None else x.id
        return fn(cx.graph, src, dim, origin=cx.origin)
    return lower


lowers("_softmax.default")(_softmax_like(composites.softmax))
lowers("_log_softmax.default")(_softmax_like(composites.log_softmax))
lowers("softmax.int")(_softmax_dtype(composites.softmax))
lowers("_safe_softmax.default")(_softmax_dtype(composites.safe_softmax))
lowers("log_softmax.int")(_softmax_dtype(composites.log_softmax))


def _opt(v) -> int | None:
    return None if v is None else v.id


@lowers("native_layer_norm.default")
def _native_layer_norm(cx: Ctx, x, normalized_shape, weight, bias, eps):
    # (out, mean, rstd): only `out` is ever read by inference code
    y = composites.layer_norm(cx.graph, x.id, len(normalized_shape), _opt(weight), _opt(bias), eps,
                              origin=cx.origin)
    return [y, None, None]


@lowers("layer_norm.default")
def _layer_norm(cx: Ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return composites.layer_norm(cx.graph, x.id, len(normalized_shape), _opt(weight), _opt(bias), eps,
                                 origin=cx.origin)


def _static_rank2(cx: Ctx, x: T) -> None:
    shape = tuple(cx.graph.node(x.id).shape)
    if len(shape) < 2 or dims.any_symbolic(shape):
        raise Unmapped("group_norm of fewer than 2 dims or over symbolic sizes")


@lowers("native_group_norm.default")
def _native_group_norm(cx: Ctx, x, weight, bias, n, c, hw, group, eps):
    # (out, mean, rstd): only `out` is lowered
    _static_rank2(cx, x)
    return [composites.group_norm(cx.graph, x.id, int(group), _opt(weight), _opt(bias), eps, origin=cx.origin),
            None, None]


@lowers("group_norm.default")
def _group_norm(cx: Ctx, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    _static_rank2(cx, x)
    return composites.group_norm(cx.graph, x.id, int(num_groups), _opt(weight), _opt(bias), eps, origin=cx.origin)


@lowers("rms_norm.default")
def _rms_norm(cx: Ctx, x, normalized_shape, weight=None, eps=None):
    return composites.rms_norm(cx.graph, x.id, len(normalized_shape), _opt(weight), eps, origin=cx.origin)


@lowers("_fused_rms_norm.default")
def _fused_rms_norm(cx: Ctx, x, normalized_shape, weight=None, eps=None):
    # CUDA's rms_norm: (out, rstd)
    return [composites.rms_norm(cx.graph, x.id, len(normalized_shape), _opt(weight), eps, origin=cx.origin),
            None]


def _attention(cx: Ctx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    if dropout_p:
        raise Unmapped("attention dropout")
    return composites.attention(cx.graph, q.id, k.id, v.id, _opt(mask), scale=scale, is_causal=is_causal,
                                enable_gqa=enable_gqa, origin=cx.origin)


@lowers("minicomp::sdpa.default")
def lower_sdpa(cx: Ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """minicomp::sdpa, the traced stand-in for F.scaled_dot_product_attention."""
    return _attention(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@lowers("_scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_cpu(cx: Ctx, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    # reached only when SDPA is called in a way fx.py does not intercept; (out, logsumexp).
    # Fewer key/value heads than query heads (SDPA's enable_gqa=True, which transformers passes
    # when no mask is given) reach this op as they are: it is grouped-query attention.
    gqa = len(cx.shape(q)) >= 3 and cx.shape(k)[-3] != cx.shape(q)[-3]
    return [_attention(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa), None]


# --------------------------------------------------------------------------- views

@lowers("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
        "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "flatten.using_ints",
        "unflatten.int", "view_as.default")
def _reshape(cx: Ctx, x, *_):
    # every reshape-like view ends at the shape aten computed
    return cx.reshape(x, cx.out_shape)


@lowers("expand.default")
def _expand(cx: Ctx, x, size, implicit=False):
    return x.id if cx.shape(x) == cx.out_shape else cx.add("expand", x, shape=cx.out_shape)


@lowers("permute.default")
def _permute(cx: Ctx, x, dims):
    rank = len(cx.shape(x))
    dims = tuple(d % rank for d in dims) if rank else ()
    return x.id if dims == tuple(range(rank)) else cx.add("permute", x, dims=dims)


@lowers("transpose.int")
def _transpose(cx: Ctx, x, dim0, dim1):
    rank = len(cx.shape(x))
    if rank < 2 or dim0 % rank == dim1 % rank:
        return x.id
    return composites.transpose(cx.graph, x.id, dim0, dim1, origin=cx.origin)


@lowers("t.default", "numpy_T.default")
def _t(cx: Ctx, x):
    rank = len(cx.shape(x))
    return x.id if rank < 2 else cx.add("permute", x, dims=tuple(reversed(range(rank))))


def _slice(cx: Ctx, x: int, dim: int, start, end, step: int) -> int:
    shape = cx.graph.node(x).shape
    dim %= len(shape)
    size = shape[dim]
    if dims.is_symbolic(size) and step == 1 and start in (None, 0) and (end is None or end is size
                                                                      or (isinstance(end, int) and end >= 2 ** 62)):
        return x   # the whole of a symbolic dim (`x[:, :, None]` traces as such a slice): nothing to bound
    if any(dims.is_symbolic(v) for v in (size, start, end)):
        start, end = _symbolic_bounds(size, start, end, step)
        return x if (start, end) == (0, size) else cx.add("slice", x, dim=dim, start=start, end=end, step=1)
    start, end, _ = slice(start, end, step).indices(size)
    end = max(end, start)  # an empty slice stays empty
    if (start, end, step) == (0, size, 1):
        return x
    return cx.add("slice", x, dim=dim, start=start, end=end, step=step)


def _symbolic_bounds(size, start, end, step: int) -> tuple:
    """(start, end) of `x[start:end]` along a dim where the size or a bound is symbolic
    (`position_ids[:, :seq_len]` under dynamic shapes). Python's slicing counts a negative
    bound from the end and clamps one past the size (or before 0); over symbols that is taken
    only where the symbols' ranges show no clamp happens (Dynamo refines a symbol's range with the guard
    `s <= 512` it records for such a slice), else SymbolicDim says which bound is undecided."""
    start = 0 if start is None else start
    end = size if end is None or (isinstance(end, int) and end >= 2 ** 62) else end
    # a negative int counts from the end: size + bound, kept only where the ranges show it is
    # not negative (no clamp): a sliding-window cache's keys[:, :, 1 - window:], which Dynamo
    # guards with length >= window - 1
    start = size + start if isinstance(start, int) and start < 0 else start
    end = size + end if isinstance(end, int) and end < 0 else end
    if not views.symbolic_slice_fits(size, start, end, step):
        raise dims.SymbolicDim(f"slice [{start}:{end}:{step}] of a dim of size {size}: over symbols, a slice "
                               "needs step 1 and bounds the sizes' ranges keep within [0, size]")
    return start, end


@lowers("slice.Tensor")
def _slice_tensor(cx: Ctx, x, dim=0, start=None, end=None, step=1):
    return _slice(cx, x.id, dim, start, end, step)


@lowers("narrow.default")
def _narrow(cx: Ctx, x, dim, start, length):
    size = cx.shape(x)[dim]
    start = start % size if start < 0 else start
    return _slice(cx, x.id, dim, start, start + length, 1)


def _select(cx: Ctx, x: int, dim: int, index: int, out_shape: tuple[int, ...]) -> int:
    # select = slice of one element, then drop the axis
    shape = cx.graph.node(x).shape
    dim %= len(shape)
    if index < 0:       # from the end (x[:, -1]); over a symbolic size the start is an expression
        index += shape[dim]
    return cx.reshape(_slice(cx, x, dim, index, index + 1, 1), out_shape)


@lowers("select.int")
def _select_int(cx: Ctx, x, dim, index):
    return _select(cx, x.id, dim, index, cx.out_shape)


@lowers("unbind.int")
def _unbind(cx: Ctx, x, dim=0):
    return [_select(cx, x.id, dim, i, shape_of(cx.graph, v)) for i, v in enumerate(cx.val)]


def _split_at(cx: Ctx, x: T, sizes: list[int], dim: int) -> list[int]:
    dim %= len(cx.shape(x))
    out, start = [], 0
    for s in sizes:
        out.append(_slice(cx, x.id, dim, start, start + s, 1))
        start += s
    return out


@lowers("split.Tensor")
def _split(cx: Ctx, x, split_size, dim=0):
    return _split_at(cx, x, [shape_of(cx.graph, v)[dim] for v in cx.val], dim)


@lowers("split_with_sizes.default")
def _split_with_sizes(cx: Ctx, x, split_sizes, dim=0):
    return _split_at(cx, x, list(split_sizes), dim)


@lowers("cat.default")
def _cat(cx: Ctx, tensors, dim=0):
    # legacy: 1-D empty tensors are skipped by torch.cat
    parts = [t for t in tensors if not (cx.shape(t) == (0,) and len(cx.out_shape) != 1)]
    if len(parts) == 1:
        return parts[0].id
    return cx.add("cat", *parts, dim=dim % len(cx.out_shape))


@lowers("stack.default")
def _stack(cx: Ctx, tensors, dim=0):
    rank = len(cx.out_shape)
    dim %= rank
    parts = []
    for t in tensors:
        shape = cx.shape(t)
        parts.append(cx.reshape(t, shape[:dim] + (1,) + shape[dim:]))
    return parts[0] if len(parts) == 1 else cx.add("cat", *parts, dim=dim)


@lowers("repeat.default")
def _repeat(cx: Ctx, x, repeats):
    # x[a, b].repeat(r0, r1) == expand([r0, a, r1, b]).reshape([r0*a, r1*b]) (leading axes added first)
    shape = (1,) * (len(repeats) - len(cx.shape(x))) + cx.shape(x)
    interleaved = tuple(v for s in shape for v in (1, s))
    big = tuple(v for r, s in zip(repeats, shape) for v in (r, s))
    y = cx.reshape(x, interleaved)
    if big != interleaved:
        y = cx.add("expand", y, shape=big)
    return cx.reshape(y, cx.out_shape)


@lowers("repeat_interleave.self_int")
def _repeat_interleave(cx: Ctx, x, repeats, dim=None, output_size=None):
    # repeating each slice along `dim` = unsqueeze after dim, expand, merge (grouped KV heads)
    src = x.id if dim is not None else cx.reshape(x, (math.prod(cx.shape(x)),))
    shape = cx.graph.node(src).shape
    dim = 0 if dim is None else dim % len(shape)
    y = cx.reshape(src, shape[:dim + 1] + (1,) + shape[dim + 1:])
    y = cx.add("expand", y, shape=shape[:dim + 1] + (repeats,) + shape[dim + 1:])
    return cx.reshape(y, cx.out_shape)


# --------------------------------------------------------------------------- gemm

# mm, bmm, matmul, dot, mv and minicomp::matmul lower generically (`fx_ops.direct`)

def _scaled(cx: Ctx, x: int, factor) -> int:
    return x if factor == 1 else cx.add("mul", x, cx.const(factor))


@lowers("addmm.default", "baddbmm.default", "addmv.default")
def _addmm(cx: Ctx, bias, a, b, beta=1, alpha=1):
    # beta * bias + alpha * (a @ b), as matmul then add so the bias is a GEMM epilogue
    y = _scaled(cx, cx.add("matmul", a, b), alpha)
    if beta == 0:
        return y
    return cx.add("add", y, _scaled(cx, bias.id, beta))


@lowers("linear.default", "minicomp::linear.default")
def _linear(cx: Ctx, x, weight, bias=None):
    return composites.linear(cx.graph, x.id, weight.id, _opt(bias), origin=cx.origin)


# --------------------------------------------------------------------------- generators

def _full_of(value_of: Callable[..., Any]) -> Handler:
    def lower(cx: Ctx, *args):
        value = cx.fitting(value_of(*args), cx.out_dtype, "fill value")
        return cx.add("full", shape=cx.out_shape, value=value, dtype=cx.out_dtype)
    return lower


lowers("full.default")(_full_of(lambda size, value, *_: value))
lowers("new_full.default")(_full_of(lambda x, size, value, *_: value))
lowers("full_like.default")(_full_of(lambda x, value, *_: value))
lowers("ones.default", "ones_like.default", "new_ones.default")(_full_of(lambda *_: 1))
lowers("zeros.default", "zeros_like.default", "new_zeros.default")(_full_of(lambda *_: 0))


@lowers("scalar_tensor.default")
def _scalar_tensor(cx: Ctx, value, *_):
    return cx.const(cx.fitting(value, cx.out_dtype, "scalar_tensor value"), dtype=cx.out_dtype)


@lowers("arange.default")
def _arange(cx: Ctx, end, *_):
    return cx.add("arange", start=0, end=end, step=1, dtype=cx.out_dtype)


@lowers("arange.start")
def _arange_start(cx: Ctx, start, end, *_):
    if dims.is_symbolic(start) and cx.out_dtype == torch.int64:
        # arange(past, past + n) over symbols (a decode step's cache positions): arange(n) + past,
        # the start a size kernels compute (the arange op's own start is an int)
        base = cx.add("arange", start=0, end=end - start, step=1, dtype=torch.int64)
        return cx.add("add", base, cx.operand(start))
    return cx.add("arange", start=start, end=end, step=1, dtype=cx.out_dtype)


@lowers("arange.start_step")
def _arange_step(cx: Ctx, start, end, step=1, *_):
    return cx.add("arange", start=start, end=end, step=step, dtype=cx.out_dtype)


@lowers("eye.default", "eye.m")
def _eye(cx: Ctx, *_):
    # the diagonal is what both triu and tril keep
    ones = cx.add("full", shape=cx.out_shape, value=1, dtype=cx.out_dtype)
    return cx.add("tril", cx.add("triu", ones, diagonal=0), diagonal=0)

# tril and triu lower generically (`fx_ops.direct`)

"""aten handlers for indirect loads: embedding, advanced indexing, index_select, gather,
take_along_dim (the ops `index` and `gather`, minicomp/ir/ops/indexing.py).

Same contract as `fx_ops`: handlers get a `Ctx` and schema-ordered arguments (tensors as `T`)
and return a node id or raise `Unmapped`. Each node records the eager op it stands for
(`mode`), which decides what a bad index does: the compiled call raises that op's kind of
error (IndexError or RuntimeError) before any kernel reads through it.

Boolean and uint8 index tensors are masks (`x[mask]`): the output's shape depends on how many
elements are True, which no static graph can say. They are not lowered here; capture refuses
the call with a clear error (`refuse_data_dependent`, which fx.py asks of every call).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils._pytree as pytree

from minicomp.errors import MinicompError
from minicomp.frontend.fx_table import Ctx, T, Unmapped, lowers
from minicomp.ir.graph import Graph
from minicomp.ir.ops.indexing import INDEX_DTYPES


def _index_tensor(cx: Ctx, t) -> T:
    if not isinstance(t, T) or cx.dtype(t) not in INDEX_DTYPES:
        raise Unmapped(f"index of dtype {cx.dtype(t) if isinstance(t, T) else type(t).__name__}")
    return t


@lowers("embedding.default")
def _embedding(cx: Ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx, scale_grad_by_freq and sparse change only the backward
    if len(cx.shape(weight)) != 2:
        raise Unmapped("embedding of a table that is not 2-D")
    return cx.add("index", weight, _index_tensor(cx, indices), dims=(0,), mode="embedding")


@lowers("index.Tensor", "_unsafe_index.Tensor")
def _index(cx: Ctx, x, indices):
    # x[..., i, ..., j]: the positions of the tensors in `indices` are the dims they index
    dims, tensors = [], []
    for d, t in enumerate(indices):
        if t is None:
            continue
        dims.append(d)
        tensors.append(_index_tensor(cx, t))
    if not tensors:
        return x.id
    return cx.add("index", x, *tensors, dims=tuple(dims), mode="index")


@lowers("index_select.default")
def _index_select(cx: Ctx, x, dim, index):
    rank = len(cx.shape(x))
    if rank == 0:
        raise Unmapped("index_select of a 0-d tensor")
    index = _index_tensor(cx, index)
    # a 0-d index selects one element and keeps the dimension, as a 1-element index does
    return cx.add("index", x, cx.reshape(index, (math.prod(cx.shape(index)),)), dims=(dim % rank,),
                  mode="index_select")


@lowers("gather.default")
def _gather(cx: Ctx, x, dim, index, sparse_grad=False):
    rank = len(cx.shape(x))
    if rank == 0 or len(cx.shape(index)) != rank:
        raise Unmapped("gather of a 0-d tensor")
    return cx.add("gather", x, _index_tensor(cx, index), dim=dim % rank, mode="gather")


@lowers("take_along_dim.default")
def _take_along_dim(cx: Ctx, x, indices, dim=None):
    if not isinstance(indices, T) or cx.dtype(indices) != torch.int64:
        raise Unmapped("take_along_dim takes int64 indices only (eager refuses others)")
    if dim is None:
        # over the flattened tensor
        flat_x = cx.reshape(x, (math.prod(cx.shape(x)),))
        flat_i = cx.reshape(indices, (math.prod(cx.shape(indices)),))
        return cx.add("gather", flat_x, flat_i, dim=0, mode="take_along_dim")
    xs, js = cx.shape(x), cx.shape(indices)
    if len(xs) != len(js) or not xs:
        raise Unmapped("take_along_dim of tensors of different ranks")
    dim %= len(xs)
    # both broadcast over every dim but `dim`
    common = torch.broadcast_shapes(xs[:dim] + (1,) + xs[dim + 1:], js[:dim] + (1,) + js[dim + 1:])
    want_x, want_i = common[:dim] + (xs[dim],) + common[dim + 1:], common[:dim] + (js[dim],) + common[dim + 1:]
    xe = x.id if xs == want_x else cx.add("expand", x, shape=tuple(want_x))
    ie = indices.id if js == want_i else cx.add("expand", indices, shape=tuple(want_i))
    return cx.add("gather", xe, ie, dim=dim, mode="take_along_dim")


def _unbacked(t: torch.Tensor) -> bool:
    if all(isinstance(d, int) for d in t.shape):
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return bool(free_unbacked_symbols(t))


def refuse_data_dependent(g: Graph, node: Any, args: tuple, origin: str | None) -> None:
    """Refuse an aten call whose output shape depends on its inputs' values (`x[mask]`, nonzero,
    masked_select): make_fx records it with a symbolic size, which no graph of static shapes
    (minicomp's) can hold. A clear error at the user's line (it used to crash the planner)."""
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    # sizes from the inputs' symbols are fine (a graph over symbolic sizes); a size no input
    # has (an "unbacked" symbol: how many elements a mask selects) is what is refused
    if all(not isinstance(v, torch.Tensor) or not _unbacked(v) for v in vals):
        return
    masks = [a for a in pytree.tree_leaves(args)
             if isinstance(a, T) and g.node(a.id).dtype in (torch.bool, torch.uint8)]
    what = f"{node.target}" + (" with a boolean mask (x[mask])" if masks and "index" in str(node.target) else "")
    raise MinicompError(f"{origin or node.name}: {what} has an output shape that depends on the values of its "
                        "inputs (how many elements are selected), and minicomp compiles graphs of static shapes. "
                        "Keep the shape (torch.where(mask, x, 0), masked_fill) or run this part in PyTorch")


@lowers("nll_loss_forward.default")
def _nll_loss_forward(cx: Ctx, x, target, weight, reduction, ignore_index):
    """(output, total_weight) of log-probabilities x [N, C] and classes target [N]:
    -x[i, t_i] weighted by weight[t_i] (1 without weights), 0 where t_i == ignore_index;
    summed, or over the total weight for the mean. The class read is a gather at
    where(t == ignore, 0, t), which reaches it through memory, so call() checks it against
    [0, C-1] first: eager's error for a class out of range. Only `output` is lowered."""
    if len(cx.shape(x)) != 2 or len(cx.shape(target)) != 1 or reduction not in (0, 1, 2):
        raise Unmapped("nll_loss of other than [N, C] log-probabilities and [N] classes")
    n = cx.shape(x)[0]
    target = _index_tensor(cx, target)
    ignore = cx.const(int(ignore_index), dtype=cx.dtype(target))
    kept = cx.add("ne", target, ignore)
    classes = cx.add("where", kept, target, cx.const(0, dtype=cx.dtype(target)))
    picked = cx.reshape(cx.add("gather", x, cx.reshape(classes, (n, 1)), dim=1, mode="nll_loss"), (n,))
    w = cx.cast(kept, cx.dtype(x))
    if weight is not None:
        w = cx.add("mul", w, cx.add("gather", weight, classes, dim=0, mode="nll_loss"))
    loss = cx.add("mul", cx.add("neg", picked), w)
    if reduction == 0:
        return [loss, None]
    total = cx.add("sum", loss, axes=(0,), keepdim=False)
    if reduction == 2:
        return [total, None]
    return [cx.add("div", total, cx.add("sum", w, axes=(0,), keepdim=False)), None]

"""The `pretranspose` pass: misaligned transposed weights stored transposed, once.

A constant weight W[.., N, K] used only as `W^T` (a permute of the last two axes) for the
B operand of matmuls is replaced by one new constant W^T stored [.., K, N] when its rows
are not 16-byte aligned (K * itemsize % 16 != 0) but the transposed rows are: Triton
specialises pointers and strides divisible by 16, and only then vectorises the loads.
Aligned weights stay as they are: a tiled `tl.dot` reads either layout at full speed, and
the copy would double the constant's memory. Weights are constants only under
`minicomp.compile(fn, freeze=True)` (otherwise they are graph inputs read at every call,
in the caller's layout), so only frozen weights are ever pre-transposed.

This is the part of layout choice that rewrites the graph, so it is a pass and runs before
the planner; the strides of what kernels write are chosen after planning, from the plan
(`minicomp.plan.layout.assign_layout`). Invariant: the new constant computes what
`permute(W)` did (same shape, dtype and values); the graph's outputs are unchanged.
"""

from __future__ import annotations

import torch

from minicomp.ir.dtypes import itemsize
from minicomp.ir.graph import Graph
from minicomp.passes.registry import Changes, register_pass

ALIGN = 16  # bytes


def _swaps_last_two(dims: tuple[int, ...]) -> bool:
    r = len(dims)
    return r >= 2 and tuple(dims) == tuple(range(r - 2)) + (r - 1, r - 2)


def pretranspose_weights(g: Graph) -> int:
    """Store transposed constant weights transposed (in place on `g`), where that aligns
    their rows; returns how many were."""
    count = 0
    for cid in g.topo_order():
        if cid not in g:
            continue
        c = g.node(cid)
        if c.op != "constant" or not isinstance(c.attrs["value"], torch.Tensor) or len(c.shape) < 2:
            continue
        users = [g.node(u) for u in g.users(cid)]
        if not users or not all(u.op == "permute" and _swaps_last_two(u.attrs["dims"]) for u in users):
            continue
        if not all(g.node(m).op == "matmul" and g.node(m).args[1] == u.id and g.node(m).args[0] != u.id
                   for u in users for m in g.users(u.id)):
            continue
        size = itemsize(c.dtype)
        if (c.shape[-1] * size) % ALIGN == 0 or (c.shape[-2] * size) % ALIGN != 0:
            continue
        value = c.attrs["value"].transpose(-2, -1).contiguous()
        label = c.attrs.get("label")
        new = g.constant(value, origin=c.origin, label=f"{label}.T" if label else None)
        for u in users:
            g.replace_all_uses(u.id, new)
            g.remove(u.id)
        g.remove(cid)
        count += 1
    return count


@register_pass("pretranspose")
def pretranspose_pass(graph: Graph) -> tuple[Graph, Changes]:
    """Misaligned transposed weights stored transposed (strides come after planning)."""
    g = graph.copy()
    return g, {"pretransposed": pretranspose_weights(g)}

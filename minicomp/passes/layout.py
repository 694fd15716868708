"""The `layout` pass: strides for every tensor a kernel writes, and pre-transposed weights.

Invariants after the pass:
- every node some group writes (per `plan_graph` of the result) has `layout` set, so the
  dump shows `strides=[...]`; nodes no kernel writes (values inside a kernel, views)
  keep `layout=None`: views are never materialised, kernels fold them into the strides
  they read through;
- graph outputs are contiguous (what eager PyTorch returns), and so is whatever an opaque
  node (PyTorch) writes;
- an intermediate read only through one permute that keeps the last axis in place is
  written in the permuted order, so the permuted view is contiguous (attention's
  [B, H, S, D] output written as [B, S, H, D] memory: the `permute + reshape` before the
  output projection becomes a plain contiguous view, and both the writer and the reader
  keep unit stride on the innermost axis);
- an intermediate that only row kernels read, reducing axes that are not innermost, is
  written with those axes innermost (the reduced axis contiguous for row kernels);
- everything else is contiguous.

Pre-transposition: a constant weight W[.., N, K] used only as `W^T` (a permute of the
last two axes) for the B operand of matmuls is replaced by one new constant W^T stored
[.., K, N] when its rows are not 16-byte aligned (K * itemsize % 16 != 0) but the
transposed rows are: Triton specialises pointers and strides divisible by 16, and only
then vectorises the loads. Aligned weights stay as they are: a tiled `tl.dot` reads
either layout at full speed, and the copy would double the constant's memory.
Weights are constants only under `minicomp.compile(fn, freeze=True)` (otherwise they are
graph inputs read at every call, in the caller's layout), so only frozen weights are ever
pre-transposed.
"""

from __future__ import annotations

import torch

from minicomp.ir.dtypes import itemsize
from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.passes.cost import get_machine
from minicomp.passes.plan_memo import leave_plan
from minicomp.passes.registry import Changes, register_pass

ALIGN = 16  # bytes
PLAN_MACHINE = "h200"   # the plan that decides which tensors are written (plan_graph's default)


def strides_for_order(shape: tuple[int, ...], order: list[int]) -> tuple[int, ...]:
    """Strides that lay `shape` out with axes in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


def _swaps_last_two(dims: tuple[int, ...]) -> bool:
    r = len(dims)
    return r >= 2 and tuple(dims) == tuple(range(r - 2)) + (r - 1, r - 2)


def pretranspose_weights(g: Graph) -> int:
    """Store transposed constant weights transposed, where that aligns their rows."""
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


def _permute_reader(g: Graph, nid: int) -> tuple[int, ...] | None:
    """dims, when `nid` is read only through one permute that keeps the last axis last."""
    users = g.users(nid)
    if len(users) != 1:
        return None
    u = g.node(users[0])
    if u.op != "permute" or nid in g.outputs:
        return None
    dims = tuple(u.attrs["dims"])
    if dims[-1] != len(dims) - 1 or dims == tuple(range(len(dims))):
        return None
    return dims


def _reduced_axes(g: Graph, nid: int, plan, writer) -> tuple[int, ...] | None:
    """The axes of `nid` that every reading group reduces, if all readers are row kernels."""
    found: set[tuple[int, ...]] = set()
    for grp in plan.groups:
        if grp is writer or nid not in grp.inputs:
            continue
        if grp.kind != "reduction":
            return None
        for r in grp.nodes:
            rn = g.node(r)
            if rn.kind == "reduction" and rn.args[0] == nid:
                rank = len(g.node(nid).shape)
                axes = tuple(rn.attrs.get("axes", ())) or tuple(range(rank))
                found.add(tuple(sorted(a % rank for a in axes)))
            elif nid in rn.args:
                return None   # read elementwise too: leave it contiguous
    return found.pop() if len(found) == 1 else None


def choose_strides(g: Graph, nid: int, plan, writer) -> tuple[int, ...]:
    n = g.node(nid)
    if nid in g.outputs or writer.kind == "opaque":   # PyTorch hands back contiguous tensors
        return contiguous_strides(n.shape)
    dims = _permute_reader(g, nid)
    if dims is not None:
        # strides[dims[i]] = contiguous strides of the permuted shape at i
        permuted = contiguous_strides(tuple(n.shape[d] for d in dims))
        strides = [0] * len(dims)
        for i, d in enumerate(dims):
            strides[d] = permuted[i]
        return tuple(strides)
    axes = _reduced_axes(g, nid, plan, writer)
    if axes:
        order = [a for a in range(len(n.shape)) if a not in axes] + list(axes)
        return strides_for_order(n.shape, order)
    return contiguous_strides(n.shape)


def choose_layout(graph: Graph) -> Graph:
    """The layout pass as a plain function (a new graph)."""
    return _layout(graph)[0]


def _layout(graph: Graph) -> tuple[Graph, Changes]:
    from minicomp.passes.fusion import plan_graph
    g = graph.copy()
    pre = pretranspose_weights(g)
    machine = get_machine(PLAN_MACHINE)
    plan = plan_graph(g, machine)
    changed = strided = 0
    written = {o: grp for grp in plan.groups for o in grp.outputs}
    for nid in g.topo_order():
        n = g.node(nid)
        if n.op in ("input", "constant"):
            continue
        new = choose_strides(g, nid, plan, written[nid]) if nid in written else None
        if new != contiguous_strides(n.shape) and new is not None:
            strided += 1
        if n.layout != new:
            n.layout = new
            changed += 1
    leave_plan(g, machine, plan)   # strides are all that changed: the compile's plan of g is this one
    return g, {"pretransposed": pre, "laid_out": changed, "non_contiguous": strided if changed else 0}


@register_pass("layout")
def layout_pass(graph: Graph) -> tuple[Graph, Changes]:
    """Strides for every tensor a kernel writes; permutes folded; weights pre-transposed."""
    return _layout(graph)

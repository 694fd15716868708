"""Layout assignment: strides for every tensor a kernel writes, chosen from the plan.

`assign_layout(graph, plan) -> Graph` runs after planning (`passes -> plan -> layout ->
codegen`, wired by minicomp/api): which tensors reach memory, and who reads them, is the plan's
decision, so the strides follow it instead of planning again. The planner never reads
strides, so `plan` stays the plan of the graph this returns (same nodes, same ids).

Invariants of the result:
- every node some group of `plan` writes has `layout` set, so the dump shows
  `strides=[...]`; nodes no kernel writes (values inside a kernel, views) keep
  `layout=None`: views are never materialised, kernels fold them into the strides
  they read through; inputs and constants keep theirs;
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
The caller's graph is not changed. (Misaligned transposed weights are stored transposed
before planning, by the `pretranspose` pass: that rewrite changes the graph.)
"""

from __future__ import annotations

from minicomp.errors import CompileError
from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.plan.records import Group, Plan


def strides_for_order(shape: tuple[int, ...], order: list[int]) -> tuple[int, ...]:
    """Strides that lay `shape` out with axes in `order` (outermost first)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


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


def _reduced_axes(g: Graph, nid: int, plan: Plan, writer: Group) -> tuple[int, ...] | None:
    """The axes of `nid` that every reading group reduces, if all readers are row kernels."""
    found: set[tuple[int, ...]] = set()
    for grp in plan.groups:
        if grp is writer or nid not in grp.inputs:
            continue
        if grp.kind != "reduction":
            return None
        for r in grp.nodes:
            rn = g.node(r)
            if rn.kind in ("reduction", "scan") and rn.args[0] == nid:
                found.add(grp.spec.axes)   # the group's domain: every reduction in it reduces these
            elif nid in rn.args:
                return None   # read elementwise too: leave it contiguous
    return found.pop() if len(found) == 1 else None


def choose_strides(g: Graph, nid: int, plan: Plan, writer: Group) -> tuple[int, ...]:
    """The strides `writer` writes node `nid` with (see the module docstring)."""
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


def assign_layout(graph: Graph, plan: Plan) -> Graph:
    """A copy of `graph` with the strides of every tensor `plan` writes (module docstring)."""
    written = {o: grp for grp in plan.groups for o in grp.outputs}
    missing = sorted(o for o in written if o not in graph)
    if missing:
        raise CompileError(f"the plan for {plan.graph_name!r} writes %{missing[0]}, which graph "
                           f"{graph.name!r} does not have: a plan lays out only the graph it was made for")
    g = graph.copy()
    for nid in g.topo_order():
        n = g.node(nid)
        if n.op in ("input", "constant"):
            continue
        n.layout = choose_strides(g, nid, plan, written[nid]) if nid in written else None
    return g

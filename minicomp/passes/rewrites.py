"""Simplify's rules that move a view or a matmul to where a kernel can use it.

Each is a rule of `simplify` (same contract: it returns a node computing exactly the tensor
the node it looks at computes, or None): `slice_of_matmul` cuts a matmul whose halves are
joined into two matmuls (a dual GEMM), `gather_of_row_shift` moves a per-row shift after a
gather (cross entropy reads the logits, not a log-softmax), `reshape_sink` moves a reshape
below a unary op (a row kernel computes the op too).
"""

from __future__ import annotations

from minicomp.ir.composites import linear_bias
from minicomp.ir.graph import Graph, Node


def _only_operand(g: Graph, n: Node, op: str) -> Node | None:
    """n's single tensor operand if it is an `op` node, else None."""
    if len(n.args) != 1:
        return None
    inner = g.node(n.args[0])
    return inner if inner.op == op else None


def pointwise_join(g: Graph, x: int, y: int, depth: int = 4, through: tuple[str, ...] = ()) -> bool:
    """Whether some pointwise node depends on both `x` and `y` through pointwise nodes only
    (and ops named in `through`: the reshapes of aten's `view -> mm -> view` linears), at most
    `depth` steps from each: where a dual GEMM's two results meet."""
    def reach(start: int) -> set[int]:
        seen, frontier = set(), {start}
        for _ in range(depth):
            frontier = {u for f in frontier for u in g.users(f)
                        if g.node(u).kind == "pointwise" or g.node(u).op in through} - seen
            seen |= frontier
        return seen
    return any(g.node(n).kind == "pointwise" for n in reach(x) & reach(y))


def slice_of_matmul(g: Graph, n: Node) -> int | None:
    # slice(A @ B [+ bias], last dim) -> A @ slice(B) [+ slice(bias)] when A @ B is cut in two
    # along its last dim and a pointwise node joins the halves: each output column is the same
    # dot product either way. A fused gate/up projection (Phi-3's `gate_up_proj(x).chunk(2, -1)`)
    # becomes two matmuls sharing A, which the planner makes one dual GEMM with their join
    # (also through a reshape that regroups only the rows: aten's view -> addmm -> view linears)
    if n.attrs["dim"] % len(n.shape) != len(n.shape) - 1:
        return None
    src = g.node(n.args[0])
    view = src if src.op == "reshape" and src.id not in g.outputs else None
    inner = g.node(view.args[0]) if view is not None else src
    found = _projection(g, inner)
    if found is None or (view is not None and (view.shape[-1:] != inner.shape[-1:] or g.users(inner.id) != [view.id])):
        return None
    mm, bias = found
    users = [g.node(u) for u in g.users(src.id)]
    if any(u.op != "slice" or u.attrs["dim"] % len(u.shape) != len(u.shape) - 1 for u in users):
        return None
    if len(users) != 2 or not pointwise_join(g, users[0].id, users[1].id):
        return None     # a q/k/v split stays one GEMM: three would read A three times for nothing
    a, b = mm.args

    def columns(sl: Node) -> int:
        cut = dict(dim=-1, start=sl.attrs["start"], end=sl.attrs["end"], step=sl.attrs["step"], origin=sl.origin)
        out = g.add("matmul", a, g.add("slice", b, **cut), origin=sl.origin)
        if bias is not None:
            out = g.add("add", out, g.add("slice", bias, **cut), origin=sl.origin)
        return out if view is None else g.add("reshape", out, shape=tuple(sl.shape), origin=sl.origin)
    other = next(u for u in users if u.id != n.id)
    g.replace_all_uses(other.id, columns(other))    # both halves at once: the pair is the pattern
    return columns(n)


def _projection(g: Graph, node: Node) -> tuple[Node, int | None] | None:
    """(the matmul, its bias or None) when `node` is A @ B with a 2-D or batched B, or
    A @ B + bias with a 1-D bias along N that is the matmul's only user; else None."""
    bias = None
    if node.op == "add":
        mm = next((g.node(x) for x in node.args if g.node(x).op == "matmul"), None)
        bias = None if mm is None else linear_bias(g, node.id, mm.id)
        if bias is None or g.users(mm.id) != [node.id] or mm.id in g.outputs:
            return None
        node = mm
    if node.op != "matmul" or len(g.node(node.args[1]).shape) < 2 or node.id in g.outputs:
        return None
    return node, bias


def gather_of_row_shift(g: Graph, n: Node) -> int | None:
    # gather(a -/+ b, idx, dim) -> gather(a, idx, dim) -/+ b when b is one value per gathered
    # row (b's shape is the gather's: extent 1 along dim): the same element, shifted the same.
    # log_softmax's shift (x - max - log sum exp) then comes after the gather, which reads x
    # itself: cross entropy's picked log-probability needs no [N, C] log-softmax in memory
    # (a is gathered again, not recomputed: a - b may have other users, exp(x - max) does;
    # a cast commutes with the gather too: a half log_softmax is rounded after its shift)
    p = g.node(n.args[0])
    if p.op == "cast":
        return g.add("cast", g.add("gather", p.args[0], n.args[1], origin=n.origin, **n.attrs),
                     dtype=p.attrs["dtype"], origin=p.origin)
    if p.op not in ("sub", "add") or len(p.args) != 2:
        return None
    a, b = (g.node(x) for x in p.args)
    dim = n.attrs["dim"] % len(n.shape)
    for row, other, first in ((b, a, False), (a, b, True)):
        if tuple(row.shape) == tuple(n.shape) and row.shape[dim] == 1 and tuple(other.shape) == tuple(p.shape) \
                and row.dtype == p.dtype and other.dtype == p.dtype:
            picked = g.add("gather", other.id, n.args[1], origin=n.origin, **n.attrs)
            args = (row.id, picked) if first else (picked, row.id)
            return g.add(p.op, *args, origin=p.origin)
    return None


def reshape_sink(g: Graph, n: Node) -> int | None:
    # f(reshape(x)) -> reshape(f(x)) for a unary elementwise f (not a cast) that is the
    # reshape's only user: the same values at the same row-major positions. The reshape moves
    # past the op, so a row kernel computing x also computes f (GroupNorm's view back to
    # [N, C, H, W], then SiLU: one kernel)
    if n.kind != "pointwise" or n.op == "cast" or len(n.args) != 1:
        return None
    r = _only_operand(g, n, "reshape")
    if r is None or g.users(r.id) != [n.id] or r.id in g.outputs:
        return None
    src = g.node(r.args[0])
    if src.kind in ("input", "constant", "view"):
        return None      # nothing computes it here: no kernel gains
    inner = g.add(n.op, src.id, origin=n.origin, **n.attrs)
    return g.add("reshape", inner, shape=tuple(n.shape), origin=r.origin)

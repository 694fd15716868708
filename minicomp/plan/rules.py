"""Legality of a candidate group, separate from its profit.

`check(graph, nodes, outputs)` says whether one kernel may compute `nodes` and write
`outputs`, and returns None, or the reason it may not (a sentence naming the nodes).
Cycles between groups are the planner's business (they depend on the other groups);
everything about the group itself is here. The rules are the Group semantics of
contracts.md:

- opaque: one opaque node, nothing else (PyTorch runs it; nothing fuses across it).
- pointwise: pointwise and view nodes; every output has one shape (the iteration space).
  Values of fewer elements are evaluated again at each element of it; the ledger flops that
  costs an element stay under `cost.RECOMPUTE_FLOPS` (rotary's cos and sin, recomputed for
  every head, are one kernel of their own instead).
  A view of a value the group computes is allowed: the operand is evaluated at the
  remapped index (rotary's `cat(-x2, x1)`), since no reduction sits underneath it.
- reduction: one domain (every reduction reduces a tensor of shape S over axes A, every
  scan scans one of shape S along the one axis of A); other nodes are per element of S
  (a scan's result is one) or per row (S reduced over A); a per-row value must line up
  with the rows it is broadcast back to (a keepdim=False statistic of shape [M] may not
  broadcast against [M, N] as numpy would, along the wrong axis); a row kernel may
  re-shape a value it computes only by adding or dropping unit axes, or expand it;
  outputs have shape S or the reduced shape, or are a reshape or permute of such a value that
  nothing in the kernel reads (`x.softmax(-1).view(...)`: stored at the view's index). A row
  too wide for one block stays legal: the emitter loops over it (recorded in the group's reason).
- gemm: one matmul (or two sharing operand A whose results meet in one pointwise join:
  the dual GEMM of SwiGLU); a prologue of views and casts on its operands; an epilogue of
  pointwise nodes of the matmul's output shape that depend on it, reading other operands
  straight from memory (through strided views at most). A reshape in the epilogue that only
  groups the rows otherwise (`[B*S, N] -> [B, S, N]`, static sizes) keeps every element
  where it is: what follows it may have that shape too (GPT-2's Conv1D: addmm, view, gelu).
  A matmul the caller hands the planner as a library call (`library`: cuBLAS computes it,
  codegen/library_plan.py chose it) keeps a group of its own: strided views before it, and after
  it nothing, or only the one bias add cuBLAS does itself, then reshapes that regroup the
  rows; its epilogue is another kernel.
- attention: one attention node, prologue views on q/k/v/mask, pointwise epilogue.
- indirect loads (index, gather) in any kind: plan/indirect.py (their indices must be known
  good; in a row kernel they read nothing that depends on its reductions); a GEMM folds one
  into its operand's loads when its indices come from memory (an embedding feeding a matmul).
"""

from __future__ import annotations

import math
from typing import Iterable

from minicomp.ir import dims
from minicomp.ir.composites import linear_bias
from minicomp.ir.graph import Graph, Node
from minicomp.ir.ops.views import STRIDED
from minicomp.plan import indirect
from minicomp.plan.cost import RECOMPUTE_FLOPS, recompute_flops

MAX_INPUTS = 32          # tensors one kernel may read (argument lists and register pressure)
ROW_BLOCK_LIMIT = 16384  # widest row a reduction keeps in one block; wider rows are looped
STRIDED_VIEWS = STRIDED      # the views strides can express (the op table's list)


def describe(graph: Graph, nid: int) -> str:
    n = graph.node(nid)
    return f"%{nid} ({n.op})"


def kind_of(graph: Graph, nodes: Iterable[int]) -> str:
    kinds = {graph.node(n).kind for n in nodes}
    for k in ("opaque", "attention", "gemm", "reduction"):
        if k in kinds:
            return k
    return "reduction" if "scan" in kinds else "pointwise"   # a scan runs in a row kernel


def in_group_args(graph: Graph, n: Node, nodes: set[int]) -> list[int]:
    return [a for a in dict.fromkeys(n.args) if a in nodes]


def roots_outside(graph: Graph, nid: int, nodes: set[int]) -> bool:
    """True when `nid` (a view in the group) only re-indexes tensors read from memory."""
    n = graph.node(nid)
    for a in n.args:
        if a in nodes:
            an = graph.node(a)
            if an.kind != "view" or not roots_outside(graph, a, nodes):
                return False
    return True


def group_inputs(graph: Graph, nodes: set[int]) -> list[int]:
    return sorted({a for nid in nodes for a in graph.node(nid).args if a not in nodes})


def topo(graph: Graph, nodes: set[int]) -> list[int]:
    """`nodes` in a topological order of their own edges (ties by id), without sorting the graph."""
    indegree = {n: sum(1 for a in set(graph.node(n).args) if a in nodes) for n in nodes}
    ready = sorted(n for n, d in indegree.items() if d == 0)
    out: list[int] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for u in graph.users(n):
            if u in indegree:
                indegree[u] -= 1
                if indegree[u] == 0:
                    ready.append(u)
        ready.sort()
    return out


def check(graph: Graph, nodes: set[int], outputs: set[int], library: dict[int, str] | None = None) -> str | None:
    """None if one kernel may compute `nodes` and write `outputs`; else why not. `library`:
    the matmuls a library call computes, each with why (see the module docstring)."""
    ops_ = [graph.node(n) for n in nodes]
    opaque = [n for n in ops_ if n.kind == "opaque"]
    if opaque and len(nodes) > 1:
        return f"{describe(graph, opaque[0].id)} runs in PyTorch; nothing fuses across it"
    attention = [n.id for n in ops_ if n.kind == "attention"]
    matmuls = [n.id for n in ops_ if n.kind == "gemm"]
    reductions = [n.id for n in ops_ if n.kind in ("reduction", "scan")]   # scans share the row kernel
    if attention and (matmuls or reductions or len(attention) > 1):
        other = (attention[1:] + matmuls + reductions)[0]
        return f"{describe(graph, attention[0])} and {describe(graph, other)} are not one attention kernel"
    if matmuls and reductions:
        return (f"{describe(graph, reductions[0])} cannot join the GEMM of {describe(graph, matmuls[0])}: "
                f"a GEMM prologue holds views and casts, its epilogue pointwise ops")
    inputs = group_inputs(graph, nodes)
    if len(inputs) > MAX_INPUTS:
        return f"the kernel would read {len(inputs)} tensors (limit {MAX_INPUTS})"
    if opaque:
        return None
    why = indirect.check(graph, nodes, reductions)
    if why:
        return why
    if attention:
        return _check_anchored(graph, nodes, outputs, attention, "attention")
    if matmuls:
        return _check_library(graph, nodes, matmuls, library or {}) or _check_anchored(
            graph, nodes, outputs, matmuls, "gemm")
    if reductions:
        return _check_reduction(graph, nodes, outputs, reductions)
    return _check_pointwise(graph, nodes, outputs)


# --------------------------------------------------------------------------- pointwise


def _check_pointwise(graph: Graph, nodes: set[int], outputs: set[int]) -> str | None:
    ordered = sorted(outputs)
    for o in ordered[1:]:
        a = ordered[0]
        if graph.node(o).shape != graph.node(a).shape:
            return (f"outputs {describe(graph, a)} {graph.node(a).type} and {describe(graph, o)} "
                    f"{graph.node(o).type} have different iteration spaces")
    if not ordered:
        return None
    space = graph.node(ordered[0]).numel
    flops, worst = recompute_flops(graph, nodes, space)
    if flops > RECOMPUTE_FLOPS:
        return (f"{describe(graph, worst)} {graph.node(worst).type} would be recomputed at each of the "
                f"kernel's {space} elements ({flops:.0f} flops an element, limit {RECOMPUTE_FLOPS}); "
                f"it is computed once in a kernel of its own size")
    return None


# --------------------------------------------------------------------------- reduction


def reduction_domain(graph: Graph, nid: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(S, A): the shape a reduction reduces (a scan scans) and its axes (an empty axes list
    means all). A 0-d operand has no axes to reduce: its domain is one row of one element."""
    n = graph.node(nid)
    shape = graph.node(n.args[0]).shape
    if not shape:
        return shape, ()
    axes = (n.attrs["axis"],) if n.kind == "scan" else tuple(n.attrs.get("axes", ())) or tuple(range(len(shape)))
    return shape, tuple(sorted(a % len(shape) for a in axes))


def _pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(_pad(shape, len(target)), target))


def _unit_reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    return [d for d in src if d != 1] == [d for d in dst if d != 1]


def _stored_view(graph: Graph, n: Node, nodes: set[int], outputs: set[int], shapes: tuple) -> bool:
    """Whether view `n` (a reshape or permute) is an output of the kernel that nothing in it
    reads, of a value of the group with one of `shapes` (a row kernel's domain or row, a GEMM
    tile's): the kernel stores each element at the view's index for it (codegen/row_kernel.py,
    codegen/gemm.py). Each earlier view of a chain was admitted on its own."""
    src = graph.node(n.args[0])
    return (n.op in ("reshape", "permute") and n.id in outputs and src.id in nodes
            and tuple(src.shape) in {tuple(x) for x in shapes} and not any(u in nodes for u in graph.users(n.id)))


def _check_reduction(graph: Graph, nodes: set[int], outputs: set[int], reductions: list[int]) -> str | None:
    domains = {r: reduction_domain(graph, r) for r in reductions}
    first = reductions[0]
    S, A = domains[first]
    for r, dom in domains.items():
        if dom != (S, A):
            return (f"reduction domains differ: {describe(graph, first)} reduces {list(S)} over {list(A)}, "
                    f"{describe(graph, r)} reduces {list(dom[0])} over {list(dom[1])}")
    rank = len(S)
    keep = tuple(1 if i in A else d for i, d in enumerate(S))
    drop = tuple(d for i, d in enumerate(S) if i not in A)
    drop_aligned = _pad(drop, rank) == keep   # a leading-axes reduction broadcasts back like numpy
    tag: dict[int, str] = {}   # per node that depends on a reduction here: "row", "drop" or "full"
    stored: set[int] = set()   # outputs that are a reshape or permute of a value of the domain or a row
    for nid in topo(graph, nodes):
        n = graph.node(nid)
        deps = [a for a in in_group_args(graph, n, nodes) if a in tag]
        if n.kind == "view" and in_group_args(graph, n, nodes) and not roots_outside(graph, nid, nodes):
            src = graph.node(n.args[0])
            if _stored_view(graph, n, nodes, outputs, (S, keep, drop)):
                stored.add(nid)       # written at the element's own place: `softmax(x).view(...)`
                continue
            if not (n.op == "expand" or (n.op == "reshape" and _unit_reshape(src.shape, n.shape))):
                return (f"a row kernel cannot {n.op} {describe(graph, src.id)}, a value it computes "
                        f"({describe(graph, nid)})")
        if n.kind == "scan":
            tag[nid] = "full"     # a value per element of S
            continue
        if n.kind == "reduction":
            tag[nid] = "row" if n.attrs.get("keepdim") or drop_aligned else "drop"
            continue
        if not deps:
            continue
        if any(tag[a] == "drop" for a in deps):
            if n.shape == keep and n.kind == "view":
                tag[nid] = "row"
            elif n.shape == drop:
                tag[nid] = "drop"
            else:
                a = next(a for a in deps if tag[a] == "drop")
                return (f"{describe(graph, a)} {graph.node(a).type} (reduced without keepdim) broadcasts "
                        f"along the wrong axes in {describe(graph, nid)} {n.type}")
            continue
        if not _broadcasts_to(n.shape, S):
            return f"{describe(graph, nid)} {n.type} is outside the reduction domain {list(S)}"
        padded = _pad(n.shape, rank)
        tag[nid] = "row" if all(padded[i] == 1 for i in A) else "full"
    for o in outputs - stored:
        shape = graph.node(o).shape
        if shape not in (S, keep, drop):
            return (f"{describe(graph, o)} {graph.node(o).type} would be written by a row kernel over "
                    f"{list(S)}, but it is neither a row nor an element of it")
    return None


# --------------------------------------------------------------------------- gemm / attention


def _ancestors_in(graph: Graph, starts: Iterable[int], nodes: set[int]) -> set[int]:
    out: set[int] = set()
    stack = [s for s in starts if s in nodes]
    while stack:
        nid = stack.pop()
        if nid in out:
            continue
        out.add(nid)
        stack.extend(a for a in graph.node(nid).args if a in nodes)
    return out


def _descendants_in(graph: Graph, starts: Iterable[int], nodes: set[int]) -> set[int]:
    out: set[int] = set()
    stack = list(starts)
    while stack:
        nid = stack.pop()
        for u in graph.users(nid):
            if u in nodes and u not in out:
                out.add(u)
                stack.append(u)
    return out


def _side_value(graph: Graph, n: Node, nodes: set[int], rest: set[int], epilogue: set[int],
                shapes: set[tuple]) -> bool:
    """Whether `n`, a group node that neither feeds the matmul nor depends on it, is a value the
    epilogue computes from memory alone: pointwise, of the tile's shape, from tensors read from
    memory or other such values, and read only by the epilogue or other such values
    (`silu(gate) * (x @ w_up)` where cuBLAS wrote `gate`: SiLU is applied to the loaded tile)."""
    if n.kind != "pointwise" or tuple(n.shape) not in shapes or n.op in indirect.OPS:
        return False
    if any(a not in rest for a in in_group_args(graph, n, nodes)):
        return False
    return all(u in epilogue or u in rest for u in graph.users(n.id) if u in nodes)


def _check_library(graph: Graph, nodes: set[int], matmuls: list[int], library: dict[int, str]) -> str | None:
    """Why a group holding a library matmul breaks its rule (module docstring); None if it keeps it."""
    called = [m for m in matmuls if m in library]
    if not called:
        return None
    mm = graph.node(called[0])
    what = f"{describe(graph, mm.id)} is a cuBLAS call ({library[mm.id]})"
    if len(matmuls) > 1:
        return f"{what}: it shares its kernel with no other matmul"
    before = _ancestors_in(graph, mm.args, nodes)
    for p in sorted(before):
        if graph.node(p).op not in STRIDED_VIEWS:
            return f"{what}: only strided views come before it, and {describe(graph, p)} computes a value"
    after = topo(graph, nodes - before - {mm.id})
    last = mm.id
    if after:
        bias = linear_bias(graph, after[0], mm.id)
        if bias is not None and bias not in nodes:
            last = after.pop(0)     # the bias along N that addmm adds itself
    while after and graph.node(after[0]).op == "reshape" and graph.node(after[0]).args[0] == last \
            and regroups(graph.node(after[0]).shape, mm.shape):
        last = after.pop(0)         # the rows viewed back as the program has them (no computation)
    if not after:
        return None
    return f"{what}: its epilogue ({describe(graph, after[0])} and after) is a kernel of its own"


def regroups(shape: tuple, out_shape: tuple) -> bool:
    """Whether `shape` is the GEMM output's `out_shape` with its rows grouped otherwise: the same
    last dim (N) and the same number of rows, static sizes (a tile's element stays its own)."""
    if dims.any_symbolic(tuple(shape) + tuple(out_shape)) or not shape or not out_shape:
        return False
    return shape[-1] == out_shape[-1] and math.prod(shape[:-1]) == math.prod(out_shape[:-1])


def _check_anchored(graph: Graph, nodes: set[int], outputs: set[int], anchors: list[int], kind: str) -> str | None:
    """gemm and attention: anchor(s), prologue on their operands, pointwise epilogue."""
    if kind == "gemm" and len(anchors) > 2:
        return f"{len(anchors)} matmuls in one kernel ({', '.join(describe(graph, a) for a in anchors)})"
    operands = [a for m in anchors for a in graph.node(m).args]
    prologue = _ancestors_in(graph, operands, nodes)
    for m in anchors:
        if m in prologue:
            return f"GEMMs in series: {describe(graph, m)} feeds another matmul of the same kernel"
    per_anchor = {m: _descendants_in(graph, [m], nodes) for m in anchors}
    epilogue = set().union(*per_anchor.values())
    if epilogue & prologue:
        bad = min(epilogue & prologue)
        return f"{describe(graph, bad)} both consumes and feeds the {kind} anchor"
    out_shape = graph.node(anchors[0]).shape
    shapes = {tuple(out_shape)}
    allowed = ("view",) if kind == "attention" else ("view", "cast")
    for p in prologue:
        n = graph.node(p)
        if n.kind == "view" and n.op not in STRIDED_VIEWS:
            return f"the {kind} prologue folds strided views only; {describe(graph, p)} is not one"
        if kind == "gemm" and indirect.prologue_ok(graph, p, nodes):
            continue      # an embedding's rows, loaded straight into the A tiles
        if n.kind not in allowed and n.op not in allowed:
            what = "views" if kind == "attention" else "views and casts"
            return f"the {kind} prologue holds only {what}; {describe(graph, p)} computes a value"
        if p in outputs:
            return f"{describe(graph, p)} is a prologue value; the {kind} kernel cannot write it"
    for e in topo(graph, epilogue):
        n = graph.node(e)
        if kind == "gemm" and n.op == "reshape" and regroups(n.shape, out_shape) and \
                all(a in epilogue or a in anchors for a in n.args):
            shapes.add(tuple(n.shape))      # `addmm(b, x.view(-1, k), w).view(*lead, n)`: the same rows
            continue
        if kind == "gemm" and _stored_view(graph, n, nodes, outputs, tuple(shapes)):
            continue                        # an output stored at the view's index: `(x @ w).view(s, b, e).transpose(0, 1)`
        if n.kind != "pointwise" or tuple(n.shape) not in shapes:
            return (f"the {kind} epilogue holds pointwise ops of shape {list(out_shape)}; "
                    f"{describe(graph, e)} {n.type} is not one")
        if n.op in indirect.OPS and n.args[0] in nodes:
            return f"the {kind} epilogue cannot gather from {describe(graph, n.args[0])}, a value of its own tile"
        for a in in_group_args(graph, n, nodes):
            if a in prologue:
                return f"{describe(graph, a)} is a prologue value used by the epilogue {describe(graph, e)}"
    rest = nodes - prologue - epilogue - set(anchors)
    for r in rest:
        n = graph.node(r)
        loads_for_epilogue = n.op in STRIDED_VIEWS and roots_outside(graph, r, nodes)
        if not (loads_for_epilogue or (kind == "gemm" and _side_value(graph, n, nodes, rest, epilogue, shapes))):
            return f"{describe(graph, r)} neither feeds the {kind} anchor nor consumes it"
    if len(anchors) == 2:
        m1, m2 = anchors
        a1, a2 = graph.node(m1), graph.node(m2)
        if a1.args[0] != a2.args[0]:
            return f"{describe(graph, m1)} and {describe(graph, m2)} do not share operand A (no dual GEMM)"
        if a1.shape != a2.shape or a1.dtype != a2.dtype:
            return f"{describe(graph, m1)} {a1.type} and {describe(graph, m2)} {a2.type} differ (no dual GEMM)"
        join = per_anchor[m1] & per_anchor[m2]
        if not join:
            return (f"{describe(graph, m1)} and {describe(graph, m2)} share operand A but no pointwise "
                    f"join consumes both (a dual GEMM needs one)")
        for o in outputs:
            if o not in join:
                return f"a dual GEMM writes only values of its join; {describe(graph, o)} is not one"
    for o in outputs:
        if o not in epilogue and o not in anchors:
            return f"{describe(graph, o)} is not the {kind} result or its epilogue"
    return None

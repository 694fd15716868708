"""Legality and reads of indirect loads (`index`, `gather`: minicomp/ir/ops/indexing.py).

A kernel may gather from a tensor in memory or from a value it computes (recomputed at the
gathered positions only), but it must know its indices are good before it reads through them
(ir/ranges.py): an index operand the group computes needs a static range inside the valid
one (or the op takes indices modulo the size); otherwise the index must reach the kernel
through memory (views and value-keeping casts of a tensor it reads), where `call()` checks it.
In a row kernel neither the gathered value nor its index may depend on a reduction of the same
kernel (the row kernel would need that reduction at positions it has not reduced yet).

The ledger (`read_share`): a gather reads at most one source element per output element, so
its source costs min(1, out / source) of the source's bytes, as a slice does: an embedding of
8 tokens reads 8 rows of its table, not the table. A source the kernel computes is computed
only where it is gathered, so what that computation reads shrinks alike (`shares`: the loss's
`log_softmax(x).gather(-1, labels)` reads one element of x per row, not the rows).
"""

from __future__ import annotations

from typing import Iterable

from minicomp.ir import dims
from minicomp.ir.graph import Graph, Node
from minicomp.ir.ops.indexing import MODES
from minicomp.ir.ranges import memory_sources, value_range, within

OPS = ("index", "gather")


def describe(graph: Graph, nid: int) -> str:
    return f"%{nid} ({graph.node(nid).op})"


def index_operands(n: Node) -> list[tuple[int, int]]:
    """(index operand, the source dim it indexes) of an indirect node."""
    if n.op == "gather":
        return [(n.args[1], n.attrs["dim"])]
    return list(zip(n.args[1:], n.attrs["dims"]))


def read_share(graph: Graph, n: Node, position: int) -> float:
    """The share of operand `position` of node `n` that computing `n` reads (1 but for the
    source of an indirect load)."""
    if n.op not in OPS or position != 0:
        return 1.0
    src = graph.node(n.args[0])
    return min(1.0, dims.ratio(n.numel, src.numel))     # a ledger figure: at the hints over symbols


def shares(graph: Graph, nodes: set[int], outputs: set[int]) -> dict[int, float] | None:
    """For each node of a group, the share of its elements the kernel evaluates: 1 for what it
    writes, else the most any reader in the group asks for (a gather asks `read_share` of its
    source). None when the group holds no indirect load (every share is 1)."""
    if not any(graph.node(n).op in OPS for n in nodes):
        return None
    users: dict[int, list[tuple[int, int]]] = {}
    for nid in nodes:
        for i, a in enumerate(graph.node(nid).args):
            if a in nodes:
                users.setdefault(a, []).append((nid, i))
    memo: dict[int, float] = {}

    def share(nid: int) -> float:
        if nid not in memo:
            memo[nid] = 1.0          # a cycle cannot happen; this also ends the recursion
            readers = users.get(nid)
            if nid not in outputs and readers:
                memo[nid] = max(share(u) * read_share(graph, graph.node(u), i) for u, i in readers)
        return memo[nid]

    return {n: share(n) for n in nodes}


def _reaches(graph: Graph, start: int, targets: set[int], nodes: set[int]) -> int | None:
    """A node of `targets` that `start` depends on inside `nodes` (itself included), if any."""
    stack, seen = [start], set()
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in nodes:
            continue
        if nid in targets:
            return nid
        seen.add(nid)
        stack.extend(graph.node(nid).args)
    return None


def check(graph: Graph, nodes: set[int], reductions: Iterable[int] = ()) -> str | None:
    """None if the indirect loads among `nodes` may be one kernel's; else why not."""
    reductions = set(reductions)
    for nid in sorted(nodes):
        n = graph.node(nid)
        if n.op not in OPS:
            continue
        src = graph.node(n.args[0])
        for idx, dim in index_operands(n):
            if idx not in nodes:
                continue          # read from memory: call() checks it
            valid = MODES[n.attrs["mode"]].bounds(src.shape[dim])
            if valid is not None and not within(value_range(graph, idx), valid) \
                    and memory_sources(graph, idx, nodes) is None:
                return (f"{describe(graph, nid)} reads at positions that {describe(graph, idx)} computes in the "
                        f"same kernel, with no bound minicomp knows: the index must come through memory, where the "
                        f"compiled call checks it")
        if reductions:
            for operand in n.args:
                red = _reaches(graph, operand, reductions, nodes)
                if red is not None:
                    return (f"{describe(graph, nid)} reads {describe(graph, operand)} at loaded positions, and it "
                            f"depends on the reduction {describe(graph, red)} of the same row kernel")
    return None


def prologue_ok(graph: Graph, nid: int, nodes: set[int]) -> bool:
    """An indirect load a GEMM may fold into its operand's loads: every index it computes comes
    from memory through views and value-keeping casts (the kernel loads it once per tile row)."""
    n = graph.node(nid)
    return n.op in OPS and all(i not in nodes or memory_sources(graph, i, nodes) is not None
                               for i, _ in index_operands(n))

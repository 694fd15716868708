"""The fusion planner: which nodes share a kernel, decided by the bytes that fusion saves.

`plan_graph(graph, machine) -> Plan`. The search state is a set of clusters (groups to
be). A cluster *owns* nodes (it writes them when anyone outside needs them) and may hold
*copies* of nodes owned elsewhere (views, and cheap pointwise values it recomputes instead
of reading). Invariants of every state:
- each live non-leaf node is owned by exactly one cluster, except views, which are never
  owned (each cluster that reads through a view holds a copy: the view is folded into its
  loads) unless a graph output or an opaque node needs the view itself in memory;
- a node is written by its owner iff it is a graph output or another cluster reads it;
- every cluster passes `fusion_rules.check`, and the graph of clusters is acyclic.

Start: one cluster per node (eager). Moves, scored by the ledger of the whole plan:
- merge two clusters (producer and consumer, or two readers of one tensor);
- recompute a cheap value (pointwise/view nodes over the owner's inputs) inside a
  consumer instead of reading it, when re-reading the inputs costs fewer bytes than
  writing and reading the value.
Greedy: apply the legal move that saves the most bytes, until none saves any. Ties go to
the earliest nodes (deterministic). Legality is checked separately from profit; the
refused candidates that remain at the end are reported with their reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import networkx as nx

from minicomp.ir.graph import Graph
from minicomp.passes import cost as ledger
from minicomp.passes.fusion_rules import check, describe
from minicomp.passes.plan import Plan


@dataclass(frozen=True)
class Cluster:
    owned: frozenset[int]
    copies: frozenset[int] = frozenset()

    @property
    def nodes(self) -> frozenset[int]:
        return self.owned | self.copies


@dataclass(frozen=True)
class Move:
    kind: str                   # "merge", "sibling" or "recompute"
    a: int                      # merge: the two cluster ids; recompute: owner cluster, consumer cluster
    b: int
    node: int | None = None     # recompute: the value recomputed


class State:
    """Clusters plus what follows from them (who reads what, who writes what)."""

    def __init__(self, graph: Graph, clusters: dict[int, Cluster], costs: dict):
        self.graph = graph
        self.clusters = clusters
        self._cost_cache = costs
        self.owner = {n: cid for cid, c in clusters.items() for n in c.owned}
        self.reads: dict[int, set[int]] = {}        # cluster -> nodes it reads from memory
        self.readers: dict[int, set[int]] = {}      # node -> clusters reading it
        for cid, c in clusters.items():
            nodes = c.nodes
            r = {a for n in nodes for a in graph.node(n).args if a not in nodes}
            self.reads[cid] = r
            for a in r:
                self.readers.setdefault(a, set()).add(cid)
        outs = set(graph.outputs)
        self.outputs = {cid: frozenset(n for n in c.owned if n in outs or self.readers.get(n, set()) - {cid})
                        for cid, c in clusters.items()}

    def cost(self, cid: int) -> ledger.Cost:
        key = (self.clusters[cid].nodes, self.outputs[cid])
        if key not in self._cost_cache:
            self._cost_cache[key] = ledger.group_cost(self.graph, set(key[0]), key[1])
        return self._cost_cache[key]

    def total(self) -> int:
        return sum(self.cost(cid).bytes for cid in self.clusters)

    def quotient(self) -> nx.DiGraph:
        q = nx.DiGraph()
        q.add_nodes_from(self.clusters)
        for cid, r in self.reads.items():
            for a in r:
                if a in self.owner and self.owner[a] != cid:
                    q.add_edge(self.owner[a], cid)
        return q

    def with_clusters(self, changes: dict[int, Cluster | None]) -> "State":
        clusters = dict(self.clusters)
        for cid, c in changes.items():
            if c is None:
                clusters.pop(cid, None)
            else:
                clusters[cid] = c
        return State(self.graph, clusters, self._cost_cache)

    def label(self, cid: int) -> str:
        """How reasons name a cluster: its first owned node, and the node count."""
        order = self.graph.topo_order()
        owned = sorted(self.clusters[cid].owned, key=order.index)
        extra = f" +{len(owned) - 1}" if len(owned) > 1 else ""
        return f"{{{describe(self.graph, owned[0])}{extra}}}"


# --------------------------------------------------------------------------- building states


def view_closure(graph: Graph, nodes: set[int]) -> set[int]:
    """The views that `nodes` read through (folded into their loads). Opaque nodes read
    materialised tensors; a matmul or attention operand is read through strided views only
    (a `cat` feeding one is materialised by a kernel of its own)."""
    out: set[int] = set()
    stack = [(a, graph.node(n).kind in ("gemm", "attention")) for n in nodes if graph.node(n).kind != "opaque"
             for a in graph.node(n).args]
    while stack:
        a, anchored = stack.pop()
        node = graph.node(a)
        if a in out or a in nodes or node.kind != "view" or (anchored and node.op == "cat"):
            continue
        out.add(a)
        stack.extend((x, anchored) for x in node.args)
    return out


def materialised_views(graph: Graph, live: set[int]) -> set[int]:
    """Views some kernel must write: graph outputs, operands of opaque nodes, and `cat`s that
    a matmul or attention operand reads (their loads take strided views only)."""
    need = {v for v in graph.outputs if graph.node(v).kind == "view"}
    for nid in live:
        n = graph.node(nid)
        if n.kind == "opaque":
            need |= {a for a in n.args if graph.node(a).kind == "view"}
        elif n.kind in ("gemm", "attention"):
            stack = list(n.args)
            while stack:
                a = stack.pop()
                if graph.node(a).op == "cat":
                    need.add(a)
                elif graph.node(a).kind == "view":
                    stack.extend(graph.node(a).args)
    return need


def live_nodes(graph: Graph) -> set[int]:
    live = set(graph.outputs)
    for o in graph.outputs:
        live |= nx.ancestors(graph.nx, o)
    return live


def initial_state(graph: Graph) -> State:
    """Eager: one cluster per node; views owned only where memory needs them."""
    live = live_nodes(graph)
    owned_views = materialised_views(graph, live)
    clusters: dict[int, Cluster] = {}
    for nid in graph.topo_order():
        n = graph.node(nid)
        if nid not in live or n.kind in ("input", "constant"):
            continue
        if n.kind == "view" and nid not in owned_views:
            continue
        copies = view_closure(graph, {nid}) if n.kind != "opaque" else set()
        clusters[nid] = Cluster(frozenset({nid}), frozenset(copies - {nid}))
    return State(graph, clusters, {})


def _merged(graph: Graph, a: Cluster, b: Cluster) -> Cluster:
    owned = a.owned | b.owned
    copies = (a.copies | b.copies | view_closure(graph, set(owned | a.copies | b.copies))) - owned
    return Cluster(owned, frozenset(copies))


def _cheap(graph: Graph, nid: int) -> bool:
    return graph.node(nid).kind in ("pointwise", "view")


def recompute_set(state: State, node: int) -> set[int] | None:
    """The nodes a consumer must copy to recompute `node`: its ancestors inside its owner's
    cluster. None if one of them is not cheap (a reduction or a matmul is never recomputed)."""
    graph = state.graph
    owner = state.clusters[state.owner[node]]
    need: set[int] = set()
    stack = [node]
    while stack:
        nid = stack.pop()
        if nid in need:
            continue
        if not _cheap(graph, nid):
            return None
        need.add(nid)
        stack.extend(a for a in graph.node(nid).args if a in owner.nodes)
    return need


def _prune(state: State, cid: int, consumer: int, consumer_reads: set[int]) -> Cluster | None:
    """The owner `cid` once `consumer` reads only `consumer_reads` from memory: it keeps what
    its remaining outputs need (None when nothing is left to write)."""
    graph = state.graph
    cluster = state.clusters[cid]
    outs = set(graph.outputs)

    def read_elsewhere(n: int) -> bool:
        others = state.readers.get(n, set()) - {cid, consumer}
        return bool(others) or n in consumer_reads

    keep_out = {n for n in cluster.owned if n in outs or read_elsewhere(n)}
    if not keep_out:
        return None
    needed: set[int] = set()
    stack = list(keep_out)
    while stack:
        nid = stack.pop()
        if nid in needed:
            continue
        needed.add(nid)
        stack.extend(a for a in graph.node(nid).args if a in cluster.nodes)
    return Cluster(frozenset(cluster.owned & needed), frozenset(cluster.copies & needed))


def apply(state: State, move: Move) -> State | None:
    """The state after `move` (None when the move does not apply)."""
    graph = state.graph
    if move.kind in ("merge", "sibling"):
        m = _merged(graph, state.clusters[move.a], state.clusters[move.b])
        return state.with_clusters({move.a: m, move.b: None})
    need = recompute_set(state, move.node)
    if need is None:
        return None
    consumer = state.clusters[move.b]
    copies = (consumer.copies | need | view_closure(graph, set(consumer.nodes | need))) - consumer.owned
    new_consumer = Cluster(consumer.owned, frozenset(copies))
    reads = {a for n in new_consumer.nodes for a in graph.node(n).args if a not in new_consumer.nodes}
    return state.with_clusters({move.b: new_consumer, move.a: _prune(state, move.a, move.b, reads)})


def candidates(state: State) -> Iterator[Move]:
    """Producer/consumer merges, merges of two readers of one tensor, and recomputations."""
    seen: set[tuple[int, int]] = set()
    for cid in state.clusters:
        for a in sorted(state.reads[cid]):
            src = state.owner.get(a)
            if src is None or src == cid:
                continue
            if (src, cid) not in seen:
                seen.add((src, cid))
                yield Move("merge", src, cid)
            if _cheap(state.graph, a):
                yield Move("recompute", src, cid, a)
    for a, rs in sorted(state.readers.items()):
        if state.graph.node(a).numel <= 1:
            continue   # sharing a scalar saves nothing worth a kernel
        ordered = sorted(rs)
        for i, x in enumerate(ordered):
            for y in ordered[i + 1:]:
                if (x, y) not in seen and (y, x) not in seen:
                    seen.add((x, y))
                    yield Move("sibling", x, y)


def legality(before: State, after: State, move: Move) -> str | None:
    """None if `after` is a legal state reached by `move`; else the reason."""
    for cid in (move.a, move.b):
        if cid in after.clusters:
            c = after.clusters[cid]
            why = check(after.graph, set(c.nodes), set(after.outputs[cid]))
            if why:
                return why
    q = after.quotient()
    if not nx.is_directed_acyclic_graph(q):
        cycle = nx.find_cycle(q)
        path = " -> ".join(after.label(x) for x, _ in cycle) + " -> " + after.label(cycle[0][0])
        if move.kind == "recompute":
            return f"recomputing would create a cycle between groups: {path}"
        return (f"fusing {before.label(move.a)} and {before.label(move.b)} would create a cycle "
                f"between groups: {path}")
    return None


def search(state: State) -> tuple[State, list[tuple[Move, State, State]]]:
    """Greedy by bytes saved; returns the final state and the recomputations applied."""
    applied: list[tuple[Move, State, State]] = []
    order = {nid: i for i, nid in enumerate(state.graph.topo_order())}
    while True:
        base = state.total()
        scored = []
        for move in candidates(state):
            after = apply(state, move)
            if after is None:
                continue
            gain = base - after.total()
            if gain <= 0:
                continue
            first = min(order[n] for n in state.clusters[move.a].owned | state.clusters[move.b].owned)
            priority = {"merge": 0, "sibling": 1, "recompute": 2}[move.kind]
            scored.append((-gain, priority, first, move.a, move.b, move, after))
        scored.sort(key=lambda s: s[:5])
        for *_, move, after in scored:
            if legality(state, after, move) is None:
                if move.kind == "recompute":
                    applied.append((move, state, after))
                state = after
                break
        else:
            return state, applied


def plan_graph(graph: Graph, machine: "str | ledger.Machine" = "h200", *, baseline: Graph | None = None) -> Plan:
    """Group the nodes of `graph` into kernels; see the module docstring and contracts.md.

    `baseline`: the program as written (before the passes), whose eager bytes the plan's
    `unfused_bytes` should count; by default `graph` itself.
    """
    from minicomp.passes.fusion_report import build_plan
    m = ledger.get_machine(machine)
    final, recomputed = search(initial_state(graph))
    plan = build_plan(final, recomputed, m)
    if baseline is not None:
        plan.unfused_bytes = ledger.unfused_bytes(baseline)
    return plan

"""The planner's search state: clusters of nodes (groups to be) and what follows from them.

A cluster *owns* nodes (it writes them when anyone outside needs them) and may hold
*copies* of nodes owned elsewhere (views, and cheap pointwise values it recomputes
instead of reading). Invariants of every state:
- each live non-leaf node is owned by exactly one cluster, except views, which are never
  owned (each cluster that reads through a view holds a copy: the view is folded into its
  loads) unless a graph output, an opaque node, or a matmul/attention operand that only
  takes strided views (a `cat`) needs the view itself in memory;
- a node is written by its owner iff it is a graph output or another cluster reads it.
States are immutable: a move derives a new state (`State.with_clusters`).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from minicomp.ir.graph import Graph
from minicomp.passes import cost as ledger
from minicomp.passes.fusion_rules import describe


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


class Context:
    """What every state of one search shares: the graph, its topological order, caches."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.order = {nid: i for i, nid in enumerate(graph.topo_order())}
        self.graph_outputs = frozenset(graph.outputs)
        self.costs: dict = {}
        self.checks: dict = {}


class State:
    """Clusters plus what follows from them (who reads what, who writes what).

    States are immutable; `with_clusters` derives a new one by updating only what the
    changed clusters touch, and records those clusters in `touched` so that a move's
    gain is computed from them alone."""

    def __init__(self, ctx: Context, clusters: dict[int, Cluster]):
        self.ctx = ctx
        self.graph = ctx.graph
        self.clusters = clusters
        self.owner = {n: cid for cid, c in clusters.items() for n in c.owned}
        self.reads: dict[int, frozenset[int]] = {cid: self._reads_of(c) for cid, c in clusters.items()}
        self.readers: dict[int, set[int]] = {}      # node -> clusters reading it from memory
        for cid, r in self.reads.items():
            for a in r:
                self.readers.setdefault(a, set()).add(cid)
        self.outputs = {cid: self._outputs_of(cid) for cid in clusters}
        self.touched: set[int] = set(clusters)

    def _reads_of(self, c: Cluster) -> frozenset[int]:
        nodes = c.nodes
        return frozenset(a for n in nodes for a in self.graph.node(n).args if a not in nodes)

    def _outputs_of(self, cid: int) -> frozenset[int]:
        outs = self.ctx.graph_outputs
        return frozenset(n for n in self.clusters[cid].owned
                         if n in outs or self.readers.get(n, set()) - {cid})

    def cost(self, cid: int) -> ledger.Cost:
        key = (self.clusters[cid].nodes, self.outputs[cid])
        if key not in self.ctx.costs:
            self.ctx.costs[key] = ledger.group_cost(self.graph, set(key[0]), key[1])
        return self.ctx.costs[key]

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
        new = object.__new__(State)
        new.ctx, new.graph = self.ctx, self.graph
        new.clusters, new.owner, new.reads = dict(self.clusters), dict(self.owner), dict(self.reads)
        new.readers, new.outputs = dict(self.readers), dict(self.outputs)
        affected: set[int] = set()
        for cid in changes:
            if cid in self.clusters:
                old = self.clusters[cid]
                for n in old.owned:
                    if new.owner.get(n) == cid:
                        del new.owner[n]
                for a in self.reads[cid]:
                    new.readers[a] = new.readers[a] - {cid}
                affected |= self.reads[cid] | old.owned
                del new.clusters[cid], new.reads[cid], new.outputs[cid]
        for cid, c in changes.items():
            if c is None:
                continue
            new.clusters[cid] = c
            for n in c.owned:
                new.owner[n] = cid
            r = new._reads_of(c)
            new.reads[cid] = r
            for a in r:
                new.readers[a] = new.readers.get(a, set()) | {cid}
            affected |= r | c.owned
        touched = {cid for cid, c in changes.items() if c is not None}
        touched |= {new.owner[n] for n in affected if n in new.owner}
        for cid in touched:
            new.outputs[cid] = new._outputs_of(cid)
        new.touched = touched | set(changes)
        return new

    def gain(self, after: "State") -> int:
        """Bytes saved going from this state to `after` (derived from it by one move)."""
        before = sum(self.cost(c).bytes for c in after.touched if c in self.clusters)
        return before - sum(after.cost(c).bytes for c in after.touched if c in after.clusters)

    def label(self, cid: int) -> str:
        """How reasons name a cluster: its first owned node, and the node count."""
        owned = sorted(self.clusters[cid].owned, key=self.ctx.order.__getitem__)
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
    return State(Context(graph), clusters)

"""The planner's search state: clusters of nodes (groups to be) and what follows from them.

A cluster *owns* nodes (it writes them when anyone outside needs them) and may hold
*copies* of nodes owned elsewhere (views, and cheap pointwise values it recomputes
instead of reading). Invariants of every state:
- each live non-leaf node is owned by exactly one cluster, except views, which are never
  owned (each cluster that reads through a view holds a copy: the view is folded into its
  loads) unless a graph output, an opaque node, or a matmul/attention operand that only
  takes strided views (a `cat`) needs the view itself in memory;
- a node is written by its owner iff it is a graph output or another cluster reads it.
States are immutable: a move is first a `Preview` (overlays on the old state: all that
scoring and checking it need), and `State.commit` makes the chosen one a new state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import networkx as nx

from minicomp.ir.graph import Graph
from minicomp.ir.ops.views import STRIDED
from minicomp.plan import cost as ledger
from minicomp.plan.rules import describe


@dataclass(frozen=True)
class Cluster:
    owned: frozenset[int]
    copies: frozenset[int] = frozenset()

    @functools.cached_property
    def nodes(self) -> frozenset[int]:
        # kept (the search asks millions of times, and the ledger's cache hashes the set)
        return self.owned | self.copies


@dataclass(frozen=True)
class Move:
    kind: str                   # "merge", "sibling" or "recompute"
    a: int                      # merge: the two cluster ids; recompute: owner cluster, consumer cluster
    b: int
    node: int | None = None     # recompute: the value recomputed


class Context:
    """What every state of one search shares: the graph, its topological order, caches.

    It also indexes the graph's Node records by id (`node(nid)`, `kind[nid]`,
    `args[nid]`): the search looks nodes up millions of times, and a plain dict is many
    times faster than `Graph.node`. The graph does not change during a search, so the
    index stays exact; `node` has `Graph.node`'s meaning, so the ledger functions
    (`cost.group_cost`, which only look nodes up) take the context as their graph."""

    def __init__(self, graph: Graph, topo: list[int] | None = None, library: dict[int, str] | None = None):
        self.graph = graph
        self.library = dict(library or {})    # matmul -> why a library call computes it (rules.check)
        topo = graph.topo_order() if topo is None else topo
        self.order = {nid: i for i, nid in enumerate(topo)}
        self.graph_outputs = frozenset(graph.outputs)
        records = {nid: graph.node(nid) for nid in graph.nx.nodes}
        self.node = records.__getitem__
        self.kind = {nid: n.kind for nid, n in records.items()}
        self.args = {nid: n.args for nid, n in records.items()}
        self.costs: dict = {}
        self.checks: dict = {}
        self._topo = topo
        self._ancestors: dict[int, int] | None = None

    def ancestors(self, nid: int) -> int:
        """The nodes `nid` depends on, as a bit mask over topological positions (`order`):
        built once per search, the first time a move asks (moves.entangled)."""
        if self._ancestors is None:
            masks: dict[int, int] = {}
            order, args = self.order, self.args
            for n in self._topo:
                m = 0
                for a in args[n]:
                    m |= masks[a] | (1 << order[a])
                masks[n] = m
            self._ancestors = masks
        return self._ancestors[nid]

    def cost(self, nodes: frozenset[int], outputs: frozenset[int]) -> ledger.Cost:
        """The ledger of one group, computed once per (nodes, outputs)."""
        key = (nodes, outputs)
        if key not in self.costs:
            self.costs[key] = ledger.group_cost(self, set(nodes), outputs)
        return self.costs[key]


class State:
    """Clusters plus what follows from them (who reads what, who writes what).

    States are immutable; `commit` derives a new one from a `Preview`, updating only what
    the changed clusters touch, and records those clusters in `touched` so that a move's
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
        self._successors: dict[int, set[int]] = {}

    def _reads_of(self, c: Cluster) -> frozenset[int]:
        nodes, args = c.nodes, self.ctx.args
        return frozenset(a for n in nodes for a in args[n] if a not in nodes)

    def _outputs_of(self, cid: int) -> frozenset[int]:
        outs = self.ctx.graph_outputs
        return frozenset(n for n in self.clusters[cid].owned
                         if n in outs or self.readers.get(n, set()) - {cid})

    def cost(self, cid: int) -> ledger.Cost:
        return self.ctx.cost(self.clusters[cid].nodes, self.outputs[cid])

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

    def preview(self, changes: dict[int, Cluster | None]) -> "Preview":
        """What replacing the `changes` clusters (None: remove) would give, without copying
        this state: enough to score and check a move. `commit` makes it a State."""
        return Preview(self, changes)

    def commit(self, p: "Preview") -> "State":
        """The state `p` previews (a new State; this one is unchanged)."""
        new = object.__new__(State)
        new.ctx, new.graph = self.ctx, self.graph
        new.clusters, new.owner, new.reads = dict(self.clusters), dict(self.owner), dict(self.reads)
        new.readers, new.outputs = dict(self.readers), dict(self.outputs)
        # removed and replaced clusters leave the dicts first, so replacements go to the end
        # (the order the report's enumeration, and so its tie-breaks, sees)
        for cid in p.changes:
            if cid in self.clusters:
                del new.clusters[cid], new.reads[cid], new.outputs[cid]
        for n, cid in p.owner.items():
            if cid is None:
                del new.owner[n]
            else:
                new.owner[n] = cid
        for cid, c in p.changes.items():
            if c is not None:
                new.clusters[cid] = c
                new.reads[cid] = p.reads[cid]
        new.readers.update(p.readers)
        for cid in p.outputs_order:
            new.outputs[cid] = p.outputs[cid]
        new.touched = p.touched
        # a cluster's successors change only where the readers of what it owns changed: the
        # owners of what the changed clusters read or own, all in `touched`
        new._successors = {c: succ for c, succ in self._successors.items() if c not in p.touched}
        return new

    def gain(self, after: "State | Preview") -> int:
        """Bytes saved going from this state to `after` (derived from it by one move)."""
        before = sum(self.cost(c).bytes for c in after.touched if c in self.clusters)
        return before - sum(after.cost(c).bytes for c in after.touched if after.has(c))

    def has(self, cid: int) -> bool:
        return cid in self.clusters

    def cluster(self, cid: int) -> Cluster:
        return self.clusters[cid]

    def outputs_of(self, cid: int) -> frozenset[int]:
        return self.outputs[cid]

    def successors(self, cid: int) -> set[int]:
        """The groups that read something `cid` writes (its successors in `quotient()`)."""
        succ = self._successors.get(cid)
        if succ is None:
            readers = self.readers
            succ = {r for n in self.clusters[cid].owned for r in readers.get(n, ())} - {cid}
            self._successors[cid] = succ
        return succ

    def label(self, cid: int) -> str:
        """How reasons name a cluster: its first owned node, and the node count."""
        owned = sorted(self.clusters[cid].owned, key=self.ctx.order.__getitem__)
        extra = f" +{len(owned) - 1}" if len(owned) > 1 else ""
        return f"{{{describe(self.graph, owned[0])}{extra}}}"


class Preview:
    """One move's effect on a state, kept as overlays on it (the state is not copied).

    It computes exactly what `State.commit` installs: the changed clusters and their
    reads, the new owner of each node whose owner changes (None: no longer owned), the
    new readers of each node whose readers change, and the outputs of every cluster the
    change touches (`touched`: the changed clusters, and the owners of what they read or
    own, whose outputs may change). Scoring and checking a move need only these."""

    def __init__(self, base: State, changes: dict[int, Cluster | None]):
        self.base, self.changes = base, changes
        self.ctx, self.graph = base.ctx, base.graph
        self.owner: dict[int, int | None] = {}
        self.readers: dict[int, set[int]] = {}
        self.reads: dict[int, frozenset[int]] = {}
        affected: set[int] = set()
        for cid in changes:
            if cid in base.clusters:
                old = base.clusters[cid]
                for n in old.owned:
                    if self.owner_of(n) == cid:
                        self.owner[n] = None
                for a in base.reads[cid]:
                    self.readers[a] = self.readers_of(a) - {cid}
                affected |= base.reads[cid] | old.owned
        for cid, c in changes.items():
            if c is None:
                continue
            for n in c.owned:
                self.owner[n] = cid
            r = base._reads_of(c)
            self.reads[cid] = r
            for a in r:
                self.readers[a] = self.readers_of(a) | {cid}
            affected |= r | c.owned
        touched = {cid for cid, c in changes.items() if c is not None}
        touched |= {o for o in map(self.owner_of, affected) if o is not None}
        self.affected = affected    # the nodes whose readers or owner the change may move
        self.outputs_order = list(touched)
        self.outputs = {cid: self._outputs_of(cid) for cid in self.outputs_order}
        self.touched = touched | set(changes)

    def owner_of(self, n: int) -> int | None:
        return self.owner[n] if n in self.owner else self.base.owner.get(n)

    def readers_of(self, n: int) -> set[int]:
        return self.readers[n] if n in self.readers else self.base.readers.get(n, set())

    def has(self, cid: int) -> bool:
        return self.changes[cid] is not None if cid in self.changes else cid in self.base.clusters

    def cluster(self, cid: int) -> Cluster:
        return self.changes[cid] if cid in self.changes else self.base.clusters[cid]

    def outputs_of(self, cid: int) -> frozenset[int]:
        return self.outputs[cid] if cid in self.outputs else self.base.outputs[cid]

    def _written(self, n: int, cid: int) -> bool:
        """Does owner `cid` write `n`: a graph output, or read by another cluster?"""
        readers = self.readers_of(n)
        return n in self.ctx.graph_outputs or len(readers) > 1 or (len(readers) == 1 and cid not in readers)

    def _outputs_of(self, cid: int) -> frozenset[int]:
        if cid in self.changes:
            return frozenset(n for n in self.changes[cid].owned if self._written(n, cid))
        # An unchanged cluster owns what it owned (ownership moves only between the changed
        # clusters), and only nodes whose readers changed can change their verdict.
        base_owner = self.base.owner
        moved = [n for n in self.readers if base_owner.get(n) == cid]
        before = self.base.outputs[cid]
        if not moved:
            return before
        return frozenset((before - set(moved)) | {n for n in moved if self._written(n, cid)})

    def cost(self, cid: int) -> ledger.Cost:
        return self.base.ctx.cost(self.cluster(cid).nodes, self.outputs_of(cid))


# --------------------------------------------------------------------------- building states


def view_closure(ctx: Context, nodes: set[int]) -> set[int]:
    """The views that `nodes` read through (folded into their loads). Opaque nodes read
    materialised tensors; a matmul or attention operand is read through strided views only
    (a `cat`, `flip`, `roll` or `constant_pad` feeding one is materialised by a kernel of its own)."""
    kind, args = ctx.kind, ctx.args
    out: set[int] = set()
    stack = [(a, kind[n] in ("gemm", "attention")) for n in nodes if kind[n] != "opaque" for a in args[n]]
    while stack:
        a, anchored = stack.pop()
        if a in out or a in nodes or kind[a] != "view" or (anchored and ctx.node(a).op not in STRIDED):
            continue
        out.add(a)
        stack.extend((x, anchored) for x in args[a])
    return out


def materialised_views(graph: Graph, live: set[int]) -> set[int]:
    """Views some kernel must write: graph outputs, operands of opaque nodes, and the views that
    are not strided (`cat`, `flip`, ...) that a matmul or attention operand reads (their loads
    take strided views only)."""
    need = {v for v in graph.outputs if graph.node(v).kind == "view"}
    for nid in live:
        n = graph.node(nid)
        if n.kind == "opaque":
            need |= {a for a in n.args if graph.node(a).kind == "view"}
        elif n.kind in ("gemm", "attention"):
            stack = list(n.args)
            while stack:
                a = stack.pop()
                if graph.node(a).kind == "view" and graph.node(a).op not in STRIDED:
                    need.add(a)
                elif graph.node(a).kind == "view":
                    stack.extend(graph.node(a).args)
    return need


def live_nodes(graph: Graph) -> set[int]:
    live = set(graph.outputs)
    for o in graph.outputs:
        live |= nx.ancestors(graph.nx, o)
    return live


def initial_state(graph: Graph, library: dict[int, str] | None = None) -> State:
    """Eager: one cluster per node; views owned only where memory needs them. `library`: the
    matmuls a library call computes (rules.check keeps their epilogues out of their groups)."""
    live = live_nodes(graph)
    owned_views = materialised_views(graph, live)
    topo = graph.topo_order()
    ctx = Context(graph, topo, library)
    clusters: dict[int, Cluster] = {}
    for nid in topo:
        kind = ctx.kind[nid]
        if nid not in live or kind in ("input", "constant"):
            continue
        if kind == "view" and nid not in owned_views:
            continue
        copies = view_closure(ctx, {nid}) if kind != "opaque" else set()
        clusters[nid] = Cluster(frozenset({nid}), frozenset(copies - {nid}))
    return State(ctx, clusters)

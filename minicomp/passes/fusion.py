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


def _check_cluster(state: State, cid: int) -> str | None:
    c = state.clusters[cid]
    key = (c.nodes, state.outputs[cid])
    if key not in state.ctx.checks:
        state.ctx.checks[key] = check(state.graph, set(c.nodes), set(key[1]))
    return state.ctx.checks[key]


class Reach:
    """Reachability in one state's group graph (computed once per state, on demand)."""

    def __init__(self, state: State):
        self.q = state.quotient()
        self._desc: dict[int, set[int]] = {}

    def path_via_other(self, a: int, b: int) -> list[int] | None:
        """A path a -> s -> ... -> b through some other group s, if there is one."""
        for s in sorted(self.q.successors(a)):
            if s == b:
                continue
            if s not in self._desc:
                self._desc[s] = nx.descendants(self.q, s)
            if b in self._desc[s]:
                return [a] + nx.shortest_path(self.q, s, b)
        return None


def legality(before: State, after: State, move: Move, reach: Reach | None = None) -> str | None:
    """None if `after` is a legal state reached by `move`; else the reason.

    A merge makes a cycle exactly when one of the two groups reaches the other through a
    third; a recomputation cannot make one (the consumer now reads what the producer read,
    which it already depended on)."""
    for cid in (move.a, move.b):
        if cid in after.clusters:
            why = _check_cluster(after, cid)
            if why:
                return why
    if move.kind == "recompute":
        return None
    reach = reach or Reach(before)
    path = reach.path_via_other(move.a, move.b) or reach.path_via_other(move.b, move.a)
    if path:
        text = " -> ".join(before.label(x) for x in path)
        return (f"fusing {before.label(move.a)} and {before.label(move.b)} would create a cycle "
                f"between groups: {text}")
    return None


def _sort_key(state: State, gain: int, move: Move) -> tuple:
    first = min(state.ctx.order[n] for n in state.clusters[move.a].owned | state.clusters[move.b].owned)
    return (-gain, {"merge": 0, "sibling": 1, "recompute": 2}[move.kind], first, move.a, move.b)


def scored_moves(state: State) -> list[tuple[int, Move, State]]:
    """Every applicable move with its gain, best first (ties: merges, then the earliest nodes)."""
    scored = []
    for move in candidates(state):
        after = apply(state, move)
        if after is not None:
            gain = state.gain(after)
            scored.append((_sort_key(state, gain, move), gain, move, after))
    scored.sort(key=lambda s: s[0])
    return [(gain, move, after) for _, gain, move, after in scored]


class MoveCache:
    """Gains of moves, kept across greedy steps: a move's gain depends only on the clusters
    it touches, so it stays valid until one of them changes (tracked by version numbers)."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.gains: dict[Move, tuple[tuple | None, tuple]] = {}
        self.verdicts: dict[Move, tuple[tuple, int]] = {}
        self.epoch = 0

    def _deps(self, cids) -> tuple:
        return tuple(sorted((c, self.versions.get(c, 0)) for c in cids))

    def score(self, state: State, move: Move) -> tuple | None:
        """The move's sort key (gain first, negated), or None when it does not apply."""
        hit = self.gains.get(move)
        if hit is not None and all(self.versions.get(c, 0) == v for c, v in hit[1]):
            return hit[0]
        after = apply(state, move)
        key = None if after is None else _sort_key(state, state.gain(after), move)
        touched = {move.a, move.b} | (after.touched if after is not None else set())
        self.gains[move] = (key, self._deps(touched))
        return key

    def applied(self, after: State, move: Move) -> None:
        for c in after.touched:
            self.versions[c] = self.versions.get(c, 0) + 1
        if move.kind == "recompute":
            self.epoch += 1

    def refused(self, move: Move) -> bool:
        """Was `move` found illegal, with nothing since that could change the verdict? Its
        own clusters are unchanged, and no recomputation removed a dependency (merges only
        add paths between groups, so a cycle stays a cycle)."""
        hit = self.verdicts.get(move)
        return hit is not None and hit[1] == self.epoch and all(self.versions.get(c, 0) == v for c, v in hit[0])

    def refuse(self, move: Move) -> None:
        self.verdicts[move] = (self._deps({move.a, move.b}), self.epoch)


def search(state: State) -> tuple[State, list[tuple[Move, State, State]]]:
    """Greedy by bytes saved; returns the final state and the recomputations applied."""
    applied: list[tuple[Move, State, State]] = []
    cache = MoveCache()
    while True:
        scored = []
        for move in candidates(state):
            key = cache.score(state, move)
            if key is not None and key[0] < 0:
                scored.append((key, move))
        scored.sort(key=lambda s: s[0])
        reach = None
        for _, move in scored:
            if cache.refused(move):
                continue
            after = apply(state, move)
            if move.kind != "recompute" and reach is None:
                reach = Reach(state)
            if legality(state, after, move, reach) is None:
                if move.kind == "recompute":
                    applied.append((move, state, after))
                cache.applied(after, move)
                state = after
                break
            cache.refuse(move)
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

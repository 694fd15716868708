"""The planner's moves and their legality: what a step of the search may do, and why not.

The search state (`state.py`) is a set of clusters, groups to be; every state keeps each
cluster legal (`rules.check`) and the graph of clusters acyclic.

Moves, scored by the ledger of the whole plan:
- merge two clusters (producer and consumer, or two readers of one tensor);
- recompute a cheap value (pointwise/view nodes over the owner's inputs) inside a
  consumer instead of reading it, when re-reading the inputs costs fewer bytes than
  writing and reading the value.
Legality is checked separately from profit. This module defines the moves, their order
(`sort_key`: bytes saved first; ties go to merges, then the earliest nodes, so the
result is deterministic) and their legality; `search.py` runs the greedy loop over them
and `build.py` turns the final state into a Plan, both on top of this module (neither is
imported here).
"""

from __future__ import annotations

from typing import Iterator

import networkx as nx

from minicomp.plan.rules import check
from minicomp.plan.state import Cluster, Context, Move, Preview, State, view_closure


def _merged(ctx: Context, a: Cluster, b: Cluster) -> Cluster:
    owned = a.owned | b.owned
    copies = (a.copies | b.copies | view_closure(ctx, set(owned | a.copies | b.copies))) - owned
    return Cluster(owned, frozenset(copies))


def cheap(ctx: Context, nid: int) -> bool:
    return ctx.kind[nid] in ("pointwise", "view")


def recompute_set(state: State, node: int) -> set[int] | None:
    """The nodes a consumer must copy to recompute `node`: its ancestors inside its owner's
    cluster. None if one of them is not cheap (a reduction or a matmul is never recomputed)."""
    ctx = state.ctx
    inside = state.clusters[state.owner[node]].nodes
    need: set[int] = set()
    stack = [node]
    while stack:
        nid = stack.pop()
        if nid in need:
            continue
        if not cheap(ctx, nid):
            return None
        need.add(nid)
        stack.extend(a for a in ctx.args[nid] if a in inside)
    return need


def _prune(state: State, cid: int, consumer: int, consumer_reads: set[int]) -> Cluster | None:
    """The owner `cid` once `consumer` reads only `consumer_reads` from memory: it keeps what
    its remaining outputs need (None when nothing is left to write)."""
    cluster = state.clusters[cid]
    inside, args = cluster.nodes, state.ctx.args
    outs = state.ctx.graph_outputs

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
        stack.extend(a for a in args[nid] if a in inside)
    return Cluster(frozenset(cluster.owned & needed), frozenset(cluster.copies & needed))


def preview_move(state: State, move: Move) -> Preview | None:
    """What `move` changes, without building the new state (None when it does not apply)."""
    ctx = state.ctx
    if move.kind in ("merge", "sibling"):
        m = _merged(ctx, state.clusters[move.a], state.clusters[move.b])
        return state.preview({move.a: m, move.b: None})
    need = recompute_set(state, move.node)
    if need is None:
        return None
    consumer = state.clusters[move.b]
    copies = (consumer.copies | need | view_closure(ctx, set(consumer.nodes | need))) - consumer.owned
    new_consumer = Cluster(consumer.owned, frozenset(copies))
    inside = new_consumer.nodes
    reads = {a for n in inside for a in ctx.args[n] if a not in inside}
    return state.preview({move.b: new_consumer, move.a: _prune(state, move.a, move.b, reads)})


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
            if cheap(state.ctx, a):
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


def _check_cluster(after: State | Preview, cid: int) -> str | None:
    c, outputs = after.cluster(cid), after.outputs_of(cid)
    checks = after.ctx.checks
    key = (c.nodes, outputs)
    if key not in checks:
        checks[key] = check(after.graph, set(c.nodes), set(outputs), after.ctx.library)
    return checks[key]


def path_via_other(state: State, a: int, b: int) -> list[int] | None:
    """A path of groups a -> s -> ... -> b through some third group s, or None."""
    stack = [s for s in state.successors(a) if s != b]
    parent = dict.fromkeys(stack, a)
    while stack:
        c = stack.pop()
        if c == b:
            path = [b]
            while path[-1] != a:
                path.append(parent[path[-1]])
            return path[::-1]
        for s in state.successors(c):
            if s not in parent:
                parent[s] = c
                stack.append(s)
    return None


def cycle_witness(state: State, move: Move) -> list[int] | None:
    """A path of groups that merging `move`'s two groups would close into a cycle (one reaches
    the other through a third), or None where the move makes no cycle. A recomputation cannot
    make one (the consumer now reads what the producer read, which it already depended on)."""
    if move.kind == "recompute":
        return None
    return path_via_other(state, move.a, move.b) or path_via_other(state, move.b, move.a)


def still_a_path(state: State, path: list[int]) -> bool:
    """Is `path` (a `cycle_witness`) still a path of groups in `state`?"""
    succ = state.successors
    return all(c in state.clusters for c in path) and all(y in succ(x) for x, y in zip(path, path[1:]))


def creates_cycle(state: State, move: Move) -> bool:
    """A merge makes a cycle exactly when one of the two groups reaches the other through a
    third (`cycle_witness`)."""
    return cycle_witness(state, move) is not None


def entangled(state: State, move: Move) -> bool:
    """Is `move` a sibling merge of two groups one of which depends, node by node, on a node the
    other owns that no group can recompute (not `cheap`: a matmul, a reduction)? Such a merge
    always makes a cycle. Whoever computes the path from that node reads it from memory, from
    its owner, so the owner's group reaches the other group; siblings read nothing of each
    other (else they are producer and consumer), so the path runs through a third group, which
    would both read from and feed the merged one. It stays a cycle while both groups stay as
    they are, so the search need not preview it: a cheap test over bit masks, where a rotary
    table that every layer reads pairs each layer's readers with every other layer's. (A cheap
    node does not do: a third group may recompute it from what it reads, and owe the first
    group nothing.)"""
    if move.kind != "sibling":
        return False
    ctx = state.ctx
    a, b = state.clusters[move.a], state.clusters[move.b]
    return _reaches(ctx, a, b) or _reaches(ctx, b, a)


def _reaches(ctx: Context, a: Cluster, b: Cluster) -> bool:
    """Does a node of `b` depend on a node `a` owns that no group can recompute?"""
    owned = 0
    for n in a.owned:
        if not cheap(ctx, n):
            owned |= 1 << ctx.order[n]
    return bool(owned) and any(ctx.ancestors(n) & owned for n in b.nodes)


class Reach:
    """Paths in one state's group graph, to name a cycle (computed once per state, on demand)."""

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


def rule_violation(after: State | Preview, move: Move) -> str | None:
    """Why one of the groups `move` leaves behind breaks the rules of rules.check."""
    for cid in (move.a, move.b):
        if after.has(cid):
            why = _check_cluster(after, cid)
            if why:
                return why
    return None


def is_legal(before: State, after: State | Preview, move: Move) -> bool:
    """`legality(...) is None`, without naming the reason (the search needs only the verdict)."""
    return rule_violation(after, move) is None and not creates_cycle(before, move)


def legality(before: State, after: State | Preview, move: Move, reach: Reach | None = None) -> str | None:
    """None if `after` is a legal state reached by `move`; else the reason."""
    why = rule_violation(after, move)
    if why or not creates_cycle(before, move):
        return why
    reach = reach or Reach(before)
    path = reach.path_via_other(move.a, move.b) or reach.path_via_other(move.b, move.a)
    text = " -> ".join(before.label(x) for x in path)
    return (f"fusing {before.label(move.a)} and {before.label(move.b)} would create a cycle "
            f"between groups: {text}")


def sort_key(state: State, gain: int, move: Move) -> tuple:
    first = min(state.ctx.order[n] for n in state.clusters[move.a].owned | state.clusters[move.b].owned)
    return (-gain, {"merge": 0, "sibling": 1, "recompute": 2}[move.kind], first, move.a, move.b)


def scored_moves(state: State) -> list[tuple[int, Move, Preview]]:
    """Every applicable move with its gain and a preview of its result, best first (ties:
    merges, then the earliest nodes; then the order `candidates` yields them in)."""
    scored = []
    for move in candidates(state):
        after = preview_move(state, move)
        if after is not None:
            gain = state.gain(after)
            scored.append((sort_key(state, gain, move), gain, move, after))
    scored.sort(key=lambda s: s[0])
    return [(gain, move, after) for _, gain, move, after in scored]


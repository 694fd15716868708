"""The planner's greedy search, kept incremental so that it scales with the graph.

`search(state)` applies, step after step, the legal move that saves the most bytes (ties:
merges, then siblings, then recomputations; then the earliest nodes; then the lowest
cluster ids and recomputed node), until no legal move saves any. That is: at every step,
walk `moves.candidates(state)` in `moves.sort_key` order and take the first legal one.

Doing that literally costs a pass over every candidate per step (quadratic in the graph).
Instead, three structures carry what a step did not change:
- `CandidateSet`: the candidates themselves. A move changes only the reads of its own
  clusters, the owner of what they own and the readers of what they read, so only the
  moves of the consumers and tensors around those are derived again;
- `MoveCache`: a move's key depends only on what its preview reads (`key_inputs`): its own
  clusters, the other owners whose outputs it changes, and for each node it moves readers or
  ownership of, whether that node keeps a reader besides the move's clusters. Version numbers
  tell when a cluster changed (a step changes only those it replaced and the owners whose
  outputs it changed: `cost_changed`) and when a node's count of readers crossed a small number
  (`recounted`), so a table every layer reads no longer ties every layer's moves to its owner.
  A refused move stays refused until what its verdict came from changes, and one refused for a
  cycle also until a step drops an edge between groups (`drops_an_edge`: merges only add
  paths, so a cycle stays a cycle); then the path it found (`moves.cycle_witness`) is checked
  before anything else. Each cluster and node lists the moves whose key depends
  on it, so a step re-scores exactly the moves whose cached key it invalidated. A sibling
  merge that `moves.entangled` proves a cycle is never previewed;
- `MoveQueue`: the candidates that save bytes, in key order (a heap). Refused moves wait
  aside ("parked") until their verdict may change.
The result is the same sequence of moves as the literal walk: the queue holds, for every
candidate that saves bytes and is not known to be refused, its current key.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from minicomp.plan.moves import cheap, cycle_witness, entangled, preview_move, rule_violation, sort_key, still_a_path
from minicomp.plan.state import Move, State

Pair = tuple[int, int]


class MoveCache:
    """Keys of moves, kept across greedy steps: a key stays valid while what it was computed
    from (`key_inputs`) stays as it was, tracked by version numbers of clusters and of nodes'
    reader counts."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}          # cluster -> version
        self.reader_versions: dict[int, int] = {}   # node -> version of its (small) count of readers
        self.keys: dict[Move, tuple[tuple | None, tuple, tuple]] = {}
        self.verdicts: dict[Move, tuple[tuple, tuple, int | None, list | None]] = {}
        self.dependents: dict[int, set[Move]] = {}          # cluster -> moves whose cached key used it
        self.node_dependents: dict[int, set[Move]] = {}     # node -> moves whose cached key used its readers
        self.epoch = 0

    def _deps(self, cids) -> tuple:
        return tuple(sorted((c, self.versions.get(c, 0)) for c in cids))

    def _node_deps(self, nodes) -> tuple:
        versions = self.reader_versions
        return tuple((n, versions.get(n, 0)) for n in nodes)

    def _valid(self, deps: tuple, node_deps: tuple = ()) -> bool:
        versions, readers = self.versions, self.reader_versions
        return (all(versions.get(c, 0) == v for c, v in deps)
                and all(readers.get(n, 0) == v for n, v in node_deps))

    def score(self, state: State, move: Move) -> tuple | None:
        """The move's sort key (gain first, negated), or None when it does not apply."""
        hit = self.keys.get(move)
        if hit is not None and self._valid(hit[1], hit[2]):
            return hit[0]
        after = None if entangled(state, move) else preview_move(state, move)
        key = None if after is None else sort_key(state, state.gain(after), move)
        clusters, nodes = key_inputs(state, move, after)
        self.keys[move] = (key, self._deps(clusters), self._node_deps(nodes))
        for c in clusters:
            self.dependents.setdefault(c, set()).add(move)
        for n in nodes:
            self.node_dependents.setdefault(n, set()).add(move)
        return key

    def applied(self, touched: set[int], recounted: set[int], dropped_edge: bool) -> set[Move]:
        """Record a move that changed the `touched` clusters and the reader counts of the
        `recounted` nodes, and whether it took an edge out of the graph of groups
        (`drops_an_edge`: then a cycle verdict may change); returns the moves whose cached key
        that invalidates."""
        stale: set[Move] = set()
        for c in touched:
            self.versions[c] = self.versions.get(c, 0) + 1
            stale |= self.dependents.pop(c, set())
        for n in recounted:
            self.reader_versions[n] = self.reader_versions.get(n, 0) + 1
            stale |= self.node_dependents.pop(n, set())
        if dropped_edge:
            self.epoch += 1
        return stale

    def refused(self, move: Move) -> bool:
        """Was `move` found illegal, with nothing since that could change the verdict? What the
        verdict was computed from is unchanged and, for a cycle, no step since dropped an edge
        between groups."""
        hit = self.verdicts.get(move)
        return hit is not None and hit[2] in (None, self.epoch) and self._valid(hit[0], hit[1])

    def witness(self, move: Move) -> list[int] | None:
        """The path of groups `move`'s last refusal for a cycle found, where its own clusters
        are as they were (the verdict lapsed only because a step dropped an edge). The search
        checks that path first: it usually still holds, and checking it costs its length where
        a search for a path may cross the whole graph."""
        hit = self.verdicts.get(move)
        return hit[3] if hit is not None and hit[2] is not None and self._valid(hit[0]) else None

    def refuse(self, state: State, move: Move, preview, witness: list[int] | None = None) -> None:
        """Record `move` as illegal: for a cycle, with the path of groups it closes (`witness`),
        else because `rules.check` refused a group it leaves. A rules refusal depends only on
        the groups its preview builds: their nodes come from the move's own clusters and what
        they write from whether each node they own has a reader besides them, which
        `key_inputs` tracks; that holds across recomputations too. A cycle may go when a step
        drops an edge between groups, so that refusal lasts only until then (`epoch`)."""
        if witness is None:
            clusters, nodes = key_inputs(state, move, preview)
            self.verdicts[move] = (self._deps(clusters), self._node_deps(nodes), None, None)
        else:
            self.verdicts[move] = (self._deps({move.a, move.b}), (), self.epoch, witness)


def key_inputs(state: State, move: Move, preview) -> tuple[set[int], set[int]]:
    """What `move`'s key, and a rules verdict on it, is computed from, given its `preview` (None:
    the move does not apply, which only its own clusters decide): (clusters, nodes).

    - clusters, any change to which counts: the move's own and any other its preview changes,
      and each other owner whose outputs (what it must write) the move changes, since that
      owner's cost before and after enters the gain. An owner whose outputs the move leaves as
      they are costs the same on both sides of the gain, so what it holds does not matter;
    - nodes whose count of readers counts: each node the move moves readers or ownership of
      (`Preview.affected`). What the preview derives from the readers of such a node n is only
      whether n keeps a reader besides the move's clusters a and b (is it still written?):
      |readers(n) - {a, b}| >= 1, where how many of a and b read n follows from a and b. So
      that answer can change only when n's count of readers crosses a number of at most 2, and
      a step marks a node only then (`recounted`): a table every layer reads (the rotary cos
      and sin) is a node of many readers whose owner's merges no longer rescore every layer."""
    if preview is None:
        return {move.a, move.b}, set()
    clusters = {move.a, move.b} | set(preview.changes)
    clusters |= {c for c in preview.outputs_order
                 if c not in preview.changes and preview.outputs[c] != state.outputs.get(c)}
    return clusters, preview.affected


def recounted(before: State, preview) -> set[int]:
    """The nodes whose count of readers the committed `preview` changes where the count before
    or after is at most 2 (`key_inputs`)."""
    readers = before.readers
    out: set[int] = set()
    for n, new in preview.readers.items():
        old = len(readers.get(n, ()))
        if old != len(new) and min(old, len(new)) <= 2:
            out.add(n)
    return out


class MoveQueue:
    """Moves that save bytes, best key first. A heap with lazy deletion: an entry counts
    only while it is its move's current one (`put` again, `drop` and `pop` retire it)."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, Move]] = []
        self._current: dict[Move, tuple] = {}
        self._seq = itertools.count()

    @staticmethod
    def _order(key: tuple, move: Move) -> tuple:
        # recomputations of two values between the same clusters share a key: the
        # literal walk meets them in node order
        return key + (-1 if move.node is None else move.node,)

    def put(self, move: Move, key: tuple | None) -> None:
        if key is None or key[0] >= 0:   # saves nothing: not a step the search takes
            self._current.pop(move, None)
            return
        order = self._order(key, move)
        if self._current.get(move) != order:
            self._current[move] = order
            heapq.heappush(self._heap, (order, next(self._seq), move))

    def drop(self, move: Move) -> None:
        self._current.pop(move, None)

    def pop(self) -> Move | None:
        while self._heap:
            order, _, move = heapq.heappop(self._heap)
            if self._current.get(move) == order:
                del self._current[move]
                return move
        return None


class CandidateSet:
    """The moves `moves.candidates(state)` yields, kept up to date move after move.

    - `into[c]`: the merges and recomputations into consumer c, one per (producer,
      consumer) edge and one per cheap value read over it;
    - `pairs_at[t]`: pairs (x < y) of clusters that both read tensor t (not a scalar);
      a pair is a sibling move while some tensor has it and no merge joins x and y.
    """

    def __init__(self, state: State):
        self.into: dict[int, set[Move]] = {}
        self.merge_pairs: set[Pair] = set()
        self.pairs_at: dict[int, set[Pair]] = {}
        self.pair_count: Counter[Pair] = Counter()
        self.siblings: set[Pair] = set()
        for cid in state.clusters:
            self._set_consumer(state, cid)
        for t in state.readers:
            self._set_tensor(state, t)
        for p in self.pair_count:
            self._refresh_pair(p)

    @property
    def moves(self) -> set[Move]:
        out = {Move("sibling", x, y) for x, y in self.siblings}
        for ms in self.into.values():
            out |= ms
        return out

    def __contains__(self, move: Move) -> bool:
        if move.kind == "sibling":
            return (move.a, move.b) in self.siblings
        return move in self.into.get(move.b, ())

    # -------------------------------------------------------------- derivation

    @staticmethod
    def _moves_into(state: State, cid: int) -> set[Move]:
        out: set[Move] = set()
        for a in state.reads[cid]:
            src = state.owner.get(a)
            if src is None or src == cid:
                continue
            out.add(Move("merge", src, cid))
            if cheap(state.ctx, a):
                out.add(Move("recompute", src, cid, a))
        return out

    @staticmethod
    def _pairs(state: State, t: int) -> set[Pair]:
        if state.ctx.node(t).numel <= 1:
            return set()   # sharing a scalar saves nothing worth a kernel
        ordered = sorted(state.readers.get(t, ()))
        return {(x, y) for i, x in enumerate(ordered) for y in ordered[i + 1:]}

    def _set_consumer(self, state: State | None, cid: int) -> tuple[set[Move], set[Move], set[Pair]]:
        """Re-derive the moves into `cid` (None state: it is gone): (old, new, pairs whose
        merge status changed)."""
        old = self.into.pop(cid, set())
        new = self._moves_into(state, cid) if state is not None else set()
        if new:
            self.into[cid] = new
        flipped: set[Pair] = set()
        for m in old - new:
            if m.kind == "merge":
                self.merge_pairs.discard((m.a, m.b))
                flipped.add((min(m.a, m.b), max(m.a, m.b)))
        for m in new - old:
            if m.kind == "merge":
                self.merge_pairs.add((m.a, m.b))
                flipped.add((min(m.a, m.b), max(m.a, m.b)))
        return old, new, flipped

    def _set_tensor(self, state: State, t: int) -> set[Pair]:
        """Re-derive the reader pairs of tensor `t`: the pairs whose count changed."""
        old = self.pairs_at.pop(t, set())
        new = self._pairs(state, t)
        if new:
            self.pairs_at[t] = new
        for p in old - new:
            self.pair_count[p] -= 1
            if not self.pair_count[p]:
                del self.pair_count[p]
        for p in new - old:
            self.pair_count[p] += 1
        return old ^ new

    def _refresh_pair(self, p: Pair) -> tuple[set[Move], set[Move]]:
        """Is pair p a sibling move? Returns (removed, added) sibling moves."""
        x, y = p
        live = p in self.pair_count and (x, y) not in self.merge_pairs and (y, x) not in self.merge_pairs
        move = Move("sibling", x, y)
        if live and p not in self.siblings:
            self.siblings.add(p)
            return set(), {move}
        if not live and p in self.siblings:
            self.siblings.discard(p)
            return {move}, set()
        return set(), set()

    # -------------------------------------------------------------- update

    def update(self, before: State, after: State, changed: set[int]) -> tuple[set[Move], set[Move]]:
        """Follow one move that replaced or removed the `changed` clusters: (removed, added)."""
        owned = set().union(*(s.clusters[k].owned for s in (before, after) for k in changed if k in s.clusters))
        read = set().union(*(s.reads[k] for s in (before, after) for k in changed if k in s.clusters))
        consumers = {k for k in changed if k in after.clusters}
        consumers |= {r for n in owned for r in after.readers.get(n, ())}
        removed: set[Move] = set()
        added: set[Move] = set()
        flipped: set[Pair] = set()
        for cid in sorted(consumers | (changed - consumers)):
            old, new, f = self._set_consumer(after if cid in after.clusters else None, cid)
            removed |= old - new
            added |= new - old
            flipped |= f
        for t in read:
            flipped |= self._set_tensor(after, t)
        for p in flipped:
            r, a = self._refresh_pair(p)
            removed |= r
            added |= a
        return removed, added


def cost_changed(before: State, after: State, preview) -> set[int]:
    """The clusters whose version a step bumps: those it replaced or removed, and the owners
    around them whose outputs (what they must write) changed. A key depends on another owner
    only where its move changes that owner's outputs (`key_inputs`), and whether it does
    follows from reader counts, which `recounted` tracks; so this holds for recomputations,
    which take readers away without merging, as for merges."""
    return {c for c in after.touched
            if c in preview.changes or before.outputs.get(c) != after.outputs.get(c)}


def drops_an_edge(before: State, after: State, preview) -> bool:
    """Whether a step took an edge out of the graph of groups: some group it touched no longer
    feeds a group it fed. A merge never does (the edges of its two groups become the merged
    group's); a recomputation may (its consumer stops reading the value from its owner, the
    owner may stop reading what the value needed). Only then can a merge refused for a cycle
    become legal."""
    for c in preview.touched:
        if c in before.clusters and before.successors(c) - (after.successors(c) if c in after.clusters else set()):
            return True
    return False


def search(state: State) -> tuple[State, list[tuple[Move, State, State]]]:
    """Greedy by bytes saved; returns the final state and the recomputations applied."""
    applied: list[tuple[Move, State, State]] = []
    cache = MoveCache()
    candidates = CandidateSet(state)
    queue = MoveQueue()
    for move in candidates.moves:
        queue.put(move, cache.score(state, move))
    parked: set[Move] = set()   # popped but refused: back in the queue once the verdict may change
    while True:
        chosen = preview = None
        while (move := queue.pop()) is not None:
            if cache.refused(move):
                parked.add(move)
                continue
            lapsed = cache.witness(move)     # a cycle verdict that lapsed: it usually still holds
            if lapsed is not None:
                witness = lapsed if still_a_path(state, lapsed) else cycle_witness(state, move)
                if witness is not None:
                    cache.refuse(state, move, None, witness)    # no preview needed to say so
                    parked.add(move)
                    continue
            preview = preview_move(state, move)
            if rule_violation(preview, move) is not None:
                cache.refuse(state, move, preview)
            elif lapsed is None and (witness := cycle_witness(state, move)) is not None:
                cache.refuse(state, move, preview, witness)
            else:
                chosen = move
                break
            parked.add(move)
        if chosen is None:
            return state, applied
        after = state.commit(preview)
        if chosen.kind == "recompute":
            applied.append((chosen, state, after))
        dropped = chosen.kind == "recompute" and drops_an_edge(state, after, preview)
        rescore = cache.applied(cost_changed(state, after, preview), recounted(state, preview), dropped)
        removed, added = candidates.update(state, after, set(preview.changes))
        state = after
        if dropped:   # every cycle verdict may change
            rescore |= parked
            parked.clear()
        for move in removed:
            queue.drop(move)
            parked.discard(move)
        for move in rescore | added:
            if move in candidates:
                parked.discard(move)
                queue.put(move, cache.score(state, move))

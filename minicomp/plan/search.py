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
- `MoveCache`: a move's key depends only on the clusters it touches (version numbers tell
  when one changed, and a step changes only those it replaced and the owners whose outputs
  it changed: `cost_changed`); a refused move stays refused until one of its two clusters
  changes, and one refused for a cycle also until a recomputation removes a dependency
  (merges only add paths between groups, so a cycle stays a cycle). Each cluster lists the
  moves whose key depends on it, so a step re-scores exactly the moves whose cached key it
  invalidated;
- `MoveQueue`: the candidates that save bytes, in key order (a heap). Refused moves wait
  aside ("parked") until their verdict may change.
The result is the same sequence of moves as the literal walk: the queue holds, for every
candidate that saves bytes and is not known to be refused, its current key.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from minicomp.plan.moves import cheap, creates_cycle, preview_move, rule_violation, sort_key
from minicomp.plan.state import Move, State

Pair = tuple[int, int]


class MoveCache:
    """Keys of moves, kept across greedy steps: a move's key depends only on the clusters
    it touches, so it stays valid until one of them changes (tracked by version numbers)."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.keys: dict[Move, tuple[tuple | None, tuple]] = {}
        self.verdicts: dict[Move, tuple[tuple, int]] = {}
        self.dependents: dict[int, set[Move]] = {}   # cluster -> moves whose cached key used it
        self.epoch = 0

    def _deps(self, cids) -> tuple:
        return tuple(sorted((c, self.versions.get(c, 0)) for c in cids))

    def _valid(self, deps: tuple) -> bool:
        return all(self.versions.get(c, 0) == v for c, v in deps)

    def score(self, state: State, move: Move) -> tuple | None:
        """The move's sort key (gain first, negated), or None when it does not apply."""
        hit = self.keys.get(move)
        if hit is not None and self._valid(hit[1]):
            return hit[0]
        after = preview_move(state, move)
        key = None if after is None else sort_key(state, state.gain(after), move)
        touched = {move.a, move.b} | (after.touched if after is not None else set())
        self.keys[move] = (key, self._deps(touched))
        for c in touched:
            self.dependents.setdefault(c, set()).add(move)
        return key

    def applied(self, touched: set[int], move: Move) -> set[Move]:
        """Record a move that changed the `touched` clusters; returns the moves whose
        cached key that invalidates."""
        stale: set[Move] = set()
        for c in touched:
            self.versions[c] = self.versions.get(c, 0) + 1
            stale |= self.dependents.pop(c, set())
        if move.kind == "recompute":
            self.epoch += 1
        return stale

    def refused(self, move: Move) -> bool:
        """Was `move` found illegal, with nothing since that could change the verdict? Its own
        clusters are unchanged and, for a cycle, no recomputation removed a dependency."""
        hit = self.verdicts.get(move)
        return hit is not None and hit[1] in (None, self.epoch) and self._valid(hit[0])

    def refuse(self, move: Move, by_rules: bool = False) -> None:
        """Record `move` as illegal. A refusal `by_rules` (`rules.check` refused a group the move
        leaves) depends only on the groups its preview builds from its own two clusters, and
        those stay as they are while the two do, across recomputations too: what the groups
        write follows from who reads what they own, and a step that changes that bumps their
        owner (`cost_changed`). A cycle may go when a recomputation removes a dependency, so
        that refusal lasts only until the next one (`epoch`)."""
        self.verdicts[move] = (self._deps({move.a, move.b}), None if by_rules else self.epoch)


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


def cost_changed(before: State, after: State, preview, move: Move) -> set[int]:
    """The clusters whose cached move keys `move` may have changed: those it replaced or removed,
    and the owners around them whose outputs (what they must write) changed. A touched owner
    whose outputs stayed as they were costs what it cost, and the keys of moves through it hold:
    a merge elsewhere changes who reads what that owner writes only by replacing readers with
    their union, which still reads it, so no preview of another move through the owner sees
    its last outside reader go (unless that move involves a replaced cluster, rescored anyway).
    A recomputation does take a reader away without merging, so after one every touched
    cluster counts as changed."""
    if move.kind == "recompute":
        return after.touched
    return {c for c in after.touched
            if c in preview.changes or before.outputs.get(c) != after.outputs.get(c)}


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
            preview = preview_move(state, move)
            if rule_violation(preview, move) is not None:
                cache.refuse(move, by_rules=True)
            elif creates_cycle(state, move):
                cache.refuse(move)
            else:
                chosen = move
                break
            parked.add(move)
        if chosen is None:
            return state, applied
        after = state.commit(preview)
        if chosen.kind == "recompute":
            applied.append((chosen, state, after))
        rescore = cache.applied(cost_changed(state, after, preview, chosen), chosen)
        removed, added = candidates.update(state, after, set(preview.changes))
        state = after
        if chosen.kind == "recompute":   # every verdict may change
            rescore |= parked
            parked.clear()
        for move in removed:
            queue.drop(move)
            parked.discard(move)
        for move in rescore | added:
            if move in candidates:
                parked.discard(move)
                queue.put(move, cache.score(state, move))

"""A layered layout of a DAG in pure Python, so the report's graph looks the same everywhere.

The method is the usual layered (Sugiyama-style) one, kept small:

1. layering: longest path from the sources; then every node that does not depend on a
   node pinned to the top (a constant, a weight, a transpose of a weight) moves down to
   just above its first consumer, so a weight sits beside the matmul that reads it rather
   than at the top with a long edge;
2. an edge that spans several layers gets a thin dummy box in each layer it crosses, so
   it bends around the nodes there instead of running through them;
3. ordering: alternating down and up sweeps sort each layer by the barycentre of its
   neighbours in the layer before; the ordering with the fewest crossings wins;
4. x coordinates: each layer is pulled towards its neighbours' centres and then placed
   by an isotonic regression that keeps the order and the minimum gaps exactly.

Invariants of the result (tested): boxes never overlap (every layer is its own band of
y, and inside a band the order keeps each gap); every edge goes from a lower layer to a
higher one, and its path's y strictly increases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

Node = Hashable

NODE_GAP = 18.0      # horizontal space between two boxes of one layer
DUMMY_WIDTH = 6.0    # the slot an edge takes when it passes through a layer
LAYER_GAP = 24.0     # vertical space between layers, where edges run
MARGIN = 12.0


@dataclass(frozen=True)
class Box:
    x: float          # left
    y: float          # top
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    def overlaps(self, other: "Box") -> bool:
        return (self.x < other.x + other.w and other.x < self.x + self.w
                and self.y < other.y + other.h and other.y < self.y + self.h)


@dataclass
class Layout:
    boxes: dict[Node, Box]
    layer: dict[Node, int]
    edges: dict[tuple[Node, Node], list[tuple[float, float]]]   # bottom of source, bends, top of target
    width: float
    height: float
    crossings: int = 0
    rows: list[list[Node]] = field(default_factory=list)        # the final order, dummies left out


@dataclass(frozen=True)
class _Dummy:
    edge: tuple
    step: int


def _layers(nodes: Sequence[Node], preds: dict, succs: dict, pinned: set) -> dict[Node, int]:
    layer: dict[Node, int] = {}
    anchored: set = set()                  # the pinned nodes and all that depend on them
    for n in nodes:                        # `nodes` is in a topological order
        layer[n] = max((layer[p] + 1 for p in preds[n]), default=0)
        if n in pinned or any(p in anchored for p in preds[n]):
            anchored.add(n)
    for n in reversed(nodes):              # the rest (weights and what only they feed) sits just above its first consumer
        if n not in anchored and succs[n]:
            layer[n] = min(layer[s] for s in succs[n]) - 1
    low = min(layer.values(), default=0)
    return {n: k - low for n, k in layer.items()}


def _crossings(upper: list, lower_pos: dict, down: dict) -> int:
    """Crossings between the edges from row `upper` to the row below (positions `lower_pos`)."""
    segs = [(i, lower_pos[t]) for i, u in enumerate(upper) for t in down[u]]
    count = 0
    for k, (a1, b1) in enumerate(segs):
        for a2, b2 in segs[k + 1:]:
            if (a1 - a2) * (b1 - b2) < 0:
                count += 1
    return count


def _total_crossings(rows: list[list], down: dict) -> int:
    total = 0
    for r in range(len(rows) - 1):
        pos = {n: i for i, n in enumerate(rows[r + 1])}
        total += _crossings(rows[r], pos, down)
    return total


def _sweep(rows: list[list], neighbours: dict, indices: Iterable[int], ref_offset: int) -> None:
    """Sort each row in `indices` by the mean position of its neighbours in row index + ref_offset."""
    for r in indices:
        ref = {n: i for i, n in enumerate(rows[r + ref_offset])}
        row = rows[r]

        def key(item: tuple[int, Node]) -> tuple[float, int]:
            i, n = item
            near = [ref[m] for m in neighbours[n] if m in ref]
            # a node without neighbours there keeps its place, scaled to the other row's length
            bary = sum(near) / len(near) if near else i * max(len(ref), 1) / max(len(row), 1)
            return (bary, i)
        rows[r] = [n for _, n in sorted(enumerate(row), key=key)]


def _order(rows: list[list], up: dict, down: dict, sweeps: int) -> tuple[list[list], int]:
    best, best_count = [list(r) for r in rows], _total_crossings(rows, down)
    for _ in range(sweeps):
        if best_count == 0:
            break
        _sweep(rows, up, range(1, len(rows)), -1)
        _sweep(rows, down, range(len(rows) - 2, -1, -1), +1)
        count = _total_crossings(rows, down)
        if count < best_count:
            best, best_count = [list(r) for r in rows], count
    return best, best_count


def _place_row(widths: list[float], wanted: list[float]) -> list[float]:
    """Centres as close as possible (least squares) to `wanted`, in order, gaps kept.

    With o_i the least distance of centre i from centre 0, y_i = x_i - o_i must not
    decrease: an isotonic regression of wanted_i - o_i (pool adjacent violators)."""
    offsets = [0.0]
    for a, b in zip(widths, widths[1:]):
        offsets.append(offsets[-1] + (a + b) / 2 + (NODE_GAP if min(a, b) > DUMMY_WIDTH else NODE_GAP / 3))
    target = [w - o for w, o in zip(wanted, offsets)]
    blocks: list[list[float]] = []          # [sum, count]
    for t in target:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    fitted: list[float] = []
    for s, c in blocks:
        fitted += [s / c] * int(c)
    return [f + o for f, o in zip(fitted, offsets)]


def _coordinates(rows: list[list], width_of: dict, up: dict, down: dict, rounds: int) -> dict[Node, float]:
    x: dict[Node, float] = {}
    for row in rows:                        # start packed from the left
        placed = _place_row([width_of[n] for n in row], [0.0] * len(row))
        x.update(zip(row, placed))
    for k in range(rounds):
        order = range(1, len(rows)) if k % 2 == 0 else range(len(rows) - 2, -1, -1)
        near = up if k % 2 == 0 else down
        for r in order:
            row = rows[r]
            wanted = []
            for n in row:
                ns = [x[m] for m in near[n]]
                wanted.append(sum(ns) / len(ns) if ns else x[n])
            x.update(zip(row, _place_row([width_of[n] for n in row], wanted)))
    return x


def layered_layout(nodes: Sequence[Node], sizes: dict[Node, tuple[float, float]],
                   edges: Iterable[tuple[Node, Node]], pinned_top: Iterable[Node] = (),
                   sweeps: int = 12, rounds: int = 8) -> Layout:
    """Lay out a DAG top to bottom. `nodes` in a topological order; `sizes` (width, height)
    per node; `pinned_top` nodes without predecessors stay in the first layer."""
    nodes = list(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    edges = sorted(set(edges), key=lambda e: (index[e[0]], index[e[1]]))
    preds: dict = {n: [] for n in nodes}
    succs: dict = {n: [] for n in nodes}
    for a, b in edges:
        succs[a].append(b)
        preds[b].append(a)
    layer = _layers(nodes, preds, succs, set(pinned_top))
    depth = max(layer.values(), default=-1) + 1
    rows: list[list] = [[] for _ in range(depth)]
    for n in nodes:
        rows[layer[n]].append(n)
    width_of = {n: float(sizes[n][0]) for n in nodes}
    up: dict = {n: [] for n in nodes}       # over real nodes and dummies: the chain each edge follows
    down: dict = {n: [] for n in nodes}
    chains: dict[tuple, list] = {}
    for a, b in edges:
        chain = [a] + [_Dummy((a, b), s) for s in range(1, layer[b] - layer[a])] + [b]
        for s, d in enumerate(chain[1:-1], start=1):
            rows[layer[a] + s].append(d)
            width_of[d] = DUMMY_WIDTH
            up[d], down[d] = [], []
        for u, v in zip(chain, chain[1:]):
            down[u].append(v)
            up[v].append(u)
        chains[(a, b)] = chain
    rows, crossings = _order(rows, up, down, sweeps)
    x = _coordinates(rows, width_of, up, down, rounds)
    left = min((x[n] - width_of[n] / 2 for row in rows for n in row), default=0.0)
    shift = MARGIN - left
    bands = [max((sizes[n][1] for n in row if not isinstance(n, _Dummy)), default=0.0) for row in rows]
    tops, y = [], MARGIN
    for band in bands:
        tops.append(y)
        y += band + LAYER_GAP
    boxes: dict[Node, Box] = {}
    for r, row in enumerate(rows):
        for n in row:
            if not isinstance(n, _Dummy):
                w, h = sizes[n]
                boxes[n] = Box(x[n] + shift - w / 2, tops[r] + (bands[r] - h) / 2, float(w), float(h))
    paths = {}
    for (a, b), chain in chains.items():
        pts = [(boxes[a].cx, boxes[a].y + boxes[a].h)]
        pts += [(x[d] + shift, tops[layer[a] + d.step] + bands[layer[a] + d.step] / 2) for d in chain[1:-1]]
        pts.append((boxes[b].cx, boxes[b].y))
        paths[(a, b)] = pts
    right = max((b.x + b.w for b in boxes.values()), default=0.0)
    right = max([right] + [p[0] for pts in paths.values() for p in pts])
    real_rows = [[n for n in row if not isinstance(n, _Dummy)] for row in rows]
    return Layout(boxes, layer, paths, right + MARGIN, y - LAYER_GAP + MARGIN, crossings, real_rows)

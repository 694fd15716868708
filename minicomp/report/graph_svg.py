"""The fused graph as an inline SVG: one box per graph node, filled with its plan group's colour.

Each node is labelled with what the user wrote: an input's parameter name, a weight's
attribute path (`attention.wq.weight`), an op's name, an opaque node's PyTorch target.
A node's colour is that of the group that writes it, else of the first that computes it
(`explain.node_groups`); a node computed in several groups (recomputed) has a dashed
border, and a graph output a thick one. An edge between two nodes of one group stays
inside a kernel (drawn in the group's colour); any other edge is a tensor read from
memory (grey).

Every user-supplied string goes through `html.escape`: the SVG is markup inside the page.
"""

from __future__ import annotations

import html

from minicomp.ir.dtypes import type_str
from minicomp.ir.graph import Graph, Node
from minicomp.plan.records import Plan
from minicomp.report.layout import Layout, layered_layout

# light fills with a darker stroke each; 12 groups before a colour repeats
PALETTE = [("#a6cee3", "#1f78b4"), ("#b2df8a", "#33a02c"), ("#fb9a99", "#e31a1c"), ("#fdbf6f", "#ff7f00"),
           ("#cab2d6", "#6a3d9a"), ("#ffff99", "#b15928"), ("#8dd3c7", "#1b9e77"), ("#bebada", "#7570b3"),
           ("#fccde5", "#e7298a"), ("#d9d9d9", "#636363"), ("#ccebc5", "#66a61e"), ("#ffed6f", "#d95f02")]
NO_GROUP = ("#ffffff", "#8c8c8c")

FONT_PX = 11.0
CHAR_PX = 6.8          # advance of one monospace character at FONT_PX (DejaVu Sans Mono: 0.602 em), rounded up
BOX_H = 34.0
PAD_X = 8.0
MAX_CHARS = 30         # longer labels are cut (the full text is in the tooltip)


def group_colour(gid: int | None) -> tuple[str, str]:
    """(fill, stroke) of plan group `gid` (None: no group, e.g. an input or a constant)."""
    return NO_GROUP if gid is None else PALETTE[gid % len(PALETTE)]


def node_groups(plan: Plan, graph: Graph) -> dict[int, int]:
    """Node id -> the group that writes it, else the first group that computes it."""
    from minicomp.explain import node_groups as groups   # the CLI's picture uses the same rule
    return groups(plan, graph)


def _short(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def node_name(n: Node) -> str:
    """What the user calls node `n`: parameter name, weight label, PyTorch target or op name."""
    if n.op == "input":
        return str(n.attrs.get("name", "input"))
    if n.op == "constant":
        if n.attrs.get("label"):
            return str(n.attrs["label"])
        value = n.attrs.get("value")
        if hasattr(value, "shape") and getattr(value, "ndim", 0):
            return "constant"
        return f"{value:.4g}" if isinstance(value, float) else repr(value)
    if n.op == "opaque":
        return str(n.attrs.get("target", "opaque"))
    return n.op


def node_lines(graph: Graph, n: Node) -> tuple[str, str]:
    """The two label lines of a node box: `%id name` (and its output slot), then its type."""
    first = f"%{n.id} {_short(node_name(n))}"
    if n.id in graph.outputs:
        slots = [str(k) for k, o in enumerate(graph.outputs) if o == n.id]
        first += f"  → out {','.join(slots)}"
    return first, type_str(n.shape, n.dtype)


def box_size(lines: tuple[str, str]) -> tuple[float, float]:
    return max(len(line) for line in lines) * CHAR_PX + 2 * PAD_X, BOX_H


def graph_layout(graph: Graph) -> tuple[Layout, dict[int, tuple[str, str]]]:
    """The layout of `graph` (node ids in topological order; inputs pinned to the top) and each node's lines."""
    order = graph.topo_order()
    lines = {nid: node_lines(graph, graph.node(nid)) for nid in order}
    sizes = {nid: box_size(lines[nid]) for nid in order}
    layout = layered_layout(order, sizes, graph.nx.edges, pinned_top=graph.inputs)
    return layout, lines


def _path(points: list[tuple[float, float]]) -> str:
    """A smooth path through `points`, leaving and entering each vertically."""
    (x0, y0), rest = points[0], points[1:]
    d = [f"M{x0:.1f},{y0:.1f}"]
    for x1, y1 in rest:
        mid = (y1 - y0) / 2
        d.append(f"C{x0:.1f},{y0 + mid:.1f} {x1:.1f},{y1 - mid:.1f} {x1:.1f},{y1:.1f}")
        x0, y0 = x1, y1
    return " ".join(d)


def _tooltip(n: Node, plan: Plan, gid: int | None, holders: list[int]) -> str:
    parts = [f"%{n.id} {node_name(n)}: {n.op} {type_str(n.shape, n.dtype)}"]
    if n.origin:
        parts.append(f"from {n.origin}")
    g = next((g for g in plan.groups if g.id == gid), None)
    if g is not None:
        parts.append(f"group {g.id}: {g.kind} {g.name}".rstrip())
    if len(holders) > 1:
        parts.append("computed in groups " + ", ".join(map(str, holders)))
    return "\n".join(parts)


def render_graph(graph: Graph, plan: Plan) -> str:
    """The `<svg>` element of the fused graph, sized to its layout."""
    layout, lines = graph_layout(graph)
    groups = node_groups(plan, graph)
    holders: dict[int, list[int]] = {}
    for g in plan.groups:
        for nid in g.nodes:
            holders.setdefault(nid, []).append(g.id)
    esc = html.escape
    out = [f'<svg class="graph" role="img" aria-label="fused graph of {esc(graph.name)}" '
           f'width="{layout.width:.0f}" height="{layout.height:.0f}" '
           f'viewBox="0 0 {layout.width:.0f} {layout.height:.0f}">',
           '<defs><marker id="mc-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" fill="#777"/></marker></defs>',
           '<g class="edges">']
    for (a, b), pts in sorted(layout.edges.items()):
        ga, gb = groups.get(a), groups.get(b)
        inside = ga is not None and ga == gb
        colour = group_colour(ga)[1] if inside else "#9a9a9a"
        width = "1.6" if inside else "1.1"
        out.append(f'<path class="edge{" inside" if inside else ""}" data-from="{a}" data-to="{b}" '
                   f'd="{_path(pts)}" fill="none" stroke="{colour}" stroke-width="{width}" '
                   'marker-end="url(#mc-arrow)"/>')
    out.append('</g><g class="nodes">')
    for nid in graph.topo_order():
        n, box = graph.node(nid), layout.boxes[nid]
        gid = groups.get(nid)
        fill, stroke = group_colour(gid)
        dash = ' stroke-dasharray="4 2"' if len(holders.get(nid, [])) > 1 else ""
        border = "2.6" if nid in graph.outputs else "1"
        rx = "14" if n.op in ("input", "constant") else "3"
        first, second = lines[nid]
        tip = _tooltip(n, plan, gid, holders.get(nid, []))
        out.append(f'<g class="node" data-node="{nid}" data-group="{"" if gid is None else gid}">'
                   f'<title>{esc(tip)}</title>'
                   f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="{rx}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{border}"{dash}/>'
                   f'<text x="{box.cx:.1f}" y="{box.y + 14:.1f}" text-anchor="middle" class="l1">{esc(first)}</text>'
                   f'<text x="{box.cx:.1f}" y="{box.y + 27:.1f}" text-anchor="middle" class="l2">{esc(second)}</text>'
                   '</g>')
    out.append("</g></svg>")
    return "\n".join(out)

"""The roofline chart: arithmetic intensity (flop/byte, log x) against throughput (flop/s, log y).

The ceilings are the machine model's (`minicomp.plan.cost.Machine`): the memory roof
y = bandwidth * x, and one horizontal roof per distinct compute peak (the vector peak and
each matmul dtype's). Each plan group is one point at its ledger bound: x = its flops over
its bytes, y = its flops over its roofline lower bound, so it sits on the roof that bounds
it. With timings (`explain.bench`, CUDA only) a group also gets its measured point, at the
same x and y = flops over the measured time, joined to its bound by a line.

A group with no flops or no bytes has no place on log axes: it is listed as not plotted,
never dropped silently.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from minicomp.plan.cost import Machine
from minicomp.plan.records import Plan
from minicomp.report.graph_svg import group_colour

W, H = 720.0, 430.0
LEFT, RIGHT, TOP, BOTTOM = 78.0, 190.0, 18.0, 46.0


@dataclass(frozen=True)
class Point:
    group: int
    label: str                     # "g3 gemm swiglu"
    intensity: float               # flop per byte
    bound_flops: float             # flop/s at the ledger's lower bound
    measured_flops: float | None   # flop/s measured, when timed


@dataclass(frozen=True)
class Ceiling:
    label: str
    flops: float


def points(plan: Plan, group_us: dict[int, float] | None = None) -> tuple[list[Point], list[str]]:
    """One point per group that has flops, bytes and a bound; and why each other group is not plotted."""
    pts, skipped = [], []
    for g in plan.groups:
        name = f"g{g.id} {g.kind} {g.name}".rstrip()
        nbytes = g.bytes_in + g.bytes_out
        if g.flops <= 0 or nbytes <= 0 or g.lower_bound_us <= 0:
            what = "no flops" if g.flops <= 0 else "no bytes" if nbytes <= 0 else "no bound"
            skipped.append(f"{name}: {what}, so no point on log axes")
            continue
        measured = None
        if group_us and group_us.get(g.id, 0.0) > 0:
            measured = g.flops / (group_us[g.id] * 1e-6)
        pts.append(Point(g.id, name, g.flops / nbytes, g.flops / (g.lower_bound_us * 1e-6), measured))
    return pts, skipped


def ceilings(machine: Machine) -> list[Ceiling]:
    """The machine's distinct compute peaks, each named for what reaches it, highest first."""
    named: dict[float, list[str]] = {}
    for dtype, peak in machine.matmul_flops.items():
        named.setdefault(peak, []).append(f"{dtype} matmul")
    if machine.vector_flops:
        named.setdefault(machine.vector_flops, []).append("vector")
    return [Ceiling(", ".join(names), peak) for peak, names in sorted(named.items(), reverse=True)]


def fmt_rate(flops: float) -> str:
    for unit, scale in (("PF/s", 1e15), ("TF/s", 1e12), ("GF/s", 1e9), ("MF/s", 1e6), ("KF/s", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} F/s"


def _fmt_intensity(x: float) -> str:
    return f"{x:g}" if 1e-3 <= x <= 1e5 else f"1e{round(math.log10(x))}"


class _Axes:
    def __init__(self, xs: list[float], ys: list[float]):
        self.x0 = math.floor(math.log10(min(xs)) - 0.3)
        self.x1 = math.ceil(math.log10(max(xs)) + 0.3)
        self.y0 = math.floor(math.log10(min(ys)) - 0.3)
        self.y1 = math.ceil(math.log10(max(ys)) + 0.15)

    def px(self, x: float) -> float:
        return LEFT + (math.log10(x) - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return H - BOTTOM - (math.log10(y) - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)


def _labels_placed(items: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """One label per cluster of points closer than a marker's width ("g1,g2,g3"), right of the
    cluster, moved down until no two labels overlap."""
    clusters: list[list[tuple[float, float, str]]] = []
    for item in sorted(items, key=lambda t: (t[0], t[1])):
        for c in clusters:
            if abs(c[0][0] - item[0]) < 7 and abs(c[0][1] - item[1]) < 7:
                c.append(item)
                break
        else:
            clusters.append([item])
    placed: list[tuple[float, float, str]] = []
    for c in sorted(clusters, key=lambda c: (c[0][1], c[0][0])):
        text = ",".join(t[2] for t in c)
        lx, ly = max(t[0] for t in c) + 8, c[0][1] + 4
        width = len(text) * 6.2
        while any(abs(ly - py) < 11 and lx < px + len(pt) * 6.2 and px < lx + width for px, py, pt in placed):
            ly += 11
        placed.append((lx, ly, text))
    return placed


def render_roofline(plan: Plan, machine: Machine, group_us: dict[int, float] | None = None) -> str:
    """The `<svg>` roofline of `plan`'s groups on `machine`."""
    esc = html.escape
    pts, _ = points(plan, group_us)
    roofs = ceilings(machine)
    bw = machine.bytes_per_s
    ridges = [c.flops / bw for c in roofs]
    xs = [p.intensity for p in pts] + ridges
    ys = [p.bound_flops for p in pts] + [p.measured_flops for p in pts if p.measured_flops] + [c.flops for c in roofs]
    ax = _Axes(xs, ys)
    xl, xr = 10.0 ** ax.x0, 10.0 ** ax.x1
    yb, yt = 10.0 ** ax.y0, 10.0 ** ax.y1
    out = [f'<svg class="roofline" role="img" aria-label="roofline of {esc(plan.graph_name)} on {esc(machine.name)}" '
           f'width="{W:.0f}" height="{H:.0f}" viewBox="0 0 {W:.0f} {H:.0f}">',
           f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="#fcfcfc" '
           'stroke="#bbb"/>']
    for k in range(ax.x0, ax.x1 + 1):                       # decades: grid and tick labels
        x = ax.px(10.0 ** k)
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#e6e6e6"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 15}" text-anchor="middle">'
                   f'{_fmt_intensity(10.0 ** k)}</text>')
    for k in range(ax.y0, ax.y1 + 1):
        y = ax.py(10.0 ** k)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_rate(10.0 ** k)}</text>')
    out.append(f'<text class="axis" x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor="middle">'
               'arithmetic intensity (flop / byte)</text>')
    out.append(f'<text class="axis" transform="translate(14 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
               'text-anchor="middle">throughput (flop / s)</text>')
    # the memory roof, from the left edge (or the floor) up to the highest compute peak
    x_start = max(xl, yb / bw)
    x_top = min(max(ridges), xr)
    out.append(f'<line class="ceiling memory" x1="{ax.px(x_start):.1f}" y1="{ax.py(x_start * bw):.1f}" '
               f'x2="{ax.px(x_top):.1f}" y2="{ax.py(x_top * bw):.1f}" stroke="#444" stroke-width="2"/>')
    dx = ax.px(xl * 10) - ax.px(xl)
    dy = ax.py(xl * 10 * bw) - ax.py(xl * bw)   # negative: the roof rises to the right
    angle = math.degrees(math.atan2(dy, dx))
    span = 17 * 6.6 * math.cos(math.radians(angle))   # the label's width along x, in pixels
    # the label goes where the fewest points sit along the roof (they all lie on it)
    starts = [x_start * 10 ** (k / 4) for k in range(1, 40) if ax.px(x_start * 10 ** (k / 4)) + span < ax.px(x_top)]
    crowd = lambda x: sum(ax.px(x) - 10 < ax.px(p.intensity) < ax.px(x) + span + 10 for p in pts)   # noqa: E731
    label_x = min(starts, key=lambda x: (crowd(x), x)) if starts else x_start * 1.3
    out.append(f'<text class="ceiling-label" transform="translate({ax.px(label_x):.1f} '
               f'{ax.py(label_x * bw) - 9:.1f}) rotate({angle:.1f})">memory {bw / 1e9:.0f} GB/s</text>')
    for c, ridge in zip(roofs, ridges):
        y = ax.py(c.flops)
        out.append(f'<line class="ceiling compute" x1="{ax.px(min(ridge, xr)):.1f}" y1="{y:.1f}" x2="{W - RIGHT}" '
                   f'y2="{y:.1f}" stroke="#444" stroke-width="2"/>')
        out.append(f'<text class="ceiling-label" x="{W - RIGHT + 6}" y="{y + 4:.1f}">{fmt_rate(c.flops)} '
                   f'<tspan x="{W - RIGHT + 6}" dy="12">{esc(c.label)}</tspan></text>')
    labels = []
    for p in pts:
        fill, stroke = group_colour(p.group)
        x, y = ax.px(p.intensity), ax.py(p.bound_flops)
        tip = f"{p.label}: {p.intensity:.3g} flop/B, {fmt_rate(p.bound_flops)} at the ledger bound"
        if p.measured_flops:
            ym = ax.py(p.measured_flops)
            out.append(f'<line class="gap" x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{ym:.1f}" stroke="{stroke}" '
                       'stroke-dasharray="3 2"/>')
            out.append(f'<path class="point measured" data-group="{p.group}" '
                       f'd="M{x:.1f},{ym - 6:.1f} L{x + 6:.1f},{ym:.1f} L{x:.1f},{ym + 6:.1f} L{x - 6:.1f},{ym:.1f} z" '
                       f'fill="#fff" stroke="{stroke}" stroke-width="2"><title>{esc(p.label)}: measured '
                       f'{fmt_rate(p.measured_flops)}</title></path>')
        out.append(f'<circle class="point bound" data-group="{p.group}" cx="{x:.1f}" cy="{y:.1f}" r="5" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"><title>{esc(tip)}</title></circle>')
        labels.append((x, y, f"g{p.group}"))
    for lx, ly, text in _labels_placed(labels):
        out.append(f'<text class="point-label" x="{lx:.1f}" y="{ly:.1f}">{esc(text)}</text>')
    out.append("</svg>")
    return "\n".join(out)

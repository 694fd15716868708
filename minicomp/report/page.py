"""The report page: one self-contained HTML file (inline CSS and SVG, no script, no network).

Sections, in order: the ledger totals (`#ledger`) beside the roofline (`#roofline`), the
fused graph (`#graph`), the plan with its refused fusions and recompute decisions (`#plan`), and the
kernels beside the user's lines (`#kernels`). Every string that comes from the user or the
program (names, labels, paths, source lines, reasons, kernel text) passes through `esc`
(`html.escape`) on its way into markup; nothing else is spliced in unescaped but figures
and the page's own fixed text.

Figures are labelled as what they are: the bytes and bounds are a model of the named
machine (`Machine` in plan/cost.py), and a measured point only exists when the kernels
were timed on a GPU (`explain.bench`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from minicomp.plan.cost import Machine, fmt_bytes, fmt_flops
from minicomp.plan.records import Plan
from minicomp.plan.table import callee, compress_ids, library_counts
from minicomp.report import kernels as kern
from minicomp.report.graph_svg import group_colour, render_graph
from minicomp.report.roofline import ceilings, fmt_rate, points, render_roofline


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


@dataclass
class PageInput:
    """What the page shows, gathered by `minicomp.report.render`."""
    compiled: object               # minicomp.api.Compiled
    machine: Machine
    source: str | None             # the file the program came from, as the user named it
    ran_on: str                    # where the kernels of this compile run ("cpu (Triton's interpreter)")
    group_us: dict[int, float] | None   # measured kernel time per group (µs), when timed
    total_us: float | None         # measured whole call (µs), when timed
    measured_note: str             # what the roofline says about measured points


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d1d1d; background: #f6f6f4; }
header { background: #22303c; color: #f4f4f4; padding: 14px 24px; }
header h1 { font-size: 20px; margin: 0 0 4px; font-weight: 600; }
header p { margin: 2px 0; color: #cdd6dd; }
main { padding: 8px 24px 40px; }
section { background: #fff; border: 1px solid #ddd; border-radius: 6px; margin: 14px 0; padding: 10px 16px 14px; }
h2 { font-size: 16px; margin: 4px 0 8px; }
h3 { font-size: 14px; margin: 12px 0 6px; }
.note { color: #555; margin: 4px 0; }
.row { display: flex; gap: 18px; align-items: flex-start; flex-wrap: wrap; }
.scroll { overflow: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0ee; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.why { max-width: 560px; min-width: 220px; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid; border-radius: 2px; vertical-align: -1px; margin-right: 4px; }
.legend li { list-style: none; white-space: nowrap; font-size: 13px; }
.legend { padding: 0; }
svg text { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; }
svg.graph text.l1 { font-size: 11px; font-weight: 600; }
svg.graph text.l2 { font-size: 10px; fill: #333; }
svg.roofline text { font-size: 11px; }
svg.roofline text.axis { font-size: 12px; font-family: system-ui, sans-serif; }
.kernel { border-top: 1px solid #e4e4e4; padding-top: 6px; }
.kernel .cols { display: grid; grid-template-columns: minmax(300px, 2fr) 3fr; gap: 12px; }
.kernel .cols > div { min-width: 0; }
.top { display: flex; gap: 14px; flex-wrap: wrap; align-items: stretch; }
.top > section { margin: 14px 0 0; }
#ledger { flex: 1 1 340px; }
#roofline { flex: 0 0 760px; box-sizing: border-box; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 16px; margin: 4px 0 8px; }
pre { margin: 0; padding: 8px; background: #f7f7f5; border: 1px solid #e2e2e2; border-radius: 4px; overflow: auto; font: 12px/1.35 "DejaVu Sans Mono", Menlo, Consolas, monospace; }
pre.user { background: #fffbea; white-space: pre-wrap; }
table.groups { font-size: 12.5px; }
table.groups td:nth-child(-n+3), table.refused td:nth-child(-n+2) { white-space: nowrap; }
.lineno { color: #999; }
.from { color: #77705a; }
.fallback { color: #a0341a; }
"""


def _swatch(gid: int | None) -> str:
    fill, stroke = group_colour(gid)
    return f'<span class="swatch" style="background:{fill};border-color:{stroke}"></span>'


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset(), cls: str = "") -> str:
    """An HTML table; `rows` cells are markup already (escaped by the caller)."""
    out = [f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="num">{c}</td>' if k in numeric else
                                    f'<td class="why">{c}</td>' if k == len(r) - 1 else f"<td>{c}</td>"
                                    for k, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def machine_words(machine: Machine) -> str:
    peaks = "; ".join(f"{fmt_rate(c.flops)} {c.label}" for c in ceilings(machine))
    return f"{machine.name} model: {machine.bytes_per_s / 1e9:.0f} GB/s; {peaks}"


def _kernel_of(compiled) -> dict[int, str]:
    gen = compiled.generated
    return {gid: name for name, gid in gen.kernel_groups.items()} | {
        gid: name for name, gids in gen.kernel_users.items() for gid in gids}


def _library_of(compiled) -> dict[int, str]:
    """Group id -> why it calls cuBLAS or SDPA (codegen/library.py, library_attention.py: a GEMM or
    an attention with nothing to fuse)."""
    return dict(getattr(compiled.generated, "library", {}) or {})


def ledger_section(p: PageInput) -> str:
    plan: Plan = p.compiled.plan
    n_kernels = len(p.compiled.generated.kernel_names)
    called = _library_of(p.compiled)
    n_library = len(called)
    through_torch = len(plan.groups) - n_kernels - n_library
    fewer = f"{plan.unfused_bytes / plan.total_bytes:.2f}x fewer" if plan.total_bytes else "-"
    rows = [["bytes, unfused (each op its own kernel, as eager)", esc(fmt_bytes(plan.unfused_bytes))],
            ["bytes, planned", esc(f"{fmt_bytes(plan.total_bytes)} ({plan.ratio:.2f} of unfused, {fewer})")],
            ["flops", esc(fmt_flops(plan.total_flops))],
            [f"lower bound on the {p.machine.name} model", esc(f"{plan.lower_bound_us:.3f} µs")],
            ["groups", esc(f"{len(plan.groups)}: {n_kernels} Triton kernel(s), "
                                 + (f"{library_counts(called)}, " if n_library else "")
                                 + f"{through_torch} through PyTorch")]]
    if p.total_us is not None:
        rows.append(["measured whole call", esc(f"{p.total_us:.1f} µs (median, triton.testing.do_bench)")])
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f'<section id="ledger"><h2>Ledger totals</h2><table class="ledger">{body}</table>'
            f'<p class="note">A model of the {esc(p.machine.name)}, not a measurement: '
            f'{esc(machine_words(p.machine))} ({esc(p.machine.source or "figures of the machine model")}). '
            f'The kernels of this compile run on {esc(p.ran_on)}.</p></section>')


def graph_section(p: PageInput) -> str:
    c = p.compiled
    kernel = _kernel_of(c)
    library = _library_of(c)
    items = []
    for g in c.plan.groups:
        runs = (esc(kernel[g.id]) if g.id in kernel else esc(callee(library[g.id])) if g.id in library
                else '<span class="fallback">PyTorch</span>')
        items.append(f"<li>{_swatch(g.id)}g{g.id} {esc(g.kind)} {esc(g.name)} → {runs}</li>")
    items.append(f"<li>{_swatch(None)}input, constant or weight (no kernel)</li>")
    return ('<section id="graph"><h2>Fused graph</h2>'
            '<p class="note">One box per node, coloured by the plan group that computes it; grey edges are '
            'tensors read from memory, coloured edges stay inside a kernel. A dashed border: recomputed in '
            'several groups; a thick one: a graph output. Hover a node for its origin.</p>'
            f'<ul class="legend">{"".join(items)}</ul>'
            f'<div class="scroll">{render_graph(c.graph, c.plan)}</div></section>')


def roofline_section(p: PageInput) -> str:
    plan = p.compiled.plan
    pts, skipped = points(plan, p.group_us)
    rows = []
    for pt in pts:
        measured = (f"{fmt_rate(pt.measured_flops)} ({100 * pt.measured_flops / pt.bound_flops:.0f}% of bound)"
                    if pt.measured_flops else "-")
        rows.append([f"{_swatch(pt.group)}{esc(pt.label)}", esc(f"{pt.intensity:.3g}"), esc(fmt_rate(pt.bound_flops)),
                     esc(measured)])
    extra = "".join(f'<p class="note">not plotted: {esc(s)}</p>' for s in skipped)
    return ('<section id="roofline"><h2>Roofline</h2>'
            f'<p class="note">Ceilings of the {esc(machine_words(p.machine))}. Each circle is a group at its '
            'ledger bound (its flops over its bytes, and over its lower bound time). '
            f'Measured points (diamonds): {esc(p.measured_note)}</p>'
            f'<div class="scroll">{render_roofline(plan, p.machine, p.group_us)}</div>{extra}'
            '<details><summary>the points as a table</summary>'
            + _table(["group", "flop/byte", "at bound", "measured"], rows, {1, 2}, "points")
            + "</details></section>")


def plan_section(p: PageInput) -> str:
    plan: Plan = p.compiled.plan
    kernel = _kernel_of(p.compiled)
    fallbacks, library = p.compiled.generated.fallbacks, _library_of(p.compiled)
    rows = []
    for g in plan.groups:
        nbytes = g.bytes_in + g.bytes_out
        why = esc(fallbacks.get(g.id) or "")
        runs = (esc(kernel[g.id]) if g.id in kernel else esc(library[g.id]) if g.id in library
                else f'<span class="fallback">PyTorch: {why}</span>')
        rows.append([f"{_swatch(g.id)}{g.id}", esc(g.kind), esc(g.name or "-"),
                     esc(f"{compress_ids(g.nodes)} ({len(g.nodes)})"), esc(fmt_bytes(g.bytes_in)),
                     esc(fmt_bytes(g.bytes_out)), esc(fmt_bytes(g.bytes_saved)), esc(fmt_flops(g.flops)),
                     esc(f"{g.flops / nbytes:.3g}" if nbytes else "-"), esc(f"{g.lower_bound_us:.3f} µs {g.bound}"), runs, esc(g.reason or "-")])
    out = [f'<section id="plan"><h2>Plan on the {esc(p.machine.name)} model</h2>',
           '<div class="scroll">',
           _table(["#", "kind", "name", "nodes", "in", "out", "saved", "flops", "flop/byte", "lower bound",
                   "runs as", "why these nodes share a kernel"], rows, {4, 5, 6, 7, 8, 9}, "groups"),
           "</div>"]
    refused = [[esc(r.a), esc(r.b), esc(fmt_bytes(r.bytes)) if r.bytes > 0 else "-", esc(r.reason)]
               for r in plan.rejected]
    out.append(f"<h3>Refused fusions ({len(refused)})</h3>")
    out.append(_table(["group", "with", "would save", "why not"], refused, {2}, "refused") if refused
               else '<p class="note">none: the planner refused no candidate.</p>')
    if plan.recomputed:
        rows = [[esc(f"%{d.node} {d.op}"), esc(f"g{d.group}"), esc("recomputed" if d.chosen else "materialised"),
                 esc(fmt_bytes(d.bytes_recompute)), esc(fmt_bytes(d.bytes_materialise)), esc(d.reason or "-")]
                for d in plan.recomputed]
        out.append(f"<h3>Recompute or materialise ({len(rows)})</h3>")
        out.append(_table(["value", "in", "chosen", "bytes if recomputed", "bytes if materialised", "why"],
                          rows, {3, 4}, "recompute"))
    out.append("</section>")
    return "".join(out)


def _user_pre(lines: list[kern.SourceLine]) -> str:
    """The user's lines, dedented together (relative indentation kept), each followed by the nodes it made."""
    texts = [s.text for s in lines if s.text and s.text.strip()]
    cut = min((len(t) - len(t.lstrip()) for t in texts), default=0)
    out, last = [], None
    for s in lines:
        if last is not None and s.file == last.file and s.line > last.line + 1:
            out.append('<span class="lineno">   …</span>')
        if last is None or s.file != last.file:
            out.append(f'<span class="from"># {esc(s.file)}</span>')
        text = esc(s.text[cut:]) if s.text is not None else '<span class="fallback">(source not available)</span>'
        out.append(f'<span class="lineno">{s.line:4d}</span>  {text}')
        out.append(f'<span class="from">      ↳ {esc(", ".join(s.nodes))}</span>')
        last = s
    return '<pre class="user">' + "\n".join(out) + "</pre>"


def kernels_section(p: PageInput) -> str:
    c = p.compiled
    sources = kern.kernel_sources(c.generated)
    kernel = _kernel_of(c)
    out = ['<section id="kernels"><h2>Kernels beside your code</h2>',
           '<p class="note">Left: the lines of your program that each group computes (from each node\'s '
           'origin), with the nodes they produced. Right: the Triton kernel written for the group.</p>']
    for g in c.plan.groups:
        name = kernel.get(g.id)
        called = _library_of(c).get(g.id)
        title = f"g{g.id} {g.kind} {g.name}".rstrip() + (f" → {name}" if name else f" → {callee(called)}" if called
                                                          else " → PyTorch")
        lines = kern.user_lines(c.graph, g)
        left = _user_pre(lines) if lines else '<p class="note">no node of this group names a source line.</p>'
        unplaced = kern.unplaced_nodes(c.graph, g)
        if unplaced and lines:
            left += f'<p class="note">without a source line: {esc(", ".join(unplaced))}</p>'
        first = c.generated.kernel_groups.get(name) if name else None
        if name and first is not None and first != g.id:
            # a kernel the same up to names as an earlier group's (codegen/dedup.py): shown there
            right = (f'<p class="note">the kernel of group g{first} (above), launched again with this '
                     "group's tensors: the two differ only in names.</p>")
        elif name and name in sources:
            right = f'<pre class="triton">{esc(sources[name])}</pre>'
        elif name:
            right = f'<p class="fallback">the source of {esc(name)} was not found in the module.</p>'
        elif called:
            right = f'<p class="note">no Triton kernel: calls {esc(called)}.</p>'
        else:
            why = esc(c.generated.fallbacks.get(g.id) or g.kind)
            right = f'<p class="fallback">no Triton kernel: runs through PyTorch ({why}).</p>'
        out.append(f'<article class="kernel" data-group="{g.id}"><h3>{_swatch(g.id)}{esc(title)}</h3>'
                   f'<div class="cols"><div>{left}</div><div>{right}</div></div></article>')
    out.append("</section>")
    return "".join(out)


def render_page(p: PageInput) -> str:
    c = p.compiled
    name = c.graph.name
    where = f"from {esc(p.source)}; " if p.source else ""
    head = (f"<header><h1>minicomp report: {esc(name)}</h1>"
            f"<p>{where}{len(c.graph.nx)} nodes in {len(c.plan.groups)} group(s); "
            f"planned for the {esc(p.machine.name)} model; kernels run on {esc(p.ran_on)}</p></header>")
    top = f'<div class="top">{ledger_section(p)}{roofline_section(p)}</div>'
    body = "".join([top, graph_section(p), plan_section(p), kernels_section(p)])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>minicomp report: {esc(name)}</title><style>{CSS}</style></head>"
            f"<body>{head}<main>{body}</main></body></html>\n")

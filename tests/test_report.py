"""The report page (minicomp/report/): its structure, escaping, the graph layout, the roofline,
the `minicomp report` command and `compiled.report()`, and (marked `browser`) the page as
headless Chromium renders it: a screenshot, SVGs of nonzero size, no console errors.
"""

from __future__ import annotations

import html
import os
import struct
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minicomp
from minicomp import report
from minicomp.api import compile_graph
from minicomp.cli import main
from minicomp.errors import MinicompError
from minicomp.explain import BenchResult
from minicomp.frontend.fx import capture
from minicomp.frontend.loader import load_model_file
from minicomp.ir.graph import Graph
from minicomp.plan import get_machine
from minicomp.report import roofline
from minicomp.report.graph_svg import graph_layout
from minicomp.report.layout import layered_layout

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "samples" / "llama_block.py"


class Tree(HTMLParser):
    """Elements as (tag, attrs, ancestors' (tag, attrs)) and each text run with its ancestors."""

    VOID = {"meta", "br", "img", "link", "input", "hr", "col", "source"}

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.elements: list[tuple[str, dict, list]] = []
        self.texts: list[tuple[str, list]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a, list(self.stack)))
        if tag not in self.VOID:
            self.stack.append((tag, a))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), list(self.stack)))

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1][0] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.texts.append((data, list(self.stack)))

    def find(self, tag: str, cls: str | None = None, inside: str | None = None) -> list[dict]:
        return [a for t, a, up in self.elements if t == tag and (cls is None or cls in a.get("class", "").split())
                and (inside is None or any(u[1].get("id") == inside for u in up))]

    def text(self, inside: str | None = None) -> str:
        return "".join(d for d, up in self.texts if inside is None or any(u[1].get("id") == inside for u in up))


@pytest.fixture(scope="module")
def llama():
    fn, inputs = load_model_file(str(LLAMA))
    compiled = compile_graph(capture(fn, inputs), list(inputs))
    return compiled, report.render(compiled, source="samples/llama_block.py")


def test_page_holds_every_section_graph_node_kernel_and_refusal(llama):
    compiled, page = llama
    tree = Tree(page)                          # parses, and every tag closes where it opened
    assert not tree.stack
    for section in ("ledger", "graph", "roofline", "plan", "kernels"):
        assert tree.find("section") and any(a.get("id") == section for a in tree.find("section"))
    assert len(tree.find("svg", "graph", inside="graph")) == 1
    assert len(tree.find("svg", "roofline", inside="roofline")) == 1
    nodes = tree.find("g", "node", inside="graph")
    assert sorted(int(a["data-node"]) for a in nodes) == sorted(compiled.graph.nx.nodes)
    graph_text = tree.text("graph")
    for label in ("attention.wq.weight", "feed_forward.w2.weight", "%0 x", "rsqrt", "attention"):
        assert label in graph_text                      # the user's names and the op names
    kernels_text = tree.text("kernels")
    assert compiled.generated.kernel_names
    for name in compiled.generated.kernel_names:
        assert f"def {name}(" in kernels_text           # each kernel's own source, under its name
    assert "self.attention_norm(x)" in kernels_text     # the user's line that g0 (rmsnorm) computes
    # each kernel's text once (a combo kernel holds three functions: codegen/combo.py)
    assert kernels_text.count("@triton.jit") == sum(k.source.count("@triton.jit") for k in compiled.generated.kernels)
    assert len(compiled.generated.kernels) == len(compiled.generated.kernel_names)
    refused = tree.text("plan")
    assert compiled.plan.rejected
    for r in compiled.plan.rejected:
        assert r.reason in refused
    assert len(tree.find("tr", inside="plan")) >= len(compiled.plan.groups) + len(compiled.plan.rejected)
    ledger = tree.text("ledger")
    assert "A model of the H200, not a measurement" in ledger and "lower bound" in ledger


def test_page_is_self_contained(llama):
    _, page = llama
    tree = Tree(page)
    assert not tree.find("script") and not tree.find("link") and not tree.find("img") and not tree.find("iframe")
    for tag, attrs, _ in tree.elements:
        for key, value in attrs.items():
            assert not (key in ("src", "href", "xlink:href") and value and not value.startswith("#")), (tag, key)
            assert "http:" not in (value or "") and "https:" not in (value or ""), (tag, key, value)
    assert "@import" not in page and "url(http" not in page


def test_user_strings_render_as_text(tmp_path):
    evil = "<script>alert(1)</script>"
    user_file = tmp_path / "m<b>.py"
    user_file.write_text("y = x * 2  # </pre><script>alert(2)</script>\n")
    g = Graph(f"<i>{evil}")
    x = g.add_input(evil, (4, 8), torch.float32, origin=f"{user_file}:1")
    w = g.constant(torch.arange(8.0), label='"><img src=z onerror=alert(3)>', origin=f"{user_file}:1")
    g.set_outputs([g.add("mul", x, w, origin=f"{user_file}:1")])
    compiled = compile_graph(g, [torch.randn(4, 8)])
    page = report.render(compiled, source=f"{tmp_path}/<s>.py")
    tree = Tree(page)
    tags = {t for t, _, _ in tree.elements}
    assert not tags & {"script", "img", "i", "b", "s"}
    text = tree.text()
    for raw in (evil, '"><img src=z onerror=alert(3)>', "</pre><script>alert(2)</script>", "m<b>.py", "<s>.py"):
        assert raw in text                                # shown to the reader as it was written
    assert html.escape(evil) in page


def test_report_of_a_function_compiled_with_the_api(tmp_path):
    def scale_shift(x, w):
        return torch.relu(x * w + 1.0)

    f = minicomp.compile(scale_shift)
    with pytest.raises(MinicompError, match="has not been called yet"):
        f.report(tmp_path / "early.html")
    f(torch.randn(5, 7), torch.randn(7))
    path = f.report(tmp_path / "r.html", bench=True)       # on the CPU: no timing, and the page says so
    tree = Tree(path.read_text(encoding="utf-8"))
    assert "test_report.py" in tree.text()                 # the header names the function's file
    assert "none on the CPU" in tree.text("roofline")
    assert "x * w + 1.0" in tree.text("kernels")
    assert len(tree.find("circle", "bound", inside="roofline")) == len(f.plan.groups)


def test_cli_report_writes_the_page_and_errors_are_user_errors(tmp_path, capsys):
    out = tmp_path / "rms.html"
    code = main(["report", str(ROOT / "samples" / "rmsnorm.mc"), "--dim", "B=2", "--dim", "S=13", "--dim", "C=96",
                 "-o", str(out), "--machine", "a100", "--bench"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"wrote {out}" in captured.out and "bench: skipped" in captured.out
    tree = Tree(out.read_text(encoding="utf-8"))
    assert "A100 model" in tree.text("roofline") and "rmsnorm.mc" in tree.text("kernels")
    assert main(["report", str(ROOT / "samples" / "rmsnorm.py"), "-o", str(tmp_path / "no" / "dir.html")]) == 1
    assert "cannot write the report" in capsys.readouterr().err
    # a bad --machine is bad usage: exit 2, as for `compile` (tests/test_cli.py)
    assert main(["report", str(ROOT / "samples" / "rmsnorm.py"), "-o", str(out), "--machine", "z80"]) == 2
    assert "unknown machine 'z80'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- layout


@st.composite
def dags(draw):
    n = draw(st.integers(1, 28))
    edges = [(a, b) for b in range(n) for a in range(b) if draw(st.integers(0, 99)) < 18]
    sizes = {i: (draw(st.integers(8, 160)), draw(st.integers(16, 40))) for i in range(n)}
    pinned = [i for i in range(n) if draw(st.booleans())]
    return list(range(n)), sizes, edges, pinned


def check_layout(nodes, sizes, edges, layout):
    assert set(layout.boxes) == set(nodes)
    boxes = list(layout.boxes.items())
    for k, (a, ba) in enumerate(boxes):
        assert (ba.w, ba.h) == tuple(map(float, sizes[a]))
        assert 0 <= ba.x and ba.x + ba.w <= layout.width and 0 <= ba.y and ba.y + ba.h <= layout.height
        for b, bb in boxes[k + 1:]:
            assert not ba.overlaps(bb), (a, b, ba, bb)
    assert set(layout.edges) == set(edges)
    for a, b in edges:
        assert layout.layer[a] < layout.layer[b]
        ys = [y for _, y in layout.edges[(a, b)]]
        assert all(y0 < y1 for y0, y1 in zip(ys, ys[1:])), (a, b, ys)   # every edge runs downward
        assert ys[0] == layout.boxes[a].y + layout.boxes[a].h and ys[-1] == layout.boxes[b].y


@settings(max_examples=60, deadline=None)
@given(dags())
def test_layout_never_overlaps_and_edges_point_down(dag):
    nodes, sizes, edges, pinned = dag
    check_layout(nodes, sizes, edges, layered_layout(nodes, sizes, edges, pinned_top=pinned))


def test_layout_of_llama_block(llama):
    compiled, _ = llama
    layout, lines = graph_layout(compiled.graph)
    sizes = {n: (b.w, b.h) for n, b in layout.boxes.items()}
    check_layout(compiled.graph.topo_order(), sizes, list(compiled.graph.nx.edges), layout)
    x = compiled.graph.inputs[0]
    assert layout.layer[x] == 0
    weight = next(n.id for n in compiled.graph.nodes() if n.attrs.get("label") == "feed_forward.w2.weight")
    consumer = next(iter(compiled.graph.nx.successors(weight)))
    assert layout.layer[weight] == layout.layer[consumer] - 1   # a weight sits just above what reads it


def test_ordering_removes_a_crossing():
    sizes = {n: (40, 20) for n in "abcd"}
    layout = layered_layout(list("abcd"), sizes, [("a", "d"), ("b", "c")], pinned_top="ab")
    assert layout.crossings == 0
    assert (layout.boxes["a"].cx < layout.boxes["b"].cx) == (layout.boxes["d"].cx < layout.boxes["c"].cx)


# ----------------------------------------------------------------------------- roofline


def test_roofline_has_a_point_per_group_on_its_roof(llama):
    compiled, page = llama
    plan, machine = compiled.plan, get_machine("h200")
    pts, skipped = roofline.points(plan)
    assert len(pts) == len(plan.groups) and not skipped
    for p in pts:                                 # at the ledger bound a point lies on the roof that bounds it
        g = plan.groups[p.group]
        memory_roof = p.intensity * machine.bytes_per_s
        if g.bound == "memory":
            assert p.bound_flops == pytest.approx(memory_roof, rel=1e-9)
        else:
            assert p.bound_flops < memory_roof
        assert p.bound_flops <= max(c.flops for c in roofline.ceilings(machine)) * (1 + 1e-9)
    tree = Tree(page)
    assert sorted(int(a["data-group"]) for a in tree.find("circle", "bound", inside="roofline")) == \
        [g.id for g in plan.groups]
    assert not tree.find("path", "measured", inside="roofline")
    assert len(tree.find("line", "compute", inside="roofline")) == len(roofline.ceilings(machine)) == 2
    assert len(tree.find("line", "memory", inside="roofline")) == 1
    assert "this compile runs on the CPU" in tree.text("roofline")


def test_roofline_draws_measured_points_given_timings(llama):
    compiled, _ = llama
    timed = BenchResult(total_us=50.0, group_us={0: 4.0, 9: 30.0})   # a GPU's timings, as explain.bench returns
    tree = Tree(report.render(compiled, bench=timed, bench_requested=True))
    assert sorted(int(a["data-group"]) for a in tree.find("path", "measured", inside="roofline")) == [0, 9]
    assert "50.0 µs" in tree.text("ledger")
    pts, _ = roofline.points(compiled.plan, timed.group_us)
    g9 = next(p for p in pts if p.group == 9)
    assert g9.measured_flops == pytest.approx(compiled.plan.groups[9].flops / 30e-6)


def test_a_group_without_flops_is_listed_not_dropped():
    f = minicomp.compile(lambda x: x.to(torch.float16))
    f(torch.randn(3, 5))
    pts, skipped = roofline.points(f.plan)
    assert not pts and len(skipped) == 1 and "no flops" in skipped[0]
    page = report.render(f._need())
    assert "not plotted: g0" in Tree(page).text("roofline")


# ----------------------------------------------------------------------------- in a real browser


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


CHECKS = """JSON.stringify({
  svgs: [...document.querySelectorAll('svg')].map(s => {
    const r = s.getBoundingClientRect();
    return {cls: s.getAttribute('class'), section: s.closest('section').id, w: r.width, h: r.height};
  }),
  nodes: [...document.querySelectorAll('svg.graph g.node')].map(g => {
    const rect = g.querySelector('rect').getBBox();
    const widest = Math.max(...[...g.querySelectorAll('text')].map(t => t.getBBox().width));
    return {id: g.dataset.node, w: rect.width, h: rect.height, text: widest};
  }),
  points: document.querySelectorAll('svg.roofline circle.point').length,
  scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
  height: document.documentElement.scrollHeight,
})"""


@pytest.mark.browser
def test_page_renders_in_headless_chromium(request, tmp_path):
    import json

    from browser import CHROMIUM, Chromium
    if not CHROMIUM.exists():
        if os.environ.get("MINICOMP_REQUIRE_BROWSER"):      # CI (.ci/run) installs it: there a skip would hide a gap
            pytest.fail(f"MINICOMP_REQUIRE_BROWSER is set but {CHROMIUM} is missing")
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    compiled, page = request.getfixturevalue("llama")       # compiled only when there is a browser
    path = tmp_path / "report-llama_block.html"
    path.write_text(page, encoding="utf-8")
    start = time.perf_counter()
    with Chromium() as browser:
        tab = browser.open(path, width=1400, height=2000)
        seen = json.loads(tab.evaluate(CHECKS))
        shot = tab.screenshot(height=min(seen["height"], 2900))
        errors, requests = tab.errors, tab.requests
    elapsed = time.perf_counter() - start
    assert errors == [], errors
    assert requests == [path.resolve().as_uri()]           # the page itself, nothing else
    assert {(s["cls"], s["section"]) for s in seen["svgs"]} == {("graph", "graph"), ("roofline", "roofline")}
    assert all(s["w"] > 100 and s["h"] > 100 for s in seen["svgs"]), seen["svgs"]
    assert sorted(int(n["id"]) for n in seen["nodes"]) == sorted(compiled.graph.nx.nodes)
    for n in seen["nodes"]:                                 # every label fits its box as the browser sets it
        assert n["w"] > 0 and n["h"] > 0 and n["text"] <= n["w"], n
    assert seen["points"] == len(compiled.plan.groups)
    assert seen["scrollWidth"] <= seen["clientWidth"]      # nothing sticks out sideways at 1400 px
    assert _png_size(shot) == (1400, min(seen["height"], 2900))
    (tmp_path / "report-llama_block.png").write_bytes(shot)
    keep = os.environ.get("MINICOMP_REPORT_SCREENSHOT")     # docs/report-llama_block.png is made this way
    if keep:
        Path(keep).write_bytes(shot)
    print(f"browser check and screenshot: {elapsed:.1f} s")

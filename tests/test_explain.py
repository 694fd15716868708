"""Explaining a compiled graph: the plan table (explain(), --dump-plan), fallback notes, the DOT
picture coloured by group (and SVG through Graphviz), bench lines against the bounds, and
autotuning progress. GPU timings themselves are not run here; their text and hooks are."""

from __future__ import annotations

import io
import os
import re
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp import explain
from minicomp.cli import main
from minicomp.runtime import progress

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "cache"))


def _norm_then_matmul(x, w, b):
    h = F.layer_norm(x, x.shape[-1:])
    return torch.relu(h @ w + b).sum(-1)


def _compiled():
    f = minicomp.compile(_norm_then_matmul)
    f(torch.randn(6, 16), torch.randn(16, 8), torch.randn(8))
    return f


# ----------------------------------------------------------------------------- the plan table

def test_explain_shows_each_group_with_nodes_kind_bytes_saved_and_bound():
    f = _compiled()
    text = f.explain()
    assert "graph _norm_then_matmul(" in text                      # the IR after the passes
    header = next(line for line in text.splitlines() if line.startswith("#  kind"))
    for column in ("kind", "nodes", "saved", "bound µs"):
        assert column in header
    for g in f.plan.groups:
        row = next(line for line in text.splitlines() if re.match(rf"{g.id}\s+{g.kind}\s", line))
        first = min(g.nodes)
        assert f"%{first}" in row and f"({len(g.nodes)})" in row, row
        assert f"{g.lower_bound_us:.3f}" in row
    assert {"reduction", "gemm"} <= set(f.plan.kinds())
    assert "lower bound" in text and "unfused" in text


def test_dump_plan_in_the_cli_matches_explain(capsys):
    assert main(["compile", str(SAMPLES / "layernorm.py"), "--dump-plan"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^0\s+reduction\s+\S+\s+%\d", out, re.MULTILINE), out
    assert "bound µs" in out and "saved" in out


def test_explain_before_the_first_call_is_a_user_error():
    with pytest.raises(minicomp.MinicompError, match="has not been called yet"):
        minicomp.compile(_norm_then_matmul).explain()


# ----------------------------------------------------------------------------- the picture

def _fills(dot: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'^\s+n(\d+) \[.*fillcolor="([^"]+)"', dot, re.M)}


def test_dot_colours_nodes_by_the_group_that_writes_them():
    f = _compiled()
    dot = explain.graph_dot(f.graph, f.plan)
    fills = _fills(dot)
    assert set(fills) == {n.id for n in f.graph.nodes()}
    colour_of_group = {}
    for n in f.graph.nodes():
        g = f.plan.group_of(n.id)
        if g is None:                                          # inputs and constants: grey
            assert fills[n.id] == "#eeeeee"
            continue
        colour_of_group.setdefault(g.id, fills[n.id])
        assert fills[n.id] == colour_of_group[g.id], f"%{n.id} in g{g.id}"
        assert f"group {g.id}" in re.search(rf'n{n.id} \[label="([^"]+)"', dot).group(1)
    assert len(set(colour_of_group.values())) == len(f.plan.groups)       # one colour per group
    for a, b in f.graph.nx.edges:
        assert f"n{a} -> n{b};" in dot
    legend = re.search(r'legend \[shape=note, label="([^"]+)"', dot).group(1)
    for g in f.plan.groups:
        assert f"g{g.id}: {g.kind}" in legend


def test_dump_graph_writes_dot_and_svg_when_dot_exists(tmp_path, monkeypatch, capsys):
    # a stand-in `dot` on PATH records its arguments and writes the SVG it was asked for
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "dot"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf "<svg/>" > "$4"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    out_dot = tmp_path / "g.dot"
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=5", "--dim", "N=7",
                 "--dump-graph", str(out_dot)]) == 0
    printed = capsys.readouterr().out
    assert out_dot.read_text().startswith('digraph "softmax_rows"')
    assert (tmp_path / "g.svg").read_text() == "<svg/>"
    assert (bindir / "args").read_text().split() == ["-Tsvg", str(out_dot), "-o", str(tmp_path / "g.svg")]
    assert f"wrote {out_dot}" in printed and f"wrote {tmp_path / 'g.svg'}" in printed


def test_dump_graph_without_graphviz_writes_only_dot(tmp_path, monkeypatch):
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)
    f = _compiled()
    written = explain.write_graph(tmp_path / "g.dot", f.graph, f.plan)
    assert written == [tmp_path / "g.dot"] and not (tmp_path / "g.svg").exists()


# ----------------------------------------------------------------------------- notes and bench text

def test_fallback_notes_name_opaque_nodes_and_fallen_back_groups():
    f = minicomp.compile(lambda a, b: (torch.kthvalue(a, 2, 0).values, a @ b))
    f(torch.randint(-3, 3, (4, 5)), torch.randint(-3, 3, (5, 2)))
    notes = explain.fallback_notes(f.plan, f.graph, f._need().generated.fallbacks)
    assert any("aten.kthvalue" in n for n in notes)
    assert any("gemm" in n and "runs through PyTorch" in n and "matmul of torch.int64" in n for n in notes)


def test_kernel_groups_map_kernel_names_to_plan_groups():
    f = _compiled()
    mapping = f._need().generated.kernel_groups
    assert set(mapping) == set(f._need().generated.kernel_names)
    tags = {"reduction": "red", "gemm": "gemm", "pointwise": "pw", "attention": "attn"}
    for name, gid in mapping.items():
        g = next(g for g in f.plan.groups if g.id == gid)
        assert name.startswith(f"mc_{tags[g.kind]}_") and gid not in f._need().generated.fallbacks


def test_bench_lines_put_times_against_the_bounds():
    f = _compiled()
    plan = f.plan
    measured = {g.id: max(g.lower_bound_us, 0.001) * 4 for g in plan.groups}      # each at 25% of its bound
    result = explain.BenchResult(total_us=plan.lower_bound_us * 2, group_us=measured)
    lines = explain.bench_lines(plan, result)
    assert "per call" in lines[0] and "50.0% of bound" in lines[0]
    assert len(lines) == 1 + len(plan.groups)
    for g, line in zip(plan.groups, lines[1:]):
        assert line.strip().startswith(f"g{g.id}") and g.kind in line and "of bound" in line
    assert len(plan.groups) >= 2
    lines = explain.bench_lines(plan, explain.BenchResult(total_us=10.0, group_us={plan.groups[0].id: 1.0}))
    assert "(no kernel)" not in lines[1] and all("(no kernel)" in line for line in lines[2:])
    assert explain.bench_lines(plan, explain.BenchResult(total_us=10.0)) == lines[:1]   # no profile: call only


def test_bench_on_cpu_is_skipped_with_a_reason(capsys):
    assert main(["compile", str(SAMPLES / "softmax.py"), "--bench", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "compiled kernels agree with eager" in out            # --bench checks first
    assert "bench: skipped, timings need a CUDA device" in out


@pytest.mark.gpu
def test_bench_on_cuda_prints_measured_times(capsys):
    assert main(["compile", str(SAMPLES / "layernorm.py"), "--check", "--bench", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"bench: [\d.]+ µs per call", out) and "% of bound" in out


# ----------------------------------------------------------------------------- autotuning progress

class _FakeTuner:
    """Stands in for triton's Autotuner: run() prunes, then benchmarks each config."""

    def __init__(self, n: int, clock: list[float], step: float):
        self.configs = list(range(n))
        self.clock, self.step = clock, step

    def prune_configs(self, kwargs):
        return self.configs

    def _bench(self, *args, config, **meta):
        self.clock[0] += self.step
        return [float(config)]

    def run(self, *args, **kwargs):
        return {c: self._bench(*args, config=c, **kwargs) for c in self.prune_configs(kwargs)}


def test_long_autotuning_shows_one_line_updated_in_place_on_a_terminal():
    clock = [0.0]
    out = io.StringIO()
    tuner = _FakeTuner(6, clock, step=0.4)
    assert progress.watch(tuner, progress.SweepProgress("mc_gemm_3 (group 3)", out, clock=lambda: clock[0], tty=True))
    timings = tuner.run(1, 2, BLOCK=16)
    assert timings == {c: [float(c)] for c in range(6)}                 # results untouched
    text = out.getvalue()
    # configs 3..6 finish after 1.2, 1.6, 2.0, 2.4 s: past the threshold; one line, rewritten
    assert text.count("\n") == 1 and text.endswith("config 6/6, 2.4 s\x1b[K\n")
    assert text.split("\r")[1:] == [f"minicomp: autotuning mc_gemm_3 (group 3): config {k}/6, {0.4 * k:.1f} s\x1b[K"
                                    for k in range(3, 6)] + ["minicomp: autotuning mc_gemm_3 (group 3): config 6/6, 2.4 s\x1b[K\n"]


def test_long_autotuning_writes_one_summary_line_to_a_log():
    clock = [0.0]
    out = io.StringIO()
    tuner = _FakeTuner(6, clock, step=0.4)
    progress.watch(tuner, progress.SweepProgress("mc_gemm_3 (group 3)", out, clock=lambda: clock[0], tty=False))
    tuner.run(1, 2, BLOCK=16)
    assert out.getvalue() == "minicomp: autotuned mc_gemm_3 (group 3): 6 configs in 2.4 s\n"


def test_quick_autotuning_prints_nothing():
    clock = [0.0]
    out = io.StringIO()
    tuner = _FakeTuner(8, clock, step=0.01)
    progress.watch(tuner, progress.SweepProgress("k", out, clock=lambda: clock[0]))
    tuner.run()
    assert out.getvalue() == ""


def test_watch_autotuning_finds_the_autotuned_kernels_of_a_module():
    import types

    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
    @triton.jit
    def mc_pw_add_0(x_ptr, n, BLOCK: tl.constexpr):
        pass

    module = types.ModuleType("fake_generated")
    module.mc_pw_add_0 = mc_pw_add_0
    module.not_a_kernel = 3
    assert progress.watch_autotuning(module, {"mc_pw_add_0": 0}) == ["mc_pw_add_0"]
    assert progress.watch(object(), progress.SweepProgress("x")) is False     # no hooks: left alone

"""The pass manager: names, fixed points, verification, watching (print, dump, time)."""

import io

import pytest
import torch

from minicomp.errors import MinicompError, VerifyError
from minicomp.ir.graph import Graph
from minicomp.passes.manager import CLEANUP_PIPELINE, DEFAULT_PIPELINE, PASSES, describe_passes, run_pipeline
from minicomp.passes.registry import Pass, register_pass
from pass_testing import assert_same_results, dump


def two_round_graph() -> Graph:
    """Needs a second round: simplify (ones * c -> c) makes `neg(c)` foldable."""
    g = Graph("rounds")
    x = g.add_input("x", (4, 4), torch.float32)
    c = g.constant(torch.arange(16.0).reshape(4, 4))
    ones = g.add("full", shape=(4, 4), value=1.0, dtype=torch.float32)
    y = g.add("neg", g.add("mul", ones, c))
    z1 = g.add("add", g.add("mul", x, g.constant(1.0)), y)
    z2 = g.add("add", x, y)                      # the same as z1 once x*1 is x
    g.add("exp", x)                              # dead
    g.set_outputs([g.add("div", z1, z2)])
    return g


def test_cleanup_passes_reach_a_fixed_point():
    g = two_round_graph()
    before = g.dump()
    out, records = run_pipeline(g, CLEANUP_PIPELINE)
    assert g.dump() == before, "the caller's graph was mutated"
    assert dump(out) == """graph rounds(%0: x) {
  %0 = input x : f32[4, 4]
  %1 = constant(<f32[4, 4] #%s>) : f32[4, 4]
  %2 = add(%0, %1) : f32[4, 4]
  %3 = div(%2, %2) : f32[4, 4]
  return %3
}""".replace("#%s", "#" + _digest(-torch.arange(16.0).reshape(4, 4)))
    assert_same_results(g, out)
    steps = [(r.name, r.round, r.changes) for r in records]
    assert steps == [
        ("constant_fold", 1, {}),
        ("simplify", 1, {"mul_one": 2}),
        ("cse", 1, {"merged": 1}),
        ("dce", 1, {"removed": 3}),
        ("constant_fold", 2, {"folded": 1}),
        ("simplify", 2, {}),
        ("cse", 2, {}),
        ("dce", 2, {"removed": 1}),
        ("constant_fold", 3, {}),
        ("simplify", 3, {}),
        ("cse", 3, {}),
        ("dce", 3, {}),
    ]
    assert [r.nodes_after for r in records][:4] == [11, 9, 8, 5]
    # running the pipeline again changes nothing
    _, again = run_pipeline(out, CLEANUP_PIPELINE)
    assert [r.changed for r in again] == [False] * 4


def test_default_pipeline():
    # complex products become real arithmetic first, so everything after sees real pairs
    assert DEFAULT_PIPELINE[0] == "complex" and DEFAULT_PIPELINE[1:5] == CLEANUP_PIPELINE
    if "attention" in PASSES:
        assert DEFAULT_PIPELINE[5:10] == ["attention"] + CLEANUP_PIPELINE
    if "pretranspose" in PASSES:
        assert DEFAULT_PIPELINE[-1] == "pretranspose"
    out, records = run_pipeline(two_round_graph())
    assert [r.name for r in records][1:13] == CLEANUP_PIPELINE * 3


def _digest(t):
    from minicomp.ir.printer import tensor_digest
    return tensor_digest(t)


def test_unknown_pass_lists_known_ones():
    g = two_round_graph()
    with pytest.raises(MinicompError) as e:
        run_pipeline(g, ["constant_fold", "cfold"])
    assert "unknown pass 'cfold'" in str(e.value)
    for name in DEFAULT_PIPELINE:
        assert name in str(e.value)
    with pytest.raises(MinicompError, match="did you mean 'simplify'"):
        run_pipeline(g, "simplfy")


def test_pipeline_as_text_and_empty_pipeline():
    g = two_round_graph()
    out, records = run_pipeline(g, " dce , cse")
    assert [r.name for r in records][:2] == ["dce", "cse"]
    same, none = run_pipeline(g, [])
    assert none == [] and same.dump() == g.dump() and same is not g


def test_verify_error_names_the_pass(monkeypatch):
    def broken(graph: Graph) -> Graph:
        g = graph.copy()
        n = g.node(g.outputs[0])
        n.shape = (1,)                       # lie about a type
        return g

    monkeypatch.setitem(PASSES, "broken", Pass("broken", broken, False, "breaks the graph"))
    with pytest.raises(VerifyError, match=r"after pass 'broken': .*recorded type f32\[1\]"):
        run_pipeline(two_round_graph(), ["dce", "broken", "dce"])


def test_a_bad_input_graph_is_reported_before_any_pass():
    g = two_round_graph()
    g.node(g.outputs[0]).dtype = torch.float16
    with pytest.raises(VerifyError, match="input graph"):
        run_pipeline(g)


def test_a_pass_that_reports_nothing_gets_a_diff_and_runs_once(monkeypatch):
    def tag(graph: Graph) -> Graph:
        g = graph.copy()
        out = g.node(g.outputs[0])
        out.layout = (4, 1)
        return g

    monkeypatch.setitem(PASSES, "tag", Pass("tag", tag, False, "sets a layout"))
    _, records = run_pipeline(two_round_graph(), ["dce", "tag", "simplify"])
    assert [(r.name, r.round, r.changes) for r in records] == [
        ("dce", 1, {"removed": 1}), ("dce", 2, {}),
        ("tag", None, {"modified": 1}),
        ("simplify", 1, {"mul_one": 2}), ("simplify", 2, {}),
    ]


def test_register_pass_refuses_a_second_pass_with_one_name():
    with pytest.raises(ValueError, match="already registered"):
        @register_pass("dce")
        def another_dce(graph):
            return graph
    assert PASSES["dce"].fn.__module__ == "minicomp.passes.dce"


def test_pass_table_entries_are_graph_to_graph():
    g = two_round_graph()
    out = PASSES["dce"](g)
    assert isinstance(out, Graph) and len(out) == len(g) - 1
    text = describe_passes()
    for name in CLEANUP_PIPELINE:
        assert name in text and PASSES[name].fixed_point and PASSES[name].doc
    assert all(name in text for name in PASSES)


def test_print_after_all_shows_each_pass_and_node_counts():
    buf = io.StringIO()
    run_pipeline(two_round_graph(), CLEANUP_PIPELINE, print_after_all=True, out=buf)
    text = buf.getvalue()
    headers = [line for line in text.splitlines() if line.startswith("=====")]
    assert headers[0] == "======== 000 input: 11 nodes ========"
    assert headers[1] == "======== 001 after constant_fold (round 1): 11 nodes, no change ========"
    assert headers[2] == "======== 002 after simplify (round 1): 9 nodes (was 11), mul_one 2 ========"
    assert headers[4] == "======== 004 after dce (round 1): 5 nodes (was 8), removed 3 ========"
    assert len(headers) == 13
    assert text.count("graph rounds(") == 1 + 5   # the input, and each pass that changed something


def test_dump_dir_writes_one_file_per_step(tmp_path):
    stale = tmp_path / "099_old.txt"
    stale.write_text("from an earlier run")
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    out, records = run_pipeline(two_round_graph(), CLEANUP_PIPELINE, dump_dir=tmp_path / "d")
    files = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert files[:3] == ["000_input.txt", "001_constant_fold.txt", "002_simplify.txt"]
    assert len(files) == len(records) + 1
    last = (tmp_path / "d" / files[-1]).read_text()
    assert last.startswith("# 012 after dce (round 3): 4 nodes, no change\n")
    assert out.dump() in last
    run_pipeline(two_round_graph(), ["dce"], dump_dir=tmp_path)
    assert not stale.exists() and keep.exists()
    assert sorted(p.name for p in tmp_path.glob("0*.txt")) == ["000_input.txt", "001_dce.txt", "002_dce.txt"]


def test_time_passes_prints_a_table():
    buf = io.StringIO()
    run_pipeline(two_round_graph(), CLEANUP_PIPELINE, time_passes=True, out=buf)
    lines = buf.getvalue().splitlines()
    assert lines[0].split() == ["pass", "runs", "ms", "%", "changes"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"constant_fold", "simplify", "cse", "dce", "(verify)", "total"}
    assert rows["dce"].split()[1] == "3" and rows["dce"].endswith("removed 4")
    assert rows["cse"].endswith("merged 1")

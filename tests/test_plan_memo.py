"""The layout pass's plan is reused for the graph it returns, and only while that graph is
unchanged: the reused plan equals planning afresh, and any change to the graph (or another
machine) plans again."""

from __future__ import annotations

from dataclasses import asdict

import torch

from minicomp.ir.graph import Graph
from minicomp.passes import plan_memo
from minicomp.passes.cost import get_machine
from minicomp.passes.fusion import plan_graph
from minicomp.passes.manager import run_pipeline

F32 = torch.float32


def mlp_with_norm() -> Graph:
    """rmsnorm -> matmul -> gelu, a few groups and a transposed weight."""
    g = Graph("memo")
    x = g.add_input("x", (5, 24), F32)
    w = g.constant(torch.randn(40, 24))
    ms = g.add("mean", g.add("mul", x, x), axes=(-1,), keepdim=True)
    h = g.add("mul", x, g.add("rsqrt", g.add("add", ms, g.constant(1e-5))))
    y = g.add("gelu", g.add("matmul", h, g.add("permute", w, dims=(1, 0))), approximate="none")
    g.set_outputs([y])
    return g


def fresh_plan(g: Graph, machine: str = "h200"):
    return plan_graph(g.copy(), machine)   # a copy has no plan left with it


def test_layout_output_reuses_its_plan_and_it_equals_a_fresh_one():
    out, _ = run_pipeline(mlp_with_norm())
    assert plan_memo.left_plan(out, get_machine("h200")) is not None
    assert asdict(plan_graph(out)) == asdict(fresh_plan(out))


def test_reused_plans_are_independent_copies():
    out, _ = run_pipeline(mlp_with_norm())
    first = plan_graph(out)
    first.groups[0].nodes.clear()
    first.groups[0].fallback = "edited"
    assert asdict(plan_graph(out)) == asdict(fresh_plan(out))


def test_a_graph_changed_after_layout_is_planned_again():
    out, _ = run_pipeline(mlp_with_norm())
    before = plan_graph(out)
    mean = next(n.id for n in out.nodes() if n.op == "mean")
    out.set_outputs(out.outputs + [mean])          # an intermediate becomes a graph output
    assert plan_memo.left_plan(out, get_machine("h200")) is None
    after = plan_graph(out)
    assert asdict(after) == asdict(fresh_plan(out))
    assert any(mean in grp.outputs for grp in after.groups)
    assert asdict(after) != asdict(before)


def test_an_attribute_change_after_layout_is_planned_again():
    out, _ = run_pipeline(mlp_with_norm())
    mean = next(n for n in out.nodes() if n.op == "mean")
    mean.attrs["keepdim"] = False                  # in place: only the fingerprint can tell
    assert plan_memo.left_plan(out, get_machine("h200")) is None


def test_another_machine_is_planned_for_that_machine():
    out, _ = run_pipeline(mlp_with_norm())
    assert plan_memo.left_plan(out, get_machine("a100")) is None
    assert asdict(plan_graph(out, "a100")) == asdict(fresh_plan(out, "a100"))
    assert plan_graph(out, "a100").machine == "A100"

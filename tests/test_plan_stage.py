"""The planner as a stage of its own: an immutable Plan, per-kind specs that codegen reads
instead of re-deriving, fallbacks kept on the generated module, and the explicit pipeline
passes -> plan (for the machine asked) -> layout(graph, plan) -> codegen."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from conftest import tol
from minicomp.api import Options, compile_graph
from minicomp.codegen import generate
from minicomp.errors import CompileError
from minicomp.frontend.fx import call_inputs, capture
from minicomp.frontend.loader import load_model_file
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.passes.manager import run_pipeline
from minicomp.plan import AttentionSpec, GemmSpec, Group, Plan, ReductionSpec, assign_layout, plan_graph
from minicomp.runtime import load

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
F32 = torch.float32


def sample(name: str):
    fn, inputs = load_model_file(SAMPLES / f"{name}.py")
    g = run_pipeline(capture(fn, inputs, name=name))[0]
    return g, plan_graph(g), fn, inputs


def norm_gemm() -> Graph:
    g = Graph("norm_gemm")
    x = g.add_input("x", (5, 24), F32)
    h = C.rms_norm(g, x, 1, None, 1e-6)
    w = g.constant(torch.randn(24, 40, generator=torch.Generator().manual_seed(0)))
    b = g.constant(torch.randn(40, generator=torch.Generator().manual_seed(1)))
    g.set_outputs([g.add("gelu", g.add("add", g.add("matmul", h, w), b), approximate="none")])
    return g


# --------------------------------------------------------------------------- immutable


def test_a_plan_cannot_be_changed_once_built():
    plan = plan_graph(norm_gemm())
    grp = plan.groups[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        grp.name = "edited"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.unfused_bytes = 0
    with pytest.raises(AttributeError):
        grp.nodes.append(99)         # a tuple: no mutation in place either
    with pytest.raises(TypeError):
        plan.groups[0] = grp
    assert isinstance(plan.groups, tuple) and isinstance(plan.rejected, tuple) and isinstance(plan.recomputed, tuple)
    edited = dataclasses.replace(plan, groups=[dataclasses.replace(grp, name="edited")] + list(plan.groups[1:]))
    assert edited.groups[0].name == "edited" and plan.groups[0].name != "edited"   # a new plan, the old one as it was


def test_hand_made_groups_hold_tuples():
    grp = Group(0, "pointwise", nodes=[1, 2], inputs=[0], outputs=[2])
    assert (grp.nodes, grp.inputs, grp.outputs) == ((1, 2), (0,), (2,))
    assert Plan("p", [grp]).groups == (grp,)


# --------------------------------------------------------------------------- specs


def test_specs_of_the_gpt_block_say_what_each_kernel_computes():
    g, plan, _, _ = sample("gpt_block")
    by_kind = {}
    for grp in plan.groups:
        by_kind.setdefault(grp.kind, []).append(grp)
    for grp in by_kind["reduction"]:        # layernorm: mean and centred variance over the last axis
        spec = grp.spec
        assert isinstance(spec, ReductionSpec)
        assert spec.axes == (len(spec.shape) - 1,) and spec.trailing and spec.n_cols == spec.shape[-1]
        assert [g.node(r).op for r in spec.reductions] == ["mean", "mean"]
        assert all(r in grp.nodes for r in spec.reductions)
    for grp in by_kind["gemm"]:
        spec = grp.spec
        assert isinstance(spec, GemmSpec) and spec.matmuls == (grp.anchor,)
        (a, b), = spec.operands
        assert g.node(grp.anchor).args == (a, b) and spec.shape == g.node(grp.anchor).shape
        ops = [g.node(n).op for n in spec.epilogue]
        assert {"bias": ["add"], "bias_gelu": ["add", "gelu"], "bias_residual": ["add", "add"]}[grp.name] == \
            [op for op in ops if op != "cast"], (grp.name, ops)
    [att] = by_kind["attention"]
    spec = att.spec
    assert isinstance(spec, AttentionSpec) and spec.node == att.anchor and spec.causal and spec.mask is None
    node = g.node(att.anchor)
    assert spec.scale == node.attrs["scale"] and spec.kv_groups == 1 and spec.batch == node.shape[:-2]
    assert (spec.q, spec.k, spec.v) == node.args[:3]


def test_llama_attention_spec_groups_kv_heads_and_swiglu_is_one_dual_gemm():
    g, plan, _, _ = sample("llama_block")
    [att] = [grp for grp in plan.groups if grp.kind == "attention"]
    q, k = g.node(att.spec.q), g.node(att.spec.k)
    assert att.spec.kv_groups == q.shape[-3] // k.shape[-3] == 2
    [dual] = [grp for grp in plan.groups if grp.name == "swiglu"]
    m1, m2 = dual.spec.matmuls
    assert dual.spec.matmuls[0] == dual.anchor and dual.spec.operands[0][0] == dual.spec.operands[1][0]
    assert [g.node(n).op for n in dual.spec.epilogue if g.node(n).op != "cast"][-1] == "mul"


def test_codegen_reads_the_spec_and_does_not_derive_one():
    g = norm_gemm()
    plan = plan_graph(g)
    bare = dataclasses.replace(plan, groups=[dataclasses.replace(grp, spec=None) for grp in plan.groups])
    with pytest.raises(CompileError, match="needs a ReductionSpec and has none.*with_specs"):
        generate(g, bare, "cpu")
    assert bare.with_specs(g) == plan      # what the planner gives, derived again for a hand-made plan


def test_a_hand_made_group_that_is_not_its_kind_is_refused_clearly():
    g = Graph("no_reduction")
    x = g.add_input("x", (4, 4), F32)
    g.set_outputs([g.add("exp", x)])
    hand = Plan(g.name, [Group(0, "reduction", nodes=[g.outputs[0]], inputs=[x], outputs=list(g.outputs))])
    with pytest.raises(CompileError, match="group 0 \\(reduction\\) holds no reduction or scan node"):
        hand.with_specs(g)


# --------------------------------------------------------------------------- fallbacks on the module


def test_fallbacks_live_on_the_generated_module_and_the_table_shows_them():
    g = assign_layout(norm_gemm(), plan := plan_graph(norm_gemm()))
    before = plan.table()
    gemm = next(grp.id for grp in plan.groups if grp.kind == "gemm")
    forced = generate(g, plan, "cpu", forced_fallbacks={gemm: "told to"})
    plain = generate(g, plan, "cpu")
    assert forced.fallbacks == {gemm: "told to"} and plain.fallbacks == {}
    assert plan.table() == before == plan.table(fallbacks=plain.fallbacks)   # the plan is as it was
    shown = plan.table(fallbacks=forced.fallbacks)
    assert f"g{gemm} runs through PyTorch: told to" in shown and "(fallback)" in shown
    assert "(fallback)" not in before
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(load(forced, "cpu")(x)[0], load(plain, "cpu")(x)[0], **tol(F32))


# --------------------------------------------------------------------------- the pipeline


@pytest.mark.parametrize("machine", ["h200", "a100"])
def test_compile_plans_for_the_machine_asked_and_lays_out_from_that_plan(machine):
    fn, inputs = load_model_file(SAMPLES / "gpt_block.py")
    graph = capture(fn, inputs, name="gpt_block")
    args = call_inputs(graph, inputs)                                  # the inputs, then the weights
    c = compile_graph(graph, args, Options(machine=machine))
    assert c.plan.machine == machine.upper()
    assert plan_graph(c.graph, machine).groups == c.plan.groups        # the planner ignores strides
    again = assign_layout(c.graph, c.plan)
    assert [n.layout for n in again.nodes()] == [n.layout for n in c.graph.nodes()]
    with torch.no_grad():
        want = fn(*inputs)
    torch.testing.assert_close(c.call(*args)[0], want, **tol(want.dtype))

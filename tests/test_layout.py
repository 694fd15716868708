"""Layout assignment (minicomp/plan/layout.py): strides for every tensor a kernel writes, from
the plan; permutes folded into strides, reduced axes innermost for row kernels. And the
`pretranspose` pass: misaligned transposed weights stored transposed."""

from pathlib import Path

import pytest
import torch

from minicomp.frontend.fx import capture
from minicomp.frontend.loader import load_model_file
from minicomp.ir import composites as C
from minicomp.errors import CompileError
from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.ir.interpret import run
from minicomp.passes.manager import run_pipeline
from minicomp.passes.registry import PASSES
from minicomp.plan import assign_layout, plan_graph
from minicomp.plan.layout import strides_for_order

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
F32 = torch.float32


def choose_layout(g: Graph) -> Graph:
    """What compile_graph does after the passes: weights pre-transposed, plan, strides from the plan."""
    g = run_pipeline(g, ["pretranspose"])[0]
    return assign_layout(g, plan_graph(g))


def test_strides_helpers():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert strides_for_order((6, 10), [1, 0]) == (1, 6)


def test_every_written_tensor_gets_strides_and_nothing_else():
    g = Graph("ln_gemm")
    x = g.add_input("x", (5, 12), F32)
    h = C.layer_norm(g, x, 1, None, None, 1e-5)
    y = g.add("matmul", h, g.add_input("w", (12, 7), F32))
    g.set_outputs([g.add("relu", y)])
    out = choose_layout(g)
    plan = plan_graph(out)
    written = {o for grp in plan.groups for o in grp.outputs}
    assert written == {h, out.outputs[0]}
    for n in out.nodes():
        assert (n.layout is not None) == (n.id in written), n
    assert out.node(h).layout == (12, 1) and "strides=[12, 1]" in out.dump()
    assert g.node(h).layout is None   # the caller's graph is untouched


def test_reduced_axis_is_innermost_for_row_kernels():
    # p = a @ b is written by a GEMM and only read by a row kernel reducing axis 0:
    # write it with axis 0 contiguous. The same value as a graph output stays contiguous.
    for as_output in (False, True):
        g = Graph("colsum")
        p = g.add("matmul", g.add_input("a", (6, 4), F32), g.add_input("b", (4, 10), F32))
        s = g.add("sum", p, axes=(0,), keepdim=True)
        g.set_outputs([s, p] if as_output else [s])
        out = choose_layout(g)
        assert out.node(p).layout == ((10, 1) if as_output else (1, 6))


def test_permuted_reader_makes_the_view_contiguous():
    # o: [B, H, S, D] read only as o.transpose(1, 2).reshape(B, S, H*D) by a GEMM:
    # write o in [B, S, H, D] order, so the reshape is a contiguous view.
    B, H, S, D = 2, 3, 5, 4
    g = Graph("heads")
    o = g.add("exp", g.add_input("o", (B, H, S, D), F32))
    flat = g.add("reshape", g.add("permute", o, dims=(0, 2, 1, 3)), shape=(B, S, H * D))
    g.set_outputs([g.add("matmul", flat, g.add_input("w", (H * D, 6), F32))])
    out = choose_layout(g)
    assert out.node(o).layout == (S * H * D, D, H * D, 1)


@pytest.mark.parametrize("name", ["gpt_block", "llama_block"])
def test_attention_output_written_in_the_order_the_projection_reads(name):
    fn, ins = load_model_file(SAMPLES / f"{name}.py")
    g = choose_layout(run_pipeline(capture(fn, ins, name=name), ["constant_fold", "simplify", "cse", "dce",
                                                                 "attention", "dce"])[0])
    [att] = [n for n in g.nodes() if n.op == "attention"]
    b, h, s, d = att.shape
    assert att.layout == (s * h * d, d, h * d, 1)
    for o in g.outputs:
        assert g.node(o).layout == contiguous_strides(g.node(o).shape)


def _weight_graph(k: int, n: int):
    g = Graph("linear")
    x = g.add_input("x", (3, k), F32)
    w = g.constant(torch.randn(n, k, generator=torch.Generator().manual_seed(0)), label="w")
    g.set_outputs([C.linear(g, x, w, None)])
    return g


def test_misaligned_transposed_weight_is_stored_transposed():
    # W [8, 13] f32: its rows are 52 B (not 16-byte aligned); W^T rows are 32 B.
    g = _weight_graph(13, 8)
    out = choose_layout(g)
    mm = out.node(out.outputs[0])
    wt = out.node(mm.args[1])
    assert wt.op == "constant" and wt.shape == (13, 8) and wt.attrs["label"] == "w.T"
    assert not [n for n in out.nodes() if n.op == "permute"]
    x = [torch.randn(3, 13)]
    torch.testing.assert_close(run(out, x)[0], run(g, x)[0])


def test_aligned_weight_is_left_alone():
    out = choose_layout(_weight_graph(16, 8))
    assert [n.op for n in out.nodes() if n.op in ("permute", "constant")] == ["constant", "permute"]


def test_pretranspose_pass_is_registered_and_idempotent():
    g = run_pipeline(_weight_graph(13, 8), ["pretranspose"])[0]
    assert PASSES["pretranspose"].run(g)[1] == {}


def test_layout_keeps_the_plan_valid_and_refuses_another_graphs_plan():
    # the planner never reads strides: planning the laid-out graph gives the plan it was laid out by
    g = run_pipeline(_weight_graph(13, 8), ["pretranspose"])[0]
    plan = plan_graph(g)
    out = assign_layout(g, plan)
    assert plan_graph(out) == plan
    assert all(n.layout is None for n in g.nodes() if n.op not in ("input", "constant"))   # g untouched
    other = Graph("other")
    other.set_outputs([other.add("exp", other.add_input("x", (2, 2), F32))])
    with pytest.raises(CompileError, match="lays out only the graph it was made for"):
        assign_layout(other, plan)

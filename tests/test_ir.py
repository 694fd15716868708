"""IR core: building, inference through PyTorch's rules, dumps, verify() and the interpreter."""

import pytest
import torch

from conftest import tol
from minicomp.errors import VerifyError
from minicomp.ir import Graph, composites as C, run, to_dot, verify
from minicomp.ir.graph import Node


def small_graph():
    g = Graph("f")
    x = g.add_input("x", (3, 5), torch.float32)
    y = g.add_input("y", (5,), torch.float32)
    s = g.add("add", x, y, origin="f.py:3")
    e = g.add("exp", s, origin="f.py:4")
    g.set_outputs([e])
    return g, (x, y, s, e)


def test_inference_follows_pytorch_promotion_and_broadcasting():
    g = Graph()
    a = g.add_input("a", (4, 1, 3), torch.bfloat16)
    b = g.add_input("b", (2, 1), torch.float32)
    half = g.constant(0.5)                      # a scalar: does not promote bf16
    i = g.add_input("i", (3,), torch.int64)
    assert g.node(g.add("mul", a, half)).dtype == torch.bfloat16
    assert g.node(g.add("add", a, b)).shape == (4, 2, 3)
    assert g.node(g.add("add", a, b)).dtype == torch.float32
    assert g.node(g.add("div", i, i)).dtype == torch.float32   # true division
    assert g.node(g.add("lt", i, g.constant(2))).dtype == torch.bool
    with pytest.raises(ValueError, match="broadcast"):
        g.add("add", a, g.add_input("c", (5,), torch.float32))


def test_dump_is_stable_and_shows_types_and_origins():
    g, _ = small_graph()
    text = g.dump()
    assert text == g.copy().dump() == g.renumbered().dump()
    assert "%2 = add(%0, %1) : f32[3, 5]   # f.py:3" in text
    assert text.splitlines()[-2] == "  return %3"


def test_dot_export_names_every_node_and_edge():
    g, (x, y, s, e) = small_graph()
    dot = to_dot(g, groups={s: 0, e: 0})
    assert dot.startswith('digraph "f"')
    for a, b in [(x, s), (y, s), (s, e)]:
        assert f"n{a} -> n{b};" in dot
    assert "group 0" in dot


def test_interpreter_matches_eager_on_composites():
    g = Graph("ln")
    x = g.add_input("x", (7, 33), torch.bfloat16)
    w = g.add_input("w", (33,), torch.bfloat16)
    b = g.add_input("b", (33,), torch.bfloat16)
    ln = C.layer_norm(g, x, 1, w, b, 1e-5)
    sm = C.softmax(g, x, -1)
    lsm = C.log_softmax(g, x, 0)
    g.set_outputs([ln, sm, lsm])
    verify(g)
    xs = [torch.randn(7, 33).bfloat16(), torch.randn(33).bfloat16(), torch.randn(33).bfloat16()]
    got = run(g, xs)
    want = [torch.nn.functional.layer_norm(xs[0], (33,), xs[1], xs[2], 1e-5),
            torch.softmax(xs[0], -1), torch.log_softmax(xs[0], 0)]
    for a, b_ in zip(got, want):
        torch.testing.assert_close(a, b_, **tol(torch.bfloat16))


# ---------------------------------------------------------------------------- verify() rejects


def test_verify_accepts_a_good_graph():
    g, _ = small_graph()
    verify(g)


def test_verify_rejects_a_cycle():
    g, (x, y, s, e) = small_graph()
    g.nx.add_edge(e, s, positions=[5])
    with pytest.raises(VerifyError, match="cycle"):
        verify(g)


def test_verify_rejects_edges_that_disagree_with_args():
    g, (x, y, s, e) = small_graph()
    g.nx.remove_edge(y, s)
    with pytest.raises(VerifyError, match=r"node %2 \(add\).*f.py:3.*edges"):
        verify(g)


def test_verify_rejects_a_missing_operand():
    g, (x, y, s, e) = small_graph()
    g.node(e).args = (99,)
    with pytest.raises(VerifyError, match=r"node %3 \(exp\).*%99"):
        verify(g)


def test_verify_rejects_a_wrong_shape():
    g, (x, y, s, e) = small_graph()
    g.node(s).shape = (3, 4)
    with pytest.raises(VerifyError, match=r"node %2 \(add\) with operands \(%0: f32\[3, 5\], %1: f32\[5\]\) "
                                          r"from f.py:3: recorded type f32\[3, 4\]"):
        verify(g)


def test_verify_rejects_a_wrong_dtype():
    g, (x, y, s, e) = small_graph()
    g.node(e).dtype = torch.float16
    with pytest.raises(VerifyError, match=r"%3 \(exp\).*recorded type f16"):
        verify(g)


def test_verify_rejects_an_unknown_op_and_missing_attrs():
    g, (x, y, s, e) = small_graph()
    g.node(e).op = "frobnicate"
    with pytest.raises(VerifyError, match=r"%3.*unknown op 'frobnicate'"):
        verify(g)
    g, (x, y, s, e) = small_graph()
    r = g.add("sum", e, axes=(1,), keepdim=False)
    del g.node(r).attrs["keepdim"]
    g.set_outputs([r])
    with pytest.raises(VerifyError, match=rf"%{r} \(sum\).*missing attribute.*keepdim"):
        verify(g)


def test_verify_rejects_wrong_arity_and_operands_that_do_not_fit():
    g, (x, y, s, e) = small_graph()
    g.set_args(e, [s, s])
    with pytest.raises(VerifyError, match=r"%3 \(exp\).*takes 1 operand"):
        verify(g)
    g, (x, y, s, e) = small_graph()
    m = g.add_input("m", (2, 2), torch.float32)
    g.set_args(s, [x, m])
    with pytest.raises(VerifyError, match=r"%2 \(add\).*do not fit"):
        verify(g)


def test_verify_rejects_bad_outputs_and_stray_inputs():
    g, (x, y, s, e) = small_graph()
    g.set_outputs([])
    with pytest.raises(VerifyError, match="no outputs"):
        verify(g)
    g.set_outputs([42])
    with pytest.raises(VerifyError, match="output %42 does not exist"):
        verify(g)
    g, (x, y, s, e) = small_graph()
    g.inputs.remove(y)
    with pytest.raises(VerifyError, match="not a graph input"):
        verify(g)


def test_rewrites_keep_edges_in_step():
    g, (x, y, s, e) = small_graph()
    m = g.add("mul", x, x)
    g.replace_all_uses(s, m)
    g.remove(s)
    verify(g)
    assert g.nx.edges[x, m]["positions"] == [0, 1]
    with pytest.raises(ValueError, match="still has users"):
        g.remove(m)


def test_the_shape_inference_memo_is_bounded():
    """A long-lived process meets many shapes: the memo drops its oldest entries past its size."""
    from minicomp.ir import graph as graph_mod
    memo = graph_mod.InferenceMemo(size=8)
    g = graph_mod.Graph("g")
    for n in range(1, 30):
        x = g.add_input(f"x{n}", (n, 3), torch.float32)
        assert graph_mod.infer("exp", [g.node(x)], {}, memo) == ((n, 3), torch.float32)
    assert len(memo.entries) == 8
    assert all(key[1][0][0][0] >= 22 for key in memo.entries)   # the newest shapes stayed

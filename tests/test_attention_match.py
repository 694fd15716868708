"""The `attention` pass: every spelling of attention becomes one node with the same values,
and nothing changes when an intermediate is used elsewhere."""

import math
from pathlib import Path

import pytest
import torch
from conftest import tol

from minicomp.frontend.fx import call_inputs, capture
from minicomp.frontend.loader import load_model_file
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import run
from minicomp.ir.verify import verify
from minicomp.passes.attention_match import match_attention
from minicomp.passes.manager import run_pipeline
from minicomp.passes.registry import PASSES

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
F32 = torch.float32
B, H, S, D = 2, 4, 9, 16


def inputs_for(g: Graph, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for nid in g.inputs:
        n = g.node(nid)
        t = torch.randn(n.shape, generator=gen)
        out.append(t > 0 if n.dtype == torch.bool else t.to(n.dtype))
    return out


def attention_nodes(g: Graph):
    return [g.node(n) for n in g.topo_order() if g.node(n).op == "attention"]


def matched(g: Graph):
    """Run the pass after cleanup; check the values did not change; return the new graph."""
    before = run_pipeline(g, ["constant_fold", "simplify", "cse", "dce"])[0]
    after = run_pipeline(before, ["attention", "dce"])[0]
    verify(after)
    ins = inputs_for(g)
    for a, b in zip(run(g, ins), run(after, ins)):
        torch.testing.assert_close(b, a, **tol(a.dtype))
    return after


def scores(g, q, k, how="mul"):
    s = g.add("matmul", q, C.transpose(g, k, -2, -1))
    if how == "mul":
        return g.add("mul", s, g.constant(1 / math.sqrt(D)))
    if how == "div":
        return g.add("div", s, g.add("sqrt", g.constant(float(D))))   # folds to a constant
    return s


def qkv(g, dtype=F32, hkv=H, sq=S, sk=S):
    q = g.add_input("q", (B, H, sq, D), dtype)
    return q, g.add_input("k", (B, hkv, sk, D), dtype), g.add_input("v", (B, hkv, sk, D), dtype)


@pytest.mark.parametrize("how", ["mul", "div"])
@pytest.mark.parametrize("mask", ["where_keep", "masked_fill", "triu_drop", "additive", "none"])
def test_spellings_become_one_node(how, mask):
    g = Graph("att")
    q, k, v = qkv(g)
    s = scores(g, q, k, how)
    ninf = g.constant(float("-inf"))
    full = g.add("full", shape=(S, S), value=True, dtype=torch.bool)
    if mask == "where_keep":
        s = g.add("where", C.causal_mask(g, S, S), s, ninf)
    elif mask == "masked_fill":   # scores.masked_fill(mask == 0, -inf)
        s = g.add("where", g.add("eq", C.causal_mask(g, S, S), g.constant(False)), ninf, s)
    elif mask == "triu_drop":
        s = g.add("where", g.add("triu", full, diagonal=1), ninf, s)
    elif mask == "additive":      # a registered -inf/0 buffer
        s = g.add("add", s, g.constant(torch.full((S, S), float("-inf")).triu(1)))
    g.set_outputs([g.add("matmul", C.softmax(g, s), v)])
    after = matched(g)
    [att] = attention_nodes(after)
    assert att.attrs["is_causal"] == (mask != "none") and len(att.args) == 3
    assert att.attrs["scale"] == pytest.approx(1 / math.sqrt(D))
    assert not [n for n in after.nodes() if n.op in ("amax", "exp", "matmul", "where", "tril", "full")]


def test_upcast_softmax_bf16_and_scale_on_q():
    # q * scale @ k^T, scores.float(), softmax, .to(bf16), @ v
    g = Graph("att_bf16")
    q, k, v = qkv(g, torch.bfloat16)
    s = g.add("matmul", g.add("mul", q, g.constant(0.25)), C.transpose(g, k, -2, -1))
    s = g.add("where", C.causal_mask(g, S, S), g.add("cast", s, dtype=F32), g.constant(float("-inf")))
    p = g.add("cast", C.softmax(g, s), dtype=torch.bfloat16)
    g.set_outputs([g.add("matmul", p, v)])
    after = matched(g)
    [att] = attention_nodes(after)
    assert att.args[0] == q and att.attrs["scale"] == 0.25 and att.attrs["is_causal"]
    assert after.node(after.outputs[0]).dtype == torch.bfloat16


def test_grouped_kv_heads_through_expand_and_reshape():
    g = Graph("gqa")
    q, k, v = qkv(g, hkv=2)

    def repeat_interleave(t):   # [B, 2, S, D] -> [B, 4, S, D], each head twice in a row
        t = g.add("reshape", t, shape=(B, 2, 1, S, D))
        return g.add("reshape", g.add("expand", t, shape=(B, 2, 2, S, D)), shape=(B, H, S, D))
    s = g.add("where", C.causal_mask(g, S, S), scores(g, q, repeat_interleave(k)), g.constant(float("-inf")))
    g.set_outputs([g.add("matmul", C.softmax(g, s), repeat_interleave(v))])
    [att] = attention_nodes(matched(g))
    assert att.args[1:] == (k, v) and att.attrs["enable_gqa"] and att.attrs["is_causal"]


def test_repeat_not_interleaved_is_not_grouped():
    g = Graph("repeat")   # heads repeated as [h0, h1, h0, h1]: not SDPA's grouping
    q, k, v = qkv(g, hkv=2)

    def repeat(t):
        t = g.add("reshape", t, shape=(B, 1, 2, S, D))
        return g.add("reshape", g.add("expand", t, shape=(B, 2, 2, S, D)), shape=(B, H, S, D))
    g.set_outputs([g.add("matmul", C.softmax(g, scores(g, q, repeat(k))), repeat(v))])
    [att] = attention_nodes(matched(g))
    assert not att.attrs["enable_gqa"]


def test_general_masks_are_passed_along():
    g = Graph("masks")
    q, k, v = qkv(g)
    q2, q3 = g.add_input("q2", (B, H, S, D), F32), g.add_input("q3", (B, H, S, D), F32)
    keep = g.add_input("keep", (1, 1, S, S), torch.bool)
    bias = g.add_input("bias", (B, 1, S, S), F32)
    s1 = g.add("where", keep, scores(g, q, k), g.constant(float("-inf")))
    s2 = g.add("add", scores(g, q2, k, "none"), bias)
    band = g.add("where", g.add("triu", g.add("full", shape=(S, S), value=True, dtype=torch.bool), diagonal=0),
                 scores(g, q3, k), g.constant(float("-inf")))                  # keeps the upper triangle
    g.set_outputs([g.add("matmul", C.softmax(g, s), v) for s in (s1, s2, band)])
    after = matched(g)
    atts = attention_nodes(after)
    assert len(atts) == 3 and not any(a.attrs["is_causal"] for a in atts)
    assert sorted(after.node(a.args[3]).op for a in atts) == ["input", "input", "triu"]


def test_shared_scores_leave_the_graph_alone():
    g = Graph("shared")   # one q @ k^T feeding two softmaxes: neither pattern owns it
    q, k, v = qkv(g)
    raw = scores(g, q, k, "none")
    g.set_outputs([g.add("matmul", C.softmax(g, raw), v),
                   g.add("matmul", C.softmax(g, g.add("mul", raw, g.constant(0.5))), v)])
    assert not attention_nodes(matched(g))


def test_probabilities_used_elsewhere_leave_the_graph_alone():
    g = Graph("probs")
    q, k, v = qkv(g)
    p = C.softmax(g, scores(g, q, k))
    g.set_outputs([g.add("matmul", p, v), p])
    after = matched(g)
    assert not attention_nodes(after) and len(after) == len(run_pipeline(g, ["dce"])[0])


def test_finite_fill_on_a_general_mask_becomes_the_nodes_fill():
    # masked scores take the fill itself (a fully masked row averages its keys, as eager);
    # tests/test_attention_masks.py runs such rows through the kernel
    g = Graph("finite")
    q, k, v = qkv(g)
    keep = g.add_input("keep", (S, S), torch.bool)
    s = g.add("where", keep, scores(g, q, k), g.constant(-1e30))
    g.set_outputs([g.add("matmul", C.softmax(g, s), v)])
    [att] = attention_nodes(matched(g))
    assert att.attrs["mask_fill"] == float(torch.tensor(-1e30)) and att.attrs["empty_rows"] == "nan"


def test_pass_is_registered_idempotent_and_leaves_the_input_graph():
    assert "attention" in PASSES
    g = Graph("att")
    q, k, v = qkv(g)
    g.set_outputs([g.add("matmul", C.softmax(g, scores(g, q, k)), v)])
    before = g.dump()
    once = match_attention(g)
    assert g.dump() == before and len(attention_nodes(once)) == 1
    assert match_attention(once).dump() == once.dump()
    assert PASSES["attention"].run(once)[1] == {}


@pytest.mark.parametrize("name, gqa", [("attention", False), ("gpt_block", False), ("llama_block", True)])
def test_samples(name, gqa):
    fn, ins = load_model_file(SAMPLES / f"{name}.py")
    g = capture(fn, ins, name=name)
    after = run_pipeline(g, ["constant_fold", "simplify", "cse", "dce", "attention", "dce"])[0]
    [att] = attention_nodes(after)
    assert att.attrs["is_causal"] and att.attrs["enable_gqa"] == gqa
    ins = call_inputs(g, ins)
    for a, b in zip(run(g, ins), run(after, ins)):
        torch.testing.assert_close(b, a, **tol(a.dtype))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_written_with_einsum_is_one_node(causal):
    """torch.einsum's lowering moves unit axes around its bmm (reshape, permute, reshape):
    simplify makes those reshapes, and the pattern is found through them."""
    import minicomp

    def attn(q, k, v):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool), 1), float("-inf"))
        return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=gen) for _ in range(3))
    f = minicomp.compile(attn)
    torch.testing.assert_close(f(q, k, v), attn(q, k, v), **tol(F32))
    c = f.compile_for(q, k, v)
    assert c.plan.kinds() == ["attention"], str(c.plan)
    (node,) = attention_nodes(c.graph)
    assert node.attrs.get("is_causal", False) == causal

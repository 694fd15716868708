"""Flash-attention kernels (codegen/attention.py) against F.scaled_dot_product_attention.

CPU tests run under Triton's interpreter at small sizes (fp32 mostly; half types are
widened for the interpreter's dot); `gpu` tests check bf16/fp16 at S=4096 on CUDA.
Each graph is compiled as one hand-made attention group.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

from minicomp.codegen import generate
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.plan import Group, Plan
from minicomp.runtime import load
from minicomp.target import Target

ATOL32 = dict(atol=2e-4, rtol=2e-4)   # fp32 online softmax vs PyTorch's: a few ulps of exp and sums


@pytest.fixture(autouse=True)
def our_attention_kernels(monkeypatch):
    """These tests test minicomp's attention kernels: no attention group calls SDPA instead
    (codegen/library_attention.py), through the api (the environment) or `one_group` (the Target)."""
    monkeypatch.setenv("MINICOMP_LIBRARY_ATTENTION", "0")


def one_group(g: Graph, device_type: str | Target = "cpu"):
    """Generate `g` as a single attention group holding every computed node, as OUR kernel (on
    CUDA targets too: `library_attention` off)."""
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    reads = sorted({a for nid in nodes for a in g.node(nid).args if g.node(a).kind in ("input", "constant")})
    anchor = next(n for n in nodes if g.node(n).op == "attention")
    plan = Plan(g.name, [Group(0, "attention", nodes=nodes, inputs=reads, outputs=list(g.outputs), anchor=anchor)])
    plan = plan.with_specs(g)
    target = Target.for_device(device_type) if isinstance(device_type, str) else device_type
    return generate(g, plan, replace(target, library_attention=False)), plan.groups[0]


def run_attention(g: Graph, inputs, device: str = "cpu"):
    gen, group = one_group(g, "cuda" if str(device).startswith("cuda") else "cpu")
    assert not gen.fallbacks, gen.fallbacks
    assert any(name.startswith("mc_attn") for name in gen.kernel_names)
    return load(gen, device)(*inputs), gen


def randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def attention_graph(b, hq, hkv, sq, sk, d, dv=None, dtype=torch.float32, causal=False, mask=None,
                    scale=None, bshd=False):
    """q [b, hq, sq, d] (or [b, sq, hq, d] seen through a transpose), k/v [b, hkv, sk, d|dv]."""
    dv = dv or d
    g = Graph("attn")
    if bshd:
        q = C.transpose(g, g.add_input("q", (b, sq, hq, d), dtype), 1, 2)
        k = C.transpose(g, g.add_input("k", (b, sk, hkv, d), dtype), 1, 2)
        v = C.transpose(g, g.add_input("v", (b, sk, hkv, dv), dtype), 1, 2)
    else:
        q = g.add_input("q", (b, hq, sq, d), dtype)
        k = g.add_input("k", (b, hkv, sk, d), dtype)
        v = g.add_input("v", (b, hkv, sk, dv), dtype)
    m = None
    if mask is not None:
        m = g.add_input("mask", mask[0], mask[1])
    g.set_outputs([C.attention(g, q, k, v, m, scale=scale, is_causal=causal, enable_gqa=hq != hkv)])
    return g


def inputs_for(g: Graph, dtype_device="cpu"):
    out = []
    for i, nid in enumerate(g.inputs):
        n = g.node(nid)
        if n.dtype == torch.bool:
            gen = torch.Generator().manual_seed(7)
            t = torch.rand(n.shape, generator=gen) > 0.3
        else:
            t = randn(*n.shape, dtype=n.dtype, seed=i)
        out.append(t.to(dtype_device))
    return out


def sdpa(q, k, v, mask=None, causal=False, scale=None, bshd=False, gqa=False):
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=gqa)


# --------------------------------------------------------------------------- CPU (interpreter)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s", [77, 16])
def test_causal_and_not(causal, s):
    g = attention_graph(2, 3, 3, s, s, 32, causal=causal)
    q, k, v = inputs_for(g)
    (out,), gen = run_attention(g, [q, k, v])
    torch.testing.assert_close(out, sdpa(q, k, v, causal=causal), **ATOL32)
    if causal:
        assert "rm >= rn" in gen.source and "tl.num_programs(0) - 1" in gen.source
    assert "tl.exp2(" in gen.source


@pytest.mark.parametrize("sq,sk", [(20, 45), (45, 20), (1, 33)])
def test_query_and_key_lengths_differ(sq, sk):
    for causal in (False, True):
        g = attention_graph(1, 2, 2, sq, sk, 32, causal=causal)
        q, k, v = inputs_for(g)
        (out,), _ = run_attention(g, [q, k, v])
        torch.testing.assert_close(out, sdpa(q, k, v, causal=causal), **ATOL32)


def test_boolean_mask_with_fully_masked_rows():
    g = attention_graph(2, 2, 2, 37, 29, 16, mask=((37, 29), torch.bool))
    q, k, v, m = inputs_for(g)
    m[3] = False                                  # a row with no visible key: PyTorch gives 0
    (out,), _ = run_attention(g, [q, k, v, m])
    torch.testing.assert_close(out, sdpa(q, k, v, m), **ATOL32)
    assert out[:, :, 3].abs().max() == 0


def test_additive_mask_broadcast_over_heads():
    g = attention_graph(2, 3, 3, 33, 40, 16, mask=((2, 1, 33, 40), torch.float32))
    q, k, v, m = inputs_for(g)
    m[0, 0, :, 5:9] = float("-inf")
    (out,), _ = run_attention(g, [q, k, v, m])
    torch.testing.assert_close(out, sdpa(q, k, v, m), **ATOL32)


def test_mask_computed_in_the_group():
    """where(keep, 0, -inf) and a tril mask built from `full` are computed inside the kernel."""
    g = Graph("attn_tril")
    q = g.add_input("q", (1, 2, 29, 16), torch.float32)
    k = g.add_input("k", (1, 2, 29, 16), torch.float32)
    v = g.add_input("v", (1, 2, 29, 16), torch.float32)
    keep = C.causal_mask(g, 29, 29)
    bias = g.add("where", keep, g.constant(0.0), g.constant(float("-inf")))
    g.set_outputs([C.attention(g, q, k, v, bias)])
    qv, kv, vv = inputs_for(g)
    (out,), gen = run_attention(g, [qv, kv, vv])
    torch.testing.assert_close(out, sdpa(qv, kv, vv, causal=True), **ATOL32)
    kernel = gen.source.split("def _check")[0]
    assert "tril" in kernel and kernel.count("tl.load(") == 5   # q, then k and v in each loop: no mask load


@pytest.mark.parametrize("d", [64, 128])
def test_head_dims_64_128(d):
    g = attention_graph(1, 2, 2, 33, 33, d, causal=True)
    q, k, v = inputs_for(g)
    (out,), gen = run_attention(g, [q, k, v])
    torch.testing.assert_close(out, sdpa(q, k, v, causal=True), **ATOL32)
    assert f"tl.arange(0, {d})" in gen.source and f"kd < {d}" not in gen.source   # no padding mask


def test_padded_head_dims():
    g = attention_graph(1, 2, 2, 21, 21, 40, dv=24)
    q, k, v = inputs_for(g)
    (out,), gen = run_attention(g, [q, k, v])
    torch.testing.assert_close(out, sdpa(q, k, v), **ATOL32)
    assert "tl.arange(0, 64)" in gen.source and "kd < 40" in gen.source


def test_grouped_kv_heads():
    g = attention_graph(2, 6, 2, 25, 25, 16, causal=True)
    q, k, v = inputs_for(g)
    (out,), gen = run_attention(g, [q, k, v])
    torch.testing.assert_close(out, sdpa(q, k, v, causal=True, gqa=True), **ATOL32)
    assert "// 3" in gen.source                  # query head h reads KV head h // 3


def test_permuted_qkv_read_through_strides():
    g = attention_graph(2, 3, 3, 19, 19, 16, causal=True, bshd=True)
    q, k, v = inputs_for(g)
    (out,), gen = run_attention(g, [q, k, v])
    torch.testing.assert_close(out, sdpa(q, k, v, causal=True, bshd=True), **ATOL32)
    assert "_as_layout" in gen.source and "permute" not in gen.source.split("def call")[0]


def test_user_scale_and_epilogue():
    g = Graph("attn_epi")
    q = g.add_input("q", (1, 2, 17, 16), torch.float32)
    k = g.add_input("k", (1, 2, 17, 16), torch.float32)
    v = g.add_input("v", (1, 2, 17, 16), torch.float32)
    o = C.attention(g, q, k, v, scale=0.3)
    g.set_outputs([g.add("cast", g.add("mul", o, g.constant(2.0)), dtype=torch.float16)])
    qv, kv, vv = inputs_for(g)
    (out,), gen = run_attention(g, [qv, kv, vv])
    ref = (2.0 * sdpa(qv, kv, vv, scale=0.3)).half()
    torch.testing.assert_close(out, ref, **tol(torch.float16))
    assert gen.source.count("tl.store(") == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_on_the_interpreter(dtype):
    g = attention_graph(1, 2, 2, 23, 23, 16, dtype=dtype, causal=True)
    q, k, v = inputs_for(g)
    (out,), _ = run_attention(g, [q, k, v])
    ref = sdpa(q.float(), k.float(), v.float(), causal=True).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))


def test_cuda_source_autotunes(monkeypatch):
    monkeypatch.setenv("MINICOMP_HOPPER_ATTENTION", "0")   # the block-language kernel, on any GPU
    gen, _ = one_group(attention_graph(1, 8, 8, 4096, 4096, 128, dtype=torch.bfloat16, causal=True), "cuda")
    assert "@triton.autotune(" in gen.source and 'key=["SQ", "SK"]' in gen.source
    assert "p.to(tl.bfloat16)" in gen.source


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_s4096(dtype, causal):
    g = attention_graph(1, 8, 8, 4096, 4096, 128, dtype=dtype, causal=causal)
    q, k, v = inputs_for(g, "cuda")
    (out,), _ = run_attention(g, [q, k, v], device="cuda")
    torch.testing.assert_close(out, sdpa(q, k, v, causal=causal), **tol(dtype))


@pytest.mark.gpu
def test_gpu_gqa_d64_bshd_odd_length():
    dtype = torch.bfloat16
    g = attention_graph(2, 8, 2, 1000, 1000, 64, dtype=dtype, causal=True, bshd=True)
    q, k, v = inputs_for(g, "cuda")
    (out,), _ = run_attention(g, [q, k, v], device="cuda")
    torch.testing.assert_close(out, sdpa(q, k, v, causal=True, bshd=True, gqa=True), **tol(dtype))


@pytest.mark.gpu
def test_gpu_masks():
    dtype = torch.float16
    g = attention_graph(2, 4, 4, 777, 777, 128, dtype=dtype, mask=((2, 1, 777, 777), dtype))
    q, k, v, m = inputs_for(g, "cuda")
    (out,), _ = run_attention(g, [q, k, v, m], device="cuda")
    torch.testing.assert_close(out, sdpa(q, k, v, m), **tol(dtype))
    g = attention_graph(1, 4, 4, 513, 513, 128, dtype=dtype, mask=((513, 513), torch.bool))
    q, k, v, m = inputs_for(g, "cuda")
    (out,), _ = run_attention(g, [q, k, v, m], device="cuda")
    torch.testing.assert_close(out, sdpa(q, k, v, m), **tol(dtype))


@pytest.mark.gpu
def test_gpu_fp32():
    g = attention_graph(1, 4, 4, 300, 300, 64, causal=True)
    q, k, v = inputs_for(g, "cuda")
    (out,), _ = run_attention(g, [q, k, v], device="cuda")
    torch.testing.assert_close(out, sdpa(q, k, v, causal=True), atol=1e-3, rtol=1e-3)

"""Decode attention (codegen/attention_decode.py): few queries against a long KV cache, split over
KV chunks and combined. Every case is compared with eager PyTorch (assert_close, the dtype's
tolerance) and asserts that the decode kernel, not the prefill one, computed it, with no group
falling back. Shapes are small for Triton's interpreter; key lengths are odd so the last chunk's
last block is ragged, and long enough for three chunks (the interpreter's count), so the
combine merges partials.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from conftest import tol
from minicomp.api import plan_only
from minicomp.codegen.module import generate
from minicomp.frontend.dsl import load_dsl
from minicomp.target import Target


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' repeat_kv, written out: each KV head repeated n times in a row."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def check(fn, inputs, dtype, decode: bool = True):
    f = minicomp.compile(fn)
    got = f(*inputs)
    gen = f._need().generated
    assert gen.fallbacks == {}, gen.fallbacks
    assert ("mc_attn_decode" in gen.source) == decode, gen.kernel_names
    torch.testing.assert_close(got, fn(*inputs), **tol(dtype))
    return f


def qkv(b, h, kvh, sq, sk, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=gen).to(dtype)
    k = torch.randn(b, kvh, sk, d, generator=gen).to(dtype)
    v = torch.randn(b, kvh, sk, d, generator=gen).to(dtype)
    return q, k, v


CASES = [
    # (B, H, KVH, Sq, Sk, D, dtype, how the KV heads are shared)
    (2, 8, 2, 1, 333, 32, torch.float32, "enable_gqa"),
    (1, 8, 2, 4, 1000, 32, torch.float16, "repeat_kv"),
    (2, 4, 4, 16, 333, 32, torch.bfloat16, "mha"),
    (1, 4, 1, 1, 200, 80, torch.float32, "mqa_broadcast"),     # head dim 80: padded to 128 with masks
    (1, 8, 2, 16, 201, 64, torch.bfloat16, "enable_gqa"),
]


@pytest.mark.parametrize("b,h,kvh,sq,sk,d,dtype,how", CASES,
                         ids=[f"{c[7]}-sq{c[3]}-sk{c[4]}-d{c[5]}-{str(c[6])[6:]}" for c in CASES])
def test_decode_matches_eager(b, h, kvh, sq, sk, d, dtype, how):
    q, k, v = qkv(b, h, kvh, sq, sk, d, dtype)

    def fn(q, k, v):
        if how == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        if how == "repeat_kv":
            return F.scaled_dot_product_attention(q, repeat_kv(k, h // kvh), repeat_kv(v, h // kvh))
        if how == "mqa_broadcast":
            # Falcon's multi-query form: one KV head broadcast over every query head
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            return torch.softmax(s, dim=-1) @ v
        return F.scaled_dot_product_attention(q, k, v)
    check(fn, (q, k, v), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_transformers_padding_mask_with_repeat_kv(dtype):
    """transformers' decode step: an additive mask [B, 1, Sq, Sk] of 0 and finfo.min (left padding
    differs per batch row), repeat_kv by hand, q read through a transpose of [B, Sq, H, D]."""
    b, h, kvh, sq, sk, d = 2, 4, 2, 1, 333, 32
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(b, sq, h * d, generator=gen).to(dtype)
    k = torch.randn(b, kvh, sk, d, generator=gen).to(dtype)
    v = torch.randn(b, kvh, sk, d, generator=gen).to(dtype)
    keep = torch.ones(b, 1, sq, sk, dtype=torch.bool)
    keep[0, :, :, :50] = False            # batch row 0: 50 padding positions on the left
    keep[1, :, :, :177] = False           # crosses a chunk boundary
    mask = torch.zeros(b, 1, sq, sk, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)

    def fn(x, k, v, mask):
        q = x.view(b, sq, h, d).transpose(1, 2)
        return F.scaled_dot_product_attention(q, repeat_kv(k, h // kvh), repeat_kv(v, h // kvh), attn_mask=mask)
    check(fn, (x, k, v, mask), dtype)


def test_boolean_mask_per_head_with_an_empty_row_and_an_epilogue():
    """A boolean mask [B, H, Sq, Sk] (different per query head of a group), one row of which keeps
    no key (SDPA gives 0 there: the empty_rows rule across chunks); the output is scaled and a
    residual added in the combine kernel (a fused epilogue)."""
    b, h, kvh, sq, sk, d = 1, 4, 2, 4, 301, 32
    q, k, v = qkv(b, h, kvh, sq, sk, d, torch.float32, seed=2)
    gen = torch.Generator().manual_seed(3)
    keep = torch.rand(b, h, sq, sk, generator=gen) > 0.3
    keep[0, 1, 2] = False                 # head 1, query 2: no visible key
    keep[0, 3, 0, :290] = False           # head 3, query 0: only the last chunk's keys
    res = torch.randn(b, h, sq, d, generator=gen)

    def fn(q, k, v, keep, res):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True) * 0.5 + res
    f = check(fn, (q, k, v, keep, res), torch.float32)
    assert len(f.plan.groups) == 1          # the epilogue is in the attention group


@pytest.mark.parametrize("sq", [1, 4])
def test_causal_is_top_left_as_eager(sq):
    """is_causal with Sq < Sk is PyTorch's top-left alignment: query i sees keys 0..i only, so
    every chunk but the first is empty for every row."""
    q, k, v = qkv(2, 4, 2, sq, 260, 32, torch.float32, seed=4)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
          (q, k, v), torch.float32)


def test_prefill_shapes_keep_the_prefill_kernel():
    """More than 16 queries, or a short cache, is the prefill kernel's."""
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    check(sdpa, qkv(1, 4, 2, 17, 300, 16, torch.float32), torch.float32, decode=False)
    check(sdpa, qkv(1, 4, 2, 1, 100, 16, torch.float32), torch.float32, decode=False)


def test_growing_cache_compiles_once_over_a_symbolic_key_length():
    """A decode step over a cache that grows: the second length makes Sk a symbol, and that one
    decode kernel (chunk bounds computed from SK at run time) serves every later length,
    including one shorter than the first two (chunks of it lie past the end: empty)."""
    h, kvh, d = 4, 2, 32

    def step(q, k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k, h // kvh), repeat_kv(v, h // kvh))
    f = minicomp.compile(step)
    gen = torch.Generator().manual_seed(5)
    for length in (300, 333, 150, 517):
        q = torch.randn(1, h, 1, d, generator=gen)
        k, v = (torch.randn(1, kvh, length, d, generator=gen) for _ in range(2))
        torch.testing.assert_close(f(q, k, v), step(q, k, v), **tol(torch.float32))
    assert f.compiles == 2, f.dynamic.refused
    assert f.graph.symbolic and "mc_attn_decode" in f.source
    assert f._need().generated.fallbacks == {}


def test_growing_cache_with_a_padding_mask_over_the_symbolic_length():
    """transformers' decode mask [B, 1, 1, T] (0 or finfo.min, left padding) over a symbolic T:
    the mask is loaded through its symbolic strides, masked past the end in the ragged block."""
    h, d = 2, 16

    def step(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    f = minicomp.compile(step)
    gen = torch.Generator().manual_seed(7)
    for length in (300, 333, 517):
        q = torch.randn(2, h, 1, d, generator=gen)
        k, v = (torch.randn(2, h, length, d, generator=gen) for _ in range(2))
        mask = torch.zeros(2, 1, 1, length)
        mask[1, ..., :length // 3] = torch.finfo(torch.float32).min
        torch.testing.assert_close(f(q, k, v, mask), step(q, k, v, mask), **tol(torch.float32))
    assert f.compiles == 2 and f.graph.symbolic, f.dynamic.refused
    assert "mc_attn_decode" in f.source and f._need().generated.fallbacks == {}


def test_value_head_dim_differs_from_the_query_head_dim():
    """Dv != D (an MLA-like shape): the accumulator and the output tile are Dv wide."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(1, 4, 4, 32, generator=gen)
    k = torch.randn(1, 2, 257, 32, generator=gen)
    v = torch.randn(1, 2, 257, 48, generator=gen)     # padded to 64 with masks
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), (q, k, v), torch.float32)


DECODE = """
func decode(q: bf16[8, 32, 1, 128], k: bf16[8, 8, T, 128], v: bf16[8, 8, T, 128]) -> bf16[8, 32, 1, 128] {
  return attention(q, k, v, enable_gqa=true)
}
"""


@pytest.mark.parametrize("sizes", [{"T": 4096}, None], ids=["static", "symbolic"])
def test_cuda_source_of_the_benchmark_shape(sizes):
    """The benchmark's shape (batch 8, 32 heads over 8 KV heads, 1 query, head dim 128, bf16),
    written for sm_90: the decode kernel, autotuned over BLOCK_N (keyed on the length, or its
    bucket over a symbol), 64 x NCH programs filling about two per SM."""
    graph = load_dsl(DECODE, "decode.mc", dims=sizes) if sizes else load_dsl(DECODE, "decode.mc", symbolic=True)
    graph, plan = plan_only(graph)
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    assert gen.fallbacks == {} and gen.kernel_names == ["mc_attn_decode_gqa_attention_0"]
    assert f"_launch(mc_attn_decode_gqa_attention_0, ({33 if sizes is None else 16}, 64), q, k, v," in gen.source
    assert "_launch(mc_attn_decode_gqa_attention_0_combine, (64,), " in gen.source
    # 4096 keys: 16 chunks of 256 (MIN_CHUNK); over a symbol: 8 waves of 2 x 132 programs, 33 per KV program
    assert ("33 KV chunk(s)" if sizes is None else "16 KV chunk(s)") in gen.source
    assert ("key=[\"sk_bucket\"]" in gen.source) == (sizes is None)


def _hand_written(name):
    import test_attention_masks as tam
    if name == "where":
        return lambda q, k, v, keep: tam.where_minus_inf(q, repeat_kv(k, 2), repeat_kv(v, 2), keep)
    return {"eager": tam.eager_attention, "gemma2": tam.gemma2_eager(3.0, 0.125)}[name]


@pytest.mark.parametrize("name,dtype", [("eager", torch.bfloat16), ("gemma2", torch.float32), ("where", torch.float32)])
def test_hand_written_attention_at_decode(name, dtype):
    """transformers' eager attention at a decode step (the matcher's forms): Llama's with an
    additive padding mask in bf16 (softmax in fp32, rounded to bf16 before P @ V); Gemma2's
    soft-capped scores; a hand-written boolean mask whose empty row is NaN, as softmax gives."""
    b, h, kvh, sq, sk, d = 2, 4, 2, 1, 333, 32
    q, k, v = qkv(b, h, kvh, sq, sk, d, dtype, seed=6)
    if name == "gemma2":
        q = q * 4.0                            # scores large enough to saturate the tanh
    keep = torch.ones(b, 1, sq, sk, dtype=torch.bool)
    keep[0, ..., :120] = False
    if name == "where":
        keep[1] = False                        # batch row 1: no visible key, NaN as softmax
        mask = keep
    else:
        mask = torch.zeros(b, 1, sq, sk, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    fn = _hand_written(name)
    f = minicomp.compile(fn)
    got = f(q, k, v, mask)
    gen = f._need().generated
    assert gen.fallbacks == {} and "mc_attn_decode" in gen.source, gen.kernel_names
    want = fn(q, k, v, mask)
    if name == "where":
        assert want[1].isnan().all() and got[1].isnan().all()
    torch.testing.assert_close(got, want, equal_nan=True, **tol(dtype))

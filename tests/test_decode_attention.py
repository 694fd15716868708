"""Decode attention (codegen/attention_decode.py): few queries against a long KV cache, split over
KV chunks and combined. Every case is compared with eager PyTorch (assert_close, the dtype's
tolerance) and asserts that the decode kernel, not the prefill one, computed it, with no group
falling back. Shapes are small for Triton's interpreter; key lengths are odd so the last chunk's
last block is ragged, and long enough for three chunks (the interpreter's count), so the
combine merges partials.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import minicomp
from conftest import tol
from test_codegen_attention import our_attention_kernels  # noqa: F401  (autouse: our kernels, not SDPA)
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


@pytest.mark.parametrize("sizes", [{"T": 4096}, {"T": 32768}, None], ids=["static", "static-long", "symbolic"])
def test_cuda_source_of_the_benchmark_shape(sizes):
    """The benchmark's shape (batch 8, 32 heads over 8 KV heads, 1 query, head dim 128, bf16),
    written for sm_90: the decode kernel, autotuned over BLOCK_N (keyed on the length, or its
    bucket over a symbol), in one wave of 4 x 64 programs (two per SM), each over a quarter of
    the cache, then the combine."""
    graph = load_dsl(DECODE, "decode.mc", dims=sizes) if sizes else load_dsl(DECODE, "decode.mc", symbolic=True)
    graph, plan = plan_only(graph)
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    assert gen.fallbacks == {} and gen.kernel_names == ["mc_attn_decode_gqa_attention_0"]
    assert "_launch(mc_attn_decode_gqa_attention_0, (4, 64), q, k, v," in gen.source
    assert "_launch(mc_attn_decode_gqa_attention_0_combine, (64,), " in gen.source
    assert "4 KV chunk(s)" in gen.source
    if sizes:
        assert f"    chunk = {sizes['T'] // 4}\n" in gen.source
    assert ("key=[\"sk_bucket\"]" in gen.source) == (sizes is None)


@pytest.mark.parametrize("batch,sk", [(32, 4096), (8, 300)], ids=["batch32", "short-cache"])
def test_cuda_source_is_one_launch_when_one_chunk_covers_the_keys(batch, sk):
    """Where the batch x KV heads fill the wave alone (32 x 8 = 256 programs), or the cache is
    shorter than two chunks, each program covers its KV head's whole cache and stores the
    result: one launch, no scratch, no combine."""
    text = DECODE.replace("8, 32, 1, 128", f"{batch}, 32, 1, 128").replace("8, 8, T, 128", f"{batch}, 8, T, 128")
    graph, plan = plan_only(load_dsl(text, "decode.mc", dims={"T": sk}))
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    assert gen.fallbacks == {} and gen.kernel_names == ["mc_attn_decode_gqa_attention_0"]
    assert f"_launch(mc_attn_decode_gqa_attention_0, (1, {batch * 8}), q, k, v, buf" in gen.source
    assert "_combine" not in gen.source and "scratch" not in gen.source and "1 KV chunk(s)" in gen.source


def _kernel_text(source: str) -> str:
    """The module's kernels and launches, with buffer names (node ids) made equal."""
    start, end = source.index("@triton."), source.index("\nif __name__")
    body = "\n".join(line for line in source[start:end].splitlines() if "takes 3 input(s)" not in line)
    return re.sub(r"buf\d+|%\d+", "buf", body)


@pytest.mark.parametrize("kv", [4096, 32768])
def test_repeat_kv_and_enable_gqa_write_one_module_at_the_benchmark_shape(kv):
    """The benchmark's two forms of one decode step (transformers' repeat_kv + SDPA, and
    SDPA(enable_gqa=True)) compute the same thing, and minicomp writes the same kernels, grid
    and launches for both (the matcher turns repeat_kv into enable_gqa): any difference in
    their times is not in the generated code. Written for sm_90 from a CPU capture."""
    q = torch.empty(8, 32, 1, 128, dtype=torch.bfloat16)
    k, v = (torch.empty(8, 8, kv, 128, dtype=torch.bfloat16) for _ in range(2))
    scale = 1 / math.sqrt(128)
    forms = [lambda q, k, v: F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), scale=scale),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)]
    texts = []
    for fn in forms:
        c = minicomp.compile(fn).compile_for(q, k, v)
        assert c.plan.kinds() == ["attention"]
        gen = generate(c.graph, c.plan, Target.for_device("cpu", verify_target="off").for_check(90))
        assert gen.fallbacks == {} and gen.kernel_names == ["mc_attn_decode_gqa_attention_0"]
        texts.append(_kernel_text(gen.source))
    assert texts[0] == texts[1]
    assert "_launch(mc_attn_decode_gqa_attention_0, (4, 64), q, k, v," in texts[0]


# one chunk under the interpreter: more than CPU_PROGRAMS / 2 = 12 batch x KV heads
ONE_CHUNK = [
    # (B, H, KVH, Sq, Sk, D, dtype)
    (4, 8, 4, 1, 333, 32, torch.float32),
    (2, 16, 8, 4, 201, 64, torch.bfloat16),
    (8, 4, 2, 16, 150, 16, torch.float16),
]


@pytest.mark.parametrize("b,h,kvh,sq,sk,d,dtype", ONE_CHUNK, ids=[f"b{c[0]}-kvh{c[2]}-sq{c[3]}-{str(c[6])[6:]}"
                                                                  for c in ONE_CHUNK])
def test_one_chunk_is_one_launch_matching_eager(b, h, kvh, sq, sk, d, dtype):
    """Enough batch x KV heads to fill the wave: pass 1 finishes the softmax and stores (one
    launch, no combine), through a transposed query, with both KV forms."""
    q, k, v = qkv(b, h, kvh, sq, sk, d, dtype, seed=9)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)        # [B, Sq, H, D] storage, read through strides
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
               lambda q, k, v: F.scaled_dot_product_attention(q, repeat_kv(k, h // kvh), repeat_kv(v, h // kvh))):
        f = check(fn, (qt, k, v), dtype)
        src = f._need().generated.source
        assert "_combine" not in src and "1 KV chunk(s)" in src


def test_one_chunk_with_a_mask_an_empty_row_causal_and_an_epilogue():
    """The one-launch form's tail is the combine's: a boolean mask per head with a row that keeps
    no key (0, as SDPA), and a fused epilogue (scale, residual); is_causal top-left."""
    b, h, kvh, sq, sk, d = 4, 4, 4, 4, 260, 32
    q, k, v = qkv(b, h, kvh, sq, sk, d, torch.float32, seed=10)
    gen = torch.Generator().manual_seed(11)
    keep = torch.rand(b, h, sq, sk, generator=gen) > 0.3
    keep[1, 2, 3] = False
    res = torch.randn(b, h, sq, d, generator=gen)

    def masked(q, k, v, keep, res):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep) * 0.5 + res
    f = check(masked, (q, k, v, keep, res), torch.float32)
    assert len(f.plan.groups) == 1 and "_combine" not in f.source
    out = f(q, k, v, keep, res)
    torch.testing.assert_close(out[1, 2, 3], res[1, 2, 3] + 0.0)      # the empty row: 0 * 0.5 + res
    causal = check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), torch.float32)
    assert "_combine" not in causal.source


def test_one_chunk_over_a_growing_cache():
    """A symbolic key length with one chunk: the chunk is the whole cache, computed from SK."""
    h, kvh, d = 8, 4, 16

    def step(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    f = minicomp.compile(step)
    gen = torch.Generator().manual_seed(12)
    for length in (300, 333, 130):
        q = torch.randn(4, h, 1, d, generator=gen)
        k, v = (torch.randn(4, kvh, length, d, generator=gen) for _ in range(2))
        torch.testing.assert_close(f(q, k, v), step(q, k, v), **tol(torch.float32))
    assert f.compiles == 2 and f.graph.symbolic, f.dynamic.refused
    assert "mc_attn_decode" in f.source and "_combine" not in f.source


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


# --------------------------------------------------------------------------- GPU (the benchmark's shapes)


def cuda_qkv(b, h, kvh, sk, seed):
    """One decode step's bf16 q [B, H, 1, 128] and K/V cache [B, KVH, Sk, 128], drawn on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, 1, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(b, kvh, sk, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("kv", [4096, 32768, 5000])   # 5000: four chunks of 1280, the last ragged
@pytest.mark.parametrize("how", ["repeat_kv", "enable_gqa"])
def test_gpu_benchmark_decode_step(how, kv):
    """benchmarks/workloads_issue22.py's decode steps (B8, 32 query heads over 8 KV heads, 1
    query, d128, bf16) on the H200: the split form (4 chunks, combine) against eager."""
    q, k, v = cuda_qkv(8, 32, 8, kv, seed=13)
    scale = 1 / math.sqrt(128)
    if how == "repeat_kv":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), scale=scale)  # noqa: E731
    else:
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)  # noqa: E731
    f = check(fn, (q, k, v), torch.bfloat16)
    assert "_combine" in f.source and "4 KV chunk(s)" in f.source
    torch.testing.assert_close(f(q, k, v), fn(q, k, v), **tol(torch.bfloat16))   # the fast path's launches


@pytest.mark.gpu
@pytest.mark.parametrize("sk", [4096, 300])
def test_gpu_one_launch_decode(sk):
    """Batch 32 (256 batch x KV heads fill the wave) or a short cache: the one-launch form."""
    b = 32 if sk == 4096 else 8
    q, k, v = cuda_qkv(b, 32, 8, sk, seed=14)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    f = check(fn, (q, k, v), torch.bfloat16)
    assert "_combine" not in f.source and "1 KV chunk(s)" in f.source

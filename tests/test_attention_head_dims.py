"""Prefill attention at head dims that are no power of two (attention_body.head_pieces): a
multiple of 16 is computed in power-of-two pieces (96 = 64 + 32: the QK^T products summed in the
dot, one accumulator per piece of Dv, the epilogue and the store per piece), anything else
padded to the next power of two with masks. Each case is compared with eager (assert_close,
the dtype's tolerance), with odd lengths (a ragged last key block) and no group falling back.
The `gpu` tests are the issue's shapes at full size, for the H200.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicomp
from conftest import tol
from test_codegen_attention import our_attention_kernels  # noqa: F401  (autouse: our kernels, not SDPA)
from minicomp.codegen.attention_body import head_pieces


def test_head_pieces():
    assert head_pieces(96) == [(0, 64), (64, 32)]
    assert head_pieces(80) == [(0, 64), (64, 16)]
    assert head_pieces(208) == [(0, 128), (128, 64), (192, 16)]
    assert head_pieces(128) == [(0, 128)]
    assert head_pieces(72) == [(0, 128)]          # 72 = 64 + 8: a piece under 16 cannot be a dot
    assert head_pieces(8) == [(0, 16)]


CASES = [
    # (D, Dv, causal, dtype, fused epilogue)
    (96, 96, True, torch.float32, False),
    (80, 80, False, torch.float16, True),
    (96, 64, True, torch.bfloat16, False),
    (72, 96, False, torch.float32, True),      # D padded with masks, Dv in pieces
    (48, 48, True, torch.float16, False),
]


@pytest.mark.parametrize("d,dv,causal,dtype,epilogue", CASES,
                         ids=[f"d{c[0]}-dv{c[1]}-{'causal' if c[2] else 'full'}-{str(c[3])[6:]}" for c in CASES])
def test_prefill_at_head_dims_in_pieces(d, dv, causal, dtype, epilogue):
    gen = torch.Generator().manual_seed(d + dv)
    b, h, s = 1, 2, 77
    q, k = (torch.randn(b, h, s, d, generator=gen).to(dtype) for _ in range(2))
    v, res = (torch.randn(b, h, s, dv, generator=gen).to(dtype) for _ in range(2))

    def fn(q, k, v, res):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return y * 2.0 + res if epilogue else y
    f = minicomp.compile(fn)
    got = f(q, k, v, res)
    gen_mod = f._need().generated
    assert gen_mod.fallbacks == {} and len(f.plan.groups) == 1
    pieces = head_pieces(dv)
    if len(pieces) > 1:
        assert f"acc1 = tl.zeros([BLOCK_M, {pieces[1][1]}]" in gen_mod.source
    if len(head_pieces(d)) > 1:
        assert "qk = tl.dot(q1, k1, qk" in gen_mod.source
    torch.testing.assert_close(got, fn(q, k, v, res), **tol(dtype))


def test_non_contiguous_q_at_head_dim_96():
    """q read through a transpose of [B, S, H, D] (as models lay it out), split head dim."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 45, 3 * 96, generator=gen)
    k, v = (torch.randn(2, 3, 45, 96, generator=gen) for _ in range(2))

    def fn(x, k, v):
        q = x.view(2, 45, 3, 96).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(x, k, v), fn(x, k, v), **tol(torch.float32))
    assert f._need().generated.fallbacks == {}


def _cuda_check(fn, inputs, dtype, kernel: str) -> None:
    f = minicomp.compile(fn)
    got = f(*inputs)
    gen = f._need().generated
    assert gen.fallbacks == {} and any(kernel in name for name in gen.kernel_names), gen.kernel_names
    torch.testing.assert_close(got, fn(*inputs), **tol(dtype))


@pytest.mark.gpu
def test_gpu_causal_head_dim_96_length_1000():
    """The issue's weak shape: causal, head dim 96, S = 1000 (no Gluon kernel: not a multiple of 128)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 16, 1000, 96, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    _cuda_check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v),
                torch.bfloat16, "mc_attn_")


@pytest.mark.gpu
@pytest.mark.parametrize("sk", [4096, 32768])
def test_gpu_decode_benchmark_shape(sk):
    """The benchmark's decode shape: batch 8, 32 heads over 8 KV heads, 1 query, head dim 128, bf16."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(8, 32, 1, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(8, 8, sk, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    _cuda_check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), (q, k, v),
                torch.bfloat16, "mc_attn_decode")

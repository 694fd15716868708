"""A group of views whose output the producer already laid out is a strided view, no kernel.

`F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h * d)` is how
transformers' attention modules end: the attention kernel writes its output in [b, s, h, d]
memory order (the layout pass picks it for the reshape), so the transpose-and-reshape copy
would read and write every element at the same offset. The module makes the output
`buf.as_strided(...)` of the attention's buffer instead (codegen/pointwise.py `alias_source`).
These run on CPU under Triton's interpreter and compare with eager; the negative cases are
the ones where a view would share memory eager does not share.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

import minicomp

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _compiled(fn, inputs):
    f = minicomp.compile(fn)
    out = f(*inputs)
    return out, f.compile_for(*inputs).generated


def _merge_heads(q, k, v):
    b, h, s, d = q.shape
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h * d)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d", [(2, 3, 17, 16), (1, 2, 33, 32)], ids=["s17_d16", "s33_d32"])
def test_merged_heads_are_a_view_of_the_attention_output(b, h, s, d, dtype):
    inputs = [_randn(b, h, s, d, dtype=dtype, seed=i) for i in range(3)]
    out, gen = _compiled(_merge_heads, inputs)
    want = _merge_heads(*inputs)
    torch.testing.assert_close(out, want, **tol(dtype))
    assert out.stride() == want.stride()
    assert ".as_strided(" in gen.source and "no kernel: a view of" in gen.source
    assert not any(name.startswith("mc_pw") for name in gen.kernel_names), gen.kernel_names
    assert not any(out.data_ptr() == t.data_ptr() for t in inputs)


def test_the_view_feeds_a_later_kernel():
    """The aliased output read by an o-projection and a residual add, as in a block."""
    q, k, v, x = (_randn(2, 4, 9, 8, seed=i) for i in range(4))
    w = _randn(32, 32, seed=5)

    def block(q, k, v, x, w):
        attn = _merge_heads(q, k, v)
        return attn @ w.t() + x.transpose(1, 2).reshape(2, 9, 32)

    inputs = [q, k, v, x, w]
    out, gen = _compiled(block, inputs)
    torch.testing.assert_close(out, block(*inputs), **tol(torch.float32))


def _shares(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


OUTPUT_AND_VIEW = {
    # eager's reshape of a contiguous tensor is a view of it: minicomp's outputs share as eager's do
    "reshape": lambda a: a.reshape(6, 17, 16),
    # a transpose then reshape is a copy in eager: no memory shared with the other output
    "transpose_reshape": lambda a: a.transpose(1, 2).reshape(2, 17, 48),
}


@pytest.mark.parametrize("view", sorted(OUTPUT_AND_VIEW))
def test_an_output_and_a_view_of_it_share_memory_as_eagers_do(view):
    q, k, v = (_randn(2, 3, 17, 16, seed=i) for i in range(3))

    def both(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v)
        return a, OUTPUT_AND_VIEW[view](a)

    (a, other), gen = _compiled(both, [q, k, v])
    want_a, want_other = both(q, k, v)
    torch.testing.assert_close(a, want_a, **tol(torch.float32))
    torch.testing.assert_close(other, want_other, **tol(torch.float32))
    assert _shares(a, other) == _shares(want_a, want_other)


def test_a_view_of_an_input_is_a_copy_where_eagers_is():
    """`x.t().contiguous().t().reshape(...)` copies in eager; the compiled result must not be
    the caller's memory (a write to it would change x). The views move no element here, but
    the module keeps its copy: its output is never a view of an input it was given."""
    x = _randn(4, 6, 5)
    flat = lambda x: x.transpose(0, 1).contiguous().transpose(0, 1).reshape(24, 5)  # noqa: E731
    out, gen = _compiled(flat, [x])
    torch.testing.assert_close(out, flat(x), **tol(torch.float32))
    assert not _shares(out, x) and not _shares(flat(x), x)
    assert ".as_strided(" not in gen.source
    out.add_(1.0)
    torch.testing.assert_close(x, _randn(4, 6, 5))

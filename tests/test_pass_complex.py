"""The `complex` pass (passes/complex_arith.py): Meta's complex rotary embedding as real math."""

from __future__ import annotations

import pytest
import torch
from conftest import tol

import minicomp


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """As Meta's reference Llama writes it."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


class Rotary(torch.nn.Module):
    """`apply_rotary_emb` of Meta's llama/model.py, the table a complex buffer of the module."""

    def __init__(self, head_dim: int, seq: int):
        super().__init__()
        self.register_buffer("freqs_cis", precompute_freqs_cis(head_dim, seq))

    def forward(self, xq: torch.Tensor, xk: torch.Tensor):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        fc = self.freqs_cis[: xq.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * fc).flatten(3)
        xk_out = torch.view_as_real(xk_ * fc).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_meta_rotary_embedding_is_one_kernel(dtype):
    torch.manual_seed(0)
    rot = Rotary(16, 12)
    xq, xk = torch.randn(2, 7, 4, 16).to(dtype), torch.randn(2, 7, 2, 16).to(dtype)
    f = minicomp.compile(rot)
    for got, want in zip(f(xq, xk), rot(xq, xk)):
        torch.testing.assert_close(got, want, **tol(dtype))
    c = f.compile_for(xq, xk)
    kinds = c.plan.kinds()
    # the table's real view is PyTorch's (a view, nothing launched); q and k rotate in kernels
    assert kinds.count("opaque") == 1 and "pointwise" in kinds and len(kinds) <= 3, str(c.plan)
    assert not any("no Triton type" in why for why in c.generated.fallbacks.values()), c.generated.fallbacks


def test_a_product_read_as_complex_too_is_left_to_pytorch():
    def f(x, y):
        p = torch.view_as_complex(x) * torch.view_as_complex(y)
        return torch.view_as_real(p), p.abs()
    x, y = torch.randn(3, 5, 2), torch.randn(3, 5, 2)
    cf = minicomp.compile(f)
    for got, want in zip(cf(x, y), f(x, y)):
        torch.testing.assert_close(got, want, **tol(torch.float32))


def test_polar_inside_the_function_and_a_broadcast_table():
    def f(x, angles):
        fc = torch.polar(torch.ones_like(angles), angles)        # [S, D/2], computed each call
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * fc).flatten(-2)
    x, angles = torch.randn(2, 5, 8), torch.randn(5, 4)
    cf = minicomp.compile(f)
    torch.testing.assert_close(cf(x, angles), f(x, angles), **tol(torch.float32))
    assert "pointwise" in cf.compile_for(x, angles).plan.kinds()

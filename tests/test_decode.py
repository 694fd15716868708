"""Decoding step by step: a step function over static K/V caches and a position tensor
(transformers' static-cache recipe, written functionally) compiles once and serves every step.

The caches and the position are tensors of fixed shapes, so every step has the same signature;
the position only changes values (the cache write and the visibility mask read it at run time).
"""

import torch
import torch.nn.functional as F
from conftest import tol

import minicomp

# a cache of 16 positions: every step of it, from the first to the full cache, is one compile
H, D, LENGTH = 2, 8, 16


def make_step(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    wq, wk, wv, wo = (torch.randn(H * D, H * D, generator=gen) / (H * D) ** 0.5 for _ in range(4))

    def step(x, k_cache, v_cache, pos):
        """x [B, 1, H*D]; caches [B, H, LENGTH, D]; pos: int64 [1], the new token's position."""
        b = x.shape[0]
        q = (x @ wq).view(b, 1, H, D).transpose(1, 2)
        k = (x @ wk).view(b, 1, H, D).transpose(1, 2)
        v = (x @ wv).view(b, 1, H, D).transpose(1, 2)
        k_cache = k_cache.index_copy(2, pos, k)
        v_cache = v_cache.index_copy(2, pos, v)
        visible = torch.arange(LENGTH) <= pos                 # keys written so far
        mask = torch.where(visible, 0.0, float("-inf"))[None, :]
        y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        return torch.tanh(y.transpose(1, 2).reshape(b, 1, H * D) @ wo), k_cache, v_cache
    return step


def test_every_decode_step_over_the_whole_cache_compiles_once():
    step = make_step()
    compiled = minicomp.compile(step)
    b = 2
    x = torch.randn(b, 1, H * D, generator=torch.Generator().manual_seed(1))
    caches = [torch.zeros(b, H, LENGTH, D), torch.zeros(b, H, LENGTH, D)]
    eager_caches = [c.clone() for c in caches]
    xe = x.clone()
    for i in range(LENGTH):
        pos = torch.tensor([i])
        x, *caches = compiled(x, *caches, pos)
        xe, *eager_caches = step(xe, *eager_caches, pos)
        torch.testing.assert_close(x, xe, **tol(torch.float32))
        if i == 0:
            assert compiled.compiles == 1
    assert compiled.compiles == 1                             # no recompile after the first step
    torch.testing.assert_close(caches[0], eager_caches[0], **tol(torch.float32))

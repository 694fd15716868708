"""Residual add + RMSNorm, written by hand as in Llama: returns the sum and the normed value.

The statistics are computed in fp32 and the result cast back (`.float()` ... `.type_as`),
so half-precision inputs exercise casts.
"""

import torch

BENCH_SIZES = dict(batch=8, seq=1024, width=4096)


def model(x, residual, weight, eps: float = 1e-6):
    h = x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return h, normed.type_as(x) * weight


def build(device="cpu", dtype=torch.float32, batch=2, seq=13, width=96, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, width, generator=gen)
    residual = torch.randn(batch, seq, width, generator=gen)
    weight = 1 + 0.1 * torch.randn(width, generator=gen)
    return model, [t.to(device=device, dtype=dtype) for t in (x, residual, weight)]


def example_inputs():
    return build()[1]

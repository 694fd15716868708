"""LayerNorm over the last axis, written by hand: mean, variance, normalise, scale and shift."""

import torch

BENCH_SIZES = dict(batch=8, seq=1024, width=2048)


def model(x, weight, bias, eps: float = 1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    return centred * torch.rsqrt(var + eps) * weight + bias


def build(device="cpu", dtype=torch.float32, batch=2, seq=13, width=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = 2 + torch.randn(batch, seq, width, generator=gen)
    weight = 1 + 0.1 * torch.randn(width, generator=gen)
    bias = 0.1 * torch.randn(width, generator=gen)
    return model, [t.to(device=device, dtype=dtype) for t in (x, weight, bias)]


def example_inputs():
    return build()[1]

"""Causal attention written out: q @ k^T * scale, mask with a lower-triangular matrix, softmax, @ v.

q, k, v: [batch, heads, seq, head_dim]. The attention fusion pass should recognise this
as one flash-attention kernel.
"""

import torch

BENCH_SIZES = dict(batch=8, heads=16, seq=1024, head_dim=128)


def model(q, k, v):
    seq = q.shape[-2]
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=q.device))
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def build(device="cpu", dtype=torch.float32, batch=2, heads=3, seq=29, head_dim=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(batch, heads, seq, head_dim, generator=gen) for _ in range(3)]
    return model, [t.to(device=device, dtype=dtype) for t in qkv]


def example_inputs():
    return build()[1]

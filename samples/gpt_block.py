"""A GPT-2 transformer block: pre-LayerNorm causal self-attention and a GELU-tanh MLP, with residuals.

Attention goes through `F.scaled_dot_product_attention(is_causal=True)` on [batch, heads,
seq, head_dim] views of one fused qkv projection, as nanoGPT writes it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BENCH_SIZES = dict(batch=8, seq=1024, width=2048, heads=16)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.c_attn(x).split(w, dim=2)
        q = q.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, s, w)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def build(device="cpu", dtype=torch.float32, batch=2, seq=13, width=64, heads=4, seed=0):
    """(block in eval mode with seeded weights, [x]) for x: [batch, seq, width]."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Block(width, heads)
        for ln in (block.ln_1, block.ln_2):  # non-trivial norm weights, so tests see them applied
            nn.init.normal_(ln.weight, 1.0, 0.1)
            nn.init.normal_(ln.bias, 0.0, 0.1)
        x = torch.randn(batch, seq, width)
    return block.to(device=device, dtype=dtype).eval(), [x.to(device=device, dtype=dtype)]


model, _inputs = build()


def example_inputs():
    return [t.clone() for t in _inputs]

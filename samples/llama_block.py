"""A Llama transformer block: RMSNorm, rotary embeddings, grouped-query causal attention, SwiGLU MLP.

Rotary embeddings use precomputed cos/sin tables (buffers) and `rotate_half` written with
slicing and `torch.cat`; the grouped KV heads are repeated with `repeat_interleave` before
`F.scaled_dot_product_attention(is_causal=True)`.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BENCH_SIZES = dict(batch=4, seq=2048, width=4096, heads=32, kv_heads=8, hidden=11008)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, max_seq: int, theta: float = 10000.0):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = width // heads
        self.wq = nn.Linear(width, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, width, bias=False)
        inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, kv_heads: int = 2, hidden: int = 176,
                 max_seq: int = 64, eps: float = 1e-5):
        super().__init__()
        self.attention_norm = nn.RMSNorm(width, eps=eps)
        self.attention = Attention(width, heads, kv_heads, max_seq)
        self.ffn_norm = nn.RMSNorm(width, eps=eps)
        self.feed_forward = FeedForward(width, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def build(device="cpu", dtype=torch.float32, batch=2, seq=13, width=64, heads=4, kv_heads=2, hidden=176,
          seed=0):
    """(block in eval mode with seeded weights, [x]) for x: [batch, seq, width]."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Block(width, heads, kv_heads, hidden, max_seq=seq)
        for norm in (block.attention_norm, block.ffn_norm):  # non-trivial norm weights
            nn.init.normal_(norm.weight, 1.0, 0.1)
        x = torch.randn(batch, seq, width)
    return block.to(device=device, dtype=dtype).eval(), [x.to(device=device, dtype=dtype)]


model, _inputs = build()


def example_inputs():
    return [t.clone() for t in _inputs]

"""A transformer MLP: Linear -> GELU -> Linear.

`model` and `example_inputs()` are the small CPU case (the CLI and tests use them);
`build(device, dtype, **sizes)` makes the same model at any size, `BENCH_SIZES` at GPU size.
"""

import torch
import torch.nn as nn

BENCH_SIZES = dict(batch=8, seq=1024, width=2048)


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def build(device="cpu", dtype=torch.float32, batch=2, seq=13, width=64, hidden=None, seed=0):
    """(model in eval mode with seeded weights, [x]) for x: [batch, seq, width]."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(width, hidden or 4 * width)
        x = torch.randn(batch, seq, width)
    return model.to(device=device, dtype=dtype).eval(), [x.to(device=device, dtype=dtype)]


model, _inputs = build()


def example_inputs():
    return [t.clone() for t in _inputs]

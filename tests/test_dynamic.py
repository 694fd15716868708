"""One compile for every size: `minicomp.compile` over symbolic sizes (api/dynamic.py,
frontend/fx_symbolic.py, codegen/sizes.py), checked against eager at odd sizes.

The default goes symbolic at the second size, as Dynamo does; `dynamic=True` from the first
call; `dynamic=False` never; `mark_dynamic` for chosen dims. A trace that assumes a fact
about a size the module cannot re-check compiles for concrete sizes instead, and says why."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytest

import minicomp
from conftest import tol


class Block(nn.Module):
    """A transformer-ish block's pointwise and row parts, as people write them."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x, bias):
        h = self.norm(x * self.scale + bias)
        heads = h.reshape(x.shape[0], x.shape[1], 4, -1).transpose(1, 2)      # [B, 4, S, d/4]
        return torch.softmax(heads, dim=-1), F.gelu(h).sum(-1), h.mean(dim=1)


def _check(f, m, *args, dtype=torch.float32):
    with torch.no_grad():
        want = m(*args)
    got = f(*args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol(dtype))


def test_a_size_that_changes_goes_symbolic_at_the_second_shape():
    torch.manual_seed(0)
    m = Block().eval()
    f = minicomp.compile(m)
    for s in (5, 7, 33, 2, 9, 64, 7):
        _check(f, m, torch.randn(2, s, 16), torch.randn(s, 16))
    assert f.compiles == 2, f.dynamic.refused
    assert f.graph.symbolic and not f.dynamic.refused
    # the module reads S from the call: one plan serves every length
    assert "bind_size" in f.source
    assert f.explain().startswith("compiled over symbolic sizes s") and "; planned at s" in f.explain()


def test_dynamic_true_compiles_once_and_false_per_size():
    torch.manual_seed(1)
    m = Block().eval()
    always, never = minicomp.compile(m, dynamic=True), minicomp.compile(m, dynamic=False)
    for b, s in ((2, 5), (3, 7), (2, 11), (5, 3)):
        args = (torch.randn(b, s, 16), torch.randn(s, 16))
        _check(always, m, *args)
        _check(never, m, *args)
    assert always.compiles == 1 and never.compiles == 4


def test_mark_dynamic_makes_that_dim_symbolic_from_the_first_call():
    torch.manual_seed(2)
    m = Block().eval()
    f = minicomp.compile(m)
    x = minicomp.mark_dynamic(torch.randn(2, 5, 16), 1)
    _check(f, m, x, torch.randn(5, 16))        # the bias's 5 fixes x's: a guard Eq(s, 5), as in Dynamo
    assert not f.graph.symbolic and f.dynamic.refused
    f = minicomp.compile(m)
    _check(f, m, x, minicomp.mark_dynamic(torch.randn(5, 16), 0))
    assert f.graph.symbolic
    for s in (6, 13):
        _check(f, m, torch.randn(2, s, 16), torch.randn(s, 16))
    assert f.compiles == 1
    with pytest.raises(IndexError, match="out of range"):
        minicomp.mark_dynamic(torch.randn(3), 2)


def test_non_contiguous_broadcast_and_bf16_inputs_over_symbols():
    torch.manual_seed(3)
    m = Block().eval()
    f = minicomp.compile(m, dynamic=True)
    for s in (6, 17):
        x = torch.randn(2, 16, s).transpose(1, 2)            # [2, s, 16], not contiguous
        _check(f, m, x, torch.randn(1, 16).expand(s, 16))    # a broadcast bias
    mb = Block().eval().to(torch.bfloat16)
    fb = minicomp.compile(mb, dynamic=True)
    for s in (5, 12):
        _check(fb, mb, torch.randn(3, s, 16, dtype=torch.bfloat16), torch.randn(s, 16, dtype=torch.bfloat16),
               dtype=torch.bfloat16)
    assert f.compiles == 1 and fb.compiles == 1


def test_size_one_gets_a_compile_of_its_own():
    torch.manual_seed(4)
    m = Block().eval()
    f = minicomp.compile(m, dynamic=True)
    _check(f, m, torch.randn(2, 5, 16), torch.randn(5, 16))
    _check(f, m, torch.randn(2, 1, 16), torch.randn(1, 16))    # 1 broadcasts differently: not in the range
    _check(f, m, torch.randn(2, 9, 16), torch.randn(9, 16))
    assert f.compiles == 2


def test_a_branch_on_a_size_compiles_once_per_side_of_the_branch():
    def f(x):
        if x.shape[1] > 8:                     # the trace narrows the symbol's range: s <= 8, or s >= 9
            return torch.tanh(x) * 2
        return torch.sigmoid(x)
    cf = minicomp.compile(f)
    for s in (5, 7, 12, 6, 30, 8, 9):
        x = torch.randn(3, s)
        torch.testing.assert_close(cf(x), f(x), **tol(torch.float32))
    # 5 concrete; 7 goes symbolic over [2, 8] (call() checks the range); 12 is outside it and
    # gets the other side, over [9, ...]; 6, 30, 8 and 9 reuse those two
    assert cf.compiles == 3 and not cf.dynamic.refused, cf.dynamic.refused


@pytest.mark.parametrize("first", [9, 2], ids=["longer_first", "shorter_first"])
def test_the_last_rows_of_a_sequence_compile_once_on_each_side_of_their_count(first):
    """`x[:, -3:]` (the last tokens, a window of a cache): PyTorch asks whether the slice is the
    whole row (its stride equals 3 only at s = 3) and records `Ne(s, 3)`. The trace is made again
    over the range on the first size's side of 3, which implies the guard: one compile for every
    longer length (or every shorter one), never one per size; the other side compiles too."""
    def f(x, w):
        return torch.tanh(x[:, -3:]) * w
    cf = minicomp.compile(f, dynamic=True)
    sizes = (first, 12, 5, 4, 3, 2, 30) if first == 9 else (first, 3, 5, 12, 4)
    w = torch.randn(3)
    for s in sizes:
        x = torch.randn(2, s, 3)
        torch.testing.assert_close(cf(x, w), f(x, w), **tol(torch.float32))
    # longer first: one module over [4, ...] for 9, 12, 5, 4 and 30; 3 and 2 compile on their
    # own. Shorter first: 2 (the slice is the whole row), 3, then [4, ...] once for 5, 12 and 4
    assert cf.compiles == 3 and not cf.dynamic.refused, (cf.compiles, cf.dynamic.refused)
    assert "in [4, 2147483647]" in cf.explain(), cf.explain()


def test_a_branch_between_two_sizes_compiles_per_size_and_says_why():
    def f(x):
        if x.shape[1] > x.shape[0]:            # no range implies this: no module re-checks it
            return torch.tanh(x) * 2
        return torch.sigmoid(x)
    cf = minicomp.compile(f)
    for b, s in ((3, 5), (4, 7), (9, 6), (4, 7)):
        x = torch.randn(b, s)
        torch.testing.assert_close(cf(x), f(x), **tol(torch.float32))
    assert cf.compiles == 3 and cf.dynamic.refused
    assert any("the trace assumed" in why for why in cf.dynamic.refused.values()), cf.dynamic.refused
    assert "compiled for concrete sizes: the trace assumed" in cf.explain()


def test_a_slice_to_the_sequence_length_of_a_longer_buffer_stays_symbolic():
    # `position_ids[:, :seq_len]` as BERT and GPT-2 write it: the bound is a symbol, the buffer's
    # size a constant; the trace's guard s <= 64 narrows the symbol's range
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 8)
            self.register_buffer("ids", torch.arange(64).expand(1, -1), persistent=False)

        def forward(self, x):
            return x + self.emb(self.ids[:, :x.shape[1]]) * 2

    torch.manual_seed(7)
    m = Positions().eval()
    f = minicomp.compile(m, dynamic=True)
    for s in (5, 17, 64, 2):
        _check(f, m, torch.randn(2, s, 8))
    assert f.compiles == 1 and f.graph.symbolic and not f.dynamic.refused, f.dynamic.refused
    with pytest.raises(Exception) as err:          # past the buffer: eager fails too (65 rows of 64)
        f(torch.randn(2, 65, 8))
    assert "Traceback" not in str(err.value)
    with torch.no_grad(), pytest.raises(RuntimeError):
        m(torch.randn(2, 65, 8))


def test_sizes_that_disagree_are_the_users_error_as_in_eager():
    torch.manual_seed(5)
    m = Block().eval()
    f = minicomp.compile(m, dynamic=True)
    _check(f, m, torch.randn(2, 5, 16), torch.randn(5, 16))
    with pytest.raises(Exception) as err:
        f(torch.randn(2, 6, 16), torch.randn(7, 16))       # bias rows do not match the sequence
    assert "Traceback" not in str(err.value)
    with torch.no_grad(), pytest.raises(RuntimeError):
        m(torch.randn(2, 6, 16), torch.randn(7, 16))


def test_weights_are_read_at_call_time_over_symbols():
    torch.manual_seed(6)
    m = Block().eval()
    f = minicomp.compile(m, dynamic=True)
    _check(f, m, torch.randn(2, 5, 16), torch.randn(5, 16))
    with torch.no_grad():
        m.scale.mul_(3.0)
        m.norm.weight = nn.Parameter(torch.randn(16))
    _check(f, m, torch.randn(2, 8, 16), torch.randn(8, 16))


@pytest.mark.parametrize("dynamic, compiles, steps", [(None, 2, 30), (True, 1, 64)])
def test_a_growing_past_length_compiles_once_or_twice_over_the_steps(dynamic, compiles, steps):
    """A decode step over plain K/V tensors whose length grows every step (the issue's loop):
    with dynamic=True the first step compiles over symbols and none of the 64 after it does
    (issue 21's must-show); by default the second step compiles over symbols, and 30 steps
    (the length from 3 to 32, every power-of-two bucket up to 32) show no step after it does."""
    torch.manual_seed(7)
    wq, wo = torch.randn(16, 16) / 4, torch.randn(16, 16) / 4

    def step(x, k, v):                     # x [B, 1, 16]; k, v [B, T, 16]
        q = x @ wq
        att = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1)
        return (att @ v) @ wo + x

    f = minicomp.compile(step, dynamic=dynamic)
    x = torch.randn(2, 1, 16)
    k = torch.randn(2, 3, 16)
    v = torch.randn(2, 3, 16)
    for _ in range(steps):
        out = f(x, k, v)
        torch.testing.assert_close(out, step(x, k, v), **tol(torch.float32))
        k = torch.cat([k, out], dim=1)
        v = torch.cat([v, torch.tanh(out)], dim=1)
        x = out
    assert f.compiles == compiles, f.dynamic.refused


def test_a_step_that_concatenates_its_past_compiles_once_over_the_length():
    """Past K and V grow by one token a step, concatenated inside the step: their lengths are
    two symbols the trace finds equal (`Eq(s76 + 1, s30 + 1)`), which the module checks by
    writing both over one symbol; one compile over symbols serves every later step."""
    torch.manual_seed(0)
    heads, d = 2, 8
    wq, wk, wv = (torch.randn(heads * d, heads * d) / 4 for _ in range(3))

    def step(x, past_k, past_v):
        b = x.shape[0]
        q = (x @ wq).view(b, 1, heads, d).transpose(1, 2)
        k = torch.cat([past_k, (x @ wk).view(b, 1, heads, d).transpose(1, 2)], dim=2)
        v = torch.cat([past_v, (x @ wv).view(b, 1, heads, d).transpose(1, 2)], dim=2)
        return F.scaled_dot_product_attention(q, k, v), k, v

    f = minicomp.compile(step)
    k, v = torch.randn(1, heads, 3, d), torch.randn(1, heads, 3, d)
    for _ in range(6):
        x = torch.randn(1, 1, heads * d)
        want = step(x, k, v)
        for a, b in zip(f(x, k, v), want):
            torch.testing.assert_close(a, b, **tol(torch.float32))
        k, v = want[1], want[2]
    assert f.compiles == 2 and not f.dynamic.refused, f.dynamic.refused


def test_the_backend_returns_sizes_computed_from_the_sizes_it_was_given():
    # Dynamo hands the graph its sizes as arguments; a graph that returns one (or `length + 1`,
    # as a sliding-window cache's length does) stays one compile over symbols
    def f(x):
        return x * 2, x.shape[1] + 1, x.shape[0] * x.shape[1]

    backend = minicomp.backend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    for n in (3, 7, 12):
        x = torch.randn(2, n)
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
    assert [(g.symbolic, g.shapes, g.per_shape) for g in backend.report().graphs] == [(True, 1, "")]

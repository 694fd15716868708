"""How `minicomp.compile`'s functions may be called (minicomp/api/arguments.py, entry.py).

Tensors and None, positionally or by keyword, nested in lists, tuples and dicts, go through
the own capture (no warning); the call's shape is part of what a specialisation is found by.
Any other argument (a Python number, a string, an object holding tensors, as transformers'
Cache is) or a result that is not a tensor sends the function through Dynamo, once, with one
warning, and eager's answer, including in-place writes into an object's tensors.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import minicomp
from conftest import tol


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x, mask=None, bias=None):
        y = torch.sigmoid(self.proj(x))
        if mask is not None:
            y = y * mask
        if bias is not None:
            y = y + bias["b"]
        return y


def _no_fallback(f):
    assert f.refused is None and f.plan is not None      # the own capture served every call


def test_keyword_arguments_and_none_go_through_the_own_capture():
    torch.manual_seed(0)
    m = Gate()
    x = torch.randn(6, 5).t()                  # non-contiguous, odd shape
    mask = torch.rand(5, 1) > 0.5              # broadcast over the features
    b = {"b": torch.randn(6)}
    f = minicomp.compile(m)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")         # no fallback warning
        for args, kwargs in [((), dict(x=x, mask=mask)), ((x,), dict(mask=mask)), ((), dict(mask=mask, x=x)),
                             ((x,), dict(mask=None, bias=b)), ((x, None, b), {}), ((x,), {})]:
            torch.testing.assert_close(f(*args, **kwargs), m(*args, **kwargs), **tol(torch.float32))
    _no_fallback(f)
    assert f.compiles == 6                     # six call shapes, each its own specialisation
    names = [f.graph.node(i).attrs.get("name") for i in f.graph.inputs]
    assert names[0] == "x" and "proj.weight" in names


def test_a_keyword_call_is_found_again_and_follows_new_values():
    f = minicomp.compile(lambda a, b: a * b + 1)
    x, y = torch.randn(7), torch.randn(7)
    torch.testing.assert_close(f(a=x, b=y), x * y + 1)
    y2 = torch.randn(7)
    torch.testing.assert_close(f(a=x, b=y2), x * y2 + 1)
    assert f.compiles == 1
    torch.testing.assert_close(f(a=x.double(), b=y.double()), x.double() * y.double() + 1)
    assert f.compiles == 2


def test_a_keyword_that_is_not_a_name_never_reaches_the_source():
    def total(**parts):
        return sum(parts.values()) * 2

    f = minicomp.compile(total)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(f(**{"x); mc_injected(": x, "y": y}), (x + y) * 2)
    _no_fallback(f)
    assert "mc_injected" not in f.source
    assert [f.graph.node(i).attrs.get("name") for i in f.graph.inputs] == ["arg0", "y"]


def test_python_values_go_through_dynamo_once_and_are_guarded():
    f = minicomp.compile(lambda a, n, *, mode="scale": a * n if mode == "scale" else a + n)
    x = torch.randn(3, 5)
    with pytest.warns(UserWarning, match=r"own capture cannot take it whole \(<lambda> was called with argument 1 = 2.0"):
        torch.testing.assert_close(f(x, 2.0), x * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # one warning, at the switch
        torch.testing.assert_close(f(x, 3.0), x * 3.0)
        torch.testing.assert_close(f(x, 3.0, mode="shift"), x + 3.0)
        torch.testing.assert_close(f(x, torch.ones(5)), x)       # tensors too, now through Dynamo
    assert "argument 1 = 2.0" in f.explain() and f.backend_report().kernels > 0


def test_a_result_that_is_not_a_tensor_goes_through_dynamo():
    def with_count(x):
        return torch.tanh(x), x.shape[0] * 2

    f = minicomp.compile(with_count)
    x = torch.randn(4, 3)
    with pytest.warns(UserWarning, match="returns int"):
        out = f(x)
    torch.testing.assert_close(out[0], torch.tanh(x), **tol(torch.float32))
    assert out[1] == 8


class SlotCache:
    """A KV-cache-like object (not a pytree): tensors written in place at a position, as
    transformers' StaticCache is by each decoding step."""
    def __init__(self, slots: int, width: int):
        self.keys = torch.zeros(slots, width)
        self.seen = 0


def step(x, cache, pos):
    cache.keys.index_copy_(0, pos, x)          # the in-place write the caller keeps
    return torch.softmax(cache.keys @ x.t(), dim=0)


def test_an_object_whose_tensors_are_written_in_place_gives_eagers_state_and_answer():
    f = minicomp.compile(step)
    ours, theirs = SlotCache(8, 4), SlotCache(8, 4)
    xs = torch.randn(5, 1, 4, generator=torch.Generator().manual_seed(3))
    with pytest.warns(UserWarning, match="cache = a SlotCache|argument 1 = a SlotCache"):
        f(xs[0], ours, torch.tensor([0]))
    step(xs[0], theirs, torch.tensor([0]))
    for i in range(1, 5):
        got = f(xs[i], ours, torch.tensor([i]))
        want = step(xs[i], theirs, torch.tensor([i]))
        torch.testing.assert_close(got, want, **tol(torch.float32))
        torch.testing.assert_close(ours.keys, theirs.keys, atol=0, rtol=0)   # the write happened, exactly
    assert f.backend_report().kernels > 0


def test_weights_are_read_at_call_time_on_a_keyword_call():
    torch.manual_seed(1)
    m = Gate()
    x, mask = torch.randn(3, 6), torch.ones(3, 1)
    f = minicomp.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(f(x=x, mask=mask), m(x=x, mask=mask), **tol(torch.float32))
        m.proj.weight = nn.Parameter(torch.randn(6, 6))       # rebound
        torch.testing.assert_close(f(x=x, mask=mask), m(x=x, mask=mask), **tol(torch.float32))
        m.proj.bias.mul_(3)                                    # written in place
        torch.testing.assert_close(f(x=x, mask=mask), m(x=x, mask=mask), **tol(torch.float32))
    _no_fallback(f)

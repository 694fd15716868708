"""`minicomp.compile(fn)` where its own capture cannot take `fn` whole: it goes through Dynamo
(minicomp/entry.py), says so once, and `explain()` lists the graphs and each graph break.

The functions are written as PyTorch users write them (a normalisation that branches on a
value, a logged `.item()`, `.tolist()` lengths, an old-style autograd.Function, `.numpy()`),
each compared with eager. A user's own error stays an error on both paths.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn as nn

import minicomp
from conftest import tol
from minicomp.errors import CaptureRefused, GuardError, MinicompError, SourceError


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def clip_norm(x):
    norm = x.norm(dim=-1, keepdim=True)
    if norm.max() > 1.0:                       # data-dependent branch
        x = x / norm.clamp(min=1e-6)
    return torch.tanh(x) * 2


def standardise(x):
    std = x.std().item()                       # a value read
    return (x - x.mean()) / (std + 1e-5)


def logged(x, w):
    y = torch.relu(x @ w)
    print(f"activation mean {y.mean().item():.4f}")   # the training-loop habit
    return y * 0.5


def ragged_sums(x, lengths):
    out = []
    start = 0
    for n in lengths.tolist():                 # Python ints from a tensor
        out.append(x[start:start + n].sum(0))
        start += n
    return torch.stack(out)


class _OldScale(torch.autograd.Function):
    """Old-style (no setup_context), as Bloom's code has: make_fx cannot trace it."""
    @staticmethod
    def forward(ctx, x):
        return x * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * 3.0


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        h = _OldScale.apply(self.proj(x))
        return torch.sigmoid(h) * x


def with_numpy(x):
    peak = float(x.detach().numpy().max())     # make_fx used to read uninitialised memory here
    return x / peak


def _compiled(fn):
    with pytest.warns(UserWarning, match="own capture cannot take it whole.*through Dynamo") as seen:
        c = minicomp.compile(fn)
    return c, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_data_dependent_branch_goes_through_dynamo_and_takes_both_ways(dtype):
    f = minicomp.compile(clip_norm)
    big = torch.randn(5, 7, dtype=dtype) * 3            # odd sizes; norm > 1: the division runs
    small = (torch.rand(5, 7, dtype=dtype) * 0.05)      # norm < 1: it does not
    with pytest.warns(UserWarning, match="clip_norm: its own capture cannot take it whole"):
        got = f(big)
    torch.testing.assert_close(got, clip_norm(big), **tol(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # said once: no second warning
        torch.testing.assert_close(f(small), clip_norm(small), **tol(dtype))
    assert isinstance(f.refused, CaptureRefused)
    report = f.backend_report()
    assert len(report.graphs) >= 2 and report.kernels > 0 and not report.failures, report.table()
    breaks = f.graph_breaks
    assert breaks and breaks[0].where.endswith(f"test_fallback.py:{_line_of(clip_norm, 'norm.max() > 1.0')}")
    text = f.explain()
    assert "went through Dynamo" in text and "graph break(s)" in text and str(breaks[0]) in text
    assert "| graph |" in text                           # the backend's table of graphs


def test_an_item_read_on_a_non_contiguous_input_matches_eager():
    f = minicomp.compile(standardise)
    x = torch.randn(9, 6).t()                           # non-contiguous
    with pytest.warns(UserWarning, match="through Dynamo"):
        got = f(x)
    torch.testing.assert_close(got, standardise(x), **tol(torch.float32))
    y = torch.randn(6, 9) * 4 + 1                       # a new value and layout, same shape
    torch.testing.assert_close(f(y), standardise(y), **tol(torch.float32))
    assert f.graph_breaks[0].where.endswith(f"test_fallback.py:{_line_of(standardise, '.item()')}")
    assert "item" in f.graph_breaks[0].reason


def test_a_print_of_a_value_runs_at_every_call_and_the_result_matches(capsys):
    f = minicomp.compile(logged)
    x, w = torch.randn(3, 5), torch.randn(5, 4)         # broadcast-free matmul, odd sizes
    with pytest.warns(UserWarning, match="through Dynamo"):
        got = f(x, w)
    torch.testing.assert_close(got, logged(x, w), **tol(torch.float32))
    capsys.readouterr()
    f(x * 2, w)
    assert "activation mean" in capsys.readouterr().out  # Dynamo runs the print between graphs


def test_tolist_lengths_match_eager():
    f = minicomp.compile(ragged_sums)
    x, lengths = torch.randn(10, 3), torch.tensor([2, 5, 3])
    with pytest.warns(UserWarning, match="through Dynamo"):
        got = f(x, lengths)
    torch.testing.assert_close(got, ragged_sums(x, lengths), **tol(torch.float32))


def test_a_module_with_an_old_style_autograd_function_matches_eager():
    torch.manual_seed(0)
    gate = Gate().eval()
    f = minicomp.compile(gate)
    x = torch.randn(4, 1, 6).expand(4, 3, 6)            # a broadcast (stride-0) input
    with torch.no_grad(), pytest.warns(UserWarning, match="setup_context"):
        got = f(x)
    with torch.no_grad():
        torch.testing.assert_close(got, gate(x), **tol(torch.float32))


def test_numpy_reads_give_eagers_answer_for_each_value():
    f = minicomp.compile(with_numpy)
    a, b = torch.rand(4, 3) + 1, torch.rand(4, 3) * 10 + 1
    with pytest.warns(UserWarning, match="values into Python"):
        torch.testing.assert_close(f(a), with_numpy(a), **tol(torch.float32))
    torch.testing.assert_close(f(b), with_numpy(b), **tol(torch.float32))


def test_the_own_capture_stays_first_where_it_works():
    def plain(x):
        return torch.where(x.sum(-1, keepdim=True) > 0, x + 1, x - 1)   # the branch, as tensor ops

    f = minicomp.compile(plain)
    x = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(f(x), plain(x), **tol(torch.float32))
    assert f.refused is None and f.graph_breaks == [] and f.plan is not None
    with pytest.raises(MinicompError, match="own capture, not through Dynamo"):
        f.backend_report()


def test_a_users_error_is_an_error_not_a_fallback():
    def mismatched(x):
        return x @ torch.ones(5, 5)

    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # no fallback warning
        with pytest.raises(SourceError, match="must have the same reduction dim"):
            minicomp.compile(mismatched)(torch.randn(4, 3))
    with pytest.warns(UserWarning, match="argument 1 = 2"), \
            pytest.raises(MinicompError, match="takes 1 positional argument but 2 were given"):
        minicomp.compile(standardise)(torch.randn(3), 2)   # a Python value goes to Dynamo; the call is still wrong


def test_a_users_error_behind_a_refused_read_is_an_error_at_the_users_line():
    def late_mismatch(x):
        if x.sum() > -1e9:
            return x @ torch.ones(5, 5)
        return x

    f = minicomp.compile(late_mismatch)
    with pytest.warns(UserWarning, match="through Dynamo"), pytest.raises(MinicompError) as info:
        f(torch.randn(4, 3))
    assert "through Dynamo failed" in str(info.value) and "Traceback" not in str(info.value)
    assert f"test_fallback.py:{_line_of(late_mismatch, '@ torch.ones')}" in str(info.value)
    with pytest.raises(MinicompError, match="through Dynamo failed"):
        f(x=torch.randn(4, 3))                 # keywords go through Dynamo too, to the same error
    with pytest.raises(MinicompError, match="compiled through Dynamo"):
        f.plan

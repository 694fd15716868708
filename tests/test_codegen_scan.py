"""Scan row kernels: tl.associative_scan in the single-pass form, a carry between column blocks
in the looped and columns forms, (value, index) pairs, and fusion with what surrounds a scan."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same, compile_without_fallbacks, tol

import minicomp

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype, shape, dim", [
    (torch.float32, (3, 37), 1), (torch.float16, (37, 5), 0), (torch.bfloat16, (2, 19, 3), 1),
    (torch.int32, (3, 37), -1), (torch.bool, (37, 5), 0), (torch.float64, (2, 19, 3), -3)])
def test_cumsum_any_axis(shape, dim, dtype, form):
    x = (torch.randn(shape) * 3).to(dtype) if dtype != torch.bool else torch.rand(shape) > 0.5
    f, out = compile_without_fallbacks(lambda x: torch.cumsum(x, dim), x, form=form)
    assert_same(out, torch.cumsum(x, dim))
    assert "tl.associative_scan(" in f.source
    # a loop over column blocks (the looped form, or the columns form of a leading axis) carries
    assert ("carry" in f.source) == ("for c0 in range" in f.source)
    assert form.name == "single" or "carry" in f.source


def test_a_long_row_is_looped_with_a_carry():
    # 9000 columns: more than one tile holds, without forcing the looped form
    x = torch.randn(2, 9000)
    f, out = compile_without_fallbacks(lambda x: torch.cumsum(x, -1), x)
    torch.testing.assert_close(out, torch.cumsum(x, -1), atol=1e-3, rtol=1e-4)
    assert "for c0 in range(0, n_cols, BLOCK_C):" in f.source and "carry" in f.source


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_values_and_indices_are_one_scan(op, form):
    x = torch.tensor([[1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0] * 5, [2.0, 2.0, -INF, 1.0, 2.0, INF, 0.0] * 5])
    f, out = compile_without_fallbacks(lambda x: op(x, 1), x, form=form)
    assert_same(tuple(out), tuple(op(x, 1)))         # ties take the later index; NaN holds until the next NaN
    assert f.source.count("tl.associative_scan(") == 1
    assert f.plan.kinds() == ["reduction"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_logcumsumexp_infinities(dtype, form):
    x = torch.tensor([[-INF, -INF, 1.0, INF, 2.0, 3.0] * 4, [-INF] * 24, [0.5, INF, INF, -1.0, NAN, 2.0] * 4]).to(dtype)
    _, out = compile_without_fallbacks(lambda x: torch.logcumsumexp(x, 1), x, form=form)
    assert_same(out, torch.logcumsumexp(x, 1), torch.float16 if dtype == torch.float16 else torch.float32)


def test_cumprod_of_ints_wraps_as_eager(form):
    x = torch.randint(-9, 10, (3, 40), dtype=torch.int32)
    _, out = compile_without_fallbacks(lambda x: torch.cumprod(x, 1), x, form=form)
    assert torch.equal(out, torch.cumprod(x, 1))     # int64, wrapping on overflow like eager


def test_prologue_scan_epilogue_share_one_kernel(form):
    x, w = torch.randn(4, 33), torch.randn(33)
    fn = lambda x, w: torch.cumsum(x * w + 1.0, -1).sigmoid() * 2   # noqa: E731
    f, out = compile_without_fallbacks(fn, x, w, form=form)
    assert_same(out, fn(x, w))
    assert f.plan.kinds() == ["reduction"], f.plan


def test_a_scan_feeds_a_reduction_of_the_same_kernel(form):
    x = torch.randn(3, 45)
    fn = lambda x: (torch.cumsum(x, 1), torch.cumsum(x, 1).amax(1))   # noqa: E731
    f, out = compile_without_fallbacks(fn, x, form=form)
    assert_same(tuple(out), fn(x))
    assert f.plan.kinds() == ["reduction"], f.plan
    if form.name == "looped":    # the reduction's loop and the output loop each carry their own prefix
        assert f.source.count("carry") >= 4


def test_a_reduction_feeds_a_scan(form):
    x = torch.randn(5, 29)
    fn = lambda x: torch.cumsum(torch.softmax(x, -1), -1)   # noqa: E731
    f, out = compile_without_fallbacks(fn, x, form=form)
    assert_same(out, fn(x))
    assert f.plan.kinds() == ["reduction"], f.plan


def test_a_non_contiguous_scanned_axis(form):
    base = torch.randn(23, 6)
    x = base.t()                           # the scanned axis 1 has stride 6
    _, out = compile_without_fallbacks(lambda x: torch.cumsum(x, 1), x, form=form)
    assert_same(out, torch.cumsum(x, 1))
    y = torch.randn(6, 40)[:, ::3]         # strided along the scan
    _, out = compile_without_fallbacks(lambda y: torch.cummax(y, 1), y, form=form)
    assert_same(tuple(out), tuple(torch.cummax(y, 1)))


@pytest.mark.parametrize("shape, dim", [((), 0), ((), -1), ((0, 4), 0), ((3, 0), 1), ((1, 7), 0)])
def test_scans_of_0d_empty_and_size_1_axes(shape, dim):
    x = torch.randn(shape)
    for op in (torch.cumsum, torch.cumprod, torch.logcumsumexp):
        _, out = compile_without_fallbacks(lambda x: op(x, dim), x)
        assert_same(out, op(x, dim))
    _, out = compile_without_fallbacks(lambda x: torch.cummin(x, dim), x)
    assert_same(tuple(out), tuple(torch.cummin(x, dim)))


def test_a_scan_across_dims_out_of_range_is_eagers_error():
    with pytest.raises(Exception, match="[Dd]imension out of range"):
        minicomp.compile(lambda x: torch.cumsum(x, 2))(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="not implemented for 'Int'"):
        minicomp.compile(lambda x: torch.logcumsumexp(x, 0))(torch.ones(3, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_a_scan_of_a_constant_or_a_per_row_value(dtype, form):
    """OPT's position ids: cumsum of an all-ones mask the model built itself, which constant
    folding leaves as a literal (the scan was handed a Python number: Triton's interpreter
    and compiler reject that), and a scan of a value that varies by row only."""
    def positions(x):
        m = torch.ones(x.shape[0], x.shape[1], dtype=dtype)
        return (torch.cumsum(m, dim=1) * m - 1) + x

    def per_row(x, r):
        return torch.cumsum(r.expand(-1, x.shape[1]), dim=1) + x

    x = (torch.randn(3, 21) * 4).to(dtype)
    _, out = compile_without_fallbacks(positions, x, form=form)
    assert_same(out, positions(x))
    r = (torch.randn(3, 1) * 4).to(dtype)
    _, out = compile_without_fallbacks(per_row, x, r, form=form)
    assert_same(out, per_row(x, r))

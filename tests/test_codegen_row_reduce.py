"""The reductions added to row kernels: argmax/argmin with eager's ties and NaN, max.dim and
var_mean sharing one pass, prod/any/all, logsumexp (a 151,936-wide row among them), and the
reductions of 0-d, empty and size-1 domains."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same, compile_without_fallbacks, tol

import minicomp

NAN, INF = float("nan"), float("inf")


# rows: ties (first index wins), NaN (the first NaN is the max and the min), +-inf, all -inf
ROWS = torch.tensor([[1.0, 3.0, 3.0, 2.0, -1.0, 3.0] * 4,
                     [1.0, NAN, 5.0, NAN, 0.0, 1.0] * 4,
                     [-INF, -INF, -INF, -INF, -INF, -INF] * 4,
                     [0.0, INF, -INF, 2.0, INF, 1.0] * 4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int64])
def test_argmax_argmin_first_index_and_nan(dtype, form):
    x = ROWS.to(dtype) if dtype.is_floating_point else torch.randint(-2, 3, (4, 24), dtype=dtype)
    fn = lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.t().argmin(0), x.argmax(0, keepdim=True))  # noqa: E731
    _, out = compile_without_fallbacks(fn, x, form=form)
    for got, want in zip(out, fn(x), strict=True):
        assert torch.equal(got, want), (got, want)


def test_max_dim_values_and_indices_are_one_pass(form):
    x = ROWS
    f, out = compile_without_fallbacks(lambda x: torch.max(x, 1), x, form=form)
    assert_same(out, torch.max(x, 1))
    assert f.plan.kinds() == ["reduction"]
    assert f.source.count("tl.reduce(") == 1 and "_argmax_combine)" in f.source   # no second max


def test_aminmax_and_var_mean_share_one_kernel(form):
    x = torch.randn(6, 50)
    f, out = compile_without_fallbacks(lambda x: torch.aminmax(x, dim=1), x, form=form)
    assert_same(out, torch.aminmax(x, dim=1))
    assert f.plan.kinds() == ["reduction"]
    f, out = compile_without_fallbacks(lambda x: torch.var_mean(x, 1, correction=0), x, form=form)
    assert_same(out, torch.var_mean(x, 1, correction=0))
    assert f.plan.kinds() == ["reduction"]
    assert f.source.count("tl.sum(") == 2          # the mean's sum and the squares': var reuses the mean


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_prod_any_all_with_eagers_dtypes(dtype, form):
    gen = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        x = torch.rand(5, 30, generator=gen) > 0.2
    elif dtype.is_floating_point:
        x = (1 + 0.05 * torch.randn(5, 30, generator=gen)).to(dtype)
        x[1, 3] = 0.0
        x[2, 4] = NAN
    else:
        x = torch.randint(-3, 4, (5, 30), generator=gen, dtype=dtype)
    fn = lambda x: (x.prod(1), x.any(1), x.all(0), x.sum(1), x.prod())   # noqa: E731
    _, out = compile_without_fallbacks(fn, x, form=form)
    assert_same(out, fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_logsumexp_rows_with_infinities(dtype, form):
    x = ROWS.to(dtype) if dtype.is_floating_point else torch.randint(-3, 4, (4, 24), dtype=dtype)
    _, out = compile_without_fallbacks(lambda x: torch.logsumexp(x, 1), x, form=form)
    assert_same(out, torch.logsumexp(x, 1))      # +inf rows +inf, -inf rows -inf, NaN rows NaN; ints in fp32


def test_logsumexp_of_a_151936_wide_row_is_one_looped_pass():
    # a vocabulary-wide row (Qwen's 151,936 logits): a kernel, not a PyTorch call
    x = torch.randn(3, 151936) * 4
    x[1, 100_000] = INF
    x[2] = -INF
    f, out = compile_without_fallbacks(lambda x: torch.logsumexp(x, -1), x)
    assert_same(out, torch.logsumexp(x, -1))
    src = f.source
    assert "online logsumexp" in src and src.count("for c0 in range(0, n_cols, BLOCK_C):") == 1


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3.0, 0.5])
def test_vector_norm_every_ord(ord, form):
    x = torch.randn(4, 37, dtype=torch.float16)
    x[0, :5] = 0
    fn = lambda x: torch.linalg.vector_norm(x, ord, dim=1)  # noqa: E731
    f, out = compile_without_fallbacks(fn, x, form=form)
    assert_same(out, fn(x))
    assert f.plan.kinds() == ["reduction"]


def test_a_0d_tensor_reduces_to_itself():
    # x.mean(0) on a 0-d tensor crashed the plan report (issue 20): its row is one element
    x = torch.tensor(2.5)
    fn = lambda x: (x.mean(0), x.sum(-1), x.amax(0, keepdim=True), x.prod(0), x.argmax(0), x.any(0),  # noqa: E731
                    torch.logsumexp(x, 0), x.var(0), x.sum().mean(0))
    _, out = compile_without_fallbacks(fn, x)
    assert_same(out, fn(x))


def test_empty_rows_give_the_neutral_value():
    x = torch.randn(3, 0)
    fn = lambda x: (x.sum(1), x.prod(1), x.any(1), x.all(1), x.mean(1), torch.logsumexp(x, 1),  # noqa: E731
                    torch.linalg.vector_norm(x, dim=1), x.sum(0), x.t().sum(0))
    _, out = compile_without_fallbacks(fn, x)
    assert_same(out, fn(x))
    with pytest.raises(Exception, match="zero-size|non-zero size"):
        minicomp.compile(lambda x: x.amax(1))(x)       # no identity: eager's error
    with pytest.raises(Exception, match="non-zero size"):
        minicomp.compile(lambda x: x.argmax(1))(x)
    for y, dim in ((x, 1), (torch.randn(0, 0), 0), (torch.randn(0, 0), -1)):
        # an empty result too: aten's meta kernel of max.dim let it through, so it used to give empty tensors
        with pytest.raises(minicomp.errors.MinicompError, match="non-zero size"):
            minicomp.compile(lambda y: torch.max(y, dim))(y)
        with pytest.raises(minicomp.errors.MinicompError, match="non-zero size"):
            minicomp.compile(lambda y: torch.min(y * 2, dim, keepdim=True))(y)


def test_a_keepdim_reduction_over_a_size_1_axis_is_a_kernel():
    # its result has the domain's shape; it used to fall back ("read at another row")
    x = torch.randn(13, 1)
    fn = lambda x: (x.sum(-1, keepdim=True), *torch.max(x, 1, keepdim=True), torch.softmax(x, -1))  # noqa: E731
    _, out = compile_without_fallbacks(fn, x)
    assert_same(out, fn(x))


def test_var_of_ints_is_eagers_error():
    # eager refuses it; its meta kernel does not, and minicomp used to compute a kernel for it
    with pytest.raises(RuntimeError, match="floating point"):
        minicomp.compile(lambda x: torch.var(x, 1))(torch.ones(3, 4, dtype=torch.int32))


def test_max_dim_of_bool_gives_its_indices_from_the_kernel(form):
    # argmax refuses bool and max.dim does not: the indices used to stay a PyTorch call
    x = torch.rand(6, 29, generator=torch.Generator().manual_seed(5)) > 0.7
    x[2] = False                                   # all False: index 0, as eager
    x[3] = True                                    # all True: index 0
    fn = lambda x: (*torch.max(x, 1), *torch.min(x.t(), 0, keepdim=True))  # noqa: E731
    f, out = compile_without_fallbacks(fn, x, form=form)
    for got, want in zip(out, fn(x), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    assert f.plan.kinds() == ["reduction", "reduction"], f.plan    # one kernel per reduced domain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_nansum_and_count_nonzero(dtype, form):
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(5, 31, generator=gen) * (torch.rand(5, 31, generator=gen) < 0.4)).to(dtype)
    if dtype.is_floating_point:
        x[0, 3], x[1, :] = NAN, NAN                 # a row of NaN sums to 0
        x[2, 7] = INF
    fn = lambda x: (torch.nansum(x, 1), torch.count_nonzero(x, 0), torch.count_nonzero(x), torch.nansum(x))  # noqa: E731
    _, out = compile_without_fallbacks(fn, x, form=form)
    assert_same(out, fn(x))

"""Property tests of reductions and scans: random calls of each op, compiled, equal eager.

For every op of `reduction_cases.CASES` (sum ... logcumsumexp, 25 aten-level ops), each example
draws a call (`reduction_cases.draw`: rank 0-4, odd and zero sizes, every dtype eager accepts,
NaN/inf, transposed or strided inputs, negative and several axes, keepdim, a fused pointwise
prologue and epilogue) and checks that minicomp:
- gives eager's shape, dtype and values (tolerance by dtype; NaN where eager has NaN; indices
  exactly), from kernels only: no group runs through PyTorch;
- puts the op, its multi-output siblings and the fused prologue/epilogue in one row kernel;
- raises where eager raises (the dtypes eager refuses are tried too: mean of int, argmax of
  bool, logcumsumexp of int).
Examples alternate between the single-pass and the looped kernel form (16-wide column blocks,
so rows of a few dozen elements span several blocks and the scans carry between them).

Size: EXAMPLES per op in CI, derandomised (seeded by the op's name). MINICOMP_REDUCTION_EXAMPLES=N
runs N per op from a random seed, printed with every failure so it reproduces.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch
from conftest import LOOPED, tol
from reduction_cases import ALL, CASES, Example, draw

import minicomp

EXAMPLES = 6
ENV = os.environ.get("MINICOMP_REDUCTION_EXAMPLES")
SEED = int(os.environ.get("MINICOMP_REDUCTION_SEED", random.randrange(2**32) if ENV else 0))
COUNT = int(ENV) if ENV else EXAMPLES


def _tol(dtype: torch.dtype) -> dict:
    return dict(atol=1e-9, rtol=1e-7) if dtype == torch.float64 else tol(dtype)


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINICOMP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, b, equal_nan=True, **_tol(b.dtype))
    except AssertionError:
        return False
    return True


def _nearer(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor) -> bool:
    """`got` is as near `exact` (fp64) as eager's `want` is, to the dtype's tolerance."""
    exact = exact.to(got.dtype).double()
    if not torch.equal(got.isnan(), exact.isnan()):
        return False
    finite = exact.isfinite()
    if not torch.equal(got.double()[~finite & ~exact.isnan()], exact[~finite & ~exact.isnan()]):
        return False
    g, w, e = got.double()[finite], want.double()[finite], exact[finite]
    t = _tol(got.dtype)
    return bool(((g - e).abs() <= (w - e).abs() + t["atol"] + t["rtol"] * e.abs()).all())


def _flat(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check(ex: Example, looped: bool) -> str:
    """Compile and compare one example; returns "compared" or "eager error"."""
    fn = ex.fn()
    where = f"{ex.describe()} [{'looped' if looped else 'single'} form, seed {SEED}]"
    try:
        want = _flat(fn(ex.x))
    except (RuntimeError, IndexError, ValueError) as e:
        with pytest.raises(Exception):       # noqa: B017  (eager's error, however minicomp reports it)
            minicomp.compile(fn)(ex.x)
        return f"eager error ({type(e).__name__})"
    compiled = minicomp.compile(fn, row_form=LOOPED if looped else None)
    try:
        got = _flat(compiled(ex.x))
    except Exception as e:
        raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e
    c = compiled._need()
    assert len(got) == len(want), where
    if ex.case.name in ("var_mean", "std_mean") and ex.x.isinf().any():
        # eager's Welford mean turns NaN after an infinity that is not the row's last element
        # (torch.var_mean([inf, 1.]) is (nan, nan)); minicomp's is the mean, as torch.mean's
        x = ex.x * 2 if ex.fused else ex.x
        dim = ex.dim if ex.dim is not None else tuple(range(x.dim()))
        mean = x.mean(dim, keepdim=ex.keepdim) if x.dim() else x
        want[1] = mean + 1 if ex.fused else mean
    exact = None
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), where
        if w.dtype in (torch.float16, torch.bfloat16) and not _close(g, w):
            # eager's CPU kernels keep some half-precision running values in half (prod of bf16):
            # minicomp's fp32 accumulator may then be nearer the exact result than eager is
            exact = exact or _flat(fn(ex.x.double()))
            assert _nearer(g, w, exact[k]), f"{where}: neither eager's nor nearer the fp64 result"
            continue
        torch.testing.assert_close(g, w, equal_nan=True, **_tol(w.dtype), msg=lambda m: f"{where}\n{m}")
    assert not c.generated.fallbacks, f"{where}: {c.generated.fallbacks}\n{c.plan}"
    rows = [g for g in c.plan.groups if g.kind != "opaque"]
    if ex.x.numel() > 1:
        # an empty or one-element tensor saves no bytes by fusing: the planner may keep groups apart
        assert [g.kind for g in rows] == ["reduction"], f"{where}: one row kernel expected\n{c.plan}"
    return "compared"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_eager(case):
    rng = random.Random(SEED ^ zlib.crc32(case.name.encode()))
    outcomes: dict[str, int] = {}
    for i in range(COUNT):
        ex = draw(case, rng)
        outcome = _check(ex, looped=bool(i % 2))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"{case.name}: {COUNT} examples {outcomes}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dtypes_eager_refuses_are_refused(case):
    # one example per dtype eager does not accept for the op: minicomp raises too
    refused = [d for d in ALL if d not in case.dtypes]
    if not refused:
        pytest.skip("eager accepts every dtype")
    rng = random.Random(zlib.crc32(case.name.encode()))
    for dtype in refused:
        ex = draw(case, rng, dtype)
        outcome = _check(ex, looped=False)
        assert outcome.startswith("eager error"), f"{ex.describe()}: eager accepted it"

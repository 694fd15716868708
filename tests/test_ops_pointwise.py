"""The pointwise ops of issue 20 (tests/pointwise_cases.py) against eager PyTorch.

- `test_op_matches_eager`: every case on every dtype it applies to, captured from Python and
  compiled: an odd shape (5 x 7), the first operand transposed (non-contiguous), the others
  broadcast ([7] and [5, 1]), special values in every operand (NaN, +-inf, -0.0, branch
  boundaries, the integer extremes). Integers and bool must be bit-exact, floats within the
  dtype's tolerance (NaN where eager has NaN), and every group must be a kernel: no fallback
  to PyTorch, no opaque node.
- `test_ops_hold_for_random_inputs`: hypothesis over case, dtype, shape (zero-size, size-1 and
  odd dimensions, 0-d), layout (contiguous, transposed, a strided slice, a stride-0 expand) and
  values. 60 examples, derandomised; `MINICOMP_OPS_EXAMPLES=2000` draws that many at random.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import tol
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pointwise_cases import CASES, Case, operand

import minicomp

EXAMPLES = int(os.environ.get("MINICOMP_OPS_EXAMPLES", "60"))


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINICOMP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def tolerance(dtype: torch.dtype) -> dict:
    # fp64 kernels use the interpreter's libm (numpy), eager its own: a few ulp apart
    return dict(atol=1e-12, rtol=1e-9) if dtype == torch.float64 else tol(dtype)


def _outputs(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _closer_to_f64(case: Case, inputs: list[torch.Tensor], i: int, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Half types: kernels compute in fp32 and round once; eager may round every step (its strided
    batch norm does), so where they differ, the kernel's answer must be the nearer to fp64's."""
    if want.dtype not in (torch.float16, torch.bfloat16):
        return False
    wide = [t.double() if t.dtype.is_floating_point else t for t in inputs]
    ref = _outputs(case.fn(*wide))[i].to(want.dtype).double()
    g, w = got.double(), want.double()
    both_nan = torch.isnan(g) & torch.isnan(ref)
    return bool(((g - ref).abs() <= (w - ref).abs() + tol(want.dtype)["atol"])[~both_nan].all())


def check(case: Case, inputs: list[torch.Tensor]) -> None:
    """Compile `case.fn`, compare it with eager on `inputs`, and require kernels only."""
    want = _outputs(case.fn(*inputs))
    compiled = minicomp.compile(case.fn)
    got = _outputs(compiled(*inputs))
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"{case.name} output {i} on {[f'{t.dtype}{list(t.shape)}' for t in inputs]}"
        assert (g.shape, g.dtype) == (w.shape, w.dtype), where
        try:
            torch.testing.assert_close(g, w, equal_nan=True, **tolerance(w.dtype), msg=lambda m: f"{where}: {m}")
        except AssertionError:
            if not _closer_to_f64(case, inputs, i, g, w):
                raise
    # nothing runs through PyTorch (a reduction over an empty axis is a kernel too)
    fallbacks = list(compiled._need().generated.fallbacks.values())
    assert not fallbacks and "opaque" not in compiled.plan.kinds(), (case.name, fallbacks, compiled.plan.kinds())


def _dtype_of(domain: str, dtype: torch.dtype) -> torch.dtype:
    return torch.bool if domain == "bool" else dtype


SWEEP = [pytest.param(c, d, id=f"{c.name}-{str(d).replace('torch.', '')}") for c in CASES for d in c.dtypes]


@pytest.mark.parametrize("case, dtype", SWEEP)
def test_op_matches_eager(case: Case, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(len(case.name) * 31 + len(str(dtype)))
    last = 8 if case.last_even else 7
    shapes = [(5, last), (last,), (5, 1)]
    inputs = []
    for i, domain in enumerate(case.domains):
        shape = (last,) if case.stats and i else shapes[i]
        if i == 0:   # non-contiguous: the transpose of a [last, 5] tensor
            inputs.append(operand(shape[::-1], _dtype_of(domain, dtype), domain, gen).t())
        else:
            inputs.append(operand(shape, _dtype_of(domain, dtype), domain, gen))
    check(case, inputs)


# --------------------------------------------------------------------------- random inputs

DIMS = st.sampled_from([0, 1, 2, 3, 5, 7, 13, 33])


@st.composite
def examples(draw):
    case = draw(st.sampled_from(CASES))
    dtype = draw(st.sampled_from(case.dtypes))
    shape = tuple(draw(st.lists(DIMS, min_size=0, max_size=3)))
    if case.last_even:
        shape = shape[:-1] + (2 * max(shape[-1], 1),) if shape else (4,)
    if case.stats and len(shape) < 2:
        shape = (2, 3)
    layouts = []
    for i in range(case.arity):
        if case.stats and i:
            layouts.append(((shape[1],), draw(st.sampled_from(["contiguous", "strided"]))))
            continue
        # later operands broadcast: drop leading dims or set some to 1
        lead = draw(st.integers(0, len(shape)))
        s = shape if i == 0 else tuple(d if draw(st.booleans()) else 1 for d in shape[lead:])
        layouts.append((s, draw(st.sampled_from(["contiguous", "transposed", "strided", "expanded"]))))
    seed = draw(st.integers(0, 2**16))
    specials = draw(st.booleans())
    return case, dtype, layouts, seed, specials


def _laid_out(shape, layout: str, make) -> torch.Tensor:
    """A tensor of `shape` whose strides are `layout`'s (transposed and strided need rank >= 1)."""
    if layout == "transposed" and len(shape) >= 2:
        return make(shape[::-1]).permute(*reversed(range(len(shape))))
    if layout == "strided" and shape:
        return make(shape[:-1] + (2 * shape[-1] + 1,))[..., 1::2]
    if layout == "expanded" and shape:
        return make(shape[:-1] + (1,)).expand(shape)
    return make(shape)


@settings(max_examples=EXAMPLES, deadline=None, derandomize="MINICOMP_OPS_EXAMPLES" not in os.environ,
          database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(examples())
def test_ops_hold_for_random_inputs(example):
    case, dtype, layouts, seed, specials = example
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for domain, (shape, layout) in zip(case.domains, layouts):
        dt = _dtype_of(domain, dtype)
        inputs.append(_laid_out(shape, layout, lambda s: operand(s, dt, domain, gen, specials)))
    try:
        case.fn(*inputs)
    except (RuntimeError, ValueError, IndexError):
        return                  # eager has no answer for these operands (shapes that do not broadcast)
    check(case, inputs)

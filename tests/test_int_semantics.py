"""Integer and bool semantics, eager's errors, index remaps among their neighbours, and the
precision of the special functions where an absolute tolerance would hide an error.

- integer arithmetic wraps as eager's does, a Python scalar beside an integer tensor included
  (it is converted to the tensor's type first: `int8 * 300` multiplies by 44); `//` and `%`
  follow Python's signs; shifts past the width give eager's 0 or sign fill; bool `+` and `*`
  are "or" and "and"; integer powers wrap (the issue's `torch.pow(x, 87)` on int32). All
  bit-exact, all in kernels;
- calls eager refuses (an integer to a negative power, a constant zero divisor, a fill value or
  bound that does not fit the dtype) raise `MinicompError` at the user's line: capture may run
  on fake tensors, which do not check, and minicomp used to return garbage (int64 `x ** -1`);
- flip, roll and constant_pad are index remaps: they fuse into their readers' kernels;
- erfc, erfinv, expm1, log1p and fp64 tanh keep their relative precision in the tails.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.errors import MinicompError

I8, I16, I32, I64, U8 = torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8


def ints(dtype: torch.dtype, n: int = 64, seed: int = 0) -> torch.Tensor:
    """Integers of `dtype` over its whole range, its extremes first."""
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64)
    x[:5] = torch.tensor([info.min, info.max, 0, 1, info.min + 1 if info.min else 2])
    return x.to(dtype)


def exact(fn, *inputs) -> minicomp.CompiledFunction:
    """Compile fn: its results must equal eager's bit for bit, computed by kernels only."""
    compiled = minicomp.compile(fn)
    got, want = compiled(*inputs), fn(*inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        assert torch.equal(g, w), (g, w)
    assert not compiled._need().generated.fallbacks and "opaque" not in compiled.plan.kinds()
    return compiled


@pytest.mark.parametrize("fn, dtype", [
    (lambda a: a * 2**31, I32),                    # the crash: the literal did not fit int32
    (lambda a: a * 2**40 + 3, I32),
    (lambda a: a * 2**63 - 1, I64),
    (lambda a: (a * 300, a + 1000, a - 129), I8),
    (lambda a: (a - 300, a * -1, a + 256), U8),
    (lambda a: a * -70000, I16),
    (lambda a: (a < 300, a == 44, a >= -300), I8),  # comparisons convert the scalar too
    (lambda a: (a * a, -a, a.abs()), I32),
    (lambda a: (-a, a.abs(), a * 3 // 7), I8),
    (lambda a: torch.where(a > 0, a, -1) + torch.tensor(300, dtype=torch.int64), I8),   # a 0-d tensor
], ids=["i32-2**31", "i32-2**40", "i64-2**63", "i8-scalars", "u8-scalars", "i16", "i8-compare", "i32-square",
        "i8-neg-abs", "i8-0d-tensor"])
def test_integer_arithmetic_wraps_like_eager(fn, dtype):
    exact(fn, ints(dtype))


@pytest.mark.parametrize("dtype", [I8, I32, I64], ids=str)
def test_floor_division_and_remainder_follow_pythons_signs(dtype):
    a = torch.arange(-9, 10).repeat_interleave(8).to(dtype)
    b = torch.tensor([-4, -3, -2, -1, 1, 2, 3, 5]).repeat(19).to(dtype)
    info = torch.iinfo(dtype)
    exact(lambda a, b: torch.div(a, b, rounding_mode="trunc"), a, b)   # eager's INT_MIN / -1 is SIGFPE
    a = torch.cat([a, torch.tensor([info.min, info.min, info.max, info.min], dtype=dtype)])
    b = torch.cat([b, torch.tensor([-1, 1, -1, info.min], dtype=dtype)])   # INT_MIN // -1 overflows
    exact(lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="floor")), a, b)
    exact(lambda a: (a // 3, a % 3, a // -3, a % -3, torch.fmod(a, -3), a // -1, a % -1, a // 1), a)


@pytest.mark.parametrize("dtype", [I8, I32, I64, U8], ids=str)
def test_shifts_past_the_width_give_eagers_fill(dtype):
    bits = torch.iinfo(dtype).bits
    a = ints(dtype, 2 * bits + 6, seed=1)
    lo = -3 if dtype != U8 else 0
    n = torch.arange(lo, lo + a.numel()).to(dtype)                      # amounts up to twice the width
    exact(lambda a, n: (a << n, a >> n), a, n)
    exact(lambda a: (a << 3, a >> 3, a << (bits - 1), a >> bits, a << 2 * bits), a)


def test_bool_arithmetic_is_logic():
    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(5, 7, generator=g) > 0.5, torch.rand(7, generator=g) > 0.5
    exact(lambda a, b: (a + b, a * b, torch.maximum(a, b), torch.minimum(a, b), a & b | ~a, a ^ b, a + True), a, b)
    exact(lambda a: (a + 1, a * 3, torch.where(a, 2, -5)), a)          # bool with an int: int64


@pytest.mark.parametrize("fn, x", [
    (lambda a: torch.pow(a, 87), ints(I32)),      # the crash: float-only exp2/log2 on int32
    (lambda a: (a ** 63, a ** 2, a ** 0, a ** 1), ints(I64)),
    (lambda a: a ** 5, ints(I8)),
    (lambda a: (2 ** a, (-3) ** a), torch.arange(-2, 70)),
    (lambda a: torch.tensor(True) ** a, torch.arange(0, 9)),
    (lambda a: a ** 2, torch.tensor([True, False])),
], ids=["i32-87", "i64", "i8", "scalar-base", "bool-base", "bool-squared"])
def test_integer_powers_wrap_like_eager(fn, x):
    exact(fn, x)


def test_integer_tensor_powers_with_negative_exponents():
    a = torch.tensor([1, -1, 2, -2, 0, 3, -1, 7] * 3, dtype=I32)
    e = torch.tensor([-1, -3, -2, -1, 0, 5, -4, 31] * 3, dtype=I32)
    exact(torch.pow, a, e)                                               # eager: 1, +-1, else 0


# --------------------------------------------------------------------------- eager's errors

HERE = Path(__file__).name


@pytest.mark.parametrize("fn, inputs, words", [
    (lambda a: a ** -1, [torch.arange(1, 5)], "negative integer powers"),
    (lambda a: torch.pow(a, -2), [torch.arange(1, 5, dtype=I32)], "negative integer powers"),
    (lambda a: a ** 300, [torch.arange(1, 5, dtype=I8)], "does not fit torch.int8"),
    (lambda a: a // 0, [torch.arange(1, 5, dtype=I32)], "division by zero"),
    (lambda a: a % 0, [torch.arange(1, 5)], "division by zero"),
    (lambda a: torch.fmod(a, 0), [torch.arange(1, 5)], "division by zero"),
    (lambda a: torch.div(a, 0, rounding_mode="trunc"), [torch.arange(1, 5)], "division by zero"),
    (lambda a: a.clamp(max=300), [torch.arange(1, 5, dtype=I8)], "clamp max=300 does not fit"),
    (lambda a: a.masked_fill(a > 2, 300), [torch.arange(1, 5, dtype=I8)], "masked_fill value=300"),
    (lambda a: torch.where(a > 2, a, 2**40), [torch.arange(1, 5, dtype=I32)], "does not fit torch.int32"),
    (lambda a: F.pad(a, (1, 1), value=300), [torch.arange(1, 5, dtype=I8)], "constant_pad_nd value=300"),
    (lambda a: a + torch.full((4,), 300, dtype=I8), [torch.arange(1, 5, dtype=I8)], "fill value=300"),
    (lambda a: torch.add(a, a, alpha=300), [torch.arange(1, 5, dtype=I8)], "alpha=300"),
    (lambda a: torch.round(a, decimals=1), [torch.arange(1, 5, dtype=I32)], "NotImplementedError"),
    (lambda a: torch.lerp(a, a, 0.5), [torch.arange(1, 5, dtype=I8)], "NotImplementedError"),
    (lambda a: a.clamp(min=-1e5), [torch.ones(4, dtype=torch.float16)], "does not fit torch.float16"),
], ids=["i64-pow-neg", "i32-pow-neg", "i8-pow-300", "floordiv-0", "mod-0", "fmod-0", "trunc-0", "clamp-i8",
        "masked-fill-i8", "where-i32", "pad-i8", "full-i8", "alpha-i8", "round-int", "lerp-int", "clamp-f16"])
def test_calls_eager_refuses_raise_at_capture(fn, inputs, words):
    with pytest.raises(Exception):
        fn(*inputs)                                       # eager refuses it ...
    with pytest.raises(MinicompError) as e:
        minicomp.compile(fn)(*inputs)                     # ... and so does minicomp, at the user's line
    assert words in str(e.value) and HERE in str(e.value), str(e.value)


def test_integer_division_by_a_zero_element_divides_by_one():
    # eager raises on the CPU (ZeroDivisionError) and gives an unspecified value on CUDA; a kernel
    # cannot raise, so it divides by 1 there: a // 0 -> a, a % 0 -> 0, never undefined behaviour
    a, b = torch.arange(-4, 4, dtype=I32), torch.tensor([2, 0, -3, 0, 1, 0, 0, -1], dtype=I32)
    got = minicomp.compile(lambda a, b: (a // b, a % b, torch.fmod(a, b)))(a, b)
    ones = torch.where(b == 0, torch.ones_like(b), b)
    for g, w in zip(got, (a // ones, a % ones, torch.fmod(a, ones))):
        assert torch.equal(g, w)


# --------------------------------------------------------------------------- index remaps in kernels

@pytest.mark.parametrize("fn, shapes, kinds", [
    (lambda x: F.pad(x, (1, 2, 3, 0), value=-1.5) * 2 + 1, [(5, 7)], ["pointwise"]),
    (lambda x: torch.roll(x, (1, -9), (0, 1)) + torch.flip(x, [1]) * x, [(5, 7)], ["pointwise"]),
    (lambda x: torch.flip(x * 2, [0]).t() + F.pad(x, (-1, -2, 0, 0)).sum(), [(6, 9)], None),
    (lambda x: torch.softmax(torch.roll(x, 3, -1), -1), [(4, 33)], ["reduction"]),
    (lambda x, w: torch.flip(x, [0]) @ F.pad(w, (0, 0, 1, 1)), [(9, 12), (10, 5)], None),
    (lambda x: (torch.roll(x, 2), F.pad(x, (1, 1)), torch.flip(x, [0])), [(0, 7)], None),   # empty
    (lambda x: F.pad(x, (2, 1)) + 1, [(3, 0)], ["pointwise"]),                               # all padding
    (lambda x, m, v: F.relu(F.batch_norm(x, m, v, None, None, False)), [(2, 6, 5), (6,), (6,)], ["pointwise"]),
    (lambda x: F.glu(x * 3, -1) - 1, [(5, 8)], ["pointwise"]),
    (lambda x, t: F.mse_loss(torch.tanh(x), t), [(5, 37), (5, 37)], ["reduction"]),
], ids=["pad", "roll-flip", "flip-transposed", "roll-softmax", "flip-matmul", "empty", "pad-empty", "bn-relu",
        "glu", "mse"])
def test_index_remaps_and_composites_fuse_with_their_neighbours(fn, shapes, kinds):
    g = torch.Generator().manual_seed(5)
    inputs = [torch.rand(s, generator=g) + 0.1 for s in shapes]
    compiled = minicomp.compile(fn)
    got, want = compiled(*inputs), fn(*inputs)
    for a, b in zip(*((got, want) if isinstance(want, tuple) else ((got,), (want,)))):
        torch.testing.assert_close(a, b)
    assert not compiled._need().generated.fallbacks and "opaque" not in compiled.plan.kinds()
    if kinds is not None:
        assert compiled.plan.kinds() == kinds, str(compiled.plan)


def test_batch_norm_with_infinite_statistics_is_eagers_contiguous_answer():
    inf = float("inf")
    x = torch.tensor([[inf, 1.0, 2.0, 3.0, -inf, 0.5, -2.9]]).repeat(3, 1)
    mean = torch.tensor([inf, inf, 0.0, 1.0, 0.0, 0.0, -inf])
    var = torch.tensor([1.0, 1.0, inf, 0.0, 1.0, 1.0, 0.0])
    weight = torch.tensor([1.0, 2.0, 1.0, inf, 0.0, 1.0, -inf])
    bias = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, inf, -inf])
    fn = lambda *t: F.batch_norm(*t, training=False, eps=1e-3)  # noqa: E731
    got, want = minicomp.compile(fn)(x, mean, var, weight, bias), fn(x, mean, var, weight, bias)
    torch.testing.assert_close(got, want, equal_nan=True)


# --------------------------------------------------------------------------- precision in the tails

def _relative(fn, x: torch.Tensor, rtol: float) -> None:
    got, want = minicomp.compile(fn)(x), fn(x)
    finite = torch.isfinite(want) & (want != 0)
    rel = ((got - want).abs() / want.abs())[finite]
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(got[~finite], want[~finite])
    assert rel.max().item() <= rtol, (rel.max().item(), x[finite][rel.argmax()].item())


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 4e-6), (torch.float64, 2e-14)], ids=str)
def test_special_functions_keep_relative_precision(dtype, rtol):
    big = 9.0 if dtype == torch.float32 else 26.5                       # erfc(x) still a normal number
    _relative(torch.special.erfc, torch.linspace(-4, big, 997, dtype=dtype), rtol)
    eps = torch.finfo(dtype).eps
    near_one = 1 - torch.tensor([2.0 ** -k for k in range(1, -int(math.log2(eps)))], dtype=dtype)
    _relative(torch.erfinv, torch.cat([near_one, -near_one, torch.linspace(-0.99, 0.99, 301, dtype=dtype),
                                       torch.tensor([1e-30, 1e-8], dtype=dtype)]), 4 * rtol)
    tiny = torch.tensor([1e-30, -1e-20, 1e-10, -1e-7, 3e-5, 0.01, -0.3, 5.0, -20.0, 80.0], dtype=dtype)
    _relative(torch.expm1, tiny, rtol)
    _relative(torch.log1p, tiny[:-2].abs(), rtol)
    _relative(torch.tanh, tiny[:-1], rtol)

"""The pointwise ops of issue 20 as test cases: a function eager and minicomp both run, the
dtypes it applies to, and the domain each operand is drawn from.

`CASES` is what tests/test_ops_pointwise.py sweeps and samples. `operand(...)` makes one input:
random values of the domain with special values written over the first elements (NaN, +-inf,
-0.0, values on the boundaries of the op's branches; the integer extremes, -1, 0 and 1), so
every sweep meets them. A domain keeps an operand where eager has an answer (no integer
divisor 0, no negative integer exponent where eager raises).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
FLOATS = (F32, F16, BF16, F64)
INTS = (torch.int32, torch.int64, torch.int8)
ALL = FLOATS + INTS + (torch.bool,)
BITS = INTS + (torch.uint8, torch.bool)
SHIFTS = INTS + (torch.uint8,)


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., torch.Tensor]
    dtypes: tuple[torch.dtype, ...]
    domains: tuple[str, ...] = ("any",)      # one per tensor operand
    last_even: bool = False                  # glu halves the last dimension
    stats: bool = False                      # operands after the first are per-channel: [x.shape[1]]

    @property
    def arity(self) -> int:
        return len(self.domains)


def _special_floats(domain: str) -> list[float]:
    inf, nan = float("inf"), float("nan")
    return {"any": [nan, inf, -inf, -0.0, 0.0, 0.5, -0.5, -2.5, 3.0, 1e-30, -1e30],
            "nonzero": [nan, inf, -inf, -0.0, 0.0, 0.5, -2.5, 3.0, 1e-30],
            "pos": [nan, inf, 0.0, 1e-30, 1.0, 0.5],
            "unit": [nan, 1.0, -1.0, -0.0, 0.0, 0.999999, -0.5, 1.5],
            "prob": [nan, 0.0, 1.0, 1e-6, 0.999999, 0.5],
            "small": [nan, inf, -inf, -0.0, 0.0, 1.0, -1.0, -2.0, 0.5],
            "halves": [nan, inf, -inf, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5],
            "big": [nan, inf, -inf, -0.0, 125.0, -125.0, 0.005, 12.345, 1e4],
            "finite": [0.0, -0.0, 1e-30, 3.0],
            "finite_pos": [0.0, 1e-30, 3.0],
            "exp": [nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.0, 3.0, 0.5, -2.5]}[domain]


def _special_ints(domain: str, dtype: torch.dtype) -> list[int]:
    info = torch.iinfo(dtype)
    if domain in ("shift", "exp"):
        bits = info.bits
        return [0, 1, bits - 1, bits, bits + 1, 2 * bits] + ([-1, -3] if info.min < 0 else [])
    extremes = [info.min, info.max, info.min + 1, 1] + ([-1] if info.min < 0 else [])
    if domain == "nonzero":
        return extremes
    if domain == "small":
        return [0, 1, -1, 2, -2, 3] if info.min < 0 else [0, 1, 2, 3]
    return extremes + [0]


def _random(shape, dtype: torch.dtype, domain: str, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        if domain in ("pos", "finite_pos"):
            x = torch.rand(shape, generator=gen) * 4 + 0.01
        elif domain in ("unit", "prob"):
            x = torch.rand(shape, generator=gen) * (2 if domain == "unit" else 1) - (1 if domain == "unit" else 0)
        elif domain == "small":
            x = torch.randint(-3, 4, shape, generator=gen).float()
        elif domain == "halves":              # k + 0.5 and k: every tie of round-half-to-even
            x = torch.randint(-40, 40, shape, generator=gen) / 2.0
        elif domain == "big":
            x = torch.randn(shape, generator=gen) * 300
        else:
            x = torch.randn(shape, generator=gen) * 3
        return x.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = {"shift": (-3, 2 * info.bits + 3), "exp": (-2, 40), "small": (-4, 5), "pos": (1, 100)}.get(
        domain, (max(info.min, -1000), min(info.max, 1000)))
    lo = max(lo, info.min)
    x = torch.randint(lo, hi, shape, generator=gen)
    if domain == "nonzero":
        x = torch.where(x == 0, torch.ones_like(x), x)
    return x.to(dtype)


def operand(shape, dtype: torch.dtype, domain: str, gen: torch.Generator, specials: bool = True) -> torch.Tensor:
    """Random values of `domain` in `shape`, special values first (see the module docstring)."""
    x = _random(shape, dtype, domain, gen)
    if not specials or x.numel() == 0 or dtype == torch.bool:
        return x
    flat = x.flatten().clone()
    if dtype.is_floating_point:
        values = torch.tensor(_special_floats(domain)).to(dtype)
    else:
        values = torch.tensor(_special_ints(domain, dtype), dtype=torch.int64).to(dtype)
    n = min(len(values), flat.numel())
    flat[:n] = values[:n]
    return flat.reshape(x.shape)


def _where_scalar(c, x):
    return torch.where(c, x, 0.5 if x.dtype.is_floating_point else 3)


def _pad(x):
    return F.pad(x, (1, 2, 0, 1) if x.dim() >= 2 else (1, 2), value=True if x.dtype == torch.bool else 3)


def _bn(x, mean, var, weight, bias):
    return F.batch_norm(x, mean, var, weight, bias, training=False, eps=1e-3)


CASES: list[Case] = [
    # predicates and repairs
    Case("isnan", torch.isnan, ALL), Case("isinf", torch.isinf, ALL),
    Case("isfinite", torch.isfinite, (F32, F16, torch.int32, torch.bool)),
    Case("signbit", torch.signbit, ALL), Case("sign", torch.sign, ALL), Case("sgn", torch.sgn, (F32, torch.int32)),
    Case("nan_to_num", torch.nan_to_num, FLOATS + INTS),
    Case("nan_to_num_values", lambda x: torch.nan_to_num(x, 1.5, 100.0, -7.0), FLOATS),
    # special functions
    Case("expm1", torch.expm1, FLOATS + (torch.int32,)), Case("log1p", torch.log1p, FLOATS + (torch.int32,)),
    Case("log2", torch.log2, FLOATS + (torch.int64,)), Case("erfc", torch.special.erfc, FLOATS + (torch.int32,)),
    Case("erfinv", torch.erfinv, FLOATS, ("unit",)),
    Case("xlogy", torch.xlogy, FLOATS + (torch.int32,), ("any", "pos")),
    Case("xlogy_nan", torch.xlogy, (F32, F64), ("any", "any")),
    # rounding
    Case("floor", torch.floor, FLOATS + INTS), Case("ceil", torch.ceil, FLOATS + INTS),
    Case("trunc", torch.trunc, FLOATS + INTS), Case("frac", torch.frac, FLOATS),
    Case("round", torch.round, FLOATS + INTS), Case("round_halves", torch.round, FLOATS, ("halves",)),
    Case("round_2", lambda x: torch.round(x, decimals=2), (F32, F16, F64), ("big",)),
    Case("round_-1", lambda x: torch.round(x, decimals=-1), (F32, BF16, F64), ("big",)),
    # division
    Case("floor_divide", torch.floor_divide, FLOATS + INTS, ("any", "nonzero")),
    Case("remainder", torch.remainder, FLOATS + INTS, ("any", "nonzero")),
    Case("fmod", torch.fmod, FLOATS + INTS, ("any", "nonzero")),
    Case("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), (F32, torch.int64), ("any", "nonzero")),
    Case("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), FLOATS + INTS, ("any", "nonzero")),
    Case("floordiv_literal", lambda a: a // 7, (F32, F16) + INTS),
    Case("mod_literal", lambda a: a % -3, (F32, BF16) + INTS),
    Case("div_minus_one", lambda a: (a // -1, a % -1, torch.fmod(a, -1)), INTS),
    # binary selections
    Case("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), FLOATS + INTS, ("any", "any", "any")),
    Case("fmin", torch.fmin, FLOATS + INTS, ("any", "any")), Case("fmax", torch.fmax, FLOATS + INTS, ("any", "any")),
    Case("bool_arith", lambda a, b: (a + b, a * b, torch.maximum(a, b), torch.minimum(a, b)), (torch.bool,),
         ("any", "any")),
    Case("where_scalar", _where_scalar, FLOATS + INTS, ("bool", "any")),
    Case("where_scalars", lambda c: torch.where(c, 1.5, -2.0), (torch.bool,)),
    Case("masked_fill_tensor", lambda x, m: x.masked_fill(m, x.flatten()[-1]), ALL, ("any", "bool")),
    # bitwise and shifts
    Case("bitwise", lambda a, b: (a & b, a | b, a ^ b, ~a), BITS, ("any", "any")),
    Case("lshift", lambda a, b: a << b, SHIFTS, ("any", "shift")),
    Case("rshift", lambda a, b: a >> b, SHIFTS, ("any", "shift")),
    Case("shift_literals", lambda a: (a << 3, a >> 5, a << 70, a >> 70), SHIFTS),
    # powers
    Case("pow_2", lambda x: x ** 2, FLOATS + INTS), Case("pow_3", lambda x: torch.pow(x, 3), (F32, torch.int32)),
    Case("pow_87", lambda x: torch.pow(x, 87), FLOATS[:1] + (F64,) + INTS[:2], ("small",)),
    Case("pow_0", lambda x: x ** 0, (F32, F16, torch.int64)), Case("pow_-1", lambda x: x ** -1, FLOATS),
    Case("pow_-3", lambda x: x ** -3, (F32, F64)), Case("pow_half", lambda x: x ** 0.5, FLOATS),
    Case("pow_-half", lambda x: x ** -0.5, FLOATS), Case("pow_2.5", lambda x: x ** 2.5, FLOATS + (torch.int32,)),
    Case("pow_int_float", lambda x: x ** 2.0, (torch.int32, torch.int8)),
    Case("pow_tensor", torch.pow, FLOATS, ("small", "exp")),
    Case("pow_tensor_int", torch.pow, INTS, ("small", "exp")),
    Case("pow_scalar_base", lambda e: 2 ** e, INTS, ("exp",)),
    Case("pow_scalar_base_float", lambda e: 1.5 ** e, FLOATS, ("exp",)),
    # activations
    Case("elu", F.elu, FLOATS), Case("selu", F.selu, (F32, BF16)), Case("celu", lambda x: F.celu(x, 0.7), (F32, F64)),
    Case("leaky_relu", lambda x: F.leaky_relu(x, 0.2), FLOATS), Case("hardswish", F.hardswish, FLOATS),
    Case("hardsigmoid", F.hardsigmoid, FLOATS), Case("hardtanh", lambda x: F.hardtanh(x, -0.5, 2.0), FLOATS),
    Case("relu6", F.relu6, (F32, F16)), Case("softplus", lambda x: F.softplus(x, 2.0, 3.0), FLOATS),
    Case("mish", F.mish, FLOATS), Case("logit", torch.logit, FLOATS, ("prob",)),
    Case("logit_eps", lambda x: torch.logit(x, 1e-2), FLOATS, ("prob",)),
    Case("glu", F.glu, FLOATS, last_even=True),
    Case("lerp_scalar", lambda a, b: torch.lerp(a, b, 0.3), (F32, BF16), ("any", "any")),
    Case("lerp_tensor", torch.lerp, FLOATS, ("any", "any", "prob")),
    # index remaps and composites
    Case("flip", lambda x: torch.flip(x, list(range(x.dim()))) * 2 if x.dtype != torch.bool else x.flip(0), ALL),
    Case("roll", lambda x: torch.roll(x, [2, -3][: x.dim()], list(range(min(x.dim(), 2)))), ALL),
    Case("roll_flat", lambda x: torch.roll(x, 5), (F32, torch.int8, torch.bool)),
    Case("pad", _pad, ALL),
    # finite statistics: with an infinite one, eager's answer depends on the input's layout (its
    # contiguous kernel computes x * a + b, its strided one ((x - mean) * invstd) * w + b)
    Case("batch_norm", _bn, FLOATS, ("any", "finite", "finite_pos", "finite", "finite"), stats=True),
    Case("mse_loss", lambda a, b: F.mse_loss(a, b), FLOATS, ("any", "any")),
    Case("mse_loss_sum", lambda a, b: F.mse_loss(a, b, reduction="sum"), (F32, BF16), ("any", "any")),
    Case("l1_loss_none", lambda a, b: F.l1_loss(a, b, reduction="none"), (F32, F16), ("any", "any")),
    Case("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), FLOATS, ("any", "any")),
    Case("huber_loss_none", lambda a, b: F.huber_loss(a, b, reduction="none", delta=2.0), FLOATS, ("any", "any")),
]

"""Triton texts of what Triton has no instruction for: expm1, log1p, erfc, erfinv, rounding
half to even, powers, and integer division with floor semantics.

Each function takes operand texts already converted to the compute type of `dtype` (fp32 for
the half types), and most a `Let` to write steps with (a value used several times is named
once, so a form's text stays linear in size). They use only what Triton's compiler accepts
for that type: `tl.exp`, `tl.log`, `tl.erf`, `tl.floor` on fp32/fp64 only (integer paths
never call them), `tl.div_rn` on fp32 only, literals that take the tensor's type, and no
negative literal beside an unsigned tensor.

Accuracy, against PyTorch's CPU kernels:
- expm1 and log1p correct the rounding of `exp(x)` and `1 + x` (Kahan's forms), so they keep
  full relative precision near 0;
- erfc is `exp(-x*x) * erfcx(x)` for |x| >= 0.5, erfcx from a Chebyshev fit (`ERFCX`, made by
  scripts/fit_erfc.py: 2e-9 relative for fp32, 2e-15 for fp64) with `x*x` split so that its
  rounding does not reach the exponent; below 0.5 it is `1 - erf(x)`;
- erfinv refines a closed-form first guess with two Halley steps on erf (erfc where erf is
  near 1, so the residual there is not a difference of nearly equal numbers);
- rounding, powers with an integer exponent and integer division are exact.

Integer division truncates in Triton (C semantics; its interpreter emulates that), so floor
division and remainder correct the truncated result by the signs, as eager does. A zero
divisor in a tensor is replaced by 1 (eager raises ZeroDivisionError on the CPU; a kernel
cannot, and dividing by zero is undefined on the GPU), and -1 is taken apart (INT_MIN / -1
overflows).
"""

from __future__ import annotations

import math

import torch

from minicomp.ir.ops.text import Let, compute_tl, int_bits, int_literal

INF = "float('inf')"
NAN = "float('nan')"

# erfcx(x) * (x + 3) as a Chebyshev series in u = 7/6 t - 1/6, t = (x - 3) / (x + 3), x >= 0.5
ERFCX_K = 3.0
ERFCX_U = (1.1666666666666665, -0.16666666666666674)
ERFCX = {
    "fp32": (1.1524464011975493, -0.7520774257150903, 0.20027266807544397, -0.04260547909736578,
             0.006829504568671287, -0.000691318220450439, 5.638199110719509e-06, 1.1014269903382764e-05,
             -1.3559965890004847e-06, -1.0183016795639344e-07, 3.906429710119259e-08),
    "fp64": (1.1524464011975493, -0.7520774257150902, 0.20027266807544408, -0.042605479097365694,
             0.006829504568671478, -0.0006913182204503052, 5.638199110775985e-06, 1.1014269903492675e-05,
             -1.355996589163647e-06, -1.0183016741444732e-07, 3.9064296913386206e-08, -7.440365460047834e-12,
             -1.0252308460683492e-09, 3.8398954045140424e-11, 2.914901442500073e-11, -1.5756088687441039e-12,
             -9.359853492537473e-13, 4.564160846227261e-14, 3.345084139858119e-14, -6.400485509730751e-16,
             -1.2989353699355171e-15),
}


def is_f64(dtype: torch.dtype) -> bool:
    return compute_tl(dtype) == "tl.float64"


def unsigned(dtype: torch.dtype) -> bool:
    return dtype in (torch.uint8, torch.bool)


def fdiv(a: str, b: str, dtype: torch.dtype) -> str:
    """a / b correctly rounded (Triton's fp32 `/` is approximate on the GPU; fp64's is not)."""
    return f"({a} / {b})" if is_f64(dtype) else f"tl.div_rn({a}, {b})"


def ones_like(v: str, dtype: torch.dtype) -> str:
    """1 in the shape and compute type of `v` (for every value of v, NaN and inf included)."""
    return f"(tl.zeros_like({v}) + {'1.0' if dtype.is_floating_point else '1'})"


def signbit(v: str, dtype: torch.dtype) -> str:
    """True where the sign bit of `v` is set (-0.0 and -NaN included)."""
    if dtype.is_floating_point:
        bits = "tl.int64" if is_f64(dtype) else "tl.int32"
        return f"({v}.to({bits}, bitcast=True) < 0)"
    if unsigned(dtype):
        return f"({v} != {v})"
    return f"({v} < 0)"


def trunc(v: str) -> str:
    return f"tl.where({v} < 0, tl.ceil({v}), tl.floor({v}))"


def tanh(v: str) -> str:
    """tanh to fp32's precision (use `tanh_steps` where the type may be fp64)."""
    # 1 - 2 / (e^{2x} + 1): saturates to +-1 without overflow trouble; portable across Triton versions.
    # Near 0 it cancels (tanh(1e-7) came out 2e-7): below 0.2 the odd series to x^7 is within an ulp.
    sq = f"({v} * {v})"
    series = f"{v} * (1.0 + {sq} * (-0.3333333333333333 + {sq} * (0.13333333333333333 + {sq} * -0.05396825396825397)))"
    return f"tl.where(tl.abs({v}) < 0.2, {series}, 1.0 - 2.0 / (tl.exp(2.0 * {v}) + 1.0))"


def tanh_steps(let: Let, v: str, dtype: torch.dtype) -> str:
    """tanh in `dtype`'s precision: fp64 as expm1(2|x|) / (expm1(2|x|) + 2) (the fp32 series near 0
    is 2e-8 off in fp64), 1 beyond |x| = 20, where that quotient would be inf / inf."""
    if not is_f64(dtype):
        return tanh(v)
    a = let("ta", f"tl.abs({v})")
    e = expm1(let, let("t2", f"2.0 * {a}"))
    t = let("tpos", f"tl.where({a} > 20.0, 1.0, {e} / ({e} + 2.0))")
    return let("tanh", f"tl.where({v} < 0.0, -{t}, {t})")


# --------------------------------------------------------------------------- exp and log near 0

def expm1(let: Let, v: str) -> str:
    """exp(x) - 1: (u - 1) * x / log(u) with u = exp(x) rounded corrects u's rounding error."""
    u = let("u", f"tl.exp({v})")
    um1 = let("um1", f"{u} - 1.0")
    return let("expm1", f"tl.where({u} == 1.0, {v}, tl.where({um1} == -1.0, -1.0, "
                        f"tl.where({u} == {INF}, {u}, {um1} * {v} / tl.log({u}))))")


def log1p(let: Let, v: str) -> str:
    """log(1 + x): log(u) * x / (u - 1) with u = 1 + x rounded corrects u's rounding error."""
    u = let("u", f"1.0 + {v}")
    return let("log1p", f"tl.where({u} == 1.0, {v}, tl.where({v} == {INF}, {v}, "
                        f"tl.log({u}) * ({v} / ({u} - 1.0))))")


# --------------------------------------------------------------------------- erfc, erfinv

def _clenshaw(let: Let, u: str, coefs: tuple[float, ...]) -> str:
    """sum c_k T_k(u), by Clenshaw's recurrence."""
    b1 = let("b", repr(coefs[-1]))
    b2 = None
    for c in reversed(coefs[1:-1]):
        rest = f" - {b2}" if b2 is not None else ""
        b1, b2 = let("b", f"{c!r} + 2.0 * {u} * {b1}{rest}"), b1
    rest = f" - {b2}" if b2 is not None else ""
    return let("cheb", f"{coefs[0]!r} + {u} * {b1}{rest}")


def erfc(let: Let, v: str, dtype: torch.dtype) -> str:
    a = let("ax", f"tl.abs({v})")
    t = let("t", f"({a} - {ERFCX_K!r}) / ({a} + {ERFCX_K!r})")
    u = let("cu", f"{ERFCX_U[0]!r} * {t} + {ERFCX_U[1]!r}")
    p = _clenshaw(let, u, ERFCX["fp64" if is_f64(dtype) else "fp32"])
    # exp(-x*x) = exp(-hi*hi) * exp(-(x - hi) * (x + hi)): hi has few bits, so hi*hi is exact
    scale = 2.0 ** 20 if is_f64(dtype) else 16.0
    hi = let("hi", f"tl.floor({a} * {scale!r}) * {1 / scale!r}")
    tail = let("tail", f"tl.exp(-({hi} * {hi})) * tl.exp(-(({a} - {hi}) * ({a} + {hi}))) * {p} / ({a} + {ERFCX_K!r})")
    pos = let("erfc_pos", f"tl.where({a} < 0.5, 1.0 - tl.erf({a}), tl.where({a} == {INF}, 0.0, {tail}))")
    return let("erfc", f"tl.where({v} < 0.0, 2.0 - {pos}, {pos})")


WINITZKI = 0.147   # erf(x)^2 ~ 1 - exp(-x^2 (4/pi + a x^2) / (1 + a x^2)): invertible in closed form


def erfinv(let: Let, v: str, dtype: torch.dtype) -> str:
    a = let("a", f"tl.abs({v})")
    w = let("w", f"-tl.log((1.0 - {a}) * (1.0 + {a}))")          # -log(1 - a^2), exact near a = 1
    c = let("c", f"{2 / (math.pi * WINITZKI)!r} - 0.5 * {w}")
    guess = let("guess", f"tl.sqrt(tl.sqrt({c} * {c} + {w} * {1 / WINITZKI!r}) - {c})")
    # the closed form cancels near 0, where erfinv(a) ~ a sqrt(pi) / 2 is as close a start
    y = let("y", f"tl.where({a} < 0.1, {a} * {math.sqrt(math.pi) / 2!r}, {guess})")
    for _ in range(2):
        # Halley on f(y) = erf(y) - a: f' = 2/sqrt(pi) e^{-y^2}, f'' = -2y f', step n / (1 + y n), n = f / f'
        e = erfc(let, y, dtype)
        f = let("f", f"tl.where({a} < 0.5, tl.erf({y}) - {a}, (1.0 - {a}) - {e})")
        n = let("n", f"{f} * {math.sqrt(math.pi) / 2!r} * tl.exp({y} * {y})")
        y = let("y", f"{y} - {n} / (1.0 + {y} * {n})")
    r = let("r", f"tl.where({a} == 1.0, {INF}, tl.where({a} > 1.0, {NAN}, {y}))")
    return let("erfinv", f"tl.where({signbit(v, dtype)}, -{r}, {r})")


# --------------------------------------------------------------------------- rounding

def round_half_even(let: Let, v: str) -> str:
    """Nearest integer, ties to even, keeping the sign of zero (torch.round, C's nearbyint)."""
    f = let("fl", f"tl.floor({v})")
    d = let("d", f"{v} - {f}")                                    # exact: the fraction of v
    odd = f"({f} - 2.0 * tl.floor({f} * 0.5) == 1.0)"
    r = let("r", f"tl.where(({d} > 0.5) | (({d} == 0.5) & {odd}), {f} + 1.0, {f})")
    return let("rnd", f"tl.where({r} == 0.0, {v} * 0.0, {r})")


# --------------------------------------------------------------------------- powers

def int_power(let: Let, v: str, n: int, dtype: torch.dtype) -> str:
    """v ** n for a Python int n >= 0 by repeated squaring: exact for integers (wrapping as eager's
    does: the product mod 2**bits does not depend on the order), a few ulp for floats."""
    if n == 0:
        return ones_like(v, dtype)
    result, base = None, v
    while True:
        if n & 1:
            result = base if result is None else let("p", f"{result} * {base}")
        n >>= 1
        if not n:
            return result
        base = let("sq", f"{base} * {base}")


def pow_float(let: Let, x: str, y: str, dtype: torch.dtype) -> str:
    """x ** y for float tensors, with C's special cases: x**0 = 1 and 1**y = 1 (NaN included),
    negative x to an odd integer power is negative, to a non-integer power NaN, (-1)**inf = 1."""
    ax = let("ax", f"tl.abs({x})")
    r = let("r", f"tl.exp2({y} * tl.log2({ax}))")
    yint = let("yint", f"tl.floor({y}) == {y}")
    yodd = let("yodd", f"{yint} & ({y} - 2.0 * tl.floor({y} * 0.5) == 1.0)")
    r = let("r", f"tl.where({signbit(x, dtype)} & {yodd}, -{r}, {r})")
    r = let("r", f"tl.where(({x} < 0.0) & ({ax} != {INF}) & ({yint} == 0), {NAN}, {r})")
    r = let("r", f"tl.where(({ax} == 1.0) & (tl.abs({y}) == {INF}), 1.0, {r})")
    return let("pow", f"tl.where(({y} == 0.0) | ({x} == 1.0), 1.0, {r})")


def pow_float_scalar(let: Let, x: str, e: float, dtype: torch.dtype) -> str:
    """x ** e for a float tensor and a Python exponent."""
    if e == int(e) and abs(e) <= 64:
        p = int_power(let, x, int(abs(e)), dtype)
        return let("pow", fdiv("1.0", p, dtype)) if e < 0 else p
    if e in (0.5, -0.5) and dtype != torch.float16:
        # eager's sqrt and 1 / sqrt (so (-inf) ** 0.5 is NaN there, not C's inf); its f16 kernel
        # calls C's pow instead, which the general case below follows
        sqrt = let("sqrt", f"tl.sqrt({x})" if is_f64(dtype) else f"tl.sqrt_rn({x})")
        return sqrt if e > 0 else let("pow", fdiv("1.0", sqrt, dtype))
    ax = let("ax", f"tl.abs({x})")
    r = let("r", f"tl.exp2({e!r} * tl.log2({ax}))")
    if math.isinf(e):
        return let("pow", f"tl.where({ax} == 1.0, 1.0, {r})")
    if e == int(e):
        # an integer too large for repeated squaring: the sign comes from its parity
        return let("pow", f"tl.where({signbit(x, dtype)}, -{r}, {r})" if int(e) % 2 else r)
    # a negative base (finite) to a non-integer power is NaN; -0.0 and -inf are not NaN
    return let("pow", f"tl.where(({x} < 0.0) & ({ax} != {INF}), {NAN}, {r})")


def pow_int_tensor(let: Let, x: str, e: str, dtype: torch.dtype) -> str:
    """x ** e for integer tensors (both of `dtype`), as eager's: repeated squaring over every bit
    of e; a negative e gives 1 for x == 1, +-1 for x == -1 by parity, 0 otherwise."""
    bits = int_bits(dtype) - (0 if unsigned(dtype) else 1)
    p = ones_like(x, dtype)
    base, k = x, e
    for i in range(bits):
        p = let("p", f"tl.where(({k} & 1) != 0, {p} * {base}, {p})")
        if i < bits - 1:
            base = let("sq", f"{base} * {base}")
            k = let("k", f"{k} >> 1")
    if unsigned(dtype):
        return p
    neg = f"tl.where({x} == 1, {x}, tl.where({x} == -1, tl.where(({e} & 1) != 0, {x}, -{x}), {x} * 0))"
    return let("pow", f"tl.where({e} < 0, {neg}, {p})")


# --------------------------------------------------------------------------- integer division

def _int_divisor(let: Let, b: str, dtype: torch.dtype) -> tuple[str, int | None]:
    """The divisor to divide by (a tensor's zeros and -1s replaced by 1) and its value if a literal."""
    k = int_literal(b)
    if k is not None:
        return b, k
    if unsigned(dtype):
        return let("bs", f"tl.where({b} == 0, 1, {b})"), None
    return let("bs", f"tl.where(({b} == 0) | ({b} == -1), 1, {b})"), None


def int_div(let: Let, a: str, b: str, dtype: torch.dtype, mode: str) -> str:
    """a / b on integers, `mode` "floor" (floor_divide), "trunc" (C), "mod" (remainder: the sign
    of b) or "fmod" (C: the sign of a)."""
    bs, k = _int_divisor(let, b, dtype)
    if k == 0:
        raise ZeroDivisionError("integer division by zero")
    if k == -1 and not unsigned(dtype):
        return f"-{a}" if mode in ("floor", "trunc") else f"{a} * 0"
    if mode in ("floor", "trunc"):
        q = let("q", f"{a} // {bs}")
        if mode == "floor" and not unsigned(dtype):
            r = f"({a} - {q} * {bs})"
            if k is None:
                q = let("q", f"tl.where(({r} != 0) & (({r} < 0) != ({bs} < 0)), {q} - 1, {q})")
            else:
                q = let("q", f"tl.where({r} {'<' if k > 0 else '>'} 0, {q} - 1, {q})")
    else:
        q = let("r", f"{a} % {bs}")
        if mode == "mod" and not unsigned(dtype):
            if k is None:
                q = let("r", f"tl.where(({q} != 0) & (({q} < 0) != ({bs} < 0)), {q} + {bs}, {q})")
            else:
                q = let("r", f"tl.where({q} {'<' if k > 0 else '>'} 0, {q} + {bs}, {q})")
    if k is None and not unsigned(dtype):
        minus_one = f"-{a}" if mode in ("floor", "trunc") else f"{a} * 0"
        q = let("q", f"tl.where({b} == -1, {minus_one}, {q})")
    return q


def fmod(let: Let, a: str, b: str, dtype: torch.dtype) -> str:
    """C's fmod(a, b), exact where |a / b| < 2**24 (fp32; 2**53 fp64) on every target. Triton's float
    `%` is LLVM's frem, which NVPTX writes as a - b * trunc(a / b): a quotient that rounds up to an
    integer leaves a remainder of the wrong sign there. Here the quotient is truncated, the product
    taken off with one rounding (fma: the remainder is representable, so exact), and a quotient one
    too large (the only error a correctly rounded division can make) is undone. Larger quotients
    use `%` (exact in the interpreter; the GPU's frem is not)."""
    q = let("q", f"tl.div_rn({a}, {b})" if not is_f64(dtype) else f"({a} / {b})")
    q = let("qt", trunc(q))
    r = let("r", f"tl.fma(-{q}, {b}, {a})")
    step = f"tl.where(({a} < 0.0) != ({b} < 0.0), -{b}, {b})"
    r = let("r", f"tl.where(({r} != 0.0) & (({r} < 0.0) != ({a} < 0.0)), {r} + {step}, {r})")
    big = 2.0 ** (53 if is_f64(dtype) else 24)
    r = let("r", f"tl.where(tl.abs({q}) < {big!r}, {r}, {a} % {b})")
    r = let("r", f"tl.where((tl.abs({b}) == {INF}) & (tl.abs({a}) != {INF}), {a}, {r})")   # fmod(x, inf) = x
    return let("fmod", f"tl.where({r} == 0.0, {a} * 0.0, {r})")                            # the sign of a


def float_floor_div(let: Let, a: str, b: str, dtype: torch.dtype) -> str:
    """floor(a / b) as eager computes it: from fmod, so that the quotient of values that divide
    exactly is exact, then snapped to the nearest integer; a / b where b is 0."""
    mod = fmod(let, a, b, dtype)
    div = let("div", fdiv(f"({a} - {mod})", b, dtype))
    div = let("div", f"tl.where(({mod} != 0.0) & (({b} < 0.0) != ({mod} < 0.0)), {div} - 1.0, {div})")
    fl = let("fl", f"tl.floor({div})")
    fl = let("fl", f"tl.where({div} - {fl} > 0.5, {fl} + 1.0, {fl})")
    q = fdiv(a, b, dtype)
    return let("floordiv", f"tl.where({b} == 0.0, {q}, tl.where({div} == 0.0, {q} * 0.0, {fl}))")


def float_remainder(let: Let, a: str, b: str, dtype: torch.dtype) -> str:
    """a - b * floor(a / b) as eager computes it: fmod, moved to the sign of b."""
    mod = fmod(let, a, b, dtype)
    return let("rem", f"tl.where(({mod} != 0.0) & (({b} < 0.0) != ({mod} < 0.0)), {mod} + {b}, {mod})")

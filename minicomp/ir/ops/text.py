"""The spellings an op's Triton and PyTorch forms are written with: dtypes, literals, values.

These are text helpers with no state and no knowledge of kernels, so they live in the IR,
under the op table that uses them; `codegen/tlexpr.py` re-exports the Triton ones for the
emitters. `Unsupported` lives here too: an op's Triton form raises it for operands it has
no exact Triton text for, and codegen then runs the op's group through PyTorch.

Integer literals wrap to their dtype (`py_literal(300, torch.int8)` is `44`): a Python scalar
meets an integer tensor that way in eager (`int8 * 300` multiplies by 44), and Triton refuses
a literal outside the type it takes. Where eager raises instead (a fill value, a clamp bound
that does not fit), the frontend has raised before any text is written.

A form that needs a value more than once, or several steps, returns `Steps`: assignments that
become kernel lines of their own, so its text stays linear in size (an expression that names a
sub-expression twice doubles with every level it nests).

Invariant: every function returns a Python/Triton expression built only from the values it
is given as numbers, dtypes and operand texts; a string attribute (a user's label, say) only
ever becomes a quoted literal (`py_value`), never code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch


class Unsupported(Exception):
    """No generated kernel for this: the module wrapper runs the group through PyTorch instead."""


_TL = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# NaN in, NaN out, as torch.maximum/minimum/clamp/relu do (Triton's default drops NaN).
NAN_ALL = ", propagate_nan=tl.PropagateNan.ALL"


def storage_tl(dtype: torch.dtype) -> str:
    """The Triton type a tensor of `dtype` is stored as."""
    try:
        return _TL[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no Triton type") from None


def compute_tl(dtype: torch.dtype) -> str:
    """The Triton type a kernel holds `dtype` values in: fp32 for f16/bf16/f32."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return storage_tl(dtype)


def int_bits(dtype: torch.dtype) -> int:
    """Bit width of an integer dtype (bool: 1)."""
    return 1 if dtype == torch.bool else torch.iinfo(dtype).bits


def wrap_int(value: int, dtype: torch.dtype) -> int:
    """`value` converted to the integer `dtype` as C and eager convert it: modulo 2**bits."""
    info = torch.iinfo(dtype)
    span = 1 << info.bits
    return (int(value) - info.min) % span + info.min


def fits(value: Any, dtype: torch.dtype) -> bool:
    """Whether eager converts the Python scalar `value` to `dtype` without an overflow error
    (its fill values, clamp bounds, masked_fill values: a check eager makes, and wrapping does not)."""
    if dtype == torch.bool or dtype.is_complex or isinstance(value, bool) or isinstance(value, complex):
        return True
    if dtype.is_floating_point:
        v = float(value)
        return not math.isfinite(v) or abs(v) <= torch.finfo(dtype).max
    if isinstance(value, float) and not math.isfinite(value):
        return False
    info = torch.iinfo(dtype)
    return info.min <= int(value) <= info.max


def py_literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal of `value` as a value of `dtype` (inf/nan spelt so Triton parses them;
    integers wrapped to the dtype's range)."""
    if dtype == torch.bool:
        return "True" if bool(value) else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(v)
    if dtype.is_complex:
        return repr(value)        # never in a kernel: complex tensors have no Triton type
    v = wrap_int(int(value), dtype)
    # the most negative int64 is not a literal Python can write: -(2**63) parses as neg of an
    # int64-overflowing 2**63, which Triton refuses
    return f"({v + 1} - 1)" if v == torch.iinfo(torch.int64).min else str(v)


def int_literal(text: str) -> int | None:
    """The value of an integer literal text `py_literal` wrote (a form's operand), else None."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    m = re.fullmatch(r"\((-?\d+) - 1\)", t)
    return int(m.group(1)) - 1 if m else None


def zero_literal(dtype: torch.dtype) -> str:
    return py_literal(0, dtype)


def nan_arg(dtype: torch.dtype) -> str:
    """`NAN_ALL` for float dtypes (tl.maximum/minimum then keep NaN), else nothing."""
    return NAN_ALL if dtype.is_floating_point else ""


def py_value(v: Any) -> str:
    """Python source for an attribute value (dtypes, inf/nan floats, nested tuples)."""
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return f"float('{v}')"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(py_value(x) for x in v)
        return f"({inner},)" if isinstance(v, tuple) and len(v) == 1 else (f"({inner})" if isinstance(v, tuple) else f"[{inner}]")
    return repr(v)


def is_literal(text: str) -> bool:
    """Whether an operand text is a literal `py_literal` wrote (a number; Python's Triton frontend
    takes it as a scalar, which tl functions do not all accept), not a tensor's name or expression."""
    t = text.strip()
    return (t in ("True", "False") or int_literal(t) is not None
            or re.fullmatch(r"-?float\('(inf|nan)'\)", t) is not None
            or re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-?(inf|nan)", t) is not None)


def as_tensor(text: str, dtype: torch.dtype) -> str:
    """An operand text as a tensor of `dtype`'s compute type: a literal becomes a one-element tensor."""
    return f"tl.full([1], {text}, {compute_tl(dtype)})" if is_literal(text) else text


@dataclass(frozen=True)
class Steps:
    """A Triton form's text as steps: `lines` are `(name, expr)` assignments, `value` the result.

    Inside the texts `$name` refers to an earlier step; codegen gives each step a fresh kernel
    variable and substitutes it. Use `Let` to build one."""
    lines: tuple[tuple[str, str], ...]
    value: str


class Let:
    """Builds `Steps`: `u = let("u", "tl.exp(x)")` writes a step and returns the text naming it
    (`$u`; a name used again gets a suffix, so helpers can be called twice in one form)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, name: str, expr: str) -> str:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        used = {n for n, _ in self.lines}
        unique, k = name, 0
        while unique in used:
            k += 1
            unique = f"{name}_{k}"
        self.lines.append((unique, expr))
        return f"${unique}"

    def done(self, value: str) -> Steps:
        return Steps(tuple(self.lines), value)

"""The spellings an op's Triton and PyTorch forms are written with: dtypes, literals, values.

These are text helpers with no state and no knowledge of kernels, so they live in the IR,
under the op table that uses them; `codegen/tlexpr.py` re-exports the Triton ones for the
emitters. `Unsupported` lives here too: an op's Triton form raises it for operands it has
no exact Triton text for, and codegen then runs the op's group through PyTorch.

Invariant: every function returns a Python/Triton expression built only from the values it
is given as numbers, dtypes and operand texts; a string attribute (a user's label, say) only
ever becomes a quoted literal (`py_value`), never code.
"""

from __future__ import annotations

import math
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


def py_literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal of `value` as a value of `dtype` (inf/nan spelt so Triton parses them)."""
    if dtype == torch.bool:
        return "True" if bool(value) else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(v)
    return str(int(value))


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

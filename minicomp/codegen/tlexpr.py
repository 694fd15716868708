"""Triton text for one pointwise op over already-named operand values, with dtype rules.

Inside a kernel every value is held in its compute type: fp32 for f16/bf16/f32 (half
precision is widened on load and rounded only on store or by an explicit cast), fp64
for f64, and the storage type for integers and bool. Operands are converted to the
type the op computes in (PyTorch's promotion result, which inference already put on
the node), so `int / int` divides in fp32 and comparisons compare in the promoted type.

`Val.literal` marks a Python literal (a scalar constant or `full`): it broadcasts by
itself in binary ops but must become a tensor (`tl.full`) before a `tl.*` call or a store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minicomp.codegen.common import Unsupported
from minicomp.ir import ops
from minicomp.ir.graph import Node

_TL = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def storage_tl(dtype: torch.dtype) -> str:
    try:
        return _TL[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no Triton type") from None


def compute_tl(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return storage_tl(dtype)


def py_literal(value, dtype: torch.dtype) -> str:
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


@dataclass(frozen=True)
class Val:
    code: str                    # a variable name, or a literal when `literal`
    dtype: torch.dtype           # the node's dtype (values are held in compute_tl(dtype))
    syms: frozenset = frozenset()  # the index symbols it depends on; empty: scalar
    literal: bool = False
    value: object = None         # the Python value of a literal
    exact: bool = False          # already a value of `dtype` (a load, a cast), not an unrounded fp32 result


def convert(v: Val, dtype: torch.dtype) -> str:
    """Text of `v` held as `dtype`'s compute type."""
    if v.literal:
        return py_literal(v.value, dtype)
    if compute_tl(v.dtype) == compute_tl(dtype):
        return v.code
    if dtype == torch.bool:
        return f"({v.code} != 0)"
    return f"{v.code}.to({compute_tl(dtype)})"


def tensor_of(v: Val, dtype: torch.dtype) -> str:
    """Like `convert`, but a literal becomes a one-element tensor (broadcasts like a scalar)."""
    if v.literal:
        return f"tl.full([1], {py_literal(v.value, dtype)}, {compute_tl(dtype)})"
    return convert(v, dtype)


# Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so CPU
# kernels round through this helper, which the module defines when a kernel uses it.
ROUND_BF16_HELPER = '''\
@triton.jit
def _round_bf16(x):
    # fp32 -> nearest-even bf16 value, kept in fp32 (the interpreter's own cast truncates)
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)'''


def round_to(code: str, dtype: torch.dtype, cpu: bool) -> str:
    """Round an fp32 value to a half type and widen again, as an explicit cast does in eager."""
    if dtype == torch.bfloat16 and cpu:
        return f"_round_bf16({code})"
    if dtype in (torch.float16, torch.bfloat16):
        return f"{code}.to({storage_tl(dtype)}).to(tl.float32)"
    return code


def store_text(code: str, dtype: torch.dtype, cpu: bool, exact: bool = False) -> str:
    """An fp32 (compute type) value converted for storing as `dtype` (`exact`: already rounded)."""
    if storage_tl(dtype) == compute_tl(dtype):
        return code
    if dtype == torch.bfloat16 and cpu and not exact:
        return f"_round_bf16({code}).to(tl.bfloat16)"
    return f"{code}.to({storage_tl(dtype)})"


# tl.max / tl.min combine with maxnum/minnum, which drop NaN; torch.amax/amin propagate it.
# Row kernels reduce floats through these instead (the module defines them when used).
NAN_REDUCE_HELPERS = '''\
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)'''
# NaN in, NaN out, as torch.maximum/minimum/clamp/relu do (Triton's default drops NaN).
NAN_ALL = ", propagate_nan=tl.PropagateNan.ALL"

ARITH = ("add", "sub", "mul", "div", "maximum", "minimum")
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "sigmoid", "silu")


def op_text(node: Node, args: list[Val], cpu: bool) -> str:
    """Triton text computing `node` from its operand values (in its compute type)."""
    op, dt, a = node.op, node.dtype, node.attrs
    d = ops.get(op)
    if op in ARITH:
        if dt == torch.bool:
            raise Unsupported(f"{op} on bool tensors")
        x, y = (convert(v, dt) for v in args)
        if all(v.literal for v in args):
            x = tensor_of(args[0], dt)
        if op in ("maximum", "minimum") and dt.is_floating_point:
            return f"tl.{op}({x}, {y}{NAN_ALL})"
        return d.triton.format(x, y)
    if op in ops.COMPARISONS:
        common = torch.promote_types(args[0].dtype, args[1].dtype)
        x, y = (convert(v, common) for v in args)
        if all(v.literal for v in args):
            x = tensor_of(args[0], common)
        return d.triton.format(x, y)
    if op in ("logical_and", "logical_or"):
        x, y = (tensor_of(v, torch.bool) for v in args)
        return d.triton.format(x, y)
    if op == "logical_not":
        return f"{tensor_of(args[0], args[0].dtype)} == 0"
    if op in FLOAT_UNARY:
        return d.triton.format(tensor_of(args[0], dt))
    x = tensor_of(args[0], dt) if args else ""
    if op == "neg":
        return f"-{x}"
    if op == "abs":
        return f"tl.abs({x})"
    if op == "relu":
        return f"tl.maximum({x}, {zero_literal(dt)}{NAN_ALL if dt.is_floating_point else ''})"
    if op == "tanh":
        # 1 - 2 / (e^{2x} + 1): saturates to +-1 without overflow trouble; portable across Triton versions.
        # Near 0 it cancels (tanh(1e-7) came out 2e-7): below 0.2 the odd series to x^7 is within an ulp.
        sq = f"({x} * {x})"
        series = f"{x} * (1.0 + {sq} * (-0.3333333333333333 + {sq} * (0.13333333333333333 + {sq} * -0.05396825396825397)))"
        return f"tl.where(tl.abs({x}) < 0.2, {series}, 1.0 - 2.0 / (tl.exp(2.0 * {x}) + 1.0))"
    if op == "gelu":
        if a["approximate"] == "tanh":
            inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
            return f"0.5 * {x} * (2.0 - 2.0 / (tl.exp(2.0 * ({inner})) + 1.0))"
        return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"
    if op == "pow":
        return _pow_text(x, float(a["exponent"]))
    if op == "clamp":
        out, nan = x, NAN_ALL if dt.is_floating_point else ""
        if a["min"] is not None:
            out = f"tl.maximum({out}, {py_literal(a['min'], dt)}{nan})"
        if a["max"] is not None:
            out = f"tl.minimum({out}, {py_literal(a['max'], dt)}{nan})"
        return out
    if op == "where":
        c = tensor_of(args[0], torch.bool)
        return f"tl.where({c}, {convert(args[1], dt)}, {convert(args[2], dt)})"
    if op == "cast":
        return cast_text(args[0], dt, cpu)
    raise Unsupported(f"no Triton form for op {op!r} ({node.describe()})")


def cast_text(v: Val, dtype: torch.dtype, cpu: bool) -> str:
    """An explicit cast: to bool compares with 0; to a half type rounds (then widens back)."""
    if v.literal:
        return f"tl.full([1], {py_literal(v.value, dtype)}, {compute_tl(dtype)})"
    if dtype == torch.bool:
        return f"{v.code} != 0"
    src = v.code
    if v.dtype in (torch.float16, torch.bfloat16) and v.dtype != dtype and not v.exact:
        # a half-typed intermediate is held unrounded; eager would have rounded it before this cast
        src = round_to(src, v.dtype, cpu)
    text = src if compute_tl(v.dtype) == compute_tl(dtype) else f"{src}.to({compute_tl(dtype)})"
    if dtype in (torch.float16, torch.bfloat16) and v.dtype != dtype:
        text = round_to(text, dtype, cpu)
    return text


def _pow_text(x: str, e: float) -> str:
    if e == int(e) and abs(e) <= 4:
        n = int(abs(e))
        if n == 0:
            return f"tl.full([1], 1.0, tl.float32) + 0.0 * {x}"
        prod = " * ".join([x] * n)
        return f"1.0 / ({prod})" if e < 0 else prod
    if e == 0.5:
        return f"tl.sqrt_rn({x})"
    if e == int(e):
        # odd/even integer powers keep the sign rule of a real power of a negative base
        mag = f"tl.exp2({e!r} * tl.log2(tl.abs({x})))"
        return mag if int(e) % 2 == 0 else f"tl.where({x} < 0, -{mag}, {mag})"
    # x^e = 2^(e*log2 x): NaN for x < 0, 0 or inf for x == 0, as torch.pow
    return f"tl.exp2({e!r} * tl.log2({x}))"

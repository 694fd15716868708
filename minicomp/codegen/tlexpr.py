"""Triton text for one pointwise op over already-named operand values, with dtype rules.

Inside a kernel every value is held in its compute type: fp32 for f16/bf16/f32 (half
precision is widened on load and rounded only on store or by an explicit cast), fp64
for f64, and the storage type for integers and bool. Operands are converted to the
type the op computes in (PyTorch's promotion result, which inference already put on
the node), so `int / int` divides in fp32 and comparisons compare in the promoted type.

What an op computes is the op table's (`minicomp/ir/ops`): `op_text` converts the operand
values as the op's entry asks (`OpDef.operands`) and hands the texts to its Triton form. A
form answers with one expression or with `Steps` (assignments, then a value), which the
lowering writes as lines of their own. Only `cast` is written here, since rounding depends
on how a value is held (`Val.exact`).

`Val.literal` marks a Python literal (a scalar constant or `full`): it broadcasts by
itself in binary ops but must become a tensor (`tl.full`) before a `tl.*` call or a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minicomp.codegen.common import Unsupported
from minicomp.ir import ops
from minicomp.ir.graph import Node
from minicomp.ir.ops.rules import result_type
# the dtype and literal spellings are the op table's; emitters import them from here
from minicomp.ir.ops.text import NAN_ALL, Steps, compute_tl, py_literal, storage_tl, zero_literal

__all__ = ["NAN_ALL", "Steps", "Val", "cast_text", "compute_tl", "convert",
           "op_text", "py_literal", "round_to", "storage_tl", "store_text", "tensor_of", "zero_literal"]


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


# Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so CPU kernels
# round through `_round_bf16` (minicomp/runtime/kernel_lib.py, imported by every module).
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


def _operand_texts(how: str, args: list[Val], dtype: torch.dtype, ranks: Sequence[int]) -> list[str]:
    """The operand texts an op's Triton form takes, converted as its entry says (`ops.OPERANDS`)."""
    if how == "bool":
        return [tensor_of(v, torch.bool) for v in args]
    if how == "own":
        return [tensor_of(v, v.dtype) for v in args]
    if how == "tensors":
        return [tensor_of(v, dtype) for v in args]
    if how == "cond":
        return [tensor_of(args[0], torch.bool)] + [convert(v, dtype) for v in args[1:]]
    if how == "promoted":
        # PyTorch's promotion: a 0-d operand decides only by a higher category, and a Python scalar
        # (a 0-d literal) ranks below a 0-d tensor (`int8[] < 300` compares in int8)
        dtype = result_type(*[((1,) * r, v.dtype) for v, r in zip(args, ranks) if r or not v.literal],
                            wrapped=[v.dtype for v, r in zip(args, ranks) if not r and v.literal])
    texts = [convert(v, dtype) for v in args]
    if args and all(v.literal for v in args):
        texts[0] = tensor_of(args[0], dtype)   # one literal must be a tensor for the result to be one
    return texts


def op_text(node: Node, args: list[Val], cpu: bool, ranks: Sequence[int] | None = None) -> str | Steps:
    """Triton text computing `node` from its operand values (in its compute type): one
    expression, or `Steps` when the op's form needs temporaries. `ranks` are the operands'
    ranks (a 0-d operand promotes less); None: all dimensioned."""
    d = ops.get(node.op)
    if d.emitter == "cast":
        return cast_text(args[0], node.dtype, cpu)
    if d.triton is None:
        raise Unsupported(f"no Triton form for op {node.op!r} ({node.describe()})")
    # "own" operands keep their dtypes: the form is told the first one's (isnan of f64 bitcasts as 64 bits)
    dtype = args[0].dtype if d.operands == "own" and args else node.dtype
    ranks = [1] * len(args) if ranks is None else ranks
    return d.triton_text(_operand_texts(d.operands, args, node.dtype, ranks), dtype, node.attrs)


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

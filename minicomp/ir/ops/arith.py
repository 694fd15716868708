"""Binary pointwise ops: arithmetic, maximum/minimum, comparisons, logical and/or.

Operands broadcast and promote as in PyTorch (the shape rules and `ref` say so); codegen
converts both operands to the type the op computes in before the Triton form sees them:
the result type for arithmetic (`int / int` is a float division: inference made the node
float), the promoted operand type for comparisons, bool for logical ops.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir.ops import OpDef, TritonForm, register
from minicomp.ir.ops.rules import LOGICAL, SAME_FLOAT, TO_BOOL
from minicomp.ir.ops.text import Unsupported, nan_arg


def _arith(name: str, template: str) -> TritonForm:
    """`template` over the operands, refused on bool (Triton's int1 arithmetic is not PyTorch's)."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        if dtype == torch.bool:
            raise Unsupported(f"{name} on bool tensors")
        return template.format(*x)
    return form


def _extremum(name: str) -> TritonForm:
    """tl.maximum/minimum, keeping NaN for floats as torch.maximum/minimum do."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        if dtype == torch.bool:
            raise Unsupported(f"{name} on bool tensors")
        return f"tl.{name}({x[0]}, {x[1]}{nan_arg(dtype)})"
    return form


def binary(name: str, ref, triton, *, aten: tuple[str, ...], commutative: bool = False, shape=SAME_FLOAT,
           operands: str = "result") -> OpDef:
    """A binary pointwise op whose PyTorch text is `torch.<name>(a, b)`."""
    return register(OpDef(name, "pointwise", ref, arity=2, commutative=commutative, triton=triton, shape=shape,
                          operands=operands, pytorch=f"torch.{name}({{0}}, {{1}})", aten=aten))


# alpha (add, sub), rsub, rounding modes (div), reciprocal and square have handlers in frontend/fx_ops.py
binary("add", torch.add, _arith("add", "{0} + {1}"), commutative=True, aten=("add.Tensor", "add.Scalar"))
binary("sub", torch.sub, _arith("sub", "{0} - {1}"),
       aten=("sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar"))
binary("mul", torch.mul, _arith("mul", "{0} * {1}"), commutative=True,
       aten=("mul.Tensor", "mul.Scalar", "square.default"))
binary("div", torch.div, _arith("div", "{0} / {1}"),
       aten=("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode", "reciprocal.default"))
binary("maximum", torch.maximum, _extremum("maximum"), commutative=True, aten=("maximum.default", "max.other"))
binary("minimum", torch.minimum, _extremum("minimum"), commutative=True, aten=("minimum.default", "min.other"))

# comparisons compare in the promoted operand type; the result is bool
binary("eq", torch.eq, "{0} == {1}", commutative=True, shape=TO_BOOL, operands="promoted",
       aten=("eq.Tensor", "eq.Scalar"))
binary("ne", torch.ne, "{0} != {1}", commutative=True, shape=TO_BOOL, operands="promoted",
       aten=("ne.Tensor", "ne.Scalar", "logical_xor.default", "bitwise_xor.Tensor", "bitwise_xor.Scalar"))
binary("lt", torch.lt, "{0} < {1}", shape=TO_BOOL, operands="promoted", aten=("lt.Tensor", "lt.Scalar"))
binary("le", torch.le, "{0} <= {1}", shape=TO_BOOL, operands="promoted", aten=("le.Tensor", "le.Scalar"))
binary("gt", torch.gt, "{0} > {1}", shape=TO_BOOL, operands="promoted", aten=("gt.Tensor", "gt.Scalar"))
binary("ge", torch.ge, "{0} >= {1}", shape=TO_BOOL, operands="promoted", aten=("ge.Tensor", "ge.Scalar"))

# truth values; the bitwise spellings lower here only for bool tensors (fx_ops.py)
binary("logical_and", torch.logical_and, "{0} & {1}", commutative=True, shape=LOGICAL, operands="bool",
       aten=("logical_and.default", "bitwise_and.Tensor", "bitwise_and.Scalar"))
binary("logical_or", torch.logical_or, "{0} | {1}", commutative=True, shape=LOGICAL, operands="bool",
       aten=("logical_or.default", "bitwise_or.Tensor", "bitwise_or.Scalar"))

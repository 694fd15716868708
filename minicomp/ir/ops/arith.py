"""Binary pointwise ops: arithmetic, maximum/minimum, fmin/fmax, comparisons, logical and/or.

Operands broadcast and promote as in PyTorch (the shape rules and `ref` say so); codegen
converts both operands to the type the op computes in before the Triton form sees them:
the result type for arithmetic (`int / int` is a float division: inference made the node
float), the promoted operand type for comparisons, bool for logical ops.

Integer arithmetic wraps, in Triton as in eager; a Python scalar beside an integer tensor is
wrapped to its type first (text.py `py_literal`), as eager converts it. On bool tensors eager's
`+` is "or", `*` is "and", maximum "or" and minimum "and" (`-` and negation raise there).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir.ops import OpDef, TritonForm, register
from minicomp.ir.ops.rules import LOGICAL, SAME_FLOAT, TO_BOOL
from minicomp.ir.ops.text import Unsupported, nan_arg


# what eager's arithmetic is on bool tensors (Triton's int1 `+` would wrap: True + True = False)
_BOOL = {"add": "{0} | {1}", "mul": "{0} & {1}", "maximum": "{0} | {1}", "minimum": "{0} & {1}"}


def _arith(name: str, template: str) -> TritonForm:
    """`template` over the operands; on bool, eager's meaning of the op (or refused)."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        if dtype == torch.bool:
            if name not in _BOOL:
                raise Unsupported(f"{name} on bool tensors")
            return _BOOL[name].format(*x)
        return template.format(*x)
    return form


def _extremum(name: str) -> TritonForm:
    """tl.maximum/minimum, keeping NaN for floats as torch.maximum/minimum do."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        if dtype == torch.bool:
            return _BOOL[name].format(*x)
        return f"tl.{name}({x[0]}, {x[1]}{nan_arg(dtype)})"
    return form


def _nan_ignoring(name: str) -> TritonForm:
    """fmin/fmax: like minimum/maximum, but a NaN loses to a number (C's fmin/fmax)."""
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        a, b = x
        if dtype == torch.bool:
            return _BOOL[name[1:] + "imum"].format(a, b)
        if not dtype.is_floating_point:
            return f"tl.{name[1:]}imum({a}, {b})"
        return f"tl.where({a} != {a}, {b}, tl.where({b} != {b}, {a}, tl.{name[1:]}imum({a}, {b})))"
    return form


def binary(name: str, ref, triton, *, aten: tuple[str, ...], commutative: bool = False, shape=SAME_FLOAT,
           operands: str = "result") -> OpDef:
    """A binary pointwise op whose PyTorch text is `torch.<name>(a, b)`."""
    return register(OpDef(name, "pointwise", ref, arity=2, commutative=commutative, triton=triton, shape=shape,
                          operands=operands, pytorch=f"torch.{name}({{0}}, {{1}})", aten=aten))


# alpha (add, sub), rsub, reciprocal and square have handlers in frontend/fx_ops.py; div's rounding
# modes are a composite (composite.py: floor_divide or div_trunc, rounding.py)
binary("add", torch.add, _arith("add", "{0} + {1}"), commutative=True, aten=("add.Tensor", "add.Scalar"))
binary("sub", torch.sub, _arith("sub", "{0} - {1}"),
       aten=("sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar"))
binary("mul", torch.mul, _arith("mul", "{0} * {1}"), commutative=True,
       aten=("mul.Tensor", "mul.Scalar", "square.default"))
binary("div", torch.div, _arith("div", "{0} / {1}"), aten=("div.Tensor", "div.Scalar", "true_divide.Tensor", "true_divide.Scalar",
                                                                     "reciprocal.default"))
binary("maximum", torch.maximum, _extremum("maximum"), commutative=True, aten=("maximum.default", "max.other"))
binary("minimum", torch.minimum, _extremum("minimum"), commutative=True, aten=("minimum.default", "min.other"))
binary("fmax", torch.fmax, _nan_ignoring("fmax"), commutative=True, aten=("fmax.default",))
binary("fmin", torch.fmin, _nan_ignoring("fmin"), commutative=True, aten=("fmin.default",))

# comparisons compare in the promoted operand type; the result is bool
binary("eq", torch.eq, "{0} == {1}", commutative=True, shape=TO_BOOL, operands="promoted",
       aten=("eq.Tensor", "eq.Scalar"))
binary("ne", torch.ne, "{0} != {1}", commutative=True, shape=TO_BOOL, operands="promoted",
       aten=("ne.Tensor", "ne.Scalar", "logical_xor.default"))
binary("lt", torch.lt, "{0} < {1}", shape=TO_BOOL, operands="promoted", aten=("lt.Tensor", "lt.Scalar"))
binary("le", torch.le, "{0} <= {1}", shape=TO_BOOL, operands="promoted", aten=("le.Tensor", "le.Scalar"))
binary("gt", torch.gt, "{0} > {1}", shape=TO_BOOL, operands="promoted", aten=("gt.Tensor", "gt.Scalar"))
binary("ge", torch.ge, "{0} >= {1}", shape=TO_BOOL, operands="promoted", aten=("ge.Tensor", "ge.Scalar"))

# truth values (the bitwise spellings are bitwise.py's, for bool and integer tensors alike)
binary("logical_and", torch.logical_and, "{0} & {1}", commutative=True, shape=LOGICAL, operands="bool",
       aten=("logical_and.default",))
binary("logical_or", torch.logical_or, "{0} | {1}", commutative=True, shape=LOGICAL, operands="bool",
       aten=("logical_or.default",))

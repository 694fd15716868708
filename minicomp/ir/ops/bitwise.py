"""Bitwise ops and shifts on integer and bool tensors.

Operands arrive in the result type (PyTorch's promotion: `int8 & int64` is int64, a bool with
an int is that int). Shifts follow eager's kernels rather than C's undefined behaviour: a
left shift by a negative amount or by at least the width gives 0; a right shift by such an
amount fills with the sign (0 or -1; 0 for unsigned types). Triton's shifts of a width or
more are undefined on the GPU, so the amount is kept in range before shifting.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir.ops import OpDef, TritonForm, register
from minicomp.ir.ops.mathtext import unsigned
from minicomp.ir.ops.text import Let, Unsupported, int_bits, int_literal


def _no_floats(name: str, dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        raise Unsupported(f"{name} on {dtype} tensors")


def _bitwise(name: str, op: str) -> TritonForm:
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
        _no_floats(name, dtype)
        return f"{x[0]} {op} {x[1]}"
    return form


def _bitwise_not(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str:
    _no_floats("bitwise_not", dtype)
    return f"{x[0]} == 0" if dtype == torch.bool else f"~{x[0]}"


def _shift(name: str, left: bool) -> TritonForm:
    def form(x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]):
        _no_floats(name, dtype)
        if dtype == torch.bool:
            raise Unsupported(f"{name} on bool tensors")
        a, b = x
        width = int_bits(dtype)
        # what a shift by an amount out of [0, width) gives: 0, or the sign for a signed right shift
        fill = f"{a} * 0" if left or unsigned(dtype) else f"{a} >> {width - 1}"
        k = int_literal(b)
        if k is not None:
            return fill if k < 0 or k >= width else f"{a} {'<<' if left else '>>'} {k}"
        let = Let()
        out = f"({b} >= {width})" if unsigned(dtype) else f"(({b} < 0) | ({b} >= {width}))"
        oob = let("oob", out)
        amount = let("amount", f"tl.where({oob}, 0, {b})")
        shifted = let("shifted", f"{a} {'<<' if left else '>>'} {amount}")
        return let.done(f"tl.where({oob}, {fill}, {shifted})")
    return form


def binary(name: str, ref, triton, *, aten: tuple[str, ...], commutative: bool = False) -> OpDef:
    return register(OpDef(name, "pointwise", ref, arity=2, commutative=commutative, triton=triton,
                          pytorch=f"torch.{name}({{0}}, {{1}})", aten=aten))


binary("bitwise_and", torch.bitwise_and, _bitwise("bitwise_and", "&"), commutative=True,
       aten=("bitwise_and.Tensor", "bitwise_and.Scalar"))
binary("bitwise_or", torch.bitwise_or, _bitwise("bitwise_or", "|"), commutative=True,
       aten=("bitwise_or.Tensor", "bitwise_or.Scalar"))
binary("bitwise_xor", torch.bitwise_xor, _bitwise("bitwise_xor", "^"), commutative=True,
       aten=("bitwise_xor.Tensor", "bitwise_xor.Scalar"))
register(OpDef("bitwise_not", "pointwise", torch.bitwise_not, triton=_bitwise_not,
               pytorch="torch.bitwise_not({0})", aten=("bitwise_not.default",)))
binary("bitwise_left_shift", torch.bitwise_left_shift, _shift("bitwise_left_shift", left=True),
       aten=("__lshift__.Scalar", "__lshift__.Tensor", "bitwise_left_shift.Tensor",
             "bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift.Scalar_Tensor"))
binary("bitwise_right_shift", torch.bitwise_right_shift, _shift("bitwise_right_shift", left=False),
       aten=("__rshift__.Scalar", "__rshift__.Tensor", "bitwise_right_shift.Tensor",
             "bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift.Scalar_Tensor"))

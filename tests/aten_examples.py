"""One example call for every aten overload the op table lowers (`tests/test_aten_lowerings.py`).

`example(name)` returns `(args, kwargs)` for the overload the table spells `name`
(`ops.ATEN`), with values seeded by the name (the same whichever tests run). Shapes are odd on purpose (5 x 7, 3 x 1 x 7), operands broadcast where the op
allows it, a few inputs are transposed views (non-contiguous), and the example is chosen so
that the claimed op really appears (a clamp with bounds, a cast to another dtype).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import torch

_gen = torch.Generator().manual_seed(0)


def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen).to(dtype)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen) + 0.25


def small(*shape: int) -> torch.Tensor:
    """Floats from {0, 1, 2}: comparisons see equal elements."""
    return torch.randint(0, 3, shape, generator=_gen).float()


def b(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen) > 0.5


def tr(*shape: int) -> torch.Tensor:
    """A non-contiguous input: the transpose of a [shape[1], shape[0]] tensor."""
    return r(shape[1], shape[0]).t()


Example = Callable[[], tuple[tuple, dict]]


def call(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, kwargs


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return r(1, 2, 9, 16), r(1, 2, 11, 16), r(1, 2, 11, 16)


EXAMPLES: dict[str, Example] = {
    # --- leaves
    "scalar_tensor.default": lambda: call(2.5, dtype=torch.float32),
    # --- binary arithmetic
    "add.Tensor": lambda: call(r(5, 7), r(7), alpha=2),
    "add.Scalar": lambda: call(tr(5, 7), 3.5),
    "sub.Tensor": lambda: call(r(5, 7), r(5, 1), alpha=0.5),
    "sub.Scalar": lambda: call(r(5, 7), 2),
    "rsub.Tensor": lambda: call(r(5, 7), r(7), alpha=2),
    "rsub.Scalar": lambda: call(r(5, 7), 1.5),
    "mul.Tensor": lambda: call(r(3, 1, 7), r(5, 1)),
    "mul.Scalar": lambda: call(r(5, 7), -3),
    "square.default": lambda: call(tr(5, 7)),
    "div.Tensor": lambda: call(r(5, 7), pos(7)),
    "div.Scalar": lambda: call(r(5, 7), 4),
    "div.Tensor_mode": lambda: call(r(5, 7), pos(5, 7), rounding_mode=None),
    "div.Scalar_mode": lambda: call(r(5, 7), 3.0, rounding_mode=None),
    "reciprocal.default": lambda: call(pos(5, 7)),
    "maximum.default": lambda: call(r(5, 7), r(7)),
    "max.other": lambda: call(r(5, 7), r(5, 7)),
    "minimum.default": lambda: call(r(5, 7), r(5, 1)),
    "min.other": lambda: call(r(5, 7), r(5, 7)),
    # --- comparisons
    "eq.Tensor": lambda: call(small(5, 7), small(7)),
    "eq.Scalar": lambda: call(small(5, 7), 1.0),
    "ne.Tensor": lambda: call(small(5, 7), small(5, 7)),
    "ne.Scalar": lambda: call(small(5, 7), 2),
    "lt.Tensor": lambda: call(small(5, 7), small(7)),
    "lt.Scalar": lambda: call(small(5, 7), 1.0),
    "le.Tensor": lambda: call(small(5, 7), small(5, 7)),
    "le.Scalar": lambda: call(small(5, 7), 1),
    "gt.Tensor": lambda: call(small(5, 7), small(5, 1)),
    "gt.Scalar": lambda: call(small(5, 7), 1.0),
    "ge.Tensor": lambda: call(small(5, 7), small(7)),
    "ge.Scalar": lambda: call(small(5, 7), 1.0),
    "logical_xor.default": lambda: call(b(5, 7), small(7)),
    "bitwise_xor.Tensor": lambda: call(b(5, 7), b(7)),
    "bitwise_xor.Scalar": lambda: call(b(5, 7), True),
    # --- logical
    "logical_and.default": lambda: call(r(5, 7), b(5, 7)),
    "bitwise_and.Tensor": lambda: call(b(5, 7), b(5, 7)),
    "bitwise_and.Scalar": lambda: call(b(5, 7), True),
    "logical_or.default": lambda: call(b(5, 7), small(7)),
    "bitwise_or.Tensor": lambda: call(b(5, 7), b(1, 7)),
    "bitwise_or.Scalar": lambda: call(b(5, 7), False),
    "logical_not.default": lambda: call(small(5, 7)),
    "bitwise_not.default": lambda: call(b(5, 7)),
    # --- unary math
    "neg.default": lambda: call(tr(5, 7)),
    "abs.default": lambda: call(r(5, 7)),
    "exp.default": lambda: call(tr(5, 7)),
    "log.default": lambda: call(pos(5, 7)),
    "sqrt.default": lambda: call(pos(5, 7)),
    "rsqrt.default": lambda: call(pos(5, 7)),
    "sin.default": lambda: call(r(5, 7)),
    "cos.default": lambda: call(r(5, 7)),
    "erf.default": lambda: call(r(5, 7)),
    "tanh.default": lambda: call(r(5, 7) * 3),
    "sigmoid.default": lambda: call(r(5, 7)),
    "relu.default": lambda: call(r(5, 7)),
    "silu.default": lambda: call(r(5, 7, dtype=torch.bfloat16)),
    "gelu.default": lambda: call(r(5, 7, dtype=torch.float16), approximate="tanh"),
    "pow.Tensor_Scalar": lambda: call(r(5, 7), 3),
    "clamp.default": lambda: call(r(5, 7), -0.5, 0.5),
    "clamp_min.default": lambda: call(r(5, 7), -0.2),
    "clamp_max.default": lambda: call(r(5, 7), 0.3),
    "clamp.Tensor": lambda: call(r(5, 7), r(7) - 1, r(5, 1) + 1),
    # --- selection and casts
    "where.self": lambda: call(b(5, 7), r(5, 7), r(7)),
    "masked_fill.Scalar": lambda: call(r(5, 7), b(7), -1.0),
    "masked_fill.Tensor": lambda: call(r(5, 7), b(5, 7), r(())),
    "_to_copy.default": lambda: call(r(5, 7), dtype=torch.bfloat16),
    "to.dtype": lambda: call(r(5, 7), torch.float16),
    "to.dtype_layout": lambda: call(r(5, 7), dtype=torch.float64),
    "to.device": lambda: call(r(5, 7), "cpu", torch.float64),
    "tril.default": lambda: call(r(6, 9), 1),
    "triu.default": lambda: call(r(2, 6, 9), -1),
    # --- generators
    "full.default": lambda: call([3, 5], 2.5),
    "new_full.default": lambda: call(r(5, 7), [2, 3], 1.5),
    "full_like.default": lambda: call(r(5, 7), 7.0),
    "ones.default": lambda: call([4, 3]),
    "ones_like.default": lambda: call(r(5, 7)),
    "new_ones.default": lambda: call(r(5, 7), [2, 2]),
    "zeros.default": lambda: call([3]),
    "zeros_like.default": lambda: call(r(5, 7)),
    "new_zeros.default": lambda: call(r(5, 7), [5]),
    "fill.Scalar": lambda: call(r(5, 7), 3.0),
    "fill.Tensor": lambda: call(r(5, 7), r(())),
    "arange.default": lambda: call(7),
    "arange.start": lambda: call(2, 9),
    "arange.start_step": lambda: call(1.0, 4.0, 0.5),
    "eye.default": lambda: call(4),
    "eye.m": lambda: call(3, 5),
    # --- reductions
    "sum.dim_IntList": lambda: call(r(5, 7), [1], True),
    "sum.default": lambda: call(r(5, 7)),
    "mean.dim": lambda: call(tr(5, 7), [0]),
    "mean.default": lambda: call(r(5, 7)),
    "amax.default": lambda: call(r(5, 7), [1]),
    "max.default": lambda: call(r(5, 7)),
    "max.dim": lambda: call(r(5, 7), 1),
    "amin.default": lambda: call(r(5, 7), [0], True),
    "min.default": lambda: call(r(5, 7)),
    "min.dim": lambda: call(r(5, 7), 0, True),
    "var.correction": lambda: call(r(5, 7), [1], correction=0),
    "var.dim": lambda: call(r(5, 7), [1], False),
    "var.default": lambda: call(r(5, 7)),
    "std.correction": lambda: call(r(5, 7), [1]),
    "std.dim": lambda: call(r(5, 7), [0], True, True),
    # --- views
    "view.default": lambda: call(r(5, 7), [35]),
    "_unsafe_view.default": lambda: call(r(5, 7), [7, 5]),
    "reshape.default": lambda: call(r(5, 7), [5, 7, 1]),
    "view_copy.default": lambda: call(r(5, 7), [35, 1]),
    "unsqueeze.default": lambda: call(r(5, 7), 1),
    "squeeze.default": lambda: call(r(5, 1, 7)),
    "squeeze.dim": lambda: call(r(5, 1, 7), 1),
    "squeeze.dims": lambda: call(r(1, 5, 1, 7), [0, 2]),
    "flatten.using_ints": lambda: call(r(3, 5, 7), 0, 1),
    "unflatten.int": lambda: call(r(5, 14), 1, [7, 2]),
    "view_as.default": lambda: call(r(5, 7), r(7, 5)),
    "permute.default": lambda: call(r(3, 5, 7), [2, 0, 1]),
    "transpose.int": lambda: call(r(3, 5, 7), 0, 2),
    "t.default": lambda: call(r(5, 7)),
    "numpy_T.default": lambda: call(r(3, 5, 7)),
    "expand.default": lambda: call(r(5, 1), [3, 5, 7]),
    "repeat.default": lambda: call(r(5, 7), [2, 1, 3]),
    "repeat_interleave.self_int": lambda: call(r(5, 7), 2, 0),
    "slice.Tensor": lambda: call(r(5, 9), 1, 1, 8, 2),
    "narrow.default": lambda: call(r(5, 9), 1, 2, 3),
    "select.int": lambda: call(r(5, 9), 1, -2),
    "unbind.int": lambda: call(r(3, 5), 0),
    "split.Tensor": lambda: call(r(5, 9), 4, 1),
    "split_with_sizes.default": lambda: call(r(5, 9), [2, 7], 1),
    "cat.default": lambda: call([r(5, 7), r(5, 2)], 1),
    "stack.default": lambda: call([r(5, 7), r(5, 7)], 1),
    # --- GEMM and attention
    "mm.default": lambda: call(r(9, 12), tr(12, 10)),
    "bmm.default": lambda: call(r(2, 9, 12), r(2, 12, 10)),
    "matmul.default": lambda: call(r(3, 9, 12), r(12, 10)),
    "dot.default": lambda: call(r(12), r(12)),
    "mv.default": lambda: call(r(9, 12), r(12)),
    "addmm.default": lambda: call(r(10), r(9, 12), r(12, 10), beta=0.5, alpha=2),
    "baddbmm.default": lambda: call(r(2, 9, 10), r(2, 9, 12), r(2, 12, 10)),
    "addmv.default": lambda: call(r(9), r(9, 12), r(12), alpha=3),
    "minicomp::matmul.default": lambda: call(r(2, 9, 12), r(12, 10)),
    "_scaled_dot_product_flash_attention_for_cpu.default": lambda: call(*_qkv(), 0.0, True),
    "minicomp::sdpa.default": lambda: call(*_qkv(), None, 0.0, True, None, False),
    # --- composites
    "positive.default": lambda: call(r(5, 7)),
    "clone.default": lambda: call(r(5, 7)),
    "contiguous.default": lambda: call(r(5, 7)),
    "alias.default": lambda: call(r(5, 7)),
    "detach.default": lambda: call(r(5, 7)),
    "lift_fresh_copy.default": lambda: call(r(5, 7)),
    "lift_fresh.default": lambda: call(r(5, 7)),
    "resolve_conj.default": lambda: call(r(5, 7)),
    "resolve_neg.default": lambda: call(r(5, 7)),
    "dropout.default": lambda: call(r(5, 7), 0.5, False),
    "native_dropout.default": lambda: call(r(5, 7), 0.5, False),
    "_softmax.default": lambda: call(r(5, 37), -1, False),
    "softmax.int": lambda: call(r(5, 7, dtype=torch.float16), 0),
    "_log_softmax.default": lambda: call(r(5, 37), 1, False),
    "log_softmax.int": lambda: call(r(3, 5, 7), -1),
    "native_layer_norm.default": lambda: call(r(3, 5, 7), [7], r(7), r(7), 1e-5),
    "layer_norm.default": lambda: call(r(3, 5, 7, dtype=torch.bfloat16), [5, 7]),
    "rms_norm.default": lambda: call(r(3, 5, 7), [7], r(7), 1e-6),
    "_fused_rms_norm.default": lambda: call(r(3, 5, 7), [7], r(7), 1e-6),
    "linear.default": lambda: call(r(3, 5, 12), r(10, 12), r(10)),
    "minicomp::linear.default": lambda: call(r(5, 12), r(10, 12), None),
}


def example(name: str) -> tuple[tuple, dict]:
    """The example call of `name`, its random values seeded by the name."""
    _gen.manual_seed(zlib.crc32(name.encode()))
    return EXAMPLES[name]()

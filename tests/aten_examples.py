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


def ix(high: int, *shape: int, low: int = 0, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Indices in [low, high): valid ones for a dimension of size `high` (low < 0: from the end)."""
    return torch.randint(low, high, shape, generator=_gen).to(dtype)


def tr(*shape: int) -> torch.Tensor:
    """A non-contiguous input: the transpose of a [shape[1], shape[0]] tensor."""
    return r(shape[1], shape[0]).t()


def ri(*shape: int, lo: int = -50, hi: int = 50, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Integers from [lo, hi)."""
    return torch.randint(lo, hi, shape, generator=_gen).to(dtype)


def nz(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Non-zero integers of both signs (divisors)."""
    v = torch.randint(1, 9, shape, generator=_gen)
    return torch.where(torch.rand(shape, generator=_gen) > 0.5, v, -v).to(dtype)


def sp(*shape: int) -> torch.Tensor:
    """Floats with NaN, +-inf and -0.0 among them."""
    x = r(*shape).flatten()
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    return x.reshape(shape)


def prob(*shape: int) -> torch.Tensor:
    """Floats in (0, 1), a few very near the ends."""
    x = torch.rand(*shape, generator=_gen).flatten()
    x[:2] = torch.tensor([1e-6, 1 - 1e-6])
    return x.reshape(shape)


Example = Callable[[], tuple[tuple, dict]]


def _with_empty_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of only -inf (0 from _safe_softmax), and a lone -inf in another row."""
    x = x.clone()
    x[1] = float("-inf")
    x[3, 4] = float("-inf")
    return x


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
    "true_divide.Tensor": lambda: call(r(5, 7), pos(7)),
    "true_divide.Scalar": lambda: call(r(5, 7), 3),
    "div.Tensor_mode": lambda: call(ri(5, 7), nz(7), rounding_mode="floor"),
    "div.Scalar_mode": lambda: call(r(5, 7) * 9, -2.5, rounding_mode="trunc"),
    "floor_divide.default": lambda: call(ri(5, 7), nz(5, 1)),
    "floor_divide.Scalar": lambda: call(tr(5, 7), 0.7),
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
    "bitwise_xor.Tensor": lambda: call(ri(5, 7), ri(7, dtype=torch.int64)),
    "bitwise_xor.Scalar": lambda: call(b(5, 7), True),
    # --- logical
    "logical_and.default": lambda: call(r(5, 7), b(5, 7)),
    "bitwise_and.Tensor": lambda: call(ri(5, 7, dtype=torch.int8), ri(5, 7, dtype=torch.int8)),
    "bitwise_and.Scalar": lambda: call(b(5, 7), True),
    "logical_or.default": lambda: call(b(5, 7), small(7)),
    "bitwise_or.Tensor": lambda: call(b(5, 7), b(1, 7)),
    "bitwise_or.Scalar": lambda: call(b(5, 7), False),
    "logical_not.default": lambda: call(small(5, 7)),
    "bitwise_not.default": lambda: call(ri(5, 7)),
    # --- shifts (amounts past the width included)
    "__lshift__.Scalar": lambda: call(ri(5, 7), 3),
    "__lshift__.Tensor": lambda: call(ri(5, 7), ri(7, lo=-2, hi=40)),
    "__rshift__.Scalar": lambda: call(ri(5, 7, dtype=torch.int64), 2),
    "__rshift__.Tensor": lambda: call(ri(5, 7), ri(5, 1, lo=-3, hi=70)),
    "bitwise_left_shift.Tensor": lambda: call(ri(5, 7, dtype=torch.int8), ri(7, lo=-2, hi=10, dtype=torch.int8)),
    "bitwise_left_shift.Tensor_Scalar": lambda: call(ri(5, 7), 5),
    "bitwise_left_shift.Scalar_Tensor": lambda: call(3, ri(5, 7, lo=0, hi=20)),
    "bitwise_right_shift.Tensor": lambda: call(ri(5, 7, lo=-128, hi=127, dtype=torch.int8),
                                               ri(7, lo=0, hi=10, dtype=torch.int8)),
    "bitwise_right_shift.Tensor_Scalar": lambda: call(ri(5, 7), 33),
    "bitwise_right_shift.Scalar_Tensor": lambda: call(-1000, ri(5, 7, lo=0, hi=20)),
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
    # --- more math
    "expm1.default": lambda: call(sp(5, 7) * 1e-3),
    "log1p.default": lambda: call(pos(5, 7) - 0.5),
    "log2.default": lambda: call(pos(5, 7)),
    "erfc.default": lambda: call(r(5, 7) * 4),
    "erfinv.default": lambda: call(prob(5, 7) * 2 - 1),
    "xlogy.Tensor": lambda: call(sp(5, 7), pos(7)),
    "xlogy.Scalar_Self": lambda: call(3.0, pos(5, 7)),
    "xlogy.Scalar_Other": lambda: call(r(5, 7), 2.0),
    "lerp.Scalar": lambda: call(r(5, 7), r(7), 0.3),
    "lerp.Tensor": lambda: call(tr(5, 7), r(5, 7), pos(7) - 0.25),
    "pow.Tensor_Tensor": lambda: call(r(5, 7), small(7)),
    "pow.Scalar": lambda: call(2, ri(5, 7, lo=0, hi=40)),
    "isnan.default": lambda: call(sp(5, 7)),
    "isinf.default": lambda: call(sp(5, 7)),
    "nan_to_num.default": lambda: call(sp(5, 7), 0.5, 10.0, None),
    "fmax.default": lambda: call(sp(5, 7), sp(7)),
    "fmin.default": lambda: call(sp(5, 7), r(5, 1)),
    # --- rounding and integer-valued division
    "floor.default": lambda: call(sp(5, 7) * 3),
    "ceil.default": lambda: call(tr(5, 7) * 3),
    "trunc.default": lambda: call(sp(5, 7) * 3),
    "fix.default": lambda: call(r(5, 7) * 3),
    "frac.default": lambda: call(r(5, 7) * 3),
    "round.default": lambda: call(small(5, 7) - 0.5),
    "round.decimals": lambda: call(r(5, 7) * 100, decimals=1),
    "sign.default": lambda: call(sp(5, 7)),
    "sgn.default": lambda: call(ri(5, 7)),
    "signbit.default": lambda: call(sp(5, 7)),
    "remainder.Tensor": lambda: call(ri(5, 7), nz(7)),
    "remainder.Scalar": lambda: call(r(5, 7) * 5, -1.5),
    "remainder.Scalar_Tensor": lambda: call(7, nz(5, 7)),
    "fmod.Tensor": lambda: call(ri(5, 7, dtype=torch.int64), nz(5, 1, dtype=torch.int64)),
    "fmod.Scalar": lambda: call(r(5, 7) * 5, 0.75),
    # --- activations
    "elu.default": lambda: call(r(5, 7) * 3, 1.0, 1.05, 1.0),
    "celu.default": lambda: call(r(5, 7) * 3, 0.7),
    "leaky_relu.default": lambda: call(tr(5, 7), 0.2),
    "hardswish.default": lambda: call(r(5, 7) * 4),
    "hardsigmoid.default": lambda: call(r(5, 7) * 4),
    "hardtanh.default": lambda: call(r(5, 7) * 2, -0.5, 1.5),
    "softplus.default": lambda: call(r(5, 7) * 5, 2.0, 3.0),
    "mish.default": lambda: call(r(5, 7) * 4),
    "logit.default": lambda: call(prob(5, 7), 1e-3),
    "glu.default": lambda: call(r(5, 8), -1),
    # --- selection and casts
    "where.self": lambda: call(b(5, 7), r(5, 7), r(7)),
    "masked_fill.Scalar": lambda: call(r(5, 7), b(7), -1.0),
    "masked_fill.Tensor": lambda: call(r(5, 7), b(5, 7), r(())),
    "_to_copy.default": lambda: call(r(5, 7), dtype=torch.bfloat16),
    "to.dtype": lambda: call(r(5, 7), torch.float16),
    "prims::convert_element_type.default": lambda: call(tr(5, 7), torch.bfloat16),
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
    "var_mean.correction": lambda: call(r(5, 7), [1], correction=0, keepdim=True),
    "std_mean.correction": lambda: call(tr(5, 7), [0]),
    "prod.default": lambda: call(pos(3, 5) + 0.5),
    "prod.dim_int": lambda: call(r(5, 7, dtype=torch.int32).clamp(-2, 2), 1, True),
    "any.default": lambda: call(b(5, 7)),
    "any.dim": lambda: call(small(5, 7) - 1, 0),
    "any.dims": lambda: call(b(3, 5, 7), [0, 2], True),
    "all.default": lambda: call(small(5, 7)),
    "all.dim": lambda: call(b(5, 7), 1, True),
    "all.dims": lambda: call(tr(5, 7) > -1.5, [1]),
    "argmax.default": lambda: call(small(5, 7), 1),
    "argmin.default": lambda: call(tr(5, 7)),
    "aminmax.default": lambda: call(r(5, 7), dim=0, keepdim=True),
    "nansum.default": lambda: call(r(5, 7).masked_fill(b(5, 7), float("nan")), [1]),
    "count_nonzero.dim_IntList": lambda: call(small(5, 7), [0, 1]),
    "count_nonzero.default": lambda: call(tr(5, 7).round(), 1),
    "logsumexp.default": lambda: call(r(5, 37) * 4, [1]),
    "linalg_vector_norm.default": lambda: call(r(5, 7, dtype=torch.float16), 3.0, [1], True),
    # --- scans
    "cumsum.default": lambda: call(r(5, 7), 1),
    "cumprod.default": lambda: call(tr(5, 7), 0, dtype=torch.float64),
    "cummax.default": lambda: call(small(5, 7), 1),
    "cummin.default": lambda: call(small(5, 7), 0),
    "logcumsumexp.default": lambda: call(r(5, 7, dtype=torch.bfloat16), -1),
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
    "flip.default": lambda: call(tr(5, 7), [0, -1]),
    "roll.default": lambda: call(r(5, 7), [2, -9], [0, 1]),
    "constant_pad_nd.default": lambda: call(r(3, 5, 7), [1, 2, -1, 1], 0.5),
    "stack.default": lambda: call([r(5, 7), r(5, 7)], 1),
    # --- indirect loads (indices of both dtypes, negative where eager allows them, non-contiguous)
    "embedding.default": lambda: call(r(11, 7), ix(11, 3, 5)),
    "index.Tensor": lambda: call(r(5, 3, 7), [ix(5, 4, low=-5), None, ix(7, 2, 1, dtype=torch.int32)]),
    "_unsafe_index.Tensor": lambda: call(tr(5, 9), [None, ix(9, 6)]),
    "index_select.default": lambda: call(r(5, 9), 1, ix(9, 4, dtype=torch.int32)),
    "gather.default": lambda: call(r(5, 9), 1, ix(9, 5, 3)),
    "take_along_dim.default": lambda: call(r(5, 9), ix(20, 1, 4, low=-20), 1),
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
    "_safe_softmax.default": lambda: call(_with_empty_rows(r(5, 37)), -1),
    "log_softmax.int": lambda: call(r(3, 5, 7), -1),
    "native_layer_norm.default": lambda: call(r(3, 5, 7), [7], r(7), r(7), 1e-5),
    "layer_norm.default": lambda: call(r(3, 5, 7, dtype=torch.bfloat16), [5, 7]),
    "nll_loss_forward.default": lambda: call(torch.log_softmax(r(6, 5), -1), ix(5, 6), r(5).abs(), 1, 2),
    "native_group_norm.default": lambda: call(r(2, 6, 5, 3), r(6), r(6), 2, 6, 15, 3, 1e-5),
    "group_norm.default": lambda: call(r(3, 4, 7, dtype=torch.bfloat16), 2),
    "rms_norm.default": lambda: call(r(3, 5, 7), [7], r(7), 1e-6),
    "_fused_rms_norm.default": lambda: call(r(3, 5, 7), [7], r(7), 1e-6),
    "linear.default": lambda: call(r(3, 5, 12), r(10, 12), r(10)),
    "native_batch_norm.default": lambda: call(r(2, 6, 5), r(6), r(6), r(6), pos(6), False, 0.1, 1e-5),
    "_native_batch_norm_legit_no_training.default": lambda: call(r(2, 6, 5, 3, dtype=torch.float16), r(6), None,
                                                                 r(6), pos(6), 0.1, 1e-3),
    "mse_loss.default": lambda: call(r(5, 7), tr(5, 7), 1),
    "smooth_l1_loss.default": lambda: call(r(5, 7) * 2, r(5, 7), 2, 0.5),
    "huber_loss.default": lambda: call(r(5, 7) * 2, r(5, 7), 1, 0.7),
    "minicomp::linear.default": lambda: call(r(5, 12), r(10, 12), None),
}


def example(name: str) -> tuple[tuple, dict]:
    """The example call of `name`, its random values seeded by the name."""
    _gen.manual_seed(zlib.crc32(name.encode()))
    return EXAMPLES[name]()

"""Triton combine functions of row kernels: scans, index reductions, products, logaddexp.

Generated modules whose row kernels use them import them from here (the reduction
emitter writes the import once per module, as `Kernel.shared`); like kernel_lib's, they are
`@triton.jit` functions, run under the interpreter for CPU modules.

Semantics, eager's:
- `_argmax_combine`/`_argmin_combine` reduce (value, index) pairs in any order: the larger
  (smaller) value wins, NaN beats every number, and ties (NaN with NaN too) go to the
  smaller index, so the result is eager's first index of the max;
- `_cummax_combine`/`_cummin_combine` combine an earlier prefix `a` with a later one `b`:
  `b` wins when its value is >= (<=) `a`'s or is NaN, so ties take the later index and a
  NaN stays until the next NaN, as torch.cummax/cummin do;
- `_logaddexp_combine` is log(exp(a) + exp(b)) without overflow: -inf is its identity,
  +inf absorbs, NaN propagates.
"""

import triton
import triton.language as tl


@triton.jit
def _add_combine(a, b):
    return a + b


@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _argmax_combine(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    tie = (av == bv) | (a_nan & b_nan)
    take_a = (av > bv) | (a_nan & ~b_nan) | (tie & (ai < bi))
    return tl.where(take_a, av, bv), tl.where(take_a, ai, bi)


@triton.jit
def _argmin_combine(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    tie = (av == bv) | (a_nan & b_nan)
    take_a = (av < bv) | (a_nan & ~b_nan) | (tie & (ai < bi))
    return tl.where(take_a, av, bv), tl.where(take_a, ai, bi)


@triton.jit
def _cummax_combine(av, ai, bv, bi):
    take_b = (bv >= av) | (bv != bv)
    return tl.where(take_b, bv, av), tl.where(take_b, bi, ai)


@triton.jit
def _cummin_combine(av, ai, bv, bi):
    take_b = (bv <= av) | (bv != bv)
    return tl.where(take_b, bv, av), tl.where(take_b, bi, ai)


@triton.jit
def _logaddexp_combine(a, b):
    hi = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    lo = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    # equal operands (both infinite included): hi + log 2, never inf - inf
    return tl.where(lo == hi, hi + 0.6931471805599453, hi + tl.log(1.0 + tl.exp(lo - hi)))


HELPERS = ("_add_combine", "_mul_combine", "_argmax_combine", "_argmin_combine", "_cummax_combine",
           "_cummin_combine", "_logaddexp_combine")

"""Checks generated modules make before launching a kernel: index tensors (`check_index`).

A kernel that reads its source at positions an index tensor holds (an embedding, `x[idx]`,
gather: codegen/indirect.py) trusts those positions; `call()` checks every index tensor it
reads from memory first (codegen/index_check.py writes the line), so a bad index raises
eager's kind of error and no kernel ever reads outside a tensor. The check is one pass over
the index tensor (its min and max), which is small next to what the kernel reads through it.

On the CPU (Triton's interpreter) a bad index raises `OutOfBoundsIndexError` or
`OutOfBoundsRuntimeError` (minicomp.errors: an IndexError or a RuntimeError, as eager's) naming
the node, its origin, the index and the dimension. On CUDA the check is
`torch._assert_async`, as eager's own CUDA kernels check indices with device-side asserts: it
does not wait for the GPU, and a bad index fails the next synchronising call with the message.
"""

from __future__ import annotations

import torch

from minicomp.errors import OutOfBoundsIndexError, OutOfBoundsRuntimeError

ERRORS = {"IndexError": OutOfBoundsIndexError, "RuntimeError": OutOfBoundsRuntimeError}


def check_index(t: torch.Tensor, lo: int, hi: int, dim: int, size: int, error: str, what: str) -> None:
    """Raise eager's kind of error (`error`) unless every element of `t` lies in [lo, hi], the
    valid indices of dimension `dim` (of `size`) of the tensor that `what` reads through it."""
    if t.numel() == 0:
        return
    if t.device.type != "cpu":
        ok = ((t >= lo) & (t <= hi)).all()
        torch._assert_async(ok, f"{what}: an index is out of bounds for dimension {dim} with size {size}")
        return
    low, high = (int(v) for v in torch.aminmax(t))
    if lo <= low and high <= hi:
        return
    bad = low if low < lo else high
    where = "" if lo < 0 else " (negative indices are not allowed here)" if bad < 0 else ""
    raise ERRORS[error](f"{what}: index {bad} is out of bounds for dimension {dim} with size {size}{where}; "
                        "found by the compiled call before any kernel read through it")

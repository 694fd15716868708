"""The CUDA form of `checks.check_index`: one kernel and one assertion per checked index tensor.

A compiled call checks every index tensor it gathers through (an embedding's ids, a model's
position buffer) before any kernel reads through it, as eager's gather kernels do. Written as
PyTorch ops (`((t >= lo) & (t <= hi)).all()` and `torch._assert_async`) that check took five
dispatches and four kernel launches; BERT-base checks three tensors a call, and its profile on
the H100 showed those twelve kernels at 27 us of GPU time a call (results/2026-12-06,
session 20), besides their host time in a call the host already bounds.

Here `_in_range` clears a flag (one int32 per device, kept for the process) when it finds an
index outside [lo, hi], and `torch._assert_async` raises on the device when the flag is zero,
eager's own behaviour for a bad index on CUDA (a device-side assertion, after which the CUDA
context is unusable, so the flag is never set back). `launcher.check_index` calls it with a `Launcher` of
its own: after the first launch of each size and range, the compiled kernel's own launcher. A CUDA graph capture records both launches and replays them with the flag.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

BLOCK = 1024
_flags: dict[int, torch.Tensor] = {}       # device index -> int32 [1], 1 while every index seen was good


@triton.jit
def _in_range(t_ptr, n, lo, hi, ok_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(t_ptr + offs, mask=offs < n, other=lo)
    bad = tl.max(((x < lo) | (x > hi)).to(tl.int32), axis=0)
    tl.store(ok_ptr, 0, mask=bad > 0)


def flag(index: int) -> torch.Tensor:
    """The process's flag for CUDA device `index` (allocated at its first use, set to 1)."""
    ok = _flags.get(index)
    if ok is None:
        ok = _flags[index] = torch.ones(1, dtype=torch.int32, device=torch.device("cuda", index))
    return ok


def flattened(t: torch.Tensor) -> torch.Tensor:
    """`t` as the kernel reads it: its elements at offsets 0 to numel - 1. A contiguous tensor
    is that already (the kernel takes its pointer: no dispatch at each call). An expanded view
    holds its values once along each dimension of stride 0, so those are dropped first (BERT's
    token types, `buf.expand(4, 512)`, are its 512 values in place: no copy kernel at each call);
    what is still not contiguous is copied (`reshape` would keep an expand's stride 0)."""
    if t.is_contiguous():
        return t
    strides = t.stride()
    if 0 in strides:
        kept = [(n, s) for n, s in zip(t.shape, strides) if s != 0]
        t = t.as_strided([n for n, _ in kept], [s for _, s in kept])
        if t.is_contiguous():
            return t
    return t.contiguous()


def assert_in_range(t: torch.Tensor, lo: int, hi: int, message: str, launch: Callable) -> None:
    """Assert on `t`'s device that every element of `t` (a CUDA integer tensor, not empty) lies
    in [lo, hi]; `message` is what PyTorch prints with the failed assertion. `launch` is the
    caller's `Launcher(by_sizes=True)` (runtime/launcher.py, which imports this module)."""
    flat = flattened(t)
    ok = flag(t.get_device())
    n = flat.numel()
    launch(_in_range, (triton.cdiv(n, BLOCK),), flat, n, lo, hi, ok, BLOCK=BLOCK)
    torch._assert_async(ok, message)

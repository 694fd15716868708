"""Checks generated modules make before launching a kernel: inputs (`check_input`, `bind_size`
for a symbolic size, `as_layout`), and index tensors (`check_index`). All run once per input
per call, so the common case is tested first with the cheapest reads.

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

from typing import Any, Callable

import torch

from minicomp.errors import OutOfBoundsIndexError, OutOfBoundsRuntimeError

ERRORS = {"IndexError": OutOfBoundsIndexError, "RuntimeError": OutOfBoundsRuntimeError}


_SCALARS: dict[tuple, torch.Tensor] = {}


def scalar(value: bool | int | float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 0-dim tensor of a scalar constant that PyTorch lines of a generated run() read, made
    once per (value, dtype, device) and kept. Made at each call, as `torch.tensor(v,
    device=device)`, it was a copy from pageable host memory at every call: that copy waits for
    the GPU (the host could no longer run ahead of it) and no CUDA graph capture takes it.
    Nothing minicomp writes writes into it (buffer reuse takes only `_empty` memory, and eager
    branches copy into kernel buffers); where the caller could get it, or a view of it, back
    from a call, the module clones it (`codegen/fallback.scalar_line`)."""
    key = (type(value), repr(value), dtype, device)      # True == 1 == 1.0 and 0.0 == -0.0: keep them apart
    t = _SCALARS.get(key)
    if t is None:
        with torch.inference_mode(False):    # made in a call under inference_mode, it would be an
            t = torch.tensor(value, dtype=dtype, device=device)   # inference tensor, which autograd refuses later
        _SCALARS[key] = t
    return t


def check_index(t: torch.Tensor, lo: int, hi: int, dim: int, size: int, error: str, what: str) -> None:
    """Raise eager's kind of error (`error`) unless every element of `t` lies in [lo, hi], the
    valid indices of dimension `dim` (of `size`) of the tensor that `what` reads through it."""
    if t.numel() == 0:
        return
    if t.device.type != "cpu":    # CUDA tensors take launcher.check_index's kernel instead
        ok = ((t >= lo) & (t <= hi)).all()
        torch._assert_async(ok, index_message(what, dim, size))
        return
    low, high = (int(v) for v in torch.aminmax(t))
    if lo <= low and high <= hi:
        return
    bad = low if low < lo else high
    where = "" if lo < 0 else " (negative indices are not allowed here)" if bad < 0 else ""
    raise ERRORS[error](f"{what}: index {bad} is out of bounds for dimension {dim} with size {size}{where}; "
                        "found by the compiled call before any kernel read through it")


def index_message(what: str, dim: int, size: int) -> str:
    """What a device-side assertion of a bad index says (the index itself stays on the device)."""
    return f"{what}: an index is out of bounds for dimension {dim} with size {size}"


def next_pow2(n: int) -> int:
    """The power-of-two bucket of a size (1 for sizes up to 1), as call() computes it for the
    kernels' tuning keys: a plain function, where `triton.next_power_of_2` is a Triton
    `ConstexprFunction` whose call costs ~7 us of Python (measured on Triton 3.9), once or twice
    per launch of a module over symbolic sizes."""
    return 1 << max(n - 1, 0).bit_length()


def bind_size(t: Any, name: str, rank: int, axis: int, lo: int, hi: int, symbol: str) -> int:
    """The size of dimension `axis` of input `t`, which a module over symbolic sizes reads as
    symbol `symbol`; GuardError unless `t` is a tensor of rank `rank` whose size there is in
    [lo, hi] (sizes 0 and 1 are never symbolic: such a call needs a module of its own)."""
    from minicomp.errors import GuardError

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"input {name!r} must be a tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise GuardError(f"input {name!r} must have {rank} dimension(s), got shape {list(t.shape)}")
    size = t.shape[axis]
    if not lo <= size <= hi:
        raise GuardError(f"input {name!r}: dimension {axis} ({symbol}) is {size}, outside the range "
                         f"[{lo}, {hi}] this module serves")
    return size


def check_input(t: Any, name: str, shape: tuple, dtype: torch.dtype, device_type: str) -> None:
    """Raise TypeError unless `t` is a tensor of `shape` and `dtype` on `device_type`."""
    # the common case first, in attribute reads that cost least (`t.device.type` builds a
    # device object: ~1.5 us of the ~2.5 this took, once per input per call)
    if isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype and (
            t.is_cuda if device_type == "cuda" else t.is_cpu if device_type == "cpu" else t.device.type == device_type):
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"input {name!r} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise TypeError(f"input {name!r} must be {dtype} of shape {list(shape)}, got {t.dtype} of shape {list(t.shape)}")
    if t.device.type != device_type:
        raise TypeError(f"input {name!r} is on {t.device}, but this module was generated for {device_type}")


try:        # what Inductor's generated code allocates its buffers with: at::empty_strided on the current device
    from torch._C._dynamo.guards import _empty_strided_cuda as empty_strided_cuda
except ImportError:
    empty_strided_cuda = None


# The current CUDA device, for callers that know CUDA is initialised (a fast launcher exists only
# after a launch through Triton; a CUDA input exists): `torch.cuda.current_device()`'s lazy-init
# check, two thirds of its time in a cProfile of BERT's launches on the H100 (session 15), is
# skipped by reading the device from torch._C directly.
cuda_device_now: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _empty_on(device: torch.device) -> Callable[[tuple, tuple, torch.dtype], torch.Tensor]:
    def empty(shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    return empty


def allocator(device: torch.device) -> Callable[[tuple, tuple, torch.dtype], torch.Tensor]:
    """`empty(shape, strides, dtype)` on `device`, for a generated run()'s buffers: taken once a
    call. On the current CUDA device it is PyTorch's C++ allocation that Inductor's generated code
    calls, without torch.empty_strided's parsing of keywords and a device object (a call allocates
    30 to 40 buffers); elsewhere (the CPU, another CUDA device than the current one) it is
    torch.empty_strided on `device`."""
    if empty_strided_cuda is not None and device.type == "cuda" and device.index == cuda_device_now():
        return empty_strided_cuda
    return _empty_on(device)


def as_layout(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """`t` itself when its strides are `strides` (size-1 dimensions aside) and, on CUDA, it starts
    16-byte aligned; else a copy laid out so. On CUDA no kernel sees a misaligned tensor: each
    compiles one specialisation (the one the warm-up compiled), and PyTorch lines do not get one
    either (PyTorch 2.11's cuDNN attention answers wrongly for a query 2 bytes off alignment)."""
    if t.stride() == strides and (not t.is_cuda or t.data_ptr() % 16 == 0):
        return t              # the common case, without the loop below (~1 us against ~5)
    if all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides)) and (
            t.device.type != "cuda" or t.data_ptr() % 16 == 0):
        return t
    out = torch.empty_strided(tuple(t.shape), strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def aligned(ts: tuple) -> bool:
    """Whether every tensor of `ts` starts on 16 bytes: what `as_layouts` checks besides the
    strides, for a caller whose guards compared those (a loop, ~0.07 us a tensor on the 2-core
    CPU machine, against ~0.15 for `as_layouts`' test of both)."""
    for t in ts:
        if t.data_ptr() & 15:
            return False
    return True


def as_layouts(ts: tuple, layouts: tuple) -> tuple:
    """`as_layout` over a module's inputs at once: `ts` itself when every tensor has its layout's
    strides and (on CUDA) starts 16-byte aligned, as a model's ~200 weights do at every call;
    else each through `as_layout`. One loop here costs less than a call of `as_layout` per input
    in the generated run()."""
    for t, strides in zip(ts, layouts):
        if t.stride() != strides or (t.is_cuda and t.data_ptr() % 16):
            return tuple(as_layout(t, s) for t, s in zip(ts, layouts))
    return ts

"""Device-side helpers generated modules call through `_rt`: TMA descriptors' 16-byte aligned
operands (`align16`) and scratch allocator (`tma_ready`), and the SM count persistent grids
are sized by (`sm_count`). Split from launcher.py, which re-exports them."""

from __future__ import annotations

from typing import Any

import torch

from minicomp.runtime.checks import empty_strided_cuda


def align16(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy with the same strides at a 16-byte aligned address: TMA descriptors need one."""
    if t.data_ptr() % 16 == 0:
        return t
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _tma_scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """Triton's scratch for a launch's TMA descriptors, on the current device (where Triton
    launches), at each launch of a GEMM that builds them: without torch.empty's argument parsing
    (BERT-base launches 36 such GEMMs a call). The caching allocator's blocks start 512-byte
    aligned, more than Triton asks."""
    if empty_strided_cuda is not None:        # the allocation `checks.allocator` gives buffers
        return empty_strided_cuda((size,), (1,), torch.int8)
    return torch.empty(size, dtype=torch.int8, device="cuda")


_ALLOCATION: list = []      # Triton's allocator module once looked up ([None]: another Triton layout)


def tma_ready() -> None:
    """Kernels that build TMA descriptors take scratch memory from Triton's allocator: install one
    unless the program has set its own. Called before every TMA launch, so the module holding
    the allocator is looked up once (an import per call cost ~1.5 us)."""
    if not _ALLOCATION:
        try:
            from triton.runtime import _allocation
            _ALLOCATION.append(_allocation if hasattr(_allocation, "_NULL_ALLOCATOR") else None)
        except ImportError:
            _ALLOCATION.append(None)
    alloc = _ALLOCATION[0]
    try:
        if alloc is not None and alloc._allocator.get() is not alloc._NULL_ALLOCATOR:
            return
    except AttributeError:  # another Triton layout: install ours
        pass
    import triton
    triton.set_allocator(_tma_scratch)


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count

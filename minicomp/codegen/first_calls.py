"""cuBLAS answers a GEMM's first calls while minicomp's kernel for it compiles in the background.

Some GEMMs with nothing to fuse are our kernel's only because cuBLAS is slow on their shape:
an lm_head's 50257 output columns, or a K off 16 bytes (library.py). Their first call then
waits for the kernel's compile and autotuning (0.82 s for `lm_head_50257` on the H100, where
torch.compile's first call took 0.40 s, session 25). With `Target.library_first`
($MINICOMP_LIBRARY_FIRST=1) such a group is written twice:

    if _rt.compiled(mc_gemm_matmul_0):
        _launch(mc_gemm_matmul_0, ...)      # once its background compile has finished
    else:  # cuBLAS answers while the kernel compiles
        buf3 = torch.nn.functional.linear(x, w)

The kernel goes into the module's `_LATER` list (compiled on a background thread at the first
call, runtime/launcher.py `compile_later`) instead of `_WARM`. The first calls run cuBLAS at
eager's speed (the slow path, 1.7 ms for the lm_head); the first call after the compile ends
autotunes the kernel; later calls run it. The two forms agree within rounding, so a call's
result can differ in its last bits between those calls, as with the tiered attention
(attention_hopper.tiered). `minicomp.wait_compiled()` waits for the compile (benchmarks time
the settled module).

Off by default: session 25 wrote it without a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from minicomp.codegen import library
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Kernel, KernelCtx, Ready
from minicomp.ir.graph import Node

WHY = "while the kernel compiles in the background: codegen/first_calls.py"


def _serves(ctx: KernelCtx, groups: list) -> bool:
    """Whether cuBLAS can answer for the group while its kernel compiles: `Target.library_first`
    on a CUDA target, and one matmul with nothing or a bias to fuse, alone in its kernel."""
    t = ctx.target
    return (t.library_first and t.library_gemm and ctx.device_type == "cuda" and ctx.group.kind == "gemm"
            and len(groups) == 1 and library._plain(ctx, ctx.group.spec) is not None)


def tier(ctx: KernelCtx, kernel: Kernel, groups: list) -> Kernel:
    """`kernel` with its one launch made once it has compiled (`Ready`: its warm-up entry goes
    to `_LATER`), where `_serves` says cuBLAS can answer meanwhile; else `kernel` as it is."""
    if len(kernel.launches) != 1 or kernel.launches[0].when is not None or not _serves(ctx, groups):
        return kernel
    (launch,) = kernel.launches
    return replace(kernel, launches=[replace(launch, when=Ready(launch.fn or kernel.name))])


def write_else(ctx: KernelCtx, kernel: Kernel, groups: list, out: CodeBuilder,
               opaque_slot: Callable[[Node], int]) -> None:
    """After a `tier`ed kernel's launch lines (`if _rt.compiled(...):`), the cuBLAS lines that
    answer until then; nothing for any other kernel."""
    if len(kernel.launches) == 1 and isinstance(kernel.launches[0].when, Ready) and _serves(ctx, groups):
        with out.block("else:  # cuBLAS answers until then"):
            library.emit(ctx, out, opaque_slot, why=WHY)

"""The library answers a group's first calls while minicomp's kernel for it compiles in the background.

Some groups with nothing to fuse are our kernel's only because the library is slow on them, or
slower on the host: a GEMM with an lm_head's 50257 output columns or a K off 16 bytes, which
cuBLAS runs on its slow path (library.py); an attention of few flops, or one the Gluon kernel
takes (library_attention.py). Their first call waits for the kernel's compile and autotuning
(0.82 s for `lm_head_50257` on the H100, where torch.compile's first call took 0.40 s, session
25). With `Target.library_first` (on unless $MINICOMP_LIBRARY_FIRST=0) such a group is written twice:

    if _rt.compiled(mc_gemm_matmul_0):
        _launch(mc_gemm_matmul_0, ...)      # once its background compile has finished
    else:  # cuBLAS answers until then
        buf3 = torch.nn.functional.linear(x, w)

The kernel goes into the module's `_LATER` list (compiled on a background thread at the first
call, runtime/launcher.py `compile_later`) instead of `_WARM`. The first calls run the library
(cuBLAS at eager's speed, the slow path for the lm_head: 1.7 ms; SDPA for attention); the first
call after the compile ends autotunes the kernel; later calls run it. An attention the Gluon
kernel takes is emitted without `Target.tiered` (`context`): SDPA takes the place of the
block-language kernel that would serve in front of it (attention_hopper.tiered), so neither
compiles before the first call. The forms agree within rounding, so a
call's result can differ in its last bits between those calls. `minicomp.wait_compiled()` waits
for the compile (benchmarks time the settled module).

On the H100 (session 26) it took lm_head_50257's first call in a warm process from 0.82 s to
0.04 (torch.compile: 2.03) and gemm_k4095's to 0.03 (0.06), the steady state unchanged (0.294 ms
against torch.compile's 0.294; 0.231 against 0.231).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from minicomp.codegen import library, library_attention
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Kernel, KernelCtx, Ready
from minicomp.ir.graph import Node

WHY = "while the kernel compiles in the background: codegen/first_calls.py"


def _serves(ctx: KernelCtx, groups: list) -> bool:
    """Whether cuBLAS or SDPA can answer for the group while its kernel compiles:
    `Target.library_first` on a CUDA target, the group alone in its kernel, and either one
    matmul with nothing or a bias to fuse, or an attention SDPA computes as it is."""
    t = ctx.target
    if not (t.library_first and ctx.device_type == "cuda" and len(groups) == 1):
        return False
    if ctx.group.kind == "gemm":
        return t.library_gemm and library.computes(ctx)
    return ctx.group.kind == "attention" and t.library_attention and library_attention.computes(ctx)


def context(ctx: KernelCtx) -> KernelCtx:
    """The context to emit the group's kernel in: where SDPA will answer an attention's first
    calls (`_serves`), without `Target.tiered`, so that the Gluon kernel comes alone instead of
    behind a block-language kernel that would compile for the first call (attention.emit)."""
    if ctx.group.kind == "attention" and ctx.target.tiered and _serves(ctx, [ctx.group]):
        return replace(ctx, target=replace(ctx.target, tiered=False))
    return ctx


def tier(ctx: KernelCtx, kernel: Kernel, groups: list) -> Kernel:
    """`kernel` with its one launch made once it has compiled (`Ready`: its warm-up entry goes
    to `_LATER`), where `_serves` says the library can answer meanwhile; else `kernel` as it is."""
    if len(kernel.launches) != 1 or kernel.launches[0].when is not None or not _serves(ctx, groups):
        return kernel
    (launch,) = kernel.launches
    return replace(kernel, launches=[replace(launch, when=Ready(launch.fn or kernel.name))])


def write_else(ctx: KernelCtx, kernel: Kernel, groups: list, out: CodeBuilder,
               opaque_slot: Callable[[Node], int]) -> None:
    """After a `tier`ed kernel's launch lines (`if _rt.compiled(...):`), the library lines that
    answer until then; nothing for any other kernel."""
    launches = kernel.launches
    if len(launches) == 1 and isinstance(launches[0].when, Ready) and launches[0].when.ready and _serves(ctx, groups):
        lib = library_attention if ctx.group.kind == "attention" else library
        with out.block(f"else:  # {'SDPA' if lib is library_attention else 'cuBLAS'} answers until then"):
            lib.emit(ctx, out, opaque_slot, why=WHY)

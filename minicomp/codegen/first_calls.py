"""Eager PyTorch answers a group's first calls while minicomp's kernel for it compiles in the background.

A kernel's first launch waits for Triton to compile it, and for its autotuning: 0.82 s for the
`lm_head_50257` GEMM on the H100, 5.2 s for a 4-layer Llama's first call where torch.compile's
took 4.5 (session 26). With `Target.eager_first` (on unless $MINICOMP_EAGER_FIRST=0) each
kernel's group is written twice:

    if _rt.compiled(mc_gemm_matmul_0):
        _launch(mc_gemm_matmul_0, ...)      # once its background compile has finished
    else:  # cuBLAS answers until then
        buf3 = torch.nn.functional.linear(x, w)

The else branch is the library's call where the library computes the group as it is (a GEMM
with nothing or a bias to fuse: cuBLAS, codegen/library.py; an attention SDPA computes:
codegen/library_attention.py), and otherwise the group's own nodes as PyTorch lines, as a
fallback writes them (fallback.write_nodes; for sibling groups that share one kernel, each
group's), their results copied into the buffers the kernel would have written. The kernel goes
into the module's `_LATER` list (compiled on background threads from the first call on,
runtime/background.py `compile_later`) instead of `_WARM`. The first calls run at eager's
speed; the first call after a kernel's compile ends autotunes it; later calls run it. An
attention the Gluon kernel takes is emitted without `Target.tiered` (`context`): eager takes the
place of the block-language kernel that would serve in front of it (attention_hopper.tiered),
so neither compiles before the first call.

The forms agree within rounding, so a call's result can differ in its last bits between those
calls. `minicomp.wait_compiled()` waits for the compiles (benchmarks time the settled module and
report how long settling took). A kernel of several launches (split reductions, split-KV decode,
a second form for other sizes) tests all of its functions once, at its first launch
(`Ready.together`), and its eager lines run under `if not <that answer>:`.

On the H100 (session 26) the library's part took lm_head_50257's first call in a warm process
from 0.82 s to 0.04 (torch.compile: 2.03) and gemm_k4095's to 0.03 (0.06), the steady state
unchanged (0.294 ms against torch.compile's 0.294; 0.231 against 0.231).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from minicomp.codegen import fallback, library, library_attention
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Kernel, KernelCtx, Ready
from minicomp.codegen.names import comment_text
from minicomp.ir.graph import Node

WHY = "while the kernel compiles in the background: codegen/first_calls.py"


def _library(ctx: KernelCtx, groups: list) -> bool:
    """Whether cuBLAS or SDPA computes the group as it is: alone in its kernel, and either one
    matmul with nothing or a bias to fuse, or an attention SDPA computes as it is."""
    t = ctx.target
    if len(groups) != 1:
        return False
    if ctx.group.kind == "gemm":
        return t.library_gemm and library.computes(ctx)
    return ctx.group.kind == "attention" and t.library_attention and library_attention.computes(ctx)


def _serves(ctx: KernelCtx) -> bool:
    """Whether eager answers for the group while its kernel compiles: `Target.eager_first` on a
    CUDA target."""
    return ctx.target.eager_first and ctx.device_type == "cuda"


def context(ctx: KernelCtx) -> KernelCtx:
    """The context to emit the group's kernel in: where eager will answer an attention's first
    calls (`_serves`), without `Target.tiered`, so that the Gluon kernel comes alone instead of
    behind a block-language kernel that would compile for the first call (attention.emit)."""
    if ctx.group.kind == "attention" and ctx.target.tiered and _serves(ctx):
        return replace(ctx, target=replace(ctx.target, tiered=False))
    return ctx


def tier(ctx: KernelCtx, kernel: Kernel) -> Kernel:
    """`kernel` with its launches made once it has compiled (`Ready`: their warm-up entries go
    to `_LATER`), where `_serves` says eager answers meanwhile; else `kernel` as it is. The
    launches of a kernel of several (split reductions, split-KV decode) or of forms for other
    sizes share one test of all their functions (`Ready.together`), each keeping its size
    condition (`Ready.inner`); the tiered attention's launches keep theirs."""
    launches = kernel.launches
    if not launches or any(isinstance(launch.when, Ready) for launch in launches) or not _serves(ctx):
        return kernel
    if len(launches) == 1 and launches[0].when is None:
        return replace(kernel, launches=[replace(launches[0], when=Ready(launches[0].fn or kernel.name))])
    fns = tuple(dict.fromkeys(launch.fn or kernel.name for launch in launches))
    return replace(kernel, launches=[
        replace(launch, when=Ready(launch.fn or kernel.name, together=fns, var=f"{kernel.name}_ready", first=i == 0,
                                   inner=launch.when))
        for i, launch in enumerate(launches)])


def write_else(ctxs: list[KernelCtx], kernel: Kernel, out: CodeBuilder, opaque_slot: Callable[[Node], int]) -> None:
    """After a `tier`ed kernel's launch lines (`if _rt.compiled(...):`), the lines that answer
    until then: the library's call, or each group's nodes as PyTorch lines that end in copies
    into the kernel's output buffers. Nothing for any other kernel."""
    launches, ctx = kernel.launches, ctxs[0]
    if not (launches and all(isinstance(launch.when, Ready) and launch.when.ready for launch in launches)
            and _serves(ctx)):
        return
    var = launches[0].when.var      # several launches, or size conditions (`tier`): `if not var:`
    test = f"if not {var}:" if var else "else:"
    if _library(ctx, [c.group for c in ctxs]):
        lib = library_attention if ctx.group.kind == "attention" else library
        with out.block(f"{test}  # {'SDPA' if lib is library_attention else 'cuBLAS'} answers until then"):
            lib.emit(ctx, out, opaque_slot, why=WHY)
        return
    with out.block(f"{test}  # PyTorch answers until then"):
        out.writeline(f"# {comment_text(WHY)}")
        for c in ctxs:
            # a scalar constant the kernel takes as a literal becomes a tensor here only (the kernel
            # path binds nothing it does not read)
            g = c.graph
            for a in sorted({a for n in c.group.nodes for a in g.node(n).args}):
                node = g.node(a)
                if node.op == "constant" and not isinstance(node.attrs["value"], torch.Tensor):
                    out.writeline(fallback.scalar_line(c, node))
            # into the buffers the kernel would write: a result that views an input (a no-op cast)
            # must not become memory a later output reuses (codegen/buffers.py)
            eager = replace(c, names={**(c.names or {}), **{o: f"mc_eager{o}" for o in c.group.outputs}})
            fallback.write_nodes(eager, out, opaque_slot, layouts=False)
            out.writelines([f"{c.buf(o)}.copy_({eager.buf(o)})" for o in c.group.outputs])

"""Pointwise kernels: one flat 1-D launch over the group's iteration space.

Every output of a pointwise group has the same shape (the planner promises it); the
kernel walks that shape's elements in row-major order, `offs = pid * BLOCK + arange`.
Each output is computed at `Index(shape, flat=offs)`: views move the index, broadcast
operands are read through their shape (strides of 0 in effect), and when every tensor
is contiguous and of the output's shape every access is simply `ptr + offs` (the fast
path, found by the index algebra rather than by a separate template).

On CUDA the block size and warp count are autotuned over a few configs keyed on the
element count; under the CPU interpreter one fixed large block keeps the run short.
"""

from __future__ import annotations

import math

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Kernel, KernelCtx, Unsupported, kernel_name, next_pow2
from minicomp.codegen.lowering import Lowering
from minicomp.ir.dtypes import type_str

# (BLOCK, num_warps) tried by the autotuner on CUDA
CUDA_CONFIGS = ((512, 4), (1024, 4), (2048, 8), (4096, 8))
CPU_BLOCK = 4096           # interpreter: few, large programs (numpy does the vector work)
INT32_LIMIT = 2**31 - 1


def needs_int64(ctx: KernelCtx, nids, numel: int) -> bool:
    """True when some element offset could overflow int32."""
    extent = numel
    for nid in nids:
        node = ctx.graph.node(nid)
        if node.numel:
            extent = max(extent, 1 + sum((d - 1) * abs(s) for d, s in zip(node.shape, ctx.strides(nid))))
    return extent > INT32_LIMIT


def io_comment(ctx: KernelCtx, reads, writes) -> list[str]:
    """Header comment lines naming what the kernel reads and writes."""
    def fmt(nid: int) -> str:
        n = ctx.graph.node(nid)
        label = n.attrs["name"] if n.op == "input" else f"%{nid}"
        return f"{label} {type_str(n.shape, n.dtype)}"
    ops = ", ".join(f"%{nid} {ctx.graph.node(nid).op}" for nid in ctx.group.nodes
                    if ctx.graph.node(nid).kind not in ("input", "constant"))
    return [f"# computes {ops}",
            f"# reads {', '.join(fmt(n) for n in reads) or 'nothing'}; writes {', '.join(fmt(n) for n in writes)}"]


def autotune_decorator(configs: list[tuple[dict, int]], key: list[str]) -> list[str]:
    b = CodeBuilder()
    with b.block("@triton.autotune("):
        with b.block("configs=["):
            for meta, warps in configs:
                b.writeline(f"triton.Config({meta!r}, num_warps={warps}),")
        b.writeline("],")
        b.writeline(f"key={key!r},")
    b.writeline(")")
    return b.getvalue().splitlines()


def emit(ctx: KernelCtx) -> Kernel:
    graph, group = ctx.graph, ctx.group
    if not group.outputs:
        raise Unsupported("pointwise group with no outputs")
    shape = graph.node(group.outputs[0]).shape
    for o in group.outputs:
        if graph.node(o).shape != shape:
            raise Unsupported(f"pointwise outputs of different shapes: {shape} and {graph.node(o).shape}")
    numel = math.prod(shape)
    name = kernel_name(ctx, "pw")

    body = CodeBuilder()
    low = Lowering(ctx, builder_for=lambda syms: body, mask_for=lambda syms: "mask" if syms else None)
    offs = ix.sym("offs", max(numel, 1))
    for o in group.outputs:
        low.store(o, ix.Index(shape, flat=offs), "[BLOCK]")

    reads = [n for n in low.pointers if n not in group.outputs]
    wide = needs_int64(ctx, list(low.pointers), numel)
    params = [low.pointers[n].name for n in reads] + [low.pointers[n].name for n in group.outputs]
    params += ["n_elements", "BLOCK: tl.constexpr"]

    src = CodeBuilder()
    if ctx.device_type == "cuda":
        fitting = [c for c in CUDA_CONFIGS if c[0] <= max(next_pow2(numel), CUDA_CONFIGS[0][0])]
        src.writelines(autotune_decorator([({"BLOCK": b}, w) for b, w in fitting], ["n_elements"]))
    src.writeline("@triton.jit")
    with src.block(f"def {name}({', '.join(params)}):"):
        src.writelines(io_comment(ctx, reads, group.outputs))
        src.writeline("pid = tl.program_id(0)")
        src.writeline(f"offs = {'pid.to(tl.int64)' if wide else 'pid'} * BLOCK + tl.arange(0, BLOCK)")
        src.writeline("mask = offs < n_elements")
        src.splice(body.getvalue())

    args = ", ".join([ctx.buf(n) for n in reads] + [ctx.buf(n) for n in group.outputs] + [str(numel)])
    if numel == 0:
        launch = [f"# {name}: nothing to compute (0 elements)"]
    elif ctx.device_type == "cuda":
        launch = [f"grid = lambda meta: (triton.cdiv({numel}, meta['BLOCK']),)",
                  f"{name}[grid]({args})"]
    else:
        block = min(CPU_BLOCK, next_pow2(numel))
        launch = [f"{name}[({-(-numel // block)},)]({args}, BLOCK={block})"]
    return Kernel(name, src.getvalue(), launch)

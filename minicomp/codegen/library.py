"""GEMM groups with nothing to fuse, written as PyTorch lines that call cuBLAS (CUDA targets).

A `gemm` group whose one matmul reads its operands through strided views only (reshape,
permute, expand, slice: no cast, cat or other copy before it) and has no epilogue, or only a bias add along N (what eager's `F.linear`
with a bias computes as one `addmm`), gains nothing from a kernel of ours: no bytes are saved
by fusing, and cuBLAS is as fast or faster. On the H200 (benchmarks/results/2026-12-01/
session11-weak.md) our Triton GEMM ran at 0.92x torch.compile's cuBLAS call for bf16
4096x4095x4096, 0.86x for fp32 2048^3 and 0.915x for the lm_head F.linear, and its first call
compiled and tuned for 1.28 s where cuBLAS needs nothing. Such a group is written as
`F.linear` / `torch.matmul` / `torch.addmm` lines of `call()` and recorded on the generated
module as a library choice (`GeneratedModule.library`), not as a fallback: it is what
minicomp chose, not something it could not compile, and it warns about nothing.

A GEMM whose K or N is off 16 bytes (4096 x 4095 x 4096 in bf16) would take cuBLAS's slow path
(0.969 ms against our kernel's 0.237 on the H200), so our kernel computes it. Handing cuBLAS
copies whose rows start on 16 bytes does not help: with K = 4095 read over rows 4096 elements
apart it still took 1.05 ms on the H100, and padding K itself (both operands, then the mm)
took 0.243 ms at best against torch.compile's 0.229 and our kernel's 0.233
(benchmarks/ablations/pad_gemm.py, session 26). Its first call, which waits for our kernel's
compile, is what codegen/first_calls.py serves with cuBLAS's plain (slow) call.

`choice(ctx)` says whether (and why) a group goes to the library; `emit(ctx, out, slot)`
writes its lines. The matmuls that go to cuBLAS whatever follows them (few rows under CUDA
graphs, one of a dual GEMM's pair, a GEMM whose result meets a tile) are named on the graph
before planning, by `library_plan.py`.

Invariants:
- only CUDA targets with `Target.library_gemm` on choose the library; the CPU target never
  does (the interpreter path keeps testing minicomp's own GEMM kernels);
- a library group computes what the reference interpreter computes (the same PyTorch calls),
  and reads PyTorch's fp32 precision switches when it runs, as eager does; the Target's
  `matmul_precision` (our kernels' compile-time copy of them) plays no part;
- the lines hold no sizes, so they serve symbolic sizes unchanged, and launch nothing but
  cuBLAS (and a copy where a layout asks for one): they are safe inside a CUDA graph capture.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.fallback import torch_text
from minicomp.codegen.library_plan import (ALL, DTYPES, FEW, FEW_BIAS, aligned_kn, graph_few_rows,
                                            join_of, rows_text, split_of)
from minicomp.codegen.names import comment_text
from minicomp.ir.composites import linear_bias
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.graph import Node, contiguous_strides
from minicomp.ir.ops.text import py_value
from minicomp.ir.ops.views import STRIDED
from minicomp.plan.rules import topo
from minicomp.plan.specs import GemmSpec
from minicomp.plan.table import library_counts

PLAIN = "cuBLAS: nothing to fuse"
BIAS = "cuBLAS: nothing to fuse but a bias along N (addmm)"


def header_note(chosen: dict[int, str]) -> str:
    """The module header's count of library groups (`, 2 through cuBLAS, 1 through SDPA`; "" for
    none): `chosen` maps group ids to why (cuBLAS here, SDPA: codegen/library_attention.py)."""
    return f", {library_counts(chosen)}" if chosen else ""


def _bias(ctx: KernelCtx, spec: GemmSpec) -> int | None:
    """The bias operand when the group's epilogue is exactly `matmul + bias` with a bias of
    shape [N] read from memory, of the matmul's dtype, added to a 2-D B; else None."""
    g = ctx.graph
    if len(spec.epilogue) != 1:
        return None
    bias = linear_bias(g, spec.epilogue[0], spec.matmuls[0])
    b = g.node(spec.operands[0][1])
    if bias is None or bias in ctx.group.nodes or len(b.shape) != 2 or len(g.node(spec.operands[0][0]).shape) < 2:
        return None
    return bias


def _aligned(ctx: KernelCtx, spec: GemmSpec) -> bool:
    """Whether every static K and N of the group's matmuls is a whole number of 16 bytes.

    cuBLAS's fast kernels read rows whose strides are 16-byte multiples; with K = 4095 in bf16
    it took 0.969 ms on the H200 where our kernel (masked K tail) took 0.237 and torch.compile,
    which pads, 0.217; F.linear to N = 50257 took 1.72 ms against our 0.301
    (results/2026-12-01/session11-final-*.md). A symbolic K or N cannot be told here: cuBLAS."""
    return all(aligned_kn(ctx.graph, mm) for mm in spec.matmuls)


def choice(ctx: KernelCtx) -> str | None:
    """Why the group calls cuBLAS (`PLAIN` or `BIAS`; `FEW` or `FEW_BIAS` when its matmul has
    few rows, `SPLIT` for one of a dual GEMM's pair: the planner kept those alone), or None when a
    kernel of ours computes it: another target, the switch off, a dual GEMM, a prologue that
    computes, an epilogue."""
    target, group = ctx.target, ctx.group
    if target.device_type != "cuda" or not target.library_gemm or group.kind != "gemm":
        return None
    spec = group.spec
    if not isinstance(spec, GemmSpec):
        return None
    if not _aligned(ctx, spec):
        return None         # a K or N off 16 bytes: our kernel's masked tails beat cuBLAS's slow path
    plain = _plain(ctx, spec)
    rows = graph_few_rows(ctx.graph, spec.matmuls[0], target) if plain is not None else None
    if rows is not None:
        return (FEW_BIAS if plain == BIAS else FEW).format(m=rows_text(rows))
    if plain is not None and target.library_all:
        return ALL
    mm = spec.matmuls[0]
    if plain is not None and target.split_dual and (split := split_of(ctx.graph, mm)):
        return split
    if plain is not None and (join := join_of(ctx.graph, mm, target)):
        return join
    return plain


def computes(ctx: KernelCtx) -> bool:
    """Whether cuBLAS computes the GEMM group as it is (one matmul with nothing or a bias to
    fuse), whichever kernel `choice` prefers for it: codegen/first_calls.py lets cuBLAS answer
    while that kernel compiles."""
    return ctx.group.kind == "gemm" and _plain(ctx, ctx.group.spec) is not None


def _plain(ctx: KernelCtx, spec: GemmSpec) -> str | None:
    """`PLAIN` or `BIAS` for one matmul with nothing (or only a bias) to fuse; else None."""
    g, group = ctx.graph, ctx.group
    if len(spec.matmuls) != 1:
        return None
    mm = g.node(spec.matmuls[0])
    a, b = (g.node(x) for x in spec.operands[0])
    if not (a.dtype == b.dtype == mm.dtype and mm.dtype in DTYPES):
        return None
    prologue = [n for n in group.nodes if n != mm.id and n not in spec.epilogue]
    if any(g.node(n).op not in STRIDED for n in prologue):
        # a cast, or a view that copies in PyTorch (cat, flip, roll, pad): our kernel folds it into its loads
        return None
    core, views = _trailing_views(ctx, spec)
    last = (views or core or [mm.id])[-1]
    if list(group.outputs) != [last]:
        return None
    if not core:
        return PLAIN
    try:
        return BIAS if _bias(ctx, replace(spec, epilogue=tuple(core))) is not None else None
    except SymbolicDim:   # a bias length the symbols' ranges do not settle: our kernel
        return None


def _trailing_views(ctx: KernelCtx, spec: GemmSpec) -> tuple[list[int], list[int]]:
    """The epilogue split into what computes and the reshapes after it, each of the one before
    (`addmm(b, x.view(-1, k), w).view(*lead, n)`, as GPT-2's Conv1D writes a linear)."""
    g, core, views = ctx.graph, list(spec.epilogue), []
    while core and g.node(core[-1]).op == "reshape" and \
            g.node(core[-1]).args[0] == (core[-2] if len(core) > 1 else spec.matmuls[0]):
        views.insert(0, core.pop())
    return core, views


def _weight(ctx: KernelCtx, b: int) -> int | None:
    """The [N, K] tensor when operand B is its transpose (`permute(w, (1, 0))`, nn.Linear's
    layout) computed in this group for this matmul only; else None."""
    g = ctx.graph
    node = g.node(b)
    if node.op != "permute" or b not in ctx.group.nodes or tuple(node.attrs.get("dims", ())) != (1, 0):
        return None
    users = [n for n in ctx.group.nodes if b in g.node(n).args]
    return node.args[0] if len(users) == 1 and b not in ctx.group.outputs else None


def emit(ctx: KernelCtx, out: CodeBuilder, opaque_slot: Callable[[Node], int], why: str | None = None) -> None:
    """Write the group as PyTorch lines of call(): the operand views, then one cuBLAS call, then
    the output's layout. The call is eager's: `F.linear(x, w[, bias])` where B is an nn.Linear
    weight's transpose, else `torch.matmul`, or with a bias `torch.addmm` for 2-D A and
    `F.linear(a, b.t(), bias)` over batched A (which folds the batch into M where it can).
    `why` (default: `choice`'s reason) is the comment's: codegen/first_calls.py writes these
    lines for a group whose kernel is ours, to serve until that kernel has compiled."""
    g, spec = ctx.graph, ctx.group.spec
    why = why or choice(ctx)
    out.writeline(f"# calls cuBLAS through PyTorch ({comment_text(why)})")
    mm = g.node(spec.matmuls[0])
    a_id, b_id = spec.operands[0]
    weight = _weight(ctx, b_id)
    core, views = _trailing_views(ctx, spec)

    def view_line(nid: int) -> None:
        node = g.node(nid)
        out.writeline(f"{ctx.buf(nid)} = {torch_text(node, [ctx.buf(x) for x in node.args], opaque_slot)}"
                      f"  # {node.op}")
    prologue = set(ctx.group.nodes) - {mm.id} - set(spec.epilogue)
    for nid in topo(g, prologue):          # the group's own order (not the graph's: 9 ms a group)
        if g.node(nid).op in STRIDED and not (weight is not None and nid == b_id):
            view_line(nid)
    a, b = ctx.buf(a_id), ctx.buf(b_id)
    w = ctx.buf(weight) if weight is not None else None
    bias = ctx.buf(_bias(ctx, replace(spec, epilogue=tuple(core)))) if core else None    # `_plain` admits only a bias
    if weight is not None:
        text = f"torch.nn.functional.linear({a}, {w}{f', {bias}' if bias else ''})"
    elif bias is None:
        text = f"torch.matmul({a}, {b})"
    elif len(g.node(a_id).shape) == 2:
        text = f"torch.addmm({bias}, {a}, {b})"
    else:
        text = f"torch.nn.functional.linear({a}, {b}.t(), {bias})"
    result = core[0] if bias else mm.id
    note = f"%{mm.id} matmul" + (f", %{result} add" if bias else "")
    out.writeline(f"{ctx.buf(result)} = {text}  # {note}")
    for nid in views:                      # the rows grouped back as the program had them
        view_line(nid)
    last = (views or [result])[-1]
    if fresh_dense(ctx, a_id, last, weight is not None and not views):
        return              # F.linear of a dense A returns a fresh dense tensor: the layout it must have
    out.writeline(f"{ctx.buf(last)} = _as_layout({ctx.buf(last)}, {py_value(ctx.strides(last))})")


def fresh_dense(ctx: KernelCtx, a_id: int, result: int, linear: bool) -> bool:
    """Whether the call's result is known to have its layout: `F.linear` over an A whose strides
    are static and row-major returns a new row-major tensor (matmul folds A's rows into one mm),
    allocated by PyTorch and so aligned. `_as_layout` would check that at every call (25 cuBLAS
    calls in a 4-layer Llama's)."""
    a_shape, shape = ctx.graph.node(a_id).shape, ctx.graph.node(result).shape
    return (linear and all(isinstance(d, int) for d in (*a_shape, *shape))      # static sizes only
            and ctx.strides(a_id) == contiguous_strides(a_shape) and ctx.strides(result) == contiguous_strides(shape))

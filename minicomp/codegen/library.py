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

`choice(ctx)` says whether (and why) a group goes to the library; `emit(ctx, out, slot)`
writes its lines. `planned(graph, target)` names, before planning, the matmuls of few rows
that go to cuBLAS whatever follows them (`few_rows`) in a module replayed as CUDA graphs
(mode="reduce-overhead", `Target.graphs`): the planner keeps each in a group of its own, so
its epilogue fuses with what comes after it (the residual add with the next norm, SwiGLU's
silu and product in one pointwise kernel), not as PyTorch ops of one launch each. In the
default mode a call at such sizes is host-bound, and our GEMM with its epilogue fused (one
launch, the skinny configs of gemm_form) wins: a 4-layer Llama at 1 x 16 ran 2.07 ms against
2.46 with the cuBLAS plan, where under CUDA graphs cuBLAS won 0.344 against 0.381 (H200,
results/2026-12-05).

At many rows (prefill), `split_pairs` names before planning one matmul of each dual GEMM's
pair (SwiGLU's gate) for cuBLAS, whose partner is our GEMM with the join in its epilogue
(`Target.split_dual`; MINICOMP_DUAL_GEMM=fused turns it off). `tile_joins` names the matmuls
of many rows and at least `Target.join_min_flop` operations whose result meets a tile of its
own size in a pointwise op (a residual add; the up projection once cuBLAS has the gate): our
GEMM would load that tile in its epilogue, where it runs far under cuBLAS, so cuBLAS computes
the matmul and the join fuses with the next kernel (`JOIN`; MINICOMP_LIBRARY_JOINS=0 turns it off).

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

import math
from dataclasses import replace
from typing import Callable

import networkx as nx
import torch

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.fallback import torch_text
from minicomp.codegen.names import comment_text
from minicomp.ir import dims
from minicomp.ir.composites import linear_bias
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.graph import Node
from minicomp.ir.ops.text import py_value
from minicomp.ir.ops.views import STRIDED
from minicomp.passes.rewrites import pointwise_join
from minicomp.plan.rules import regroups, topo
from minicomp.plan.specs import GemmSpec
from minicomp.plan.table import library_counts

PLAIN = "cuBLAS: nothing to fuse"
BIAS = "cuBLAS: nothing to fuse but a bias along N (addmm)"
# A GEMM of at most SMALL_ROWS output rows over K >= SMALL_MIN_K (`few_rows`) reads its
# weights (K x N) and little else: fusing its epilogue saves 2 * M * N elements against K * N
# read (under 7% at M = 64, K = 2048), while our tiles cover only N / BLOCK_N programs (32 of
# the H200's 132 SMs for N = 2048) and cuBLAS splits K to spread the read over every SM.
# Measured on the H200 (results/2026-12-01/session11-models-early.md): a 4-layer Llama at
# batch 1 x 16 under CUDA graphs took 0.534 ms with our fused GEMMs against torch.compile's
# 0.354 (cuBLAS + Triton pointwise). The planner keeps such a matmul in a group of its own
# (`planned`, plan/rules.py), so what follows it fuses with what comes next.
PLANNED = "{m}, where reading the weights is the work"
FEW = "cuBLAS: " + PLANNED
FEW_BIAS = "cuBLAS: " + PLANNED + ", and its bias (addmm)"
# A dual GEMM (SwiGLU's gate and up projections, sharing A) of many rows is compute-bound, and
# one tile holding two fp32 accumulators runs slower than two GEMMs of one each: on the H100
# (results/2026-12-06/session17-profile-llama-*.txt, 4-layer Llama at 4 x 512, N = 5632,
# K = 2048) our dual kernel took 156 us a layer (605 TFLOP/s) where cuBLAS's GEMM took 61.5 us
# for one of the pair. So cuBLAS computes one matmul of the pair and our GEMM the other, with
# the join (`silu(gate) * up`) in its epilogue reading cuBLAS's result: no pointwise pass.
# At few rows a call is launch- or weight-read-bound and the fused kernel (one launch, A read
# once) stays.
SPLIT = "cuBLAS: one matmul of a dual GEMM over {m}"
SPLIT_MIN_ROWS = 512
# A GEMM of many rows whose result meets, in a pointwise op, another value of its own size (a
# residual add; SwiGLU's up projection once cuBLAS computed the gate) would load that tile in
# its epilogue, and our GEMM with a tile-loading epilogue runs far under cuBLAS: on the H100
# (results/2026-12-06/session18-*, session19-*) `silu(gate) * up` in the epilogue ran at 527
# TFLOP/s against 740 for the same kernel with a residual only, and routing every GEMM through
# cuBLAS (library mode "all") took the CUDA kernel time per call of a 4-layer Llama at 4 x 512
# from 1802 to 1729 us, Qwen2's from 1819 to 1718, BERT's from 1291 to 1139. cuBLAS computes
# such a matmul (its bias by addmm); the join fuses with the next kernel (the residual add into
# the next norm's row kernel, SiLU and the product into one pointwise kernel).
# The cuBLAS call costs more host time than our launch (PyTorch's dispatch, the row views
# around it), and the next norm's kernel reads one more tensor: where the call is host-bound
# that outweighs the GPU time saved. With every such GEMM of 4 x 512 rows joined, GPT-2's call
# (width 1024, host-bound: 1.0 ms wall for 0.85 ms of kernels) took 1.058 ms against 0.962
# while its kernels took 831 us against 873, and BERT's 3.109 against 2.997 (H100,
# results/2026-12-06/session19-library-choice-a4817e7.md). So only GEMMs of at least
# `Target.join_min_flop` join (Llama's and Qwen2's MLPs at 4 x 512: 47 and 56 GFLOP; not
# GPT-2's projections, 4.3 and 17, nor BERT's).
JOIN = "cuBLAS: its result meets a tile of its own size over {m} (the join fuses with the next kernel)"
ALL = "cuBLAS: library mode 'all' (every GEMM; what follows fuses with the next kernel)"
SMALL_ROWS = 64
SMALL_MIN_K = 1024
DTYPES = (torch.float32, torch.float16, torch.bfloat16)   # what cuBLAS multiplies and our kernels do too


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
    return all(_aligned_kn(ctx.graph, mm) for mm in spec.matmuls)


def _aligned_kn(graph, mm: int) -> bool:
    """Matmul `mm`'s K (A's last dim) and N, where static, are whole numbers of 16 bytes."""
    node = graph.node(mm)
    size = node.dtype.itemsize
    return all(dims.any_symbolic((d,)) or (int(d) * size) % 16 == 0
               for d in (graph.node(node.args[0]).shape[-1], node.shape[-1]))


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
        return None        # a K or N off 16 bytes: our kernel's masked tails beat cuBLAS there
    plain = _plain(ctx, spec)
    rows = None if plain is None or not target.graphs else few_rows(ctx.graph, spec.matmuls[0])
    if rows is not None:
        return (FEW_BIAS if plain == BIAS else FEW).format(m=_rows(rows))
    if plain is not None and target.library_all:
        return ALL
    mm = spec.matmuls[0]
    if plain is not None and target.split_dual and (split := _split_of(ctx.graph, mm)):
        return split
    if plain is not None and target.library_joins and _joins(ctx.graph, mm, target.join_min_flop) and \
            not (not target.split_dual and _paired(ctx.graph, mm)):
        return _join_text(ctx.graph, mm)
    return plain


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


def few_rows(graph, nid: int) -> int | None:
    """The rows of matmul `nid` when the few-rows rule holds for the node alone: cuBLAS takes it
    (`_takes`), and it has at most SMALL_ROWS static rows over a static K of at least
    SMALL_MIN_K (and a static N); else None."""
    if not _takes(graph, nid):
        return None
    mm = graph.node(nid)
    rows, k, n = math.prod(mm.shape[:-1]), graph.node(mm.args[0]).shape[-1], mm.shape[-1]
    if dims.any_symbolic((rows, k, n)):
        return None
    return int(rows) if rows <= SMALL_ROWS and k >= SMALL_MIN_K else None


def planned(graph, target) -> dict[int, str]:
    """The matmuls the few-rows rule sends to cuBLAS on a `target` replayed as CUDA graphs
    (`Target.graphs`: in the default mode a call is host-bound, and our GEMM with its epilogue
    fused is one launch where cuBLAS and the epilogue's kernel are two), each with why; in
    library mode "all" (`Target.library_all`) every matmul cuBLAS takes (`_takes`). Empty for a
    target that calls no library. The planner gives each a group of its own (plan/rules.py)."""
    if target.device_type != "cuda" or not target.library_gemm:
        return {}
    if target.library_all:
        return {nid: ALL for nid in graph.nx.nodes if _takes(graph, nid)}
    chosen = split_pairs(graph) if target.split_dual else {}
    if target.library_joins:
        chosen = tile_joins(graph, target.join_min_flop, skip_pairs=not target.split_dual) | chosen
    if not target.graphs:
        return chosen    # the default mode: at few rows a call is host-bound, our fused GEMM saves launches
    rows = {nid: few_rows(graph, nid) for nid in graph.nx.nodes}
    return chosen | {nid: PLANNED.format(m=_rows(m)) for nid, m in rows.items() if m is not None}


def tile_joins(graph, min_flop: int, skip_pairs: bool = False) -> dict[int, str]:
    """The matmuls of many rows and at least `min_flop` operations (`JOIN`) whose result, past a bias along N and reshapes that
    regroup its rows, meets in a pointwise op a value of its own shape that does not depend on
    it: `x + o_proj(h)`, `silu(gate) * up`. Not `gelu(h)`, whose operands all come from the
    matmul's result. `skip_pairs`: leave a matmul of a dual GEMM to its pair (the pair is kept
    one kernel of ours, MINICOMP_DUAL_GEMM=fused)."""
    return {nid: _join_text(graph, nid) for nid in sorted(graph.nx.nodes)
            if _joins(graph, nid, min_flop) and not (skip_pairs and _paired(graph, nid))}


def _joins(graph, nid: int, min_flop: int) -> bool:
    mm = graph.node(nid)
    if mm.op != "matmul" or not _takes(graph, nid) or not _many(math.prod(mm.shape[:-1])):
        return False
    flop = 2 * math.prod(mm.shape) * graph.node(mm.args[0]).shape[-1]
    if not dims.any_symbolic((flop,)) and flop < min_flop:
        return False
    last = nid
    users = graph.users(last)
    if len(users) == 1 and linear_bias(graph, users[0], nid) is not None:
        last = users[0]
    while len(users := graph.users(last)) == 1 and graph.node(users[0]).op == "reshape" \
            and regroups(graph.node(users[0]).shape, mm.shape):
        last = users[0]
    shape = tuple(graph.node(last).shape)
    for u in set(graph.users(last)):
        node = graph.node(u)
        if node.kind != "pointwise" or len(node.args) != 2 or tuple(node.shape) != shape:
            continue
        other = node.args[1] if node.args[0] == last else node.args[0]
        if other != last and tuple(graph.node(other).shape) == shape and not nx.has_path(graph.nx, nid, other):
            return True
    return False


def _paired(graph, nid: int) -> bool:
    """Whether matmul `nid` and another reading its A meet in a pointwise join (a dual GEMM)."""
    a = graph.node(nid).args[0]
    return any(u != nid and graph.node(u).op == "matmul" and graph.node(u).args[0] == a
               and pointwise_join(graph, nid, u, through=("reshape",)) for u in set(graph.users(a)))


def _join_text(graph, mm: int) -> str:
    rows = math.prod(graph.node(mm).shape[:-1])
    return JOIN.format(m="rows the sizes do not settle" if dims.any_symbolic((rows,)) else _rows(int(rows)))


def _many(rows) -> bool:
    return dims.any_symbolic((rows,)) or rows >= SPLIT_MIN_ROWS


def split_pairs(graph) -> dict[int, str]:
    """One matmul of each dual GEMM of many rows, for cuBLAS (`SPLIT`): two matmuls reading the
    same A, of one shape and dtype, whose results meet in a pointwise join (SwiGLU's
    `silu(x @ w_gate) * (x @ w_up)`), with at least SPLIT_MIN_ROWS rows, or rows the sizes do
    not settle (a prefill over a symbolic length). The first of the pair (by node id) goes to
    cuBLAS; the planner then gives the other our GEMM with the join in its epilogue, reading
    cuBLAS's result as a tile (plan/rules.py: an epilogue may compute from memory alone)."""
    by_a: dict[int, list[int]] = {}
    for nid in sorted(graph.nx.nodes):
        if graph.node(nid).op == "matmul":
            by_a.setdefault(graph.node(nid).args[0], []).append(nid)
    return {m: _split_text(graph, m) for mms in by_a.values() for m in _firsts(graph, mms)}


def _split_of(graph, mm: int) -> str | None:
    """`split_pairs`' answer for matmul `mm` alone, from the matmuls reading its A (no walk of
    the whole graph: codegen asks once per GEMM group)."""
    a = graph.node(mm).args[0]
    mms = sorted(u for u in set(graph.users(a)) if graph.node(u).op == "matmul" and graph.node(u).args[0] == a)
    return _split_text(graph, mm) if mm in _firsts(graph, mms) else None


def _firsts(graph, mms: list[int]) -> list[int]:
    """The first matmul of each pair `_split` takes among `mms` (one A's matmuls, by id), each
    matmul in one pair at most."""
    used: set[int] = set()
    firsts = []
    for i, m1 in enumerate(mms):
        for m2 in mms[i + 1:]:
            if m1 not in used and m2 not in used and _split(graph, m1, m2):
                used |= {m1, m2}
                firsts.append(m1)
    return firsts


def _split_text(graph, mm: int) -> str:
    rows = math.prod(graph.node(mm).shape[:-1])
    return SPLIT.format(m="rows the sizes do not settle" if dims.any_symbolic((rows,)) else _rows(int(rows)))


def _split(graph, m1: int, m2: int) -> bool:
    """Whether matmuls `m1` and `m2` (same A) are a dual GEMM worth splitting: one shape and
    dtype, a pointwise join, cuBLAS takes `m1`, and many rows (or rows not settled)."""
    a, b = graph.node(m1), graph.node(m2)
    if a.shape != b.shape or a.dtype != b.dtype or not _takes(graph, m1) or \
            not pointwise_join(graph, m1, m2, through=("reshape",)):
        return False
    return _many(math.prod(a.shape[:-1]))


def _takes(graph, nid: int) -> bool:
    """Whether cuBLAS takes matmul `nid` as well as our kernel would: operands of its dtype, and
    every static K and N a whole number of 16 bytes (see `_aligned`)."""
    mm = graph.node(nid)
    if mm.op != "matmul":
        return False
    a, b = (graph.node(x) for x in mm.args)
    if len(a.shape) < 2 or len(b.shape) < 2 or not (a.dtype == b.dtype == mm.dtype and mm.dtype in DTYPES):
        return False
    return _aligned_kn(graph, nid)


def _rows(m: int) -> str:
    return f"{m} row" if m == 1 else f"{m} rows"


def _weight(ctx: KernelCtx, b: int) -> int | None:
    """The [N, K] tensor when operand B is its transpose (`permute(w, (1, 0))`, nn.Linear's
    layout) computed in this group for this matmul only; else None."""
    g = ctx.graph
    node = g.node(b)
    if node.op != "permute" or b not in ctx.group.nodes or tuple(node.attrs.get("dims", ())) != (1, 0):
        return None
    users = [n for n in ctx.group.nodes if b in g.node(n).args]
    return node.args[0] if len(users) == 1 and b not in ctx.group.outputs else None


def emit(ctx: KernelCtx, out: CodeBuilder, opaque_slot: Callable[[Node], int]) -> None:
    """Write the group as PyTorch lines of call(): the operand views, then one cuBLAS call, then
    the output's layout. The call is eager's: `F.linear(x, w[, bias])` where B is an nn.Linear
    weight's transpose, else `torch.matmul`, or with a bias `torch.addmm` for 2-D A and
    `F.linear(a, b.t(), bias)` over batched A (which folds the batch into M where it can)."""
    g, spec = ctx.graph, ctx.group.spec
    why = choice(ctx)
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
    bias = ctx.buf(_bias(ctx, replace(spec, epilogue=tuple(core)))) if core else None    # `_plain` admits only a bias
    if weight is not None:
        text = f"torch.nn.functional.linear({a}, {ctx.buf(weight)}{f', {bias}' if bias else ''})"
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
    out.writeline(f"{ctx.buf(last)} = _as_layout({ctx.buf(last)}, {py_value(ctx.strides(last))})")

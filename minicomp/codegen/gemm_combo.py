"""Sibling GEMMs that read one A, launched as one persistent kernel (a horizontal GEMM).

Attention's q, k and v projections (and any matmuls of one activation) read the same A and
write three outputs, each with its own epilogue (BERT's and Qwen2's biases). Written one by
one they are three launches; where each is small, each is also a poor wave: BERT-base's
2048 x 768 x 768 projection is 96 tiles of 128 x 128 on 132 SMs, and the host pays a launch
(a cuBLAS call through PyTorch took ~30 us of host time on the H100 machines, session 22's
profiles) for ~7 us of GPU work. BERT makes 36 such calls a forward.

When two or more GEMM groups come one after the other in the launch order, read the same
operand A (the same tensor at the same offsets once views are folded), have one matmul each of
the same M, K and dtype, and all fit the TMA form (`gemm_form.tma_form`: plain fp16/bf16
matrices, static sizes, no batch dims), they run as one kernel:

- descriptors for A and each part's B, made once per program;
- one persistent loop over the union of the parts' output tiles: tile t belongs to the first
  part whose tile count, summed, exceeds it; the part's B descriptor is picked for the tile
  (`if tile >= tiles_0: b_desc = b1_desc`: one K loop, so one set of pipelined shared-memory
  buffers whatever the number of parts);
- one K loop into one fp32 accumulator;
- each part's epilogue in a `@triton.jit` function of its own (`<kernel>_0`, `_1`...: its
  lowering's locals stay apart; Triton inlines it), called in the part's branch.

A tile is still read from A's rows in L2 by each part (A is read from memory about once: the
parts' tiles of one row band run close together). The parts share one autotuned config.

Invariants: the plan is unchanged (its groups, outputs and ledger; only the launch is shared,
and the module's summary says which groups share it); the parts write disjoint outputs and
none reads another's (checked), so the order of their tiles does not matter; a group the
library plan sends to cuBLAS for a reason of its own (a split pair, a tile join, few rows under
CUDA graphs) stays there; anything else (a dual GEMM, a padded operand, int64 offsets, a B of
another layout) keeps each group's own kernel. `Target.gemm_combo` says when: "auto", where
the parts' ledger bounds sum to at most `COMBO_MAX_US` (launch-bound GEMMs; cuBLAS's large
GEMMs beat ours, library_plan.py); "all", any size; "off".
"""

from __future__ import annotations

import math
from dataclasses import replace

from minicomp.codegen import library
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Unsupported, kernel_name
from minicomp.codegen.epilogue import TileLowering
from minicomp.codegen.gemm_configs import CPU_PROGRAMS, GROUP_M, configs
from minicomp.codegen.gemm_form import analyse, needs_int64, tma_form
from minicomp.codegen.gemm_tile import LOCALS, write_configs, write_dots, write_epilogue, write_tile_coords
from minicomp.codegen.gemm_tma import descriptor_load
from minicomp.codegen.sizes import tune_tail
from minicomp.ir.graph import Graph
from minicomp.plan.records import Group
from minicomp.plan.specs import GemmSpec

# The ledger's bound (us) under which sibling GEMMs together share a launch ("auto"). Measured on
# an H100 (results/2026-12-07/session23-library-choice-*, whole models at 4 x 512, bf16):
# - BERT-base's q, k, v (ledger 10.6 us a layer): cuBLAS's three calls took 252.8 us of GPU time a
#   call (12 layers), the combo 290.2 us; the call took 1.39-1.45 ms against 1.78-2.12 (the host
#   makes 24 launches fewer);
# - Qwen2's (N = 1536 + 256 + 256, 12.9 GFLOP): kernel time 1691 against 1709 us, the call 1.850
#   against 2.002 ms;
# - a 4-layer Llama's (width 2048, N = 4096, ledger 50 us a layer): the combo took 202.7 us a
#   call where cuBLAS's took about 211 (kernel time 1651 against 1681 us), the call 1.839 against
#   1.862 ms. Larger sibling sets (width 4096: ~200 us a layer) were not measured: cuBLAS keeps them.
COMBO_MAX_US = 64.0


def partners(graph: Graph, order: list[Group], index: int, forced: dict, mode: str) -> list[Group]:
    """The groups after `order[index]` that may share its launch as parts of one horizontal
    GEMM (module docstring): the longest run of GEMM groups of one matmul each, none reading
    another's outputs, within the size `mode` allows; [] for none. Their kernels' forms are
    checked when written (`emit_run`)."""
    first = order[index]
    if mode == "off" or graph.symbolic or not _single(first, forced):
        return []
    run, written = [], set(first.outputs)
    for group in order[index + 1:]:
        if not _single(group, forced) or written & set(group.inputs):
            break
        run.append(group)
        written |= set(group.outputs)
    while run and mode == "auto" and sum(g.lower_bound_us for g in [first] + run) > COMBO_MAX_US:
        run.pop()
    return run


def _single(group: Group, forced: dict) -> bool:
    return (group.kind == "gemm" and group.id not in forced and isinstance(group.spec, GemmSpec)
            and len(group.spec.matmuls) == 1 and group.lower_bound_us > 0)


def _part(ctx: KernelCtx):
    """(GemmForm, A's TmaOperand, B's TmaOperand) of a group that can be a part, else None."""
    if library.choice(ctx) not in (None, library.PLAIN, library.BIAS):
        return None            # cuBLAS for a reason the library plan made (library_plan.py)
    try:
        spec = analyse(ctx)
        tma = tma_form(ctx, spec)
        wide = needs_int64(ctx)
    except Unsupported:
        return None
    if tma is None or wide or len(spec.mms) != 1:
        return None
    a, (b,) = tma
    return None if a.pad or b.pad else (spec, a, b)


def _shares(first: tuple, other: tuple | None) -> bool:
    """Whether part `other` can share `first`'s kernel: the same A (tensor, offsets, casts), M, K
    and dtypes, A and B read the same way."""
    if other is None:
        return False
    (spec0, a0, b0), (spec, a, b) = first, other
    return ((spec.a.leaf, spec.a.offset, spec.a.casts) == (spec0.a.leaf, spec0.a.offset, spec0.a.casts)
            and (spec.m, spec.k, spec.a.dtype, spec.bs[0].dtype) == (spec0.m, spec0.k, spec0.a.dtype, spec0.bs[0].dtype)
            and (a.ld, a.transposed, b.transposed) == (a0.ld, a0.transposed, b0.transposed))


def emit_run(ctxs: list[KernelCtx]) -> tuple[Kernel, int] | None:
    """One kernel computing the longest run of `ctxs`' groups, from the first, that can share
    one (module docstring), and how many it computes (at least two); None where the first two
    cannot (a group's kernel is not a plain TMA GEMM, or A, M, K, a dtype or a layout differs)."""
    parts = [_part(ctxs[0])]
    if parts[0] is None:
        return None
    for c in ctxs[1:]:
        if not _shares(parts[0], part := _part(c)):
            break
        parts.append(part)
    if len(parts) < 2:
        return None
    ctxs = ctxs[:len(parts)]
    spec0, a0, b0 = parts[0]
    first = ctxs[0]
    name = kernel_name(first, f"gemm{len(parts)}")
    ns = [spec.n for spec, _, _ in parts]
    cuda = first.device_type == "cuda"
    # the configs of one GEMM over all the parts' columns
    cfgs = configs(replace(spec0, n=sum(ns)), first.device_type, tma=True, precision=first.target.matmul_precision)
    # a K loop of one step has nothing to pipeline, and Triton 3.6's pipeliner fails on it beside
    # the per-tile pick of B's descriptor (K = 32 or 64 at BLOCK_K = 64: "TritonGPUPipeline"
    # failed; Triton 3.9 compiles it): one stage there
    cfgs = list(dict.fromkeys((bm, bn, bk, 1 if spec0.k <= bk else stages, warps)
                              for bm, bn, bk, stages, warps in cfgs))

    # each part's epilogue, as a function of its own
    src, params = CodeBuilder(), {spec0.a.leaf: None}
    for spec, _, _ in parts:
        params.setdefault(spec.bs[0].leaf, None)
    epilogues = []        # each part's epilogue function: the tensors it takes
    for p, (ctx, (spec, _, _)) in enumerate(zip(ctxs, parts)):
        body = CodeBuilder()
        low = TileLowering(ctx, body, {"rm": "mask_m[:, None]", "rn": "mask_n[None, :]"}, reserved=LOCALS)
        write_epilogue(ctx, spec, body, low, ["acc"])
        pointers = list(low.pointers.values())
        for ptr in pointers:
            params.setdefault(ptr.nid, None)
        src.writeline("@triton.jit")
        with src.block(f"def {name}_{p}(acc, offs_m, offs_n, {', '.join(q.name for q in pointers)}, "
                       "M: tl.constexpr, N: tl.constexpr):"):
            writes = ", ".join(ctx.graph.node(o).type for o in ctx.group.outputs)
            src.writeline(f"# group {ctx.group.id}'s epilogue: its tile of [{spec.m}, {spec.n}], written to {writes}")
            src.splice(body.getvalue())
        src.writelines(["", ""])
        epilogues.append([q.nid for q in pointers])
    names = _param_names(first, params)
    calls = [f"{name}_{p}(acc, offs_m, offs_n, {', '.join(names[nid] for nid in nids)}, M, N_{p})"
             for p, nids in enumerate(epilogues)]

    sizes = (("M", spec0.m), ("K", spec0.k)) + tuple((f"N_{p}", n) for p, n in enumerate(ns))
    tuned = cuda and len(cfgs) > 1
    if tuned:
        write_configs(src, name, cfgs)
        src.writeline(f"@triton.autotune(configs={name}_configs, key={[s for s, _ in sizes]!r}, {tune_tail()})")
    src.writeline("@triton.jit")
    signature = list(names.values()) + [f"{s}: tl.constexpr" for s, _ in sizes] + [
        f"{d}: tl.constexpr" for d in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
    with src.block(f"def {name}({', '.join(signature)}):"):
        _write_kernel(src, first, parts, names, calls)

    args = tuple(Buf(nid) for nid in names)
    bm, bn, bk, stages, warps = cfgs[0]
    blocks = (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("GROUP_M", GROUP_M))
    tiles = (Blocks(spec0.m, "BLOCK_M"), Blocks(ns[0], "BLOCK_N", more=tuple(ns[1:])))   # every part's column blocks
    if cuda:
        fixed = () if tuned else blocks + (("num_stages", stages), ("num_warps", warps))
        return Kernel(name, src.getvalue(), [Launch(Grid.of(tiles, persistent=True), args, sizes + fixed, tma=True)]), \
            len(parts)
    programs = min(CPU_PROGRAMS, math.prod(Grid.of(tiles).evaluate(dict(blocks))))
    return Kernel(name, src.getvalue(), [Launch(Grid.of(programs), args, sizes + blocks, tma=True)]), len(parts)


def _param_names(ctx: KernelCtx, nids: dict) -> dict[int, str]:
    """A parameter name for each tensor the kernel takes (A, the Bs, the epilogues' tensors)."""
    low = TileLowering(ctx, CodeBuilder(), {}, reserved=LOCALS + ("a_desc", "b_desc", "part_tile"))
    return {nid: low.pointer(nid) for nid in nids}


def _write_kernel(src: CodeBuilder, ctx: KernelCtx, parts: list, names: dict[int, str], calls: list[str]) -> None:
    spec0, a0, b0 = parts[0]
    graph = ctx.graph
    a = graph.node(spec0.a.leaf)
    src.writeline(f"# {len(parts)} matmuls of A %{a.id} {a.type} ([{spec0.m}, {spec0.k}]) by "
                  + ", ".join(f"[{spec0.k}, {spec.n}]" for spec, _, _ in parts)
                  + ": one persistent launch over all their output tiles (codegen/gemm_combo.py)")
    rows, cols = ("K", "M") if a0.transposed else ("M", "K")
    src.writeline(f"a_desc = tl.make_tensor_descriptor({names[spec0.a.leaf]}, shape=[{rows}, {cols}], "
                  f"strides=[{a0.ld}, 1], block_shape=[BLOCK_{rows}, BLOCK_{cols}])")
    for p, (spec, _, b) in enumerate(parts):
        shape, block = (f"N_{p}, K", "BLOCK_N, BLOCK_K") if b.transposed else (f"K, N_{p}", "BLOCK_K, BLOCK_N")
        src.writeline(f"b{p}_desc = tl.make_tensor_descriptor({names[spec.bs[0].leaf]}, shape=[{shape}], "
                      f"strides=[{b.ld}, 1], block_shape=[{block}])" + ("  # read transposed" if b.transposed else ""))
    src.writeline("num_pid_m = tl.cdiv(M, BLOCK_M)")
    ends = []
    for p in range(len(parts)):
        src.writeline(f"end_{p} = {f'end_{p - 1} + ' if p else ''}num_pid_m * tl.cdiv(N_{p}, BLOCK_N)"
                      f"  # tiles of parts 0..{p}")
        ends.append(f"end_{p}")
    src.writeline("# persistent: the grid holds at most one program per SM, each walking output tiles")
    with src.block(f"for tile in range(tl.program_id(0), {ends[-1]}, tl.num_programs(0)):"):
        src.writeline("# the tile's part: its B, its column blocks and its tile number within it")
        src.writeline("b_desc = b0_desc")
        for p in range(1, len(parts)):
            with src.block(f"if tile >= {ends[p - 1]}:"):
                src.writeline(f"b_desc = b{p}_desc")
        n_pids, starts = f"tl.cdiv(N_{len(parts) - 1}, BLOCK_N)", f"{ends[-2]}"
        for p in reversed(range(len(parts) - 1)):
            n_pids = f"tl.where(tile < {ends[p]}, tl.cdiv(N_{p}, BLOCK_N), {n_pids})"
            if p:
                starts = f"tl.where(tile < {ends[p]}, {ends[p - 1]}, {starts})"
        src.writeline(f"num_pid_n = {n_pids}")
        src.writeline(f"part_tile = tile - tl.where(tile < {ends[0]}, 0, {starts})")
        write_tile_coords(src, "part_tile")
        src.writeline("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        with src.block("for k0 in range(0, K, BLOCK_K):"):
            src.writeline(f"a = {descriptor_load('a', a0, 'pid_m * BLOCK_M', 'k0')}")
            src.writeline(f"b = {descriptor_load('b', b0, 'k0', 'pid_n * BLOCK_N')}")
            write_dots(ctx, spec0, src, ["b"], ["acc"])
        for p, call in enumerate(calls):
            test = "else:" if p == len(calls) - 1 else f"{'if' if p == 0 else 'elif'} tile < {ends[p]}:"
            with src.block(test):
                src.writeline(call)

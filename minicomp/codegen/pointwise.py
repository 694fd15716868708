"""Pointwise kernels: one flat 1-D launch over the group's iteration space.

Every output of a pointwise group has the same shape (the planner promises it); the
kernel walks that shape's elements in row-major order, `offs = pid * BLOCK + arange`.
Each output is computed at `Index(shape, flat=offs)`: views move the index, broadcast
operands are read through their shape (strides of 0 in effect), and when every tensor
is contiguous and of the output's shape every access is simply `ptr + offs` (the fast
path, found by the index algebra rather than by a separate template).

On CUDA the block size and warp count are autotuned over a few configs keyed on the
element count; under the CPU interpreter one fixed large block keeps the run short.

When some tensor is read or written across the last dimension (a transpose), the kernel
is 2-D instead: (rows, cols) tiles over (outer dimensions, last dimension), so both the
transposed access and the plain ones run along unit strides inside a tile.

Tiles also pay when an operand is broadcast along the rows (a bias or a norm weight over
the last dimension): a tile loads it once for BLOCK_R rows, where the flat form loads it
again for every element through `offs % n`. On the H200 (`benchmarks/ablations/run.py`,
`gelu_tanh(x*w+b)` over 8192x8192 bf16) the flat form's best was 0.074 ms and a hand-written
tiled kernel's 0.069 ms, the speed of a plain copy of x; the generated tiled kernel runs
0.073 ms, and what the remaining difference is has not been found (BENCHMARKS.md).
"""

from __future__ import annotations

import math

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Unsupported, kernel_name, next_pow2
from minicomp.codegen.lowering import Lowering
from minicomp.codegen.names import comment_text
from minicomp.codegen.sizes import bucket_fit, jit_line, size_args, size_params, tune_tail, tuning_key
from minicomp.ir import dims
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.dtypes import type_str

# (BLOCK, num_warps) tried by the autotuner on CUDA
CUDA_CONFIGS = ((512, 4), (1024, 4), (2048, 8), (4096, 8))
CUDA_TILE_CONFIGS = ((32, 64, 4), (64, 64, 4), (64, 128, 8), (128, 64, 8))   # 2-D: (BLOCK_R, BLOCK_C, warps)
# 2-D tiles for row-broadcast operands: wide rows, 16-32 elements a thread (the ablation's best four)
CUDA_BCAST_TILE_CONFIGS = ((16, 256, 4), (8, 512, 4), (32, 256, 8), (8, 1024, 8))
TILE_MIN = 16              # both tile extents at least this long before 2-D tiles pay
BCAST_MIN_COLS = 256       # rows at least this long before broadcast tiles pay
CPU_BLOCK = 4096           # interpreter: few, large programs (numpy does the vector work)
INT32_LIMIT = 2**31 - 1


def needs_int64(ctx: KernelCtx, nids, numel: int) -> bool:
    """True when some element offset could overflow int32 (over symbolic sizes: at the top of
    the symbols' ranges)."""
    if ctx.graph.symbolic:
        top = lambda d: dims.bounds(d)[1]
        return any(top(1 + sum((d - 1) * s for d, s in zip(ctx.graph.node(n).shape, ctx.strides(n)))) > INT32_LIMIT
                   for n in nids) or top(numel) > INT32_LIMIT
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
        label = comment_text(n.attrs["name"]) if n.op == "input" else f"%{nid}"
        return f"{label} {type_str(n.shape, n.dtype)}"
    ops = ", ".join(f"%{nid} {ctx.graph.node(nid).op}" for nid in ctx.group.nodes
                    if ctx.graph.node(nid).kind not in ("input", "constant"))
    return [f"# computes {ops}",
            f"# reads {', '.join(fmt(n) for n in reads) or 'nothing'}; writes {', '.join(fmt(n) for n in writes)}"]


def autotune_decorator(configs: list[tuple[dict, int]], key: list[str]) -> list[str]:
    """The `@triton.autotune` lines over `configs` ((constexprs, num_warps) pairs); none for a
    single config, which is no choice: the launch passes it (`fixed_config`). Over symbolic
    sizes a sweep keeps the blocks its buckets fit (`sizes.bucket_fit`)."""
    if len(configs) == 1:
        return []
    b = CodeBuilder()
    with b.block("@triton.autotune("):
        with b.block("configs=["):
            for meta, warps in configs:
                b.writeline(f"triton.Config({meta!r}, num_warps={warps}),")
        b.writeline("],")
        b.writeline(f"key={key!r},")
        fit = bucket_fit([("BLOCK", "n_elements_bucket", CUDA_CONFIGS[0][0]), ("BLOCK_R", "n_rows_bucket", 1),
                          ("BLOCK_C", "n_cols_bucket", 16)], key)
        b.writeline(f"{tune_tail(fit)},")
    b.writeline(")")
    return b.getvalue().splitlines()


def fixed_config(configs: list[tuple[dict, int]]) -> tuple[tuple[str, int], ...]:
    """The launch keywords of a kernel with a single config (its constexprs and num_warps);
    () for an autotuned one."""
    if len(configs) != 1:
        return ()
    meta, warps = configs[0]
    return tuple(meta.items()) + (("num_warps", warps),)


def _mask_2d(syms: frozenset) -> str | None:
    r, c = "rows" in syms, "cols" in syms
    return "mask" if (r and c) else "row_mask" if r else "col_mask" if c else None


def _build(ctx: KernelCtx, shape: tuple[int, ...], tiled: bool) -> tuple[Lowering, CodeBuilder]:
    """Lower every output at the kernel's index: `offs` (flat), or (rows, cols) over a 2-D tile.

    In a tile, lines that use only the rows or only the columns (a bias or norm weight
    broadcast over the rows, and what is computed from it alone) come first, before any
    line over the whole tile: their loads hit L2 and are issued ahead of the big streamed
    load. Generated as written, `x` before `w` and `b`, gelu_tanh(x*w+b) over 8192^2 took
    0.0720 ms; with w and b loaded first, 0.0687 ms, as fast as the hand-written kernel
    (H200, `benchmarks/ablations/run.py --only pw_kernel`). Moving them cannot break an order:
    a line's operands never use more symbols than the line."""
    body = CodeBuilder()
    numel = math.prod(shape)
    if tiled:
        n = shape[-1]
        head, tile = CodeBuilder(), CodeBuilder()
        low = Lowering(ctx, builder_for=lambda syms: tile if {"rows", "cols"} <= syms else head, mask_for=_mask_2d)
        idx = ix.Index(shape, flat=ix.sym("rows", numel // n) * n + ix.sym("cols", n))
        block = "[BLOCK_R, BLOCK_C]"
    else:
        low = Lowering(ctx, builder_for=lambda syms: body, mask_for=lambda syms: "mask" if syms else None)
        idx, block = ix.Index(shape, flat=ix.sym("offs", max(numel, 1))), "[BLOCK]"
    for o in ctx.group.outputs:
        low.store(o, idx, block)
    if tiled:
        body.splice(head.getvalue())
        body.splice(tile.getvalue())
    return low, body


def _wants_tiles(ctx: KernelCtx, shape: tuple[int, ...]) -> tuple[Lowering, CodeBuilder, str] | None:
    """A 2-D lowering, and why, when some access runs along the outer dimensions rather than the
    last one (a transpose: a [BLOCK_R, BLOCK_C] tile reads and writes both in long unit-stride
    runs), or when an operand is read along the last dimension only (broadcast over the rows:
    a tile loads it once for BLOCK_R rows)."""
    if len(shape) < 2 or shape[-1] < TILE_MIN or math.prod(shape[:-1]) < TILE_MIN:
        return None
    low, body = _build(ctx, shape, tiled=True)
    if any(ix.unit_stride_in(o, "rows") and not ix.unit_stride_in(o, "cols") for o in low.offsets):
        return low, body, "transposed"
    if shape[-1] >= BCAST_MIN_COLS and any(ix.syms(o) == frozenset({"cols"}) for o in low.offsets):
        return low, body, "broadcast"
    return None


def alias_source(ctx: KernelCtx) -> int | None:
    """The buffer a group of views already holds, element for element, at the output's own
    strides, or None. `attn.transpose(1, 2).reshape(b, s, h * d)` where the attention wrote
    [b, s, h, d] in memory is a copy that moves nothing: its load and store offsets are both
    the flat index. The module then makes the output a strided view of that buffer, no kernel.
    Only a buffer the module allocates and does not also return: an output that shares memory
    with an input, a weight or another output would be a view where eager gives a copy."""
    g, group = ctx.graph, ctx.group
    if g.symbolic or len(group.outputs) != 1:
        return None
    out = g.node(group.outputs[0])
    computed = [n for n in group.nodes if n not in group.inputs]
    if not computed or any(g.node(n).kind != "view" for n in computed):
        return None
    low, _ = _build(ctx, out.shape, tiled=False)
    reads = [n for n in low.pointers if n != out.id]
    if len(reads) != 1:
        return None
    src = g.node(reads[0])
    if (src.op in ("input", "constant") or src.id in g.outputs or src.dtype != out.dtype
            or src.numel != out.numel):
        return None
    flat = ix.sym("offs", max(out.numel, 1))
    return src.id if len(low.offsets) == 2 and all(o == flat for o in low.offsets) else None


def as_view(ctx: KernelCtx) -> tuple[str, list[str]] | None:
    """For a group `alias_source` finds a buffer for: the plan summary's words and the module's
    lines that make the output a view of it."""
    src = alias_source(ctx)
    if src is None:
        return None
    (o,) = ctx.group.outputs
    return (f"no kernel: a view of %{src}, laid out as the output",
            [f"# the views move no element: %{o} is %{src}'s memory at its own strides",
             f"{ctx.buf(o)} = {ctx.buf(src)}.as_strided({tuple(ctx.graph.node(o).shape)!r}, {ctx.strides(o)!r})"])


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
    symbolic = graph.symbolic
    try:
        tiles = _wants_tiles(ctx, shape)
    except SymbolicDim:          # whether tiles pay depends on the sizes: the flat form serves them all
        tiles = None
    low, body = tiles[:2] if tiles else _build(ctx, shape, tiled=False)

    reads = [n for n in low.pointers if n not in group.outputs]
    wide = needs_int64(ctx, list(low.pointers), numel)
    params = [low.pointers[n].name for n in reads] + [low.pointers[n].name for n in group.outputs]
    # broadcast tiles take their sizes as constexpr: with a runtime n_cols, the tile coordinates
    # `pid // col_blocks` and the masks cost 0.082 ms where constants gave 0.072 (H200 ablation)
    sizes = (["n_rows: tl.constexpr", "n_cols: tl.constexpr"] if tiles and tiles[2] == "broadcast"
             else ["n_rows", "n_cols"])
    if symbolic and tiles and tiles[2] == "broadcast":
        sizes = ["n_rows", "n_cols"]            # runtime sizes: no constexpr specialisation per size
    touched = list(group.nodes) + list(group.inputs)
    # over symbolic sizes the autotuner keys on power-of-two buckets: one tuning per bucket
    if tiles:
        key, tune_params, tune_args = tuning_key([("n_rows", math.prod(shape[:-1])), ("n_cols", shape[-1])])
    else:
        key, tune_params, tune_args = tuning_key([("n_elements", numel)])
    params += ((sizes + size_params(graph, touched) + tune_params + ["BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"])
               if tiles else ["n_elements"] + size_params(graph, touched) + tune_params + ["BLOCK: tl.constexpr"])
    start = (lambda pid: f"{pid}.to(tl.int64)") if wide else (lambda pid: pid)

    src = CodeBuilder()
    configs: list[tuple[dict, int]] = []
    if ctx.device_type == "cuda" and tiles:
        table = CUDA_BCAST_TILE_CONFIGS if tiles[2] == "broadcast" else CUDA_TILE_CONFIGS
        configs = [({"BLOCK_R": r, "BLOCK_C": c}, w) for r, c, w in table]
        src.writelines(autotune_decorator(configs, key))
    elif ctx.device_type == "cuda":
        fitting = list(CUDA_CONFIGS) if symbolic else [
            c for c in CUDA_CONFIGS if c[0] <= max(next_pow2(numel), CUDA_CONFIGS[0][0])]
        configs = [({"BLOCK": b}, w) for b, w in fitting]
        src.writelines(autotune_decorator(configs, key))
    src.writeline(jit_line(graph, touched, params, free=("n_rows",) if tiles else ()))
    with src.block(f"def {name}({', '.join(params)}):"):
        src.writelines(io_comment(ctx, reads, group.outputs))
        if tiles and tiles[2] == "broadcast":
            src.writeline("# 2-D tiles: an operand broadcast over the rows is loaded once per tile;")
            src.writeline("# tiles in row-major order on one grid axis: neighbouring programs read neighbouring")
            src.writeline("# memory (no 65535 limit on the row blocks, as a second grid axis would have)")
            src.writeline("pid = tl.program_id(0)")
            src.writeline("col_blocks = tl.cdiv(n_cols, BLOCK_C)")
            src.writeline(f"rows = {start('(pid // col_blocks)')} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
            src.writeline(f"cols = {start('(pid % col_blocks)')} * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]")
            src.writeline("row_mask = rows < n_rows")
            src.writeline("col_mask = cols < n_cols")
            src.writeline("mask = row_mask & col_mask")
        elif tiles:
            src.writeline("# 2-D tiles: some tensor is read or written across the last dimension (a transpose)")
            src.writeline(f"rows = {start('tl.program_id(0)')} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
            src.writeline(f"cols = {start('tl.program_id(1)')} * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]")
            src.writeline("row_mask = rows < n_rows")
            src.writeline("col_mask = cols < n_cols")
            src.writeline("mask = row_mask & col_mask")
        else:
            src.writeline("pid = tl.program_id(0)")
            src.writeline(f"offs = {start('pid')} * BLOCK + tl.arange(0, BLOCK)")
            src.writeline("mask = offs < n_elements")
        src.splice(body.getvalue())

    bufs = tuple(Buf(n) for n in reads) + tuple(Buf(n) for n in group.outputs)
    if numel == 0:
        return Kernel(name, src.getvalue(), [], note="nothing to compute (0 elements)")
    extra = size_args(graph, touched) + tune_args
    if tiles:
        n_cols = shape[-1]
        n_rows = numel // n_cols
        one_axis = tiles[2] == "broadcast"
        args = bufs + (n_rows, n_cols) + extra
        if symbolic and ctx.device_type != "cuda":
            br = bc = 64
            rows, cols = Blocks(n_rows, "BLOCK_R"), Blocks(n_cols, "BLOCK_C")
            grid = Grid.of((rows, cols)) if one_axis else Grid.of(rows, cols)
            launch = Launch(grid, args, (("BLOCK_R", br), ("BLOCK_C", bc)))
        elif ctx.device_type == "cuda":
            rows, cols = Blocks(n_rows, "BLOCK_R"), Blocks(n_cols, "BLOCK_C")
            grid = Grid.of((rows, cols)) if one_axis else Grid.of(rows, cols)
            launch = Launch(grid, args, fixed_config(configs))
        else:
            br, bc = min(next_pow2(n_rows), 64), min(next_pow2(n_cols), 64)
            rows, cols = -(-n_rows // br), -(-n_cols // bc)
            grid = Grid.of(rows * cols) if one_axis else Grid.of(rows, cols)
            launch = Launch(grid, args, (("BLOCK_R", br), ("BLOCK_C", bc)))
    elif ctx.device_type == "cuda":
        launch = Launch(Grid.of(Blocks(numel, "BLOCK")), bufs + (numel,) + extra, fixed_config(configs))
    elif symbolic:
        launch = Launch(Grid.of(Blocks(numel, "BLOCK")), bufs + (numel,) + extra, (("BLOCK", CPU_BLOCK),))
    else:
        block = min(CPU_BLOCK, next_pow2(numel))
        launch = Launch(Grid.of(-(-numel // block)), bufs + (numel,), (("BLOCK", block),))
    return Kernel(name, src.getvalue(), [launch])

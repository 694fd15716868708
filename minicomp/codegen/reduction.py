"""Reduction kernels: a row kernel over one reduction domain (shape S, axes A).

The domain is the plan's decision (the group's `ReductionSpec`: S, A, the reductions in
order and the scans); this module checks only that it can write them. Each reduction's
accumulator is codegen/row_reduce.py's, each scan codegen/scan.py's; a scan is a value per
element, computed where the lowering asks for it (scans along A's one axis). A 0-d S is one
row of one element (A empty); an empty A axis gives each row the reduction's neutral value.

The domain is viewed as a matrix: rows = the kept dimensions of S (row-major), columns =
the reduced ones. One program owns BLOCK_R rows; tiles are [BLOCK_R, BLOCK_C] with the
reduced axis along tile axis 1. Index symbols: `rows` ([BLOCK_R, 1]) and `cols`
([1, BLOCK_C]); an element of S sits at rows * n_cols + cols when A is trailing (so a
contiguous row is read as `ptr + rows * n + cols`), else at the strided place its
dimensions give.

The forms:
- single pass (row length <= the target's `RowForm.single_pass_max`): the row is one tile, loaded once; each
  reduction in turn is a `tl.sum/max/min` over axis 1 of values already in registers;
- looped: each reduction is its own loop over column blocks (recomputing its prologue,
  which may use the reductions before it: softmax's sum loop uses the max), then one
  epilogue loop writes the full-shape outputs;
- columns: the looped form with many rows and a few columns per tile, chosen when the
  tensors read are contiguous along rows rather than along the reduced axis (a sum over
  axis 0 of a row-major matrix), so each load still reads consecutive addresses.
- split (codegen/split_reduce.py): two kernels, when the row blocks are too few programs to
  fill the device (a sum over axis 0 of a tall matrix, logsumexp over a few vocabulary rows):
  programs share each row and write fp32 partials, a second kernel combines them.

Values that depend on rows only (reductions, their post-processing, row-shaped loads)
are written outside the loops and reused; the accumulator is fp32 (the compute type of
the reduction's dtype) and padding lanes hold the reduction's neutral element. Kernels
that use row_lib's combine functions import them through `Kernel.shared`.
"""

from __future__ import annotations

from minicomp.codegen import indexing as ix
from minicomp.codegen import split_reduce
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Runtime, When, kernel_name, next_pow2
from minicomp.codegen.pointwise import autotune_decorator, fixed_config, io_comment, needs_int64
from minicomp.codegen.row_kernel import HELPERS_IMPORT, RowKernel, column_major, domain, needed_reductions
from minicomp.codegen.sizes import OWN_NAMES, jit_line, size_args, size_params, tuning_key
from minicomp.ir import dims
from minicomp.plan.specs import ReductionSpec

CPU_TILE = 4096              # interpreter: BLOCK_R * BLOCK_C of a single-pass tile
CUDA_LOOP_CONFIGS = ((1024, 4), (2048, 8), (4096, 8))
CUDA_COLUMN_CONFIGS = ((16, 64, 2), (32, 64, 4), (32, 32, 2), (64, 32, 4))   # (BLOCK_R, BLOCK_C, warps): enough programs


def _cuda_configs(dom: ReductionSpec, form: str) -> list[tuple[dict, int]]:
    if form == "columns":
        return [({"BLOCK_R": r, "BLOCK_C": c}, w) for r, c, w in CUDA_COLUMN_CONFIGS]
    if form == "looped":
        return [({"BLOCK_R": 1, "BLOCK_C": c}, w) for c, w in CUDA_LOOP_CONFIGS]
    bc = next_pow2(dom.n_cols)
    rows = 128 if dims.is_symbolic(dom.n_rows) else next_pow2(dom.n_rows)    # symbolic rows: no cap by the count
    brs = [br for br in (1, 2, 4, 8, 16, 32, 64, 128) if br <= rows and (br == 1 or br * bc <= 8192)]
    # 32 and 16 elements per thread. Measured on the H200 (benchmarks/ablations/run.py, softmax over
    # 16384x4096 bf16): a 4096-wide tile ran 0.070 ms with 4 warps, 0.072 with 8, 0.089 with 16
    # and 0.147 with 32; an 8192-wide tile (two rows) 0.070 with 8 and 0.080 with 16. Too many
    # threads per row is what held softmax and layernorm to ~60% of copy bandwidth before.
    out = []
    for br in brs[-4:]:
        tile = br * bc
        for warps in sorted({min(16, max(1, tile // 1024)), min(16, max(1, tile // 512))}):
            out.append(({"BLOCK_R": br}, warps))
    return out


def _build(ctx: KernelCtx, dom: ReductionSpec, single: bool) -> RowKernel:
    k = RowKernel(ctx, dom, single)
    pending = needed_reductions(ctx, dom)
    while pending:
        r = pending.pop(0)
        partner = k.online_partner(r, pending)
        if partner is not None:
            pending.remove(partner)
            k.reduce_online(r, partner)
        else:
            k.reduce(r, pending)
    k.store_outputs()
    return k

def _block_sizes(dom: ReductionSpec, form: str, ctx: KernelCtx, rows_hint: bool = False) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C) under the interpreter (CUDA autotunes instead); `rows_hint`: the
    row count is symbolic, so BLOCK_R does not shrink to it."""
    rows = (lambda cap: cap) if rows_hint else (lambda cap: min(next_pow2(dom.n_rows), cap))
    if form == "single":
        bc = next_pow2(dom.n_cols)
        return rows(max(1, CPU_TILE // bc)), bc
    if form == "columns":
        return rows(64), min(next_pow2(dom.n_cols), 32)
    return 1, ctx.target.row_form.cpu_loop_block


def emit(ctx: KernelCtx) -> Kernel:
    dom = domain(ctx)
    if dims.is_symbolic(dom.n_cols):
        return _emit_symbolic_row(ctx, dom)
    split = split_reduce.emit(ctx, dom)        # rows too few or too long to fill the device: two stages
    if split is not None:
        return split
    single = dom.n_cols <= max(ctx.target.row_form.single_pass_max, 1)      # a row of one element is always one tile
    k = _build(ctx, dom, single)
    form = "single" if single else "looped"
    if dom.n_rows > 1 and column_major(k):
        k, form, single = _build(ctx, dom, False), "columns", False
    name = kernel_name(ctx, "red")
    src, args = _text(ctx, dom, k, form, name)
    shared = HELPERS_IMPORT if k.helpers else ""
    if dom.n_rows == 0:
        return Kernel(name, src, [], note="nothing to compute (0 rows)", shared=shared)
    if ctx.device_type == "cuda":
        kwargs = ((("BLOCK_C", next_pow2(dom.n_cols)),) if single else ()) + fixed_config(_cuda_configs(dom, form))
        launch = Launch(Grid.of(Blocks(dom.n_rows, "BLOCK_R")), args, kwargs)
    elif dims.is_symbolic(dom.n_rows):
        br, bc = _block_sizes(dom, form, ctx, rows_hint=True)
        launch = Launch(Grid.of(Blocks(dom.n_rows, "BLOCK_R")), args, (("BLOCK_R", br), ("BLOCK_C", bc)))
    else:
        br, bc = _block_sizes(dom, form, ctx)
        launch = Launch(Grid.of(-(-dom.n_rows // br)), args, (("BLOCK_R", br), ("BLOCK_C", bc)))
    return Kernel(name, src, [launch], shared=shared)


def _emit_symbolic_row(ctx: KernelCtx, dom: ReductionSpec) -> Kernel:
    """Rows of symbolic length: both forms, and call() launches the one the row fits
    (single pass up to the target's `row_form.single_pass_max`, looped beyond), with the tile sized from the row at
    run time (codegen/sizes.py). Reductions over leading axes (the columns form) serve every
    length with one kernel."""
    looped = _build(ctx, dom, False)
    name = kernel_name(ctx, "red")
    if ix.known(lambda: dom.n_rows > 1) and column_major(looped):
        src, args = _text(ctx, dom, looped, "columns", name)
        launch = _launch_columns(ctx, dom, args)
        return Kernel(name, src, [launch], shared=HELPERS_IMPORT if looped.helpers else "")
    single = _build(ctx, dom, True)
    one = f"{name}_row"
    src_one, args = _text(ctx, dom, single, "single", one)
    src_loop, _ = _text(ctx, dom, looped, "looped", name)
    n = dims.py(dom.n_cols, OWN_NAMES)
    most = ctx.target.row_form.single_pass_max
    bc = Runtime(f"_rt.next_pow2({n})", next_pow2(min(dims.hint(dom.n_cols), max(most, 1))))
    fits = When(dom.n_cols, most)
    longer = When(dom.n_cols, most, at_most=False)
    grid = Grid.of(Blocks(dom.n_rows, "BLOCK_R"))
    if ctx.device_type == "cuda":
        # the single-pass tile from the row's length: BLOCK_R rows of BLOCK_C, about 4096 elements
        # and 16 per thread (the static configs' best, BENCHMARKS.md); not autotuned per length
        br = Runtime(f"max(1, 4096 // _rt.next_pow2({n}))", max(1, 4096 // bc.hint))
        warps = Runtime(f"max(1, min(16, _rt.next_pow2({n}) // 512))", max(1, min(16, bc.hint // 512)))
        launches = [Launch(grid, args, (("BLOCK_R", br), ("BLOCK_C", bc), ("num_warps", warps)), fn=one, when=fits),
                    Launch(grid, args, (), when=longer)]
    else:
        br = Runtime(f"max(1, {CPU_TILE} // _rt.next_pow2({n}))", max(1, CPU_TILE // bc.hint))
        launches = [Launch(grid, args, (("BLOCK_R", br), ("BLOCK_C", bc)), fn=one, when=fits),
                    Launch(grid, args, (("BLOCK_R", 1), ("BLOCK_C", ctx.target.row_form.cpu_loop_block)),
                           when=longer)]
    helpers = HELPERS_IMPORT if (single.helpers or looped.helpers) else ""
    return Kernel(name, src_one.rstrip("\n") + "\n\n\n" + src_loop, launches, shared=helpers)


def _launch_columns(ctx: KernelCtx, dom: ReductionSpec, args: tuple) -> Launch:
    grid = Grid.of(Blocks(dom.n_rows, "BLOCK_R"))
    if ctx.device_type == "cuda":
        return Launch(grid, args)
    return Launch(grid, args, (("BLOCK_R", 64), ("BLOCK_C", 32)))


def _text(ctx: KernelCtx, dom: ReductionSpec, k: RowKernel, form: str, name: str) -> tuple[str, tuple]:
    """The kernel's text in `form` (autotuned on CUDA, except a single pass over symbolic
    rows, whose tile call() sizes), and its launch arguments."""
    group = ctx.group
    single = form == "single"
    low = k.low
    reads = [n for n in low.pointers if n not in group.outputs]
    wide = needs_int64(ctx, list(low.pointers), dom.n_rows * dom.n_cols)
    touched = list(group.nodes) + list(group.inputs)
    params = [low.pointers[n].name for n in reads] + [low.pointers[n].name for n in group.outputs]
    key, tune_params, tune_args = tuning_key([("n_rows", dom.n_rows), ("n_cols", dom.n_cols)])
    params += (["n_rows", "n_cols"] + size_params(ctx.graph, touched) + tune_params
               + ["BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"])

    src = CodeBuilder()
    if ctx.device_type == "cuda" and not (single and dims.is_symbolic(dom.n_cols)):
        src.writelines(autotune_decorator(_cuda_configs(dom, form), key))
    # rows are the contiguous axis of the "columns" form: its row mask keeps loads vectorised
    src.writeline(jit_line(ctx.graph, touched, params, free=() if form == "columns" else ("n_rows",)))
    with src.block(f"def {name}({', '.join(params)}):"):
        src.writelines(io_comment(ctx, reads, group.outputs))
        how = {"single": "one tile per row block", "looped": "looped over column blocks",
               "columns": "looped over column blocks, many rows at a time (rows are contiguous)"}[form]
        what = "reduced over axes" if dom.reductions else "scanned along axis"
        src.writeline(f"# domain {list(dom.shape)} {what} {list(dom.axes)}: "
                      f"{dom.n_rows} rows of {dom.n_cols}, {how}")
        src.writeline("pid = tl.program_id(0)")
        start = "pid.to(tl.int64)" if wide else "pid"
        src.writeline(f"rows = {start} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        src.writeline("row_mask = rows < n_rows")
        if single:
            src.writeline("cols = tl.arange(0, BLOCK_C)[None, :]")
            src.writeline("col_mask = cols < n_cols")
            src.writeline("mask = row_mask & col_mask")
        src.splice(k.main.getvalue())
    args = (tuple(Buf(n) for n in reads) + tuple(Buf(n) for n in group.outputs) + (dom.n_rows, dom.n_cols)
            + size_args(ctx.graph, touched) + tune_args)
    return src.getvalue(), args

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

Two forms:
- single pass (row length <= the target's `RowForm.single_pass_max`): the row is one tile, loaded once; each
  reduction in turn is a `tl.sum/max/min` over axis 1 of values already in registers;
- looped: each reduction is its own loop over column blocks (recomputing its prologue,
  which may use the reductions before it: softmax's sum loop uses the max), then one
  epilogue loop writes the full-shape outputs;
- columns: the looped form with many rows and a few columns per tile, chosen when the
  tensors read are contiguous along rows rather than along the reduced axis (a sum over
  axis 0 of a row-major matrix), so each load still reads consecutive addresses.

Values that depend on rows only (reductions, their post-processing, row-shaped loads)
are written outside the loops and reused; the accumulator is fp32 (the compute type of
the reduction's dtype) and padding lanes hold the reduction's neutral element. Kernels
that use row_lib's combine functions import them through `Kernel.shared`.
"""

from __future__ import annotations

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen import row_reduce, scan
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import (Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Runtime, Unsupported, When,
                                     group_spec, kernel_name, next_pow2)
from minicomp.codegen.lowering import Lowering
from minicomp.codegen.pointwise import autotune_decorator, fixed_config, io_comment, needs_int64
from minicomp.codegen.sizes import OWN_NAMES, jit_line, size_args, size_params, tuning_key
from minicomp.codegen.tlexpr import Val, convert
from minicomp.ir import dims
from minicomp.plan.specs import ReductionSpec

CPU_TILE = 4096              # interpreter: BLOCK_R * BLOCK_C of a single-pass tile
CUDA_LOOP_CONFIGS = ((1024, 4), (2048, 8), (4096, 8))
CUDA_COLUMN_CONFIGS = ((16, 64, 2), (32, 64, 4), (32, 32, 2), (64, 32, 4))   # (BLOCK_R, BLOCK_C, warps): enough programs
REDUCTIONS = row_reduce.REDUCTIONS
# the combine functions of scans, index reductions and products (runtime/row_lib.py), imported
# once per module that needs them (`Kernel.shared`: one text for every kernel, so written once)
ROW_HELPERS = ("_add_combine", "_mul_combine", "_argmax_combine", "_argmin_combine", "_cummax_combine",
               "_cummin_combine", "_logaddexp_combine")
HELPERS_IMPORT = f"from minicomp.runtime.row_lib import {', '.join(ROW_HELPERS)}"


def full_index(dom: ReductionSpec, rows: ix.Expr, cols: ix.Expr) -> ix.Index:
    """The canonical index into the domain S at (rows, cols). A row of one element is its row:
    the index is `rows` alone, so a keepdim reduction over a size-1 axis (shape S) is read at
    the same index as the element it reduces."""
    if dom.n_cols == 1:
        return ix.Index(dom.shape, flat=rows)
    if dom.trailing:
        return ix.Index(dom.shape, flat=rows * dom.n_cols + cols)
    kept = [d for i, d in enumerate(dom.shape) if i not in dom.axes]
    red = [d for i, d in enumerate(dom.shape) if i in dom.axes]
    kd = iter(ix.Index(tuple(kept), flat=rows).to_dims())
    rd = iter(ix.Index(tuple(red), flat=cols).to_dims())
    return ix.dims_index(dom.shape, [next(rd) if i in dom.axes else next(kd) for i in range(len(dom.shape))])


def domain(ctx: KernelCtx) -> ReductionSpec:
    """The group's domain, as the plan decided it, if this emitter can write its reductions."""
    dom = group_spec(ctx, ReductionSpec)
    for r in dom.reductions + dom.scans:
        n = ctx.graph.node(r)
        if n.op not in REDUCTIONS + scan.SCANS:
            raise Unsupported(f"{n.kind} op {n.op!r}")
    return dom


class RowKernel:
    """Writes the body of one row kernel; `single` picks the form."""

    def __init__(self, ctx: KernelCtx, dom: ReductionSpec, single: bool):
        self.ctx, self.dom, self.single = ctx, dom, single
        self.main = CodeBuilder()
        self.loop: CodeBuilder | None = None
        self.low = Lowering(ctx, self._builder_for, self._mask_for)
        self.low.reduction_value = self._reduction_value
        self.rows = ix.sym("rows", max(dom.n_rows, 1))
        self.cols = ix.sym("cols", max(dom.n_cols, 1))
        self.reduced: dict[int, Val] = {}
        self.shared: dict[tuple[str, int], Val] = {}   # (op, operand) -> a row value one reduction gave another
        self.helpers = False                            # uses runtime/row_lib.py's combine functions

    def _builder_for(self, syms: frozenset) -> CodeBuilder:
        return self.loop if (self.loop is not None and "cols" in syms) else self.main

    @staticmethod
    def _mask_for(syms: frozenset) -> str | None:
        r, c = "rows" in syms, "cols" in syms
        return "mask" if (r and c) else "row_mask" if r else "col_mask" if c else None

    @property
    def s_index(self) -> ix.Index:
        return full_index(self.dom, self.rows, self.cols)

    def _reduction_value(self, node, idx: ix.Index) -> Val:
        if node.kind == "scan":
            return scan.scan_value(self, node, idx)
        if node.id not in self.reduced:
            raise Unsupported(f"{node.describe()} is used before it is reduced")
        if idx.key() != ix.Index(node.shape, flat=self.rows).key():
            raise Unsupported(f"{node.describe()} is read at another row than its own (a view across rows)")
        return self.reduced[node.id]

    # ------------------------------------------------------------------ loops
    def col_builder(self) -> CodeBuilder:
        """Where a line over the columns goes: the open loop, else the single tile's body."""
        return self._builder_for(frozenset({"cols"}))

    def open_loop(self) -> CodeBuilder:
        self.low.forget("cols")
        self.loop = CodeBuilder()
        self.loop.writeline("cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        self.loop.writeline("col_mask = cols < n_cols")
        self.loop.writeline("mask = row_mask & col_mask")
        return self.loop

    def close_loop(self) -> None:
        with self.main.block("for c0 in range(0, n_cols, BLOCK_C):"):
            self.main.splice(self.loop.getvalue())
        self.loop = None
        self.low.forget("cols")

    # ------------------------------------------------------------------ reductions
    def reduce(self, nid: int, pending: list[int]) -> None:
        row_reduce.reduce(self, nid, pending)

    def online_partner(self, m_id: int, pending: list[int]) -> int | None:
        """A later `sum(exp(a - m))` that can share the loop of `m = amax(a)` (online softmax)."""
        g, computed = self.ctx.graph, self.low.computed
        m = g.node(m_id)
        if self.single or m.op != "amax" or m.dtype != torch.float32:
            return None
        for r in pending:
            s = g.node(r)
            e = g.node(s.args[0]) if s.op == "sum" else None
            if e is None or e.op != "exp" or e.id not in computed:
                continue
            d = g.node(e.args[0])
            if (d.op == "sub" and d.id in computed and tuple(d.args) == (m.args[0], m_id)
                    and s.dtype == e.dtype == d.dtype == torch.float32):
                return r
        return None

    def reduce_online(self, m_id: int, s_id: int) -> None:
        """One loop for max and sum of exp(x - max): each lane keeps its running max and rescales its sum."""
        m = self.ctx.graph.node(m_id)
        low = self.low
        mx, sm = low.names.fresh(f"amax{m_id}"), low.names.fresh(f"sum{s_id}")
        row_reduce.online_max_sumexp(self, lambda: convert(low.value(m.args[0], self.s_index), m.dtype),
                                     "tl.float32", mx, sm, "softmax")
        self.reduced[m_id] = Val(mx, m.dtype, frozenset({"rows"}))
        self.reduced[s_id] = Val(sm, torch.float32, frozenset({"rows"}))

    # ------------------------------------------------------------------ outputs
    def output_index(self, nid: int) -> ix.Index | None:
        """Where the element at (rows, cols) lands in output `nid`: the domain, a reduced shape,
        or a permute/reshape of one of those (a transposed softmax output); None otherwise."""
        g, dom = self.ctx.graph, self.dom
        node = g.node(nid)
        keep, drop = dom.reduced_shapes()
        if node.shape == dom.shape:
            return self.s_index
        if node.shape in (keep, drop):
            return ix.Index(node.shape, flat=self.rows)
        if node.op in ("permute", "reshape") and nid in self.low.computed:
            src = self.output_index(node.args[0])
            if src is None:
                return None
            if node.op == "reshape":
                return ix.Index(node.shape, flat=src.to_flat())
            dims = src.to_dims()
            return ix.dims_index(node.shape, [dims[p] for p in node.attrs["dims"]])
        return None

    def store_outputs(self) -> None:
        g, dom = self.ctx.graph, self.dom
        full, row = [], []
        for o in self.ctx.group.outputs:
            if g.node(o).numel == 0:
                continue      # nothing to store (an empty S: no element is ever evaluated)
            idx = self.output_index(o)
            if idx is None:
                raise Unsupported(f"output %{o} of shape {g.node(o).shape} is neither the domain {dom.shape}, "
                                  "nor reduced, nor a view of either")
            (full if "cols" in ix.syms(idx.to_flat()) or dom.n_cols == 1 else row).append((o, idx))
        for o, idx in row:
            self.low.store(o, idx, "[BLOCK_R, 1]")
        if not full:
            return
        if not self.single:
            self.open_loop()
        for o, idx in full:
            self.low.store(o, idx, "[BLOCK_R, BLOCK_C]")
        if not self.single:
            self.close_loop()


def _needed_reductions(ctx: KernelCtx, dom: ReductionSpec) -> list[int]:
    g, inside = ctx.graph, set(ctx.group.nodes)
    seen, stack = set(), list(ctx.group.outputs)
    while stack:
        n = stack.pop()
        if n in seen or n not in inside:
            continue
        seen.add(n)
        stack.extend(g.node(n).args)
    return [r for r in dom.reductions if r in seen]


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
    pending = _needed_reductions(ctx, dom)
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


def _column_major(k: RowKernel) -> bool:
    """The tensors read are contiguous along rows and none along the reduced columns (a reduction
    over a leading axis): tiles then want many rows and few columns so loads coalesce."""
    offs = [o for o in k.low.offsets if "cols" in ix.syms(o)]     # accesses of domain-shaped tensors
    return (not any(ix.unit_stride_in(o, "cols") for o in offs)
            and any(ix.unit_stride_in(o, "rows") for o in offs))


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
    single = dom.n_cols <= max(ctx.target.row_form.single_pass_max, 1)      # a row of one element is always one tile
    k = _build(ctx, dom, single)
    form = "single" if single else "looped"
    if dom.n_rows > 1 and _column_major(k):
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
    if ix.known(lambda: dom.n_rows > 1) and _column_major(looped):
        src, args = _text(ctx, dom, looped, "columns", name)
        launch = _launch_columns(ctx, dom, args)
        return Kernel(name, src, [launch], shared=HELPERS_IMPORT if looped.helpers else "")
    single = _build(ctx, dom, True)
    one = f"{name}_row"
    src_one, args = _text(ctx, dom, single, "single", one)
    src_loop, _ = _text(ctx, dom, looped, "looped", name)
    n = dims.py(dom.n_cols, OWN_NAMES)
    most = ctx.target.row_form.single_pass_max
    bc = Runtime(f"triton.next_power_of_2({n})", next_pow2(min(dims.hint(dom.n_cols), max(most, 1))))
    fits = When(dom.n_cols, most)
    longer = When(dom.n_cols, most, at_most=False)
    grid = Grid.of(Blocks(dom.n_rows, "BLOCK_R"))
    if ctx.device_type == "cuda":
        # the single-pass tile from the row's length: BLOCK_R rows of BLOCK_C, about 4096 elements
        # and 16 per thread (the static configs' best, BENCHMARKS.md); not autotuned per length
        br = Runtime(f"max(1, 4096 // triton.next_power_of_2({n}))", max(1, 4096 // bc.hint))
        warps = Runtime(f"max(1, min(16, triton.next_power_of_2({n}) // 512))", max(1, min(16, bc.hint // 512)))
        launches = [Launch(grid, args, (("BLOCK_R", br), ("BLOCK_C", bc), ("num_warps", warps)), fn=one, when=fits),
                    Launch(grid, args, (), when=longer)]
    else:
        br = Runtime(f"max(1, {CPU_TILE} // triton.next_power_of_2({n}))", max(1, CPU_TILE // bc.hint))
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

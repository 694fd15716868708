"""Split (two-stage) reductions: programs share each row when the rows alone cannot fill the device.

A reduction over leading axes with few kept columns (`x.float().sum(0)` of a tall matrix: 32
row blocks on 132 SMs) or over a few very long rows (logsumexp over a vocabulary row) runs as
two kernels:
- stage 1 (`<kernel>_partials`), grid (row blocks, splits): program (r, s) reduces the `chunk`
  elements [s * chunk, (s + 1) * chunk) of its rows and writes its fp32 partials to a
  temporary [values, splits, n_rows] (`common.Scratch`, allocated by call());
- stage 2 (`<kernel>`): combines every split's partials of its rows (sums add, maxima take the
  maximum, a (max, sum of exp) pair rescales each sum to the common max as online softmax
  does), then is an ordinary row kernel: the reductions' post-processing (mean's division,
  logsumexp's log) and the row outputs; full-shape outputs (softmax's) are written over grid
  (row blocks, splits) again, each program its own chunk, and the row outputs only by split 0.

Which groups split (`emit` answers None for the others, which keep the one-stage form): no
scans; every reduction an output needs is a sum, mean, amax, amin or logsumexp of an fp32,
fp16 or bf16 result; no reduction's operand depends on another reduction of the group, except
softmax's `sum(exp(a - amax(a)))` with its max (one online pair); sizes are concrete (over
symbolic sizes the kernel keeps its one-stage form, never a guessed split); and
`plan.cost.split_rows` finds the row blocks fewer than the programs that fill the device
(`RowForm.split_fill`; by default two per SM of the machine model on CUDA, never under the
interpreter). The split count and chunk are split_rows's, from the sizes; the kernels' comments
say them.

Invariants: partials are fp32 (the reductions' own accumulator type); a chunk is a multiple of
every column block the kernels read, so a program's column loop stays inside its chunk and only
the row's end is masked; every program combines the partials in the same order, so the values
are the same bits in every split program of stage 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import (Blocks, Buf, Grid, Kernel, KernelCtx, Launch, Scratch, Unsupported, kernel_name,
                                     next_pow2)
from minicomp.codegen.pointwise import autotune_decorator, fixed_config, io_comment, needs_int64
from minicomp.codegen.row_kernel import HELPERS_IMPORT, RowKernel, column_major, needed_reductions, online_sum
from minicomp.codegen.row_reduce import INF, NINF, fold, fold_of, online_max_sumexp, operand
from minicomp.codegen.tlexpr import convert
from minicomp.ir import dims
from minicomp.plan import cost
from minicomp.plan.specs import ReductionSpec

SPLIT_OPS = ("sum", "mean", "amax", "amin", "logsumexp")
SPLIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (BLOCK_C, warps) of the long-rows form (one row a program: the looped form's column blocks)
CUDA_ROW_CONFIGS = ((1024, 4), (2048, 8), (4096, 8))
# (BLOCK_C, warps) of the leading-axes form: COLUMN_ROWS kept columns (contiguous: 256 bytes of
# bf16 per reduced index) by a few reduced ones per tile, as the one-stage columns form reads
CUDA_COLUMN_CONFIGS = ((32, 4), (64, 4), (64, 8))
COLUMN_ROWS = 128
CPU_COLUMN_TILE = (64, 64)     # interpreter: (BLOCK_R, BLOCK_C) of the leading-axes form
COMBINE_TILE = 4096            # BLOCK_R * BLOCK_S of stage 2's partials tile
# the kernels' own names, kept from the lowering's value names (a user's input called `split`)
LOCALS = ("split", "c_start", "c_stop", "chunk", "n_splits", "splits", "split_mask", "first_rows", "part_ptr",
          "BLOCK_S")
DEFAULT_MACHINE = "h200"       # the Target names no machine yet: the planner's default model


@dataclass(frozen=True)
class Part:
    """The partials one reduction (or online pair) keeps per (split, row): `kind` "sum", "max"
    or "min" (one value), or "pair" (a running max and the sum of exp(x - max): logsumexp, or
    softmax's amax with its sum); its values are rows `slot`, `slot + 1` of the partials."""
    kind: str
    nodes: tuple[int, ...]
    slot: int

    @property
    def width(self) -> int:
        return 2 if self.kind == "pair" else 1


# --------------------------------------------------------------------------- which groups split


def _depends_on(ctx: KernelCtx, nid: int, reductions: set[int], allowed: frozenset = frozenset()) -> bool:
    """Whether group node `nid` is computed from a reduction of the group (other than `allowed`)."""
    g, inside = ctx.graph, set(ctx.group.nodes) - set(ctx.group.inputs)
    seen, stack = set(), [nid]
    while stack:
        n = stack.pop()
        if n in seen or n not in inside:
            continue
        seen.add(n)
        if n in reductions and n not in allowed:
            return True
        stack.extend(g.node(n).args)
    return False


def _online_sum(ctx: KernelCtx, m_id: int, pending: list[int]) -> int | None:
    """A pending `sum(exp(a - m))` of `m = amax(a)` inside the group (RowKernel.online_partner's pair)."""
    return online_sum(ctx.graph, m_id, pending, set(ctx.group.nodes) - set(ctx.group.inputs))


def parts(ctx: KernelCtx, dom: ReductionSpec) -> list[Part] | None:
    """The partials of the group's reductions, or None when the group cannot split."""
    if dom.scans or dims.any_symbolic(dom.shape):
        return None
    g = ctx.graph
    reds = set(dom.reductions)
    pending = needed_reductions(ctx, dom)
    out: list[Part] = []
    slot = 0
    while pending:
        r = pending.pop(0)
        node = g.node(r)
        if node.op not in SPLIT_OPS or node.dtype not in SPLIT_DTYPES:
            return None
        partner = _online_sum(ctx, r, pending) if node.op == "amax" else None
        if _depends_on(ctx, node.args[0], reds):
            return None
        if partner is not None:
            pending.remove(partner)
            part = Part("pair", (r, partner), slot)
        else:
            kind = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "logsumexp": "pair"}[node.op]
            part = Part(kind, (r,), slot)
        out.append(part)
        slot += part.width
    return out or None


def _machine() -> cost.Machine:
    return cost.get_machine(DEFAULT_MACHINE)


def _fill(ctx: KernelCtx) -> int:
    given = ctx.target.row_form.split_fill
    if given is not None:
        return given
    return 2 * _machine().sms if ctx.device_type == "cuda" else 0


# --------------------------------------------------------------------------- the two stages


class _Stage(RowKernel):
    """A looped row kernel whose column loops cover one split's chunk of each row."""

    def __init__(self, ctx: KernelCtx, dom: ReductionSpec):
        super().__init__(ctx, dom, single=False)
        for local in LOCALS:
            self.low.names.fresh(local)

    def close_loop(self) -> None:
        with self.main.block("for c0 in range(c_start, c_stop, BLOCK_C):"):
            self.main.splice(self.loop.getvalue())
        self.loop = None
        self.low.forget("cols")


def _partial_at(slot: int, split: str) -> str:
    return f"part_ptr + ({slot} * n_splits + {split}) * n_rows + rows"


def _stage1(ctx: KernelCtx, dom: ReductionSpec, plan: list[Part]) -> _Stage:
    """Each part's fold over the program's chunk, stored as partials."""
    g = ctx.graph
    k = _Stage(ctx, dom)
    for p in plan:
        node = g.node(p.nodes[0])
        dt = node.dtype
        value = lambda node=node, dt=dt: convert(operand(k, node), dt)  # noqa: E731
        if p.kind == "pair":
            m, s = k.low.names.fresh(f"max{node.id}"), k.low.names.fresh(f"sumexp{node.id}")
            online_max_sumexp(k, value, "tl.float32", m, s, "logsumexp" if node.op == "logsumexp" else "softmax")
            values = [m, s]
        else:
            values = [fold(k, f"{p.kind}{node.id}", value, fold_of(p.kind, dt))]
        for i, v in enumerate(values):
            k.main.writeline(f"tl.store({_partial_at(p.slot + i, 'split')}, {v}, mask=row_mask)")
    return k


class _Combine(_Stage):
    """Stage 2: the partials combined into each reduction's value, then the outputs."""

    def __init__(self, ctx: KernelCtx, dom: ReductionSpec, plan: list[Part]):
        super().__init__(ctx, dom)
        self.full, self.row = self.output_places()
        main, low, g = self.main, self.low, ctx.graph
        main.writeline("splits = tl.arange(0, BLOCK_S)[None, :]")
        main.writeline("split_mask = row_mask & (splits < n_splits)")
        for p in plan:
            node = g.node(p.nodes[0])
            neutral = {"sum": "0.0", "max": NINF, "min": INF, "pair": NINF}[p.kind]
            first = low.names.fresh(f"part{node.id}")
            main.writeline(f"{first} = tl.load({_partial_at(p.slot, 'splits')}, mask=split_mask, other={neutral})")
            if p.kind == "sum":
                total = low.emit(f"sum{node.id}", f"tl.sum({first}, axis=1)[:, None]", node.dtype, frozenset({"rows"}))
                self.reduced[node.id] = total if node.op == "sum" else low.emit(
                    f"mean{node.id}", f"{total.code} / {float(dom.n_cols)!r}", node.dtype, frozenset({"rows"}))
            elif p.kind in ("max", "min"):
                self.reduced[node.id] = low.emit(f"{node.op}{node.id}", f"tl.reduce({first}, 1, _{p.kind}_nan)[:, None]",
                                                 node.dtype, frozenset({"rows"}))
            else:
                self._pair(p, first)

    def _pair(self, p: Part, pm: str) -> None:
        low, main, g = self.low, self.main, self.ctx.graph
        node = g.node(p.nodes[0])
        ps = low.names.fresh(f"part{node.id}_s")
        main.writeline(f"{ps} = tl.load({_partial_at(p.slot + 1, 'splits')}, mask=split_mask, other=0.0)")
        m = low.emit(f"max{node.id}", f"tl.reduce({pm}, 1, _max_nan)[:, None]", node.dtype, frozenset({"rows"}))
        # a split whose max is -inf adds nothing (its sum is 0); NaN spreads, as in one stage
        s = low.emit(f"sumexp{node.id}", f"tl.sum(tl.where({pm} == {NINF}, 0.0, {ps} * tl.exp({pm} - {m.code})), "
                     "axis=1)[:, None]", torch.float32, frozenset({"rows"}))
        if node.op == "logsumexp":
            text = (f"tl.where({m.code} == {INF}, {INF}, tl.where({m.code} == {NINF}, {NINF}, "
                    f"tl.log({s.code}) + {m.code}))")
            self.reduced[node.id] = low.emit(f"logsumexp{node.id}", text, node.dtype, frozenset({"rows"}))
        else:
            self.reduced[p.nodes[0]] = m
            self.reduced[p.nodes[1]] = s

    def store_outputs(self) -> None:
        if self.full:
            self.open_loop()
            for o, idx in self.full:
                self.low.store(o, idx, "[BLOCK_R, BLOCK_C]")
            self.close_loop()
        if self.full and self.row:
            # every split program has the row values: split 0 stores them (the rest would write the same)
            # (as a block: the interpreter holds a 0-d comparison as floats, which `&` refuses)
            self.main.writeline("first_rows = row_mask & (rows * 0 + split == 0)")
            plain = self.low.mask_for
            self.low.mask_for = lambda syms: "first_rows" if plain(syms) == "row_mask" else plain(syms)
        for o, idx in self.row:
            self.low.store(o, idx, "[BLOCK_R, 1]")


# --------------------------------------------------------------------------- text and launches


def _prologue(src: CodeBuilder, wide: bool, loops: bool) -> None:
    src.writeline("pid = tl.program_id(0)")
    if loops:
        src.writeline("split = tl.program_id(1)")
    src.writeline(f"rows = {'pid.to(tl.int64)' if wide else 'pid'} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    src.writeline("row_mask = rows < n_rows")
    if loops:
        src.writeline(f"c_start = {'split.to(tl.int64)' if wide else 'split'} * chunk")
        src.writeline("c_stop = tl.minimum(c_start + chunk, n_cols)")


def _text(ctx: KernelCtx, dom: ReductionSpec, k: _Stage, name: str, what: str, configs: list, loops: bool,
          combine: bool) -> tuple[str, tuple]:
    group, low = ctx.group, k.low
    reads = [n for n in low.pointers if n not in group.outputs]
    writes = [n for n in group.outputs if n in low.pointers]
    wide = needs_int64(ctx, list(low.pointers), dom.n_rows * dom.n_cols)
    params = ([low.pointers[n].name for n in reads] + ["part_ptr"] + [low.pointers[n].name for n in writes]
              + ["n_rows", "n_cols", "n_splits", "chunk", "BLOCK_R: tl.constexpr"]
              + (["BLOCK_C: tl.constexpr"] if loops else []) + (["BLOCK_S: tl.constexpr"] if combine else []))
    src = CodeBuilder()
    if ctx.device_type == "cuda":
        src.writelines(autotune_decorator(configs, ["n_rows", "n_cols", "n_splits"]))
    src.writeline("@triton.jit")
    with src.block(f"def {name}({', '.join(params)}):"):
        comment = io_comment(ctx, reads, writes)
        head, wrote = comment[-1].split("; writes ", 1)
        if combine:
            listed = head[len("# reads "):]
            comment[-1] = f"# reads the partials{'' if listed == 'nothing' else ', ' + listed}; writes {wrote}"
        else:
            comment[-1] = f"{head}; writes fp32 partials"
        src.writelines(comment)
        src.writeline(f"# domain {list(dom.shape)} reduced over axes {list(dom.axes)}: {dom.n_rows} rows of "
                      f"{dom.n_cols}; {what}")
        _prologue(src, wide, loops)
        src.splice(k.main.getvalue())
    return src.getvalue(), (tuple(Buf(n) for n in reads), tuple(Buf(n) for n in writes))


def _tiles(ctx: KernelCtx, dom: ReductionSpec, columns: bool) -> tuple[int, list[tuple[dict, int]]]:
    """(BLOCK_R, the configs over BLOCK_C) of the forms that loop over a chunk."""
    if columns:
        br = min(COLUMN_ROWS if ctx.device_type == "cuda" else CPU_COLUMN_TILE[0], next_pow2(dom.n_rows))
        blocks = CUDA_COLUMN_CONFIGS if ctx.device_type == "cuda" else ((CPU_COLUMN_TILE[1], 4),)
    else:
        br = 1
        blocks = CUDA_ROW_CONFIGS if ctx.device_type == "cuda" else ((ctx.target.row_form.cpu_loop_block, 4),)
    return br, [({"BLOCK_R": br, "BLOCK_C": c}, w) for c, w in blocks]


def emit(ctx: KernelCtx, dom: ReductionSpec) -> Kernel | None:
    """The group's two-stage kernel, or None when it keeps the one-stage form (see the docstring)."""
    plan = parts(ctx, dom)
    fill = _fill(ctx)
    if plan is None or fill <= 0 or dom.n_rows < 1 or dom.n_cols < 2:
        return None
    try:
        first = _stage1(ctx, dom, plan)
    except Unsupported:
        return None        # the one-stage form says why, or writes what this one cannot
    columns = dom.n_rows > 1 and column_major(first)
    br, configs = _tiles(ctx, dom, columns)
    granule = max(meta["BLOCK_C"] for meta, _ in configs)
    width = sum(p.width for p in plan)
    read = sum(cost.nbytes(ctx.graph.node(n)) for n in first.low.pointers)
    row_programs = -(-dom.n_rows // br)
    if ctx.target.row_form.split_fill is None and not cost.split_pays(_machine(), row_programs, fill, read):
        return None        # too small to pay for a second launch (a RowForm's split_fill forces the choice)
    split = cost.split_rows(row_programs, dom.n_cols, fill, ctx.target.row_form.split_min_chunk, granule,
                            read, 4 * width * dom.n_rows)
    if split is None:
        return None
    try:
        second = _Combine(ctx, dom, plan)
        second.store_outputs()
    except Unsupported:
        return None
    name = kernel_name(ctx, "red")
    form = "leading axes, many rows a tile" if columns else "long rows"
    how = f"split: each row shared by {split.splits} programs of {split.chunk} elements ({form})"
    src1, (reads1, _) = _text(ctx, dom, first, f"{name}_partials", f"{how}; stage 1 of 2 writes partials "
                              f"[{width}, {split.splits}, {dom.n_rows}]", configs, loops=True, combine=False)
    full = bool(second.full)
    bs = next_pow2(split.splits)
    # stage 2 loops over its chunk like stage 1 when it writes full-shape outputs; else one
    # partials tile [BLOCK_R, BLOCK_S] per program
    configs2 = configs if full else [({"BLOCK_R": max(1, min(next_pow2(dom.n_rows), COMBINE_TILE // bs))}, 4)]
    src2, (reads2, writes2) = _text(ctx, dom, second, name, f"{how}; stage 2 of 2 combines the partials",
                                    configs2, loops=full, combine=True)
    scratch = Scratch(f"{name}_part", width * split.splits * dom.n_rows)      # [values, splits, n_rows]
    sizes = (dom.n_rows, dom.n_cols, split.splits, split.chunk)
    cuda = ctx.device_type == "cuda"
    kw1 = fixed_config(configs) if cuda else tuple(configs[0][0].items())
    grid1 = Grid.of(Blocks(dom.n_rows, "BLOCK_R"), split.splits)
    launch1 = Launch(grid1, reads1 + (scratch,) + sizes, kw1, fn=f"{name}_partials")
    kw2 = (fixed_config(configs2) if cuda else tuple(configs2[0][0].items())) + (("BLOCK_S", bs),)
    grid2 = Grid.of(Blocks(dom.n_rows, "BLOCK_R"), split.splits) if full else Grid.of(Blocks(dom.n_rows, "BLOCK_R"))
    launch2 = Launch(grid2, reads2 + (scratch,) + writes2 + sizes, kw2)
    helpers = HELPERS_IMPORT if (first.helpers or second.helpers) else ""
    return Kernel(name, src1.rstrip("\n") + "\n\n\n" + src2, [launch1, launch2], shared=helpers)

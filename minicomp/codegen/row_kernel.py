"""The row kernel's body: `RowKernel` lowers one reduction domain's nodes at (rows, cols).

codegen/reduction.py writes a row kernel in its single-pass, looped or columns form around a
`RowKernel`, and codegen/split_reduce.py the two stages of a split reduction around its
subclasses. Index symbols: `rows` ([BLOCK_R, 1]) and `cols` ([1, BLOCK_C]); an element of the
domain S sits at `full_index(dom, rows, cols)`. Lines over the columns go into the open column
loop (`open_loop`/`close_loop`), row-only lines before it; a reduction's value is
`[BLOCK_R, 1]`, recorded in `RowKernel.reduced` by the writers of codegen/row_reduce.py.
"""

from __future__ import annotations

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen import row_reduce, scan
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, Unsupported, group_spec
from minicomp.codegen.lowering import Lowering
from minicomp.codegen.tlexpr import Val, convert
from minicomp.plan.specs import ReductionSpec

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



def online_sum(g, m_id: int, pending: list[int], available) -> int | None:
    """A pending `sum(exp(a - m))` of the max `m = amax(a)` (node `m_id`), all fp32, whose exp and
    sub are in `available`: the pair one online loop computes (max, then the rescaled sum)."""
    m = g.node(m_id)
    if m.dtype != torch.float32:
        return None
    for r in pending:
        s = g.node(r)
        e = g.node(s.args[0]) if s.op == "sum" else None
        if e is None or e.op != "exp" or e.id not in available:
            continue
        d = g.node(e.args[0])
        if (d.op == "sub" and d.id in available and tuple(d.args) == (m.args[0], m_id)
                and s.dtype == e.dtype == d.dtype == torch.float32):
            return r
    return None

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
        if self.single or self.ctx.graph.node(m_id).op != "amax":
            return None
        return online_sum(self.ctx.graph, m_id, pending, self.low.computed)

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
            return None if src is None else ix.stored_through(src, node.op, node.attrs, node.shape)
        return None

    def output_places(self) -> tuple[list[tuple[int, ix.Index]], list[tuple[int, ix.Index]]]:
        """(full-shape outputs, row outputs), each with the index it is stored at."""
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
        return full, row

    def store_outputs(self) -> None:
        full, row = self.output_places()
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


def needed_reductions(ctx: KernelCtx, dom: ReductionSpec) -> list[int]:
    """The reductions of `dom` that an output of the group depends on, in order."""
    g, inside = ctx.graph, set(ctx.group.nodes)
    seen, stack = set(), list(ctx.group.outputs)
    while stack:
        n = stack.pop()
        if n in seen or n not in inside:
            continue
        seen.add(n)
        stack.extend(g.node(n).args)
    return [r for r in dom.reductions if r in seen]


def column_major(k: RowKernel) -> bool:
    """The tensors read are contiguous along rows and none along the reduced columns (a reduction
    over a leading axis): tiles then want many rows and few columns so loads coalesce."""
    offs = [o for o in k.low.offsets if "cols" in ix.syms(o)]     # accesses of domain-shaped tensors
    return (not any(ix.unit_stride_in(o, "cols") for o in offs)
            and any(ix.unit_stride_in(o, "rows") for o in offs))

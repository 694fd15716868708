"""Shared pieces of the tile kernels (GEMM, attention): operand folding and the epilogue.

- `fold_operand` follows a matmul/attention operand through the group's prologue (views,
  casts and indirect loads) down to the tensor in memory and returns the element offset of
  an index into it (`indexing.Expr`): a transposed, permuted, broadcast or reshaped operand
  is read in place, at no cost; casts are applied after the load (`cast_operand`); an
  embedding's offset holds the loaded index (`indexing.Indirect`), which the kernel loads
  when the offset is rendered.
- `TileLowering` is codegen's `Lowering` (the pointwise expression machinery, shared with
  the pointwise and reduction kernels) plus *leaves*: values the kernel already holds in
  registers (the fp32 accumulator of a matmul, the normalised output of attention). An
  epilogue node is computed from them and from other operands loaded with broadcasting.
  `scope()` keeps values written inside a loop body from leaking out of it.
- `store` writes one output tile; its pointer block always has the full tile shape.

Index symbols are the kernels' 2-D tile coordinates (`rm` = offs_m[:, None], `rn`, ...)
and scalar batch coordinates (`z0`, `z1`, ...); the kernels define them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen import indirect
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, Unsupported
from minicomp.codegen.lowering import Lowering
from minicomp.codegen.tlexpr import Val, compute_tl, convert, storage_tl
from minicomp.ir.dtypes import HALF_DTYPES
from minicomp.ir.graph import Node
from minicomp.target import read_matmul_precision

LOG2E = 1.4426950408889634


@dataclass
class Operand:
    leaf: int                       # the node read from memory
    casts: tuple[torch.dtype, ...]  # applied after the load, leaf side first
    offset: ix.Expr                 # element offset of the kernel's index into the leaf
    dtype: torch.dtype              # the dtype the consumer sees (after the casts)


def fold_operand(ctx: KernelCtx, nid: int, idx: ix.Index) -> Operand:
    """Follow views and casts from operand `nid` (indexed by `idx`) down to memory."""
    graph = ctx.graph
    computed = set(ctx.group.nodes) - set(ctx.group.inputs)
    dtype = graph.node(nid).dtype
    casts: list[torch.dtype] = []
    while nid in computed:
        n = graph.node(nid)
        src = graph.node(n.args[0]) if n.args else None
        if n.op == "cast":
            casts.append(n.attrs["dtype"])
        elif n.op == "reshape":
            idx = ix.reshape(idx, src.shape)
        elif n.op == "permute":
            idx = ix.permute(idx, n.attrs["dims"], src.shape)
        elif n.op == "expand":
            idx = ix.broadcast(idx, src.shape)
        elif n.op == "slice":
            dim = n.attrs["dim"] % len(src.shape)
            start, _, step = ix.slice_range(src.shape[dim], n.attrs["start"], n.attrs["end"], n.attrs["step"])
            idx = ix.slice_(idx, src.shape, dim, start, step)
        elif indirect.handles(n):
            # an embedding feeding a matmul: A's rows are the table's rows the indices name,
            # loaded (once per tile row) where the offset is rendered
            idx = indirect.source_index(graph, computed, n, idx)
        else:
            raise Unsupported(f"{n.describe()}: only views and casts fold into a {ctx.group.kind} operand")
        nid = n.args[0]
    leaf = graph.node(nid)
    if leaf.op == "constant" and not isinstance(leaf.attrs["value"], torch.Tensor):
        raise Unsupported(f"{leaf.describe()}: a scalar {ctx.group.kind} operand")
    return Operand(nid, tuple(reversed(casts)), ix.offset(idx, ctx.strides(nid)), dtype)


def split_offset(e: ix.Expr, inner: set[str]) -> tuple[ix.Expr, ix.Expr]:
    """(terms free of `inner` symbols plus the constant, terms using them)."""
    out, ins = {}, {}
    for atom, k in e.terms:
        uses = ix.syms(ix.Expr(((atom, 1),), 0))
        (ins if uses & inner else out)[atom] = k
    return ix.make(out, e.const), ix.make(ins, 0)


def cast_operand(var: str, op: Operand, device_type: str) -> str | None:
    """Text converting a loaded operand tile to what `tl.dot` gets; None when nothing to do.

    Under the CPU interpreter half operands are widened: its bf16 dot returns garbage."""
    text = var
    for dt in op.casts:
        text = f"{text}.to({storage_tl(dt)})"
    if device_type != "cuda" and op.dtype in HALF_DTYPES:
        text = f"{text}.to(tl.float32)"
    return None if text == var else text


def dot_precision(dtype: torch.dtype, precision: str | None = None) -> str:
    """The `tl.dot` keyword for fp32 operands: `precision` ("ieee" or "tf32", a `Target`'s
    `matmul_precision`); None reads PyTorch's switches now (`target.read_matmul_precision`)."""
    if dtype != torch.float32:
        return ""
    return f", input_precision=\"{precision or read_matmul_precision()}\""


class TileLowering(Lowering):
    """`Lowering` over a tile whose leaves (accumulators) are already in registers."""

    def __init__(self, ctx: KernelCtx, code: CodeBuilder, masks: dict[str, str],
                 leaves: dict[int, tuple[ix.Index, Val]] | None = None, reserved: tuple[str, ...] = ()):
        self.masks = dict(masks)     # symbol -> its bounds mask over the tile; callers may change it
        self.leaves = dict(leaves or {})
        super().__init__(ctx, lambda syms: code, self._mask)
        for name in reserved:
            self.names.fresh(name)

    def _mask(self, syms: frozenset) -> str | None:
        parts = [self.masks[s] for s in sorted(syms) if s in self.masks]
        return " & ".join(parts) if parts else None

    def _compute(self, node: Node, idx: ix.Index, cond):
        if node.id in self.leaves:
            want, val = self.leaves[node.id]
            if want.key() != idx.key():
                raise Unsupported(f"{node.describe()} is read through a view inside its own kernel")
            return val
        return super()._compute(node, idx, cond)

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Values and index names written inside the block are forgotten after it (a loop body)."""
        memo, atoms = dict(self.memo), dict(self.atoms)
        try:
            yield
        finally:
            self.memo, self.atoms = memo, atoms

    def offset_text(self, e: ix.Expr, need: tuple[str, ...] = ()) -> str:
        """Rendered offset; symbols in `need` that it lacks are added times 0, so the pointer
        block has the full tile shape even where a dimension has size 1."""
        text = self.render(e)
        have = ix.syms(e)
        for s in need:
            if s not in have:
                text += f" + {s} * 0"
        return text

    def store(self, nid: int, idx: ix.Index, need: tuple[str, ...], mask: str) -> None:
        """Store node `nid` at `idx` (its value rounded to its dtype), masked by `mask`."""
        node = self.graph.node(nid)
        val = self.value(nid, idx)
        text = val.code if not val.literal else f"tl.full([1], {val.code}, {compute_tl(node.dtype)})"
        if not val.literal:
            text = convert(val, node.dtype)
        if storage_tl(node.dtype) != compute_tl(node.dtype):
            text = f"{text}.to({storage_tl(node.dtype)})"
        off = ix.offset(idx, self.ctx.strides(nid))
        ptr = self.pointer(nid)
        self.builder_for(ix.syms(off)).writeline(
            f"tl.store({ptr} + {self.offset_text(off, need)}, {text}, mask={mask})")

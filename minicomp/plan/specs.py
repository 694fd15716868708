"""Per-kind specs: what a reduction, GEMM or attention group computes, decided once by the plan.

Codegen writes a group's kernel from its spec (`Group.spec`) instead of finding the facts
again in the graph. The split between the two stages:
- a spec holds planner-level facts, read off the graph and the group: which nodes, which
  operands, which shapes and axes, which attention form. They do not depend on strides,
  which are chosen after planning (plan/layout.py);
- codegen derives only what depends on strides or on the kernel text: folding views into
  operand offsets, which batch dims fold into M, index expressions, block sizes, and its
  own limits (dtypes it has no kernel for, grid limits), which make it run a group
  through PyTorch (`Unsupported`).

`derive_spec(graph, kind, nodes, anchor)` builds the spec of one group (None for pointwise
and opaque groups, which need none); the planner calls it for every group it builds, and
`Plan.with_specs(graph)` gives them to a plan made by hand (tests). Invariants: specs are
frozen; node ids in a spec are nodes of the group (operands may be read from memory);
`derive_spec` raises CompileError for a group that is not one of its kind (no reduction or scan,
reductions over different domains, no matmul, not exactly one attention node): the planner's
rules never build one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from minicomp.errors import CompileError
from minicomp.ir.graph import Graph
from minicomp.plan.rules import reduction_domain


@dataclass(frozen=True)
class ReductionSpec:
    """A row kernel's domain: every reduction reduces a tensor of `shape` (S) over `axes` (A),
    every scan scans one of shape S along A's one axis."""
    shape: tuple[int, ...]         # S
    axes: tuple[int, ...]          # A: sorted, non-negative; empty only for a 0-d S (one element)
    reductions: tuple[int, ...]    # the reduction nodes, topological order
    scans: tuple[int, ...] = ()    # the scan nodes, topological order

    @property
    def n_cols(self) -> int:
        """Elements per row: the product of the reduced dims."""
        return math.prod(self.shape[a] for a in self.axes)

    @property
    def n_rows(self) -> int:
        return math.prod(d for i, d in enumerate(self.shape) if i not in self.axes)

    @property
    def trailing(self) -> bool:
        """The reduced axes are the innermost ones."""
        return self.axes == tuple(range(len(self.shape) - len(self.axes), len(self.shape)))

    def reduced_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(S with the reduced axes kept as 1, S without them)."""
        keep = tuple(1 if i in self.axes else d for i, d in enumerate(self.shape))
        drop = tuple(d for i, d in enumerate(self.shape) if i not in self.axes)
        return keep, drop


@dataclass(frozen=True)
class GemmSpec:
    """One matmul, or two sharing operand A (a dual GEMM), and the epilogue on their results."""
    matmuls: tuple[int, ...]                 # the anchor first
    operands: tuple[tuple[int, int], ...]    # (A, B) of each matmul, as it reads them
    shape: tuple[int, ...]                   # the anchor's output [..., M, N]
    epilogue: tuple[int, ...]                # group nodes computed from the results, topological order

    @property
    def batch(self) -> tuple[int, ...]:
        return self.shape[:-2]

    @property
    def m(self) -> int:
        return self.shape[-2]

    @property
    def n(self) -> int:
        return self.shape[-1]


@dataclass(frozen=True)
class AttentionSpec:
    """softmax(q @ k^T * scale [+ mask]) @ v, as the attention node says it."""
    node: int                      # the attention node
    q: int
    k: int
    v: int
    mask: int | None               # a boolean (True keeps) or additive mask; None: none (or causal)
    batch: tuple[int, ...]         # the output's leading dims (batch, heads)
    sq: int                        # query length
    d: int                         # q/k head dim
    sk: int                        # key length
    dv: int                        # v head dim
    scale: float
    causal: bool                   # PyTorch's is_causal: top-left aligned
    kv_groups: int | None          # query heads per KV head (1: as many); None: they do not divide
    epilogue: tuple[int, ...]      # group nodes computed from the result, topological order


def _after(graph: Graph, starts: Sequence[int], nodes: Sequence[int]) -> tuple[int, ...]:
    """The nodes of `nodes` (topological order) that depend on one of `starts`."""
    reached = set(starts)
    out = []
    for nid in nodes:
        if nid not in reached and any(a in reached for a in graph.node(nid).args):
            reached.add(nid)
            out.append(nid)
    return tuple(out)


def _reduction(graph: Graph, gid: int, nodes: Sequence[int]) -> ReductionSpec:
    reds = tuple(n for n in nodes if graph.node(n).kind == "reduction")
    scans = tuple(n for n in nodes if graph.node(n).kind == "scan")
    if not reds and not scans:
        raise CompileError(f"group {gid} (reduction) holds no reduction or scan node")
    first = (reds + scans)[0]
    shape, axes = reduction_domain(graph, first)
    for r in reds + scans:
        if reduction_domain(graph, r) != (shape, axes):
            raise CompileError(f"group {gid} (reduction): {graph.node(r).describe()} reduces another domain "
                               f"than {graph.node(first).describe()}")
    return ReductionSpec(tuple(shape), axes, reds, scans)


def _gemm(graph: Graph, gid: int, nodes: Sequence[int], anchor: int | None) -> GemmSpec:
    mms = [n for n in nodes if graph.node(n).op == "matmul"]
    if not mms:
        raise CompileError(f"group {gid} (gemm) holds no matmul")
    if anchor in mms:
        mms.remove(anchor)
        mms.insert(0, anchor)
    operands = tuple((graph.node(m).args[0], graph.node(m).args[1]) for m in mms)
    return GemmSpec(tuple(mms), operands, tuple(graph.node(mms[0]).shape), _after(graph, mms, nodes))


def _attention(graph: Graph, gid: int, nodes: Sequence[int], anchor: int | None) -> AttentionSpec:
    if anchor is None or graph.node(anchor).op != "attention":
        found = [n for n in nodes if graph.node(n).op == "attention"]
        if len(found) != 1:
            raise CompileError(f"group {gid} (attention) does not hold exactly one attention node")
        anchor = found[0]
    node = graph.node(anchor)
    q, k, v = (graph.node(a) for a in node.args[:3])
    batch = tuple(node.shape[:-2])
    groups: int | None = 1
    if batch and len(k.shape) >= 3 and k.shape[-3] != q.shape[-3]:
        heads, kv_heads = q.shape[-3], k.shape[-3]
        # one KV head broadcast over every query head (multi-query attention) needs no enable_gqa
        grouped = node.attrs["enable_gqa"] or (kv_heads == 1 and v.shape[-3] == 1)
        groups = heads // kv_heads if grouped and heads % kv_heads == 0 and v.shape[-3] == kv_heads else None
    return AttentionSpec(anchor, q.id, k.id, v.id, node.args[3] if len(node.args) > 3 else None, batch,
                         q.shape[-2], q.shape[-1], v.shape[-2], v.shape[-1], float(node.attrs["scale"]),
                         bool(node.attrs["is_causal"]), groups, _after(graph, [anchor], nodes))


def derive_spec(graph: Graph, kind: str, nodes: Sequence[int], anchor: int | None = None,
                gid: int = 0) -> ReductionSpec | GemmSpec | AttentionSpec | None:
    """The spec of a group of `kind` computing `nodes` (topological order) around `anchor`."""
    if kind == "reduction":
        return _reduction(graph, gid, nodes)
    if kind == "gemm":
        return _gemm(graph, gid, nodes, anchor)
    if kind == "attention":
        return _attention(graph, gid, nodes, anchor)
    return None


"""Constant folding: evaluate, at compile time, what depends on constants only.

A node is folded when every operand is constant-like — a `constant` node, or a view
(reshape, permute, expand, slice, cat) of constant-like nodes — by running it through the
reference interpreter (`minicomp.ir.interpret.eval_node`) on the CPU. Generators (`full`,
`arange`) have no operands, so they qualify too. The result becomes a new `constant` node
with exactly the dtype and shape the interpreter computed; 0-d results are stored as
Python scalars (exact: a 0-d value converts to a Python number and back without loss),
larger ones as contiguous tensors that own their storage. Nodes are visited in
topological order, so whole constant subgraphs collapse in one run (`head_dim ** -0.5`,
`cast(2.0, bf16)`, `1 / sqrt(64)`).

Size policy — folding never makes a stored constant bigger:
  a node is folded only if its result takes at most as many bytes as the largest
  constant it is computed from, or is a single element.
So scalar arithmetic and casts of scalars always fold; `tril`, `neg`, an f32 -> bf16 cast
or a comparison of a constant tensor fold (no bigger); a reduction of a constant folds
(smaller); but a generated pattern is never materialised: `full`, `arange`, `expand` of a
scalar, and `tril(full(..))` stay symbolic at every size. A 4096x4096 causal mask
therefore reaches the fusion pass as `tril(full(...))` — recognisably "causal", not
16 MiB of data — and, because the rule does not depend on size, a toy 8x8 test graph
reaches it in the same form as a real one (a fixed "fold below N elements" threshold
would make small test graphs plan differently from large ones). A bf16 -> f32 cast of a
weight (twice the bytes a kernel would read) and a matmul of two constants whose result
outgrows both are skipped for the same reason.

Views of constants are not folded themselves (unless they are a single element): a view
computes nothing, and materialising `permute(weight)` would copy the weight and take its
layout out of the pretranspose pass's hands (it stores weights transposed where a GEMM reads them
faster). They are looked through instead, so `reshape(c) * 2` still folds.

Never folded: `input`, `constant` (already folded), `size_value` (a size known only at run
time) and `opaque` nodes (a PyTorch call may be random or have effects; it runs at run
time), and nodes whose evaluation raises (the same error then happens at run time, as it
would in eager PyTorch).
"""

from __future__ import annotations

import torch

from minicomp.ir.dtypes import itemsize
from minicomp.ir.graph import Graph, Node
from minicomp.ir.interpret import eval_node
from minicomp.passes.registry import Changes, register_pass

NEVER_FOLDED = ("input", "constant", "opaque", "size_value")   # size_value: known only at run time


class _Folder:
    """Constant-like nodes of one graph: their constant leaves, and their values on demand."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.leaves: dict[int, frozenset[int] | None] = {}
        self.values: dict[int, torch.Tensor] = {}

    def constant_leaves(self, nid: int) -> frozenset[int] | None:
        """The constants a constant-like node is a view of (None if it is not constant-like)."""
        if nid not in self.leaves:
            n = self.g.node(nid)
            if n.op == "constant":
                found: frozenset[int] | None = frozenset((nid,))
            elif n.kind == "view" and n.args:
                parts = [self.constant_leaves(a) for a in n.args]
                found = None if any(p is None for p in parts) else frozenset().union(*parts)
            else:
                found = None
            self.leaves[nid] = found
        return self.leaves[nid]

    def should_fold(self, n: Node) -> bool:
        if n.op in NEVER_FOLDED:
            return False
        if n.numel <= 1:
            return all(self.constant_leaves(a) is not None for a in n.args)
        if n.kind == "view":
            return False
        leaves: set[int] = set()
        for a in n.args:
            found = self.constant_leaves(a)
            if found is None:
                return False
            leaves |= found
        budget = max((_nbytes(self.g.node(c)) for c in leaves), default=0)
        return _nbytes(n) <= budget

    def value(self, nid: int) -> torch.Tensor:
        if nid not in self.values:
            n = self.g.node(nid)
            self.values[nid] = eval_node(n, [self.value(a) for a in n.args], "cpu")
        return self.values[nid]

    def label(self, n: Node) -> str | None:
        """`neg(w)` for a fold of one labelled constant (weights keep a readable name)."""
        labels = {self.g.node(c).attrs.get("label") for a in n.args for c in (self.constant_leaves(a) or ())}
        return f"{n.op}({labels.pop()})" if len(labels) == 1 and None not in labels else None


def _nbytes(n: Node) -> int:
    return n.numel * itemsize(n.dtype)


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy with its own storage (a fold of a view must not pin a large base)."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def fold_node(folder: _Folder, n: Node) -> int | None:
    """Evaluate `n` and add its value as a constant node; the new node's id (None if it raised)."""
    g = folder.g
    try:
        value = folder.value(n.id)
    except (RuntimeError, ValueError, TypeError, IndexError, ZeroDivisionError):
        return None
    # the registry's inference fixed the type; the interpreter must agree with it
    assert tuple(value.shape) == n.shape and value.dtype == n.dtype, (n.describe(), value.dtype, value.shape)
    if value.dim() == 0:
        new = g.constant(value.item(), dtype=value.dtype, origin=n.origin)
    else:
        value = _owned(value)
        new = g.constant(value, origin=n.origin, label=folder.label(n))
    folder.values[new] = value
    return new


@register_pass("constant_fold", fixed_point=True)
def constant_fold(graph: Graph) -> tuple[Graph, Changes]:
    """Evaluate nodes that depend on constants only (never growing a stored constant)."""
    g = graph.copy()
    folder = _Folder(g)
    folded = 0
    for nid in g.topo_order():
        n = g.node(nid)
        if not folder.should_fold(n):
            continue
        new = fold_node(folder, n)
        if new is None:
            continue
        g.replace_all_uses(nid, new)
        g.remove(nid)  # its constant operands may now be dead: DCE's job
        folded += 1
    return g, {"folded": folded}

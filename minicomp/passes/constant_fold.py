"""Constant folding: evaluate nodes whose operands are all constants, at compile time.

A node is folded when every operand is a `constant` node (generators such as `full` and
`arange` have no operands, so they qualify), by running it through the reference
interpreter (`minicomp.ir.interpret.eval_node`) on the CPU. The result becomes a new
`constant` node with exactly the dtype and shape the interpreter computed; 0-d results are
stored as Python scalars (exact: a 0-d value converts to a Python number and back without
loss), larger ones as contiguous tensors that own their storage. Folding repeats through
the graph in topological order, so whole constant subgraphs collapse in one run
(`head_dim ** -0.5`, `cast(2.0, bf16)`, `1 / sqrt(64)`).

Size policy — folding never makes the stored constants bigger:
  a node is folded only if its result has at most as many elements as its largest
  constant operand, or is a single element.
So scalar arithmetic and casts of constants fold; `tril`, `cast`, `neg` ... of a constant
tensor fold (same size); a reduction of a constant folds (smaller); but a generated
pattern is never materialised: `full`, `arange`, `expand` of a scalar, and `tril(full(..))`
stay symbolic at every size. A 4096x4096 causal mask therefore reaches the fusion pass as
`tril(full(...))` — recognisably "causal", not 16 MiB of data — and, because the rule
does not depend on size, a toy 8x8 test graph reaches it in the same form as a real one.
(A fixed "fold below 1024 elements" threshold would make small test graphs plan
differently from large ones.) A matmul of two constants whose result is larger than both
is skipped for the same reason.

Never folded: `input`, `constant` (already folded) and `opaque` nodes (a PyTorch call may
be random or have effects; it runs at run time).
"""

from __future__ import annotations

import torch

from minicomp.ir.graph import Graph, Node
from minicomp.ir.interpret import eval_node
from minicomp.passes.registry import Changes, register_pass

NEVER_FOLDED = ("input", "constant", "opaque")


def constant_value(n: Node) -> torch.Tensor:
    """The value of a `constant` node as a CPU tensor of its dtype."""
    return eval_node(n, [], "cpu")


def should_fold(graph: Graph, n: Node) -> bool:
    """All operands constant, and the result no larger than the largest of them (or one element)."""
    if n.op in NEVER_FOLDED:
        return False
    operands = [graph.node(a) for a in n.args]
    if any(a.op != "constant" for a in operands):
        return False
    budget = max([a.numel for a in operands], default=0)
    return n.numel <= max(budget, 1)


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy with its own storage (a fold of a view must not pin a large base)."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def fold_node(graph: Graph, n: Node) -> int:
    """Evaluate `n` and add its value as a constant node; returns the new node's id."""
    value = eval_node(n, [constant_value(graph.node(a)) for a in n.args], "cpu")
    # the registry's inference already fixed the type; the interpreter must agree with it
    assert tuple(value.shape) == n.shape and value.dtype == n.dtype, (n.describe(), value.dtype, value.shape)
    if value.dim() == 0:
        return graph.constant(value.item(), dtype=value.dtype, origin=n.origin)
    return graph.constant(_owned(value), origin=n.origin)


@register_pass("constant_fold", fixed_point=True)
def constant_fold(graph: Graph) -> tuple[Graph, Changes]:
    """Evaluate nodes whose operands are all constants (never growing a constant)."""
    g = graph.copy()
    folded = 0
    for nid in g.topo_order():
        n = g.node(nid)
        if not should_fold(g, n):
            continue
        new = fold_node(g, n)
        g.replace_all_uses(nid, new)
        g.remove(nid)  # its constant operands may now be dead: DCE's job
        folded += 1
    return g, {"folded": folded}

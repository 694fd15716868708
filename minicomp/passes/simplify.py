"""Algebraic simplification: small named rewrite rules, run to a fixed point.

Each rule looks at one node and returns the id of a node that computes exactly the same
tensor — same shape, same dtype, bit-identical values for every input — or None. Only
rewrites that are exact in IEEE arithmetic are here: no `x*0 -> 0` (NaN*0 is NaN), no
`x-x -> 0` (inf-inf is NaN), no reassociation.

Arithmetic identities (`x*1`, `x+0`, `x/1`) fire only when the node's dtype and shape are
x's: `x + 0` with a broadcasting or a wider zero changes the type and is kept.

The sign of zero is a value: under round-to-nearest, `x + (-0.0)` and `x - (+0.0)` return
x for every x, but `x + 0.0` turns `-0.0` into `+0.0` (and `x - (-0.0)` does too). So for
floating results, `add` drops only a negative zero and `sub` only a positive one (an
integer zero counts as positive); `x + 0.0` stays. For integer and boolean results any
zero is dropped. (A frontend that writes `x + 0.0` gets an add; the cost is one flop.)

Views: a permute that moves only size-1 axes is a reshape (`permute_units`), and chains of
reshapes, permutes and expands fold into one. The rules that move a view or a matmul to
where a kernel can use it (a projection cut in two, a gather past a per-row shift, a reshape
below a unary op) are in rewrites.py.

Casts: `cast(cast(x, a), b)` becomes `cast(x, b)` when x -> a loses nothing (every value
of x's dtype is exactly representable in a: bf16 -> f32, i8 -> f16, bool -> anything ...);
so `bf16 -> f32 -> bf16` is the identity while `f32 -> bf16 -> f32` (a rounding) stays.
A float -> int conversion is not moved (out-of-range conversions are implementation
defined, so the intermediate type could matter) unless the float holds the values of an
integer x that all fit the target (`i8 -> f16 -> i8` is the identity).

The driver sweeps the graph in topological order, applying the first rule that matches a
live node, until a sweep changes nothing. A replaced node is removed; operands it leaves
dead are DCE's business. Every rule makes the graph strictly smaller or a chain strictly
shorter, so the sweep terminates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from minicomp.ir.graph import Graph, Node
from minicomp.ir.interpret import eval_node
from minicomp.passes.registry import Changes, register_pass
from minicomp.passes.rewrites import gather_of_row_shift, reshape_sink, slice_of_matmul

# --------------------------------------------------------------------------- helpers


def _known_value(g: Graph, nid: int) -> torch.Tensor | None:
    """The value of a constant or `full` node (a `full` as one 0-d element), else None."""
    n = g.node(nid)
    if n.op == "constant":
        return eval_node(n, [], "cpu")
    if n.op == "full":
        return torch.tensor(n.attrs["value"], dtype=n.attrs["dtype"])
    return None


HEAD = 1024  # elements looked at first: a weight is rarely all ones, and says so early


def _all_one(t: torch.Tensor) -> bool:
    return bool((t.reshape(-1)[:HEAD] == 1).all()) and bool((t == 1).all())


def _all_zero(t: torch.Tensor, negative: bool) -> bool:
    """Every element is a zero, and (for floats) every zero has the given sign."""
    if not bool((t.reshape(-1)[:HEAD] == 0).all()) or not bool((t == 0).all()):
        return False
    if not t.dtype.is_floating_point:
        return not negative  # an integer zero behaves as +0
    return bool((torch.signbit(t) == negative).all())


def _same_type(n: Node, x: Node) -> bool:
    return n.shape == x.shape and n.dtype == x.dtype


def _identity_operand(g: Graph, n: Node, const_positions: tuple[int, ...],
                      is_identity: Callable[[torch.Tensor], bool]) -> int | None:
    """For a binary `n`: the other operand x where the constant at one of `const_positions`
    is an identity element and `n` has x's type."""
    for pos in const_positions:
        c, x = n.args[pos], n.args[1 - pos]
        value = _known_value(g, c)
        if value is not None and _same_type(n, g.node(x)) and is_identity(value):
            return x
    return None


def _operand(g: Graph, n: Node, op: str) -> Node | None:
    """n's only operand if it is an `op` node."""
    arg = g.node(n.args[0])
    return arg if arg.op == op else None


# dtype -> dtypes holding all its values exactly
_WIDER = {
    torch.bool: {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.uint8: {torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.int8: {torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.int16: {torch.int32, torch.int64, torch.float32, torch.float64},
    torch.int32: {torch.int64, torch.float64},
    torch.float16: {torch.float32, torch.float64},
    torch.bfloat16: {torch.float32, torch.float64},
    torch.float32: {torch.float64},
}


def lossless(src: torch.dtype, dst: torch.dtype) -> bool:
    """Does casting src -> dst keep every value exactly?"""
    return src == dst or dst in _WIDER.get(src, ())


# --------------------------------------------------------------------------- rules


def mul_one(g: Graph, n: Node) -> int | None:
    # x*1 -> x, 1*x -> x
    return _identity_operand(g, n, (1, 0), _all_one)


def add_zero(g: Graph, n: Node) -> int | None:
    # x+(-0.0) -> x, (-0.0)+x -> x; any zero for integer results (x+0.0 is not exact)
    negative = n.dtype.is_floating_point
    return _identity_operand(g, n, (1, 0), lambda t: _all_zero(t, negative))


def sub_zero(g: Graph, n: Node) -> int | None:
    # x-0 -> x (x-(-0.0) is not exact for floats)
    if n.dtype.is_floating_point:
        return _identity_operand(g, n, (1,), lambda t: _all_zero(t, negative=False))
    return _identity_operand(g, n, (1,), lambda t: bool((t == 0).all()))


def div_one(g: Graph, n: Node) -> int | None:
    # x/1 -> x
    return _identity_operand(g, n, (1,), _all_one)


def neg_neg(g: Graph, n: Node) -> int | None:
    # neg(neg(x)) -> x
    inner = _operand(g, n, "neg")
    return inner.args[0] if inner is not None else None


def permute_identity(g: Graph, n: Node) -> int | None:
    # permute(x, (0, 1, ..)) -> x
    rank = len(n.shape)
    return n.args[0] if tuple(d % rank for d in n.attrs["dims"]) == tuple(range(rank)) else None


def permute_permute(g: Graph, n: Node) -> int | None:
    # permute(permute(x, p), q) -> permute(x, p[q])
    inner = _operand(g, n, "permute")
    if inner is None:
        return None
    rank = len(n.shape)
    p = [d % rank for d in inner.attrs["dims"]]
    dims = tuple(p[q % rank] for q in n.attrs["dims"])
    if dims == tuple(range(rank)):
        return inner.args[0]
    return g.add("permute", inner.args[0], dims=dims, origin=n.origin)


def permute_units(g: Graph, n: Node) -> int | None:
    # permute(x, p) -> reshape(x, n.shape) when p moves only size-1 axes: the other axes keep
    # their order, so every element keeps its row-major position (einsum's bmm lowering moves
    # unit axes around: reshape, permute, reshape becomes one reshape)
    src = g.node(n.args[0]).shape
    rank = len(src)
    kept = [d % rank for d in n.attrs["dims"] if not _unit(src[d % rank])]
    if kept != sorted(kept) or tuple(d % rank for d in n.attrs["dims"]) == tuple(range(rank)):
        return None
    return g.add("reshape", n.args[0], shape=tuple(n.shape), origin=n.origin)


def _unit(d) -> bool:
    return isinstance(d, int) and d == 1


def reshape_same(g: Graph, n: Node) -> int | None:
    # reshape(x, x.shape) -> x
    return n.args[0] if n.shape == g.node(n.args[0]).shape else None


def reshape_reshape(g: Graph, n: Node) -> int | None:
    # reshape(reshape(x, s), t) -> reshape(x, t)
    inner = _operand(g, n, "reshape")
    if inner is None:
        return None
    x = inner.args[0]
    if n.shape == g.node(x).shape:
        return x
    return g.add("reshape", x, shape=n.shape, origin=n.origin)


def expand_same(g: Graph, n: Node) -> int | None:
    # expand(x, x.shape) -> x
    return n.args[0] if n.shape == g.node(n.args[0]).shape else None


def expand_expand(g: Graph, n: Node) -> int | None:
    # expand(expand(x, s), t) -> expand(x, t)
    inner = _operand(g, n, "expand")
    if inner is None:
        return None
    return g.add("expand", inner.args[0], shape=n.shape, origin=n.origin)


def slice_whole(g: Graph, n: Node) -> int | None:
    # x[..., 0:len:1] -> x  (same shape means every index, in order)
    return n.args[0] if n.shape == g.node(n.args[0]).shape else None


def cast_same(g: Graph, n: Node) -> int | None:
    # cast(x, x.dtype) -> x
    return n.args[0] if n.dtype == g.node(n.args[0]).dtype else None


def cast_chain(g: Graph, n: Node) -> int | None:
    # cast(cast(x, a), b) -> cast(x, b) when x -> a loses nothing (bf16->f32->bf16 -> x)
    inner = _operand(g, n, "cast")
    if inner is None:
        return None
    x = g.node(inner.args[0])
    if not lossless(x.dtype, inner.dtype):
        return None
    float_to_int = inner.dtype.is_floating_point and not n.dtype.is_floating_point and n.dtype != torch.bool
    if float_to_int and not lossless(x.dtype, n.dtype):
        return None  # unless the float holds integers that fit the target (i8 -> f16 -> i32)
    if n.dtype == x.dtype:
        return x.id
    return g.add("cast", x.id, dtype=n.dtype, origin=n.origin)


@dataclass(frozen=True)
class Rule:
    op: str                     # the op it looks at; "*": every op (the rule checks itself)
    fn: Callable[[Graph, Node], int | None]

    @property
    def name(self) -> str:
        return self.fn.__name__


RULES: list[Rule] = [
    Rule("mul", mul_one),
    Rule("add", add_zero),
    Rule("sub", sub_zero),
    Rule("div", div_one),
    Rule("neg", neg_neg),
    Rule("permute", permute_identity),
    Rule("permute", permute_permute),
    Rule("permute", permute_units),
    Rule("reshape", reshape_same),
    Rule("reshape", reshape_reshape),
    Rule("expand", expand_same),
    Rule("expand", expand_expand),
    Rule("slice", slice_whole),
    Rule("slice", slice_of_matmul),
    Rule("gather", gather_of_row_shift),
    Rule("*", reshape_sink),          # any unary elementwise op
    Rule("cast", cast_same),
    Rule("cast", cast_chain),
]

# per op: its own rules, then those for every op; an op with none of its own gets only those
_ANY: tuple[Rule, ...] = tuple(r for r in RULES if r.op == "*")
_BY_OP: dict[str, tuple[Rule, ...]] = {}
for _rule in RULES:
    if _rule.op != "*":
        _BY_OP[_rule.op] = _BY_OP.get(_rule.op, ()) + (_rule,)
_BY_OP = {op: rules + _ANY for op, rules in _BY_OP.items()}

MAX_SWEEPS = 100  # a safety net: every rule shrinks the graph, so real graphs need a few


def _is_dead(g: Graph, nid: int) -> bool:
    return g.nx.out_degree(nid) == 0 and nid not in g.outputs


def _sweep(g: Graph, counts: Counter) -> bool:
    changed = False
    for nid in g.topo_order():
        if nid not in g or _is_dead(g, nid):
            continue
        n = g.node(nid)
        for rule in _BY_OP.get(n.op, _ANY):
            new = rule.fn(g, n)
            if new is None:
                continue
            g.replace_all_uses(nid, new)
            g.remove(nid)
            counts[rule.name] += 1
            changed = True
            break
    return changed


@register_pass("simplify", fixed_point=True)
def simplify(graph: Graph) -> tuple[Graph, Changes]:
    """Exact algebraic rewrites (x*1, x+(-0.0), x/1, double permute, cast chains ...)."""
    g = graph.copy()
    counts: Counter = Counter()
    for _ in range(MAX_SWEEPS):
        if not _sweep(g, counts):
            break
    return g, dict(counts)

"""Index-expression simplification (codegen/indexing.py) checked against integer arithmetic.

The simplifier promises exactness inside the valid domain (every Sym below its bound); these
tests draw expressions built the way views build them (linear terms, then floor division and
modulo by constants, nested) and compare the simplified Expr with plain Python `//` and `%`
at every point of a small domain.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from minicomp.codegen import indexing as ix


def evaluate(e: ix.Expr, env: dict[str, int]) -> int:
    total = e.const
    for atom, k in e.terms:
        if isinstance(atom, ix.Sym):
            v = env[atom.name]
        elif isinstance(atom, ix.FloorDiv):
            v = evaluate(atom.arg, env) // atom.div
        else:
            v = evaluate(atom.arg, env) % atom.div
        total += k * v
    return total


SYMS = {"a": 6, "b": 5, "c": 4}          # name -> exclusive bound


def domain():
    names = list(SYMS)
    for values in itertools.product(*(range(SYMS[n]) for n in names)):
        yield dict(zip(names, values))


# an expression tree: ("lin", {sym: coeff}, const) | ("div", tree, c) | ("mod", tree, c) | ("add", t1, t2, k)
trees = st.recursive(
    st.builds(lambda co, k: ("lin", co, k),
              st.dictionaries(st.sampled_from(list(SYMS)), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 64]),
                              min_size=1, max_size=3),
              st.integers(0, 40)),
    lambda inner: st.one_of(
        st.builds(lambda t, c: ("div", t, c), inner, st.sampled_from([2, 3, 4, 8, 16, 24])),
        st.builds(lambda t, c: ("mod", t, c), inner, st.sampled_from([2, 3, 4, 8, 16, 24])),
        st.builds(lambda t1, t2, k: ("add", t1, t2, k), inner, inner, st.sampled_from([1, 2, 4, 8, 16]))),
    max_leaves=6)


def build(tree) -> ix.Expr:
    kind = tree[0]
    if kind == "lin":
        out = ix.as_expr(tree[2])
        for name, k in tree[1].items():
            out = out + ix.sym(name, SYMS[name]) * k
        return out
    if kind == "div":
        return ix.floordiv(build(tree[1]), tree[2])
    if kind == "mod":
        return ix.mod(build(tree[1]), tree[2])
    return build(tree[1]) + build(tree[2]) * tree[3]


def reference(tree, env) -> int:
    kind = tree[0]
    if kind == "lin":
        return tree[2] + sum(env[n] * k for n, k in tree[1].items())
    if kind == "div":
        return reference(tree[1], env) // tree[2]
    if kind == "mod":
        return reference(tree[1], env) % tree[2]
    return reference(tree[1], env) + reference(tree[2], env) * tree[3]


@settings(max_examples=300, deadline=None)
@given(trees)
def test_simplified_index_equals_integer_arithmetic_everywhere(tree):
    e = build(tree)
    for env in domain():
        assert evaluate(e, env) == reference(tree, env), (tree, e, env)


def test_terms_the_divisor_divides_leave_the_floor_division():
    a, b = ix.sym("a", 100), ix.sym("b", 7)
    e = ix.floordiv(a + b * 256 + 300, 128)              # 300 = 2*128 + 44
    assert e == ix.floordiv(a + 44, 128) + b * 2 + 2


def test_a_permuted_heads_view_read_as_a_matrix_folds_to_a_plain_offset():
    """A GEMM reading attention's output, laid out [B, S, H, D] = [8, 1024, 16, 128] and viewed
    as [B*S, H*D], addresses its A tile through the head split: it must fold to am*2048 + ak,
    which is what lets the GEMM use TMA descriptors."""
    am, ak = ix.sym("am", 8192), ix.sym("ak", 2048)
    flat = ak + am * 2048                      # the [B*S, H*D] view's flat position
    head = ix.mod(ix.floordiv(flat, 128), 16)
    within = ix.mod(flat, 128)
    assert am * 2048 + head * 128 + within == am * 2048 + ak    # (b, s) rows are 2048 apart in memory

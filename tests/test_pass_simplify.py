"""Simplification rules: each rule's rewrite, the cases where it must not fire, exactness."""

import math

import pytest
import torch

from minicomp.ir.graph import Graph
from minicomp.passes.simplify import RULES, lossless
from pass_testing import assert_same, check_pass, dump

f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64


def unchanged(g: Graph) -> None:
    check_pass("simplify", g, dump(g), {})


def one_op(op: str, x_type, const, const_dtype=None, const_first=False) -> Graph:
    """A graph `op(x, c)` (or `op(c, x)`) with x an input of type x_type=(shape, dtype)."""
    g = Graph(op)
    x = g.add_input("x", *x_type)
    c = g.constant(const, dtype=const_dtype)
    g.set_outputs([g.add(op, *((c, x) if const_first else (x, c)))])
    return g


# --------------------------------------------------------------------------- arithmetic identities

def test_mul_one_both_sides_and_a_rule_chain_in_one_run():
    g = Graph("m")
    x = g.add_input("x", (3, 5), f16)
    y = g.add("mul", g.constant(1.0), g.add("mul", x, g.constant(1)))   # 1.0 * (x * 1)
    g.set_outputs([g.add("neg", g.add("neg", y))])                        # neg(neg(...))
    check_pass("simplify", g, """
        graph m(%0: x) {
          %0 = input x : f16[3, 5]
          %1 = constant(1.0) : f32[]
          %2 = constant(1) : i64[]
          %3 = neg(%0) : f16[3, 5]
          return %0
        }""", {"mul_one": 2, "neg_neg": 1})


@pytest.mark.parametrize("op, x_type, const, const_dtype, const_first, fires", [
    ("mul", ((4,), f32), torch.ones(4), None, False, True),           # a ones tensor of x's shape
    ("mul", ((4,), f32), torch.ones(2, 4), None, False, False),       # broadcasts x up: type changes
    ("mul", ((4,), torch.int32), 1.0, None, False, False),             # int * 1.0 is float
    ("mul", ((4,), f16), torch.ones(1), None, False, False),           # f16[4] * f32[1] is f32
    ("mul", ((4,), f32), 0.0, None, False, False),                     # never x*0 -> 0
    ("add", ((4,), f32), -0.0, None, True, True),                      # -0.0 + x is x, exactly
    ("add", ((4,), f32), 0.0, None, False, False),                     # x + 0.0 maps -0.0 to 0.0
    ("add", ((4,), f32), 0, None, False, False),                       # an integer zero is +0
    ("add", ((4,), torch.int64), 0, None, False, True),                # integers: any zero
    ("add", ((4,), torch.bool), False, None, False, True),             # bool + False is x
    ("sub", ((4,), bf16), 0.0, None, False, True),                     # x - 0.0 is x + (-0.0)
    ("sub", ((4,), bf16), -0.0, None, False, False),                   # x - (-0.0) is x + 0.0
    ("sub", ((4,), f32), 0, None, False, True),                        # x - 0 (int) is x - 0.0
    ("sub", ((4,), f32), 0.0, None, True, False),                      # 0 - x is not x
    ("div", ((4,), f64), 1.0, None, False, True),
    ("div", ((4,), torch.int32), 1, None, False, False),               # true division: float result
    ("div", ((4,), f32), 1.0, None, True, False),                      # 1/x is not x
])
def test_identities_fire_only_when_exact_and_type_preserving(op, x_type, const, const_dtype, const_first, fires):
    g = one_op(op, x_type, const, const_dtype, const_first)
    out = check_pass("simplify", g, None)
    assert (out.outputs == out.inputs) == fires, dump(out)


def test_identity_from_a_full_generator():
    g = Graph("full")
    x = g.add_input("x", (2, 3), f32)
    ones = g.add("full", shape=(2, 3), value=1.0, dtype=f32)
    g.set_outputs([g.add("mul", ones, x)])
    out = check_pass("simplify", g, None, {"mul_one": 1})
    assert out.outputs == out.inputs


def test_sign_of_zero_is_kept():
    """x + 0.0 stays because on -0.0 it differs from x; the rewrite that is done is bit-exact."""
    x = torch.tensor([-0.0, 0.0, math.nan, -math.inf, 1e-45])
    assert not torch.equal(torch.signbit(x + 0.0), torch.signbit(x))
    assert_same(x + (-0.0), x)
    assert_same(x - 0.0, x)
    for op, c in (("add", 0.0), ("sub", -0.0)):
        unchanged(one_op(op, ((3,), f32), c))


def test_never_x_times_zero_or_x_minus_x():
    g = Graph("never")
    x = g.add_input("x", (3,), f32)
    g.set_outputs([g.add("mul", x, g.constant(0.0)), g.add("sub", x, x), g.add("div", x, x)])
    unchanged(g)


# --------------------------------------------------------------------------- views


def test_permutes_compose_and_identity_disappears():
    g = Graph("perm")
    x = g.add_input("x", (2, 3, 4), f32)
    back = g.add("permute", g.add("permute", x, dims=(1, 0, 2)), dims=(1, 0, 2))   # identity
    rot = g.add("permute", g.add("permute", x, dims=(1, 2, 0)), dims=(0, 2, 1))    # one permute
    same = g.add("permute", x, dims=(0, 1, -1))                                      # identity, negative dim
    g.set_outputs([back, rot, same])
    check_pass("simplify", g, """
        graph perm(%0: x) {
          %0 = input x : f32[2, 3, 4]
          %1 = permute(%0, dims=[1, 0, 2]) : f32[3, 2, 4]
          %2 = permute(%0, dims=[1, 2, 0]) : f32[3, 4, 2]
          %3 = permute(%0, dims=[1, 0, 2]) : f32[3, 2, 4]
          return %0, %3, %0
        }""", {"permute_permute": 2, "permute_identity": 1})


def test_a_permute_of_unit_axes_only_is_a_reshape():
    # einsum's bmm lowering: reshape to [.., 1], move the unit axis, reshape back
    g = Graph("units")
    x = g.add_input("x", (6, 9, 9), f32)
    r = g.add("reshape", x, shape=(2, 3, 9, 1, 9))
    moved = g.add("permute", r, dims=(0, 1, 2, 4, 3))                     # only the unit axis moves
    back = g.add("reshape", moved, shape=(2, 3, 9, 9))
    swapped = g.add("permute", r, dims=(0, 1, 4, 3, 2))                   # 9 and 9 swap: a transpose
    g.set_outputs([back, swapped])
    out = check_pass("simplify", g, None, None)
    ops = [out.node(n).op for n in out.topo_order()]
    assert ops.count("permute") == 1 and out.node(out.outputs[0]).op == "reshape", out.dump()
    assert out.node(out.node(out.outputs[0]).args[0]).op == "input", out.dump()


def test_a_reshape_sinks_below_the_unary_op_that_reads_it():
    g = Graph("sink")
    x = g.add_input("x", (2, 8, 3), f32)
    y = g.add("exp", x)                                       # computed: the reshape may sink
    act = g.add("sigmoid", g.add("reshape", y, shape=(2, 24)))
    kept = g.add("sigmoid", g.add("reshape", x, shape=(6, 8)))   # of an input: nothing gains
    g.set_outputs([act, kept])
    out = check_pass("simplify", g, None, None)
    first = out.node(out.outputs[0])
    assert first.op == "reshape" and out.node(first.args[0]).op == "sigmoid", out.dump()
    assert out.node(out.outputs[1]).op == "sigmoid", out.dump()


def test_reshapes_expands_and_slices():
    g = Graph("views")
    x = g.add_input("x", (2, 6), f32)
    col = g.add_input("col", (2, 1), f32)
    r = g.add("reshape", g.add("reshape", x, shape=(3, 4)), shape=(4, 3))     # one reshape
    r_back = g.add("reshape", g.add("reshape", x, shape=(12,)), shape=(2, -1))  # back to x
    same = g.add("reshape", x, shape=(2, 6))
    e = g.add("expand", g.add("expand", col, shape=(2, 3)), shape=(4, 2, 3))   # one expand
    e_same = g.add("expand", col, shape=(2, -1))
    whole = g.add("slice", x, dim=1, start=0, end=6, step=1)
    part = g.add("slice", x, dim=1, start=0, end=6, step=2)                    # kept
    g.set_outputs([r, r_back, same, e, e_same, whole, part])
    check_pass("simplify", g, """
        graph views(%0: x, %1: col) {
          %0 = input x : f32[2, 6]
          %1 = input col : f32[2, 1]
          %2 = reshape(%0, shape=[3, 4]) : f32[3, 4]
          %3 = reshape(%0, shape=[12]) : f32[12]
          %4 = expand(%1, shape=[2, 3]) : f32[2, 3]
          %5 = slice(%0, dim=1, start=0, end=6, step=2) : f32[2, 3]
          %6 = reshape(%0, shape=[4, 3]) : f32[4, 3]
          %7 = expand(%1, shape=[4, 2, 3]) : f32[4, 2, 3]
          return %6, %0, %0, %7, %1, %0, %5
        }""", {"reshape_reshape": 2, "reshape_same": 1, "expand_expand": 1, "expand_same": 1,
               "slice_whole": 1})


# --------------------------------------------------------------------------- casts


@pytest.mark.parametrize("src, mid, dst, result", [
    (bf16, f32, bf16, "x"),                 # widen and back: identity
    (f16, f64, f16, "x"),
    (torch.int8, f16, torch.int8, "x"),     # every i8 is an f16
    (torch.bool, f32, torch.bool, "x"),
    (bf16, f32, f16, "cast"),               # one cast bf16 -> f16
    (torch.int8, torch.int32, f32, "cast"),
    (f32, bf16, f32, "kept"),               # a rounding in the middle
    (torch.int32, f32, torch.int32, "kept"),  # i32 -> f32 loses low bits
    (f16, f32, torch.int32, "kept"),        # float -> int conversions are not moved ...
    (torch.int8, f16, torch.int32, "cast"),  # ... unless the floats hold integers that fit
    (torch.int16, f32, torch.int8, "kept"),  # (300 -> 300.0 -> i8 is not 300 -> i8)
    (f32, f32, f32, "x"),                   # casts to the same dtype vanish
])
def test_cast_chains(src, mid, dst, result):
    g = Graph("casts")
    x = g.add_input("x", (5,), src)
    g.set_outputs([g.add("cast", g.add("cast", x, dtype=mid), dtype=dst)])
    out = check_pass("simplify", g, None)
    last = out.node(out.outputs[0])
    if result == "x":
        assert out.outputs == out.inputs
    elif result == "cast":
        assert last.op == "cast" and last.args == (x,) and last.dtype == dst
    else:
        assert dump(out) == dump(g)


def test_lossless_table():
    assert lossless(bf16, f32) and lossless(f16, f64) and lossless(torch.uint8, bf16)
    assert not lossless(f32, bf16) and not lossless(f16, bf16) and not lossless(bf16, f16)
    assert not lossless(torch.int32, f32) and not lossless(torch.int64, f64)
    # the table is honest: every value of src survives the round trip through dst
    for src, dsts in [(torch.int8, [f16, bf16, torch.int16]), (torch.uint8, [f16, bf16]),
                      (torch.int16, [f32])]:
        info = torch.iinfo(src)
        values = torch.arange(info.min, info.max + 1, dtype=torch.int64).to(src)
        for dst in dsts:
            assert lossless(src, dst)
            assert torch.equal(values.to(dst).to(src), values)


def test_rules_table_has_one_comment_each():
    import inspect
    for rule in RULES:
        body = inspect.getsource(rule.fn).splitlines()
        assert body[1].strip().startswith("#"), f"{rule.name} has no one-line comment"


def test_nothing_to_simplify():
    g = Graph("plain")
    x = g.add_input("x", (3, 4), bf16)
    y = g.add("cast", g.add("permute", x, dims=(1, 0)), dtype=f32)
    g.set_outputs([g.add("mul", y, g.constant(2.0)), g.add("neg", x)])
    unchanged(g)


def test_a_gather_moves_past_a_per_row_shift_only():
    import torch as _t
    g = Graph("shift")
    x = g.add_input("x", (4, 6), f32)
    m = g.add_input("m", (4, 1), f32)
    full = g.add_input("full", (4, 6), f32)
    i1 = g.constant(_t.tensor([[0], [5], [2], [3]]))
    i6 = g.constant(_t.randint(0, 6, (4, 6), generator=_t.Generator().manual_seed(0)))
    row = g.add("gather", g.add("sub", x, m), i1, dim=1, mode="gather")       # m is one value per row
    elem = g.add("gather", g.add("sub", x, full), i6, dim=1, mode="gather")   # full is not: stays
    g.set_outputs([row, elem])
    out = check_pass("simplify", g, None, None)
    assert out.node(out.outputs[0]).op == "sub" and out.node(out.outputs[1]).op == "gather", out.dump()

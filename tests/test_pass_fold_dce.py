"""Constant folding and dead-code elimination: expected output graphs, do-nothing cases."""

import math

import pytest
import torch

from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from pass_testing import check_pass, dump


def test_fold_scale_and_scalar_chain():
    g = Graph("scale")
    x = g.add_input("x", (3, 5), torch.float32)
    hd = g.constant(64.0)
    scale = g.add("pow", hd, exponent=-0.5)                  # head_dim ** -0.5
    two = g.add("add", g.constant(1.0), g.constant(1.0))     # 1.0 + 1.0
    g.set_outputs([g.add("mul", g.add("mul", x, scale), two)])
    check_pass("constant_fold", g, """
        graph scale(%0: x) {
          %0 = input x : f32[3, 5]
          %1 = constant(64.0) : f32[]
          %2 = constant(1.0) : f32[]
          %3 = constant(1.0) : f32[]
          %4 = constant(0.125) : f32[]
          %5 = mul(%0, %4) : f32[3, 5]
          %6 = constant(2.0) : f32[]
          %7 = mul(%5, %6) : f32[3, 5]
          return %7
        }""", {"folded": 2})


def test_fold_keeps_the_interpreters_dtype():
    g = Graph("types")
    x = g.add_input("x", (4,), torch.float16)
    tenth = g.add("cast", g.constant(0.1), dtype=torch.float16)      # f16 rounding of 0.1
    ratio = g.add("div", g.constant(7), g.constant(2))                # i64 / i64 -> f32 3.5 (0-d: x stays f16)
    flag = g.add("logical_not", g.constant(True))                     # b8
    bf = g.add("add", g.add("cast", g.constant(3.0), dtype=torch.bfloat16), g.constant(1.0))  # bf16 + f32 (0-d) -> f32
    y = g.add("mul", g.add("mul", x, tenth), ratio)
    g.set_outputs([y, flag, bf])
    check_pass("constant_fold", g, """
        graph types(%0: x) {
          %0 = input x : f16[4]
          %1 = constant(0.1) : f32[]
          %2 = constant(7) : i64[]
          %3 = constant(2) : i64[]
          %4 = constant(true) : b8[]
          %5 = constant(3.0) : f32[]
          %6 = constant(1.0) : f32[]
          %7 = constant(0.0999755859375) : f16[]
          %8 = mul(%0, %7) : f16[4]
          %9 = constant(3.5) : f32[]
          %10 = mul(%8, %9) : f16[4]
          %11 = constant(false) : b8[]
          %12 = constant(3.0) : bf16[]
          %13 = constant(4.0) : f32[]
          return %10, %11, %13
        }""", {"folded": 5})


@pytest.mark.parametrize("size", [8, 4096])
def test_causal_mask_stays_symbolic_at_every_size(size):
    g = Graph("mask")
    x = g.add_input("x", (1, 1), torch.float32)
    m = C.causal_mask(g, size, size)
    g.set_outputs([m, g.add("neg", x)])
    check_pass("constant_fold", g, f"""
        graph mask(%0: x) {{
          %0 = input x : f32[1, 1]
          %1 = full(shape=[{size}, {size}], value=true, dtype=b8) : b8[{size}, {size}]
          %2 = tril(%1, diagonal=0) : b8[{size}, {size}]
          %3 = neg(%0) : f32[1, 1]
          return %2, %3
        }}""", {})


def test_generators_and_growing_folds_are_skipped_same_size_and_shrinking_folds_are_not():
    g = Graph("sizes")
    x = g.add_input("x", (4, 4), torch.float32)
    col_value = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    row_value = torch.tensor([[1.0, -1.0, 0.5, 2.0]])
    col, row = g.constant(col_value), g.constant(row_value)
    outer = g.add("matmul", col, row)                                 # 16 elements from 4: skipped
    wide = g.add("expand", g.constant(2.0), shape=(4, 4))             # a broadcast scalar: skipped
    ramp = g.add("arange", start=0, end=4, step=1, dtype=torch.float32)   # a generator: skipped
    flipped = g.add("neg", row)                                       # same size: folded
    total = g.add("sum", col, axes=(0, 1), keepdim=False)             # smaller: folded
    one = g.add("full", shape=(), value=1.5, dtype=torch.float32)     # one element: folded
    y = g.add("add", g.add("mul", g.add("add", x, outer), wide), ramp)
    y = g.add("mul", g.add("add", y, flipped), g.add("mul", total, one))
    g.set_outputs([y])
    check_pass("constant_fold", g, """
        graph sizes(%0: x) {
          %0 = input x : f32[4, 4]
          %1 = constant(<f32[4, 1] #COL>) : f32[4, 1]
          %2 = constant(<f32[1, 4] #ROW>) : f32[1, 4]
          %3 = matmul(%1, %2) : f32[4, 4]
          %4 = constant(2.0) : f32[]
          %5 = expand(%4, shape=[4, 4]) : f32[4, 4]
          %6 = arange(start=0, end=4, step=1, dtype=f32) : f32[4]
          %7 = add(%0, %3) : f32[4, 4]
          %8 = mul(%7, %5) : f32[4, 4]
          %9 = add(%8, %6) : f32[4, 4]
          %10 = constant(<f32[1, 4] #NEGROW>) : f32[1, 4]
          %11 = add(%9, %10) : f32[4, 4]
          %12 = constant(10.0) : f32[]
          %13 = constant(1.5) : f32[]
          %14 = constant(15.0) : f32[]
          %15 = mul(%11, %14) : f32[4, 4]
          return %15
        }""".replace("NEGROW", _digest(-row_value)).replace("COL", _digest(col_value)).replace(
            "ROW", _digest(row_value)), {"folded": 4})


def test_fold_output_and_opaque_never_folded():
    g = Graph("out")
    x = g.add_input("x", (2,), torch.float32)
    c = g.constant(torch.tensor([1.0, 4.0]))
    op = g.add("opaque", c, fn=torch.sqrt, target="sqrt", out_shape=(2,), out_dtype=torch.float32)
    g.set_outputs([g.add("sqrt", c), g.add("add", x, op)])
    check_pass("constant_fold", g, """
        graph out(%0: x) {
          %0 = input x : f32[2]
          %1 = constant(<f32[2] #SQUARES>) : f32[2]
          %2 = opaque(%1, target="sqrt") : f32[2]
          %3 = add(%0, %2) : f32[2]
          %4 = constant(<f32[2] #ROOTS>) : f32[2]
          return %4, %3
        }""".replace("ROOTS", _digest(torch.tensor([1.0, 2.0]))).replace(
            "SQUARES", _digest(torch.tensor([1.0, 4.0]))), {"folded": 1})


def _digest(t):
    from minicomp.ir.printer import tensor_digest
    return tensor_digest(t)


def test_fold_nothing_to_do():
    g = Graph("plain")
    x = g.add_input("x", (3,), torch.float32)
    g.set_outputs([g.add("mul", g.add("exp", x), g.constant(math.pi))])
    before = dump(g)
    check_pass("constant_fold", g, before, {})


# --------------------------------------------------------------------------- DCE


def test_dce_drops_dead_chains_keeps_inputs():
    g = Graph("dead")
    x = g.add_input("x", (3,), torch.float32)
    unused = g.add_input("unused", (2,), torch.float32)
    g.add("exp", g.add("neg", x))                                     # dead chain
    g.add("opaque", x, fn=torch.sin, target="sin", out_shape=(3,), out_dtype=torch.float32)  # dead opaque
    g.constant(3.0)                                                   # dead constant
    g.set_outputs([g.add("abs", x), unused])
    check_pass("dce", g, """
        graph dead(%0: x, %1: unused) {
          %0 = input x : f32[3]
          %1 = input unused : f32[2]
          %2 = abs(%0) : f32[3]
          return %2, %1
        }""", {"removed": 4})


def test_dce_nothing_to_do():
    g = Graph("live")
    x = g.add_input("x", (3,), torch.float32)
    a = g.add("neg", x)
    g.set_outputs([a, g.add("add", a, x), x])
    check_pass("dce", g, dump(g), {})


def test_views_of_constants_are_looked_through_not_materialised():
    g = Graph("views")
    x = g.add_input("x", (3, 2), torch.float32)
    w_value = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    w = g.constant(w_value, label="w")
    wt = g.add("permute", w, dims=(1, 0))                  # a weight transpose: left to the layout pass
    half = g.add("cast", wt, dtype=torch.bfloat16)         # fewer bytes: folded, through the view
    wide = g.add("cast", g.constant(w_value.to(torch.bfloat16), label="v"), dtype=torch.float32)  # 2x bytes: kept
    corner = g.add("slice", g.add("slice", w, dim=0, start=0, end=1, step=1), dim=1, start=0, end=1, step=1)
    g.set_outputs([g.add("add", x, wt), half, wide, corner])
    check_pass("constant_fold", g, """
        graph views(%0: x) {
          %0 = input x : f32[3, 2]
          %1 = constant(<f32[2, 3] #W>, label="w") : f32[2, 3]
          %2 = permute(%1, dims=[1, 0]) : f32[3, 2]
          %3 = constant(<bf16[2, 3] #V>, label="v") : bf16[2, 3]
          %4 = cast(%3, dtype=f32) : f32[2, 3]
          %5 = slice(%1, dim=0, start=0, end=1, step=1) : f32[1, 3]
          %6 = add(%0, %2) : f32[3, 2]
          %7 = constant(<bf16[3, 2] #HALF>, label="cast(w)") : bf16[3, 2]
          %8 = constant(<f32[1, 1] #CORNER>, label="slice(w)") : f32[1, 1]
          return %6, %7, %4, %8
        }""".replace("#W", "#" + _digest(w_value)).replace("#V", "#" + _digest(w_value.to(torch.bfloat16)))
        .replace("#HALF", "#" + _digest(w_value.T.to(torch.bfloat16))).replace("#CORNER", "#" + _digest(w_value[:1, :1])),
        {"folded": 2})


def test_a_fold_that_raises_is_left_for_run_time():
    g = Graph("raises")
    x = g.add_input("x", (2,), torch.float32)
    flags = g.constant(torch.tensor([True, False]))
    bad = g.add("sub", flags, g.constant(1.0))   # meta inference accepts this; evaluation refuses
    g.set_outputs([x, bad])
    from minicomp.passes.manager import PASSES
    out, changes = PASSES["constant_fold"].run(g)
    assert changes == {} and dump(out) == dump(g)

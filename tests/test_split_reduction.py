"""Split (two-stage) reductions (codegen/split_reduce.py) against eager, and when the plan picks them.

Under the interpreter the split is forced by `RowForm(split_fill=...)` (never by default there);
the shapes that must split on the H200 are checked in the generated CUDA source, which is
written here and compiled for sm_90 by the suite's GPU-true check, and run on the GPU by the
`gpu` tests at the end.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tol

import minicomp
from minicomp.codegen import generate
from minicomp.errors import MinicompError
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.plan import Group, Plan
from minicomp.plan.cost import MACHINES, split_pays, split_rows
from minicomp.target import RowForm, Target

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# split whenever the row blocks are fewer than 8 programs, into chunks of >= 64 elements; 256-wide
# column blocks keep the interpreter's loops short
SPLIT = RowForm(split_fill=8, split_min_chunk=64, cpu_loop_block=256)
SPLIT_MARK = "split: each row shared by"
SM90 = Target("cuda", (9, 0))


def rand(shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def run(fn, *inputs, row_form=SPLIT, **options):
    """(output, generated source) of `fn` compiled with `row_form`; no group runs through PyTorch."""
    f = minicomp.compile(fn, row_form=row_form, **options)
    out = f(*inputs)
    c = f._need()
    assert not c.generated.fallbacks, c.generated.fallbacks
    return out, c.generated.source


def check(fn, x, *, split: bool = True, dtype=None, **options):
    out, src = run(fn, x, **options)
    want = fn(x)
    torch.testing.assert_close(out, want, **tol(dtype or x.dtype), equal_nan=True)
    assert (SPLIT_MARK in src) == split, src
    return src


# --------------------------------------------------------------------------- leading axes


@pytest.mark.parametrize("dtype, rows", [(torch.float32, 65537), (torch.float16, 16411), (torch.bfloat16, 16411)])
def test_sum_over_the_leading_axis_of_a_tall_matrix(dtype, rows):
    src = check(lambda x: x.float().sum(0), rand((rows, 129), dtype), dtype=torch.float32)
    assert "leading axes" in src and "mc_red_sum_0_partials" in src
    assert "for c0 in range(c_start, c_stop, BLOCK_C):" in src


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_mean_amax_amin_over_dim0_in_their_own_dtype(dtype):
    """Four reductions of one domain: one kernel whose partials hold a value of each (few kept
    columns: the interpreter runs a max's combine function element by element)."""
    x = rand((4099, 6), dtype) * 3
    fn = lambda t: (t.sum(0), t.mean(0), t.amax(0), t.amin(0))  # noqa: E731
    out, src = run(fn, x)
    for o, w in zip(out, fn(x), strict=True):
        assert o.dtype == w.dtype == dtype
        torch.testing.assert_close(o, w, **tol(dtype))
    assert src.count(SPLIT_MARK) == 2 and "writes partials [4, " in src      # two stages, four values


@pytest.mark.parametrize("keepdim", [False, True])
def test_several_leading_dims_and_keepdim(keepdim):
    x = rand((41, 97, 13), torch.float32)
    check(lambda t: t.sum((0, 1), keepdim=keepdim), x)
    check(lambda t: t.mean((0, 1), keepdim=keepdim), x)
    check(lambda t: t.amax(0, keepdim=keepdim), rand((2053, 7), torch.bfloat16))


def test_prologue_and_epilogue_operands_of_either_axis():
    """A weight along the reduced axis is read in stage 1's loop, a bias along the kept one in
    stage 2, after the combine."""
    x, w, b = rand((3001, 5), torch.bfloat16), rand((3001,), torch.float32, 1), rand((5,), torch.float32, 2)
    fn = lambda x, w, b: (x.float() * w[:, None]).sum(0) * 0.5 + b  # noqa: E731
    out, src = run(fn, x, w, b)
    torch.testing.assert_close(out, fn(x, w, b), **tol(torch.float32))
    assert SPLIT_MARK in src


def test_non_contiguous_inputs():
    base = rand((3, 4099), torch.float32)
    # dim 0 of a transposed view is its contiguous axis: the long-rows form reads it
    src = check(lambda t: t.sum(0), base.t())
    assert "long rows" in src
    # a strided slice along the kept axis
    check(lambda t: t.amin(0), rand((3001, 8), torch.float16)[:, ::2])


# --------------------------------------------------------------------------- long rows


@pytest.mark.parametrize("dtype, cols", [(torch.float32, 100003), (torch.float16, 30011), (torch.bfloat16, 30011)])
def test_logsumexp_of_a_few_long_rows(dtype, cols):
    x = rand((3, cols), dtype) * 4
    src = check(lambda t: torch.logsumexp(t, -1), x)
    assert "long rows" in src
    check(lambda t: t.float().logsumexp(dim=1, keepdim=True), x, dtype=torch.float32)


def test_logsumexp_rows_of_infinities_and_nan():
    x = rand((5, 3001), torch.float32)
    x[0] = float("-inf")                    # all -inf: -inf, as torch
    x[1, :2000] = float("-inf")             # -inf in the first splits only
    x[2, 1234] = float("inf")               # +inf somewhere: +inf
    x[3, 2999] = float("nan")               # NaN in the last split: NaN
    out, src = run(lambda t: torch.logsumexp(t, -1), x)
    assert SPLIT_MARK in src
    torch.testing.assert_close(out, torch.logsumexp(x, -1), equal_nan=True, **tol(torch.float32))
    assert out[0] == float("-inf") and out[2] == float("inf") and out[3].isnan()


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_long_rows_writes_every_chunk(dtype):
    x = rand((2, 5003), dtype) * 5
    src = check(lambda t: torch.softmax(t.float(), -1), x, dtype=torch.float32)
    assert "stage 2 of 2" in src and "online softmax" in src


def test_softmax_with_a_row_output_stores_the_row_once():
    """One group with a full-shape and a row output: stage 2's split programs all combine the
    row's statistics, and split 0 alone stores the row output."""
    def f(x):
        m = x.amax(-1, keepdim=True)
        e = torch.exp(x - m)
        s = e.sum(-1, keepdim=True)
        return e / s, torch.log(s) + m
    x = rand((3, 4001), torch.float32) * 3
    out, src = run(f, x)
    for o, w in zip(out, f(x), strict=True):
        torch.testing.assert_close(o, w, **tol(torch.float32))
    assert SPLIT_MARK in src and "first_rows = row_mask & (rows * 0 + split == 0)" in src


# --------------------------------------------------------------------------- which form the plan picks


def test_small_or_full_shapes_keep_the_one_stage_form():
    check(lambda t: t.sum(0), rand((100, 33), torch.float32), split=False)       # rows too short to share
    check(lambda t: t.logsumexp(-1), rand((64, 2000), torch.float32), split=False)  # 64 row blocks fill 8
    # the interpreter's default never splits
    check(lambda t: t.sum(0), rand((4099, 33), torch.float32), split=False, row_form=RowForm())
    check(lambda t: t.sum(0), rand((4099, 33), torch.float32), split=False, row_form=RowForm(split_fill=0))


def test_a_reduction_that_needs_another_keeps_one_stage():
    # var's mean is a second reduction of the row, which a split would need a third pass for
    check(lambda t: t.var(0), rand((4099, 9), torch.float32), split=False)
    check(lambda t: t.argmax(0), rand((4099, 9), torch.float32), split=False)


def test_symbolic_sizes_keep_the_one_stage_form():
    f = minicomp.compile(lambda t: t.float().sum(0), dynamic=True, row_form=SPLIT)
    for n in (4099, 5003):
        x = rand((n, 33), torch.bfloat16)
        torch.testing.assert_close(f(x), x.float().sum(0), **tol(torch.float32))
    c = f._need()
    assert not c.generated.fallbacks and SPLIT_MARK not in c.generated.source


def _one_group(g: Graph) -> Plan:
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    leaves = [n.id for n in g.nodes() if n.kind in ("input", "constant") and g.users(n.id)]
    return Plan(g.name, [Group(0, "reduction", nodes=nodes, inputs=leaves, outputs=list(g.outputs))]).with_specs(g)


def _cuda_source(shape, dtype, build) -> str:
    g = Graph("split")
    x = g.add_input("x", shape, dtype)
    g.set_outputs([build(g, x)])
    gen = generate(g, _one_group(g), SM90)
    assert not gen.fallbacks, gen.fallbacks
    return gen.source


def test_h200_shapes_split_by_default_on_cuda():
    upcast = lambda g, x: g.add("cast", x, dtype=torch.float32)  # noqa: E731
    sum0 = _cuda_source((65536, 4096), torch.bfloat16, lambda g, x: C.reduce(g, "sum", upcast(g, x), (0,)))
    assert "each row shared by 17 programs of 3904 elements (leading axes" in sum0
    assert "mc_red_sum_0_part = torch.empty((69632,), dtype=torch.float32" in sum0   # [1 value, 17 splits, 4096 rows]
    lse = _cuda_source((64, 151936), torch.bfloat16, lambda g, x: C.reduce(g, "logsumexp", upcast(g, x), (1,)))
    assert "each row shared by 8 programs of 20480 elements (long rows)" in lse
    # 512 rows fill the device already (the 0.96x softmax keeps its kernel); small sums keep theirs
    assert SPLIT_MARK not in _cuda_source((512, 50257), torch.float32, lambda g, x: C.softmax(g, x, -1))
    assert SPLIT_MARK not in _cuda_source((4, 8000), torch.float32, lambda g, x: C.reduce(g, "sum", x, (1,)))


def test_a_split_past_int32_offsets_indexes_in_int64_and_compiles_for_sm90():
    g = Graph("wide")
    x = g.add_input("x", (1 << 20, 4100), torch.bfloat16)          # 4.3e9 elements
    g.set_outputs([C.reduce(g, "sum", g.add("cast", x, dtype=torch.float32), (0,))])
    gen = generate(g, _one_group(g), Target("cuda", (9, 0), verify_arch=90, verify_depth="sampled"))
    assert not gen.fallbacks and SPLIT_MARK in gen.source
    assert "c_start = split.to(tl.int64) * chunk" in gen.source and "pid.to(tl.int64) * BLOCK_R" in gen.source


def test_the_split_count_comes_from_the_sizes():
    h200 = MACHINES["h200"]
    fill = 2 * h200.sms
    tall = split_rows(32, 65536, fill, 2048, 64, 65536 * 4096 * 2, 4 * 4096)
    assert (tall.splits, tall.chunk) == (17, 3904) and tall.chunk % 64 == 0
    assert tall.splits * tall.chunk >= 65536 > (tall.splits - 1) * tall.chunk
    one_row = split_rows(1, 151936, fill, 2048, 4096, 151936 * 2, 8)
    assert one_row.splits == 38 and one_row.chunk == 4096          # every program keeps >= a granule
    assert split_rows(264, 65536, fill, 2048, 64, 1 << 30, 1024) is None     # the rows fill it
    assert split_rows(4, 3000, fill, 2048, 64, 48000, 16) is None             # too short to share
    assert split_pays(h200, 32, fill, 65536 * 4096 * 2)
    assert not split_pays(h200, 4, fill, 4 * 8000 * 4)                         # a launch costs more


def test_row_form_split_knobs_are_checked():
    with pytest.raises(MinicompError, match="split_fill"):
        RowForm(split_fill=-1)
    with pytest.raises(MinicompError, match="split_min_chunk"):
        RowForm(split_min_chunk=0)


def test_inputs_named_like_the_kernels_locals():
    def f(split, chunk, part, n_splits):
        return torch.logsumexp(split * chunk + part, -1), (split + n_splits).sum(-1)
    xs = [rand((2, 3001), torch.float32, seed=i) for i in range(4)]
    out, src = run(f, *xs)
    for o, w in zip(out, f(*xs), strict=True):
        torch.testing.assert_close(o, w, **tol(torch.float32))
    assert SPLIT_MARK in src


# --------------------------------------------------------------------------- on the H200


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["sum0", "lse", "softmax8"])
def test_split_reductions_on_the_gpu(case):
    fn, shape = {"sum0": (lambda t: t.float().sum(0), (65536, 4096)),
                 "lse": (lambda t: torch.logsumexp(t.float(), -1), (64, 151936)),
                 "softmax8": (lambda t: torch.softmax(t.float(), -1), (8, 50257))}[case]
    x = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    f = minicomp.compile(fn)
    out = f(x)
    c = f._need()
    assert not c.generated.fallbacks, c.generated.fallbacks
    assert SPLIT_MARK in c.generated.source
    torch.testing.assert_close(out, fn(x), **tol(torch.float32))

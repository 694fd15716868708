"""Indirect loads (embedding, x[idx], index_select, gather, take_along_dim) compile to kernels,
fuse with their neighbours, and give eager's answer, or eager's kind of error for a bad index.

- property test: random cases (`indexing_cases.py`) against eager, every one compiled with
  its indirect loads in kernels (`MINICOMP_INDEXING_EXAMPLES=N` runs N, not the CI's few);
- fusion: embedding + positional add + layer norm in one row kernel; an embedding in a GEMM's
  prologue, and in a group of its own when the ledger says so; gathers in reductions and in
  the loss; the plans' kinds and the kernels' text;
- bad indices: each op's out-of-range and negative cases raise eager's exception kind, with a
  message naming the node; what the kernel does not read is not checked;
- what minicomp cannot bound stays out of one kernel; x[bool_mask] is refused clearly.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tol
from hypothesis import HealthCheck, given, settings
from indexing_cases import case

import minicomp
from minicomp.api import compile_graph
from minicomp.errors import MinicompError, OutOfBoundsError
from minicomp.ir.graph import Graph

OPS = ("index", "gather")


def compiled(fn, *args):
    """(compiled result, eager result, the Compiled record) of `fn` on `args`."""
    cf = minicomp.compile(fn)
    with torch.no_grad():
        got = cf(*args)
        want = fn(*args)
    return got, want, cf.compile_for(*args)


def gather_groups(c) -> list:
    """The plan's groups that hold an indirect load."""
    return [g for g in c.plan.groups if any(c.graph.node(n).op in OPS for n in g.nodes)]


def assert_in_kernels(c) -> None:
    """Every indirect load of the graph runs in a generated kernel (none through PyTorch)."""
    nodes = [n for n in c.graph.nodes() if n.op in OPS]
    assert nodes, c.graph.dump()
    assert not [n for n in c.graph.nodes() if n.op == "opaque" and "index" in n.attrs["target"]], c.graph.dump()
    for g in gather_groups(c):
        assert g.kind != "opaque" and g.id not in c.generated.fallbacks, (str(c.plan), c.generated.fallbacks)


# --------------------------------------------------------------------------- property test

EXAMPLES = int(os.environ.get("MINICOMP_INDEXING_EXAMPLES", "40"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize="MINICOMP_INDEXING_EXAMPLES" not in os.environ,
          database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case())
def test_random_indirect_loads_equal_eager(c):
    got, want, comp = compiled(c.fn, *c.args)
    assert got.shape == want.shape and got.dtype == want.dtype, c
    # gathers are exact; the softmax some cases end in is exact to an ulp or two in fp64
    close = dict(atol=1e-12, rtol=1e-12) if want.dtype == torch.float64 else tol(want.dtype)
    torch.testing.assert_close(got, want, **close, msg=lambda m: f"{c}: {m}")
    if want.numel():
        assert_in_kernels(comp)


# --------------------------------------------------------------------------- fusion


class Embeddings(nn.Module):
    """GPT-2's input: token and position embeddings, added, then a layer norm."""

    def __init__(self, vocab=97, positions=16, width=40):
        super().__init__()
        self.wte, self.wpe, self.ln = nn.Embedding(vocab, width), nn.Embedding(positions, width), nn.LayerNorm(width)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.ln(self.wte(ids) + self.wpe(pos))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_positions_and_layer_norm_are_one_row_kernel(dtype):
    m = Embeddings().to(dtype).eval()
    ids = torch.randint(0, 97, (3, 11))
    got, want, c = compiled(m, ids)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert c.plan.kinds() == ["reduction"], str(c.plan)
    src = c.generated.source
    # the token ids are loaded once per row, the position rows are a plain strided read (arange)
    assert "ids = tl.load(ids_ptr + rows, mask=row_mask, other=0)" in src, src
    assert "wte_weight_ptr + ids * 40" in src
    assert src.count("_rt.check_index(") == 1, src     # the ids are checked; the arange needs none


def test_embedding_feeding_a_linear_is_its_gemm_prologue():
    def f(w, ids, lw, lb):
        return F.linear(F.embedding(ids, w), lw, lb).relu()
    w, ids, lw, lb = torch.randn(50, 24), torch.randint(0, 50, (3, 7)), torch.randn(20, 24), torch.randn(20)
    got, want, c = compiled(f, w, ids, lw, lb)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert c.plan.kinds() == ["gemm"], str(c.plan)
    assert "a_rows = w_ptr + ids * 24" in c.generated.source, c.generated.source


def test_embedding_also_read_elsewhere_is_its_own_group():
    # the residual reads the embedding too: writing it once is cheaper than gathering twice
    def f(w, ids, lw):
        h = F.embedding(ids, w)
        return h @ lw + h
    w, ids, lw = torch.randn(50, 24), torch.randint(0, 50, (2, 9)), torch.randn(24, 24)
    got, want, c = compiled(f, w, ids, lw)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert sorted(c.plan.kinds()) == ["gemm", "pointwise"], str(c.plan)
    (g,) = gather_groups(c)
    assert g.kind == "pointwise"


def test_gathers_fuse_into_reductions_and_the_loss():
    def f(x, i):
        return torch.gather(x, 1, i).sum(-1) * 2

    x, i = torch.randn(6, 33), torch.randint(0, 33, (6, 5))
    got, want, c = compiled(f, x, i)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert c.plan.kinds() == ["reduction"], str(c.plan)

    def loss(logits, labels):
        return -torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

    lg, lb = torch.randn(6, 33), torch.randint(0, 33, (6,))
    got, want, c = compiled(loss, lg, lb)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert_in_kernels(c)
    # the row kernel cannot gather its own normalised row; simplify moves the shift after the
    # gather (gather_of_row_shift): it reads the logits at the labels, x - max - lse per row,
    # all in the one row kernel
    assert c.plan.kinds() == ["reduction"], str(c.plan)
    (g,) = gather_groups(c)
    assert g.kind == "reduction" and g.bytes_out == 6 * 4, str(c.plan)


def test_advanced_indexing_with_slices_and_broadcast_index_tensors_is_one_kernel():
    def f(x, i, j, y):
        return x[i, 1:, j] * y          # i [2] and j [3, 1] broadcast to [3, 2]; apart: first
    x = torch.randn(5, 4, 6).transpose(0, 2).contiguous().transpose(0, 2)
    i, j = torch.tensor([1, -2]), torch.tensor([[0], [5], [-1]], dtype=torch.int32)
    y = torch.randn(3, 2, 3)
    got, want, c = compiled(f, x, i, j, y)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise"], str(c.plan)
    assert "tl.where(" in c.generated.source       # negative indices count from the end


def test_a_widening_cast_of_the_indices_stays_in_the_kernel():
    def f(w, ids):
        return F.embedding(ids.long(), w) * 3
    w, ids = torch.randn(30, 8), torch.randint(0, 30, (4, 5), dtype=torch.int32)
    got, want, c = compiled(f, w, ids)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise"], str(c.plan)
    assert "_rt.check_index(ids, 0, 29," in c.generated.source


def test_concatenated_indices_are_checked_part_by_part():
    def f(w, a, b):
        return F.embedding(torch.cat([a, b.long()]), w) * 2
    w, a, b = torch.randn(10, 4), torch.tensor([1, 2]), torch.tensor([3], dtype=torch.int32)
    got, want, c = compiled(f, w, a, b)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise"], str(c.plan)
    assert c.generated.source.count("_rt.check_index(") == 2
    with pytest.raises(IndexError, match="index 10 is out of bounds"):
        minicomp.compile(f)(w, a, torch.tensor([10], dtype=torch.int32))


def test_an_index_minicomp_cannot_bound_reaches_the_load_through_memory():
    def f(w, ids):
        return F.embedding(ids * 2, w)
    w, ids = torch.randn(30, 8), torch.randint(0, 15, (4, 5))
    got, want, c = compiled(f, w, ids)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise", "pointwise"], str(c.plan)
    assert any("no bound minicomp knows" in r.reason for r in c.plan.rejected), str(c.plan)
    with pytest.raises(IndexError, match="index 30 is out of bounds for dimension 0 with size 30"):
        minicomp.compile(f)(w, torch.full((4, 5), 15))


def test_position_ids_and_take_along_dims_modulo_need_no_check():
    def f(w, x, i):
        return F.embedding(torch.arange(5), w) + torch.gather(x, 1, i)
    w, x, i = torch.randn(8, 3), torch.randn(5, 3), torch.randint(0, 3, (5, 3))
    got, want, c = compiled(f, w, x, i)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise"]
    assert c.generated.source.count("_rt.check_index(") == 1, c.generated.source    # i only

    # take_along_dim's indices are taken modulo the size (as eager's), in the kernel: no check
    g = Graph("tad")
    xs, js = g.add_input("x", (5, 9), torch.float32), g.add_input("i", (5, 4), torch.int64)
    g.set_outputs([g.add("gather", xs, js, dim=1, mode="take_along_dim")])
    x, i = torch.randn(5, 9), torch.randint(-30, 30, (5, 4))
    c = compile_graph(g, [x, i])
    torch.testing.assert_close(c.call(x, i)[0], torch.take_along_dim(x, i, 1))
    assert "check_index" not in c.generated.source and " % 9" in c.generated.source


# --------------------------------------------------------------------------- bad indices

W, X = torch.randn(10, 4), torch.randn(5, 10)
BAD = {
    "embedding-past-the-end": (lambda i: F.embedding(i, W) + 1, torch.tensor([1, 10]), IndexError),
    "embedding-negative": (lambda i: F.embedding(i, W) + 1, torch.tensor([1, -1]), IndexError),
    "index-past-the-end": (lambda i: X[:, i] * 2, torch.tensor([3, 10]), IndexError),
    "index-below-minus-n": (lambda i: X[:, i] * 2, torch.tensor([3, -11]), IndexError),
    "index_select-past-the-end": (lambda i: torch.index_select(X, 1, i) * 2, torch.tensor([1, 10]), RuntimeError),
    "index_select-negative": (lambda i: torch.index_select(X, 1, i) * 2, torch.tensor([-1]), RuntimeError),
    "gather-past-the-end": (lambda i: torch.gather(X, 1, i) * 2, torch.tensor([[1, 10]]), RuntimeError),
    "gather-negative": (lambda i: torch.gather(X, 1, i) * 2, torch.tensor([[1, -1]]), RuntimeError),
    "int32-index": (lambda i: X[:, i] * 2, torch.tensor([3, 12], dtype=torch.int32), IndexError),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_index_raises_eagers_kind_of_error(name):
    fn, bad, kind = BAD[name]
    good = torch.zeros_like(bad)
    cf = minicomp.compile(fn)
    torch.testing.assert_close(cf(good), fn(good))          # compiled for this signature
    with pytest.raises(kind):
        fn(bad)                                             # eager's kind
    with pytest.raises(kind) as err:
        cf(bad)
    assert isinstance(err.value, OutOfBoundsError) and isinstance(err.value, MinicompError)
    message = str(err.value)
    assert "out of bounds for dimension" in message and ("(index)" in message or "(gather)" in message), message
    assert "test_indirect_loads.py" in message, message     # the user's line


def test_what_the_kernel_does_not_read_is_not_checked():
    # the last column holds a sentinel past the table: eager never reads it, nor does the kernel
    def f(w, ids):
        return F.embedding(ids[:, :-1], w) * 2
    w = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 99], [3, 4, 99]])
    got, want, c = compiled(f, w, ids)
    torch.testing.assert_close(got, want)
    assert "_rt.check_index(ids[:, 0:2:1], 0, 9," in c.generated.source, c.generated.source


def test_one_index_tensor_read_by_two_kernels_is_checked_once_per_call():
    # the GEMM folds one gather into its loads, the row kernel gathers from another table
    # through the same ids: two kernels, one check (index_check.lines), and a bad index still raises
    def f(w1, w2, ids, lw):
        return F.embedding(ids, w1) @ lw, F.embedding(ids, w2).softmax(-1)
    w1, w2, lw = torch.randn(30, 16), torch.randn(30, 8), torch.randn(16, 5)
    ids = torch.randint(0, 30, (4, 3))
    (got, want, c) = compiled(f, w1, w2, ids, lw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol(torch.float32))
    assert len(gather_groups(c)) == 2, str(c.plan)
    assert c.generated.source.count("_rt.check_index(ids, 0, 29,") == 1, c.generated.source
    cf = minicomp.compile(f)
    cf(w1, w2, ids, lw)
    with pytest.raises(IndexError, match="size 30"):
        cf(w1, w2, torch.tensor([[0, 30, 1]]), lw)


def test_a_bad_index_in_a_gemm_prologue_and_a_row_kernel():
    emb, wl = torch.randn(12, 8), torch.randn(8, 8)
    cf = minicomp.compile(lambda ids: F.embedding(ids, emb) @ wl)
    cf(torch.tensor([[0, 1]]))
    assert cf.compile_for(torch.tensor([[0, 1]])).plan.kinds() == ["gemm"]
    with pytest.raises(IndexError, match="size 12"):
        cf(torch.tensor([[0, 12]]))
    cr = minicomp.compile(lambda x, i: torch.gather(x, 1, i).softmax(-1))
    x = torch.randn(3, 7)
    cr(x, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 1 with size 7"):
        cr(x, torch.full((3, 2), 7))


def test_zero_size_index_tensors():
    for fn, i in [(lambda w, i: F.embedding(i, w) * 2, torch.zeros(0, 3, dtype=torch.long)),
                  (lambda w, i: w[i] + 1, torch.zeros(0, dtype=torch.int32)),
                  (lambda w, i: torch.gather(w, 1, i) * 2, torch.zeros(10, 0, dtype=torch.long))]:
        w = torch.randn(10, 4)
        got, want, _ = compiled(fn, w, i)
        assert got.shape == want.shape and got.numel() == 0


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("fn", [lambda x: x[x > 0] * 2, lambda x: x[:, x[0] > 0], lambda x: torch.nonzero(x)],
                         ids=["x[mask]", "x[:, mask]", "nonzero"])
def test_data_dependent_shapes_are_refused_clearly(fn):
    x = torch.randn(4, 5)
    with pytest.raises(MinicompError, match="output shape that depends on the values of its inputs") as err:
        minicomp.compile(fn)(x)
    assert "test_indirect_loads.py" in str(err.value)


def test_a_zero_dimensional_index_tensor_goes_through_dynamo():
    # PyTorch turns x[t] for a 0-d integer t into a select at t's value: a value read in Python,
    # which minicomp's own capture refuses; minicomp.compile then runs the function through
    # Dynamo (issue 19, item 2), visibly, with eager's answer for each value of t
    x = torch.randn(5, 3)
    f = minicomp.compile(lambda x, t: x[t] * 2)
    with pytest.warns(UserWarning, match="through Dynamo"):
        out = f(x, torch.tensor(2))
    torch.testing.assert_close(out, x[2] * 2)
    torch.testing.assert_close(f(x, torch.tensor(4)), x[4] * 2)
    assert f.refused


# --------------------------------------------------------------------------- static ranges


def test_static_ranges_and_memory_sources():
    from minicomp.ir.ranges import memory_sources, value_range
    g = Graph("r")
    ids = g.add_input("ids", (4,), torch.int32)
    ar = g.add("arange", start=3, end=11, step=2, dtype=torch.int64)               # 3, 5, 7, 9
    wide = g.add("cast", ids, dtype=torch.int64)
    clamped = g.add("clamp", wide, min=0, max=6)
    summed = g.add("add", ar, clamped)
    part = g.add("slice", wide, dim=0, start=1, end=3, step=1)
    view = g.add("reshape", part, shape=(2, 1))
    assert value_range(g, ar) == (3, 9)
    assert value_range(g, clamped) == (0, 6) and value_range(g, summed) == (3, 15)
    assert value_range(g, ids) is None and value_range(g, wide) is None
    assert memory_sources(g, view, {wide, part, view}) == [(ids, [wide, part, view])]
    assert memory_sources(g, view, {part, view}) == [(wide, [part, view])]      # wide read from memory
    assert memory_sources(g, summed, {summed, clamped, wide, ar}) is None


def test_a_clamped_index_needs_no_check_and_fuses():
    def f(w, ids):
        return F.embedding(ids.clamp(0, 9), w) + 1
    w, ids = torch.randn(10, 4), torch.randint(-50, 50, (3, 6))
    got, want, c = compiled(f, w, ids)
    torch.testing.assert_close(got, want)
    assert c.plan.kinds() == ["pointwise"] and "check_index" not in c.generated.source, str(c.plan)


# --------------------------------------------------------------------------- cross entropy

CE = {
    "mean": dict(),
    "ignore": dict(ignore_index=3),
    "sum_ignore": dict(reduction="sum", ignore_index=3),
    "none": dict(reduction="none"),
    "smoothing_free_weighted": dict(weight="w"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(CE))
def test_cross_entropy_as_language_models_call_it(case, dtype):
    """`F.cross_entropy(logits.view(-1, V), labels.view(-1))`: the picked log-probability is
    gathered from the logits themselves (simplify's gather_of_row_shift), so no [N, V]
    log-softmax is written; ignore_index and class weights as eager has them."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 13, generator=gen).to(dtype)
    labels = torch.randint(0, 13, (2, 5), generator=gen)
    labels[0, 1] = 3
    kw = dict(CE[case])
    weight = torch.rand(13, generator=gen).to(dtype) + 0.5
    if kw.get("weight") == "w":
        kw["weight"] = weight

    def loss(x, y):
        return F.cross_entropy(x.view(-1, x.shape[-1]), y.view(-1), **kw)
    f = minicomp.compile(loss)
    torch.testing.assert_close(f(logits, labels), loss(logits, labels), **tol(dtype))
    c = f.compile_for(logits, labels)
    assert not c.generated.fallbacks, c.generated.fallbacks
    run = c.generated.source[c.generated.source.index("def run("):]
    assert "(10, 13)" not in run, "a [N, V] buffer is written"


def test_a_class_out_of_range_raises_eagers_kind_of_error():
    f = minicomp.compile(lambda x, y: F.cross_entropy(x, y))
    x = torch.randn(4, 6)
    f(x, torch.tensor([0, 5, 2, 1]))
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 6"):
        f(x, torch.tensor([0, 6, 2, 1]))
    with pytest.raises(IndexError):
        F.cross_entropy(x, torch.tensor([0, 6, 2, 1]))
    ignored = torch.tensor([0, -100, 2, 1])                 # the default ignore_index passes
    torch.testing.assert_close(f(x, ignored), F.cross_entropy(x, ignored))

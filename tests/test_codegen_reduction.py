"""Reduction kernels under Triton's interpreter: single-pass and looped forms, any axis, several outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

import minicomp
from minicomp import runtime
from minicomp.codegen import generate
from minicomp.errors import MinicompError
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import run
from minicomp.plan import Group, Plan
from minicomp.runtime.cache import ModuleCache
from minicomp.target import RowForm

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ModuleCache(tmp_path_factory.mktemp("mc-cache"))


def one_group(g: Graph, name: str = "") -> Plan:
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    leaves = [n.id for n in g.nodes() if n.kind in ("input", "constant") and g.users(n.id)]
    return Plan(g.name, [Group(0, "reduction", nodes=nodes, inputs=leaves, outputs=list(dict.fromkeys(g.outputs)),
                               name=name)]).with_specs(g)


def rand(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def check(g, inputs, expected, cache, name="", dtype=None, form=None):
    gen = generate(g, one_group(g, name), form.target if form else "cpu")
    assert not gen.fallbacks, gen.fallbacks
    out = runtime.load(gen, "cpu", cache=cache)(*inputs)
    ref = run(g, inputs)
    for o, r, e in zip(out, ref, expected, strict=True):
        assert o.shape == e.shape and o.dtype == e.dtype
        t = tol(dtype or o.dtype)
        torch.testing.assert_close(o, r, **t)
        torch.testing.assert_close(o, e, **t)
    return gen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 37), (2, 3, 40)])
def test_softmax(shape, dtype, form, cache):
    g = Graph("softmax")
    x = g.add_input("x", shape, dtype)
    g.set_outputs([C.softmax(g, x, -1)])
    a = rand(shape, dtype) * 3
    gen = check(g, [a], [torch.softmax(a, -1)], cache, "softmax", form=form)
    assert gen.kernel_names == ["mc_red_softmax_0"]
    assert ("for c0 in range(0, n_cols, BLOCK_C):" in gen.source) == (form.name == "looped")
    assert ("online softmax" in gen.source) == (form.name == "looped")      # max and sum share one loop


def test_softmax_with_masked_entries(form, cache):
    """Rows holding -inf (a causal mask) stay finite; the online form never computes -inf - -inf."""
    g = Graph("masked_softmax")
    x = g.add_input("x", (2, 37, 37), torch.float32)
    keep = g.add("tril", g.add("full", shape=(37, 37), value=True, dtype=torch.bool), diagonal=0)
    g.set_outputs([C.softmax(g, g.add("where", keep, x, g.constant(float("-inf"))), -1)])
    a = rand((2, 37, 37), torch.float32)
    mask = torch.ones(37, 37, dtype=torch.bool).tril()
    check(g, [a], [torch.softmax(a.masked_fill(~mask, float("-inf")), -1)], cache, form=form)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_large_values(dtype, form, cache):
    g = Graph("log_softmax")
    x = g.add_input("x", (3, 33), dtype)
    g.set_outputs([C.log_softmax(g, x, -1)])
    a = rand((3, 33), dtype) * 40 + 1000          # max-subtracted: exp never overflows
    check(g, [a], [torch.log_softmax(a.float(), -1).to(dtype)], cache, form=form)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm(dtype, form, cache):
    g = Graph("rmsnorm")
    x = g.add_input("x", (6, 45), dtype)
    w = g.add_input("w", (45,), dtype)
    g.set_outputs([C.rms_norm(g, x, 1, w, 1e-6)])
    a, b = rand((6, 45), dtype), rand((45,), dtype, 1)
    check(g, [a, b], [F.rms_norm(a, (45,), b, 1e-6)], cache, "rmsnorm", form=form)


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_layernorm_with_stats(dtype, form, cache):
    """Prologue (residual add), epilogue (affine, cast), and outputs of both shapes."""
    g = Graph("add_layernorm")
    x = g.add_input("x", (4, 3, 50), dtype)
    r = g.add_input("r", (4, 3, 50), dtype)
    w = g.add_input("w", (50,), dtype)
    b = g.add_input("b", (50,), dtype)
    h = g.add("add", x, r)
    y = C.layer_norm(g, h, 1, w, b, 1e-5)
    mean = C.reduce(g, "mean", g.add("cast", h, dtype=torch.float32), -1, keepdim=True)
    top = C.reduce(g, "amax", h, -1, keepdim=False)
    g.set_outputs([y, h, mean, top])
    xs = [rand((4, 3, 50), dtype, i) for i in range(2)] + [rand((50,), dtype, i) for i in (2, 3)]
    hh = xs[0] + xs[1]
    expected = [F.layer_norm(hh, (50,), xs[2], xs[3], 1e-5), hh, hh.float().mean(-1, keepdim=True), hh.amax(-1)]
    check(g, xs, expected, cache, "add_layernorm", form=form)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("shape,axes", [((37, 5), (0,)), ((2, 9, 3), (1,)), ((4, 6, 5), (0, 2)),
                                        ((3, 5), (0, 1)), ((7,), (0,))])
def test_any_axis(op, shape, axes, form, cache):
    g = Graph(f"{op}_axes")
    x = g.add_input("x", shape, torch.float32)
    k = C.reduce(g, op, x, axes, keepdim=True)
    n = C.reduce(g, op, g.add("mul", x, g.constant(2.0)), axes, keepdim=False)
    g.set_outputs([g.add("sub", x, k), n])
    a = rand(shape, torch.float32)
    f = getattr(torch, op)
    gen = check(g, [a], [a - f(a, dim=axes, keepdim=True), f(a * 2, dim=axes)], cache, form=form)
    assert ("(rows are contiguous)" in gen.source) == (axes == (0,) and len(shape) == 2)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_var(correction, dtype, form, cache):
    g = Graph("var")
    x = g.add_input("x", (5, 41), dtype)
    v = g.add("var", g.add("cast", x, dtype=torch.float32), axes=(1,), keepdim=False, correction=correction)
    g.set_outputs([v])
    a = rand((5, 41), dtype) + 100          # large mean: the two-step form stays accurate
    check(g, [a], [torch.var(a.float(), dim=1, correction=correction)], cache, dtype=dtype, form=form)


def test_int_and_bool_reductions(form, cache):
    g = Graph("counts")
    x = g.add_input("x", (4, 19), torch.int32)
    pos = g.add("gt", x, g.constant(0))
    g.set_outputs([C.reduce(g, "sum", pos, 1), C.reduce(g, "amax", x, 1), C.reduce(g, "sum", x, 1)])
    a = torch.randint(-50, 50, (4, 19), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    check(g, [a], [(a > 0).sum(1), a.amax(1), a.sum(1)], cache, form=form)


def test_full_reduction_to_scalar(form, cache):
    g = Graph("total")
    x = g.add_input("x", (3, 50), torch.float16)
    s = C.reduce(g, "sum", g.add("cast", x, dtype=torch.float32), (0, 1))
    g.set_outputs([s, g.add("div", g.add("cast", x, dtype=torch.float32), s)])
    a = rand((3, 50), torch.float16).abs() + 0.1
    t = a.float().sum()
    check(g, [a], [t, a.float() / t], cache, form=form)


def test_noncontiguous_input(form, cache):
    g = Graph("softmax_t")
    x = g.add_input("x", (6, 21), torch.float32)
    g.set_outputs([C.softmax(g, x, -1)])
    a = rand((21, 6), torch.float32).t()
    g2 = runtime.with_input_layouts(g, runtime.Signature.of([a]))
    check(g2, [a], [torch.softmax(a, -1)], cache, form=form)
    check(g, [a], [torch.softmax(a, -1)], cache, form=form)


def test_softmax_through_a_transpose(form, cache):
    """Softmax over axis 0 written as permute -> softmax(-1) -> permute: a strided row kernel."""
    g = Graph("softmax_axis0")
    x = g.add_input("x", (23, 4), torch.float32)
    s = C.softmax(g, g.add("permute", x, dims=(1, 0)), -1)
    g.set_outputs([g.add("permute", s, dims=(1, 0))])
    a = rand((23, 4), torch.float32)
    check(g, [a], [torch.softmax(a, 0)], cache, form=form)


@pytest.mark.parametrize("cols", [8, 37])
def test_the_row_form_option_picks_single_or_looped(cols):
    """`minicomp.compile(fn, row_form=...)` reaches codegen: rows longer than single_pass_max
    loop over column blocks of cpu_loop_block; both forms give eager's answer."""
    x = torch.randn(cols, 3).t()                                # non-contiguous rows
    fn = lambda x: torch.softmax(x * 2, -1)                     # noqa: E731
    f = minicomp.compile(fn, row_form=RowForm(single_pass_max=16, cpu_loop_block=4))
    torch.testing.assert_close(f(x), fn(x), **tol(x.dtype))
    assert ("for c0 in range(0, n_cols, BLOCK_C):" in f.source) == (cols > 16)
    (kernel,) = f._need().generated.kernels
    assert dict(kernel.launches[0].kwargs)["BLOCK_C"] == (4 if cols > 16 else cols)


@pytest.mark.parametrize("bad", [RowForm, {"single_pass_max": 0}])
def test_a_bad_row_form_is_a_clear_error(bad):
    with pytest.raises(MinicompError, match="single_pass_max|RowForm"):
        f = minicomp.compile(lambda x: x.sum(1), row_form=bad(single_pass_max=-1) if bad is RowForm else bad)
        f(torch.randn(2, 3))


def test_reduction_read_across_rows_falls_back(cache):
    """A reduced value read through a view that mixes rows is not a row kernel: PyTorch runs it."""
    g = Graph("mixed_rows")
    x = g.add_input("x", (4, 4), torch.float32)
    s = C.reduce(g, "sum", x, 1, keepdim=True)                          # [4, 1]
    st = g.add("reshape", g.add("permute", s, dims=(1, 0)), shape=(4, 1))  # rows reversed? no: same, but via views
    flip = g.add("expand", g.add("slice", s, dim=0, start=0, end=1, step=1), shape=(4, 4))
    g.set_outputs([g.add("add", x, flip), st])
    plan = one_group(g)
    a = rand((4, 4), torch.float32)
    gen = generate(g, plan, "cpu")
    out = runtime.load(gen, "cpu", cache=cache)(a)
    assert "another row" in gen.fallbacks.get(0, "")
    torch.testing.assert_close(out[0], a + a[:1].sum(1, keepdim=True))


def test_cuda_source_configs():
    g = Graph("softmax")
    x = g.add_input("x", (64, 30000), torch.bfloat16)
    g.set_outputs([C.softmax(g, x, -1)])
    src = generate(g, one_group(g, "softmax"), "cuda").source
    assert "@triton.autotune(" in src and "key=['n_rows', 'n_cols']" in src
    assert "for c0 in range(0, n_cols, BLOCK_C):" in src        # 30000 > RowForm().single_pass_max: looped
    compile(src, "<generated>", "exec")


# ----------------------------------------------------------------------------- GPU (the same kernels, autotuned)

def _gpu_check(g, inputs, expected, name=""):
    gen = generate(g, one_group(g, name), "cuda")
    assert not gen.fallbacks, gen.fallbacks
    out = runtime.load(gen, "cuda")(*[t.cuda() for t in inputs])
    for o, e in zip(out, expected, strict=True):
        torch.testing.assert_close(o, e.cuda(), **tol(o.dtype))
    return gen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (257, 1000), (64, 30000)])
def test_gpu_softmax(shape, dtype):
    g = Graph("softmax")
    x = g.add_input("x", shape, dtype)
    g.set_outputs([C.softmax(g, x, -1)])
    a = rand(shape, dtype) * 3
    gen = _gpu_check(g, [a], [torch.softmax(a, -1)], "softmax")
    assert ("online softmax" in gen.source) == (shape[1] > RowForm().single_pass_max)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(512, 768), (8, 20000)])
def test_gpu_norms(shape, dtype):
    n = shape[-1]
    g = Graph("add_layernorm")
    x, r = g.add_input("x", shape, dtype), g.add_input("r", shape, dtype)
    w, b = g.add_input("w", (n,), dtype), g.add_input("b", (n,), dtype)
    h = g.add("add", x, r)
    g.set_outputs([C.layer_norm(g, h, 1, w, b, 1e-5), h, C.rms_norm(g, h, 1, w, 1e-6)])
    xs = [rand(shape, dtype, 0), rand(shape, dtype, 1), rand((n,), dtype, 2), rand((n,), dtype, 3)]
    hh = xs[0] + xs[1]
    _gpu_check(g, xs, [F.layer_norm(hh, (n,), xs[2], xs[3], 1e-5), hh, F.rms_norm(hh, (n,), xs[2], 1e-6)])


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "var"])
@pytest.mark.parametrize("shape,axes", [((4096, 33), (0,)), ((16, 300, 24), (1,)), ((1000, 1000), (0, 1))])
def test_gpu_any_axis(op, shape, axes):
    g = Graph(f"gpu_{op}")
    x = g.add_input("x", shape, torch.float32)
    extra = {"correction": 1} if op == "var" else {}
    g.set_outputs([C.reduce(g, op, x, axes, keepdim=True, **extra)])
    a = rand(shape, torch.float32)
    ref = torch.var(a, dim=axes, keepdim=True) if op == "var" else getattr(torch, op)(a, dim=axes, keepdim=True)
    _gpu_check(g, [a], [ref])


@pytest.mark.gpu
def test_gpu_masked_softmax():
    g = Graph("masked_softmax")
    x = g.add_input("x", (4, 128, 128), torch.bfloat16)
    keep = g.add("tril", g.add("full", shape=(128, 128), value=True, dtype=torch.bool), diagonal=0)
    g.set_outputs([C.softmax(g, g.add("where", keep, x, g.constant(float("-inf"))), -1)])
    a = rand((4, 128, 128), torch.bfloat16)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    _gpu_check(g, [a], [torch.softmax(a.masked_fill(~mask, float("-inf")), -1)])


# --------------------------------------------------------------------------- outputs viewed after the row kernel

VIEWED = {
    "softmax_view": (lambda x: x.softmax(-1).view(2, 3, 9), (6, 9)),
    "centred_flat": (lambda x: (x - x.mean(-1, keepdim=True)).reshape(-1), (5, 7)),
    "softmax_t": (lambda x: x.softmax(-1).transpose(0, 1), (4, 11)),
    "logits_flat": (lambda x: torch.log_softmax(x, -1).view(-1, x.shape[-1]), (2, 3, 13)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(VIEWED))
def test_a_row_kernel_stores_a_view_of_its_result_itself(case, dtype):
    """`softmax(x).view(...)` and the like: the view's elements are stored at its own index
    by the row kernel (codegen/row_kernel.py), not copied by a second kernel."""
    fn, shape = VIEWED[case]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(x), fn(x), **tol(dtype))
    assert f.compile_for(x).plan.kinds() == ["reduction"], str(f.compile_for(x).plan)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape,groups,affine", [((2, 16, 5, 5), 4, True), ((3, 6, 7), 3, False),
                                                  ((2, 8), 2, True), ((1, 12, 2, 3, 2), 6, True)])
def test_group_norm_is_one_row_kernel(shape, groups, affine, dtype):
    torch.manual_seed(0)
    gn = torch.nn.GroupNorm(groups, shape[1], affine=affine).to(dtype).eval()
    if affine:
        with torch.no_grad():
            gn.weight.normal_()
            gn.bias.normal_()
    x = torch.randn(*shape).to(dtype)
    f = minicomp.compile(gn)
    with torch.no_grad():
        torch.testing.assert_close(f(x), gn(x), **tol(dtype))
    c = f.compile_for(x)
    assert c.plan.kinds() == ["reduction"] and not c.generated.fallbacks, str(c.plan)


def test_group_norm_then_silu_is_one_row_kernel():
    """A diffusion UNet's norm and activation: the view back to [N, C, H, W] sinks below the
    SiLU (simplify's reshape_sink), which then joins the row kernel."""
    torch.manual_seed(0)
    gn = torch.nn.GroupNorm(4, 16).eval()
    fn = lambda x: F.silu(gn(x))      # noqa: E731
    x = torch.randn(2, 16, 5, 3)
    f = minicomp.compile(fn)
    with torch.no_grad():
        torch.testing.assert_close(f(x), fn(x), **tol(torch.float32))
    assert f.compile_for(x).plan.kinds() == ["reduction"]

"""Pointwise kernels under Triton's interpreter, against the reference interpreter and eager PyTorch.

Groups are made by hand (one group holding every computed node), so these tests do not
depend on the fusion planner.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

from minicomp import runtime
from minicomp.codegen import generate
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import run
from minicomp.plan import Group, Plan
from minicomp.runtime.cache import ModuleCache

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ModuleCache(tmp_path_factory.mktemp("mc-cache"))


def one_group(g: Graph, kind: str = "pointwise", name: str = "") -> Plan:
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    leaves = [n.id for n in g.nodes() if n.kind in ("input", "constant") and g.users(n.id)]
    return Plan(g.name, [Group(0, kind, nodes=nodes, inputs=leaves, outputs=list(dict.fromkeys(g.outputs)),
                               name=name)]).with_specs(g)


def compile_run(g: Graph, inputs, cache, plan: Plan | None = None):
    gen = generate(g, plan or one_group(g), "cpu")
    return runtime.load(gen, "cpu", cache=cache)(*inputs), gen


def rand(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def check(g, inputs, expected, cache, dtype=None):
    out, gen = compile_run(g, inputs, cache)
    ref = run(g, inputs)
    assert len(out) == len(expected) == len(ref)
    for o, r, e in zip(out, ref, expected):
        assert o.shape == e.shape and o.dtype == e.dtype
        torch.testing.assert_close(o, r, **tol(dtype or o.dtype))
        torch.testing.assert_close(o, e, **tol(dtype or o.dtype))
    return gen


# ----------------------------------------------------------------------------- shapes and dtypes

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs,ws", [((), ()), ((1,), (1,)), ((7,), (7,)), ((5, 37), (37,)),
                                   ((2, 3, 17), (3, 1)), ((3, 1), (1, 5)), ((37,), (4, 37))])
def test_add_gelu_broadcast(xs, ws, dtype, cache):
    g = Graph("add_gelu")
    x = g.add_input("x", xs, dtype)
    w = g.add_input("w", ws, dtype)
    y = g.add("gelu", g.add("add", x, w), approximate="none")
    g.set_outputs([y])
    a, b = rand(xs, dtype, 1), rand(ws, dtype, 2)
    gen = check(g, [a, b], [F.gelu(a + b)], cache)
    assert gen.kernel_names == ["mc_pw_add_gelu_0"]


def test_fast_path_is_plain_offsets(cache):
    g = Graph("fast")
    x = g.add_input("x", (4, 33), torch.float32)
    y = g.add_input("y", (4, 33), torch.float32)
    g.set_outputs([g.add("mul", g.add("exp", x), y)])
    gen = generate(g, one_group(g), "cpu")
    assert "x_ptr + offs, mask=mask" in gen.source and "y_ptr + offs, mask=mask" in gen.source
    assert "//" not in gen.source.split("def call")[0]   # no index arithmetic in the kernel


@pytest.mark.parametrize("dtype", DTYPES)
def test_unary_ops(dtype, cache):
    g = Graph("unary")
    x = g.add_input("x", (3, 29), dtype)
    pos = g.add("add", g.add("abs", x), g.constant(0.5))
    outs = [g.add(op, x) for op in ("neg", "exp", "sin", "cos", "erf", "tanh", "sigmoid", "relu", "silu")]
    outs += [g.add(op, pos) for op in ("log", "sqrt", "rsqrt")]
    outs += [g.add("gelu", x, approximate="tanh"), g.add("clamp", x, min=-0.5, max=None),
             g.add("clamp", x, min=-0.25, max=0.75)]
    outs += [g.add("pow", x, exponent=e) for e in (2.0, 3.0, -1.0)] + [g.add("pow", pos, exponent=e) for e in (0.5, 2.5)]
    g.set_outputs(outs)
    a = rand((3, 29), dtype)
    p = a.abs() + 0.5
    expected = [-a, a.exp(), a.sin(), a.cos(), a.erf(), a.tanh(), a.sigmoid(), a.relu(), F.silu(a),
                p.log(), p.sqrt(), p.rsqrt(), F.gelu(a, approximate="tanh"), a.clamp(min=-0.5),
                a.clamp(-0.25, 0.75), a ** 2, a ** 3, a ** -1.0, p ** 0.5, p ** 2.5]
    check(g, [a], expected, cache, dtype)


def test_casts_where_compare_bool_outputs(cache):
    g = Graph("mixed")
    x = g.add_input("x", (6, 11), torch.bfloat16)
    i = g.add_input("i", (11,), torch.int64)
    big = g.add("gt", x, g.constant(0.25))                      # bool
    xi = g.add("cast", x, dtype=torch.int32)                   # truncation toward zero
    q = g.add("div", i, g.constant(3))                         # int / int -> f32
    w = g.add("where", big, g.add("cast", x, dtype=torch.float32), q)
    nb = g.add("logical_and", g.add("logical_not", big), g.add("ne", i, g.constant(0)))
    g.set_outputs([big, xi, w, nb, g.add("cast", w, dtype=torch.float16)])
    a = rand((6, 11), torch.bfloat16) * 4
    b = torch.arange(-5, 6)
    wq = torch.where(a > 0.25, a.float(), b / 3)
    expected = [a > 0.25, a.to(torch.int32), wq, (~(a > 0.25)) & (b != 0), wq.half()]
    out, _ = compile_run(g, [a, b], cache)
    for o, e in zip(out, expected):
        assert o.dtype == e.dtype
        torch.testing.assert_close(o, e, **tol(e.dtype))


def test_generated_masks_and_ranges(cache):
    """tril/triu/full/arange come from indices, with no tensor behind them."""
    g = Graph("causal")
    x = g.add_input("x", (2, 9, 9), torch.float32)
    keep = g.add("tril", g.add("full", shape=(9, 9), value=True, dtype=torch.bool), diagonal=0)
    upper = g.add("triu", x, diagonal=1)
    pos = g.add("arange", start=0, end=9, step=1, dtype=torch.int64)
    posf = g.add("arange", start=0.5, end=5.0, step=0.5, dtype=torch.float32)
    masked = g.add("where", keep, x, g.constant(float("-inf")))
    g.set_outputs([masked, upper, g.add("add", x, pos), g.add("mul", x, posf)])
    a = rand((2, 9, 9), torch.float32)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    expected = [a.masked_fill(~mask, float("-inf")), a.triu(1), a + torch.arange(9),
                a * torch.arange(0.5, 5.0, 0.5)]
    gen = check(g, [a], expected, cache)
    assert "CONSTANTS[0]" not in gen.source


def test_only_generated_output(cache):
    g = Graph("fill")
    g.set_outputs([g.add("full", shape=(3, 5), value=2.5, dtype=torch.float16)])
    out, _ = compile_run(g, [], cache)
    torch.testing.assert_close(out[0], torch.full((3, 5), 2.5, dtype=torch.float16))


# ----------------------------------------------------------------------------- views

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_views_permute_reshape_expand_slice(dtype, cache):
    g = Graph("views")
    x = g.add_input("x", (4, 6, 5), dtype)
    b = g.add_input("b", (5, 1), dtype)
    t = g.add("permute", x, dims=(2, 0, 1))                         # [5, 4, 6]
    r = g.add("reshape", t, shape=(5, 24))
    e = g.add("expand", b, shape=(5, 24))
    s = g.add("slice", r, dim=1, start=-20, end=None, step=3)       # [5, 7]
    y = g.add("add", r, e)
    g.set_outputs([y, g.add("mul", s, g.constant(2.0))])
    a, bb = rand((4, 6, 5), dtype), rand((5, 1), dtype, 3)
    rr = a.permute(2, 0, 1).reshape(5, 24)
    check(g, [a, bb], [rr + bb, rr[:, -20::3] * 2.0], cache)


def test_cat_of_computed_pieces(cache):
    g = Graph("cat")
    x = g.add_input("x", (3, 4), torch.float32)
    y = g.add_input("y", (3, 2), torch.float32)
    c = g.add("cat", g.add("exp", x), g.add("neg", y), g.add("permute", g.add("slice", x, dim=0, start=0, end=3, step=1),
                                                                 dims=(0, 1)), dim=1)
    g.set_outputs([g.add("add", c, g.constant(1.0))])
    a, b = rand((3, 4), torch.float32), rand((3, 2), torch.float32, 5)
    check(g, [a, b], [torch.cat([a.exp(), -b, a], 1) + 1.0], cache)


def test_rotate_half_cat_of_slices(cache):
    """The RoPE idiom: cat(-x[..., h:], x[..., :h]) then a fused multiply-add."""
    g = Graph("rope")
    x = g.add_input("x", (2, 5, 8), torch.float16)
    cos = g.add_input("cos", (5, 8), torch.float16)
    lo = g.add("slice", x, dim=2, start=0, end=4, step=1)
    hi = g.add("slice", x, dim=2, start=4, end=8, step=1)
    rot = g.add("cat", g.add("neg", hi), lo, dim=-1)
    g.set_outputs([g.add("add", g.add("mul", x, cos), rot)])
    a, c = rand((2, 5, 8), torch.float16), rand((5, 8), torch.float16, 1)
    check(g, [a, c], [a * c + torch.cat([-a[..., 4:], a[..., :4]], -1)], cache)


# ----------------------------------------------------------------------------- layouts

def test_noncontiguous_inputs_are_copied_into_layout(cache):
    g = Graph("nc")
    x = g.add_input("x", (5, 7), torch.float32)
    y = g.add_input("y", (5, 7), torch.float32)
    g.set_outputs([g.add("sub", x, y)])
    base = rand((7, 5), torch.float32)
    wide = rand((5, 14), torch.float32, 2)
    a, b = base.t(), wide[:, ::2]
    out, _ = compile_run(g, [a, b], cache)
    torch.testing.assert_close(out[0], a - b)


def test_input_layouts_read_in_place(cache):
    """With the signature's strides on the input nodes, the kernel reads strided memory directly."""
    g = Graph("strided")
    x = g.add_input("x", (5, 7), torch.float32)
    g.set_outputs([g.add("mul", x, g.constant(3.0))])
    a = rand((7, 5), torch.float32).t()
    g2 = runtime.with_input_layouts(g, runtime.Signature.of([a]))
    out, gen = compile_run(g2, [a], cache)
    assert "x_ptr + offs" not in gen.source        # strided index, not the flat fast path
    torch.testing.assert_close(out[0], a * 3.0)


def test_output_layout_from_node(cache):
    g = Graph("outlayout")
    x = g.add_input("x", (4, 6), torch.float32)
    y = g.add("exp", x)
    g.node(y).layout = (1, 4)                       # column-major output
    g.set_outputs([y])
    a = rand((4, 6), torch.float32)
    out, _ = compile_run(g, [a], cache)
    assert out[0].stride() == (1, 4)
    torch.testing.assert_close(out[0], a.exp())


# ----------------------------------------------------------------------------- fallback and source

def test_gemm_and_opaque_fall_back_to_pytorch(cache):
    g = Graph("mlp")
    x = g.add_input("x", (3, 8), torch.float32)
    w = g.constant(rand((8, 5), torch.float32, 4))
    mm = g.add("matmul", x, w)
    odd = g.add("opaque", mm, fn=lambda t: torch.cumsum(t, dim=1), target="torch.cumsum",
                out_shape=(3, 5), out_dtype=torch.float32)
    y = g.add("relu", g.add("add", odd, g.constant(0.5)))
    g.set_outputs([y])
    ga = Group(0, "gemm", nodes=[mm], inputs=[x, w], outputs=[mm], anchor=mm)
    go = Group(1, "opaque", nodes=[odd], inputs=[mm], outputs=[odd])
    gp = Group(2, "pointwise", nodes=[n for n in g.topo_order() if g.node(n).op in ("add", "relu")],
               inputs=[odd], outputs=[y])
    plan = Plan("mlp", [ga, go, gp]).with_specs(g)
    a = rand((3, 8), torch.float32)
    out, gen = compile_run(g, [a], cache, plan)
    torch.testing.assert_close(out[0], torch.relu(torch.cumsum(a @ g.node(w).attrs["value"], 1) + 0.5))
    assert gen.fallbacks[go.id] == "opaque op"
    assert ga.id in gen.fallbacks or "mc_gemm" in gen.source
    assert "OPAQUE[0](buf" in gen.source and "# runs through PyTorch: opaque op" in gen.source
    assert gp.id not in gen.fallbacks and gen.kernel_names[-1].startswith("mc_pw_")


def test_unsupported_group_falls_back(cache):
    """A pointwise group whose outputs differ in shape cannot be one kernel: it runs through PyTorch."""
    g = Graph("two_shapes")
    x = g.add_input("x", (3, 4), torch.float32)
    a = g.add("exp", x)
    b = g.add("reshape", a, shape=(12,))
    g.set_outputs([a, b])
    plan = one_group(g)
    a_in = rand((3, 4), torch.float32)
    out, gen = compile_run(g, [a_in], cache, plan)
    assert "different shapes" in gen.fallbacks[0]
    torch.testing.assert_close(out[1], a_in.exp().reshape(12))


def test_cuda_source_is_autotuned():
    g = Graph("tune")
    x = g.add_input("x", (64, 1000), torch.bfloat16)
    g.set_outputs([g.add("silu", x)])
    src = generate(g, one_group(g), "cuda").source
    assert "@triton.autotune(" in src and "key=['n_elements']" in src
    assert "lambda meta: (triton.cdiv(64000, meta['BLOCK']),)" in src
    # configs are timed by the runtime's short do_bench, bound before the kernel that names it
    assert src.index("_tune_bench = ") < src.index("do_bench=_tune_bench") < src.index("@triton.jit")
    compile(src, "<generated>", "exec")


def test_source_reads_on_its_own():
    g = Graph("readable")
    x = g.add_input("x", (2, 3), torch.float32)
    g.set_outputs([g.add("sigmoid", x)])
    src = generate(g, one_group(g, name="act"), "cpu").source
    assert src.startswith("# minicomp: generated module for graph 'readable'")
    for piece in ("import triton.language as tl", "def mc_pw_act_0(x_ptr, buf1_ptr, n_elements, BLOCK: tl.constexpr):",
                  "def call(*inputs):", "_rt.check_input(x, 'x', (2, 3), torch.float32, DEVICE_TYPE)", 'if __name__ == "__main__":',
                  "other=0.0"):
        assert piece in src, piece


def test_wrong_inputs_raise_guard_error(cache):
    g = Graph("guarded")
    x = g.add_input("x", (2, 3), torch.float32)
    g.set_outputs([g.add("exp", x)])
    f = runtime.load(generate(g, one_group(g), "cpu"), "cpu", cache=cache)
    with pytest.raises(runtime.GuardError, match="takes 1 input"):
        f()
    with pytest.raises(runtime.GuardError, match="must be f32"):
        f(torch.zeros(2, 4))
    with pytest.raises(runtime.GuardError, match="must be a torch.Tensor"):
        f([1.0])
    assert math.isclose(f(torch.zeros(2, 3))[0].sum().item(), 6.0)


# ----------------------------------------------------------------------------- GPU (the same kernels, autotuned)

def _gpu_run(g: Graph, inputs, plan: Plan | None = None):
    gen = generate(g, plan or one_group(g), "cuda")
    assert not gen.fallbacks, gen.fallbacks
    f = runtime.load(gen, "cuda")
    return f(*[t.cuda() for t in inputs]), gen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_pointwise_broadcast_and_ops(dtype):
    g = Graph("gpu_pw")
    x = g.add_input("x", (1024, 4097), dtype)
    b = g.add_input("b", (4097,), dtype)
    s = g.add_input("s", (1024, 1), dtype)
    h = g.add("add", x, b)
    y = g.add("gelu", h, approximate="tanh")
    z = g.add("mul", g.add("silu", h), s)
    m = g.add("gt", h, g.constant(0.0))
    g.set_outputs([y, z, m, g.add("where", m, g.add("tanh", x), g.add("erf", x))])
    a, bb, ss = rand((1024, 4097), dtype), rand((4097,), dtype, 1), rand((1024, 1), dtype, 2)
    out, gen = _gpu_run(g, [a, bb, ss])
    a, bb, ss = a.cuda(), bb.cuda(), ss.cuda()
    hh = a + bb
    expected = [F.gelu(hh, approximate="tanh"), F.silu(hh) * ss, hh > 0, torch.where(hh > 0, a.tanh(), a.erf())]
    for o, e in zip(out, expected):
        torch.testing.assert_close(o, e, **tol(e.dtype))
    assert "@triton.autotune(" in gen.source


@pytest.mark.gpu
def test_gpu_views_and_layouts():
    g = Graph("gpu_rope")
    x = g.add_input("x", (4, 8, 128, 64), torch.bfloat16)
    cos = g.add_input("cos", (128, 64), torch.bfloat16)
    lo = g.add("slice", x, dim=3, start=0, end=32, step=1)
    hi = g.add("slice", x, dim=3, start=32, end=64, step=1)
    rot = g.add("cat", g.add("neg", hi), lo, dim=-1)
    y = g.add("add", g.add("mul", x, cos), rot)
    g.set_outputs([g.add("permute", y, dims=(0, 2, 1, 3))])
    a = rand((4, 128, 8, 64), torch.bfloat16).permute(0, 2, 1, 3)          # strided input, read in place
    c = rand((128, 64), torch.bfloat16, 1)
    g2 = runtime.with_input_layouts(g, runtime.Signature.of([a, c]))
    out, _ = _gpu_run(g2, [a, c])
    a, c = a.cuda(), c.cuda()
    ref = (a * c + torch.cat([-a[..., 32:], a[..., :32]], -1)).permute(0, 2, 1, 3)
    torch.testing.assert_close(out[0], ref, **tol(torch.bfloat16))


@pytest.mark.gpu
def test_gpu_scalar_and_generated():
    g = Graph("gpu_small")
    x = g.add_input("x", (), torch.float32)
    keep = g.add("tril", g.add("full", shape=(300, 300), value=True, dtype=torch.bool), diagonal=0)
    g.set_outputs([g.add("exp", x)])
    out, _ = _gpu_run(g, [torch.tensor(0.5)])
    torch.testing.assert_close(out[0], torch.tensor(0.5).exp().cuda())
    g2 = Graph("gpu_mask")
    y = g2.add_input("y", (300, 300), torch.float16)
    keep = g2.add("tril", g2.add("full", shape=(300, 300), value=True, dtype=torch.bool), diagonal=0)
    g2.set_outputs([g2.add("where", keep, y, g2.constant(float("-inf")))])
    b = rand((300, 300), torch.float16)
    out, _ = _gpu_run(g2, [b])
    torch.testing.assert_close(out[0], b.cuda().masked_fill(~torch.ones(300, 300, dtype=torch.bool, device="cuda").tril(),
                                                            float("-inf")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transpose_uses_2d_tiles(dtype, cache):
    g = Graph("transpose")
    x = g.add_input("x", (37, 70), dtype)
    y = g.add_input("y", (70, 37), dtype)
    g.set_outputs([g.add("add", g.add("permute", x, dims=(1, 0)), y)])
    a, b = rand((37, 70), dtype), rand((70, 37), dtype, 1)
    gen = check(g, [a, b], [a.t() + b], cache)
    assert "# 2-D tiles" in gen.source
    flat = Graph("no_transpose")
    x = flat.add_input("x", (37, 70), dtype)
    flat.set_outputs([flat.add("exp", x)])
    assert "# 2-D tiles" not in generate(flat, one_group(flat), "cpu").source


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs", [(19, 300), (3, 7, 257), (16, 1024)])
def test_row_broadcast_operands_use_2d_tiles(xs, dtype, cache):
    """A bias over the last dimension is loaded once per tile of rows, and the result is eager's,
    ragged tile edges included (300 and 257 columns, 19 and 21 rows)."""
    g = Graph("affine_gelu")
    x = g.add_input("x", xs, dtype)
    w = g.add_input("w", xs[-1:], dtype)
    b = g.add_input("b", xs[-1:], dtype)
    g.set_outputs([g.add("gelu", g.add("add", g.add("mul", x, w), b), approximate="tanh")])
    a, wt, bt = rand(xs, dtype), rand(xs[-1:], dtype, 1), rand(xs[-1:], dtype, 2)
    gen = check(g, [a, wt, bt], [F.gelu(a * wt + bt, approximate="tanh")], cache)
    assert "an operand broadcast over the rows is loaded once per tile" in gen.source
    assert "w_ptr + cols, mask=col_mask" in gen.source
    cuda = generate(g, one_group(g), "cuda").source
    assert "key=['n_rows', 'n_cols']" in cuda and "{'BLOCK_R': 16, 'BLOCK_C': 256}" in cuda
    # the broadcast operands are loaded before the whole-tile load (0.0720 -> 0.0687 ms on the H200)
    lines = cuda.splitlines()
    where = {name: next(i for i, line in enumerate(lines) if f"tl.load({name}_ptr" in line) for name in "xwb"}
    assert where["w"] < where["x"] and where["b"] < where["x"]


def test_short_rows_stay_flat(cache):
    """Under BCAST_MIN_COLS columns a broadcast operand does not make tiles: the flat form wins."""
    g = Graph("short")
    x = g.add_input("x", (64, 100), torch.float32)
    w = g.add_input("w", (100,), torch.float32)
    g.set_outputs([g.add("mul", x, w)])
    a, wt = rand((64, 100), torch.float32), rand((100,), torch.float32, 1)
    gen = check(g, [a, wt], [a * wt], cache)
    assert "# 2-D tiles" not in gen.source

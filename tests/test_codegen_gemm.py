"""GEMM kernels (codegen/gemm.py) against eager PyTorch.

CPU tests run the generated kernels under Triton's interpreter with tiny, odd shapes;
`gpu` tests (skipped without CUDA) check bf16/fp16 at 1024-4096 against torch.matmul.
Each graph is compiled as one hand-made gemm group, the way the planner groups it.
"""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

from minicomp.codegen import generate
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.plan import Group, Plan
from minicomp.runtime import load
from minicomp.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def our_gemm_kernels(monkeypatch):
    """These tests test minicomp's GEMM kernels: no GEMM group calls cuBLAS instead
    (codegen/library.py), through the api (the environment) or `one_group` (the Target)."""
    monkeypatch.setenv("MINICOMP_LIBRARY_GEMM", "0")


def one_group(g: Graph, device_type: str | Target = "cpu"):
    """Generate `g` as a single gemm group holding every computed node, as OUR kernel (on CUDA
    targets too: `library_gemm` off)."""
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    reads = sorted({a for nid in nodes for a in g.node(nid).args if g.node(a).kind in ("input", "constant")})
    mms = [n for n in nodes if g.node(n).op == "matmul"]
    plan = Plan(g.name, [Group(0, "gemm", nodes=nodes, inputs=reads, outputs=list(g.outputs), anchor=mms[0])])
    plan = plan.with_specs(g)
    target = Target.for_device(device_type) if isinstance(device_type, str) else device_type
    return generate(g, plan, replace(target, library_gemm=False)), plan.groups[0]


def run_gemm(g: Graph, inputs, device: str = "cpu", expect_kernel: bool = True, target=None):
    gen, group = one_group(g, target or ("cuda" if str(device).startswith("cuda") else "cpu"))
    if expect_kernel:
        assert not gen.fallbacks, gen.fallbacks
        assert any(name.startswith("mc_gemm") for name in gen.kernel_names)
    return load(gen, device)(*inputs), gen, group


def randn(*shape, dtype=torch.float32, device="cpu", scale=1.0):
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


# --------------------------------------------------------------------------- plain matmuls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_odd_sizes(dtype):
    g = Graph("mm")
    a = g.add_input("a", (33, 29), dtype)
    b = g.add_input("b", (29, 17), dtype)
    g.set_outputs([g.add("matmul", a, b)])
    x, y = randn(33, 29, dtype=dtype), randn(29, 17, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, y])
    ref = (x.float() @ y.float()).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))
    if dtype == torch.float32:
        assert 'input_precision="ieee"' in gen.source     # full-precision dot, as eager fp32
    else:
        assert ".to(tl.float32)" in gen.source            # interpreter: half operands widened


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_transposed_operands_read_in_place(which):
    """A transpose in the prologue becomes strides: no copy, no fallback."""
    g = Graph("mmT")
    a = g.add_input("a", (29, 33) if which in ("a", "both") else (33, 29), torch.float32)
    b = g.add_input("b", (17, 29) if which in ("b", "both") else (29, 17), torch.float32)
    at = C.transpose(g, a, 0, 1) if which in ("a", "both") else a
    bt = C.transpose(g, b, 0, 1) if which in ("b", "both") else b
    g.set_outputs([g.add("matmul", at, bt)])
    x = randn(*g.node(a).shape)
    y = randn(*g.node(b).shape)
    (out,), gen, _ = run_gemm(g, [x, y])
    xa = x.t() if which in ("a", "both") else x
    yb = y.t() if which in ("b", "both") else y
    torch.testing.assert_close(out, xa @ yb, **tol(torch.float32))
    assert "permute" not in gen.source and ".contiguous" not in gen.source


def test_non_contiguous_input_strides():
    """An input that arrives transposed is read through its own strides."""
    g = Graph("mm_strided")
    a = g.add_input("a", (20, 24), torch.float32)
    b = g.add_input("b", (24, 18), torch.float32)
    g.node(a).layout = (1, 20)          # column-major, as set_input_layouts records it
    g.set_outputs([g.add("matmul", a, b)])
    x = randn(24, 20).t()
    y = randn(24, 18)
    (out,), _, _ = run_gemm(g, [x, y])
    torch.testing.assert_close(out, x @ y, **tol(torch.float32))


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 19, 21), (3, 21, 23)),          # batched
    ((2, 19, 21), (21, 23)),             # broadcast B: folds into one [38, 21] GEMM
    ((19, 21), (3, 21, 23)),             # broadcast A: batch from the program id
    ((2, 1, 9, 21), (1, 3, 21, 10)),     # 4-D, broadcast on both sides
])
def test_batched_and_broadcast(a_shape, b_shape):
    g = Graph("bmm")
    a = g.add_input("a", a_shape, torch.float32)
    b = g.add_input("b", b_shape, torch.float32)
    g.set_outputs([g.add("matmul", a, b)])
    x, y = randn(*a_shape), randn(*b_shape)
    (out,), gen, _ = run_gemm(g, [x, y])
    torch.testing.assert_close(out, torch.matmul(x, y), **tol(torch.float32))
    if len(b_shape) == 2:
        assert "pid_batch" not in gen.source   # the batch folded into M


@pytest.mark.parametrize("a_shape,b_shape", [
    ((1, 16), (16, 12)), ((9, 16), (16, 1)), ((9, 1), (1, 12)), ((1, 1), (1, 1)), ((2, 3, 1, 7), (7, 1)),
])
def test_size_one_dims(a_shape, b_shape):
    """M, N or K of 1: pointer blocks keep the full tile shape; bias broadcast still applies."""
    g = Graph("ones")
    a = g.add_input("a", a_shape, torch.float32)
    b = g.add_input("b", b_shape, torch.float32)
    bias = g.add_input("bias", b_shape[-1:], torch.float32)
    mm = g.add("matmul", a, b)
    g.set_outputs([mm, g.add("add", mm, bias)])
    x, y, z = randn(*a_shape), randn(*b_shape), randn(*b_shape[-1:])
    (o1, o2), _, _ = run_gemm(g, [x, y, z])
    torch.testing.assert_close(o1, x @ y, **tol(torch.float32))
    torch.testing.assert_close(o2, x @ y + z, **tol(torch.float32))


def test_permuted_batched_operand():
    """[B, S, H, D] viewed as [B, H, S, D] and multiplied per head: strides, no copy."""
    g = Graph("heads")
    x = g.add_input("x", (2, 13, 3, 8), torch.float32)
    w = g.add_input("w", (8, 11), torch.float32)
    xh = g.add("permute", x, dims=(0, 2, 1, 3))
    g.set_outputs([g.add("matmul", xh, w)])
    xv, wv = randn(2, 13, 3, 8), randn(8, 11)
    (out,), _, _ = run_gemm(g, [xv, wv])
    torch.testing.assert_close(out, xv.permute(0, 2, 1, 3) @ wv, **tol(torch.float32))


def test_reshape_in_prologue():
    """A reshape that merges permuted dims cannot be one stride: it becomes // and %."""
    g = Graph("merge")
    x = g.add_input("x", (2, 3, 5, 4), torch.float32)        # [B, H, S, D]
    w = g.add_input("w", (12, 7), torch.float32)
    xs = g.add("permute", x, dims=(0, 2, 1, 3))               # [B, S, H, D]
    flat = g.add("reshape", xs, shape=(2, 5, 12))             # [B, S, H*D]
    g.set_outputs([g.add("matmul", flat, w)])
    xv, wv = randn(2, 3, 5, 4), randn(12, 7)
    (out,), _, _ = run_gemm(g, [xv, wv])
    torch.testing.assert_close(out, xv.permute(0, 2, 1, 3).reshape(2, 5, 12) @ wv, **tol(torch.float32))


def test_prologue_cast_after_load():
    g = Graph("cast_in")
    a = g.add_input("a", (17, 24), torch.bfloat16)
    b = g.add_input("b", (24, 9), torch.float32)
    g.set_outputs([g.add("matmul", g.add("cast", a, dtype=torch.float32), b)])
    x, y = randn(17, 24, dtype=torch.bfloat16), randn(24, 9)
    (out,), _, _ = run_gemm(g, [x, y])
    torch.testing.assert_close(out, x.float() @ y, **tol(torch.float32))


# --------------------------------------------------------------------------- epilogues


def _linear_graph(dtype, act=None, residual=False, scale=None, out_dtype=None):
    g = Graph("linear")
    x = g.add_input("x", (2, 11, 24), dtype)
    w = g.add_input("w", (20, 24), dtype)
    bias = g.add_input("bias", (20,), dtype)
    y = C.linear(g, x, w, bias)
    if act == "relu":
        y = g.add("relu", y)
    elif act in ("none", "tanh"):
        y = g.add("gelu", y, approximate=act)
    elif act == "silu":
        y = g.add("silu", y)
    if scale is not None:
        y = g.add("mul", y, g.constant(scale))
    if residual:
        r = g.add_input("r", (2, 11, 20), dtype)
        y = g.add("add", y, r)
    if out_dtype is not None:
        y = g.add("cast", y, dtype=out_dtype)
    g.set_outputs([y])
    return g


def _linear_ref(x, w, bias, act=None, r=None, scale=None, out_dtype=None):
    y = F.linear(x.float(), w.float(), bias.float())
    if act == "relu":
        y = torch.relu(y)
    elif act in ("none", "tanh"):
        y = F.gelu(y, approximate=act)
    elif act == "silu":
        y = F.silu(y)
    if scale is not None:
        y = y * scale
    if r is not None:
        y = y + r.float()
    return y.to(out_dtype or x.dtype)


@pytest.mark.parametrize("act", [None, "relu", "none", "tanh", "silu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_activation(act, dtype):
    g = _linear_graph(dtype, act)
    x, w, b = randn(2, 11, 24, dtype=dtype), randn(20, 24, dtype=dtype), randn(20, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, w, b])
    torch.testing.assert_close(out, _linear_ref(x, w, b, act), **tol(dtype))
    assert gen.source.count("tl.store(") == 1          # the epilogue is fused: one store


def test_residual_scale_and_cast():
    g = _linear_graph(torch.float32, "tanh", residual=True, scale=0.5, out_dtype=torch.float16)
    x, w, b, r = randn(2, 11, 24), randn(20, 24), randn(20), randn(2, 11, 20)
    (out,), _, _ = run_gemm(g, [x, w, b, r])
    assert out.dtype == torch.float16
    ref = _linear_ref(x, w, b, "tanh", r=r, scale=0.5, out_dtype=torch.float16)
    torch.testing.assert_close(out, ref, **tol(torch.float16))


def test_matmul_and_epilogue_both_written():
    """A group that writes the matmul result and its activation stores both from one tile."""
    g = Graph("two_out")
    a = g.add_input("a", (21, 30), torch.float32)
    b = g.add_input("b", (30, 19), torch.float32)
    mm = g.add("matmul", a, b)
    g.set_outputs([mm, g.add("relu", mm)])
    x, y = randn(21, 30), randn(30, 19)
    (o1, o2), gen, _ = run_gemm(g, [x, y])
    torch.testing.assert_close(o1, x @ y, **tol(torch.float32))
    torch.testing.assert_close(o2, torch.relu(x @ y), **tol(torch.float32))
    assert gen.source.count("tl.store(") == 2


def test_tensor_constant_bias():
    g = Graph("const_bias")
    a = g.add_input("a", (9, 16), torch.float32)
    w = randn(16, 12)
    bias = randn(12)
    y = g.add("add", g.add("matmul", a, g.constant(w)), g.constant(bias))
    g.set_outputs([y])
    x = randn(9, 16)
    (out,), _, _ = run_gemm(g, [x])
    torch.testing.assert_close(out, x @ w + bias, **tol(torch.float32))


def test_input_names_that_shadow_kernel_locals():
    """Inputs named like the kernel's own names (M, acc, float) get fresh variable names."""
    g = Graph("names")
    a = g.add_input("M", (9, 16), torch.float32)
    b = g.add_input("acc", (16, 12), torch.float32)
    c = g.add_input("float", (12,), torch.float32)
    g.set_outputs([g.add("add", g.add("matmul", a, b), c)])
    x, y, z = randn(9, 16), randn(16, 12), randn(12)
    (out,), gen, _ = run_gemm(g, [x, y, z])
    torch.testing.assert_close(out, x @ y + z, **tol(torch.float32))
    assert "v_float = tl.load(" in gen.source     # a builtin's name gets the prefix of user names


# --------------------------------------------------------------------------- dual GEMM


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dual_gemm_swiglu(dtype):
    g = Graph("swiglu")
    x = g.add_input("x", (3, 7, 24), dtype)
    w1 = g.add_input("w1", (40, 24), dtype)
    w3 = g.add_input("w3", (40, 24), dtype)
    h = g.add("mul", g.add("silu", C.linear(g, x, w1, None)), C.linear(g, x, w3, None))
    g.set_outputs([h])
    xv, a, b = randn(3, 7, 24, dtype=dtype), randn(40, 24, dtype=dtype), randn(40, 24, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [xv, a, b])
    ref = (F.silu(xv.float() @ a.float().t()) * (xv.float() @ b.float().t())).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))
    assert "acc0" in gen.source and "acc1" in gen.source
    assert gen.source.count("a = tl.load(") == 2          # A loaded once per K step (even and ragged K)


SIDE_CASES = {   # an epilogue that also computes from memory alone: values that neither feed the matmul nor read it
    "silu_of_gate": (lambda x, w, gate: F.silu(gate) * (x @ w), [(33, 24), (24, 40), (33, 40)]),
    "two_steps": (lambda x, w, y, z: (x @ w + 1) * torch.tanh(y * z) + y, [(33, 24), (24, 40), (33, 40), (40,)]),
    "broadcast_rows": (lambda x, w, y, b: (x @ w) * torch.sigmoid(y + b), [(2, 9, 24), (24, 40), (2, 9, 40), (9, 40)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", sorted(SIDE_CASES))
def test_an_epilogue_computes_values_read_from_memory(case, dtype):
    """`silu(gate) * (x @ w)` with `gate` an input (what cuBLAS wrote for SwiGLU's other half,
    codegen/library_plan.split_pairs): the planner gives SiLU of the loaded tile to the GEMM's
    epilogue, one kernel, no pointwise pass over `gate` first; also through two steps, and from
    an input broadcast over the batch; a non-contiguous side input is read in place. (A side
    value of another shape than the tile's is not taken: its own kernel computes it.)"""
    import minicomp
    fn, shapes = SIDE_CASES[case]
    inputs = [randn(*s, dtype=dtype, scale=0.5) for s in shapes]
    side = shapes[2]
    inputs[2] = randn(*side[:-2], side[-1], side[-2], dtype=dtype, scale=0.5).transpose(-1, -2)   # column-major
    f = minicomp.compile(fn)
    out = f(*inputs)
    want = fn(*(t.float() for t in inputs)).to(dtype)
    torch.testing.assert_close(out, want, **tol(dtype))
    (group,) = f.plan.groups
    assert group.kind == "gemm" and f._need().generated.kernel_names[0].startswith("mc_gemm")


def test_a_side_value_that_another_group_reads_stays_out():
    """SiLU(gate) returned too: the GEMM's epilogue writes only values of its tile's results,
    so SiLU is computed where it is written, and the planner says why it did not fuse."""
    import minicomp
    fn = lambda x, w, gate: (F.silu(gate), F.silu(gate) * (x @ w))   # noqa: E731
    inputs = [randn(33, 24), randn(24, 40), randn(33, 40)]
    f = minicomp.compile(fn)
    for got, want in zip(f(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want, **tol(torch.float32))
    assert len(f.plan.groups) == 2


def test_matmuls_not_sharing_a_fall_back():
    g = Graph("not_dual")
    x = g.add_input("x", (8, 16), torch.float32)
    y = g.add_input("y", (8, 16), torch.float32)
    w = g.add_input("w", (16, 8), torch.float32)
    g.set_outputs([g.add("add", g.add("matmul", x, w), g.add("matmul", y, w))])
    gen, group = one_group(g)
    assert "share operand A" in gen.fallbacks[group.id]
    xv, yv, wv = randn(8, 16), randn(8, 16), randn(16, 8)
    (out,) = load(gen, "cpu")(xv, yv, wv)
    torch.testing.assert_close(out, xv @ wv + yv @ wv, **tol(torch.float32))


def test_matrix_vector_falls_back():
    g = Graph("mv")
    a = g.add_input("a", (8, 16), torch.float32)
    v = g.add_input("v", (16,), torch.float32)
    g.set_outputs([g.add("matmul", a, v)])
    gen, group = one_group(g)
    assert "matrix-vector" in gen.fallbacks[group.id]
    av, vv = randn(8, 16), randn(16)
    torch.testing.assert_close(load(gen, "cpu")(av, vv)[0], av @ vv, **tol(torch.float32))


# --------------------------------------------------------------------------- the TMA form


@pytest.fixture(params=["plain", "overlap"])
def tma_on_cpu(request):
    """A target that emits the persistent TMA kernel for the CPU too: Triton's interpreter runs
    tensor descriptors. Each form of its epilogue (`Target.gemm_epilogue`): after the K loop, and
    in the flattened loop."""
    from minicomp.target import Target
    return Target("cpu", tma_on_cpu=True, gemm_epilogue=request.param)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["a@b", "linear", "aT@b", "aT@bT"])
def test_tma_form_matches_eager(layout, dtype, tma_on_cpu):
    """Every operand orientation a descriptor can read, with ragged tiles in M, N and K (64-wide
    tiles over 136, 72 and 40), a bias and a residual in the epilogue, and 6 output tiles walked
    by 3 persistent programs."""
    m, k, n = 136, 40, 72
    g = Graph("tma")
    a_t, b_t = layout.startswith("aT"), layout in ("linear", "aT@bT")
    a = g.add_input("a", (k, m) if a_t else (m, k), dtype)
    b = g.add_input("b", (n, k) if b_t else (k, n), dtype)
    bias = g.add_input("bias", (n,), dtype)
    r = g.add_input("r", (m, n), dtype)
    av = g.add("permute", a, dims=(1, 0)) if a_t else a
    bv = g.add("permute", b, dims=(1, 0)) if b_t else b
    g.set_outputs([g.add("add", g.add("gelu", g.add("add", g.add("matmul", av, bv), bias), approximate="tanh"), r)])
    x = randn(*((k, m) if a_t else (m, k)), dtype=dtype)
    w = randn(*((n, k) if b_t else (k, n)), dtype=dtype)
    bb, rr = randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, w, bb, rr], target=tma_on_cpu)
    xm, wm = (x.t() if a_t else x).float(), (w.t() if b_t else w).float()
    ref = (F.gelu(xm @ wm + bb.float(), approximate="tanh") + rr.float()).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))
    src = gen.source
    assert src.count("tl.make_tensor_descriptor(") == 2
    loop = {"plain": "for tile in range(tl.program_id(0)", "overlap": "flatten=True"}[tma_on_cpu.gemm_epilogue]
    assert loop in src
    assert ("a_desc.load([k0, pid_m * BLOCK_M]).T" in src) == a_t
    assert ("b_desc.load([pid_n * BLOCK_N, k0]).T" in src) == b_t


@pytest.mark.parametrize("m,k,n", [(5, 8, 8), (1, 16, 24), (3, 24, 200)])
def test_tma_form_small_and_single_row_problems(m, k, n, tma_on_cpu):
    """Tiles far larger than the problem (TMA zero-fills past the edge), and a single row, whose
    index folds its row symbol away: the descriptor still reads it (a one-row matrix's stride is
    free), and both give eager's answer."""
    dtype = torch.float16
    g = Graph("small")
    a = g.add_input("a", (m, k), dtype)
    b = g.add_input("b", (k, n), dtype)
    g.set_outputs([g.add("matmul", a, b)])
    x, y = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, y], target=tma_on_cpu)
    torch.testing.assert_close(out, (x.float() @ y.float()).to(dtype), **tol(dtype))
    assert gen.source.count("tl.make_tensor_descriptor(") == 2


def test_tma_form_dual_gemm_and_misaligned_operand(tma_on_cpu):
    """SwiGLU's two GEMMs from descriptors; an operand at an address not 16-byte aligned is copied
    to an aligned one before the launch (TMA needs it), and the answer is eager's."""
    dtype = torch.bfloat16
    g = Graph("swiglu_tma")
    x = g.add_input("x", (3, 7, 24), dtype)
    w1 = g.add_input("w1", (40, 24), dtype)
    w3 = g.add_input("w3", (40, 24), dtype)
    g.set_outputs([g.add("mul", g.add("silu", C.linear(g, x, w1, None)), C.linear(g, x, w3, None))])
    xv = randn(3 * 7 * 24 + 1, dtype=dtype)[1:].reshape(3, 7, 24)     # 2 bytes past an aligned start
    assert xv.data_ptr() % 16 != 0
    a, b = randn(40, 24, dtype=dtype), randn(40, 24, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [xv, a, b], target=tma_on_cpu)
    ref = (F.silu(xv.float() @ a.float().t()) * (xv.float() @ b.float().t())).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))
    assert gen.source.count("tl.make_tensor_descriptor(") == 3 and "_align16(x)" in gen.source


def test_a_cuda_module_aligns_no_operand_it_knows_aligned_and_installs_the_allocator_once():
    """On CUDA run() lays out every input 16-byte aligned and allocates every buffer aligned, so
    its TMA launches pass them as they are (no `_align16` call at each launch); Triton's allocator
    for the descriptors is installed once a call, before the first group. The CPU module keeps
    `_align16` (its inputs are not aligned for it: test_tma_form_dual_gemm_and_misaligned_operand)."""
    dtype = torch.bfloat16
    g = Graph("two_linears")
    x = g.add_input("x", (4, 64, 128), dtype)
    w1 = g.add_input("w1", (256, 128), dtype)
    w2 = g.add_input("w2", (128, 256), dtype)
    g.set_outputs([C.linear(g, g.add("gelu", C.linear(g, x, w1, None), approximate="none"), w2, None)])
    target = replace(Target("cuda", (9, 0)), library_gemm=False)
    from minicomp.plan import plan_graph
    gen = generate(g, plan_graph(g), target)
    lines = [line.strip() for line in gen.source.split("def run(", 1)[1].splitlines()]
    launches = [line for line in lines if line.startswith("_launch(mc_gemm_")]
    assert len(launches) == 2 and gen.source.count("tl.make_tensor_descriptor(") >= 4
    assert not any("_align16(" in line for line in launches), launches
    assert lines.count("_tma_ready()") == 1 and lines.index("_tma_ready()") < lines.index(launches[0])


@pytest.mark.parametrize("why", ["fp32", "leading stride", "batched B", "prologue cast"])
def test_pointer_form_where_a_descriptor_cannot_read(why, tma_on_cpu):
    dtype = torch.float32 if why == "fp32" else torch.bfloat16
    g = Graph("no_tma")
    k = 37 if why == "leading stride" else 40     # 74 bytes between rows: not a multiple of 16
    a = g.add_input("a", (2, 9, k), dtype)
    b = g.add_input("b", (2, k, 16) if why == "batched B" else (k, 16), dtype)
    av = g.add("cast", a, dtype=torch.float16) if why == "prologue cast" else a
    bv = g.add("cast", b, dtype=torch.float16) if why == "prologue cast" else b
    g.set_outputs([g.add("matmul", av, bv)])
    x = randn(2, 9, k, dtype=dtype)
    y = randn(*((2, k, 16) if why == "batched B" else (k, 16)), dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, y], target=tma_on_cpu)
    ref = x.float() @ y.float()
    torch.testing.assert_close(out.float(), ref, **tol(out.dtype))
    assert "make_tensor_descriptor" not in gen.source


# --------------------------------------------------------------------------- generated source


def test_cuda_source_autotunes_and_groups_programs():
    g = Graph("linear_big")
    x = g.add_input("x", (4, 64, 128), torch.bfloat16)
    w = g.add_input("w", (96, 128), torch.bfloat16)
    g.set_outputs([g.add("gelu", C.linear(g, x, w, None), approximate="tanh")])
    gen, _ = one_group(g, "cuda")
    src = gen.source
    assert "@triton.autotune(" in src and 'key=["M", "N", "K"]' in src
    assert "GROUP_M" in src and "group_size_m" in src
    assert "triton.Config({\"BLOCK_M\": " in src
    assert "input_precision" not in src                  # half dot: no precision switch
    assert ".to(tl.float32)" not in src.split("for k0")[1].split("epilogue")[0]  # no widening on the GPU


def test_a_single_config_is_passed_by_the_launch_not_autotuned():
    """A problem that only the smallest tile fits has one config: no autotuner (which would
    only wrap it), the launch passes the config's block sizes, warps and stages, and its grid
    is numbers (capped by the SM count: the bf16 form here is the persistent TMA one)."""
    g = _linear_graph(torch.bfloat16, "tanh")                      # [22, 24] @ [24, 20]
    gen, _ = one_group(g, "cuda")
    assert "triton.autotune" not in gen.source and "_configs" not in gen.source
    (kernel,) = gen.kernels
    kwargs = dict(kernel.launches[0].kwargs)
    # no config of the table fits 22 x 20: the smallest tile of it (gemm_configs.configs)
    assert kwargs == {"M": 22, "N": 20, "K": 24, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
                      "num_stages": 4, "num_warps": 4}
    (line,) = [line for line in gen.source.splitlines() if f"_launch({kernel.name}," in line]
    assert "meta['BLOCK" not in line and "_sm_count(device), 1)" in line   # one tile (the persistent TMA form)
    compile(gen.source, "<generated>", "exec")


def test_fp32_dot_follows_torch_tf32_switch():
    g = Graph("mm32")
    a = g.add_input("a", (64, 64), torch.float32)
    g.set_outputs([g.add("matmul", a, a)])
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert 'input_precision="ieee"' in one_group(g, "cuda")[0].source
        torch.backends.cuda.matmul.allow_tf32 = True
        assert 'input_precision="tf32"' in one_group(g, "cuda")[0].source
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (4096, 4096, 4096), (2048, 4096, 1024), (1000, 3000, 1500)])
def test_gpu_large(dtype, m, n, k):
    g = Graph("mm_gpu")
    a = g.add_input("a", (m, k), dtype)
    b = g.add_input("b", (k, n), dtype)
    g.set_outputs([g.add("matmul", a, b)])
    x = randn(m, k, dtype=dtype, device="cuda", scale=1 / math.sqrt(k))
    y = randn(k, n, dtype=dtype, device="cuda")
    (out,), _, _ = run_gemm(g, [x, y], device="cuda")
    torch.testing.assert_close(out, torch.matmul(x, y), **tol(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_linear_gelu(dtype):
    g = Graph("mlp_up")
    x = g.add_input("x", (4, 512, 1024), dtype)
    w = g.add_input("w", (4096, 1024), dtype)
    bias = g.add_input("bias", (4096,), dtype)
    g.set_outputs([g.add("gelu", C.linear(g, x, w, bias), approximate="tanh")])
    xv = randn(4, 512, 1024, dtype=dtype, device="cuda")
    wv = randn(4096, 1024, dtype=dtype, device="cuda", scale=1 / 32)
    bv = randn(4096, dtype=dtype, device="cuda")
    (out,), _, _ = run_gemm(g, [xv, wv, bv], device="cuda")
    ref = F.gelu(F.linear(xv, wv, bv), approximate="tanh")
    torch.testing.assert_close(out, ref, **tol(dtype))


@pytest.mark.gpu
def test_gpu_fp32_matches_eager():
    g = Graph("mm32_gpu")
    a = g.add_input("a", (1024, 768), torch.float32)
    b = g.add_input("b", (768, 1000), torch.float32)
    g.set_outputs([g.add("matmul", a, b)])
    x, y = randn(1024, 768, device="cuda"), randn(768, 1000, device="cuda")
    (out,), _, _ = run_gemm(g, [x, y], device="cuda")
    ref = (x.double() @ y.double()).float()
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
def test_gpu_dual_gemm_swiglu():
    dtype = torch.bfloat16
    g = Graph("swiglu_gpu")
    x = g.add_input("x", (2048, 1024), dtype)
    w1 = g.add_input("w1", (2816, 1024), dtype)
    w3 = g.add_input("w3", (2816, 1024), dtype)
    g.set_outputs([g.add("mul", g.add("silu", C.linear(g, x, w1, None)), C.linear(g, x, w3, None))])
    xv = randn(2048, 1024, dtype=dtype, device="cuda")
    a = randn(2816, 1024, dtype=dtype, device="cuda", scale=1 / 32)
    b = randn(2816, 1024, dtype=dtype, device="cuda", scale=1 / 32)
    (out,), _, _ = run_gemm(g, [xv, a, b], device="cuda")
    ref = (F.silu((xv @ a.t()).float()) * (xv @ b.t()).float()).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))


# --------------------------------------------------------------------------- rows regrouped in the epilogue

def _conv1d_mlp(x, w1, b1, w2, b2):
    """GPT-2's MLP as transformers writes it: Conv1D is addmm over the flattened rows, viewed back."""
    h = torch.addmm(b1, x.view(-1, x.size(-1)), w1).view(x.size()[:-1] + (w1.shape[1],))
    h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))
    return torch.addmm(b2, h.view(-1, h.size(-1)), w2).view(h.size()[:-1] + (w2.shape[1],))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_an_epilogue_after_a_view_that_regroups_the_rows_joins_the_gemm(dtype):
    import minicomp
    x = randn(2, 7, 33, dtype=dtype)
    w1, b1 = randn(33, 65, dtype=dtype, scale=0.2), randn(65, dtype=dtype)
    w2, b2 = randn(65, 31, dtype=dtype, scale=0.1), randn(31, dtype=dtype)
    f = minicomp.compile(_conv1d_mlp)
    torch.testing.assert_close(f(x, w1, b1, w2, b2), _conv1d_mlp(x, w1, b1, w2, b2), **tol(dtype))
    c = f.compile_for(x, w1, b1, w2, b2)
    assert c.plan.kinds() == ["gemm", "gemm"] and not c.generated.fallbacks, str(c.plan)
    assert c.generated.kernel_names[0].startswith("mc_gemm_bias_scale_pow"), c.generated.kernel_names


def test_a_residual_read_through_other_strides_after_the_regroup():
    import minicomp
    def f(x, w, b, r):
        return torch.addmm(b, x.view(-1, 24), w).view(3, 5, 40) + r.transpose(0, 1)
    x, w, b = randn(3, 5, 24), randn(24, 40, scale=0.2), randn(40)
    r = randn(5, 3, 40)
    cf = minicomp.compile(f)
    torch.testing.assert_close(cf(x, w, b, r), f(x, w, b, r), **tol(torch.float32))
    assert cf.compile_for(x, w, b, r).plan.kinds() == ["gemm"]


def test_a_view_that_splits_the_columns_is_stored_after_the_epilogue():
    # no regroup: the relu cannot follow the view in the tile; simplify sinks the view below
    # the relu (reshape_sink) and the GEMM stores relu's tile at the view's index
    import minicomp
    def f(x, w):
        return (x @ w).view(6, 20, 2).relu()
    def g(x, w, r):
        return (x @ w).view(6, 20, 2) + r          # a binary op: the view stays, the add apart
    x, w, r = randn(6, 24), randn(24, 40), randn(6, 20, 2)
    cf, cg = minicomp.compile(f), minicomp.compile(g)
    torch.testing.assert_close(cf(x, w), f(x, w), **tol(torch.float32))
    torch.testing.assert_close(cg(x, w, r), g(x, w, r), **tol(torch.float32))
    assert cf.compile_for(x, w).plan.kinds() == ["gemm"]
    assert cg.compile_for(x, w, r).plan.kinds() == ["gemm", "pointwise"]


# --------------------------------------------------------------------------- a fused projection cut in two

def _gate_up(x, w):
    """Phi-3's MLP: one gate/up projection, chunked, the halves joined by SwiGLU."""
    gate, up = (x @ w).chunk(2, dim=-1)
    return up * F.silu(gate)


def _gate_up_flat(x, w):
    """The same as aten graphs spell it: the rows flattened for the mm, viewed back, split."""
    h = (x.reshape(-1, x.shape[-1]) @ w).view(*x.shape[:-1], w.shape[-1])
    gate, up = h.split(w.shape[-1] // 2, dim=-1)
    return up * torch.sigmoid(gate) * gate


def _gate_up_bias(x, w):
    """With a bias (F.linear(x, W, b).chunk(2)): each half takes its part of the bias."""
    gate, up = F.linear(x, w.t(), w[0]).chunk(2, dim=-1)
    return gate * F.silu(up)


@pytest.mark.parametrize("fn", [_gate_up, _gate_up_flat, _gate_up_bias], ids=["chunk", "view_split", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_projection_cut_in_two_and_joined_is_one_dual_gemm(fn, dtype):
    import minicomp
    x, w = randn(2, 5, 24, dtype=dtype), randn(24, 2 * 19, dtype=dtype, scale=0.2)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(x, w), fn(x, w), **tol(dtype))
    c = f.compile_for(x, w)
    assert c.plan.kinds() == ["gemm"], str(c.plan)
    assert [c.graph.node(n).op for n in c.plan.groups[0].nodes].count("matmul") == 2


def test_a_qkv_split_or_halves_not_joined_stay_one_gemm():
    import minicomp
    def qkv(x, w):
        q, k, v = (x @ w).chunk(3, dim=-1)
        return q + 1, k * 2, v - 1
    def halves(x, w):
        a, b = (x @ w).chunk(2, dim=-1)
        return a.relu(), b.exp()
    x, w = randn(7, 16), randn(16, 24, scale=0.3)
    for fn in (qkv, halves):
        f = minicomp.compile(fn)
        for got, want in zip(f(x, w), fn(x, w)):
            torch.testing.assert_close(got, want, **tol(torch.float32))
        g = f.compile_for(x, w).graph
        assert sum(g.node(n).op == "matmul" for n in g.nx.nodes) == 1, g.dump()


def test_a_permute_of_the_gemm_result_is_stored_by_the_gemm():
    """nn.MultiheadAttention with batch_first: out_proj over [S*B, E], viewed [S, B, E] and
    transposed back to [B, S, E]; the GEMM stores each element at the transposed index."""
    import minicomp
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    fn = lambda x: mha(x, x, x, need_weights=False)[0]     # noqa: E731
    x = torch.randn(2, 7, 32)
    f = minicomp.compile(fn)
    with torch.no_grad():
        torch.testing.assert_close(f(x), fn(x), **tol(torch.float32))
    assert f.compile_for(x).plan.kinds() == ["gemm", "attention", "gemm"]
    def g(x, w):
        return (x @ w).t() * 2.0          # a square transpose: the shape alone does not say
    x2, w2 = randn(12, 12), randn(12, 12)
    cg = minicomp.compile(g)
    torch.testing.assert_close(cg(x2, w2), g(x2, w2), **tol(torch.float32))


@pytest.mark.parametrize("dual", [False, True], ids=["single", "dual"])
@pytest.mark.parametrize("m", [1, 16, 48])
def test_few_rows_take_the_skinny_table_and_every_config_compiles_for_sm90(m, dual):
    """A GEMM of few rows over a long K (batch 1 x 16 decode) is autotuned over the skinny table
    (16-row tiles, narrow column blocks, long K blocks); every one of its configs compiles for
    sm_90 (full depth), and the module the CPU runs computes the linear + SwiGLU/SiLU epilogue."""
    from minicomp.codegen import gemm_configs, target_check

    dtype = torch.bfloat16
    g = Graph("few_rows")
    x = g.add_input("x", (1, m, 512), dtype)
    w1 = g.add_input("w1", (384, 512), dtype)
    y = C.linear(g, x, w1, None)
    if dual:
        w3 = g.add_input("w3", (384, 512), dtype)
        y = g.add("mul", g.add("silu", y), C.linear(g, x, w3, None))
    else:
        y = g.add("silu", y)
    g.set_outputs([y])
    gen, _ = one_group(g, "cuda")
    table = gemm_configs.SKINNY_DUAL_CONFIGS if dual else gemm_configs.SKINNY_CONFIGS
    expect = [c for c in table if c[0] <= max(32, 1 << (m - 1).bit_length()) and c[1] <= 512 and c[2] <= 512]
    configs = [line for line in gen.source.splitlines() if line.strip().startswith("triton.Config(")]
    assert len(configs) == len(expect) and all(f'"BLOCK_M": {c[0]}, "BLOCK_N": {c[1]}, "BLOCK_K": {c[2]}' in line
                                               for c, line in zip(expect, configs))
    (verdict,) = target_check.check_kernels(gen.source, gen.kernel_names, 90, depth="full")
    assert verdict.error is None and verdict.configs == len(expect), verdict
    gen_rnd = torch.Generator().manual_seed(m)
    ins = [torch.randn(s, generator=gen_rnd).to(dtype) * 0.05 for s in ((1, m, 512), (384, 512), (384, 512))]
    got, _, _ = run_gemm(g, ins[:3 if dual else 2])
    ref = F.silu(F.linear(ins[0].float(), ins[1].float()))
    if dual:
        ref = ref * F.linear(ins[0].float(), ins[2].float())
    torch.testing.assert_close(got[0].float(), ref, **tol(dtype))


def test_few_rows_keep_the_general_table_where_b_is_small_or_m_is_symbolic():
    """The skinny table is for streaming a large B: a K or N under SKINNY_MIN_KN keeps the general table."""
    from minicomp.codegen import gemm_configs

    g = _linear_graph(torch.bfloat16, "tanh")                      # [22, 24] @ [24, 20]
    gen, _ = one_group(g, "cuda")
    assert '"BLOCK_M": 16' not in gen.source
    assert gemm_configs.SKINNY_MIN_KN > 24


@pytest.mark.parametrize("residual", [False, True])
def test_the_default_epilogue_overlaps_unless_it_loads_a_tile(residual):
    """`gemm_epilogue="auto"`: a bias-GELU epilogue runs in the flattened tile loop (the next
    tile's loads fly during it), one that loads a residual tile after the K loop (measured
    slower flattened, codegen/gemm.py); both give eager's answer."""
    from minicomp.target import Target
    dtype = torch.bfloat16
    m, k, n = 136, 40, 72
    g = Graph("auto_epilogue")
    a = g.add_input("a", (m, k), dtype)
    b = g.add_input("b", (n, k), dtype)
    bias = g.add_input("bias", (n,), dtype)
    r = g.add_input("r", (m, n), dtype)
    y = g.add("gelu", g.add("add", g.add("matmul", a, g.add("permute", b, dims=(1, 0))), bias), approximate="none")
    g.set_outputs([g.add("add", y, r) if residual else y])
    x, w, bb, rr = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype), randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [x, w, bb, rr], target=Target("cpu", tma_on_cpu=True))
    ref = F.gelu(x.float() @ w.float().t() + bb.float())
    torch.testing.assert_close(out, (ref + rr.float() if residual else ref).to(dtype), **tol(dtype))
    assert ("flatten=True" in gen.source) == (not residual)

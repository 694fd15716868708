"""GEMMs with nothing to fuse call cuBLAS on CUDA (codegen/library.py).

CPU tests generate for an sm_90 target with no GPU present and check the plan record
(`GeneratedModule.library`, never `fallbacks`), the source, the switch and the plan summary;
the library lines are plain PyTorch, so they also run here on CPU tensors (the module's
device type set to "cpu") against eager, at odd sizes and over symbolic M. `gpu` tests run
the modules on the H200 against eager: bf16/fp16/fp32 with odd K and N, batched, F.linear
with a bias, and fp32 under both of PyTorch's TF32 switches.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from library_testing import generate_quietly, run_on_cpu as _run_on_cpu

import minicomp
from minicomp.api import compile_graph
from minicomp.codegen import library, library_plan
from minicomp.frontend.dsl import load_dsl
from minicomp.frontend.fx import capture
from minicomp.plan.table import group_count
from minicomp.runtime import cuda_graphs as cg
from minicomp.target import Target

SM90 = Target("cuda", (9, 0), eager_first=False)   # which groups call cuBLAS; first calls: tests/test_first_calls.py
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _generate(fn, inputs, target: Target = SM90):
    return generate_quietly(fn, inputs, target)


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


PLAIN_CASES = {      # what the graph computes, the shapes, the cuBLAS call the module makes
    "mm": (lambda a, b: a @ b, [(33, 32), (32, 24)], "torch.matmul(a, b)"),
    "linear": (lambda x, w: F.linear(x, w), [(3, 7, 32), (24, 32)], "torch.nn.functional.linear(x, w)"),
    "linear_bias_2d": (lambda x, w, b: F.linear(x, w, b), [(7, 32), (24, 32), (24,)],
                       "torch.nn.functional.linear(x, w, b)"),
    "linear_bias_3d": (lambda x, w, b: F.linear(x, w, b), [(3, 7, 32), (24, 32), (24,)],
                       "torch.nn.functional.linear(x, w, b)"),
    "bias_first": (lambda x, w, b: b + x @ w, [(7, 32), (32, 24), (24,)], "torch.addmm(b, x, w)"),
    "bias_batched_a": (lambda x, w, b: x @ w + b, [(3, 7, 32), (32, 24), (24,)],
                       "torch.nn.functional.linear(x, w.t(), b)"),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 9, 32), (3, 32, 24)], "torch.matmul(a, b)"),
    "broadcast_batch": (lambda a, b: a @ b, [(2, 3, 9, 32), (32, 24)], "torch.matmul(a, b)"),
    "transposed_a": (lambda a, b: a.t() @ b, [(32, 33), (32, 24)], "torch.matmul(buf2, b)"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(PLAIN_CASES))
def test_plain_gemms_call_cublas_and_give_eagers_answer(case, dtype):
    fn, shapes, call = PLAIN_CASES[case]
    inputs = [_randn(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    c = _generate(fn, inputs)
    gen = c.generated
    (gemm,) = [g for g in c.plan.groups if g.kind == "gemm"]
    assert gen.library == {gemm.id: library.BIAS if "bias" in case else library.PLAIN}, gen.source
    assert gen.fallbacks == {} and gen.kernel_names == [] and "@triton.jit" not in gen.source
    assert call in gen.source and f"-> {gen.library[gemm.id]}" in gen.source
    assert "through cuBLAS" in gen.source.splitlines()[1]
    (out,) = _run_on_cpu(gen, inputs)
    torch.testing.assert_close(out, fn(*inputs), **tol(dtype))


def test_a_non_contiguous_operand_is_read_as_eager_reads_it():
    a = _randn(40, 32)[::2]                       # rows two apart
    b = _randn(24, 32, seed=1).t()                # column-major
    c = _generate(lambda x, y: x @ y, [a, b])
    assert c.generated.library and not c.generated.kernels
    (out,) = _run_on_cpu(c.generated, [a, b])
    torch.testing.assert_close(out, a @ b)


EPILOGUE_CASES = {
    "gelu": (lambda x, w: F.gelu(x @ w), [(33, 32), (32, 24)]),
    "residual": (lambda x, w, r: x @ w + r, [(33, 32), (32, 24), (33, 24)]),
    "scale": (lambda x, w: (x @ w) * 0.5, [(33, 32), (32, 24)]),
    "bias_then_relu": (lambda x, w, b: torch.relu(F.linear(x, w, b)), [(7, 32), (24, 32), (24,)]),
    "bias_over_batched_b": (lambda a, b, bias: torch.bmm(a, b) + bias, [(3, 9, 32), (3, 32, 24), (24,)]),
    "swiglu": (lambda x, w1, w2: F.silu(x @ w1) * (x @ w2), [(33, 32), (32, 24), (32, 24)]),
    "prologue_cast": (lambda x, w: x.half() @ w, [(33, 32), (32, 24)]),
}


@pytest.mark.parametrize("case", sorted(EPILOGUE_CASES))
def test_a_gemm_with_something_to_fuse_stays_our_kernel(case):
    fn, shapes = EPILOGUE_CASES[case]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    if case == "prologue_cast":
        inputs[1] = inputs[1].half()
    gen = _generate(fn, inputs).generated
    assert gen.library == {} and gen.fallbacks == {}
    assert any(name.startswith("mc_gemm") for name in gen.kernel_names)
    assert "torch.matmul(" not in gen.source and "torch.addmm(" not in gen.source


def test_a_bias_of_another_dtype_is_an_epilogue_of_ours():
    """bf16 matmul + fp32 bias promotes to fp32: not what addmm computes, so our kernel."""
    x, w, b = _randn(7, 32, dtype=torch.bfloat16), _randn(32, 24, dtype=torch.bfloat16, seed=1), _randn(24, seed=2)
    gen = _generate(lambda x, w, b: x @ w + b, [x, w, b]).generated
    assert gen.library == {} and any(n.startswith("mc_gemm") for n in gen.kernel_names)


def test_the_switch_off_gives_our_kernel_and_the_cpu_target_never_calls_cublas():
    fn, inputs = (lambda a, b: a @ b), [_randn(33, 32), _randn(32, 24, seed=1)]
    off = _generate(fn, inputs, replace(SM90, library_gemm=False)).generated
    assert off.library == {} and off.fallbacks == {} and off.kernel_names == ["mc_gemm_matmul_0"]
    cpu = _generate(fn, inputs, Target("cpu")).generated
    assert Target("cpu").library_gemm and cpu.library == {} and cpu.kernel_names == ["mc_gemm_matmul_0"]


def test_the_environment_sets_the_switch_and_the_compile_cache_keys_on_it(monkeypatch):
    assert Target.for_device("cuda", {}).library_gemm
    assert not Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "0"}).library_gemm
    assert Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "1"}).library_gemm
    # the GPU-true check of a CPU module compiles the GEMM kernels that module runs, not cuBLAS
    assert not Target("cpu").for_check(90).library_gemm and SM90.for_check(90).library_gemm
    f = minicomp.compile(lambda a, b: a @ b)
    x, y = _randn(9, 5), _randn(5, 3, seed=1)
    f(x, y)
    first = f._need()
    monkeypatch.setenv("MINICOMP_LIBRARY_GEMM", "0")
    f(x, y)
    assert f._need() is not first                # a flip compiles again, as a TF32 flip does
    monkeypatch.delenv("MINICOMP_LIBRARY_GEMM")
    f(x, y)
    assert f._need() is first                    # and the first specialisation serves again


def test_the_switches_a_call_keys_on_follow_every_change_of_their_variables(monkeypatch):
    """`codegen_switches` reads its variables again only when one changed: each change is
    seen at the next call, an unset variable gives the default again, and a bad value raises at
    every call (it is never kept)."""
    from minicomp.errors import MinicompError
    from minicomp.target import CODEGEN_ENVS, codegen_switches
    for name in CODEGEN_ENVS:
        monkeypatch.delenv(name, raising=False)
    default = ("on", True, False, "auto", "on", "auto", True, True, True, "auto")
    assert codegen_switches() == default
    changes = [("MINICOMP_LIBRARY_GEMM", "all", 0, "all"), ("MINICOMP_LIBRARY_ATTENTION", "0", 1, False),
               ("MINICOMP_DUAL_GEMM", "fused", 2, True), ("MINICOMP_GEMM_EPILOGUE", "plain", 3, "plain"),
               ("MINICOMP_LIBRARY_JOINS", "0", 4, "off"), ("MINICOMP_GEMM_COMBO", "0", 5, "off"),
               ("MINICOMP_GEMM_COMBO", "all", 5, "all"), ("MINICOMP_REUSE_BUFFERS", "0", 6, False),
               ("MINICOMP_PDL", "0", 7, False), ("MINICOMP_EAGER_FIRST", "0", 8, False),
               ("MINICOMP_GRAPH_FEW_ROWS", "1", 9, "on"), ("MINICOMP_GRAPH_FEW_ROWS", "0", 9, "off")]
    for name, value, i, want in changes:
        monkeypatch.setenv(name, value)
        assert codegen_switches()[i] == want, name
        assert codegen_switches()[i] == want, name         # the kept answer is the same
        monkeypatch.delenv(name)
        assert codegen_switches() == default, name
    for name in ("MINICOMP_GEMM_EPILOGUE", "MINICOMP_GEMM_COMBO"):
        monkeypatch.setenv(name, "fast")
        for _ in range(2):
            with pytest.raises(MinicompError, match=f"{name}='fast'"):
                codegen_switches()
        monkeypatch.delenv(name)


def test_fp32_source_is_the_same_under_either_tf32_switch_it_is_read_when_the_call_runs():
    """Our kernels bake the precision in at compile time (Target.matmul_precision); the cuBLAS
    line reads PyTorch's switch when it runs, as eager does, so it has no precision of its own."""
    inputs = [_randn(33, 32), _randn(32, 24, seed=1)]
    fn = lambda a, b: a @ b  # noqa: E731
    ieee = _generate(fn, inputs, replace(SM90, matmul_precision="ieee")).generated.source
    tf32 = _generate(fn, inputs, replace(SM90, matmul_precision="tf32")).generated.source
    assert ieee == tf32 and "input_precision" not in ieee


def test_symbolic_m_is_one_cublas_module_for_every_length():
    text = ("func lin(x: f32[B, S, K], w: f32[N, K], b: f32[N]) -> f32[B, S, N] {\n"
            "  return x @ transpose(w, 0, 1) + b\n}\n")
    graph = load_dsl(text, "lin", symbolic=True, dims={"K": 32, "N": 24})
    c = compile_graph(graph, [None] * len(graph.inputs), device="cuda", load=False, target=SM90)
    assert c.graph.symbolic and c.generated.library and not c.generated.fallbacks
    assert "torch.nn.functional.linear(" in c.generated.source
    w, b = _randn(24, 32, seed=1), _randn(24, seed=2)
    for bsz, s in ((2, 2), (3, 7), (2, 65)):
        x = _randn(bsz, s, 32, seed=s)
        (out,) = _run_on_cpu(c.generated, [x, w, b])
        torch.testing.assert_close(out, F.linear(x, w, b))


def test_dynamic_true_gives_a_cublas_module_over_every_size():
    """minicomp.compile(fn, dynamic=True): every size symbolic (M, K, N); the plan it made, written
    for sm_90, is one cuBLAS line that serves every size."""
    from minicomp.codegen import generate

    fn = lambda x, w, b: F.linear(x, w, b)  # noqa: E731
    f = minicomp.compile(fn, dynamic=True)
    for s in (7, 13):
        args = (_randn(2, s, 32, seed=s), _randn(24, 32, seed=1), _randn(24, seed=2))
        torch.testing.assert_close(f(*args), fn(*args))
    c = f._need()
    assert c.graph.symbolic
    gen = generate(c.graph, c.plan, SM90)
    assert list(gen.library.values()) == [library.BIAS] and not gen.kernels and not gen.fallbacks
    for bsz, s, k, n in ((2, 3, 32, 24), (3, 50, 8, 5)):
        args = (_randn(bsz, s, k, seed=s), _randn(n, k, seed=1), _randn(n, seed=2))
        (out,) = _run_on_cpu(gen, list(args))
        torch.testing.assert_close(out, fn(*args))


def test_library_groups_are_capture_safe_and_no_fallback():
    c = _generate(lambda x, w, b: F.linear(x, w, b), [_randn(7, 32), _randn(24, 32, seed=1), _randn(24, seed=2)])
    assert c.generated.device_type == "cuda" and cg.hazards(c) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shapes", [[(33, 31), (31, 24)], [(33, 32), (32, 23)], [(5, 768), (50257, 768)]],
                         ids=["k_31", "n_23", "lm_head_50257"])
def test_a_k_or_n_off_16_bytes_keeps_our_kernel(shapes, dtype):
    """cuBLAS's slow path: K = 4095 in bf16 took 0.969 ms on the H200 against our kernel's 0.237."""
    fn = (lambda x, w: F.linear(x, w)) if shapes[1][0] == 50257 else (lambda a, b: a @ b)
    inputs = [_randn(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    gen = _generate(fn, inputs).generated
    assert gen.library == {} and any(name.startswith("mc_gemm") for name in gen.kernel_names)


@pytest.mark.parametrize("shapes", [[(1024, 1023), (1023, 1024)], [(16, 1023), (1023, 1024)], [(2, 1024, 1023), (2, 1023, 1024)]],
                         ids=["long", "few_rows", "batched"])
def test_an_odd_k_keeps_our_kernel_however_long(shapes):
    """No copy makes cuBLAS fast at an odd K (session 26, benchmarks/ablations/pad_gemm.py): the
    GEMM is our kernel whatever its size, and cuBLAS serves only its first calls
    (codegen/first_calls.py)."""
    inputs = [_randn(*s, dtype=torch.bfloat16, seed=i) for i, s in enumerate(shapes)]
    gen = _generate(lambda a, b: a @ b, inputs).generated
    assert gen.library == {} and any(name.startswith("mc_gemm") for name in gen.kernel_names)
    assert "aligned_rows" not in gen.source


def test_the_plan_table_and_counts_say_cublas():
    c = _generate(lambda x, w, r: torch.relu(x @ w) @ r, [_randn(33, 32), _randn(32, 24, seed=1), _randn(24, 8, seed=2)])
    gen = c.generated
    assert len(gen.library) == 1 and len(gen.kernel_names) == 1     # relu fuses into the first GEMM only
    (gid,) = gen.library
    table = c.plan.table(fallbacks=gen.fallbacks, library=gen.library)
    assert f"  g{gid} calls cuBLAS: nothing to fuse" in table and "(cuBLAS)" in table
    assert group_count(c.plan, gen.fallbacks, gen.library) == "2 groups (1 Triton kernel, 1 through cuBLAS)"
    assert "# plan: 2 group(s), 1 Triton kernel(s), 0 through PyTorch, 1 through cuBLAS" in gen.source


# --------------------------------------------------------------------------- GPU

GPU_SHAPES = [((511, 4096), (4096, 1000)), ((4, 129, 776), (776, 336)), ((6, 65, 200), (6, 200, 96))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shapes", GPU_SHAPES, ids=["odd_m", "folded_batch", "bmm"])
def test_gpu_plain_matmuls_match_eager(shapes, dtype):
    a, b = (_randn(*s, dtype=dtype, seed=i).cuda() for i, s in enumerate(shapes))
    f = minicomp.compile(lambda x, y: x @ y)
    out = f(a, b)
    gen = f._need().generated
    assert gen.library and not gen.kernels and not gen.fallbacks
    torch.testing.assert_close(out, a @ b, **tol(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_shape", [(2048, 768), (3, 100, 768)], ids=["2d", "3d"])
def test_gpu_linear_with_bias_matches_eager(x_shape, dtype):
    x = _randn(*x_shape, dtype=dtype).cuda()
    w, b = _randn(50256, 768, dtype=dtype, seed=1).cuda(), _randn(50256, dtype=dtype, seed=2).cuda()
    f = minicomp.compile(lambda x, w, b: F.linear(x, w, b))
    out = f(x, w, b)
    gen = f._need().generated
    assert list(gen.library.values()) == [library.BIAS] and not gen.kernels
    torch.testing.assert_close(out, F.linear(x, w, b), **tol(dtype))


@pytest.mark.gpu
def test_gpu_symbolic_m_linear_matches_eager_at_every_length():
    w, b = _randn(1000, 512, dtype=torch.bfloat16, seed=1).cuda(), _randn(1000, dtype=torch.bfloat16).cuda()
    f = minicomp.compile(lambda x, w, b: F.linear(x, w, b), dynamic=True)
    for s in (7, 130, 1025):
        x = _randn(2, s, 512, dtype=torch.bfloat16, seed=s).cuda()
        torch.testing.assert_close(f(x, w, b), F.linear(x, w, b), **tol(torch.bfloat16))
    assert f._need().graph.symbolic and f._need().generated.library


@pytest.fixture
def tf32_switch():
    old = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.gpu
@pytest.mark.parametrize("allow", [False, True], ids=["ieee", "tf32"])
def test_gpu_fp32_follows_the_tf32_switch_both_ways(allow, tf32_switch):
    """The one module, run under either switch, gives eager's answer under that switch: the
    two answers differ (K = 4096: TF32 rounds the inputs to 10 bits), ours matches each."""
    a, b = _randn(1024, 4096).cuda(), _randn(4096, 1024, seed=1).cuda()
    f = minicomp.compile(lambda x, y: x @ y)
    torch.backends.cuda.matmul.allow_tf32 = not allow
    f(a, b)
    call = f._need().call                       # the module compiled under the other switch
    torch.backends.cuda.matmul.allow_tf32 = allow
    (out,) = call(a, b)
    want = a @ b
    torch.backends.cuda.matmul.allow_tf32 = not allow
    other = a @ b
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    # TF32 keeps 10 mantissa bits: over K = 4096 the two answers differ by ~1e-3 of their size
    # (4.4e-5 on values of ~0.05 on the H200), far above fp32's rounding
    assert (want - other).abs().max() > 1e-4 * want.abs().max()


@pytest.mark.gpu
def test_gpu_cublas_lines_replay_inside_a_cuda_graph():
    # N = 336: fp32 rows of a whole number of 16 bytes, which cuBLAS takes (`library._aligned`)
    w, b = _randn(336, 256, seed=1).cuda(), _randn(336, seed=2).cuda()
    f = minicomp.compile(lambda x, w, b: F.linear(x, w, b), mode="reduce-overhead")
    for i in range(5):
        x = _randn(100, 256, seed=10 + i).cuda()
        torch.testing.assert_close(f(x, w, b), F.linear(x, w, b), **tol(torch.float32))
    assert f._need().generated.library
    status = f.cuda_graphs
    assert status.reason is None and status.captures == 1 and status.replays >= 3, status.describe()


# ---------------------------------------------------------------- few rows: cuBLAS, then the epilogue's kernel
# (in a module replayed as CUDA graphs, mode="reduce-overhead": `Target.graphs`, where
# MINICOMP_GRAPH_FEW_ROWS=1 asks for it at any rows, `Target.graph_few_rows` "on"; by default
# from library_plan.GRAPH_LIBRARY_ROWS rows on)

SM90_GRAPHS = replace(SM90, graphs=True, graph_few_rows="on")

SMALL_CASES = {      # few rows over a long K: the weights' read is the work, cuBLAS spreads it
    "swiglu": (lambda x, w1, w2: F.silu(x @ w1) * (x @ w2), [(16, 1024), (1024, 40), (1024, 40)]),
    "residual": (lambda x, w, r: r + x @ w, [(2, 8, 1024), (1024, 24), (2, 8, 24)]),
    "bias_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), [(1, 1104), (24, 1104), (24,)]),
    # the residual add joins the next norm's row kernel (a decoder layer's o_proj / down_proj)
    "residual_norm": (lambda x, w, r, g: F.rms_norm(r + x @ w, (24,), g, 1e-6),
                      [(3, 1024), (1024, 24), (3, 24), (24,)]),
}
SMALL_KERNELS = {"swiglu": ["pw_silu_mul"], "residual": ["pw_add"], "bias_gelu": ["pw_gelu"],
                 "residual_norm": ["red_add"]}


def _run_interpreted(generated, inputs, monkeypatch):
    """Run a CUDA module on CPU tensors: its cuBLAS lines are PyTorch, its kernels run under
    Triton's interpreter (launched plainly; autotuners take their first config untimed)."""
    from minicomp.runtime import launcher
    monkeypatch.setattr(launcher, "tune_bench", lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0])
    ns: dict = {"__name__": "minicomp_library_test"}
    exec(compile(generated.source, "<generated>", "exec"), ns)
    ns["DEVICE_TYPE"] = "cpu"
    ns["CONSTANTS"][:] = generated.constants
    ns["OPAQUE"][:] = generated.opaque
    ns["_launch"] = lambda kernel, grid, *args, _site=None, **kwargs: kernel[grid](*args, **kwargs)
    ns["_sm_count"] = lambda device: 4          # a persistent (TMA) GEMM's grid: a few programs
    return ns["run"](*inputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_few_rows_over_a_long_k_call_cublas_and_fuse_what_follows(case, dtype, monkeypatch):
    fn, shapes = SMALL_CASES[case]
    inputs = [_randn(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    c = _generate(fn, inputs, SM90_GRAPHS)
    gen = c.generated
    rows = math.prod(shapes[0][:-1])
    assert gen.fallbacks == {} and gen.library, gen.kernel_names
    assert all(why.startswith(f"cuBLAS: {rows} row") for why in gen.library.values()), gen.library
    # each matmul is a group of its own; what follows is one kernel of ours, no GEMM kernel
    assert len(gen.kernel_names) == len(SMALL_KERNELS[case]), gen.kernel_names
    assert all(k.startswith(f"mc_{want}") for k, want in zip(gen.kernel_names, SMALL_KERNELS[case])), gen.kernel_names
    for gid in gen.library:
        group = c.plan.groups[gid]
        assert [c.graph.node(n).op for n in group.nodes if c.graph.node(n).kind == "gemm"] == ["matmul"]
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, fn(*inputs), **tol(dtype))


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_by_default_few_rows_keep_our_fused_gemm_under_cuda_graphs_too(case, monkeypatch):
    """Unless MINICOMP_GRAPH_FEW_ROWS=1 (`Target.graph_few_rows` "on"), under CUDA graphs a matmul
    of fewer rows than GRAPH_LIBRARY_ROWS stays our GEMM with its epilogue, as in the default mode
    (with PDL it beat the cuBLAS rule on the H100 at 16 rows, session 29)."""
    fn, shapes = SMALL_CASES[case]
    inputs = [_randn(*s, dtype=torch.float16, seed=i) for i, s in enumerate(shapes)]
    target = Target.for_device("cpu", environ={}, graphs=True)
    assert target.graphs and target.graph_few_rows == "auto"
    gen = _generate(fn, inputs, replace(SM90, graphs=True)).generated
    assert gen.library == {} and gen.fallbacks == {}
    assert any(name.startswith("mc_gemm") for name in gen.kernel_names), gen.kernel_names
    for value, want in (("1", "on"), ("0", "off"), ("", "auto"), (" 1 ", "on"), ("yes", "auto")):
        assert Target.for_device("cpu", environ={"MINICOMP_GRAPH_FEW_ROWS": value}, graphs=True).graph_few_rows == want
    if case == "residual":                    # one of them through the interpreter against eager
        (out,) = _run_interpreted(gen, inputs, monkeypatch)
        torch.testing.assert_close(out, fn(*inputs), **tol(torch.float16))


@pytest.mark.parametrize("rows", [library_plan.GRAPH_LIBRARY_ROWS - 1, library_plan.GRAPH_LIBRARY_ROWS])
def test_under_cuda_graphs_few_rows_call_cublas_from_the_threshold_on(rows, monkeypatch):
    """By default ("auto") under CUDA graphs a few-rows matmul calls cuBLAS from
    GRAPH_LIBRARY_ROWS rows on (cuBLAS won at Llama's 2 x 16 and 4 x 16, ours at 1 x 16), its
    residual add then a pointwise kernel of its own; below that, with "off", and in the default
    mode it stays our GEMM with the add in its epilogue. The answer is eager's either way."""
    fn = SMALL_CASES["residual"][0]
    inputs = [_randn(*s, dtype=torch.float16, seed=i)
              for i, s in enumerate([(rows, 1024), (1024, 24), (rows, 24)])]
    calls = rows >= library_plan.GRAPH_LIBRARY_ROWS
    for target, want in ((replace(SM90, graphs=True), calls), (replace(SM90, graphs=True, graph_few_rows="off"), False),
                         (SM90, False), (replace(SM90, graphs=True, graph_few_rows="on"), True)):
        gen = _generate(fn, inputs, target).generated
        assert bool(gen.library) == want, (target.graphs, target.graph_few_rows, gen.library)
        if want:
            assert all(why.startswith("cuBLAS: ") and f"{rows} rows" in why for why in gen.library.values()), gen.library
        assert any(name.startswith("mc_gemm") for name in gen.kernel_names) != want, gen.kernel_names
    (out,) = _run_interpreted(_generate(fn, inputs, replace(SM90, graphs=True)).generated, inputs, monkeypatch)
    torch.testing.assert_close(out, fn(*inputs), **tol(torch.float16))


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_in_the_default_mode_few_rows_fuse_their_epilogue_into_our_gemm(case, monkeypatch):
    """Without CUDA graphs a call at these sizes is host-bound: the few-rows matmul and its
    epilogue are one GEMM kernel of ours (one launch, not cuBLAS and a pointwise kernel), run
    here under the interpreter against eager (in fp16: a CUDA module's bf16 `tl.dot` is not
    upcast, and the interpreter's bf16 dot is wrong, GPU.md)."""
    fn, shapes = SMALL_CASES[case]
    inputs = [_randn(*s, dtype=torch.float16, seed=i) for i, s in enumerate(shapes)]
    c = _generate(fn, inputs)
    gen = c.generated
    assert not SM90.graphs and gen.library == {} and gen.fallbacks == {}
    assert any(name.startswith("mc_gemm") for name in gen.kernel_names), gen.kernel_names
    assert not any(name.startswith(f"mc_{SMALL_KERNELS[case][0]}") for name in gen.kernel_names), gen.kernel_names
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, fn(*inputs), **tol(torch.float16))


def test_mode_reduce_overhead_makes_a_target_of_cuda_graphs():
    from minicomp.api import Options
    assert Target.for_options("cuda", Options(mode="reduce-overhead")).graphs
    assert not Target.for_options("cuda", Options()).graphs


def test_the_planner_says_why_a_few_rows_matmul_keeps_its_epilogue_out():
    fn, shapes = SMALL_CASES["swiglu"]
    c = _generate(fn, [_randn(*s, seed=i) for i, s in enumerate(shapes)], SM90_GRAPHS)
    reasons = [r.reason for r in c.plan.rejected]
    assert any("is a cuBLAS call (16 rows, where reading the weights is the work)" in r for r in reasons), reasons


def test_a_cast_before_a_few_rows_matmul_stays_out_of_its_group(monkeypatch):
    fn = lambda x, w: (x.to(torch.bfloat16) @ w) * 2.0      # noqa: E731
    inputs = [_randn(16, 1024), _randn(1024, 40, dtype=torch.bfloat16, seed=1)]
    c = _generate(fn, inputs, SM90_GRAPHS)
    assert len(c.generated.library) == 1 and not any(k.startswith("mc_gemm") for k in c.generated.kernel_names)
    (out,) = _run_interpreted(c.generated, inputs, monkeypatch)
    torch.testing.assert_close(out, fn(*inputs), **tol(torch.bfloat16))


@pytest.mark.parametrize("shapes", [[(65, 1024), (1024, 40), (1024, 40)],      # more rows than SMALL_ROWS
                                    [(16, 1000), (1000, 40), (1000, 40)]],     # a K under SMALL_MIN_K
                         ids=["many_rows", "short_k"])
def test_more_rows_or_a_short_k_keep_our_fused_kernel(shapes):
    fn = SMALL_CASES["swiglu"][0]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    gen = _generate(fn, inputs, SM90_GRAPHS).generated
    assert gen.library == {} and any(name.startswith("mc_gemm") for name in gen.kernel_names)


def test_few_rows_over_symbolic_sizes_keep_our_kernel():
    x, w1, w2 = _randn(16, 1024), _randn(1024, 40, seed=1), _randn(1024, 40, seed=2)
    f = minicomp.compile(SMALL_CASES["swiglu"][0], dynamic=True)
    c = f.compile_for(x, w1, w2)
    assert c.graph.symbolic
    from minicomp.codegen import generate
    gen = generate(c.graph, c.plan, SM90_GRAPHS)
    assert gen.library == {} and gen.kernel_names


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gpu_few_rows_swiglu_matches_eager(dtype, monkeypatch):
    fn = SMALL_CASES["swiglu"][0]
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w1, w2 = (torch.randn(*s, device="cuda", generator=g).to(dtype) * s[-1] ** -0.5
                 for s in ((16, 2048), (2048, 5632), (2048, 5632)))
    # cuBLAS only under CUDA graphs with MINICOMP_GRAPH_FEW_ROWS=1; our fused GEMM otherwise
    for mode, few_rows, cublas in (("reduce-overhead", "1", True), ("reduce-overhead", "", False),
                                   ("default", "1", False)):
        monkeypatch.setenv("MINICOMP_GRAPH_FEW_ROWS", few_rows)
        f = minicomp.compile(fn, mode=mode)
        for _ in range(2):
            torch.testing.assert_close(f(x, w1, w2), fn(x, w1, w2), **tol(dtype))
        assert bool(f.compile_for(x, w1, w2).generated.library) == cublas, (mode, few_rows)


# ---------------------------------------------------------------- a dual GEMM of many rows: split
# (cuBLAS for one matmul of SwiGLU's pair, our GEMM with the join in its epilogue for the other)

def _swiglu_mlp(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def _swiglu_inputs(lead, k, n, dtype=torch.float32):
    return [_randn(*lead, k, dtype=dtype), _randn(n, k, dtype=dtype, seed=1), _randn(n, k, dtype=dtype, seed=2)]


NO_JOINS = replace(SM90, library_joins=False)
JOINS = replace(SM90, join_min_flop=0)      # the tests' GEMMs are far under Target.join_min_flop


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("lead", [(600,), (2, 300)], ids=["2d", "3d"])
def test_a_dual_gemm_of_many_rows_calls_cublas_for_both_and_joins_in_one_kernel(lead, dtype, monkeypatch):
    """SwiGLU at prefill rows: cuBLAS computes the gate (one matmul of the pair) and the up
    projection (its result meets SiLU(gate), a tile of its own size); SiLU and the product are
    one pointwise kernel, torch.compile's plan."""
    inputs = _swiglu_inputs(lead, 64, 40, dtype)
    c = _generate(_swiglu_mlp, inputs, JOINS)
    gen = c.generated
    assert sorted(gen.library.values()) == sorted([library_plan.SPLIT.format(m="600 rows"),
                                                    library_plan.JOIN.format(m="600 rows")]), gen.library
    assert len(gen.kernel_names) == 1 and gen.kernel_names[0].startswith("mc_pw_silu_mul"), gen.kernel_names
    table = c.plan.table(library=gen.library)
    assert "calls cuBLAS: one matmul of a dual GEMM over 600 rows" in table
    assert "calls cuBLAS: its result meets a tile of its own size over 600 rows" in table
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, _swiglu_mlp(*inputs), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_without_library_joins_the_partner_is_our_gemm_with_the_join_in_its_epilogue(dtype, monkeypatch):
    """MINICOMP_LIBRARY_JOINS=0: cuBLAS for the gate only, our GEMM for the up projection with
    SiLU of cuBLAS's result and the product in its epilogue (the plan before session 19)."""
    inputs = _swiglu_inputs((600,), 64, 40, dtype)
    assert not Target.for_device("cuda", {"MINICOMP_LIBRARY_JOINS": "0"}).library_joins
    c = _generate(_swiglu_mlp, inputs, NO_JOINS)
    gen = c.generated
    (gid,) = gen.library
    assert gen.library[gid] == library_plan.SPLIT.format(m="600 rows"), gen.library
    (ours,) = [g for g in c.plan.groups if g.kind == "gemm" and g.id != gid]
    ops = sorted(c.graph.node(n).op for n in ours.nodes if c.graph.node(n).kind != "view")
    assert ops == ["matmul", "mul", "silu"], ops          # SiLU of cuBLAS's result, in our epilogue
    assert [k for k in gen.kernel_names if not k.startswith("mc_gemm")] == [], gen.kernel_names
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, _swiglu_mlp(*inputs), **tol(dtype))


def _pre_norm_layer(x, wq, wo, wg, wu, wd, g):
    """A Llama-shaped layer: RMSNorm, a projection back with the residual, SwiGLU with the residual."""
    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    h = x + F.linear(F.relu(F.linear(rms(x), wq)), wo)
    return h + F.linear(F.silu(F.linear(rms(h), wg)) * F.linear(rms(h), wu), wd)


@pytest.mark.parametrize("rows", [600, 64])
def test_a_residual_gemm_of_many_rows_calls_cublas_and_the_add_joins_the_norm(rows, monkeypatch):
    """At prefill rows each GEMM whose result meets a tile (the residual adds, SwiGLU's up) is
    cuBLAS's and the add runs in the next norm's row kernel; at few rows (default mode) our
    GEMMs keep the residual in their epilogue. Both match eager on CPU tensors. Under the default
    `join_min_flop` these small GEMMs all keep our kernel."""
    w = 32
    shapes = [(rows, w), (48, w), (w, 48), (64, w), (64, w), (w, 64), (w,)]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    c = _generate(_pre_norm_layer, inputs, JOINS)
    gen = c.generated
    joins = [why for why in gen.library.values() if why == library_plan.JOIN.format(m=f"{rows} rows")]
    if rows == 600:
        assert len(joins) == 3, gen.library                      # o, up, down
        assert any(k.startswith("mc_red_add_") for k in gen.kernel_names), gen.kernel_names
        assert not any(k.startswith("mc_gemm") and "residual" in k for k in gen.kernel_names), gen.kernel_names
    else:
        assert joins == [] and any("residual" in k for k in gen.kernel_names), gen.kernel_names
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, _pre_norm_layer(*inputs), **tol(torch.float32))
    small = _generate(_pre_norm_layer, inputs).generated
    assert library_plan.JOIN.format(m=f"{rows} rows") not in small.library.values(), small.library


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("residual", ["contiguous", "transposed", "broadcast_rows"])
def test_a_residual_join_reads_its_tile_as_eager_does(residual, dtype, monkeypatch):
    """The residual of a joined GEMM in each dtype, contiguous or read through a transpose (a
    tile of the result's shape either way: cuBLAS computes the matmul, the add fuses forward),
    or broadcast over the rows (not a tile: our GEMM keeps the add in its epilogue); every
    plan matches eager, then a LayerNorm as a model has it after the residual."""
    def block(x, w, b, r, g):
        return F.layer_norm(F.linear(x, w, b) + r, (48,), g)
    x, w, b, g = _randn(3, 200, 32, dtype=dtype), _randn(48, 32, seed=1, dtype=dtype), \
        _randn(48, seed=2, dtype=dtype), _randn(48, seed=4, dtype=dtype)
    r = {"contiguous": _randn(3, 200, 48, seed=3, dtype=dtype),
         "transposed": _randn(3, 48, 200, seed=3, dtype=dtype).transpose(1, 2),
         "broadcast_rows": _randn(1, 1, 48, seed=3, dtype=dtype)}[residual]
    inputs = [x, w, b, r, g]
    gen = _generate(block, inputs, JOINS).generated
    joined = residual != "broadcast_rows"
    assert (list(gen.library.values()) == [library_plan.JOIN.format(m="600 rows")]) == joined, gen.library
    assert any(k.startswith("mc_gemm") for k in gen.kernel_names) != joined, gen.kernel_names
    if dtype == torch.bfloat16 and not joined:
        # a CUDA module's own GEMM kernel dots bf16 tiles as they are, which Triton's interpreter
        # cannot (the CPU target widens them first; its answer is checked below); the GPU tests
        # and the zoo in bf16 run such kernels on the device
        f = minicomp.compile(block)
        torch.testing.assert_close(f(*inputs), block(*inputs), **tol(dtype))
        return
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, block(*inputs), **tol(dtype))


def test_a_result_that_only_meets_itself_is_not_a_join():
    """GPT-2's tanh GELU multiplies values that all come from the matmul: no tile is loaded, our
    GEMM keeps the epilogue. A bias add (addmm's) and a row regrouping are looked through."""
    def gelu_mlp(x, w, b):
        h = F.linear(x, w, b)
        return 0.5 * h * (1.0 + torch.tanh(0.79788456 * (h + 0.044715 * h.pow(3))))
    inputs = [_randn(2, 300, 32), _randn(48, 32, seed=1), _randn(48, seed=2)]
    gen = _generate(gelu_mlp, inputs, JOINS).generated
    assert gen.library == {} and gen.kernel_names[0].startswith("mc_gemm"), gen.kernel_names
    with_residual = _generate(lambda x, w, b, r: F.linear(x, w, b) + r, inputs + [_randn(2, 300, 48, seed=3)],
                              JOINS).generated
    assert list(with_residual.library.values()) == [library_plan.JOIN.format(m="600 rows")], with_residual.library


@pytest.mark.parametrize("lead", [(511,), (2, 8)], ids=["under_the_rows", "few_rows"])
def test_a_dual_gemm_of_fewer_rows_stays_one_kernel(lead):
    gen = _generate(_swiglu_mlp, _swiglu_inputs(lead, 64, 40)).generated
    assert gen.library == {} and len(gen.kernel_names) == 1 and gen.kernel_names[0].startswith("mc_gemm_swiglu")


def test_the_dual_gemm_switch_keeps_the_pair_fused(monkeypatch):
    """MINICOMP_DUAL_GEMM=fused: one kernel of ours for the pair, even where the up projection
    would otherwise join (its result meets SiLU(gate), a tile of its own size)."""
    monkeypatch.setenv("MINICOMP_DUAL_GEMM", "fused")
    target = replace(Target.for_device("cuda"), capability=(9, 0), join_min_flop=0)
    assert not target.split_dual and target.library_joins
    gen = _generate(_swiglu_mlp, _swiglu_inputs((600,), 64, 40), target).generated
    assert gen.library == {} and gen.kernel_names[0].startswith("mc_gemm_swiglu")


def test_a_pair_without_a_join_or_of_other_shapes_is_not_split():
    x = _randn(600, 64)
    w1, w2, w3 = _randn(40, 64, seed=1), _randn(40, 64, seed=2), _randn(24, 64, seed=3)
    # q/k/v-like projections of one x, each used alone: plain cuBLAS calls, not a pair
    gen = _generate(lambda x, a, b: (F.linear(x, a), F.linear(x, b)), [x, w1, w2]).generated
    assert set(gen.library.values()) == {library.PLAIN}
    gen = _generate(lambda x, a, b: F.linear(x, a)[:, :24] * F.linear(x, b), [x, w1, w3]).generated
    assert library_plan.SPLIT.format(m="600 rows") not in gen.library.values()


@pytest.mark.parametrize("joins", [False, True], ids=["split", "joined"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_an_aten_shaped_swiglu_splits_through_its_reshapes(dtype, joins, monkeypatch):
    """The backend's graph writes each linear as view -> mm -> view: the pair's join is found
    through the reshapes, and so is the up projection's meeting with SiLU(gate) (a row
    regrouping is looked through); either plan gives eager's answer."""
    def mlp(x, wg, wu):
        rows = x.reshape(-1, x.shape[-1])
        gate = (rows @ wg.t()).reshape(*x.shape[:-1], -1)
        up = (rows @ wu.t()).reshape(*x.shape[:-1], -1)
        return F.silu(gate) * up
    inputs = _swiglu_inputs((2, 300), 64, 40, dtype)
    c = _generate(mlp, inputs, JOINS if joins else NO_JOINS)
    want = [library_plan.SPLIT.format(m="600 rows")] + ([library_plan.JOIN.format(m="600 rows")] if joins else [])
    assert sorted(c.generated.library.values()) == sorted(want), c.generated.library
    (out,) = _run_interpreted(c.generated, inputs, monkeypatch)
    torch.testing.assert_close(out, mlp(*inputs), **tol(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("joins", ["1", "0"])
def test_gpu_split_swiglu_matches_eager(dtype, joins, monkeypatch):
    """SwiGLU at prefill sizes on the GPU (and an N no tile divides). At 4 x 512 tokens, width 2048,
    hidden 5632 (47 GFLOP, over `Target.join_min_flop`) cuBLAS computes the gate and the up
    projection and one pointwise kernel the join; at 4 x 256, width 1024, hidden 2816, or with
    MINICOMP_LIBRARY_JOINS=0, our GEMM computes the up projection with SiLU(gate) * up in its epilogue."""
    monkeypatch.setenv("MINICOMP_LIBRARY_JOINS", joins)
    for lead, k, n in [((4, 512), 2048, 5632), ((4, 512), 2048, 5000), ((4, 256), 1024, 2816), ((4, 256), 1024, 1000)]:
        x, wg, wu = (t.cuda() for t in _swiglu_inputs(lead, k, n, dtype))
        f = minicomp.compile(_swiglu_mlp)
        torch.testing.assert_close(f(x, wg, wu), _swiglu_mlp(x, wg, wu), **tol(dtype))
        gen = f._need().generated
        rows = f"{math.prod(lead)} rows"
        joined = joins == "1" and k == 2048
        want = [library_plan.SPLIT.format(m=rows)] + ([library_plan.JOIN.format(m=rows)] if joined else [])
        assert sorted(gen.library.values()) == sorted(want), gen.library
        kind = "mc_pw" if joined else "mc_gemm"
        assert len(gen.kernel_names) == 1 and gen.kernel_names[0].startswith(kind), gen.kernel_names


def test_a_llama_at_batch_1_x_16_fuses_around_its_cublas_projections(monkeypatch):
    """transformers' Llama as users call it, at decode-like size (1 x 16 tokens, width 1024):
    every projection is its own cuBLAS group, each residual add joins the next RMSNorm's row
    kernel and SwiGLU's silu and product are one kernel; the module matches eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval().requires_grad_(False)
    ids = torch.randint(0, 256, (1, 16))
    fn = lambda ids: model(input_ids=ids).logits      # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(fn, [ids])
        weights = g.binding.read()
        gen = compile_graph(g, [ids, *weights], device="cuda", load=False, target=SM90_GRAPHS).generated
    assert len(gen.library) == 2 * 7 + 1, gen.library      # q k v o gate up down per layer, the lm_head
    kinds = [name.split("_")[1] + "_" + name.split("_")[2] for name in gen.kernel_names]
    assert kinds.count("red_add") >= 2 and "pw_silu" in kinds, gen.kernel_names
    assert not any(name.startswith("mc_gemm") for name in gen.kernel_names), gen.kernel_names
    (out,) = _run_interpreted(gen, [ids, *weights], monkeypatch)
    torch.testing.assert_close(out, fn(ids), **tol(torch.float32))


# ---------------------------------------------------------------- library="all": cuBLAS for every GEMM

def test_library_all_sends_every_gemm_to_cublas_and_fuses_what_follows(monkeypatch):
    """A post-norm encoder layer as BERT writes it, at a prefill size: in mode "all" each linear
    is cuBLAS (its bias by addmm), the residual add joins the LayerNorm's row kernel; the module
    run on CPU tensors matches eager. The default mode keeps our fused GEMM kernels there."""
    def layer(x, w1, b1, w2, b2, g, beta):
        h = F.gelu(F.linear(x, w1, b1))
        return F.layer_norm(x + F.linear(h, w2, b2), (48,), g, beta)
    shapes = [(2, 40, 48), (96, 48), (96,), (48, 96), (48,), (48,), (48,)]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    every = replace(Target.for_device("cuda", {}, library="all"), capability=(9, 0))
    assert every.library_gemm and every.library_all
    c = _generate(layer, inputs, every)
    gen = c.generated
    assert list(gen.library.values()) == [library_plan.ALL] * 2, gen.library
    assert len(gen.kernel_names) == 2 and not any(k.startswith("mc_gemm") for k in gen.kernel_names)
    assert any(k.startswith("mc_red_add_layernorm") for k in gen.kernel_names), gen.kernel_names
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, layer(*inputs), **tol(torch.float32))
    default = _generate(layer, inputs).generated
    assert any(k.startswith("mc_gemm") for k in default.kernel_names), default.kernel_names


def test_the_library_mode_comes_from_the_option_or_the_environment():
    assert Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "all"}).library_all
    assert not Target.for_device("cuda", {}).library_all
    off = Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "all"}, library="off")
    assert not off.library_gemm and not off.library_all
    with pytest.raises(minicomp.errors.MinicompError, match="library='some'"):
        minicomp.compile(lambda x: x, library="some")
    f = minicomp.compile(lambda a, b: a @ b, library="all")     # the CPU target runs our kernels
    a, b = _randn(5, 32), _randn(32, 8, seed=1)
    torch.testing.assert_close(f(a, b), a @ b, **tol(torch.float32))
    assert f.compile_for(a, b).generated.library == {}


ZOO_ALL = [("llama", "eager", "left_pad"), ("mistral", "sdpa", "left_pad"), ("qwen3", "sdpa", "plain"),
           ("gemma2", "eager", "plain"), ("phi3", "eager", "plain"), ("gpt_neox", "sdpa", "plain"),
           ("falcon", "sdpa", "left_pad"), ("opt", "eager", "plain"), ("gpt2", "eager", "left_pad"),
           ("bert", "sdpa", "plain"), ("distilbert", "eager", "plain")]


@pytest.mark.parametrize("name,attn,kind", ZOO_ALL, ids=["-".join(c) for c in ZOO_ALL])
def test_zoo_models_with_every_gemm_through_cublas_match_eager(name, attn, kind, monkeypatch):
    """Real models through library mode "all" (the zoo's tiny configs, own capture): each
    family's projections and MLPs split into cuBLAS groups with their epilogues fused forward
    (GPT-2's Conv1D addmm, Falcon's multi-query, OPT's and BERT's post-norm...); the CUDA module,
    run on CPU tensors, matches eager on the positions that mean something."""
    from zoo_models import zoo
    z = zoo()[name]
    model = z.model(attn)
    kw, valid = z.inputs(kind, model)
    keys = list(kw)
    fn = lambda *args: getattr(model(**dict(zip(keys, args))), z.output)     # noqa: E731
    args = [kw[k] for k in keys]
    every = replace(Target.for_device("cuda", {}, library="all"), capability=(9, 0))
    with torch.no_grad():
        g = capture(fn, args)
        weights = g.binding.read()
        gen = compile_graph(g, [*args, *weights], device="cuda", load=False, target=every).generated
        (out,) = _run_interpreted(gen, [*args, *weights], monkeypatch)
        want = fn(*args)
    assert gen.library and not any(k.startswith("mc_gemm") for k in gen.kernel_names), gen.kernel_names
    torch.testing.assert_close(out[valid], want[valid], **tol(torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "reduce-overhead, few rows cuBLAS"])
def test_gpu_a_llama_at_batch_1_x_16_matches_eager(mode, monkeypatch):
    """The few-rows plan on the GPU: our GEMM where an epilogue fuses, in both modes; under CUDA
    graphs with MINICOMP_GRAPH_FEW_ROWS=1, cuBLAS for every projection and the residual adds in
    the norms' kernels (fp32, eager's cuBLAS precision)."""
    few_rows_cublas = mode == "reduce-overhead, few rows cuBLAS"
    if few_rows_cublas:
        monkeypatch.setenv("MINICOMP_GRAPH_FEW_ROWS", "1")
        mode = "reduce-overhead"
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                                   num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").cuda().eval()
    model.requires_grad_(False)
    fn = lambda ids: model(input_ids=ids).logits      # noqa: E731
    f = minicomp.compile(fn, mode=mode)
    for step in range(4):
        ids = torch.randint(0, 1024, (1, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(step))
        torch.testing.assert_close(f(ids), fn(ids), **tol(torch.float32))
    gen = f.compile_for(ids).generated
    if few_rows_cublas:                # replayed as graphs: cuBLAS for all 7 projections a layer and lm_head,
        assert len(gen.library) == 2 * 7 + 1, gen.library          # the residual adds in the norms' kernels
        assert any(k.startswith("mc_red_add_rmsnorm") for k in gen.kernel_names), gen.kernel_names
    else:                              # cuBLAS only where nothing fuses, our GEMM with its epilogue
        assert 0 < len(gen.library) < 2 * 7 + 1, gen.library          # (the residual add) else
        assert all(why.startswith("cuBLAS: nothing to fuse") for why in gen.library.values()), gen.library
        assert any(k.startswith("mc_gemm") and "residual" in k for k in gen.kernel_names), gen.kernel_names


def test_a_decode_step_over_a_symbolic_past_plans_its_one_row_projections_for_cublas(monkeypatch):
    """One token against a growing K/V past (dynamic=True: the past length is a symbol, the
    token's rows are not): every projection is a 1-row cuBLAS group, the residual adds and
    silu fuse forward, and the module serves two past lengths against eager."""
    from minicomp.codegen import generate
    from minicomp.plan import assign_layout, plan_graph
    d, heads = 1024, 8
    torch.manual_seed(0)
    wq, wk, wv, wo = (torch.randn(d, d) * d ** -0.5 for _ in range(4))
    w1, w2 = torch.randn(2816, d) * d ** -0.5, torch.randn(d, 2816) * 2816 ** -0.5

    def step(x, k_past, v_past):
        b, t, _ = x.shape
        q = F.linear(x, wq).view(b, t, heads, d // heads).transpose(1, 2)
        k = torch.cat([k_past, F.linear(x, wk).view(b, t, heads, d // heads).transpose(1, 2)], 2)
        v = torch.cat([v_past, F.linear(x, wv).view(b, t, heads, d // heads).transpose(1, 2)], 2)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        h = x + F.linear(a, wo)
        return h + F.linear(F.silu(F.linear(F.rms_norm(h, (d,)), w1)), w2), k, v

    f = minicomp.compile(step, dynamic=True)
    args = [torch.randn(1, 1, d), torch.randn(1, heads, 5, d // heads), torch.randn(1, heads, 5, d // heads)]
    c = f.compile_for(*args)
    assert c.graph.symbolic
    plan = plan_graph(c.graph, library=library_plan.planned(c.graph, SM90_GRAPHS))
    gen = generate(assign_layout(c.graph, plan), plan, SM90_GRAPHS)
    assert len(gen.library) == 6 and all(why == library_plan.FEW.format(m="1 row") for why in gen.library.values())
    assert not any(k.startswith("mc_gemm") for k in gen.kernel_names), gen.kernel_names
    for past in (5, 9):
        args = [torch.randn(1, 1, d), torch.randn(1, heads, past, d // heads), torch.randn(1, heads, past, d // heads)]
        _, tensors, weights = f._find(tuple(args))
        outs = _run_interpreted(gen, [*tensors, *weights], monkeypatch)
        for got, want in zip(outs, step(*args)):
            torch.testing.assert_close(got, want, **tol(torch.float32))


def test_a_linear_viewed_back_to_its_rows_calls_cublas_then_views():
    """`addmm(b, x.view(-1, k), w).view(*lead, n)` (GPT-2's Conv1D) with nothing else to fuse:
    the view after it joins the group, and the library writes addmm, then the view."""
    fn = lambda x, w, b: torch.addmm(b, x.view(-1, 32), w).view(2, 7, 24)    # noqa: E731
    inputs = [_randn(2, 7, 32), _randn(32, 24, seed=1), _randn(24, seed=2)]
    gen = _generate(fn, inputs).generated
    assert list(gen.library.values()) == [library.BIAS] and not gen.kernels, gen.kernel_names
    body = gen.source[gen.source.index("def run("):]
    assert body.index("torch.addmm(") < body.index(".reshape((2, 7, 24))"), body
    torch.testing.assert_close(_run_on_cpu(gen, inputs)[0], fn(*inputs), **tol(torch.float32))


def test_a_few_rows_conv1d_keeps_its_view_and_fuses_the_gelu_after_it(monkeypatch):
    """GPT-2's Conv1D at one token (addmm over the flattened rows, viewed back, then gelu): the
    cuBLAS group holds the addmm and the view; the gelu is the next kernel; eager's answer."""
    def fn(x, w, b):
        h = torch.addmm(b, x.view(-1, 1024), w).view(1, 3, 48)
        return F.gelu(h, approximate="tanh")
    inputs = [_randn(1, 3, 1024), _randn(1024, 48, seed=1), _randn(48, seed=2)]
    gen = _generate(fn, inputs, SM90_GRAPHS).generated
    assert list(gen.library.values()) == [library_plan.FEW_BIAS.format(m="3 rows")], gen.library
    assert len(gen.kernel_names) == 1 and gen.kernel_names[0].startswith("mc_pw_gelu"), gen.kernel_names
    (out,) = _run_interpreted(gen, inputs, monkeypatch)
    torch.testing.assert_close(out, fn(*inputs), **tol(torch.float32))


def test_a_linear_result_is_not_relaid_and_has_the_layout_its_readers_expect():
    """F.linear returns a fresh row-major tensor (matmul folds A's rows into one mm, copying a
    strided A first), so its result goes on without `_as_layout`: over a dense and over a
    transposed A the results are row-major (the layout the graph gives them) and match eager."""
    lin = torch.nn.Linear(48, 40, bias=False)
    x = _randn(3, 5, 48)

    def fn(x):
        return lin(x), lin(x.transpose(0, 1))

    c = _generate(fn, [x])
    lines = c.generated.source.splitlines()
    calls = [i for i, line in enumerate(lines) if "torch.nn.functional.linear(" in line]
    assert len(calls) == 2 and not any("_as_layout(" in lines[i + 1] for i in calls)
    with torch.no_grad():
        got, want = _run_on_cpu(c.generated, [x, lin.weight]), fn(x)
    for a, b in zip(got, want):
        assert a.is_contiguous()
        torch.testing.assert_close(a, b, **tol(torch.float32))

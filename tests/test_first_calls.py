"""cuBLAS answers a slow-shaped GEMM's first calls while our kernel compiles (codegen/first_calls.py,
`Target.library_first`, on unless $MINICOMP_LIBRARY_FIRST=0).

The module is generated for sm_90 without a GPU; its text says which form runs when, and its
cuBLAS branch runs here on CPU tensors (the kernel marked as still compiling) against eager."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from library_testing import generate_quietly

from minicomp.codegen import first_calls
from minicomp.runtime import launcher
from minicomp.target import Target

FIRST = Target("cuda", (9, 0))                      # library_first is on by default
SM90 = replace(FIRST, library_first=False)          # MINICOMP_LIBRARY_FIRST=0

CASES = {      # GEMMs our kernel computes because cuBLAS is slow on them, as eager calls them
    "lm_head": (lambda x, w: F.linear(x, w), [(2, 9, 64), (1003, 64)], "torch.nn.functional.linear("),
    "lm_head_bias": (lambda x, w, b: F.linear(x, w, b), [(9, 64), (1003, 64), (1003,)], "torch.nn.functional.linear("),
    "odd_k": (lambda a, b: a @ b, [(33, 1023), (1023, 64)], "torch.matmul("),
    "odd_k_transposed_a": (lambda a, b: a.t() @ b, [(1023, 40), (1023, 64)], "torch.matmul("),
}


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


def _cublas_branch(gen, inputs, tmp_path):
    """Run the CUDA module on CPU tensors with each kernel marked as compiling in the background:
    call() takes the library's branch (and would fail on the kernel's launch otherwise). The
    module is imported from a file: a Gluon kernel's decorator reads its source from one."""
    path = tmp_path / "first_calls_module.py"
    path.write_text(gen.source)
    spec = importlib.util.spec_from_file_location("minicomp_first_calls_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ns = module.__dict__
    ns["DEVICE_TYPE"] = "cpu"
    ns["CONSTANTS"][:], ns["OPAQUE"][:] = gen.constants, gen.opaque
    ns["_WARM"][:], ns["_LATER"][:] = [], []        # nothing to compile here
    kernels = [ns[name] for name in gen.kernel_names]
    for k in kernels:
        launcher._BACKGROUND[k] = "pending"
    try:
        return ns["call"](*inputs)
    finally:
        for k in kernels:
            launcher._BACKGROUND.pop(k, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cublas_answers_until_the_kernel_has_compiled(case, dtype, tmp_path):
    fn, shapes, call = CASES[case]
    inputs = [_randn(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    gen = generate_quietly(fn, inputs, FIRST).generated
    (kernel,) = gen.kernel_names
    run = gen.source[gen.source.index("\ndef run("):]
    assert f"    if _rt.compiled({kernel}):\n        _launch({kernel}," in run
    assert "    else:  # cuBLAS answers until then\n" in run and call in run.split("else:  # cuBLAS")[1]
    assert "if _WARM or _LATER:" in run
    warm = gen.source[gen.source.index("_WARM = ["):gen.source.index("_LATER = [")]
    later = gen.source[gen.source.index("_LATER = ["):gen.source.index("\n]", gen.source.index("_LATER = ["))]
    assert f"({kernel}," not in warm and f"({kernel}," in later   # compiled in the background, not before the call
    (got,) = _cublas_branch(gen, inputs, tmp_path)
    want = fn(*[t.double() for t in inputs]).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert got.shape == want.shape and got.stride() == want.contiguous().stride()


def test_on_by_default_off_by_its_switch_and_only_for_what_cublas_computes_alone():
    fn, shapes, _ = CASES["lm_head"]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    off = generate_quietly(fn, inputs, SM90).generated.source
    assert "_rt.compiled(" not in off and "_LATER" not in off.split("\ndef run(")[1]
    # an epilogue cuBLAS does not compute: the kernel compiles before the first call as before
    gelu = generate_quietly(lambda x, w: F.gelu(F.linear(x, w)), inputs, FIRST).generated.source
    assert "_rt.compiled(" not in gelu and "cuBLAS answers" not in gelu
    # the CPU target never: its kernels run under the interpreter
    cpu = generate_quietly(fn, inputs, replace(Target("cpu"), library_first=True)).generated.source
    assert "_rt.compiled(" not in cpu
    assert Target.for_device("cpu", environ={}).library_first
    assert not Target.for_device("cpu", environ={"MINICOMP_LIBRARY_FIRST": "0"}).library_first
    assert first_calls.WHY in generate_quietly(fn, inputs, FIRST).generated.source


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("hopper", ["", "1"], ids=["block_language", "gluon_tiered"])
def test_sdpa_answers_an_attention_until_its_kernel_has_compiled(hopper, tmp_path):
    """A small attention (the block-language kernel: SDPA's dispatch costs more host time) and
    one the Gluon kernel takes (MINICOMP_HOPPER_ATTENTION=1): SDPA answers until the kernel has
    compiled, and the Gluon kernel's block-language stand-in is neither launched nor written."""
    q, k, v = (_randn(2, 4, 128, 64, dtype=torch.bfloat16, seed=i) for i in range(3))
    target = replace(FIRST, hopper_attention=hopper)
    gen = generate_quietly(_sdpa, [q, k, v], target).generated
    (kernel,) = gen.kernel_names
    assert ("hopper" in kernel) == (hopper == "1")
    run = gen.source[gen.source.index("\ndef run("):]
    assert f"    if _rt.compiled({kernel}):\n        _launch({kernel}," in run
    assert "else:  # SDPA answers until then" in run and "scaled_dot_product_attention(" in run.split("else:")[1]
    assert run.count("_launch(") == 1
    if hopper:
        assert "mc_attn_causal" not in gen.source and "gluon.jit(attn_fwd_hopper)" in gen.source
    (got,) = _cublas_branch(gen, [q, k, v], tmp_path)
    torch.testing.assert_close(got, _sdpa(q.float(), k.float(), v.float()).bfloat16(), **tol(torch.bfloat16))
    off = generate_quietly(_sdpa, [q, k, v], replace(SM90, hopper_attention=hopper)).generated.source
    assert "SDPA answers" not in off


def test_the_kernels_compiled_later_pass_the_gpu_true_check():
    """The kernels moved to `_LATER` are still compiled for sm_90 by the GPU-true check (a
    kernel Triton rejects would become a visible fallback, not a background failure)."""
    checked = replace(FIRST, verify_arch=90, verify_depth="sampled")
    fn, shapes, _ = CASES["lm_head"]
    gemm = generate_quietly(fn, [_randn(*s, dtype=torch.bfloat16, seed=i) for i, s in enumerate(shapes)], checked)
    assert not gemm.generated.fallbacks and "_LATER = [" in gemm.generated.source
    q, k, v = (_randn(2, 4, 128, 64, dtype=torch.bfloat16, seed=i) for i in range(3))
    attn = generate_quietly(_sdpa, [q, k, v], checked)
    assert not attn.generated.fallbacks and "_LATER = [" in attn.generated.source


GPU_CASES = {      # through the api as users call it: our kernel computes each, cuBLAS or SDPA answers first
    "lm_head": (lambda x, w: F.linear(x, w), [(4, 33, 256), (50257, 256)]),
    "odd_k": (lambda a, b: a @ b, [(1024, 1023), (1023, 1024)]),
    "attention": (_sdpa, [(2, 4, 128, 64)] * 3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_the_library_answers_first_then_the_kernel(case, monkeypatch):
    """The default: the first call's answer comes from the library, and once the background
    compile has finished the kernel's does; both match eager."""
    import minicomp
    monkeypatch.setenv("MINICOMP_LIBRARY_FIRST", "1")
    fn, shapes = GPU_CASES[case]
    inputs = [_randn(*s, dtype=torch.bfloat16, seed=i).cuda() for i, s in enumerate(shapes)]
    want = fn(*inputs)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(*inputs), want, **tol(torch.bfloat16))
    assert "answers until then" in f.source
    assert minicomp.wait_compiled(600)
    c = f._need()
    module = c.call.module
    kernels = [getattr(module, name) for name in c.generated.kernel_names]
    assert kernels and all(module._rt.compiled(k) for k in kernels)
    torch.testing.assert_close(f(*inputs), want, **tol(torch.bfloat16))     # the kernel's answer

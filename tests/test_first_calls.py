"""cuBLAS answers a slow-shaped GEMM's first calls while our kernel compiles (codegen/first_calls.py,
`Target.library_first`, $MINICOMP_LIBRARY_FIRST=1).

The module is generated for sm_90 without a GPU; its text says which form runs when, and its
cuBLAS branch runs here on CPU tensors (the kernel marked as still compiling) against eager."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from library_testing import generate_quietly

from minicomp.codegen import first_calls
from minicomp.runtime import launcher
from minicomp.target import Target

SM90 = Target("cuda", (9, 0))
FIRST = replace(SM90, library_first=True)

CASES = {      # GEMMs our kernel computes because cuBLAS is slow on them, as eager calls them
    "lm_head": (lambda x, w: F.linear(x, w), [(2, 9, 64), (1003, 64)], "torch.nn.functional.linear("),
    "lm_head_bias": (lambda x, w, b: F.linear(x, w, b), [(9, 64), (1003, 64), (1003,)], "torch.nn.functional.linear("),
    "odd_k": (lambda a, b: a @ b, [(33, 1023), (1023, 64)], "torch.matmul("),
    "odd_k_transposed_a": (lambda a, b: a.t() @ b, [(1023, 40), (1023, 64)], "torch.matmul("),
}


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


def _cublas_branch(gen, inputs):
    """Run the CUDA module on CPU tensors with each kernel marked as compiling in the background:
    call() takes the cuBLAS branch (and would fail on the kernel's launch otherwise)."""
    ns: dict = {"__name__": "minicomp_first_calls_test"}
    exec(compile(gen.source, "<generated>", "exec"), ns)
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
def test_cublas_answers_until_the_kernel_has_compiled(case, dtype):
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
    (got,) = _cublas_branch(gen, inputs)
    want = fn(*[t.double() for t in inputs]).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert got.shape == want.shape and got.stride() == want.contiguous().stride()


def test_off_by_default_and_only_for_what_cublas_computes_alone():
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
    assert not Target.for_device("cpu", environ={}).library_first
    assert Target.for_device("cpu", environ={"MINICOMP_LIBRARY_FIRST": "1"}).library_first
    assert first_calls.WHY in generate_quietly(fn, inputs, FIRST).generated.source

"""GEMM outputs whose rows are not 16-byte aligned (codegen/gemm_rows.py): an lm_head's logits.

The persistent TMA kernel then tiles one class of rows at a time (rows j, j + P, ...) with its
columns moved so that its stores land on 16-byte boundaries. The CPU cases run that kernel under
Triton's interpreter (a target with the TMA form on the CPU) and compare with eager; the suite's
hook compiles each for sm_90, and `test_the_vector_store_compiles_for_sm90` reads the PTX. The
GPU case runs the lm_head's own shape."""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minicomp.api import compile_graph
from minicomp.frontend.fx import capture
from minicomp.runtime import load
from minicomp.target import Target

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tol  # noqa: E402

TMA_CPU = Target("cpu", tma_on_cpu=True)
CUDA = Target("cuda", (9, 0))


def lm_head(x, w):
    return F.linear(x, w)


def head_gelu_float(x, w, b):
    """An epilogue (bias, GELU) and a widened output: fp32 rows of 4 elements per 16 bytes."""
    return F.gelu(F.linear(x, w, b)).float()


def head_two_outputs(x, w):
    """The logits and their bf16 square: two outputs stored through the aligned form."""
    y = F.linear(x, w)
    return y, y * y


def _inputs(dtype, rows, k, n, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ins = [torch.randn(*rows, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5]
    if bias:
        ins.append(torch.randn(n, generator=g))
    return [t.to(dtype) for t in ins]


def _compile(fn, ins, target):
    return compile_graph(capture(fn, ins), ins, device=target.device_type, load=False, target=target).generated


def _check(fn, ins, dtype):
    gen = _compile(fn, ins, TMA_CPU)
    got = load(gen, "cpu")(*ins)
    want = fn(*[t.float() for t in ins])
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.to(g.dtype), **tol(dtype))
    return gen.source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n", [((1000,), 67), ((4, 250), 50), ((1023,), 129)])
def test_row_classes_equal_eager(dtype, rows, n):
    """N = 67 and 129 (period 8), 50 (period 4); M = 1000, 4 x 250 and 1023 (two not multiples of the
    period: the last class has fewer rows); K = 40 leaves a K tail in the interpreter's blocks."""
    ins = _inputs(dtype, rows, 40, n)
    source = _check(lm_head, ins, dtype)
    period = 8 // math.gcd(n % 8, 8)
    assert f"a_desc{period - 1} = tl.make_tensor_descriptor(" in source
    assert f"a_desc{period} = " not in source
    assert "row0 = tl.multiple_of(" in source


def test_epilogue_and_fp32_output():
    """The bias is loaded at the moved columns (masked before column 0); the fp32 output has a
    period of its own (N = 67: 4 elements per 16 bytes, period 4)."""
    dtype = torch.bfloat16
    ins = _inputs(dtype, (2, 500), 32, 67, bias=True)
    source = _check(head_gelu_float, ins, dtype)
    assert "a_desc3 = tl.make_tensor_descriptor(" in source and "a_desc4" not in source


def test_two_outputs_share_the_form():
    dtype = torch.bfloat16
    ins = _inputs(dtype, (1024,), 32, 67)
    source = _check(head_two_outputs, ins, dtype)
    assert source.count("if inner:") == 2


@pytest.mark.parametrize("rows, n", [((16,), 67), ((1024,), 64)])
def test_form_not_taken(rows, n):
    """Few rows (each class would read B again: eight times the reads at 16 rows) and aligned
    rows keep the plain tiles."""
    dtype = torch.bfloat16
    ins = _inputs(dtype, rows, 32, n)
    source = _check(lm_head, ins, dtype)
    assert "row0 = tl.multiple_of(" not in source and "a_desc1" not in source


def test_switch_off_keeps_plain_tiles():
    """MINICOMP_GEMM_ROWS=0 (Target.gemm_rows): the same kernel as before the form, still exact."""
    from dataclasses import replace
    dtype = torch.bfloat16
    ins = _inputs(dtype, (1000,), 32, 67)
    gen = _compile(lm_head, ins, replace(TMA_CPU, gemm_rows=False))
    assert "row0 = tl.multiple_of(" not in gen.source
    torch.testing.assert_close(load(gen, "cpu")(*ins)[0], lm_head(*[t.float() for t in ins]).to(dtype), **tol(dtype))
    assert Target.for_device("cpu", environ={"MINICOMP_GEMM_ROWS": "0"}).gemm_rows is False
    assert Target.for_device("cpu", environ={}).gemm_rows is True


def test_reads_rule():
    """At most MAX_EXTRA_READS times B's reads at 128-row tiles: an lm_head at 2048 rows takes
    the form, 600 rows (75 a class, 8 row tiles for 5) do not."""
    for m, taken in ((2048, True), (1000, True), (600, False), (16, False)):
        ins = _inputs(torch.bfloat16, (m,), 64, 50257 if m == 2048 else 67)
        source = _compile(lm_head, ins, CUDA).source if m == 2048 else _compile(lm_head, ins, TMA_CPU).source
        assert ("row0 = tl.multiple_of(" in source) == taken, m


def test_the_vector_store_compiles_for_sm90():
    """The GPT-2 lm_head's kernel, compiled by Triton for sm_90: the aligned branch stores 16
    bytes at a time (`st.global.v4`), the row ends element by element."""
    triton = pytest.importorskip("triton")
    ins = _inputs(torch.bfloat16, (2048,), 768, 50257)
    source = _compile(lm_head, ins, CUDA).source
    assert "row0 = tl.multiple_of(" in source
    ptx = _ptx(source)
    assert ptx and all("st.global.v4" in text for text in ptx), triton.__version__


def _ptx(source: str) -> list[str]:
    """Each kernel config's PTX, compiled in a worker without the interpreter."""
    import json
    import subprocess
    script = Path(__file__).parent / "ptx_worker.py"
    out = subprocess.run([sys.executable, str(script)], input=source, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_lm_head_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import minicomp
    dtype = torch.bfloat16
    x, w = (t.cuda() for t in _inputs(dtype, (4, 512), 768, 50257))
    fn = minicomp.compile(lm_head)
    got = fn(x, w)
    torch.testing.assert_close(got, lm_head(x.float(), w.float()).to(dtype), **tol(dtype))
    assert got.is_contiguous()
    ins = (torch.randn(2, 1000, 768, device="cuda", dtype=dtype), w,     # 2000 rows: 250 a class
           torch.randn(50257, device="cuda", dtype=dtype))
    got = minicomp.compile(head_gelu_float)(*ins)
    torch.testing.assert_close(got, head_gelu_float(*[t.float() for t in ins]), **tol(dtype))

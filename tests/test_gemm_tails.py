"""GEMMs of any K and N (codegen/gemm.py, gemm_form.py): the masked K tail, padded TMA
operands, and the fp32 dot precision PyTorch's switches pick.

CPU runs go through Triton's interpreter (tiny odd and prime sizes); each kernel is also
compiled for sm_90 by the suite's GPU-true check. The aligned shapes' kernels are compared
byte for byte with what main generated before these forms (tests/data/gemm_aligned/: main's
code at a035eca run over `_aligned_cases`; `python tests/test_gemm_tails.py` rewrites them).
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from test_codegen_gemm import one_group, our_gemm_kernels, randn, run_gemm  # noqa: F401  (autouse: our kernels, not cuBLAS)

import minicomp
from minicomp.codegen import gemm_form
from minicomp.codegen.launch import launch_lines
from minicomp.errors import MinicompError
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.target import Target

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TAIL_LOOP = "for k0 in range(0, K - K % BLOCK_K, BLOCK_K):"
ALIGNED = Path(__file__).parent / "data" / "gemm_aligned"


def _mm_graph(m: int, k: int, n: int, dtype, weight_t: bool = False, bias: bool = False, gelu: bool = False,
              batch: int = 0) -> Graph:
    """[batch,] [m, k] @ [k, n] (the weight stored [n, k] and read transposed when `weight_t`),
    then optionally + bias and GELU (tanh) in the epilogue."""
    g = Graph("tails")
    a = g.add_input("a", ((batch,) if batch else ()) + (m, k), dtype)
    if weight_t:
        w = g.add_input("w", (n, k), dtype)
        wv = g.add("permute", w, dims=(1, 0))
    else:
        w = g.add_input("w", ((batch,) if batch else ()) + (k, n), dtype)
        wv = w
    y = g.add("matmul", a, wv)
    if bias:
        y = g.add("add", y, g.add_input("bias", (n,), dtype))
    if gelu:
        y = g.add("gelu", y, approximate="tanh")
    g.set_outputs([y])
    return g


def _inputs(g: Graph) -> list[torch.Tensor]:
    return [randn(*g.node(i).shape, dtype=g.node(i).dtype, scale=0.5) for i in g.inputs]


def _ref(x, w, b=None, weight_t=False, gelu=False):
    y = x.float() @ (w.float().t() if weight_t else w.float())
    if b is not None:
        y = y + b.float()
    if gelu:
        y = F.gelu(y, approximate="tanh")
    return y.to(x.dtype)


# --------------------------------------------------------------------------- the masked K tail


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,weight_t,epilogue", [
    (33, 47, 95, False, False),        # odd and prime K, N
    (64, 257, 95, True, True),         # an lm_head scaled down: nn.Linear weight, bias + GELU
    (17, 1021, 29, True, False),       # prime N over 16 column tiles, K below one block
])
def test_odd_k_masks_only_the_last_block(m, n, k, weight_t, epilogue, dtype):
    g = _mm_graph(m, k, n, dtype, weight_t=weight_t, bias=epilogue, gelu=epilogue)
    ins = _inputs(g)
    (out,), gen, _ = run_gemm(g, ins)
    torch.testing.assert_close(out, _ref(*ins, weight_t=weight_t, gelu=epilogue), **tol(dtype))
    src = gen.source
    # the full blocks load unmasked; the one masked step (K's tail) follows the loop
    assert TAIL_LOOP in src and "if K % BLOCK_K != 0:" in src and "k0 = K - K % BLOCK_K" in src
    assert src.count("mask=ak < K") == 1 and "if K % BLOCK_K == 0:" not in src


def test_odd_k_batched_and_transposed_activation():
    """A batched matmul whose B differs per batch (not folded into M), and an A read through a
    transpose: both take the masked tail and give eager's answer."""
    dtype = torch.float32
    g = Graph("bmm_tail")
    a = g.add_input("a", (3, 37, 21), dtype)          # read as [3, 21, 37]
    b = g.add_input("b", (3, 37, 19), dtype)
    g.set_outputs([g.add("matmul", g.add("permute", a, dims=(0, 2, 1)), b)])
    x, y = randn(3, 37, 21), randn(3, 37, 19)
    (out,), gen, _ = run_gemm(g, [x, y])
    torch.testing.assert_close(out, x.transpose(1, 2) @ y, **tol(dtype))
    assert TAIL_LOOP in gen.source and "pid_batch" in gen.source


def test_odd_k_cuda_source_splits_the_loop():
    """On CUDA every config's BLOCK_K is tried: K = 4095 divides by none, so the loop is split;
    the loop itself has no mask (it is what runs 63 of 64 steps)."""
    g = _mm_graph(256, 4095, 256, torch.float16)
    gen, _ = one_group(g, "cuda")
    src = gen.source
    assert TAIL_LOOP in src and "if K % BLOCK_K != 0:" in src
    loop = src[src.index(TAIL_LOOP):src.index("if K % BLOCK_K != 0:")]
    assert "mask=" not in loop and "a = tl.load(a_ptrs)" in loop


@pytest.mark.parametrize("name", ["fp32_linear_gelu", "bf16_linear_tma", "fp16_bmm"])
def test_aligned_shapes_generate_what_they_did(name):
    """K a multiple of every BLOCK_K: the kernel text and launch are exactly main's before the
    tail forms (fp32 under TF32: full-precision fp32 has its own configs now; the TMA form's tile loop
    flattened with its K loop since session 19, `Target.gemm_epilogue`)."""
    cases = dict(_aligned_cases())
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = name.startswith("fp32")
        text = _kernel_text(cases[name])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert text == (ALIGNED / f"{name}.txt").read_text()
    assert TAIL_LOOP not in text and "_pad" not in text


def _aligned_cases():
    g = Graph("lin32")
    x = g.add_input("x", (4, 64, 128), torch.float32)
    w = g.add_input("w", (256, 128), torch.float32)
    b = g.add_input("bias", (256,), torch.float32)
    g.set_outputs([g.add("gelu", C.linear(g, x, w, b), approximate="tanh")])
    yield "fp32_linear_gelu", g
    g = Graph("lin16")
    x = g.add_input("x", (512, 256), torch.bfloat16)
    w = g.add_input("w", (384, 256), torch.bfloat16)
    b = g.add_input("bias", (384,), torch.bfloat16)
    g.set_outputs([C.linear(g, x, w, b)])
    yield "bf16_linear_tma", g
    g = Graph("bmm")
    a = g.add_input("a", (3, 40, 64), torch.float16)
    bb = g.add_input("b", (3, 64, 24), torch.float16)
    g.set_outputs([g.add("matmul", a, bb)])
    yield "fp16_bmm", g


def _kernel_text(g: Graph) -> str:
    gen, _ = one_group(g, "cuda")
    (k,) = gen.kernels
    lines = [line for launch in k.launches for line in launch_lines(k.name, launch, lambda nid: f"buf{nid}", True)]
    return k.source + "\n# launches\n" + "\n".join(lines) + "\n"


def test_symbolic_k_and_n_share_one_kernel_with_a_runtime_tail():
    """Over symbolic sizes M, N and K are runtime arguments: one compile serves K = 95, 61, 130
    (the tail's test runs at run time) and N = 47, 29, each with eager's answer."""
    f = minicomp.compile(lambda a, b: F.gelu(a @ b), dynamic=True)
    for m, k, n in [(33, 95, 47), (40, 61, 47), (17, 130, 29)]:
        a, b = randn(m, k), randn(k, n)
        torch.testing.assert_close(f(a, b), F.gelu(a @ b), **tol(torch.float32))
    assert f.compiles == 1
    assert TAIL_LOOP in f.source and ", M, N, K," in f.source


# --------------------------------------------------------------------------- padded TMA operands


@pytest.fixture
def tma_on_cpu(monkeypatch):
    """The TMA form under the interpreter, padding operands of any reuse (the real threshold,
    PAD_MIN_REUSE = 1024, keeps small problems off the per-call copy)."""
    monkeypatch.setattr(gemm_form, "PAD_MIN_REUSE", 1)
    return Target("cpu", tma_on_cpu=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k,weight_t", [(40, 70, 95, True), (72, 257, 64, False), (33, 47, 95, False)])
def test_misaligned_rows_read_through_padded_descriptors(m, n, k, weight_t, dtype, tma_on_cpu):
    """K = 95 (A's rows and the nn.Linear weight's are 190 bytes apart) or N = 257 ([K, N]
    weight): each such operand is copied to rows padded to 16 bytes, read by a descriptor
    that stops at the real length, with a bias + GELU epilogue."""
    g = _mm_graph(m, k, n, dtype, weight_t=weight_t, bias=True, gelu=True)
    ins = _inputs(g)
    (out,), gen, _ = run_gemm(g, ins, target=tma_on_cpu)
    torch.testing.assert_close(out, _ref(*ins, weight_t=weight_t, gelu=True), **tol(dtype))
    src = gen.source
    assert src.count("tl.make_tensor_descriptor(") == 2 and "def mc_gemm" in src
    per = 8                      # 16 bytes of fp16/bf16
    if k % per:                  # A (and a transposed weight) padded along K
        assert f"strides=[{-(-k // per) * per}, 1]" in src and re.search(r"_pad\d\(a\)", src)
    if (weight_t and k % per) or (not weight_t and n % per):
        assert re.search(r"_pad\d\(w\)", src)
    if not weight_t and n % per:
        assert f"strides=[{-(-n // per) * per}, 1]" in src
    assert "torch.empty(" in src and "copy_(t)" in src


def test_padded_folded_batch_and_transposed_activation(tma_on_cpu):
    """A [2, 20, 95] activation folded into M = 40 rows, and an activation stored [K, M] with
    M = 45 read through a transpose: each padded along its unit-stride dim, with eager's answer."""
    dtype = torch.bfloat16
    g = Graph("folded")
    x = g.add_input("x", (2, 20, 95), dtype)
    w = g.add_input("w", (70, 95), dtype)
    g.set_outputs([C.linear(g, x, w, None)])
    xs, ws = randn(2, 20, 95, dtype=dtype), randn(70, 95, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [xs, ws], target=tma_on_cpu)
    torch.testing.assert_close(out, (xs.float() @ ws.float().t()).to(dtype), **tol(dtype))
    assert re.search(r"_pad\d\(x\)", gen.source) and re.search(r"_pad\d\(w\)", gen.source)
    g = Graph("a_t")
    a = g.add_input("a", (37, 45), dtype)
    b = g.add_input("b", (37, 64), dtype)
    g.set_outputs([g.add("matmul", g.add("permute", a, dims=(1, 0)), b)])
    xs, ys = randn(37, 45, dtype=dtype), randn(37, 64, dtype=dtype)
    (out,), gen, _ = run_gemm(g, [xs, ys], target=tma_on_cpu)
    torch.testing.assert_close(out, (xs.float().t() @ ys.float()).to(dtype), **tol(dtype))
    assert "shape=[K, M], strides=[48, 1]" in gen.source and re.search(r"_pad\d\(a\)", gen.source)


def test_padding_needs_reuse(monkeypatch):
    """Below PAD_MIN_REUSE the per-call copy would cost more than it saves: the pointer form."""
    g = _mm_graph(64, 95, 64, torch.bfloat16)
    gen, _ = one_group(g, "cuda")
    assert "make_tensor_descriptor" not in gen.source and TAIL_LOOP in gen.source
    monkeypatch.setattr(gemm_form, "PAD_MIN_REUSE", 64)
    gen, _ = one_group(g, "cuda")
    assert "make_tensor_descriptor" in gen.source and "_pad0(_align16(a))" not in gen.source
    assert "_pad0(a)" in gen.source


def test_padded_operand_read_by_the_epilogue_is_not_padded(tma_on_cpu):
    """x @ w + x with K odd: x is also an epilogue operand, read at its own strides, so it cannot
    be swapped for a padded copy: the pointer form serves it, with eager's answer."""
    dtype = torch.float16
    g = Graph("resid")
    x = g.add_input("x", (24, 37), dtype)
    w = g.add_input("w", (37, 37), dtype)
    g.set_outputs([g.add("add", g.add("matmul", x, w), x)])
    xs, ws = randn(24, 37, dtype=dtype), randn(37, 37, dtype=dtype, scale=0.3)
    (out,), gen, _ = run_gemm(g, [xs, ws], target=tma_on_cpu)
    torch.testing.assert_close(out, (xs.float() @ ws.float() + xs.float()).to(dtype), **tol(dtype))
    assert "_pad" not in gen.source and "make_tensor_descriptor" not in gen.source


def test_lm_head_shape_tries_a_second_config_for_misaligned_stores():
    """An lm_head (2048 x 768 -> 50257, bf16): the big-problem cut keeps the 128x256 TMA config
    (one persistent program per SM) and adds one for output rows that are not 16-byte aligned,
    launched two programs per SM (the grid reads the config's SM_SHARE)."""
    g = Graph("lm_head")
    x = g.add_input("x", (4, 512, 768), torch.bfloat16)
    w = g.add_input("w", (50257, 768), torch.bfloat16)
    g.set_outputs([C.linear(g, x, w, None)])
    gen, _ = one_group(g, "cuda")
    src = gen.source
    assert "make_tensor_descriptor" in src and "_pad" not in src
    assert src.count("triton.Config(") == 2
    assert '"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SM_SHARE": 1}' in src
    assert '"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SM_SHARE": 2}, num_stages=3' in src
    assert "min(_sm_count(device) * meta['SM_SHARE'], " in src and "SM_SHARE: tl.constexpr" in src


@pytest.mark.parametrize("n, big", [(5632, True), (2048, False)], ids=["big", "autotuned_table"])
def test_an_epilogue_that_reads_a_tile_tries_two_programs_per_sm(n, big):
    """A residual add (or SiLU of a gate cuBLAS wrote) in the epilogue reads a tile of the
    output's size beside the accumulator: the 128x128 config launched two programs per SM is a
    candidate too, in the big-problem cut and in the full table; a bias along N is no such read."""
    g = Graph("residual")
    x = g.add_input("x", (4, 512, 2048), torch.bfloat16)
    w = g.add_input("w", (n, 2048), torch.bfloat16)
    r = g.add_input("r", (4, 512, n), torch.bfloat16)
    g.set_outputs([g.add("add", C.linear(g, x, w, None), r)])
    src = one_group(g, "cuda")[0].source
    two = '"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SM_SHARE": 2}, num_stages=3'
    assert two in src and "min(_sm_count(device) * meta['SM_SHARE'], " in src
    assert (src.count("triton.Config(") == 2) == big
    g = Graph("bias")
    x = g.add_input("x", (4, 512, 2048), torch.bfloat16)
    w = g.add_input("w", (n, 2048), torch.bfloat16)
    g.set_outputs([C.linear(g, x, w, g.add_input("b", (n,), torch.bfloat16))])
    assert '"SM_SHARE": 2' not in one_group(g, "cuda")[0].source


# --------------------------------------------------------------------------- fp32 precision
# These tests flip only the legacy switch (`allow_tf32`): once the newer `fp32_precision` is set,
# PyTorch raises on every later read of the legacy one in the process (other tests read it).


@pytest.fixture
def tf32_switch():
    old = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def test_fp32_precision_follows_torch_switch_and_recompiles(tf32_switch):
    """Flipping TF32 on recompiles (the compile cache keys on it) and the kernel's dot says so;
    under "ieee" the interpreter's numbers match eager's fp32 tightly."""
    f = minicomp.compile(lambda a, b: torch.relu(a @ b))
    x, y = randn(33, 95), randn(95, 47)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = f(x, y)
    assert 'input_precision="ieee"' in f.source and 'input_precision="tf32"' not in f.source
    torch.testing.assert_close(out, torch.relu(x @ y), atol=1e-5, rtol=1e-5)
    torch.backends.cuda.matmul.allow_tf32 = True
    f(x, y)
    assert 'input_precision="tf32"' in f.source and 'input_precision="ieee"' not in f.source
    torch.backends.cuda.matmul.allow_tf32 = False
    f(x, y)
    assert 'input_precision="ieee"' in f.source


def test_precision_picks_the_fp32_configs(tf32_switch):
    g = _mm_graph(2048, 2048, 2048, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert Target("cuda").matmul_precision == "tf32"
    tf32 = one_group(g, "cuda")[0].source
    torch.backends.cuda.matmul.allow_tf32 = False
    assert Target("cuda").matmul_precision == "ieee"
    ieee = one_group(g, "cuda")[0].source
    assert 'input_precision="tf32"' in tf32 and 'input_precision="ieee"' in ieee
    # full precision runs on FMA: its table holds the larger output tiles, TF32's does not
    assert '"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 16' in ieee and '"BLOCK_K": 16' not in tf32


def test_precision_reads_the_newer_switches():
    """In a fresh process (the newer API poisons the legacy one): `fp32_precision` per backend,
    then the global one, then the legacy switch; a mix PyTorch refuses to read is full precision."""
    code = textwrap.dedent("""
        import torch
        from minicomp.target import read_matmul_precision as p
        m = torch.backends.cuda.matmul
        seen = [p()]
        torch.set_float32_matmul_precision("high"); seen.append(p())
        torch.set_float32_matmul_precision("highest"); seen.append(p())
        m.fp32_precision = "tf32"; seen.append(p())
        m.fp32_precision = "none"; seen.append(p())
        torch.backends.fp32_precision = "tf32"; seen.append(p())
        print(" ".join(seen))
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ieee", "tf32", "ieee", "tf32", "ieee", "tf32"]


def test_bad_precision_is_a_clear_error():
    with pytest.raises(MinicompError, match="matmul_precision='fp16'.*ieee, tf32"):
        Target("cpu", matmul_precision="fp16")


# --------------------------------------------------------------------------- GPU (the H200)


@pytest.mark.gpu
@pytest.mark.parametrize("weight_t", [False, True])
def test_gpu_odd_k_padded_descriptors(weight_t):
    """4096 x 4095 x 4096 in bf16 (issue 22's shape): A's rows (and an nn.Linear weight's) are
    8190 bytes apart, so they are read from padded copies by TMA descriptors."""
    dtype, m, k, n = torch.bfloat16, 4096, 4095, 4096
    g = _mm_graph(m, k, n, dtype, weight_t=weight_t)
    x = randn(m, k, dtype=dtype, device="cuda", scale=k ** -0.5)
    w = randn(*((n, k) if weight_t else (k, n)), dtype=dtype, device="cuda")
    (out,), gen, _ = run_gemm(g, [x, w], device="cuda")
    torch.testing.assert_close(out, _ref(x, w, weight_t=weight_t), **tol(dtype))
    assert "make_tensor_descriptor" in gen.source and re.search(r"_pad\d\(a\)", gen.source)


@pytest.mark.gpu
def test_gpu_lm_head():
    """GPT-2's lm_head: [4, 512, 768] -> 50257 outputs in bf16 (odd output rows), with a bias."""
    dtype = torch.bfloat16
    g = Graph("lm_head_gpu")
    x = g.add_input("x", (4, 512, 768), dtype)
    w = g.add_input("w", (50257, 768), dtype)
    b = g.add_input("bias", (50257,), dtype)
    g.set_outputs([C.linear(g, x, w, b)])
    xv = randn(4, 512, 768, dtype=dtype, device="cuda")
    wv = randn(50257, 768, dtype=dtype, device="cuda", scale=768 ** -0.5)
    bv = randn(50257, dtype=dtype, device="cuda")
    (out,), _, _ = run_gemm(g, [xv, wv, bv], device="cuda")
    ref = F.linear(xv.float(), wv.float(), bv.float()).to(dtype)
    torch.testing.assert_close(out, ref, **tol(dtype))


@pytest.mark.gpu
def test_gpu_fp32_follows_tf32_switch(tf32_switch):
    """fp32 2048^3 with an odd K tail: full precision matches a float64 reference tightly; TF32
    (10-bit mantissas) is close, and not as close."""
    g = _mm_graph(2048, 2047, 2048, torch.float32)
    x, y = randn(2048, 2047, device="cuda"), randn(2047, 2048, device="cuda")
    ref = (x.double() @ y.double()).float()
    errs = {}
    for allow in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = allow
        (out,), gen, _ = run_gemm(g, [x, y], device="cuda")
        assert f'input_precision="{"tf32" if allow else "ieee"}"' in gen.source
        errs[allow] = (out - ref).abs().max().item()
        torch.testing.assert_close(out, ref, atol=2e-3 if not allow else 0.5, rtol=1e-4 if not allow else 1e-2)
    assert errs[False] < errs[True]


if __name__ == "__main__":
    # `python tests/test_gemm_tails.py`: rewrite tests/data/gemm_aligned/ from this checkout, after a
    # change to the aligned kernels' text that is meant (review the diff: it is the point of the files)
    ALIGNED.mkdir(parents=True, exist_ok=True)
    for case, graph in _aligned_cases():
        torch.backends.cuda.matmul.allow_tf32 = case.startswith("fp32")
        (ALIGNED / f"{case}.txt").write_text(_kernel_text(graph))

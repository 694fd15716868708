"""The Hopper attention kernel (codegen/attention_hopper*.py): which groups use it, the text a
module carries compiled for sm_90 on the CPU, and (on a Hopper GPU) its results against SDPA.

The kernel is Gluon, which Triton's CPU interpreter does not run: CPU tests check the choice,
the launch's sizes and strides, and that ptxas keeps the kernel's MMAs in flight; the `gpu`
tests compare with eager PyTorch.
"""

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tol
from test_codegen_attention import attention_graph, inputs_for, one_group, our_attention_kernels, sdpa  # noqa: F401  (autouse: our kernels, not SDPA)

import minicomp
from minicomp.codegen import attention_hopper
from minicomp.codegen import indexing as ix
from minicomp.codegen.attention import Spec
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.epilogue import Operand
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.runtime import load
from minicomp.target import Target

ROOT = Path(__file__).resolve().parent.parent
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
# codegen as for an sm_90 device, whatever this machine has; the Gluon kernel wherever it fits
# (the suite's shapes are small: `test_by_default_the_kernel_takes_attention_that_pays_for_it`)
SM90 = Target("cuda", (9, 0), hopper_attention="1", eager_first=False)   # first calls: tests/test_first_calls.py


@pytest.fixture
def on_hopper():
    """Tests that generate the Gluon kernel (with the SM90 target) need a Triton that has it."""
    if not attention_hopper.gluon_hopper_available():
        pytest.skip("this Triton has no Gluon for Hopper")


def launch_kwargs(source: str, kernel: str) -> dict:
    """The keyword arguments of the `_launch(kernel, ...)` line in a generated module."""
    for line in source.splitlines():
        if line.strip().startswith(f"_launch({kernel},"):
            call = ast.parse(line.strip(), mode="eval").body
            return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "_site"}   # not Triton's
    raise AssertionError(f"no launch of {kernel}")


def reason(g: Graph, capability=(9, 0)) -> str | None:
    _, group = one_group(g, "cpu")
    ctx = KernelCtx(g, group, 0, SM90)
    return attention_hopper.why_not(ctx, Spec(ctx), capability)


def test_contiguous_and_transposed_layouts_get_the_kernel(on_hopper):
    gen, _ = one_group(attention_graph(4, 32, 32, 1024, 1024, 128, dtype=torch.bfloat16, causal=True), SM90)
    assert gen.kernel_names == ["mc_attn_hopper_attention_0"]
    assert gen.source.count("def attn_fwd_hopper(") == 1
    kw = launch_kwargs(gen.source, "mc_attn_hopper_attention_0")
    assert kw["CAUSAL"] is True and kw["G"] == 1 and kw["H"] == 32
    assert (kw["Q_SB"], kw["Q_SH"], kw["Q_SS"], kw["Q_ROWS"]) == (32 * 1024 * 128, 1024 * 128, 128, 4 * 32 * 1024)
    # [B, S, H, D] seen through a transpose, 4 query heads per KV head: rows are (b, s), heads are columns
    gen, _ = one_group(attention_graph(2, 8, 2, 384, 384, 64, dtype=torch.float16, causal=True, bshd=True), SM90)
    kw = launch_kwargs(gen.source, "mc_attn_hopper_attention_0")
    assert (kw["Q_SB"], kw["Q_SH"], kw["Q_SS"], kw["Q_ROWS"]) == (384 * 8 * 64, 64, 8 * 64, 2 * 384)
    assert (kw["K_SB"], kw["K_SH"], kw["K_SS"], kw["G"]) == (384 * 2 * 64, 64, 2 * 64, 4)
    assert (kw["O_SB"], kw["O_SH"], kw["O_SS"]) == (8 * 384 * 64, 384 * 64, 64)


@pytest.mark.parametrize("build,why", [
    (lambda: attention_graph(1, 4, 4, 1000, 1000, 64, dtype=torch.bfloat16, causal=True), "not a multiple of 128"),
    (lambda: attention_graph(1, 4, 4, 256, 512, 64, dtype=torch.bfloat16, causal=True), "causal with Sq=256"),
    (lambda: attention_graph(1, 4, 4, 256, 256, 80, dtype=torch.bfloat16), "head dims D=80"),
    (lambda: attention_graph(1, 4, 4, 256, 256, 64, dv=128, dtype=torch.bfloat16), "head dims D=64, Dv=128"),
    (lambda: attention_graph(1, 4, 4, 256, 256, 64), "torch.float32 operands"),
    (lambda: attention_graph(1, 4, 4, 256, 256, 64, dtype=torch.float16, mask=((256, 256), torch.bool)),
     "a mask tensor"),
    (lambda: attention_graph(1, 4, 4, 256, 256, 64, dtype=torch.float16, scale=-0.5), "not positive"),
])
def test_what_the_kernel_leaves_to_the_block_language_kernel(build, why):
    got = reason(build())
    assert got is not None and why in got
    assert "9.0" in reason(attention_graph(1, 4, 4, 256, 256, 64, dtype=torch.bfloat16), capability=(8, 0))
    assert reason(attention_graph(1, 4, 4, 256, 256, 64, dtype=torch.bfloat16)) is None


def test_an_epilogue_or_a_cast_keeps_the_block_language_kernel(on_hopper):
    g = Graph("attn_epilogue")
    q, k, v = (g.add_input(n, (1, 2, 256, 64), torch.bfloat16) for n in "qkv")
    a = C.attention(g, q, k, v, is_causal=True)
    g.set_outputs([g.add("mul", a, g.constant(2.0))])
    gen, _ = one_group(g, SM90)
    assert gen.kernel_names == ["mc_attn_attention_mul_0"]
    assert "# not on the Hopper kernel (attention_hopper.py): a fused epilogue or another output" in gen.source
    g = Graph("attn_cast")
    q, k, v = (g.add_input(n, (1, 2, 256, 64), torch.float32) for n in "qkv")
    q, k, v = (g.add("cast", t, dtype=torch.bfloat16) for t in (q, k, v))
    g.set_outputs([C.attention(g, q, k, v)])
    assert "cast inside the group" in reason(g)


def test_the_block_language_kernel_serves_while_the_gluon_kernel_compiles(on_hopper):
    """Tiered: the Gluon kernel compiles in the background (`_LATER`, not `_WARM`) and call()
    launches the block-language kernel until it has; MINICOMP_TIERED=0 writes the Gluon kernel alone."""
    g = attention_graph(2, 4, 4, 256, 256, 64, dtype=torch.bfloat16, causal=True)
    gen, _ = one_group(g, SM90)
    src = gen.source
    lines = [line.strip() for line in src.splitlines()]
    first = lines.index("if not _rt.compiled(mc_attn_hopper_attention_0):")
    assert lines[first + 1].startswith("_launch(mc_attn_attention_0,")
    later = lines.index("if _rt.compiled(mc_attn_hopper_attention_0):")
    assert later > first and lines[later + 1].startswith("_launch(mc_attn_hopper_attention_0,")
    assert lines.count("_tma_ready()") == 1 and lines.index("_tma_ready()") < first   # once a call, first
    warm, rest = src.split("_WARM = [", 1)[1].split("_LATER = [", 1)
    assert "(mc_attn_attention_0," in warm and "mc_attn_hopper_attention_0" not in warm
    assert "(mc_attn_hopper_attention_0," in rest.split("]\n", 1)[0]
    assert "with _rt.CompilingAtOnce(_WARM, later=_LATER):" in src
    alone, _ = one_group(g, dataclasses.replace(SM90, tiered=False))
    assert "_LATER" not in alone.source and "_rt.compiled" not in alone.source
    assert "@triton.autotune" not in alone.source and alone.kernel_names == ["mc_attn_hopper_attention_0"]


def test_by_default_the_kernel_takes_attention_that_pays_for_its_compile():
    default = Target("cuda", (9, 0))

    def why(g):
        _, group = one_group(g, "cpu")
        ctx = KernelCtx(g, group, 0, default)
        return attention_hopper.why_not(ctx, Spec(ctx))
    # a Llama layer's attention at batch 2 x 512 (16 heads of 128, causal): 2.1 GFLOP
    small = why(attention_graph(2, 16, 16, 512, 512, 128, dtype=torch.bfloat16, causal=True))
    assert small is not None and "does not pay for its compile" in small and "=1 takes it anyway" in small
    # the same at 1024 tokens (8.6 GFLOP), and non-causal at 512 (4.3)
    assert why(attention_graph(2, 16, 16, 1024, 1024, 128, dtype=torch.bfloat16, causal=True)) is None
    assert why(attention_graph(2, 16, 16, 512, 512, 128, dtype=torch.bfloat16)) is None
    assert Target.for_device("cpu", {attention_hopper.ENV_VAR: "1"}).hopper_attention == "1"


def test_the_switch_turns_the_kernel_off(on_hopper):
    off = Target.for_device("cuda", {attention_hopper.ENV_VAR: "0"}).for_check(90)
    gen, _ = one_group(attention_graph(1, 4, 4, 256, 256, 64, dtype=torch.bfloat16, causal=True), off)
    assert gen.kernel_names == ["mc_attn_attention_0"] and "MINICOMP_HOPPER_ATTENTION=0" in gen.source


def test_tma_view_refuses_a_tile_straddling_two_rows():
    # element (h, s, d) at h*96 + s*128 + d: head 1's 64 columns start at 96 of a 128-wide row
    h, s, d = ix.sym("z0", 2), ix.sym("qm", 256), ix.sym("qd", 64)
    op = Operand(0, (), h * 96 + s * 128 + d, torch.bfloat16)
    view, why = attention_hopper.tma_view(op, ("-", "z0"), "qm", "qd", 1, (1, 2), 256, 64)
    assert view is None and "straddle" in why
    op = Operand(0, (), h * 64 + s * 128 + d, torch.bfloat16)        # [S, H, D] with H = 2: fits
    view, _ = attention_hopper.tma_view(op, ("-", "z0"), "qm", "qd", 1, (1, 2), 256, 64)
    assert view == {"C": 0, "SB": 0, "SH": 64, "SS": 128, "ROWS": 256}


_COMPILE_MODULE_KERNEL_FOR_SM90 = """
import importlib.util
import json
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
path, kernel, consts, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
spec = importlib.util.spec_from_file_location("generated", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dt = {"torch.bfloat16": "*bf16", "torch.float16": "*fp16"}[sys.argv[5]]
sig = {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "o_ptr": dt, "qk_scale": "fp32", **{n: "constexpr" for n in consts}}
src = GluonASTSource(getattr(mod, kernel), sig, attrs={(i,): [["tt.divisibility", 16]] for i in range(4)},
                     constexprs=consts)
with open(out, "w") as f:
    f.write(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
print(get_ptxas(90).path)
"""


@pytest.mark.parametrize("causal,dtype,bshd", [(True, torch.bfloat16, False), (False, torch.float16, True)])
def test_the_module_kernel_compiles_for_sm90_with_its_mmas_in_flight(on_hopper, tmp_path, causal, dtype, bshd):
    """The kernel text a generated module carries, bound as the module binds it and compiled
    with its launch's constexprs for sm_90 (no GPU, no interpreter): one wgmma group stays in
    flight during the softmax, ptxas keeps the wgmma pipeline (no C7511-C7514: it serialises
    every wgmma of a kernel whose loop carries an in-flight accumulator) and nothing spills."""
    import json
    import re

    gen, _ = one_group(attention_graph(2, 8, 2, 512, 512, 128, dtype=dtype, causal=causal, bshd=bshd), SM90)
    path = gen.write(tmp_path)
    consts = launch_kwargs(gen.source, "mc_attn_hopper_attention_0")
    consts.pop("num_warps")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    ptx_path = tmp_path / "attn.ptx"
    made = subprocess.run([sys.executable, "-c", _COMPILE_MODULE_KERNEL_FOR_SM90, str(path),
                           "mc_attn_hopper_attention_0", json.dumps(consts), str(ptx_path), str(dtype)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    ptx = ptx_path.read_text()
    assert "wgmma.wait_group.sync.aligned 1;" in ptx and "setmaxnreg" in ptx
    ptxas = made.stdout.strip().splitlines()[-1]
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx_path), "-o", str(tmp_path / "attn.cubin")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"C751\d", out.stderr), out.stderr
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", out.stderr), out.stderr


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,dtype,causal,bshd", [
    (2, 8, 8, 1024, 1024, 128, torch.bfloat16, True, False),
    (1, 12, 4, 384, 384, 64, torch.float16, True, True),      # GQA, [B, S, H, D] storage
    (3, 5, 5, 256, 640, 128, torch.bfloat16, False, False),   # Sq != Sk, 15 batch x heads
    (1, 2, 1, 128, 128, 64, torch.float16, True, False),      # one key block: only the diagonal
    (4, 32, 8, 1024, 1024, 64, torch.bfloat16, True, True),   # 1024 tiles: several per program
    (2, 16, 16, 2048, 1024, 128, torch.float16, False, False),  # 512 tiles, not causal
])
def test_gpu_hopper_kernel_matches_sdpa(b, hq, hkv, sq, sk, d, dtype, causal, bshd):
    g = attention_graph(b, hq, hkv, sq, sk, d, dtype=dtype, causal=causal, bshd=bshd)
    gen, _ = one_group(g, Target.for_device("cuda", {attention_hopper.ENV_VAR: "1", "MINICOMP_EAGER_FIRST": "0"}))
    assert gen.kernel_names == ["mc_attn_hopper_attention_0"], gen.source[:2000]
    q, k, v = inputs_for(g, "cuda")
    fn = load(gen, "cuda")
    want = sdpa(q, k, v, causal=causal, bshd=bshd, gqa=hq != hkv)
    (out,) = fn(q, k, v)           # the block-language kernel, while the Gluon one compiles (tiered)
    torch.testing.assert_close(out, want, **tol(dtype))
    assert minicomp.wait_compiled(600)
    assert fn.module._rt.compiled(fn.module.mc_attn_hopper_attention_0)
    (out,) = fn(q, k, v)           # the Gluon kernel
    torch.testing.assert_close(out, want, **tol(dtype))
    # the Gluon kernel's launch took a fast launcher: keyed by its launch site (`_site`, its name
    # and a digest of its signature) in a static module, by the kernel itself otherwise
    kernel = fn.module.mc_attn_hopper_attention_0
    assert any(fast and (key is kernel or str(key).startswith("mc_attn_hopper_attention_0#"))
               for key, fast in fn.module._launch.fast.items()), list(fn.module._launch.fast)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")
def test_gpu_hopper_kernel_one_batch_dim_and_a_second_call():
    g = Graph("attn3d")
    q, k, v = (g.add_input(n, (6, 256, 64), torch.bfloat16) for n in "qkv")
    g.set_outputs([C.attention(g, q, k, v, is_causal=True)])
    gen, _ = one_group(g, Target.for_device("cuda", {attention_hopper.ENV_VAR: "1", "MINICOMP_TIERED": "0",
                                                     "MINICOMP_EAGER_FIRST": "0"}))
    assert gen.kernel_names == ["mc_attn_hopper_attention_0"] and "_LATER" not in gen.source
    fn = load(gen, "cuda")
    for seed in (1, 2):   # the second call goes through the compiled launcher
        q, k, v = (torch.randn(6, 256, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed + i))
                   .to(torch.bfloat16) for i in range(3))
        (out,) = fn(q, k, v)
        torch.testing.assert_close(out, sdpa(q, k, v, causal=True), **tol(torch.bfloat16))


def test_the_gluon_kernel_is_first_in_the_warm_up_pool(on_hopper):
    """Its compile is the longest of a module's; queued behind the others it would end the
    first call's warm-up last (benchmarks/ablations/first_call.py on the H200: llama_block 7.1 s of warm-up)."""
    g = Graph("mm_then_attention")
    x = g.add_input("x", (2, 128, 64), torch.bfloat16)
    w = g.add_input("w", (64, 64), torch.bfloat16)
    q = C.transpose(g, g.add("reshape", g.add("matmul", x, w), shape=(2, 128, 1, 64)), 1, 2)
    g.set_outputs([C.attention(g, q, q, q, is_causal=True)])
    from minicomp.plan import plan_graph
    plan = plan_graph(g)
    from minicomp.codegen import generate
    # compiled before the first launch (MINICOMP_TIERED=0): first into the pool; the plain matmul is
    # our kernel here (library_gemm off: it would call cuBLAS), so the pool holds a second kernel
    ours = dataclasses.replace(SM90, library_gemm=False)
    gen = generate(g, plan, dataclasses.replace(ours, tiered=False))
    assert len(gen.kernel_names) >= 2 and any("attn_hopper" in n for n in gen.kernel_names)
    warm = gen.source.split("_WARM = [", 1)[1].split("\n]", 1)[0].strip().splitlines()
    assert len(warm) >= 2 and warm[0].startswith("(mc_attn_hopper")
    # tiered (the default): not in the pool at all, but compiled in the background
    tiered = generate(g, plan, ours).source
    assert "(mc_attn_hopper" not in tiered.split("_WARM = [", 1)[1].split("\n]", 1)[0]
    assert tiered.split("_LATER = [", 1)[1].split("\n]", 1)[0].strip().startswith("(mc_attn_hopper")

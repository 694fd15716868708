"""GEMM and attention kernels over symbolic sizes: one compile serves every size.

Each DSL program is compiled ONCE with its sizes symbolic (`load_dsl(..., symbolic=True)`), then
called at several odd sizes (not multiples of 16, a length of 2, long rows); every result is
compared with the reference interpreter on the same program compiled with those sizes bound
(`load_dsl(..., dims=...)`), with the dtype's tolerance. No GEMM or attention group may fall back
to PyTorch. The suite's GPU-true check (conftest: sm_90) compiles every kernel these modules hold.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from conftest import tol
from minicomp.api import compile_graph, plan_only
from minicomp.codegen.module import generate
from minicomp.frontend.dsl import load_dsl
from minicomp.ir import dims
from minicomp.ir.interpret import run
from minicomp.target import Target

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def compile_once(text: str, name: str, target: Target | None = None):
    """The program compiled with its sizes symbolic, asserting that no group fell back."""
    graph = load_dsl(text, name, symbolic=True)
    assert graph.symbolic
    compiled = compile_graph(graph, [None] * len(graph.inputs), device="cpu", target=target)
    assert compiled.generated.fallbacks == {}, compiled.generated.fallbacks
    return compiled


def check_at(compiled, text: str, name: str, sizes: dict[str, int], dtype: torch.dtype,
             make=None, seed: int = 0) -> None:
    """Call the symbolic module at `sizes` and compare with the program bound to them."""
    static = load_dsl(text, name, dims=sizes)
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for nid in static.inputs:
        node = static.node(nid)
        shape = [int(d) for d in node.shape]
        t = (make(node, shape, gen) if make else None)
        if t is None:
            t = (torch.randn(shape, generator=gen) * 0.25).to(node.dtype)
        inputs.append(t)
    got = compiled.call(*inputs)
    if dtype == torch.float32:
        want = run(static, inputs)
    else:
        # eager in bf16 rounds every intermediate (the kernels keep them in fp32): the reference is
        # the program in fp32 on the same values, rounded once at the end
        wide = load_dsl(text.replace("bf16", "f32"), name, dims=sizes)
        want = [w.to(dtype) for w in run(wide, [t.float() if t.is_floating_point() else t for t in inputs])]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, **tol(dtype))


def kinds(compiled) -> list[str]:
    return [grp.kind for grp in compiled.plan.groups]


# --------------------------------------------------------------------------- GEMM

MLP = (SAMPLES / "mlp.mc").read_text()


def test_mlp_sample_one_compile_many_sizes():
    """samples/mlp.mc with B, S, C and H all symbolic: M = B*S folded, N and K runtime (masked K tail)."""
    compiled = compile_once(MLP, "mlp.mc")
    assert kinds(compiled).count("gemm") == 2
    for sizes in ({"B": 2, "S": 2, "C": 3, "H": 5}, {"B": 3, "S": 37, "C": 20, "H": 17},
                  {"B": 2, "S": 129, "C": 16, "H": 48}, {"B": 5, "S": 7, "C": 70, "H": 33}):
        check_at(compiled, MLP, "mlp.mc", sizes, torch.float32)


MLP_BF16 = """
func mlp(x: bf16[B, S, 64], fc1_w: bf16[96, 64], fc1_b: bf16[96], fc2_w: bf16[64, 96], fc2_b: bf16[64]) -> bf16[B, S, 64] {
  h = gelu(linear(x, fc1_w, fc1_b))
  return linear(h, fc2_w, fc2_b)
}
"""


@pytest.mark.parametrize("tma", [False, True], ids=["pointer", "tma"])
def test_linear_layers_over_symbolic_tokens_bf16(tma):
    """Concrete widths, symbolic batch and length (a linear layer's B*S): the pointer form, and
    the TMA descriptor form (its strides are concrete) under the interpreter."""
    target = dataclasses.replace(Target.for_device("cpu"), tma_on_cpu=tma)
    compiled = compile_once(MLP_BF16, "mlp_bf16.mc", target)
    uses_tma = "tl.make_tensor_descriptor" in compiled.generated.source
    assert uses_tma == tma
    for sizes in ({"B": 2, "S": 2}, {"B": 3, "S": 41}, {"B": 2, "S": 300}):
        check_at(compiled, MLP_BF16, "mlp_bf16.mc", sizes, torch.bfloat16)


BMM = """
func bmm(a: f32[B, S, 24], b: f32[B, 24, N], r: f32[S, N]) -> f32[B, S, N] {
  return relu(a @ b) + r
}
"""


def test_batched_matmul_with_symbolic_batch_and_broadcast_residual():
    """B is read by both operands, so it stays a batch dim decoded from the program id; the
    residual broadcasts over it; an input given non-contiguous is laid out by call()."""
    compiled = compile_once(BMM, "bmm.mc")

    def make(node, shape, gen):
        if node.attrs["name"] == "b":      # a transposed view: strides (24*N, 1, 24)
            return torch.randn(shape[0], shape[2], shape[1], generator=gen).transpose(1, 2)
        return None

    for sizes in ({"B": 2, "S": 2, "N": 3}, {"B": 3, "S": 19, "N": 45}, {"B": 7, "S": 66, "N": 17}):
        check_at(compiled, BMM, "bmm.mc", sizes, torch.float32, make)


def test_gemm_autotunes_once_per_size_bucket_on_cuda():
    """The CUDA module keys the autotuner on the symbolic sizes' power-of-two buckets (a new
    length in a tuned bucket reuses its config) and passes the sizes as runtime arguments."""
    graph, plan = plan_only(load_dsl(MLP_BF16, "mlp_bf16.mc", symbolic=True))
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    src = gen.source
    assert gen.fallbacks == {}
    assert src.count('key=["m_bucket", "N", "K"]') == 2
    assert "M, N: tl.constexpr, K: tl.constexpr, m_bucket" in src
    assert src.count("M=s0*s1, N=96, K=64, m_bucket=triton.next_power_of_2(s0 * s1)") == 1
    assert "tl.make_tensor_descriptor" in src          # the strides are concrete: TMA stays
    # fully symbolic: every size gets its bucket
    graph, plan = plan_only(load_dsl(MLP.replace("f32", "bf16"), "mlp.mc", symbolic=True))
    src = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90)).source
    assert 'key=["m_bucket", "n_bucket", "k_bucket"]' in src
    assert "tl.make_tensor_descriptor" not in src      # strides over symbols: the pointer form


def test_static_gemm_keeps_constexpr_sizes():
    """A static compile of the same program is what it was: sizes constexpr, keyed on them."""
    graph, plan = plan_only(load_dsl(MLP_BF16, "mlp_bf16.mc", dims={"B": 4, "S": 100}))
    src = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90)).source
    assert 'key=["M", "N", "K"]' in src and "_bucket" not in src
    assert "M: tl.constexpr, N: tl.constexpr, K: tl.constexpr" in src

"""GEMM and attention kernels over symbolic sizes: one compile serves every size.

Each DSL program is compiled ONCE with its sizes symbolic (`load_dsl(..., symbolic=True)`), then
called at several odd sizes (not multiples of 16, a length of 2, long rows); every result is
compared with the reference interpreter on the same program compiled with those sizes bound
(`load_dsl(..., dims=...)`), with the dtype's tolerance. No GEMM or attention group may fall back
to PyTorch. The suite's GPU-true check (conftest: sm_90) compiles every kernel these modules hold.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from conftest import tol
from minicomp.api import compile_graph, plan_only
from minicomp.codegen import indexing as ix
from minicomp.codegen.module import generate
from minicomp.frontend.dsl import load_dsl
from minicomp.ir import dims
from minicomp.ir.interpret import run
from minicomp.target import Target

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
DT_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}   # the DSL's names


def compile_once(text: str, name: str, target: Target | None = None):
    """The program compiled with its sizes symbolic, asserting that no group fell back."""
    graph = load_dsl(text, name, symbolic=True)
    assert graph.symbolic
    compiled = compile_graph(graph, [None] * len(graph.inputs), device="cpu", target=target)
    assert compiled.generated.fallbacks == {}, compiled.generated.fallbacks
    return compiled


def check_at(compiled, text: str, name: str, sizes: dict[str, int], dtype: torch.dtype,
             make=None, seed: int = 0, static_compile: bool = False) -> None:
    """Call the symbolic module at `sizes` and compare with the program bound to them: run by
    the interpreter, or (`static_compile`) compiled with those sizes."""
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
    if static_compile:
        want = compile_graph(static, inputs, device="cpu").call(*inputs)
    elif dtype == torch.float32:
        want = run(static, inputs)
    else:
        # eager in half precision rounds every intermediate (the kernels keep them in fp32): the reference is
        # the program in fp32 on the same values, rounded once at the end
        wide = load_dsl(re.sub(r"\bb?f16\b", "f32", text), name, dims=sizes)
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
func mlp(x: bf16[B, S, 64], fc1_w: bf16[96, 64], fc1_b: bf16[96],
        fc2_w: bf16[64, 96], fc2_b: bf16[64]) -> bf16[B, S, 64] {
  h = gelu(linear(x, fc1_w, fc1_b))
  return linear(h, fc2_w, fc2_b)
}
"""


@pytest.mark.parametrize("dtype, tma", [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, False)],
                         ids=["bf16-pointer", "bf16-tma", "f16-pointer"])
def test_linear_layers_over_symbolic_tokens_in_half_precision(dtype, tma):
    """Concrete widths, symbolic batch and length (a linear layer's B*S): the pointer form, and
    the TMA descriptor form (its strides are concrete) under the interpreter."""
    text = MLP_BF16 if dtype == torch.bfloat16 else MLP_BF16.replace("bf16", "f16")
    target = dataclasses.replace(Target.for_device("cpu"), tma_on_cpu=tma)
    compiled = compile_once(text, "mlp_half.mc", target)
    uses_tma = "tl.make_tensor_descriptor" in compiled.generated.source
    assert uses_tma == tma
    for sizes in ({"B": 2, "S": 2}, {"B": 3, "S": 41}, {"B": 2, "S": 300}):
        check_at(compiled, text, "mlp_half.mc", sizes, dtype)


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
    assert src.count("M=s0*s1, N=96, K=64, m_bucket=_rt.next_pow2(s0 * s1)") == 1
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


# --------------------------------------------------------------------------- attention

CAUSAL = """
func attn(q: DT[B, H, S, 32], k: DT[B, H, S, 32], v: DT[B, H, S, 32]) -> DT[B, H, S, 32] {
  return attention(q, k, v, is_causal=true)
}
"""


@pytest.mark.parametrize("dtype", list(DT_NAMES), ids=list(DT_NAMES.values()))
def test_causal_attention_over_symbolic_batch_heads_and_length(dtype):
    """Causal (top-left) attention with B, H and S symbolic, head dim 32: the diagonal blocks,
    the ragged last block and the flattened (batch x head, query block) grid at odd lengths."""
    text = CAUSAL.replace("DT", DT_NAMES[dtype])
    compiled = compile_once(text, "causal.mc")
    assert kinds(compiled) == ["attention"]
    for sizes in ({"B": 2, "H": 2, "S": 2}, {"B": 3, "H": 2, "S": 37}, {"B": 2, "H": 3, "S": 130}):
        check_at(compiled, text, "causal.mc", sizes, dtype)


CROSS = """
func cross(q: f32[2, 3, S, 32], k: f32[2, 3, T, 32], v: f32[2, 3, T, 32]) -> f32[2, 3, S, 32] {
  scores = (q @ transpose(k, -2, -1)) * (1.0 / sqrt(32))
  return softmax(scores, axis=-1) @ v
}
"""


def test_written_out_attention_with_different_symbolic_lengths():
    """The samples' written-out form (matched into one attention node) with a concrete head dim
    and query and key lengths both symbolic and different: long rows of keys included."""
    compiled = compile_once(CROSS, "cross.mc")
    assert kinds(compiled) == ["attention"]
    for sizes in ({"S": 2, "T": 3}, {"S": 37, "T": 19}, {"S": 5, "T": 700}):
        check_at(compiled, CROSS, "cross.mc", sizes, torch.float32)


CAUSAL_CROSS = """
func decode(q: f32[2, 4, S, 16], k: f32[2, 2, T, 16], v: f32[2, 2, T, 16]) -> f32[2, 4, S, 16] {
  return attention(q, k, v, is_causal=true, enable_gqa=true)
}
"""


def test_causal_attention_with_symbolic_query_and_key_lengths_and_grouped_heads():
    """is_causal with Sq != Sk (PyTorch's top-left alignment: fewer queries than keys, and more)
    over grouped KV heads; the causal block bounds are computed from the runtime lengths."""
    compiled = compile_once(CAUSAL_CROSS, "decode.mc")
    assert kinds(compiled) == ["attention"]
    for sizes in ({"S": 2, "T": 2}, {"S": 9, "T": 45}, {"S": 70, "T": 33}):
        check_at(compiled, CAUSAL_CROSS, "decode.mc", sizes, torch.float32)


MASKED = """
func masked(q: f32[B, 2, S, 32], k: f32[B, 2, T, 32], v: f32[B, 2, T, 32], keep: b8[S, T]) -> f32[B, 2, S, 32] {
  return attention(q, k, v, mask=keep)
}
"""


def test_attention_with_a_symbolic_boolean_mask():
    """A boolean mask [S, T] over symbolic lengths, broadcast over batch and heads, loaded through
    its symbolic strides; every row keeps its first key, so no row is empty."""
    compiled = compile_once(MASKED, "masked.mc")
    assert kinds(compiled) == ["attention"]

    def make(node, shape, gen):
        if node.dtype == torch.bool:
            keep = torch.rand(shape, generator=gen) > 0.4
            keep[:, 0] = True
            return keep
        return None

    for sizes in ({"B": 2, "S": 2, "T": 2}, {"B": 3, "S": 23, "T": 41}):
        check_at(compiled, MASKED, "masked.mc", sizes, torch.float32, make)


GPT_BLOCK = (SAMPLES / "gpt_block.mc").read_text()
WIDTHS = {"C": 64, "C3": 192, "F": 256}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gpt_block_sample_one_compile_for_every_batch_and_length(dtype):
    """samples/gpt_block.mc with its widths bound and B, S symbolic: layer norms, four GEMMs
    (B*S folded into M) and causal attention over split heads, all as kernels."""
    text = GPT_BLOCK if dtype == torch.float32 else GPT_BLOCK.replace("f32", "bf16")
    graph = load_dsl(text, "gpt_block.mc", dims=WIDTHS, symbolic=True)
    compiled = compile_graph(graph, [None] * len(graph.inputs), device="cpu")
    assert compiled.generated.fallbacks == {}
    assert sorted(kinds(compiled)) == ["attention"] + ["gemm"] * 4 + ["reduction"] * 2
    if dtype == torch.float32:
        for sizes in ({"B": 2, "S": 2}, {"B": 3, "S": 37}, {"B": 2, "S": 130}):
            check_at(compiled, text, "gpt_block.mc", {**WIDTHS, **sizes}, dtype)
    else:
        # eight roundings to bf16 deep: against static compiles, which round where this module does
        for sizes in ({"B": 2, "S": 2}, {"B": 3, "S": 37}):
            check_at(compiled, text, "gpt_block.mc", {**WIDTHS, **sizes}, dtype, static_compile=True)


def test_attention_autotunes_per_length_bucket_and_leaves_the_hopper_kernel_to_static_graphs():
    """On sm_90 the symbolic module runs the block-language kernel, keyed on the lengths' buckets;
    the same program with its sizes bound (a multiple of 128, head dim 64) still gets the Gluon one."""
    text = CAUSAL.replace("DT", "bf16").replace("32]", "64]")
    graph, plan = plan_only(load_dsl(text, "causal.mc", symbolic=True))
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    assert gen.fallbacks == {} and gen.kernel_names == ["mc_attn_causal_attention_0"]
    assert 'key=["sq_bucket", "sk_bucket"]' in gen.source
    assert "sq_bucket=_rt.next_pow2(s2), sk_bucket=_rt.next_pow2(s2)" in gen.source
    assert "symbolic sizes (the Gluon kernel takes concrete lengths)" in gen.source
    graph, plan = plan_only(load_dsl(text, "causal.mc", dims={"B": 2, "H": 2, "S": 256}))
    static = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    assert static.kernel_names == ["mc_attn_hopper_causal_attention_0"] and "_bucket" not in static.source


LLAMA_BLOCK = (SAMPLES / "llama_block.mc").read_text()
LLAMA_WIDTHS = {"C": 64, "CQ": 64, "CKV": 32, "F": 176, "D": 16}


def test_llama_block_sample_with_symbolic_batch_and_length():
    """samples/llama_block.mc with its widths bound: RMSNorm, rotary embeddings (slices at an
    offset over symbolic strides), grouped-query causal attention, the SwiGLU dual GEMM."""
    graph = load_dsl(LLAMA_BLOCK, "llama_block.mc", dims=LLAMA_WIDTHS, symbolic=True)
    compiled = compile_graph(graph, [None] * len(graph.inputs), device="cpu")
    assert compiled.generated.fallbacks == {}
    assert {"attention", "gemm", "pointwise", "reduction"} == set(kinds(compiled))
    for sizes in ({"B": 2, "S": 2}, {"B": 3, "S": 37}):
        check_at(compiled, LLAMA_BLOCK, "llama_block.mc", {**LLAMA_WIDTHS, **sizes}, torch.float32)


def test_index_bounds_over_symbols_that_these_kernels_need():
    """Two bounds of floor division over symbolic sizes (codegen/index_algebra.py) that hold for
    every size: a folded B*S row index reads [B, S, K] as a plain matrix (the TMA form needs it),
    and an offset a little below 0 (rotary's rotate_half) divides to no less than -1."""
    B, S = dims.sym("B"), dims.sym("S")
    am = ix.sym("am", B * S)
    assert ix.bounds(ix.floordiv(am, S)) == (0, B - 1)
    assert ix.mod(ix.floordiv(am, S), B) * S + ix.mod(am, S) == am
    low, high = ix.bounds(ix.floordiv(ix.sym("x", B * S * 64) - 8, 64 * S))
    assert low == -1
    for b, s_ in ((2, 2), (3, 37), (1000, 7)):         # never below the true top, (64*b*s - 9) // (64*s)
        assert dims.evaluate(high, {"B": b, "S": s_}) >= (64 * b * s_ - 9) // (64 * s_)

"""Attention groups with nothing to fuse call SDPA on CUDA (codegen/library_attention.py).

CPU tests generate for an sm_90 target with no GPU present and check the record
(`GeneratedModule.library`, never `fallbacks`, no kernel for the group), the source and the
switches; the library lines are plain PyTorch, so they also run here on CPU tensors (the
module's device type set to "cpu") against eager, in fp16 and bf16, causal or not, at head
dims 96 and 64 and lengths that are no multiple of 128, with grouped heads written either way,
and over symbolic sizes. What must keep our kernels does: fp32, a mask, a fused epilogue, a
decode step, the switch off, the CPU target, and a shape the Gluon kernel takes. The `gpu`
test runs the module on CUDA against eager.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from library_testing import generate_quietly, run_on_cpu as _run_on_cpu

import minicomp
from minicomp.api import compile_graph
from minicomp.codegen import generate, library_attention
from minicomp.explain import BenchResult, bench_lines
from minicomp.frontend.dsl import load_dsl
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.plan import Group, Plan
from minicomp.plan.table import group_count
from minicomp.runtime import cuda_graphs as cg
from minicomp.target import Target

# the suite's shapes are small: MINICOMP_HOPPER_ATTENTION=1 ("1") takes the Gluon kernel and SDPA
# however small; the default's size rule (`attention_hopper.too_small`) has its own test below
SM90 = Target("cuda", (9, 0), hopper_attention="1", eager_first=False)   # first calls: tests/test_first_calls.py
HALF = [torch.float16, torch.bfloat16]
SDPA_CALL = "torch.nn.functional.scaled_dot_product_attention("


def _generate(fn, inputs, target: Target = SM90):
    return generate_quietly(fn, inputs, target)


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _attention_groups(c):
    return [g for g in c.plan.groups if g.kind == "attention"]


def _assert_sdpa(c):
    """The one attention group calls SDPA: a library choice, no fallback, no kernel of its own."""
    gen = c.generated
    (group,) = _attention_groups(c)
    assert gen.library.get(group.id, "").startswith("SDPA: nothing to fuse (the Gluon kernel does not take it: "), \
        gen.library
    assert gen.fallbacks == {}, gen.fallbacks
    assert group.id not in gen.kernel_groups.values(), gen.kernel_groups
    assert not any(name.startswith("mc_attn") for name in gen.kernel_names), gen.kernel_names
    assert SDPA_CALL in gen.source and "@triton.jit" not in gen.source
    return group


def _assert_ours(c, kernel: str = "mc_attn_"):
    """The attention group runs a kernel of ours (`kernel`: its name's start), not SDPA."""
    gen = c.generated
    (group,) = _attention_groups(c)
    assert group.id not in gen.library and gen.fallbacks == {}, (gen.library, gen.fallbacks)
    names = [n for n, gid in gen.kernel_groups.items() if gid == group.id]
    assert any(n.startswith(kernel) for n in names), gen.kernel_names
    assert SDPA_CALL not in gen.source


# ------------------------------------------------------------------ what calls SDPA, run against eager

def _sdpa(causal: bool):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("b,h,s,d", [(2, 3, 77, 96), (1, 2, 130, 64)], ids=["s77_d96", "s130_d64"])
def test_plain_attention_calls_sdpa_and_gives_eagers_answer(b, h, s, d, causal, dtype):
    inputs = [_randn(b, h, s, d, dtype=dtype, seed=i) for i in range(3)]
    fn = _sdpa(causal)
    c = _generate(fn, inputs)
    group = _assert_sdpa(c)
    gen = c.generated
    assert f"is_causal={causal}" in gen.source and "enable_gqa" not in gen.source
    assert f"-> {gen.library[group.id]}" in gen.source                  # the header's summary line
    assert "1 through SDPA" in gen.source.splitlines()[1]
    (out,) = _run_on_cpu(gen, inputs)
    torch.testing.assert_close(out, fn(*inputs), **tol(dtype))


def _repeat_kv(x, n):
    """transformers' repeat_kv: each KV head repeated n times (expand, then reshape)."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


GQA = {
    "enable_gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    "repeat_kv": lambda q, k, v: F.scaled_dot_product_attention(q, _repeat_kv(k, 3), _repeat_kv(v, 3), is_causal=True),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("form", sorted(GQA))
def test_grouped_query_attention_calls_sdpa_written_either_way(form, dtype):
    inputs = [_randn(2, 6, 40, 64, dtype=dtype), _randn(2, 2, 40, 64, dtype=dtype, seed=1),
              _randn(2, 2, 40, 64, dtype=dtype, seed=2)]
    c = _generate(GQA[form], inputs)
    _assert_sdpa(c)
    if form == "enable_gqa":
        assert "enable_gqa=True)" in c.generated.source
    (out,) = _run_on_cpu(c.generated, inputs)
    torch.testing.assert_close(out, GQA[form](*inputs), **tol(dtype))


def _projected(x, wq, wk, wv, wo):
    """A self-attention block as transformers writes it: q, k, v as transposes of [B, S, H, D]
    projections (non-contiguous), the output transposed back and reshaped into the o_proj."""
    b, s, _ = x.shape
    q, k, v = ((x @ w).view(b, s, -1, 32).transpose(1, 2) for w in (wq, wk, wv))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, -1) @ wo


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_transposed_projections_and_a_transposed_reshaped_output(dtype):
    """The planner gives the output's transpose and reshape to the o_proj's group (cuBLAS, which
    reads them as views): the module is library lines only, the attention's q, k, v permutes of
    the projections. q, k and v are one kernel of ours by default (codegen/gemm_combo.py): with
    that off, the module is library lines only and runs on the CPU."""
    inputs = [_randn(2, 45, 128, dtype=dtype)] + [_randn(128, 128, dtype=dtype, seed=i) * 0.1 for i in range(1, 5)]
    combined = _generate(_projected, inputs).generated
    assert combined.kernel_names == ["mc_gemm3_matmul_0"] and len(combined.library) == 2, combined.library
    c = _generate(_projected, inputs, replace(SM90, gemm_combo="off"))
    group = _assert_sdpa(c)
    g = c.graph
    q = g.node(group.spec.q)
    assert q.op == "permute" and q.id in group.nodes                    # the transposes read in the group
    assert ".permute((0, 2, 1, 3))" in c.generated.source
    assert len(c.generated.library) == len(c.plan.groups) == 5, c.generated.library     # q k v o: cuBLAS
    (out,) = _run_on_cpu(c.generated, inputs)
    torch.testing.assert_close(out, _projected(*inputs), **tol(dtype))


def _fused_qkv(heads: int, d: int):
    """GPT-2's attention: one projection to q, k and v, split along its last dim (slices)."""
    def fn(x, w):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, heads, d).transpose(1, 2) for t in (x @ w).split(heads * d, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return fn


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_fused_qkv_split_at_whole_16_bytes_calls_sdpa(dtype):
    inputs = [_randn(2, 40, 64, dtype=dtype), _randn(64, 3 * 2 * 32, dtype=dtype, seed=1) * 0.2]
    c = _generate(_fused_qkv(2, 32), inputs)          # k at 64 elements, v at 128: whole 16 bytes
    group = _assert_sdpa(c)
    assert [c.graph.node(n).op for n in group.nodes].count("slice") == 3
    (out,) = _run_on_cpu(c.generated, inputs)
    torch.testing.assert_close(out, _fused_qkv(2, 32)(*inputs), **tol(dtype))


def test_a_fused_qkv_split_off_16_bytes_keeps_our_kernel():
    """k starts 60 halves (120 bytes) into the projection: SDPA would read it misaligned."""
    c = _generate(_fused_qkv(3, 20), [_randn(2, 40, 64, dtype=torch.float16),
                                      _randn(64, 3 * 3 * 20, dtype=torch.float16, seed=1)])
    (group,) = _attention_groups(c)
    assert [c.graph.node(n).op for n in group.nodes].count("slice") == 3
    _assert_ours(c)


def _hand_plan_with_trailing_views(dtype):
    """One attention group that also holds the output's transpose(1, 2).reshape(B, S, H*D): a
    plan made by hand (the planner keeps those views out of attention groups)."""
    g = Graph("trailing")
    q, k, v = (C.transpose(g, g.add_input(n, (2, 50, 3, 96), dtype), 1, 2) for n in "qkv")
    attn = C.attention(g, q, k, v, is_causal=True)
    out = g.add("reshape", C.transpose(g, attn, 1, 2), shape=(2, 50, 288))
    g.set_outputs([out])
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    plan = Plan(g.name, [Group(0, "attention", nodes=nodes, inputs=list(g.inputs), outputs=[out], anchor=attn)])
    return g, plan.with_specs(g)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_views_of_the_result_in_the_group_follow_the_sdpa_line(dtype):
    g, plan = _hand_plan_with_trailing_views(dtype)
    gen = generate(g, plan, SM90)
    assert list(gen.library) == [0] and not gen.fallbacks and not gen.kernels
    lines = [ln.strip() for ln in gen.source.splitlines()]
    call = next(i for i, ln in enumerate(lines) if SDPA_CALL in ln)
    assert lines[call + 1].endswith("# %" + str(g.outputs[0] - 1) + " permute")
    assert lines[call + 2].endswith("reshape") and lines[call + 3].startswith(f"buf{g.outputs[0]} = _as_layout(")
    inputs = [_randn(2, 50, 3, 96, dtype=dtype, seed=i) for i in range(3)]
    (out,) = _run_on_cpu(gen, inputs)
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in inputs), is_causal=True)
    torch.testing.assert_close(out, want.transpose(1, 2).reshape(2, 50, 288), **tol(dtype))


def test_a_computing_op_after_the_views_is_no_library_call():
    """The hand-made group with a product after its trailing views: an epilogue that computes,
    which SDPA does not (nor our kernel, whose outputs have the attention's shape: PyTorch)."""
    g, _ = _hand_plan_with_trailing_views(torch.float16)
    squared = g.add("mul", g.outputs[0], g.outputs[0])
    g.set_outputs([squared])
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    anchor = next(n for n in nodes if g.node(n).op == "attention")
    plan = Plan(g.name, [Group(0, "attention", nodes=nodes, inputs=list(g.inputs), outputs=[squared],
                               anchor=anchor)]).with_specs(g)
    gen = generate(g, plan, SM90)
    assert gen.library == {} and list(gen.fallbacks) == [0], (gen.library, gen.fallbacks)
    assert "output shape differs" in gen.fallbacks[0]


SYMBOLIC = """
func attn(q: bf16[B, H, S, 64], k: bf16[B, H, S, 64], v: bf16[B, H, S, 64]) -> bf16[B, H, S, 64] {
  return attention(q, k, v, is_causal=true)
}
"""


def test_symbolic_batch_heads_and_length_are_one_sdpa_module_for_every_size():
    graph = load_dsl(SYMBOLIC, "attn.mc", symbolic=True)
    c = compile_graph(graph, [None] * len(graph.inputs), device="cuda", load=False, target=SM90)
    assert c.graph.symbolic
    _assert_sdpa(c)
    assert "symbolic sizes (the Gluon kernel takes concrete lengths)" in c.generated.library[0]
    for b, h, s in ((2, 3, 17), (3, 2, 77), (2, 2, 130)):
        inputs = [_randn(b, h, s, 64, dtype=torch.bfloat16, seed=i) for i in range(3)]
        (out,) = _run_on_cpu(c.generated, inputs)
        torch.testing.assert_close(out, _sdpa(True)(*inputs), **tol(torch.bfloat16))


def test_minicomp_compile_over_a_changed_length_gives_one_sdpa_module_for_every_length():
    """minicomp.compile's second call at another length compiles over symbolic query and key
    lengths (`dynamic=True` would make the head dim symbolic too, which SDPA's default scale
    1/sqrt(D) refuses: it compiles statically then); the plan it made, written for sm_90, is one
    SDPA line that serves every length."""
    fn = _sdpa(True)
    f = minicomp.compile(fn)
    for s in (40, 77):
        c = f.compile_for(*(_randn(2, 3, s, 64, dtype=torch.float16, seed=i) for i in range(3)))
    assert c.graph.symbolic
    gen = generate(c.graph, c.plan, SM90)
    assert len(gen.library) == 1 and not gen.kernels and not gen.fallbacks, (gen.library, gen.fallbacks)
    for sq, sk in ((40, 40), (33, 129), (130, 17)):
        inputs = [_randn(2, 3, sq if i == 0 else sk, 64, dtype=torch.float16, seed=i) for i in range(3)]
        (out,) = _run_on_cpu(gen, inputs)
        torch.testing.assert_close(out, fn(*inputs), **tol(torch.float16))


def test_library_groups_are_capture_safe_and_the_plan_table_says_sdpa():
    c = _generate(_sdpa(True), [_randn(2, 3, 77, 96, dtype=torch.bfloat16, seed=i) for i in range(3)])
    gen = c.generated
    assert gen.device_type == "cuda" and cg.hazards(c) == []
    (gid,) = gen.library
    table = c.plan.table(fallbacks=gen.fallbacks, library=gen.library)
    assert f"  g{gid} calls SDPA: nothing to fuse" in table and "(SDPA)" in table
    assert group_count(c.plan, gen.fallbacks, gen.library) == "1 group (0 Triton kernels, 1 through SDPA)"
    assert "# plan: 1 group(s), 0 Triton kernel(s), 0 through PyTorch, 1 through SDPA" in gen.source
    lines = bench_lines(c.plan, BenchResult(10.0, {gid + 1: 1.0}), gen.fallbacks, gen.library)   # `--bench`
    assert lines[-1].rstrip().endswith("(SDPA)"), lines


# ------------------------------------------------------------------ what keeps our kernels

def _mask_case():
    keep = torch.rand(40, 40, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[:, 0] = True
    return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), [keep]


@pytest.mark.parametrize("case", ["fp32", "mask", "epilogue", "decode", "decode_short_cache"])
def test_what_sdpa_does_not_compute_as_one_plain_call_keeps_our_kernel(case):
    dtype = torch.float32 if case == "fp32" else torch.float16
    sq, sk = {"decode": (16, 300), "decode_short_cache": (3, 40)}.get(case, (40, 40))
    q = _randn(2, 3, sq, 64, dtype=dtype)
    k, v = (_randn(2, 3, sk, 64, dtype=dtype, seed=i) for i in (1, 2))
    fn, extra = _sdpa(False), []
    if case == "mask":
        fn, extra = _mask_case()
    elif case == "epilogue":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2.0      # noqa: E731
    c = _generate(fn, [q, k, v, *extra])
    # 16 queries over a long cache: the split-KV decode kernel; over a short one the prefill kernel
    _assert_ours(c, "mc_attn_decode" if case == "decode" else "mc_attn_")


def test_a_cast_inside_the_group_keeps_our_kernel():
    """q, k, v cast to bf16 in the attention group (a plan made by hand: the planner may give
    the casts a kernel of their own): our kernel folds the casts into its loads."""
    g = Graph("attn_cast")
    ins = [g.add_input(n, (2, 3, 40, 64), torch.float32) for n in "qkv"]
    attn = C.attention(g, *(g.add("cast", t, dtype=torch.bfloat16) for t in ins), is_causal=True)
    g.set_outputs([attn])
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    plan = Plan(g.name, [Group(0, "attention", nodes=nodes, inputs=ins, outputs=[attn], anchor=attn)]).with_specs(g)
    gen = generate(g, plan, SM90)
    assert gen.library == {} and gen.fallbacks == {} and gen.kernel_names == ["mc_attn_attention_0"], gen.kernel_names
    assert "q, k or v is cast inside the group" in gen.source       # why not the Gluon kernel either


@pytest.mark.parametrize("shapes", [[(2, 3, 40, 64), (2, 1, 40, 64), (2, 1, 40, 64)],      # one KV head, no enable_gqa
                                    [(6, 40, 64)] * 3,                                      # 3-D: no head axis
                                    [(2, 3, 40, 64), (1, 3, 40, 64), (1, 3, 40, 64)]],      # K/V broadcast over batch
                         ids=["mqa_broadcast", "three_d", "batch_broadcast"])
def test_what_sdpas_fused_kernels_refuse_keeps_our_kernel(shapes):
    """SDPA would run its math backend (the scores in memory) for these: ours computes them."""
    c = _generate(_sdpa(False), [_randn(*s, dtype=torch.float16, seed=i) for i, s in enumerate(shapes)])
    _assert_ours(c)


def test_the_switches_off_and_the_cpu_target_keep_our_kernel():
    inputs = [_randn(2, 3, 77, 96, dtype=torch.float16, seed=i) for i in range(3)]
    fn = _sdpa(True)
    _assert_ours(_generate(fn, inputs, replace(SM90, library_attention=False)))
    _assert_ours(_generate(fn, inputs, replace(Target.for_device("cuda", {}, library="off"), capability=(9, 0),
                                               eager_first=False)))
    _assert_ours(_generate(fn, inputs, replace(Target.for_device("cuda", {"MINICOMP_LIBRARY_ATTENTION": "0"}),
                                               capability=(9, 0), eager_first=False)))
    assert Target("cpu").library_attention
    _assert_ours(_generate(fn, inputs, Target("cpu")))


def test_the_environment_and_the_library_mode_set_the_switch():
    assert Target.for_device("cuda", {}).library_attention
    assert Target.for_device("cuda", {"MINICOMP_LIBRARY_ATTENTION": "1"}).library_attention
    assert not Target.for_device("cuda", {"MINICOMP_LIBRARY_ATTENTION": "0"}).library_attention
    assert not Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "0"}).library_attention   # "our kernels only"
    assert not Target.for_device("cuda", {}, library="off").library_attention
    assert Target.for_device("cuda", {"MINICOMP_LIBRARY_GEMM": "0"}, library="on").library_attention
    # the GPU-true check of a CPU module compiles the attention kernels that module runs, not SDPA
    assert not Target("cpu").for_check(90).library_attention and SM90.for_check(90).library_attention


def test_the_compile_cache_keys_on_the_switch(monkeypatch):
    f = minicomp.compile(_sdpa(True))
    inputs = [_randn(1, 2, 20, 16, seed=i) for i in range(3)]
    f(*inputs)
    first = f._need()
    monkeypatch.setenv("MINICOMP_LIBRARY_ATTENTION", "0")
    f(*inputs)
    assert f._need() is not first
    monkeypatch.delenv("MINICOMP_LIBRARY_ATTENTION")
    f(*inputs)
    assert f._need() is first


def test_a_shape_the_gluon_kernel_takes_stays_gluon_and_one_too_small_for_it_keeps_the_block_kernel():
    from minicomp.codegen import attention_hopper
    if not attention_hopper.gluon_hopper_available():
        pytest.skip("this Triton has no Gluon for Hopper")
    inputs = [_randn(2, 4, 256, 64, dtype=torch.float16, seed=i) for i in range(3)]
    _assert_ours(_generate(_sdpa(True), inputs, replace(SM90, hopper_attention="1")), "mc_attn_hopper")
    # the same shape under the default size rule: too small for the Gluon kernel's compile, and
    # launch-bound, so neither Gluon nor SDPA (whose dispatch costs the host more): the block kernel
    c = _generate(_sdpa(True), inputs, replace(SM90, hopper_attention=""))
    _assert_ours(c, "mc_attn_causal_attention")


def test_the_reason_names_why_not_the_gluon_kernel_on_another_gpu():
    c = _generate(_sdpa(False), [_randn(2, 4, 256, 64, dtype=torch.bfloat16, seed=i) for i in range(3)],
                  replace(SM90, capability=(8, 0), hopper_attention="1"))
    _assert_sdpa(c)
    assert library_attention.PLAIN.format(why="the Gluon kernel does not take it: compute capability (8, 0), "
                                              "not 9.0") in c.generated.library.values()


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
def test_gpu_causal_bf16_head_dim_96_matches_eager_through_sdpa():
    q, k, v = (_randn(2, 4, 1000, 96, dtype=torch.bfloat16, seed=i).cuda() for i in range(3))
    fn = _sdpa(True)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(q, k, v), fn(q, k, v), **tol(torch.bfloat16))
    gen = f._need().generated
    assert list(gen.library.values()) and all(w.startswith("SDPA: nothing to fuse") for w in gen.library.values())
    assert not gen.kernels and not gen.fallbacks


def test_by_default_a_launch_bound_attention_keeps_our_kernel_and_a_big_one_calls_sdpa():
    """Under the default MINICOMP_HOPPER_ATTENTION, SDPA takes only attention of at least
    attention_hopper.PAYS_FROM flops: below it the GPU time is a few microseconds and SDPA's
    dispatch costs the host more than our launch (a model at batch 4 x 512 is host-bound)."""
    from minicomp.codegen import attention_hopper

    default = Target("cuda", (9, 0))
    assert default.hopper_attention == ""

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    small = [_randn(2, 4, 77, 96, dtype=torch.bfloat16, seed=i) for i in range(3)]    # 9.1 MFLOP
    c = _generate(sdpa, small, default)
    assert c.generated.library == {} and any(n.startswith("mc_attn") for n in c.generated.kernel_names)
    big = [torch.empty(2, 16, 1000, 96, dtype=torch.bfloat16) for _ in range(3)]        # 6.1 GFLOP
    assert 4 * 32 * 1000 * 1000 * 96 // 2 >= attention_hopper.PAYS_FROM
    c = _generate(sdpa, big, default)
    _assert_sdpa(c)
    (why,) = c.generated.library.values()
    assert "Sq=1000 or Sk=1000 is not a multiple of 128" in why

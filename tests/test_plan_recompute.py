"""Recomputing small values inside a pointwise kernel (plan/rules.py, cost.recompute_flops).

A pointwise kernel evaluates every node at each element of its iteration space, so a value of
fewer elements that it computes (one broadcast over heads, say) is computed again for every
element it is broadcast to. Cheap values (a broadcast add, a mask) stay fused; a value whose
evaluation costs more than `cost.RECOMPUTE_FLOPS` an element (HF's rotary cos and sin, computed
for every head) is computed once in a kernel of its own size, and its readers load it. Each
plan here is also compiled and compared with eager."""

import pytest
import torch

import minicomp
from minicomp.frontend.fx import capture
from minicomp.passes.manager import run_pipeline
from minicomp.plan import cost, plan_graph

PIPELINE = ["constant_fold", "simplify", "cse", "dce", "attention", "dce", "pretranspose"]
TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _plan(fn, inputs):
    g = run_pipeline(capture(fn, inputs), PIPELINE)[0]
    return g, plan_graph(g)


def _ops(g, grp):
    return {g.node(n).op for n in grp.nodes}


def _rotary(x, pos, inv_freq):
    """Rotary embedding as transformers writes it: cos/sin of [S, D] broadcast over [B, H, S, D]."""
    freqs = pos[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rotary_wide(x, pos, inv_freq):
    """`_rotary` in fp32 from the same tables, rounded to x's dtype as the model rounds them: what
    a kernel computing in fp32 and rounding once is held to. Eager in bf16 rounds each product
    first, and x*cos + rot*sin cancels: its own error reaches an ulp of the products (0.016 at
    |x| ~ 3), more than the result's."""
    freqs = pos[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype).float(), emb.sin().to(x.dtype).float()
    xf = x.float()
    half = x.shape[-1] // 2
    return xf * cos + torch.cat((-xf[..., half:], xf[..., :half]), dim=-1) * sin


# A table entry within an fp32 rounding error of a bf16 boundary may round either way on another
# device's cos (one bf16 ulp, 2^-8 at 1): an output then moves by |x| / 256, 0.016 at |x| = 4.
ROTARY_TOL = {torch.float32: TOL[torch.float32], torch.bfloat16: dict(rtol=1.6e-2, atol=4e-2)}


def _rotary_inputs(dtype, b=2, h=3, s=7, d=10, transposed=False):
    g = torch.Generator().manual_seed(0)
    if transposed:   # [B, S, H, D] storage read as [B, H, S, D]: a view, not contiguous
        x = torch.randn(b, s, h, d, generator=g).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, s, d, generator=g).to(dtype)
    pos = torch.arange(s)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    return [x, pos, inv_freq]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_rotary_cos_and_sin_are_computed_once_and_broadcast(dtype, transposed):
    inputs = _rotary_inputs(dtype, transposed=transposed)
    g, plan = _plan(_rotary, inputs)
    trig = [grp for grp in plan.groups if _ops(g, grp) & {"cos", "sin"}]
    assert len(trig) == 1, plan.table()
    [own] = trig
    s, d = inputs[0].shape[2], inputs[0].shape[3]
    assert all(g.node(o).numel == s * d for o in own.outputs), plan.table()
    assert any("would be recomputed" in r.reason for r in plan.rejected), plan.table()
    f = minicomp.compile(_rotary)
    torch.testing.assert_close(f(*inputs).float(), _rotary_wide(*inputs), **ROTARY_TOL[dtype])


def test_the_rule_counts_flops_an_element_of_the_iteration_space():
    """cos and sin of [S, D] inside a kernel over [B, H, S, D] cost about 40 flops an element
    of it; over [S, D] itself, nothing is recomputed."""
    inputs = _rotary_inputs(torch.float32)
    g = capture(_rotary, inputs)
    trig = [n for n in g.nx.nodes if g.node(n).op in ("cos", "sin")]
    space = inputs[0].numel()
    flops, worst = cost.recompute_flops(g, trig, space)
    assert flops > cost.RECOMPUTE_FLOPS and worst in trig
    assert cost.recompute_flops(g, trig, g.node(trig[0]).numel) == (0.0, None)


def _broadcast_add(x, p):
    return torch.relu(x * (p * 2.0 + 1.0) - p)


def _scalar_exp(x, s):
    return x * torch.exp(s) + torch.cos(s)


def _same_size(x, y):
    return torch.sin(x) * torch.cos(y) + x


@pytest.mark.parametrize("fn,shapes", [
    (_broadcast_add, [(2, 3, 5, 9), (5, 9)]),     # a few flops an element: recomputed
    (_scalar_exp, [(4, 33), ()]),                 # a 0-d value is one value a program
    (_same_size, [(6, 17), (6, 17)]),             # nothing smaller than the iteration space
], ids=["broadcast-add", "scalar-exp", "same-size"])
def test_cheap_or_unbroadcast_values_stay_in_one_kernel(fn, shapes):
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(s, generator=g) for s in shapes]
    _, plan = _plan(fn, inputs)
    assert plan.kinds() == ["pointwise"], plan.table()
    torch.testing.assert_close(minicomp.compile(fn)(*inputs), fn(*inputs), **TOL[torch.float32])


def test_a_transformers_llama_computes_its_rotary_tables_once():
    """transformers' Llama called the plain way: its rotary embedding's cos and sin are one
    kernel for the whole call; each layer's q and k rotations read them (no cos or sin of their
    own); the logits match eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval().requires_grad_(False)
    ids = torch.randint(0, 128, (2, 11))

    def fn(ids):
        return model(input_ids=ids).logits

    f = minicomp.compile(fn)
    torch.testing.assert_close(f(ids), fn(ids), **TOL[torch.float32])
    c = f.compile_for(ids)
    g, plan = c.graph, c.plan
    trig = [grp for grp in plan.groups if _ops(g, grp) & {"cos", "sin"}]
    assert len(trig) == 1, plan.table()
    rotations = [grp for grp in plan.groups if grp.kind == "pointwise" and "neg" in _ops(g, grp)]
    assert len(rotations) == 2 * cfg.num_hidden_layers, plan.table()
    assert all(set(trig[0].outputs) & set(grp.inputs) for grp in rotations), plan.table()
    # the tables read only an input, so run() computes them just before the first rotation, after
    # the first layer's projections: the host queues the large kernels first (codegen/module.py)
    run = c.generated.source.split("\ndef run(")[1]
    groups = [line.split(": ")[0] for line in run.splitlines() if line.strip().startswith("# group ")]
    at = {grp.id: groups.index(f"    # group {grp.id}") for grp in plan.groups}
    first_rotation = min(at[grp.id] for grp in rotations)
    assert at[trig[0].id] == first_rotation - 1, groups
    gemms = [grp for grp in plan.groups if grp.kind == "gemm"]
    assert min(at[grp.id] for grp in gemms) < at[trig[0].id], groups


@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True])
def test_gpu_rotary_tables_kernel_matches_eager(transposed):
    """The tables' own kernel and the rotations reading them, on CUDA at a prefill-like size
    (head dim 128, 300 positions: not a power of two), in bf16 against eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    inputs = [t.cuda() for t in _rotary_inputs(torch.bfloat16, b=2, h=8, s=300, d=128, transposed=transposed)]
    f = minicomp.compile(_rotary)
    torch.testing.assert_close(f(*inputs).float(), _rotary_wide(*inputs), **ROTARY_TOL[torch.bfloat16])
    plan = f.compile_for(*inputs).plan
    assert sum(1 for grp in plan.groups if grp.kind == "pointwise") == 2, plan.table()


def test_over_a_symbolic_length_the_tables_are_still_one_kernel():
    """The sequence length marked dynamic: a symbol, so the ratio of the tables' size to the
    rotation's is decided at the hints; one module serves three lengths, each matching eager."""
    f = minicomp.compile(_rotary)
    for s in (7, 13, 30):
        x, pos, inv_freq = _rotary_inputs(torch.float32, s=s)
        inputs = [minicomp.mark_dynamic(x, 2), minicomp.mark_dynamic(pos, 0), inv_freq]
        torch.testing.assert_close(f(*inputs), _rotary(*inputs), **TOL[torch.float32])
    assert f.compiles == 1 and f.graph.symbolic, f.explain()
    c = f.compile_for(*inputs)
    trig = [grp for grp in c.plan.groups if _ops(c.graph, grp) & {"cos", "sin"}]
    assert len(trig) == 1 and len(c.plan.groups) == 2, c.plan.table()

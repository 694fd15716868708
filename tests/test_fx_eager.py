"""The eager tracer (minicomp/frontend/fx_eager.py): the same IR as make_fx for the samples and
the kernel anchors written by hand; declines (and make_fx captures) whatever would let a value decide the graph or
write to the caller's tensors; a fresh process compiles a block without importing dynamo."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tol

from minicomp.errors import MinicompError
from minicomp.frontend.fx import call_inputs, capture
from minicomp.frontend.loader import import_file
from minicomp.ir.interpret import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# whole transformers models are the zoo's (tests/test_zoo.py, through Dynamo)
SAMPLES = sorted(name[:-3] for name in os.listdir(os.path.join(ROOT, "samples")) if name.endswith(".py"))


# the memory-bound and GEMM anchors, written out op by op as a user might
def _gelu_affine(x, w, b):
    return F.gelu(x * w + b, approximate="tanh")


def _softmax_by_hand(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _add_rmsnorm(x, residual, w):
    h = (x + residual).float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype), h.to(x.dtype)


def _layernorm_by_hand(x, w, b):
    h = x.float()
    centred = h - h.mean(-1, keepdim=True)
    return (centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * w + b).to(x.dtype)


def _swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def _causal_attention(q, k, v):
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ v


ANCHORS = {  # name -> (function, input shapes)
    "gelu_affine": (_gelu_affine, [(6, 40), (40,), (40,)]),
    "softmax": (_softmax_by_hand, [(5, 37)]),
    "add_rmsnorm": (_add_rmsnorm, [(5, 48), (5, 48), (48,)]),
    "layernorm": (_layernorm_by_hand, [(7, 33), (33,), (33,)]),
    "swiglu": (_swiglu, [(9, 16), (16, 24), (16, 24), (24, 16)]),
    "causal_attention": (_causal_attention, [(2, 3, 11, 8), (2, 3, 11, 8), (2, 3, 11, 8)]),
}


def built(name: str, device: str, dtype: torch.dtype):
    """(function, inputs) of a sample (its `build`) or an anchor, on `device` in `dtype`."""
    if name in ANCHORS:
        fn, shapes = ANCHORS[name]
        gen = torch.Generator().manual_seed(0)
        return fn, [torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in shapes]
    fn, inputs = import_file(os.path.join(ROOT, "samples", f"{name}.py")).build(device=device, dtype=dtype)
    return fn, inputs


def _canonical(graph) -> list[str]:
    """The IR dump with node ids renumbered in order (the tracers number nodes differently)."""
    lines = graph.dump().splitlines()
    ids = {}
    for line in lines:
        m = re.match(r"\s*%(\d+) =", line)
        if m:
            ids[m.group(1)] = str(len(ids))
    return [re.sub(r"%(\d+)", lambda m: "%" + ids.get(m.group(1), "?"), line) for line in lines]


def both(fn, inputs):
    """(graph, tracer) from the default capture, then the graph make_fx captures."""
    seen = []
    g = capture(fn, inputs, on_tracer=seen.append)
    g_fake = capture(fn, inputs, tracer="fake", on_tracer=seen.append)
    assert seen[1:] == ["fake"]
    return g, seen[0], g_fake


@pytest.mark.parametrize("name", SAMPLES + sorted(ANCHORS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_samples_and_anchors_capture_to_the_same_ir_as_make_fx(name, dtype):
    fn, inputs = built(name, "cpu", dtype)
    g, tracer, g_fake = both(fn, inputs)
    assert tracer == "eager"
    assert _canonical(g) == _canonical(g_fake)


class _Mixed(nn.Module):
    """Odd shapes, broadcasting, in-place ops on intermediates, a buffer, views and a reshape."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(13, 7)
        self.norm = nn.LayerNorm(7)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 7))

    def forward(self, x, bias):
        y = self.norm(self.proj(x)) * self.scale
        y.add_(bias)                       # in place on an intermediate: functionalised
        y[..., 0] = 0.0                    # a write through a view of an intermediate
        z = y.transpose(-1, -2).reshape(x.shape[0], -1)
        return F.softmax(z.float(), dim=-1).to(x.dtype), y.amax(dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_mixed_module_matches_make_fx_and_eager(dtype):
    model = _Mixed().to(dtype)
    inputs = [torch.randn(3, 5, 13, dtype=dtype), torch.randn(5, 1, dtype=dtype)]
    g, tracer, g_fake = both(model, inputs)
    assert tracer == "eager"
    assert _canonical(g) == _canonical(g_fake)
    with torch.no_grad():
        want = model(*inputs)
    for got, w in zip(run(g, call_inputs(g, inputs)), want):
        torch.testing.assert_close(got, w, **tol(dtype))


def _item(x):
    return x * x.sum().item()


def _branch(x):
    return x + 1 if x.sum() > 0 else x - 1


def _tolist(x):
    return x * len([v for v in x.tolist() if v > 0])


def _nonzero(x):
    return x[x > 0].sum() + x.sum()


def _random(x):
    return x + torch.rand_like(x)


@pytest.mark.parametrize("fn", [_item, _branch, _tolist, _nonzero, _random])
def test_value_dependence_and_randomness_are_left_to_make_fx(fn):
    x = torch.randn(4, 3)
    before = x.clone()
    seen = []
    try:
        capture(fn, [x], on_tracer=seen.append)
    except MinicompError:
        pass                        # make_fx's own answer (the data-dependent error) is kept
    assert seen[-1] == "fake"
    assert torch.equal(x, before)


def test_a_write_to_an_input_is_refused_before_it_happens():
    def fn(x):
        x.mul_(2)
        return x + 1

    x = torch.randn(3, 5)
    before = x.clone()
    seen = []
    with pytest.raises(MinicompError, match="input"):
        capture(fn, [x], on_tracer=seen.append)
    assert seen[-1] == "fake"
    assert torch.equal(x, before)


def test_a_write_to_a_buffer_is_declined_and_the_buffer_kept():
    model = nn.BatchNorm1d(6).train()          # training mode updates running stats in place
    stats = model.running_mean.clone()
    x = torch.randn(4, 6)
    seen = []
    try:
        capture(model, [x], on_tracer=seen.append)
    except MinicompError:
        pass
    assert seen[-1] == "fake"
    assert torch.equal(model.running_mean, stats)


def test_a_user_error_comes_from_make_fx_with_the_user_line():
    def fn(x, y):
        return x @ y                 # 3x4 @ 5x2: a shape error in the user's code

    with pytest.raises(MinicompError) as info:
        capture(fn, [torch.randn(3, 4), torch.randn(5, 2)])
    assert "test_fx_eager.py" in str(info.value)


FRESH = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import minicomp
    from minicomp.frontend.loader import import_file
    from minicomp.ir import graph
    block, inputs = import_file({root!r} + "/samples/gpt_block.py").build({device!r}, {dtype})
    fn = minicomp.compile(block)
    fn.compile_for(*inputs)
    if {device!r} == "cuda":                   # the first call too: codegen, compiles, launches
        out = fn(*inputs)
        with torch.no_grad():
            torch.testing.assert_close(out, block(*inputs), atol=2e-2, rtol=2e-2)
    heavy = sorted(m for m in ("torch._dynamo", "sympy", "torch._inductor") if m in sys.modules)
    print("HEAVY", heavy, "META", dict(graph.INFERENCE_MEMO.meta_counts))
""")


def _fresh(device: str, dtype: str, tmp_path) -> None:
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path / "minicomp"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env.pop("MINICOMP_CAPTURE", None)
    out = subprocess.run([sys.executable, "-c", FRESH.format(root=ROOT, device=device, dtype=dtype)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY [] META {}" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_fresh_process_compiles_a_block_without_importing_dynamo(tmp_path):
    _fresh("cpu", "torch.float32", tmp_path)


@pytest.mark.gpu
def test_a_fresh_process_runs_a_block_on_cuda_without_importing_dynamo(tmp_path):
    _fresh("cuda", "torch.bfloat16", tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SAMPLES + sorted(ANCHORS))
def test_samples_and_anchors_on_cuda_capture_to_the_same_ir_as_make_fx(name):
    fn, inputs = built(name, "cuda", torch.bfloat16)
    g, tracer, g_fake = both(fn, inputs)
    assert tracer == "eager"
    assert _canonical(g) == _canonical(g_fake)


def test_the_capture_switch_is_read_into_the_target_and_checked():
    from minicomp.target import Target
    assert Target.for_device("cpu", {}).capture == "eager"
    assert Target.for_device("cpu", {"MINICOMP_CAPTURE": "fake"}).capture == "fake"
    assert Target.for_device("cpu", {"MINICOMP_CAPTURE": "eager"}).capture == "eager"
    with pytest.raises(MinicompError, match="tracer 'fast': expected one of eager, fake"):
        capture(lambda x: x + 1, [torch.randn(2)], tracer="fast")

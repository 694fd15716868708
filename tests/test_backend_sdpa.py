"""`torch.compile(backend="minicomp")` keeps F.scaled_dot_product_attention as one op
(`aot.keep_sdpa`): AOTAutograd would otherwise decompose it to whichever kernel PyTorch picks
while tracing, and under Dynamo with a mask (transformers builds one whenever it traces) that
was the math path: q, k, v cast to fp32, two bmms, a softmax. minicomp then computed exactly
that, 0.9 ms a call slower than its own capture on BERT-base (H100, results/2026-12-05)."""

import contextlib

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import minicomp
import minicomp.dynamo
from conftest import tol
from minicomp.frontend import aot
from minicomp.frontend.fx_trace import SDPA


def _kernels_of_each_compile(monkeypatch) -> list[list[str]]:
    """The kernel names of every graph the backend compiles from here on."""
    seen: list[list[str]] = []
    real = minicomp.dynamo.compile_graph

    def spy(graph, inputs, opts):
        compiled = real(graph, inputs, opts)
        seen.append(list(compiled.generated.kernel_names))
        return compiled
    monkeypatch.setattr(minicomp.dynamo, "compile_graph", spy)
    return seen


def _sdpa_graph(**kwargs) -> fx.GraphModule:
    g = fx.Graph()
    q, k, v, m = (g.placeholder(n) for n in "qkvm")
    g.output(g.call_function(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": m, **kwargs}))
    return fx.GraphModule(nn.Module(), g)


def test_keep_sdpa_turns_the_call_into_minicomp_sdpa_with_its_flags():
    gm = _sdpa_graph(scale=0.5)
    args = [torch.randn(2, 3, 5, 4) for _ in range(3)] + [torch.randn(2, 1, 5, 5)]
    want = gm(*args)
    assert aot.keep_sdpa(gm, args) == 1
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert node.target is SDPA and node.args[3:] == (node.args[3], 0.0, False, 0.5, False), node.args
    torch.testing.assert_close(gm(*args), want, **tol(torch.float32))


def test_keep_sdpa_leaves_a_graph_that_needs_a_gradient_and_a_traced_flag():
    args = [torch.randn(2, 3, 5, 4, requires_grad=True)] + [torch.randn(2, 3, 5, 4) for _ in range(2)]
    args.append(torch.randn(2, 1, 5, 5))
    gm = _sdpa_graph()
    assert aot.keep_sdpa(gm, args) == 0          # grad mode on, q requires grad: PyTorch's derivative
    with torch.no_grad():
        assert aot.keep_sdpa(gm, args) == 1      # no gradient can flow
    g = fx.Graph()
    q, k, v, p = (g.placeholder(n) for n in "qkvp")
    g.output(g.call_function(F.scaled_dot_product_attention, (q, k, v), {"dropout_p": p}))
    gm = fx.GraphModule(nn.Module(), g)
    with torch.no_grad():
        assert aot.keep_sdpa(gm, args) == 0      # a dropout probability that is a graph value


@pytest.mark.parametrize("math", [False, True], ids=["default", "math-sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_transformers_bert_through_the_backend_runs_minicomps_attention(monkeypatch, dtype, math):
    """Called the plain way, under no_grad: every layer's attention is one minicomp kernel, not
    bmm, softmax and bmm; the output matches eager's (a padded batch: the mask is real). On the
    CPU PyTorch picks its flash kernel while tracing, which minicomp lowers too; "math-sdpa"
    traces where the math path is picked, as it was on CUDA."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel._from_config(cfg, attn_implementation="sdpa").to(dtype).eval()
    ids = torch.randint(0, 97, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    seen = _kernels_of_each_compile(monkeypatch)
    backend = minicomp.backend()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        with contextlib.ExitStack() as stack:
            if math:
                stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            got = torch.compile(model, backend=backend)(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, **tol(dtype))
    kernels = [k for names in seen for k in names]
    # the layers share one attention kernel (the same up to names: codegen/dedup.py)
    assert any(k.startswith("mc_attn") for k in kernels) and not any("softmax" in k for k in kernels), kernels
    assert not backend.report().pytorch_ops, backend.report().table()


def test_a_model_trained_through_the_backend_keeps_pytorchs_attention_and_its_gradients():
    torch.manual_seed(0)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    model, x = Attn(), torch.randn(2, 5, 16)
    torch.compile(model, backend=minicomp.backend())(x).backward()
    got = model.qkv.weight.grad.clone()
    model.zero_grad()
    model(x).backward()
    torch.testing.assert_close(got, model.qkv.weight.grad, **tol(torch.float32))

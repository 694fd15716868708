"""Numbers that reach the backend as 0-d CPU tensors (`aot.host_scalars`).

Under `dynamic=True` Dynamo passes a Python float as a 0-d float64 CPU tensor so as not to
recompile when it changes: `math.pi` in GPT-2's GELU, a float argument of the function. On a
GPU a kernel cannot read CPU memory, so such an input used to make the whole graph run
through PyTorch ("inputs are on several devices"). The backend compiles it as a constant of
its value, checked at every call; other values compile again, and a number that keeps
changing is read as a device tensor, copied at each call. Every result is checked against
eager."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import minicomp
from conftest import TEST_DEVICE, tol
from minicomp.dynamo_run import HostScalars


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_a_module_float_becomes_a_constant_of_the_kernel():
    backend = minicomp.backend()
    compiled = torch.compile(_gelu_tanh, backend=backend, dynamic=True)
    for n in (5, 17, 3):
        x = torch.randn(n, 6, device=TEST_DEVICE)
        torch.testing.assert_close(compiled(x), _gelu_tanh(x), **tol(torch.float32))
    rep = backend.report()
    assert not rep.pytorch_ops and not rep.failures, rep.table()
    assert [g.symbolic for g in rep.graphs] == [True] and rep.graphs[0].shapes == 1, rep.table()


def test_a_float_argument_that_changes_compiles_a_few_times_then_is_read_at_each_call():
    def scaled(x, alpha):
        return torch.relu(x) * alpha + 1.0

    backend = minicomp.backend()
    compiled = torch.compile(scaled, backend=backend, dynamic=True)
    x = torch.randn(5, 7, device=TEST_DEVICE)[:, ::2]           # not contiguous
    values = [0.5, 0.5, -0.25, float("nan"), 2.0, 0.5] + [float(k) / 3 for k in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                            # nothing falls back to PyTorch
        for a in values:
            torch.testing.assert_close(compiled(x, a), scaled(x, a), equal_nan=True, **tol(torch.float32))
    rep = backend.report()
    assert not rep.pytorch_ops and not rep.failures, rep.table()
    # the graph that takes alpha: one compile per value up to VERSIONS, then one that reads it
    assert max(g.shapes for g in rep.graphs) == HostScalars.VERSIONS + 1, rep.table()


def test_a_number_that_needs_a_gradient_stays_an_input():
    def f(x, w):
        return (x * w).sum()

    backend = minicomp.backend()
    compiled = torch.compile(f, backend=backend, dynamic=False)
    x = torch.randn(4, 3)
    w = torch.tensor(0.7, requires_grad=True)
    got = compiled(x, w)
    got.backward()
    w2 = w.detach().clone().requires_grad_(True)
    want = f(x, w2)
    want.backward()
    torch.testing.assert_close(got, want, **tol(torch.float32))
    torch.testing.assert_close(w.grad, w2.grad, **tol(torch.float32))


@pytest.mark.gpu
def test_a_cpu_scalar_tensor_beside_cuda_tensors_is_compiled():
    def f(x, scale):
        return torch.softmax(x * scale, dim=-1)

    backend = minicomp.backend()
    compiled = torch.compile(f, backend=backend)
    x = torch.randn(8, 33, device="cuda")
    for v in (0.125, 0.125, 3.0):
        scale = torch.tensor(v)                                  # on the CPU, as eager allows
        torch.testing.assert_close(compiled(x, scale), f(x, scale), **tol(torch.float32))
    rep = backend.report()
    assert not rep.failures and not rep.pytorch_ops, rep.table()


@pytest.mark.gpu
def test_gpt2_over_symbolic_lengths_on_the_gpu_compiles_every_op():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2Model._from_config(
        transformers.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                bos_token_id=0, eos_token_id=0), attn_implementation="sdpa").cuda().eval()
    backend = minicomp.backend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for s in (7, 64, 13):
            ids = torch.randint(0, 97, (2, s), device="cuda")
            mask = torch.ones(2, s, dtype=torch.long, device="cuda")
            mask[1, s // 2:] = 0
            got = compiled(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            want = model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            torch.testing.assert_close(got, want, **tol(torch.float32))
    rep = backend.report()
    assert [(g.symbolic, g.shapes, g.error) for g in rep.graphs] == [(True, 1, None)], rep.table()
    assert not rep.pytorch_ops, rep.table()

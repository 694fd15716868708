"""Greedy `model.generate` with the model's forward compiled by the minicomp backend, as people
speed up generation: the prompt is one graph, and every decode step after it (one new token
against a cache that grows) is one graph over symbols, compiled once. What used to make each
step a compile of its own: the step's cache positions, `arange(past, past + 1)`, which
decomposes to `arange(1) + past` with `past` a size (now a `size_value` node that kernels
compute from their size arguments). Mistral's sliding-window cache keeps window - 1 positions,
so the length it has seen is a size no tensor of the step carries: it comes in through an
empty (length, 0) tensor (`aot.carry_sizes`). The tokens must be eager's, the prompt padded on
the left as batched generation pads it."""

from __future__ import annotations

import warnings

import pytest
import torch

import minicomp
from zoo_models import zoo

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2", "mistral"])
def test_greedy_generation_compiles_the_decode_step_once(name):
    zm = zoo()[name]
    model, eager = zm.model("sdpa"), zm.model("sdpa")
    torch._dynamo.reset()
    backend = minicomp.backend()
    model.forward = torch.compile(model.forward, backend=backend)
    ids = torch.randint(4, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    args = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")       # transformers' notes on generation settings
        got, want = model.generate(**args), eager.generate(**args)
    assert torch.equal(got, want), (got, want)
    rep = backend.report()
    symbolic = [g for g in rep.graphs if g.symbolic]
    # one decode graph (Mistral: two, Dynamo's own split before and after the window fills)
    assert 1 <= len(symbolic) <= 2, rep.table()
    assert all((g.shapes, g.per_shape, g.error) == (1, "", None) for g in symbolic), rep.table()
    assert not rep.pytorch_ops, rep.table()


def test_positions_after_a_cache_are_computed_by_the_kernels():
    def step(x, cache):
        past = cache.shape[1]
        pos = torch.arange(past, past + x.shape[1])
        return x * 2 + pos, pos, cache.sum(-1)

    backend = minicomp.backend()
    compiled = torch.compile(step, backend=backend, dynamic=True)
    for past in (3, 7, 12, 2):
        x, cache = torch.randn(2, 1), torch.randn(2, past)
        for g, w in zip(compiled(x, cache), step(x, cache)):
            torch.testing.assert_close(g, w)
    rep = backend.report()
    assert [(g.symbolic, g.shapes, g.per_shape) for g in rep.graphs] == [(True, 1, "")], rep.table()


def test_a_size_only_given_as_an_argument_comes_in_through_an_empty_tensor():
    def step(x, cache):
        past = cache.shape[1]                  # the graph reads only the size of `cache`
        return x * 2 + torch.arange(past, past + x.shape[1]), past + 1

    backend = minicomp.backend()
    compiled = torch.compile(step, backend=backend, dynamic=True)
    for past in (3, 7, 12):
        x, cache = torch.randn(2, 1), torch.randn(2, past)
        (got, size), (want, wsize) = compiled(x, cache), step(x, cache)
        torch.testing.assert_close(got, want)
        assert size == wsize
    assert [(g.symbolic, g.shapes, g.per_shape) for g in backend.report().graphs] == [(True, 1, "")]

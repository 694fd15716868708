"""The zoo called the plain way at three sequence lengths through `torch.compile(model,
backend=minicomp.backend())`: Dynamo compiles the first length as it is and marks the length
dynamic at the second, and minicomp then compiles that graph once, over symbols, for every
later length. Each call is checked against eager on its unpadded positions.

The models here are the ones that used to compile once per length (`per_shape` in the
report) and why: OPT, RoBERTa and Bloom take a cumsum of the integer mask (scans had a shape
rule for floats only), T5 builds an int64 `full_like` of the length, Mistral and Gemma2 return
the length they were given and slice their sliding-window cache from the end; called with
ids alone through `minicomp.compile`, Bloom and Falcon's causal mask of constants over
symbols stopped the attention matcher."""

from __future__ import annotations

import warnings

import pytest
import torch

import minicomp
from conftest import tol
from zoo_models import VOCAB, zoo

pytest.importorskip("transformers")

LENGTHS = (8, 11, 5)
FIXED = ("opt", "roberta", "bloom", "t5_encoder", "mistral", "gemma2")


def _calls(name: str, use_cache: bool | None, masked: bool = True, entry: str = "backend"):
    zm = zoo()[name]
    model = zm.model("sdpa" if "sdpa" in zm.attns else "eager")
    torch._dynamo.reset()      # Dynamo keeps what it learnt of a forward's sizes per code object
    if entry == "backend":
        backend = minicomp.backend()
        compiled = torch.compile(model, backend=backend)
        report = backend.report
    else:
        compiled = minicomp.compile(model)
        report = lambda: compiled.backend_report()    # noqa: E731 -- read after the calls
    extra = {} if use_cache is None else {"use_cache": use_cache}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")          # transformers' own notes on tiny configs
        for seq in LENGTHS:
            gen = torch.Generator().manual_seed(seq)
            ids = torch.randint(4, VOCAB, (2, seq), generator=gen)
            mask = torch.ones(2, seq, dtype=torch.long)
            if masked:
                mask[1, seq - 2:] = 0
            kwargs = dict(input_ids=ids, **({"attention_mask": mask} if masked else {}), **extra)
            got = getattr(compiled(**kwargs), zm.output)
            want = getattr(model(**kwargs), zm.output)
            valid = mask.bool()
            torch.testing.assert_close(got[valid], want[valid], **tol(torch.float32))
    return report()


@pytest.mark.parametrize("name", FIXED)
def test_a_zoo_model_compiles_once_over_symbols_after_the_first_length(name):
    rep = _calls(name, None)
    symbolic = [g for g in rep.graphs if g.symbolic]
    assert [(g.shapes, g.per_shape, g.error) for g in symbolic] == [(1, "", None)], rep.table()
    assert not rep.pytorch_ops, rep.table()


@pytest.mark.parametrize("name", ["bloom", "falcon"])
def test_minicomp_compile_of_a_model_called_with_ids_alone_compiles_once_over_symbols(name):
    # with no mask these build a causal mask of constants over symbols, which the attention
    # matcher used to size against its evaluation limit (a comparison the symbols cannot decide)
    rep = _calls(name, None, masked=False, entry="compile")
    symbolic = [g for g in rep.graphs if g.symbolic]
    assert [(g.shapes, g.per_shape, g.error) for g in symbolic] == [(1, "", None)], rep.table()
    assert not rep.pytorch_ops, rep.table()


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_a_returned_sliding_window_cache_stays_symbolic_and_matches_eager(name):
    # the cache keeps the last window - 1 positions, keys[:, :, 1 - window:]: a negative start
    # over a symbolic length, which Dynamo guards with length >= window - 1 (so no clamp)
    zm = zoo()[name]
    model = zm.model("sdpa" if "sdpa" in zm.attns else "eager")
    torch._dynamo.reset()
    backend = minicomp.backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seq in LENGTHS:
            ids = torch.randint(4, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seq))
            got, want = compiled(input_ids=ids), model(input_ids=ids)
            torch.testing.assert_close(got.logits, want.logits, **tol(torch.float32))
            pairs = list(zip(_layers(got.past_key_values), _layers(want.past_key_values)))
            assert pairs and all(g[0].shape == w[0].shape for g, w in pairs)
            for (gk, gv), (wk, wv) in pairs:
                torch.testing.assert_close(gk, wk, **tol(torch.float32))
                torch.testing.assert_close(gv, wv, **tol(torch.float32))
    rep = backend.report()
    symbolic = [g for g in rep.graphs if g.symbolic]
    assert [(g.shapes, g.per_shape, g.error) for g in symbolic] == [(1, "", None)], rep.table()


def test_minicomp_compile_of_a_model_that_returns_its_cache_object_goes_through_dynamo():
    # Mistral's mask code reads no values, so its own capture gets as far as the output: a
    # DynamicCache, which no graph holds. That is a refusal (Dynamo takes the model), not an error.
    zm = zoo()["mistral"]
    model = zm.model("sdpa")
    torch._dynamo.reset()
    compiled = minicomp.compile(model)
    ids = torch.randint(4, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad(), pytest.warns(UserWarning, match="returns a transformers.cache_utils.DynamicCache"):
        got = compiled(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.logits, want.logits, **tol(torch.float32))
    for (gk, gv), (wk, wv) in zip(_layers(got.past_key_values), _layers(want.past_key_values)):
        torch.testing.assert_close(gk, wk, **tol(torch.float32))
        torch.testing.assert_close(gv, wv, **tol(torch.float32))


def _layers(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]

"""Hugging Face models over symbolic sequence lengths, called the plain way: one compile
serves every length, through `torch.compile(backend=minicomp.backend(), dynamic=True)` and
through `minicomp.compile(model, dynamic=True)` (which goes through Dynamo for these: the
mask code reads values, and `use_cache=False` is a keyword its own capture does not take).

What used to make each length a compile of its own: `position_ids[:, :seq_len]` (a slice
whose end is a symbol, of a buffer of fixed size), `torch.arange(seq_len)`, and the pooler's
`hidden[:, 0]` over a symbolic batch. Checked against eager at odd lengths with a padded
batch (the mask is real)."""

from __future__ import annotations

import pytest
import torch

import minicomp
from conftest import tol

transformers = pytest.importorskip("transformers")

_SMALL = dict(vocab_size=97, num_hidden_layers=2, max_position_embeddings=64)
MODELS = {
    "bert": lambda: transformers.BertModel._from_config(
        transformers.BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, **_SMALL),
        attn_implementation="sdpa"),
    "gpt2": lambda: transformers.GPT2Model._from_config(
        transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                bos_token_id=0, eos_token_id=0), attn_implementation="sdpa"),
    "llama": lambda: transformers.LlamaModel._from_config(
        transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                 bos_token_id=0, eos_token_id=0, **_SMALL), attn_implementation="sdpa"),
}


@pytest.mark.parametrize("path", ["backend", "compile"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_compiles_once_for_every_sequence_length(name, path):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    if path == "backend":
        backend = minicomp.backend()
        compiled = torch.compile(model, backend=backend, dynamic=True)
        report = backend.report
    else:
        compiled = minicomp.compile(model, dynamic=True)
        report = lambda: compiled.backend_report()    # noqa: E731 -- read after the calls
    kwargs = {} if name == "bert" else {"use_cache": False}
    with torch.no_grad():
        for s in (7, 2, 13, 64):
            ids = torch.randint(0, 97, (2, s))
            mask = torch.ones(2, s, dtype=torch.long)
            mask[1, s // 2:] = 0
            got = compiled(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state
            want = model(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state
            torch.testing.assert_close(got, want, **tol(torch.float32))
    rep = report()
    assert [(g.symbolic, g.shapes, g.per_shape, g.error) for g in rep.graphs] == [(True, 1, "", None)], rep.table()
    # GPT-2's GELU computes sqrt(2 / math.pi); under dynamic=True Dynamo passes math.pi as a 0-d
    # float64 CPU tensor, which the backend folds into the kernel as a constant (aot.host_scalars)
    assert not rep.pytorch_ops, rep.table()


"""Hugging Face embeddings compile to kernels: a tiny random-config GPT-2's token and position
tables (wte(ids) + wpe(arange)) and a tiny Llama's embed_tokens with its rotary cos/sin from
position ids, through `minicomp.compile`, equal eager, with every indirect load in a generated
kernel and no PyTorch fallback; a token id past the vocabulary raises eager's IndexError.

The whole models do not capture yet (transformers' mask code branches on tensor values): that is
the real-models issue's, not this file's.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tol
from test_indirect_loads import assert_in_kernels, compiled

import minicomp
from minicomp.errors import OutOfBoundsError

transformers = pytest.importorskip("transformers")


class GPT2Embeddings(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        pos = torch.arange(ids.shape[-1]).unsqueeze(0)
        return self.m.drop(self.m.wte(ids) + self.m.wpe(pos))


class LlamaEmbeddings(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        h = self.m.embed_tokens(ids)
        pos = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
        cos, sin = self.m.rotary_emb(h, pos)
        return h * 2, cos, sin


def gpt2(vocab: int) -> GPT2Embeddings:
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=40, n_embd=48, n_layer=1, n_head=4,
                                  bos_token_id=0, eos_token_id=0)
    return GPT2Embeddings(transformers.GPT2Model(cfg).eval())


def llama(vocab: int) -> LlamaEmbeddings:
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaEmbeddings(transformers.LlamaModel(cfg).eval())


def no_fallbacks(c) -> None:
    assert not c.generated.fallbacks and all(g.kind != "opaque" for g in c.plan.groups), str(c.plan)


@pytest.mark.parametrize("shape", [(3, 17), (1, 1), (2, 40)])
def test_gpt2_token_and_position_embeddings_are_one_kernel(shape):
    torch.manual_seed(0)
    m = gpt2(301)
    ids = torch.randint(0, 301, shape)
    got, want, c = compiled(m, ids)
    torch.testing.assert_close(got, want, **tol(want.dtype))
    assert_in_kernels(c)
    no_fallbacks(c)
    assert [n.attrs["mode"] for n in c.graph.nodes() if n.op == "index"] == ["embedding"] * 2, c.graph.dump()
    assert len(c.plan.groups) == 1, str(c.plan)
    # the positions are an arange below n_positions: only the token ids are checked in call()
    assert c.generated.source.count("_rt.check_index(") == 1, c.generated.source


def test_llama_token_embeddings_and_rotary_tables_compile_to_kernels():
    torch.manual_seed(0)
    m = llama(257)
    ids = torch.randint(0, 257, (2, 11))
    got, want, c = compiled(m, ids)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol(w.dtype))
    assert_in_kernels(c)
    no_fallbacks(c)


def test_a_token_id_past_the_vocabulary_raises_eagers_error():
    torch.manual_seed(0)
    m = gpt2(50)
    cf = minicomp.compile(m)
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(cf(ids), m(ids))
        ids[1, 3] = 50
        with pytest.raises(IndexError):
            m(ids)
        with pytest.raises(IndexError) as err:
            cf(ids)
    assert isinstance(err.value, OutOfBoundsError), err.value

"""The model zoo: third-party models built from tiny random configs, and their inputs.

Each `ZooModel` builds a `transformers` model from a config small enough for Triton's CPU
interpreter (width 32, one layer, Gemma2 two for its sliding and global layers, 4 heads,
vocab 128), seeded, in eval mode, with no download: one layer is what every later layer
repeats, and the zoo's share of CI stays small. `inputs(kind)` gives its arguments for one
way of calling it:

- "plain": `model(input_ids)` (or pixel values / audio features), no mask;
- "right_pad": a 2-D attention mask whose second row ends in padding;
- "left_pad": a 2-D attention mask whose second row starts with padding (what batched
  generation gives).

`valid` is the (batch, seq) boolean of positions whose outputs mean something: padded
positions compute on padding, and their values are not compared (eager itself fills their
fully masked attention rows by a convention of the mask's fill value). Models that take no
mask (ViT, the Whisper encoder) only have "plain".

Invariant: building a model twice gives the same weights (`torch.manual_seed` before each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

BATCH, SEQ, VOCAB = 2, 8, 128
PAD = 3                                   # padded positions in the second row of a masked batch
CALLS = ("plain", "right_pad", "left_pad")


@dataclass
class ZooModel:
    name: str
    build: Callable[[str], torch.nn.Module]        # attn_implementation -> model
    kind: str = "text"                             # "text", "vision" or "audio"
    output: str = "logits"                         # the output field compared
    calls: tuple[str, ...] = CALLS
    attns: tuple[str, ...] = ("eager", "sdpa")     # transformers has no SDPA path for Gemma2 and Bloom

    def model(self, attn: str) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build(attn).eval()

    def inputs(self, kind: str, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Keyword arguments for one call, and the (batch, seq) mask of positions compared."""
        gen = torch.Generator().manual_seed(1)
        if self.kind == "vision":
            c = model.config
            x = torch.randn(BATCH, c.num_channels, c.image_size, c.image_size, generator=gen)
            return {"pixel_values": x}, None
        if self.kind == "audio":
            c = model.config
            x = torch.randn(BATCH, c.num_mel_bins, 2 * c.max_source_positions, generator=gen)
            return {"input_features": x}, None
        ids = torch.randint(4, VOCAB, (BATCH, SEQ), generator=gen)
        valid = torch.ones(BATCH, SEQ, dtype=torch.bool)
        if kind == "plain":
            return {"input_ids": ids}, valid
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if kind == "right_pad":
            mask[1, SEQ - PAD:] = 0
        elif kind == "left_pad":
            mask[1, :PAD] = 0
        else:
            raise ValueError(kind)
        ids = ids.masked_fill(mask == 0, 0)
        return {"input_ids": ids, "attention_mask": mask}, mask.bool()


def _hf(config_cls: str, model_cls: str, **cfg: Any) -> Callable[[str], torch.nn.Module]:
    """A builder of `transformers.<model_cls>` (or a dotted path under transformers.models)."""
    def build(attn: str) -> torch.nn.Module:
        import importlib

        import transformers
        config = getattr(transformers, config_cls)(**cfg)
        module, _, name = model_cls.rpartition(".")
        owner = importlib.import_module(f"transformers.models.{module}") if module else transformers
        return getattr(owner, name)._from_config(config, attn_implementation=attn)
    return build


_DEC = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)

ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("llama", _hf("LlamaConfig", "LlamaForCausalLM", **_DEC)),
    ZooModel("mistral", _hf("MistralConfig", "MistralForCausalLM", **_DEC, sliding_window=4)),
    ZooModel("qwen2", _hf("Qwen2Config", "Qwen2ForCausalLM", **_DEC)),
    ZooModel("qwen3", _hf("Qwen3Config", "Qwen3ForCausalLM", **_DEC, head_dim=8)),
    ZooModel("gemma", _hf("GemmaConfig", "GemmaForCausalLM", **_DEC, head_dim=8)),
    ZooModel("gemma2", _hf("Gemma2Config", "Gemma2ForCausalLM", **{**_DEC, "num_hidden_layers": 2}, head_dim=8,
                                  sliding_window=4,
                                  query_pre_attn_scalar=8), attns=("eager",)),
    ZooModel("phi3", _hf("Phi3Config", "Phi3ForCausalLM", **_DEC)),
    ZooModel("gpt2", _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4,
                                n_positions=64, pad_token_id=0)),
    ZooModel("gpt_neox", _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                    intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                    max_position_embeddings=64, pad_token_id=0)),
    ZooModel("falcon", _hf("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                  num_hidden_layers=1, num_attention_heads=4, multi_query=True, pad_token_id=0)),
    ZooModel("opt", _hf("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32, ffn_dim=64,
                               num_hidden_layers=1, num_attention_heads=4, word_embed_proj_dim=32,
                               max_position_embeddings=64, pad_token_id=1)),
    ZooModel("bloom", _hf("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=1,
                                 n_head=4, pad_token_id=0), attns=("eager",)),
    ZooModel("bert", _hf("BertConfig", "BertForMaskedLM", vocab_size=VOCAB, hidden_size=32,
                                num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=64, pad_token_id=0)),
    ZooModel("roberta", _hf("RobertaConfig", "RobertaForMaskedLM", vocab_size=VOCAB, hidden_size=32,
                                   num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, pad_token_id=1)),
    ZooModel("distilbert", _hf("DistilBertConfig", "DistilBertForMaskedLM", vocab_size=VOCAB, dim=32,
                                      n_layers=1, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                                      pad_token_id=0)),
    ZooModel("t5_encoder", _hf("T5Config", "T5EncoderModel", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                      num_layers=1, num_heads=4, pad_token_id=0),
             output="last_hidden_state"),
    ZooModel("vit", _hf("ViTConfig", "ViTModel", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64, image_size=16, patch_size=8, num_channels=3),
             kind="vision", output="last_hidden_state", calls=("plain",)),
    ZooModel("whisper_encoder", _hf("WhisperConfig", "whisper.modeling_whisper.WhisperEncoder", d_model=32,
                                           encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=64,
                                           num_mel_bins=16, max_source_positions=8, decoder_layers=1,
                                           decoder_attention_heads=4, decoder_ffn_dim=64, vocab_size=VOCAB),
             kind="audio", output="last_hidden_state", calls=("plain",)),
]}

# MINICOMP_ZOO=all adds these (longer, or variants of a family above)
ZOO_EXTRA: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("falcon_alibi", _hf("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                        num_hidden_layers=2, num_attention_heads=4, alibi=True, multi_query=False,
                                        pad_token_id=0)),
    ZooModel("llama_4layer", _hf("LlamaConfig", "LlamaForCausalLM", **{**_DEC, "num_hidden_layers": 4,
                                                                              "hidden_size": 64})),
]}


def zoo() -> dict[str, ZooModel]:
    """The models the tests run: the zoo, and with MINICOMP_ZOO=all the extra ones."""
    return {**ZOO, **ZOO_EXTRA} if os.environ.get("MINICOMP_ZOO") == "all" else dict(ZOO)

"""Whole third-party models as benchmark workloads: one per family (Llama, Qwen2, GPT-2, BERT).

Invariants (with those of `workloads.py`):
- Each model is built from a `transformers` config with random weights (seeded; no
  download), in eval mode, parameters without grad, on the run's device and dtype.
- `full` sizes are batch 4 x 512 tokens, 4 decoder layers at width 1024-2048 (BERT: the
  base geometry, 12 layers at width 768); `tiny` ones are for the CPU smoke run.
- The timed function is `model(input_ids)` returning the logits (BERT: the last hidden
  state), called the plain way a user calls it, with attention implementation "sdpa".
- Every model workload is also timed through `torch.compile(fn, backend="minicomp")` and
  through `minicomp.compile(fn, library="all")` (cuBLAS for every GEMM, its epilogue fused
  with what follows: how torch.compile's default mode splits a layer), `EXTRA_BACKENDS`, so one
  run times eager, torch.compile, minicomp's own capture, the minicomp backend and that variant.
"""

from __future__ import annotations

from typing import Any

import torch

EXTRA_BACKENDS = ("minicomp_dynamo", "minicomp_cublas")


def minicomp_backend():
    """The name "minicomp" where the entry point is installed, else a backend object of the
    same kind (`minicomp.backend()`: the GPU machine runs the working tree from PYTHONPATH,
    with no installed metadata)."""
    from importlib.metadata import entry_points

    import minicomp
    installed = any(e.name == "minicomp" for e in entry_points(group="torch_dynamo_backends"))
    return "minicomp" if installed else minicomp.backend()


class ModelOutput(torch.nn.Module):
    """`model(input_ids)` as a function of one tensor returning one tensor."""

    def __init__(self, model: torch.nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.field)


def _config(family: str, s: dict[str, Any]):
    import transformers
    w, layers, heads, vocab = s["width"], s["layers"], s["heads"], s["vocab"]
    if family == "llama":
        return transformers.LlamaConfig(vocab_size=vocab, hidden_size=w, intermediate_size=s["hidden"],
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=s["kv_heads"], max_position_embeddings=s["seq"])
    if family == "qwen2":
        return transformers.Qwen2Config(vocab_size=vocab, hidden_size=w, intermediate_size=s["hidden"],
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=s["kv_heads"], max_position_embeddings=s["seq"])
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=w, n_layer=layers, n_head=heads,
                                       n_positions=s["seq"], bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    if family == "bert":
        return transformers.BertConfig(vocab_size=vocab, hidden_size=w, num_hidden_layers=layers,
                                       num_attention_heads=heads, intermediate_size=s["hidden"],
                                       max_position_embeddings=s["seq"])
    raise ValueError(family)


_CLASSES = {"llama": ("LlamaForCausalLM", "logits"), "qwen2": ("Qwen2ForCausalLM", "logits"),
            "gpt2": ("GPT2LMHeadModel", "logits"), "bert": ("BertModel", "last_hidden_state")}


def make_model(family: str):
    def make(device, dtype, s, gen):
        import transformers

        from benchmarks.workloads import Built
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        cls, field = _CLASSES[family]
        model = getattr(transformers, cls)._from_config(_config(family, s), attn_implementation="sdpa")
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=gen).to(device)
        shapes = (f"batch {s['batch']} x {s['seq']} tokens, {s['layers']} layers, width {s['width']}, "
                  f"{s['heads']} heads" + (f" ({s['kv_heads']} KV)" if "kv_heads" in s else "")
                  + f", vocab {s['vocab']}")
        def wide():                     # the model in fp32: what a bf16 run is held to (measure.compare)
            import copy
            return ModelOutput(copy.deepcopy(model).float(), field)(ids)
        return Built(ModelOutput(model, field), [ids], shapes, dict(s), wide=wide)
    return make


def _matmul_flops(family: str, s: dict[str, Any]) -> int:
    """Hand-counted matmul flops of one call (2 per multiply-add): projections, MLP, attention
    (the full score matrix: these calls are causal for decoders, but SDPA kernels differ in
    what they skip), and the LM head."""
    tokens, w, layers, vocab = s["batch"] * s["seq"], s["width"], s["layers"], s["vocab"]
    head_dim = w // s["heads"]
    kv = s.get("kv_heads", s["heads"]) * head_dim
    proj = 2 * tokens * w * (w + 2 * kv + w)
    mlp = 2 * tokens * w * s["hidden"] * (3 if family in ("llama", "qwen2") else 2)
    attn = 2 * 2 * s["batch"] * s["heads"] * s["seq"] * s["seq"] * head_dim
    head = 0 if family == "bert" else 2 * tokens * w * vocab
    return layers * (proj + mlp + attn) + head


TINY = dict(batch=1, seq=8, width=32, layers=2, heads=4, kv_heads=2, hidden=64, vocab=128)


PREFILL = {     # the model workloads' full sizes (issue 22's small-batch ones take batch 1 x 16)
    "llama": dict(batch=4, seq=512, width=2048, layers=4, heads=16, kv_heads=8, hidden=5632, vocab=32000),
    "qwen2": dict(batch=4, seq=512, width=1536, layers=4, heads=12, kv_heads=2, hidden=8960, vocab=32000),
    "gpt2": dict(batch=4, seq=512, width=1024, layers=4, heads=16, hidden=4096, vocab=50257),
    "bert": dict(batch=4, seq=512, width=768, layers=12, heads=12, hidden=3072, vocab=30522),
}


def build_named(name: str, device: str, dtype: torch.dtype, tiny: bool = False, **sizes):
    """A model of PREFILL (TINY sizes with `tiny`; `sizes` over either) or one of the suite's own
    workloads (benchmarks/workloads.py: gemm_bias_gelu, swiglu, llama_block, ...) by name:
    (sizes, Built). SystemExit names the choices for an unknown name."""
    from benchmarks import workloads
    if name in PREFILL:
        s = {**(TINY if tiny else PREFILL[name]), **sizes}
        return s, make_model(name)(device, dtype, s, torch.Generator().manual_seed(0))
    w = workloads.WORKLOADS.get(name)
    if w is None or sizes:
        raise SystemExit(f"{name!r}: a model ({', '.join(PREFILL)}, sizes settable) or a workload of "
                         "benchmarks/run.py --list (its own sizes)")
    return dict(w.tiny if tiny else w.full), w.build(device, dtype, tiny=tiny)


def model_from_args(description: str, rows: int):
    """For the profiling scripts (scripts/profile_model.py, scripts/host_profile.py,
    scripts/timeline_model.py): their arguments (a family, --batch/--seq over its PREFILL
    geometry, --rows, --backend) and the benchmark's model built from them on CUDA in bf16:
    (args, sizes, Built). The family may also name one of the suite's own workloads
    (gemm_bias_gelu, swiglu, llama_block, ...) at its full size; --batch and --seq do not apply."""
    import argparse

    from benchmarks import workloads
    suite = workloads.GROUPS["suite"]
    p = argparse.ArgumentParser(description=description)
    p.add_argument("family", nargs="?", default="bert", choices=sorted(PREFILL) + suite)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--rows", type=int, default=rows, help="rows of the tables printed")
    p.add_argument("--backend", action="store_true", help="torch.compile(backend=minicomp), not minicomp.compile")
    args = p.parse_args()
    given = {k: v for k, v in (("batch", args.batch), ("seq", args.seq)) if v is not None}
    if given and args.family not in PREFILL:
        p.error(f"--batch and --seq are for the models ({', '.join(PREFILL)}), not {args.family}")
    return (args, *build_named(args.family, "cuda", torch.bfloat16, **given))


def model_workloads(workload_cls) -> list:
    """The model workloads, as `workloads.Workload` records."""
    full = PREFILL
    titles = {"llama": "Llama (transformers), model(input_ids) -> logits",
              "qwen2": "Qwen2 (transformers), model(input_ids) -> logits",
              "gpt2": "GPT-2 (transformers), model(input_ids) -> logits",
              "bert": "BERT-base (transformers), model(input_ids) -> last hidden state"}
    out = []
    for family, sizes in full.items():
        tiny = {k: v for k, v in TINY.items() if k in sizes}
        out.append(workload_cls(f"{family}_model", "block", titles[family], sizes, tiny, make_model(family),
                                lambda s, f=family: _matmul_flops(f, s), extra_backends=EXTRA_BACKENDS))
    return out

"""Issue 22's workloads: the shapes minicomp is weak on, decode attention, whole models at
batch 1 x 16, and the sample blocks at several sizes.

Invariants (with those of `workloads.py`):
- Each workload has a `group` (`weak`, `decode`, `small_batch`, `blocks_sweep`) that
  `run.py --only GROUP` selects, and a `Target`: the backend whose time the target is
  measured against and the least speed minicomp must reach against it (issue 22's targets).
- None of them counts in the suite's geometric mean (that stays the existing suite's figure)
  and none is given fresh-process compile-time runs (the whole run must fit one 10-minute
  device call); their first call in this warm process is recorded as for every workload.
- `gemm_fp32_2048_ieee` runs in fp32 whatever `--dtype` says, with
  `torch.backends.cuda.matmul.allow_tf32 = False` for every backend (`Workload.context`
  sets it and puts the old value back around the whole workload).
- Decode attention is written as transformers' eager path writes it (repeat_kv by expand +
  reshape, then SDPA with no mask; `decode_attn_kv*`) and as its SDPA path does on CUDA with
  no mask (SDPA with enable_gqa=True; `decode_attn_gqa_kv*`); SDPA with `enable_gqa=True`
  under each of flash and cuDNN is timed beside both (on the CPU: flash and math, cuDNN being CUDA only), and the target's
  baseline is the fastest of those that passed their check (`report.best_sdpa`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from benchmarks.workloads_models import TINY, make_model, _matmul_flops


def sum_leading(x):
    return x.float().sum(0)


def matmul(a, b):
    return a @ b


def lm_head(x, w):
    return F.linear(x, w)


def logsumexp_fp32(x):
    return torch.logsumexp(x.float(), dim=-1)


def softmax_rows(x):
    return torch.softmax(x, dim=-1)


def make_decode_attention(n_rep: int, head_dim: int) -> Callable:
    """One query against a KV cache, as transformers' Llama attention writes it: the KV heads
    repeated to the query heads by expand + reshape (its `repeat_kv`), then SDPA without a
    mask (one query sees every cached key)."""
    scale = 1.0 / math.sqrt(head_dim)

    def repeat_kv(h):
        b, kv_heads, s, d = h.shape
        return h[:, :, None, :, :].expand(b, kv_heads, n_rep, s, d).reshape(b, kv_heads * n_rep, s, d)

    def decode_attention(q, k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), attn_mask=None,
                                              dropout_p=0.0, scale=scale, is_causal=False)

    return decode_attention


def make_decode_attention_gqa(head_dim: int) -> Callable:
    """The same, as transformers >= 4.5x writes it on CUDA when there is no mask
    (`use_gqa_in_sdpa`): SDPA takes the KV heads as they are, with enable_gqa=True."""
    scale = 1.0 / math.sqrt(head_dim)

    def decode_attention_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    return decode_attention_gqa


def sdpa_under(backend_name: str, scale: float | None = None, gqa: bool = False, causal: bool = False) -> Callable:
    """SDPA restricted to one backend (`torch.nn.attention.SDPBackend` member name); raises
    when that backend cannot run the call, which the run records as that baseline's error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def sdpa(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal, enable_gqa=gqa)

    return sdpa


def sdpa_baselines(device: str, **kw: Any) -> list[tuple[str, Callable]]:
    names = ["FLASH_ATTENTION", "CUDNN_ATTENTION"] if device == "cuda" else ["FLASH_ATTENTION", "MATH"]
    return [(f"sdpa_{n.split('_')[0].lower()}", sdpa_under(n, **kw)) for n in names]


@contextlib.contextmanager
def tf32_off():
    """IEEE fp32 matmuls for the workload's every backend, the caller's setting restored after."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# ----------------------------------------------------------------------------------------
# Builders: (device, dtype, sizes, generator) -> Built.

def _rand(shape, dtype, device, gen, scale: float = 1.0) -> torch.Tensor:
    from benchmarks.workloads import _rand as rand
    return rand(shape, dtype, device, gen, scale)


def _built(*args, **kw):
    from benchmarks.workloads import Built
    return Built(*args, **kw)


def _sum0(device, dtype, s, gen):
    m, n = s["M"], s["N"]
    return _built(sum_leading, [_rand((m, n), dtype, device, gen)], f"x {m}x{n}, sum over dim 0 in fp32", s)


def _gemm(device, dtype, s, gen):
    m, k, n = s["M"], s["K"], s["N"]
    ins = [_rand((m, k), dtype, device, gen), _rand((k, n), dtype, device, gen, k ** -0.5)]
    return _built(matmul, ins, f"{m}x{k} @ {k}x{n} {str(dtype).split('.')[-1]}", s)


def _lm_head(device, dtype, s, gen):
    m, k, n = s["M"], s["K"], s["N"]
    ins = [_rand((m, k), dtype, device, gen), _rand((n, k), dtype, device, gen, k ** -0.5)]
    return _built(lm_head, ins, f"x {m}x{k}, w {n}x{k}", s)


def _rows(fn: Callable, scale: float) -> Callable:
    def make(device, dtype, s, gen):
        m, n = s["M"], s["N"]
        return _built(fn, [_rand((m, n), dtype, device, gen, scale)], f"{m}x{n}", s)
    return make


def _sdpa_causal(device, dtype, s, gen):
    from benchmarks.workloads import sdpa_causal
    b, h, t, d = s["B"], s["H"], s["S"], s["d"]
    ins = [_rand((b, h, t, d), dtype, device, gen) for _ in range(3)]
    return _built(sdpa_causal, ins, f"B{b} H{h} S{t} d{d} causal", s,
                  references=sdpa_baselines(device, causal=True))


def _decode(gqa: bool):
    def make(device, dtype, s, gen):
        b, hq, hkv, kv, d = s["B"], s["Hq"], s["Hkv"], s["KV"], s["d"]
        q = _rand((b, hq, 1, d), dtype, device, gen)
        k, v = (_rand((b, hkv, kv, d), dtype, device, gen) for _ in range(2))
        fn = make_decode_attention_gqa(d) if gqa else make_decode_attention(hq // hkv, d)
        how = ("SDPA(enable_gqa=True), as transformers' use_gqa_in_sdpa does with no mask" if gqa else
               "repeat_kv (expand + reshape) then SDPA, as transformers' eager attention does")
        return _built(fn, [q, k, v], f"B{b} Hq{hq} Hkv{hkv} 1 query, KV {kv}, d{d}", s,
                      references=sdpa_baselines(device, scale=1.0 / math.sqrt(d), gqa=True),
                      notes=[f"the timed function: {how}; the SDPA baselines take enable_gqa=True"])
    return make


def _sample_at(name: str):
    def make(device, dtype, s, gen):
        from benchmarks.workloads import _sample
        return _sample(name)(device, dtype, s, gen)
    return make


# ----------------------------------------------------------------------------------------
# The workloads.

def _attn_flops(s: dict[str, Any], causal: bool) -> int:
    return 2 * 2 * s["B"] * s["H"] * s["S"] * s["S"] * s["d"] // (2 if causal else 1)


def issue22_workloads(workload_cls, target_cls) -> list:
    """The workloads of issue 22, as `workloads.Workload` records, in run order."""
    W, T = workload_cls, target_cls
    vs_tc = T("inductor", 0.95, "≥ 0.95× torch.compile's speed")
    vs_sdpa = T("sdpa_best", 0.95, "≥ 0.95× SDPA's speed (flash or cuDNN, the faster)")
    decode = T("sdpa_best", 1.0, "≤ 1.0× SDPA's time (flash or cuDNN, the faster)")
    ro = ("inductor_ro", "minicomp_ro")
    mm = lambda s: 2 * s["M"] * s["N"] * s["K"]  # noqa: E731
    quick = dict(rounds=3, rep_ms=60.0)
    out = [
        W("sum0_65536x4096", "memory", "x.float().sum(0)", dict(M=65536, N=4096), dict(M=300, N=40),
          _sum0, group="weak", target=vs_tc, **quick),
        W("gemm_k4095", "gemm", "a @ b, K not a multiple of 16", dict(M=4096, K=4095, N=4096),
          dict(M=33, K=31, N=40), _gemm, mm, group="weak", target=vs_tc, **quick),
        W("sdpa_causal_d96", "attention", "F.scaled_dot_product_attention(is_causal=True), head dim 96",
          dict(B=16, H=32, S=1000, d=96), dict(B=1, H=2, S=37, d=96), _sdpa_causal,
          lambda s: _attn_flops(s, True), group="weak", target=vs_sdpa, **quick),
        W("gemm_fp32_2048_ieee", "gemm", "fp32 a @ b with allow_tf32=False",
          dict(M=2048, K=2048, N=2048), dict(M=33, K=40, N=24), _gemm, mm,
          group="weak", target=vs_tc, dtype="float32", context=tf32_off,
          peak_tflops=67.0, **quick),
        W("logsumexp_151936", "memory", "torch.logsumexp(x.float(), -1)", dict(M=64, N=151936),
          dict(M=5, N=1500), _rows(logsumexp_fp32, 2.0), group="weak", target=vs_tc, **quick),
        W("lm_head_50257", "gemm", "F.linear(x, w) to 50257 outputs", dict(M=2048, K=768, N=50257),
          dict(M=17, K=48, N=503), _lm_head, mm, group="weak", target=vs_tc, **quick),
        W("softmax_50257", "memory", "torch.softmax(x, -1) over 50257 columns", dict(M=2048, N=50257),
          dict(M=7, N=503), _rows(softmax_rows, 2.0), group="weak", target=vs_tc, **quick),
    ]
    for gqa, kv in ((False, 4096), (False, 32768), (True, 4096), (True, 32768)):
        out.append(W(f"decode_attn_{'gqa_' if gqa else ''}kv{kv}", "attention",
                     "decode attention, GQA 32/8, " + ("SDPA(enable_gqa=True)" if gqa else "repeat_kv + SDPA"),
                     dict(B=8, Hq=32, Hkv=8, KV=kv, d=128), dict(B=2, Hq=4, Hkv=2, KV=67 if kv == 4096 else 130, d=32),
                     _decode(gqa), lambda s: 2 * 2 * s["B"] * s["Hq"] * s["KV"] * s["d"], group="decode",
                     target=decode, extra_backends=ro, **quick))
    sweep = [
        ("gpt_block", "small", dict(batch=1, seq=256, width=768, heads=12), dict(batch=1, seq=8, width=32, heads=2)),
        ("gpt_block", "medium", dict(batch=4, seq=512, width=1024, heads=16), dict(batch=1, seq=12, width=48, heads=4)),
        ("llama_block", "small", dict(batch=1, seq=256, width=1024, heads=8, kv_heads=2, hidden=2816),
         dict(batch=1, seq=8, width=32, heads=2, kv_heads=1, hidden=64)),
        ("llama_block", "medium", dict(batch=2, seq=1024, width=2048, heads=16, kv_heads=8, hidden=5632),
         dict(batch=1, seq=12, width=48, heads=4, kv_heads=2, hidden=96)),
    ]
    for sample, size, full, tiny in sweep:
        out.append(W(f"{sample}_{size}", "block", f"samples/{sample}.py, {size}", full, tiny, _sample_at(sample),
                     group="blocks_sweep", **quick))
    return out


def small_batch_workloads(workload_cls, target_cls, prefill: dict[str, dict[str, Any]]) -> list:
    """`<family>_b1x16`: the model workloads' geometry at batch 1 x 16 tokens, where launch
    overhead dominates and CUDA graphs (reduce-overhead) are the baseline."""
    # like for like: minicomp's CUDA-graph mode against torch.compile's (the issue's build item 1)
    vs_ro = target_cls("inductor_ro", 1.0, "minicomp r-o ≥ 1.0× torch.compile(mode=\"reduce-overhead\")'s speed",
                       compared="minicomp_ro")
    out = []
    for family, sizes in prefill.items():
        full = dict(sizes, batch=1, seq=16)
        tiny = {k: v for k, v in TINY.items() if k in sizes}
        out.append(workload_cls(f"{family}_b1x16", "block", f"{family} (transformers) at batch 1 x 16 tokens",
                                full, tiny, make_model(family), lambda s, f=family: _matmul_flops(f, s),
                                extra_backends=("inductor_ro", "minicomp_ro"), group="small_batch",
                                target=vs_ro, rounds=3, rep_ms=60.0))
    return out

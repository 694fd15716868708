"""What an `attention` node computes: its reference, and the meaning of each attribute.

    attention(q, k, v[, mask], scale, is_causal, enable_gqa,
              softcap, window, mask_fill, score_dtype, empty_rows)

With the defaults (softcap=0.0, window=0, mask_fill=-inf, score_dtype=None,
empty_rows="zero") it is exactly `F.scaled_dot_product_attention`, and the reference calls
that. The other attributes let the node say what hand-written attention in real models
computes (attention_match.py finds those spellings), per query row i and key j:

    t = scale * (q @ k^T)                      in fp32
    t = softcap * tanh(t / softcap)            softcap > 0 (Gemma2)
    t = t + mask                               a float mask (any float dtype: ALiBi biases, padding)
    t = where(mask, t, mask_fill)              a boolean mask (True keeps; masked_fill's value)
    t = t rounded to score_dtype               eager added the mask in half precision
    t = -inf where j > i, or j <= i - window   is_causal (top-left), window > 0 (Mistral's band)
    out = softmax(t) @ v
    rows whose every t is -inf: 0 (empty_rows="zero", SDPA's answer) or NaN ("nan", softmax's)

Invariant: the reference and codegen/attention.py compute the same thing; any attribute
away from its default makes the reference do the math above in fp32 (and round the result
to q's dtype, as SDPA's half-precision kernels do).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# name -> default: the attributes beyond SDPA's arguments
EXTRA_DEFAULTS: dict[str, object] = {"softcap": 0.0, "window": 0, "mask_fill": -math.inf, "score_dtype": None,
                                     "empty_rows": "zero"}
EMPTY_ROWS = ("zero", "nan")


def is_sdpa(mask: torch.Tensor | None, q: torch.Tensor, is_causal: bool, **extra) -> bool:
    """Whether these attributes mean plain `F.scaled_dot_product_attention`."""
    if any(extra.get(k, d) != d for k, d in EXTRA_DEFAULTS.items()):
        return False
    return mask is None or (not is_causal and mask.dtype in (torch.bool, q.dtype))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor, scale: float, is_causal: bool,
              enable_gqa: bool, softcap: float = 0.0, window: int = 0, mask_fill: float = -math.inf,
              score_dtype: torch.dtype | None = None, empty_rows: str = "zero") -> torch.Tensor:
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"expected q, k and v to have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if empty_rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows must be one of {EMPTY_ROWS}, got {empty_rows!r}")
    m = mask[0] if mask else None
    extra = dict(softcap=softcap, window=window, mask_fill=mask_fill, score_dtype=score_dtype, empty_rows=empty_rows)
    if is_sdpa(m, q, is_causal, **extra):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)
    if window and not is_causal:
        raise ValueError("attention: window needs is_causal")
    hq, hk = q.shape[-3], k.shape[-3]
    if enable_gqa and hq != hk:
        k, v = (t.repeat_interleave(hq // hk, dim=-3) for t in (k, v))
    t = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if softcap:
        t = torch.tanh(t / softcap) * softcap
    if m is not None:
        if m.dtype == torch.bool:
            t = torch.where(m, t, mask_fill)      # a Python number: no copy from the host per call
        else:
            t = t + m.float()
    if score_dtype is not None:
        t = t.to(score_dtype).float()
    if is_causal:
        i = torch.arange(t.shape[-2], device=t.device)[:, None]
        j = torch.arange(t.shape[-1], device=t.device)[None, :]
        keep = j <= i
        if window:
            keep = keep & (j > i - window)
        t = t.masked_fill(~keep, -math.inf)
    p = torch.softmax(t, dim=-1)
    if empty_rows == "zero":
        p = torch.where(torch.isneginf(t).all(dim=-1, keepdim=True), 0.0, p)
    return torch.matmul(p, v.float()).to(q.dtype)

"""Attention masks as real models build them, on the flash kernel (never a PyTorch fallback).

Each test is a small function written the way transformers writes it (read from its
modeling code: Llama's and Gemma2's `eager_attention_forward`, `repeat_kv`, masking_utils'
`sdpa_mask` / `eager_mask` and sliding-window overlay, Bloom's baddbmm over [B*H, S, D],
Falcon's multi-query `q @ k.transpose(-1, -2)`), compiled by `minicomp.compile` and compared
with eager. Each asserts that attention ran on the kernel (`mc_attn...`, no fallback) and,
where the matcher must find it in hand-written code, that the plan holds one attention group.

Fully masked rows are the point of most of them: a left-padded batch gives a padding query
no visible key; eager then averages over every key for a finite `finfo.min` mask, gives NaN
for -inf (hand-written softmax) and 0 for SDPA (CPU flash and math backends alike, PyTorch
2.13, checked below).

CPU runs are Triton's interpreter (fp32, and fp16/bf16 through the interpreter's upcast);
`gpu` tests run fp16/bf16 at realistic lengths. There the kernel (scores in fp32) must be no
further from the function run in fp32 than eager fp16/bf16 is (the real-models issue's
rule): eager rounds the scores to half precision before the softmax, which at realistic
lengths and scales moves an output by more than the half-precision tolerance. On CUDA the
references run on SDPA's math backend: SDPA's CUDA backends disagree on fully masked rows
(seen on the H200, PyTorch 2.11: cuDNN gives zeros where the math backend, like the CPU,
averages over every key for a finite mask). Every kernel is also compiled for sm_90 by
Triton's own compiler (conftest's GPU-true check).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from test_codegen_attention import our_attention_kernels  # noqa: F401  (autouse: our kernels, not SDPA)

import minicomp

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# The interpreter runs on numpy, which warns where the kernel means it: (t - m) * log2(e)
# overflows to -inf for a masked key (exp2 then gives the exact 0), and 0 / 0 is the NaN of
# a row with no visible key (attention_body.py's docstring).
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")]


# --------------------------------------------------------------------------- model-style functions


def repeat_kv(x, n_rep):
    """Llama's: [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D] through expand + reshape."""
    b, hkv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hkv, n_rep, s, d).reshape(b, hkv * n_rep, s, d)


def eager_attention(q, k, v, mask):
    """Llama / Mistral / Qwen2 `eager_attention_forward` (dropout off)."""
    k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
    w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    if mask is not None:
        w = w + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def sdpa_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def where_minus_inf(q, k, v, keep):
    """A hand-written boolean mask: masked scores become -inf (a fully masked row is NaN)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(torch.where(keep, s, float("-inf")), dim=-1) @ v


def masked_fill_min(q, k, v, keep):
    """DeBERTa / MPT style: masked_fill with finfo.min (a fully masked row averages its keys)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, torch.finfo(s.dtype).min)
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def padding_mask(b, s, pad, left=True):
    """[B, S] True for real tokens; batch row i has pad[i] padding tokens (left or right)."""
    keep = torch.ones(b, s, dtype=torch.bool)
    for i, n in enumerate(pad):
        if n:
            if left:
                keep[i, :n] = False
            else:
                keep[i, s - n:] = False
    return keep


def causal_padding_keep(b, s, pad, left=True):
    """masking_utils' sdpa_mask: causal & padding, [B, 1, S, S] boolean."""
    q_idx = torch.arange(s)[None, None, :, None]
    kv_idx = torch.arange(s)[None, None, None, :]
    return (kv_idx <= q_idx) & padding_mask(b, s, pad, left)[:, None, None, :]


def additive(keep, dtype):
    """masking_utils' eager_mask: where(keep, 0, finfo(dtype).min)."""
    return torch.where(keep, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)


# --------------------------------------------------------------------------- helpers


def randn(*shape, dtype=F32, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def qkv(b, hq, hkv, s, d, dtype=F32, sk=None, scale=1.0):
    sk = sk or s
    return (randn(b, hq, s, d, dtype=dtype, seed=1, scale=scale), randn(b, hkv, sk, d, dtype=dtype, seed=2),
            randn(b, hkv, sk, d, dtype=dtype, seed=3))


def attention_node(compiled):
    [node] = [n for n in compiled._last.graph.nodes() if n.op == "attention"]
    return node


def eager(fn, args):
    """fn(*args), on SDPA's math backend for CUDA tensors (see the module docstring)."""
    if not args[0].is_cuda:
        return fn(*args)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return fn(*args)


def no_further_than_eager(out, ref, fn, args, dtype):
    """Half precision on a GPU: NaN where eager has NaN, and elsewhere no further from the
    fp32 run of `fn` than eager is (largest and root-mean-square errors, with 1.25x slack and
    the dtype's absolute tolerance)."""
    wide = eager(fn, [a.float() if a.is_floating_point() else a for a in args]).float()
    assert torch.equal(out.isnan(), ref.isnan())
    ok = ~ref.isnan()
    mine, theirs = (out.float() - wide)[ok].abs(), (ref.float() - wide)[ok].abs()
    atol = tol(dtype)["atol"]
    assert mine.max() <= 1.25 * theirs.max() + atol, (mine.max().item(), theirs.max().item())
    rms = lambda e: e.square().mean().sqrt()
    assert rms(mine) <= 1.25 * rms(theirs) + atol, (rms(mine).item(), rms(theirs).item())


def check(fn, *args, dtype=F32, groups=1):
    """Compile `fn`, compare with eager (NaN where eager has NaN), assert the kernel ran."""
    compiled = minicomp.compile(fn)
    out = compiled(*args)
    ref = eager(fn, args)
    if out.is_cuda and dtype in (F16, BF16):
        no_further_than_eager(out, ref, fn, args, dtype)
    else:
        torch.testing.assert_close(out, ref, equal_nan=True, **tol(dtype))
    gen = compiled._last.generated
    assert not gen.fallbacks, gen.fallbacks
    assert sum(name.startswith("mc_attn") for name in gen.kernel_names) == groups, gen.kernel_names
    if groups:
        assert compiled._last.plan.kinds().count("attention") == groups
    return compiled, out, ref


# --------------------------------------------------------------------------- additive finfo.min masks


@pytest.mark.parametrize("fn,s,d", [(eager_attention, 1, 32), (eager_attention, 7, 64), (eager_attention, 77, 32),
                                    (eager_attention, 129, 80), (eager_attention, 33, 96), (eager_attention, 20, 128),
                                    (sdpa_attention, 7, 64), (sdpa_attention, 77, 32), (sdpa_attention, 129, 80)],
                         ids=["eager-1", "eager-7", "eager-77", "eager-129", "eager-d96", "eager-d128", "sdpa-7",
                              "sdpa-77", "sdpa-129"])
def test_left_padding_finfo_min_rows_average_their_keys(fn, s, d):
    """Llama's left-padded batch: padding queries see no key; eager averages over all of them
    (the kernel once multiplied finfo.min by log2(e), overflowed to -inf and gave 0: off by 3.6)."""
    q, k, v = qkv(2, 3, 3, s, d)
    pad = [min(3, s - 1), 0] if s > 1 else [0, 0]
    mask = additive(causal_padding_keep(2, s, pad), F32)
    compiled, out, ref = check(fn, q, k, v, mask)
    if pad[0]:
        avg = v[0, :, None].mean(dim=-2)                     # each padding row: the mean of all values
        torch.testing.assert_close(out[0, :, :pad[0]], avg.expand_as(out[0, :, :pad[0]]), **tol(F32))
    node = attention_node(compiled)
    assert not node.attrs["is_causal"] and len(node.args) == 4


BROADCASTS = [(2, 1, 1, 21), (2, 1, 21, 21), (1, 3, 21, 21), (2, 3, 1, 21), (21, 21), (1, 21), (3, 1, 21)]


@pytest.mark.parametrize("shape,mask_dtype", [(s, F32) for s in BROADCASTS] + [
    ((2, 1, 21, 21), F16), ((2, 1, 1, 21), F16), ((2, 1, 21, 21), BF16), ((1, 3, 21, 21), BF16)])
def test_masks_broadcast_over_batch_heads_and_queries(shape, mask_dtype):
    """Every broadcast a real model's mask has, in each float dtype, with a fully masked row
    (eager adds an fp16/bf16 mask to fp32 scores in fp32)."""
    q, k, v = qkv(2, 3, 3, 21, 32)
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(5)) > 0.3
    keep[..., 0, :] = False if len(shape) > 1 and shape[-2] > 1 else keep[..., 0, :]
    mask = additive(keep, mask_dtype)
    compiled, _, _ = check(eager_attention, q, k, v, mask)
    assert compiled._last.graph.node(attention_node(compiled).args[3]).dtype == mask_dtype
    # the ragged key block's mask load stays inside the mask: its bounds are parenthesised
    # (`mask_m[:, None] & rn < SK` is `(mask_m & rn) < SK`, which reads rows past Sq)
    assert "& rn < SK" not in compiled.source and "(rn < SK), other=0.0)" in compiled.source


def test_a_padding_mask_sliced_from_a_longer_one():
    """Older transformers: `causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]`, a
    strided view of a longer mask read in place."""
    def sliced(q, k, v, mask):
        return eager_attention(q, k, v, mask[:, :, :, : k.shape[-2]])
    q, k, v = qkv(2, 2, 2, 13, 32)
    mask = additive(causal_padding_keep(2, 20, [4, 0])[:, :, :13], F32)
    check(sliced, q, k, v, mask)


def test_a_padding_query_at_decode_time():
    """One query over 77 cached keys, the first ones padding (generate() with left padding)."""
    q, k, v = qkv(2, 4, 4, 1, 64, sk=77)
    mask = additive(padding_mask(2, 77, [30, 0])[:, None, None, :], F32)
    check(eager_attention, q, k, v, mask)
    check(sdpa_attention, q, k, v, mask)


def test_all_minus_inf_rows_are_nan_in_softmax_and_zero_in_sdpa():
    q, k, v = qkv(2, 2, 2, 9, 32)
    mask = torch.zeros(2, 1, 9, 9)
    mask[0, 0, 3] = float("-inf")                           # query 3 of batch 0 sees nothing
    _, out, _ = check(eager_attention, q, k, v, mask)
    assert out[0, :, 3].isnan().all() and not out[1].isnan().any()
    compiled, out, _ = check(sdpa_attention, q, k, v, mask)
    assert (out[0, :, 3] == 0).all() and attention_node(compiled).attrs["empty_rows"] == "zero"


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_half_precision_padding_rows_on_the_interpreter(dtype):
    """fp16/bf16 eager adds finfo.min to half scores: the padding rows still average (through
    the interpreter's upcast of half dots)."""
    q, k, v = qkv(2, 3, 3, 7, 32, dtype=dtype)
    mask = additive(causal_padding_keep(2, 7, [3, 0]), dtype)
    check(eager_attention, q, k, v, mask, dtype=dtype)
    check(sdpa_attention, q, k, v, mask, dtype=dtype)


def test_fp16_padding_rows_are_weighted_as_eager_rounds_them():
    """In fp16, `s + finfo.min` keeps only multiples of 32 (-65504 + s rounds to -65472 for
    s >= 16...): eager's fully masked row is not a plain average but weights the largest
    scores' keys by e^32 steps. The kernel rounds the masked scores to fp16 as eager does
    (score_dtype), else this row differs completely."""
    q, k, v = qkv(1, 2, 2, 7, 32, dtype=F16, scale=6.0)     # scores of magnitude ~20-40
    mask = additive(causal_padding_keep(1, 7, [4]), F16)
    compiled, out, ref = check(eager_attention, q, k, v, mask, dtype=F16)
    assert attention_node(compiled).attrs["score_dtype"] == F16
    assert ".to(tl.float16).to(tl.float32)" in compiled.source
    plain = v[0, :, None].float().mean(-2)                  # what rounding-free math would not give either
    assert not torch.allclose(ref[0, :, 0].float(), plain, atol=1e-2)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_an_fp32_mask_under_half_scores_keeps_its_finite_min(dtype):
    """Half scores + an fp32 mask add in fp32 (type promotion): finfo(float32).min must not be
    cast to the half type first, where it is -inf (a padding row would become NaN)."""
    q, k, v = qkv(2, 2, 2, 9, 32, dtype=dtype)
    mask = additive(causal_padding_keep(2, 9, [3, 0]), F32)
    compiled, out, _ = check(eager_attention, q, k, v, mask, dtype=dtype)
    assert not out.isnan().any()
    assert compiled._last.graph.node(attention_node(compiled).args[3]).dtype == F32


# --------------------------------------------------------------------------- boolean masks


def test_sdpa_gives_zero_for_rows_with_no_visible_key_on_every_cpu_backend():
    """What "eager" means for SDPA's fully masked rows (PyTorch 2.13, CPU): 0, from the default
    (flash) kernel and the math backend alike, for a boolean and a -inf additive mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = qkv(1, 2, 2, 5, 16)
    keep = torch.ones(5, 5, dtype=torch.bool)
    keep[2] = False
    minus_inf = torch.zeros(5, 5).masked_fill(~keep, float("-inf"))
    for m in (keep, minus_inf):
        default = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        with sdpa_kernel(SDPBackend.MATH):
            math_ = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        assert (default[:, :, 2] == 0).all() and (math_[:, :, 2] == 0).all()
        torch.testing.assert_close(default, math_, **tol(F32))


@pytest.mark.parametrize("shape", [(2, 1, 11, 11), (2, 1, 1, 11), (11, 11), (1, 3, 11, 11)])
def test_sdpa_boolean_masks_with_all_false_rows(shape):
    q, k, v = qkv(2, 3, 3, 11, 32)
    keep = causal_padding_keep(2, 11, [4, 0]) if shape == (2, 1, 11, 11) else (
        torch.rand(shape, generator=torch.Generator().manual_seed(3)) > 0.4)
    if shape[-2] > 1:
        keep[..., 1, :] = False
    else:
        keep[0] = False                                    # batch 0 sees no key at all
    _, out, ref = check(sdpa_attention, q, k, v, keep)
    assert (ref == 0).any(dim=-1).any() and not out.isnan().any()


@pytest.mark.parametrize("fn", [where_minus_inf, masked_fill_min], ids=["where_-inf", "masked_fill_min"])
@pytest.mark.parametrize("s,d", [(7, 32), (77, 64)])
def test_hand_written_boolean_masks(fn, s, d):
    """where(keep, s, -inf): a row with no visible key is NaN, as eager's softmax gives;
    masked_fill(~keep, finfo.min): that row is the average of all values."""
    q, k, v = qkv(2, 2, 2, s, d)
    keep = causal_padding_keep(2, s, [3, 0])
    compiled, out, _ = check(fn, q, k, v, keep)
    node = attention_node(compiled)
    assert compiled._last.graph.node(node.args[3]).dtype == torch.bool and node.attrs["empty_rows"] == "nan"
    if fn is where_minus_inf:
        assert out[0, :, :3].isnan().all() and not out[0, :, 3:].isnan().any()
    else:
        assert node.attrs["mask_fill"] == torch.finfo(F32).min
        torch.testing.assert_close(out[0, :, 0], v[0].mean(-2), **tol(F32))


# --------------------------------------------------------------------------- sliding windows (Mistral)


def sliding_window_keep(s, window, device=None):
    """masking_utils: and_masks(sliding_window_overlay(W), causal_mask_function), [1, 1, S, S]."""
    q_idx = torch.arange(s, device=device)[None, None, :, None]
    kv_idx = torch.arange(s, device=device)[None, None, None, :]
    return (kv_idx > q_idx - window) & (kv_idx <= q_idx)


def mistral_eager(window):
    def attention(q, k, v):
        keep = sliding_window_keep(q.shape[-2], window, q.device).expand(q.shape[0], -1, -1, -1)
        return eager_attention(q, k, v, additive(keep, q.dtype))
    return attention


def mistral_sdpa(window):
    def attention(q, k, v):
        return sdpa_attention(q, k, v, sliding_window_keep(q.shape[-2], window, q.device))
    return attention


def mistral_padded(window):
    def attention(q, k, v, pad):
        keep = sliding_window_keep(q.shape[-2], window, q.device) & pad[:, None, None, :]
        return eager_attention(q, k, v, additive(keep, q.dtype))
    return attention


@pytest.mark.parametrize("s,w,d", [(77, 16, 32), (129, 100, 64), (7, 3, 80), (33, 40, 32)])
@pytest.mark.parametrize("build", [mistral_eager, mistral_sdpa], ids=["eager", "sdpa"])
def test_a_sliding_window_built_in_the_function_is_a_band_on_the_kernel(build, s, w, d):
    """The constant band becomes is_causal + window: no mask is read, blocks left of the band
    are skipped (W=100 at S=129 also runs the unmasked middle loop); W >= S is plain causal."""
    q, k, v = qkv(2, 4, 2, s, d)
    compiled, _, _ = check(build(w), q, k, v)
    node = attention_node(compiled)
    assert node.attrs["is_causal"] and len(node.args) == 3 and node.attrs["enable_gqa"]
    assert node.attrs["window"] == (w if w < s else 0)
    assert ("lo = " in compiled.source) == (w < s)


def test_a_sliding_window_with_left_padding_reads_the_mask():
    """Window & padding depends on an input: a mask tensor, fully masked rows averaged."""
    q, k, v = qkv(2, 2, 2, 21, 32)
    pad = padding_mask(2, 21, [5, 0])
    compiled, out, _ = check(mistral_padded(6), q, k, v, pad)
    assert len(attention_node(compiled).args) == 4
    torch.testing.assert_close(out[0, :, 0], v[0].mean(-2), **tol(F32))


# --------------------------------------------------------------------------- soft-capping (Gemma2)


def gemma2_eager(cap, scaling, window=None):
    """Gemma2's eager_attention_forward: scale, tanh soft-cap, then the mask."""
    def attention(q, k, v, mask=None):
        k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
        w = torch.matmul(q, k.transpose(2, 3)) * scaling
        w = w / cap
        w = torch.tanh(w)
        w = w * cap
        if window is not None:           # a sliding layer: the band is built here, constant
            mask = additive(sliding_window_keep(q.shape[-2], window, q.device), q.dtype)
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)
    return attention


@pytest.mark.parametrize("s,d", [(7, 32), (77, 96)])
def test_soft_capping_with_left_padding(s, d):
    q, k, v = qkv(2, 4, 2, s, d, scale=4.0)                  # scores large enough to saturate tanh
    mask = additive(causal_padding_keep(2, s, [2, 0]), F32)
    compiled, _, _ = check(gemma2_eager(3.0, 0.125), q, k, v, mask)
    node = attention_node(compiled)
    assert node.attrs["softcap"] == 3.0 and node.attrs["scale"] == 0.125 and node.attrs["enable_gqa"]


def test_soft_capping_on_a_sliding_layer():
    """Gemma2's sliding layers: softcap + window, neither a mask tensor nor a fallback."""
    q, k, v = qkv(1, 2, 2, 45, 64, scale=4.0)
    compiled, _, _ = check(gemma2_eager(5.0, 64 ** -0.5, window=8), q, k, v)
    node = attention_node(compiled)
    assert node.attrs["softcap"] == 5.0 and node.attrs["window"] == 8 and len(node.args) == 3


# --------------------------------------------------------------------------- ALiBi (Bloom, Falcon)


def alibi_slopes(heads):
    """The ALiBi paper's geometric slopes, 2^(-8 i / H) for a power-of-two H."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)])


def build_alibi(pad, heads):
    """Bloom's build_alibi_tensor: slope * position (positions counted over real tokens), [B*H, 1, S]."""
    positions = ((pad.long().cumsum(dim=-1) - 1) * pad)[:, None, :].float()
    alibi = alibi_slopes(heads)[None, :, None] * positions
    return alibi.reshape(pad.shape[0] * heads, 1, pad.shape[1])


def bloom_attention(q, k, v, alibi, mask):
    """Bloom: scores over [B*H, S, D] by baddbmm(alibi, q, k^T), viewed as [B, H, S, S] for the mask."""
    b = mask.shape[0]
    bh, s, d = q.shape
    scores = alibi.baddbmm(batch1=q, batch2=k.transpose(-1, -2), beta=1.0, alpha=1.0 / math.sqrt(d))
    w = scores.view(b, bh // b, s, -1) + mask
    probs = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(probs.view(bh, s, -1), v)


def falcon_alibi_attention(q, k, v, alibi, mask):
    """Falcon's ALiBi path: the bias added before the scale, which scales it too."""
    b, h, s, d = q.shape
    scores = (q @ k.transpose(-1, -2)).view(b, h, s, -1)
    logits = scores + alibi.view(b, h, 1, -1)
    logits *= 1.0 / math.sqrt(d)
    probs = F.softmax(logits + mask, dim=-1, dtype=q.dtype)
    return probs @ v


@pytest.mark.parametrize("s,d", [(7, 64), (77, 32)])
def test_bloom_alibi_with_left_padding(s, d):
    b, h = 2, 4
    pad = padding_mask(b, s, [3, 0])
    q, k, v = (randn(b * h, s, d, seed=i) for i in range(3))
    alibi, mask = build_alibi(pad, h), additive(causal_padding_keep(b, s, [3, 0]), F32)
    compiled, _, _ = check(bloom_attention, q, k, v, alibi, mask)
    node = attention_node(compiled)
    assert node.shape == (b, h, s, d) and len(node.args) == 4 and node.attrs["scale"] == 1.0 / math.sqrt(d)


def test_falcon_alibi_scaled_with_the_scores():
    b, h, s, d = 2, 4, 21, 32
    pad = padding_mask(b, s, [5, 0])
    q, k, v = qkv(b, h, h, s, d)
    check(falcon_alibi_attention, q, k, v, build_alibi(pad, h), additive(causal_padding_keep(b, s, [5, 0]), F32))


def paper_alibi(q, k, v):
    """ALiBi as the paper writes it: a per-head linear bias -slope * (i - j), causal, built here."""
    h, s = q.shape[1], q.shape[-2]
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    bias = -alibi_slopes(h)[:, None, None] * (i - j).float()
    bias = bias.masked_fill(j > i, float("-inf"))
    w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(w, dim=-1) @ v


def test_a_per_head_linear_bias_built_in_the_function():
    q, k, v = qkv(2, 4, 4, 33, 32)
    compiled, _, _ = check(paper_alibi, q, k, v)
    assert len(attention_node(compiled).args) == 4


# --------------------------------------------------------------------------- GQA down to one KV head


def falcon_multi_query(q, k, v, mask):
    """Falcon's eager path: k and v of one head broadcast in the matmuls, an in-place scale."""
    scores = q @ k.transpose(-1, -2)
    scores /= math.sqrt(q.shape[-1])
    scores = F.softmax(scores + mask, dim=-1, dtype=q.dtype)
    return scores @ v


def sdpa_broadcast_heads(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn,hkv", [(eager_attention, 2), (eager_attention, 1), (sdpa_attention, 1),
                                    (sdpa_attention, 3), (falcon_multi_query, 1), (sdpa_broadcast_heads, 1)],
                         ids=["repeat_kv-2", "repeat_kv-1", "enable_gqa-1", "enable_gqa-3", "falcon-mqa",
                              "sdpa-broadcast"])
def test_grouped_and_multi_query_heads_with_left_padding(fn, hkv):
    q, k, v = qkv(2, 6, hkv, 19, 64)
    mask = additive(causal_padding_keep(2, 19, [4, 0]), F32)
    compiled, _, _ = check(fn, q, k, v, mask)
    node = attention_node(compiled)
    # SDPA's own broadcast of one KV head needs no enable_gqa: the kernel reads head 0 for all
    assert node.attrs["enable_gqa"] or fn is sdpa_broadcast_heads
    assert compiled._last.graph.node(node.args[1]).shape[1] == hkv


# --------------------------------------------------------------------------- GPU (fp16 / bf16)


def cuda(*tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("fn", [eager_attention, sdpa_attention], ids=["eager", "sdpa"])
def test_gpu_left_padded_llama_batch(fn, dtype):
    q, k, v = cuda(*qkv(2, 8, 2, 1000, 128, dtype=dtype))
    mask = additive(causal_padding_keep(2, 1000, [300, 0]), dtype).cuda()
    _, out, _ = check(fn, q, k, v, mask, dtype=dtype)
    assert not out.isnan().any()


@pytest.mark.gpu
def test_gpu_fp16_padding_rows_weighted_as_eager_rounds_them():
    q, k, v = cuda(*qkv(1, 4, 4, 513, 64, dtype=F16, scale=6.0))
    check(eager_attention, q, k, v, additive(causal_padding_keep(1, 513, [100]), F16).cuda(), dtype=F16)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", [sdpa_attention, where_minus_inf, masked_fill_min],
                         ids=["sdpa", "where_-inf", "masked_fill_min"])
def test_gpu_boolean_masks_with_all_false_rows(fn):
    q, k, v = cuda(*qkv(2, 4, 4, 777, 64, dtype=F16))
    check(fn, q, k, v, causal_padding_keep(2, 777, [200, 0]).cuda(), dtype=F16)


@pytest.mark.gpu
@pytest.mark.parametrize("build", [mistral_eager, mistral_sdpa], ids=["eager", "sdpa"])
def test_gpu_mistral_sliding_window(build):
    q, k, v = cuda(*qkv(1, 8, 2, 2048, 128, dtype=BF16))
    compiled, _, _ = check(build(256), q, k, v, dtype=BF16)
    assert attention_node(compiled).attrs["window"] == 256


@pytest.mark.gpu
def test_gpu_gemma2_soft_capping():
    q, k, v = cuda(*qkv(2, 8, 4, 1024, 128, dtype=BF16, scale=4.0))
    mask = additive(causal_padding_keep(2, 1024, [100, 0]), BF16).cuda()
    check(gemma2_eager(50.0, 256 ** -0.5), q, k, v, mask, dtype=BF16)
    check(gemma2_eager(50.0, 256 ** -0.5, window=128), q, k, v, dtype=BF16)


@pytest.mark.gpu
def test_gpu_bloom_alibi_and_falcon_multi_query():
    b, h, s, d = 2, 8, 512, 64
    pad = padding_mask(b, s, [64, 0])
    q, k, v = cuda(*(randn(b * h, s, d, dtype=F16, seed=i) for i in range(3)))
    mask = additive(causal_padding_keep(b, s, [64, 0]), F16).cuda()
    check(bloom_attention, q, k, v, build_alibi(pad, h).to(F16).cuda(), mask, dtype=F16)
    q, k, v = cuda(*qkv(b, h, 1, s, d, dtype=BF16))
    check(falcon_multi_query, q, k, v, additive(causal_padding_keep(b, s, [64, 0]), BF16).cuda(), dtype=BF16)


# --------------------------------------------------------------------------- the PyTorch path


@pytest.mark.parametrize("case", ["softcap_window", "masked_fill_min", "fp32_mask_under_bf16"])
def test_a_group_run_through_pytorch_computes_the_same(case):
    """When an attention group cannot run its kernel (Triton rejects it on a GPU, say), the
    PyTorch line calls the node's reference: soft-capping, windows, fills and a mask dtype SDPA
    refuses keep eager's meaning there too."""
    from minicomp.codegen import generate
    from minicomp.runtime import load
    if case == "softcap_window":
        fn, args = gemma2_eager(5.0, 0.125, window=6), qkv(1, 2, 2, 17, 32, scale=4.0)
    elif case == "masked_fill_min":
        fn, args = masked_fill_min, qkv(2, 2, 2, 9, 32) + (causal_padding_keep(2, 9, [3, 0]),)
    else:
        fn, args = eager_attention, qkv(2, 2, 2, 9, 32, dtype=BF16) + (additive(causal_padding_keep(2, 9, [3, 0]), F32),)
    dtype = args[0].dtype
    compiled = minicomp.compile(fn)
    compiled(*args)
    last = compiled._last
    [gid] = [g.id for g in last.plan.groups if g.kind == "attention"]
    gen = generate(last.graph, last.plan, "cpu", forced_fallbacks={gid: "forced by the test"})
    assert gen.fallbacks == {gid: "forced by the test"} and "attention_ref" in gen.source
    out = load(gen, "cpu")(*args)
    torch.testing.assert_close(out[0], fn(*args), equal_nan=True, **tol(dtype))

"""Attention groups with nothing to fuse, written as PyTorch lines that call SDPA (CUDA targets).

An `attention` group that reads q, k and v through strided views only (reshape, permute,
expand, slice: no cast), with no mask tensor and none of attention_ref's extras (soft-capping,
a window, a fill value, eager's rounding: the plain branch of the node's PyTorch form,
ir/ops/linalg.py `_attention_text`) and no epilogue that computes (views of the result, such as
`o.transpose(1, 2).reshape(b, s, -1)`, may follow it in the group), saves no bytes by fusing,
and PyTorch's `F.scaled_dot_product_attention` (flash or cuDNN) is faster than our
block-language kernel (codegen/attention.py). On the H200 ours took about 1.2x SDPA's time at
every shape measured (B16 H32 S1000 d96 causal: 0.361 ms against 0.312; B8 H16 S1024 d64:
0.111 against 0.091; B4 H32/8 S2048 d128: 0.354 against 0.291), and its first call compiled
for ~2.5 s where SDPA compiles nothing. Only the Gluon Hopper kernel
(codegen/attention_hopper.py) beats SDPA, so the order is: the Gluon kernel where it takes the
group (`attention_hopper.why_not` is None; a group it declines only because it would not pay
for its compile goes to SDPA too, which compiles nothing), then SDPA, then the block-language
kernel. Such a group is written as the SDPA line of `call()` between its views and recorded on
the generated module as a library choice (`GeneratedModule.library`: "SDPA: nothing to fuse
(why the Gluon kernel does not take it)"), as codegen/library.py records cuBLAS: it is what
minicomp chose, not a fallback, and it warns about nothing.

Our kernels keep (`choice` is None):
- decoding, a concrete query length of at most attention_decode.MAX_QUERIES: the split-KV
  decode kernel (codegen/attention_decode.py) matched SDPA's time there;
- a static attention of under attention_hopper.PAYS_FROM flops (a few microseconds of GPU
  time), unless MINICOMP_HOPPER_ATTENTION=1: SDPA's dispatch costs the host 2-3x a Triton
  launch, and the models at batch 4 x 512 are host-bound on the H200 (BERT-base: 1.58 ms of GPU
  time a call in 3.27 ms), so there the cheaper launch wins over SDPA's faster kernel;
- fp32 operands (SDPA's fp32 backend is slower than its half ones), q, k and v of different
  dtypes, or a cast inside the group;
- a mask tensor, an extra attribute, an epilogue that computes, another output;
- operands that SDPA's fused kernels do not take as they are, so that its math backend (the
  score matrix in memory) would run: not 4-D, batch sizes that differ (broadcast), or query
  heads over fewer KV heads that the node does not mark `enable_gqa` (or that do not divide);
- q, k or v sliced (a fused QKV projection's split) to an offset that is not a whole number of
  16 bytes, or not known to be one (symbolic sizes): PyTorch's cuDNN attention answered wrongly
  for a misaligned query (`_aligned`).

`choice(ctx)` says whether (and why) a group calls SDPA; `emit(ctx, out, slot)` writes its lines.

Invariants:
- only CUDA targets with `Target.library_attention` on choose SDPA; the CPU target never does
  (the interpreter path keeps testing our attention kernels), nor does the GPU-true check of a
  CPU module (`Target.for_check`); MINICOMP_LIBRARY_ATTENTION=0, or library mode "off", turns
  it off;
- the SDPA line is the attention node's own PyTorch form (`_attention_text`'s plain branch:
  what the reference interpreter calls), so the group computes what eager computes;
- the lines hold no sizes, so they serve symbolic sizes unchanged, and launch nothing but
  SDPA's kernels (and a copy where a layout asks for one): they are safe inside a CUDA graph
  capture.
"""

from __future__ import annotations

from typing import Callable

import torch

from minicomp.codegen import attention, attention_decode, attention_hopper
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, Unsupported
from minicomp.codegen.fallback import torch_text
from minicomp.codegen.names import comment_text
from minicomp.ir import dims
from minicomp.ir.attention_ref import EXTRA_DEFAULTS
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.graph import Node
from minicomp.ir.ops.text import py_value
from minicomp.ir.ops.views import STRIDED
from minicomp.plan.rules import topo
from minicomp.plan.specs import AttentionSpec

PLAIN = "SDPA: nothing to fuse ({why})"
DTYPES = (torch.float16, torch.bfloat16)     # SDPA's flash and cuDNN backends; fp32 keeps our kernel


def choice(ctx: KernelCtx) -> str | None:
    """Why the group calls SDPA (`PLAIN`, with why the Gluon kernel does not take it), or None
    when a kernel of ours computes it (see the module docstring)."""
    target, group = ctx.target, ctx.group
    if target.device_type != "cuda" or not target.library_attention or group.kind != "attention":
        return None
    spec = group.spec
    if not isinstance(spec, AttentionSpec) or _trailing_views(ctx, spec) is None or not _plain(ctx, spec):
        return None
    if not dims.is_symbolic(spec.sq) and spec.sq <= attention_decode.MAX_QUERIES:
        return None        # decoding: the split-KV decode kernel is as fast
    sliced = any(ctx.graph.node(n).op == "slice" for n in _prologue(ctx, spec))
    try:
        folded = attention.Spec(ctx)       # q, k, v down to memory, as attention.emit folds them
    except (Unsupported, SymbolicDim) as e:
        # neither the Gluon kernel nor the block-language one computes it (PyTorch would, with a
        # warning); unless a slice moved q, k or v to where `_aligned` cannot tell
        return None if sliced else PLAIN.format(why=f"the Gluon kernel does not take it: {e}")
    if sliced and not _aligned(ctx, folded):
        return None
    if not ctx.graph.symbolic and attention_hopper.too_small(ctx, folded, "is launch-bound") is not None:
        # a few microseconds of GPU time: SDPA's dispatch costs the host 2-3x a Triton launch
        # (aten::_cudnn_attention_forward 79 us of host time a call against aten::mm's 26, under
        # torch.profiler on the H200's host), and a model at batch 4 x 512 is host-bound (BERT-base:
        # 1.58 ms of GPU time a call in 3.27 ms, results/2026-12-05), so the cheaper launch wins
        return None
    gluon = attention_hopper.why_not(ctx, folded)
    return None if gluon is None else PLAIN.format(why=f"the Gluon kernel does not take it: {gluon}")


def _prologue(ctx: KernelCtx, spec: AttentionSpec) -> set[int]:
    """The group's nodes before the attention node (those `_plain` admits are views of q, k, v)."""
    return set(ctx.group.nodes) - {spec.node} - set(spec.epilogue)


def _aligned(ctx: KernelCtx, folded: attention.Spec) -> bool:
    """Whether q, k and v, read through the group's slices, start a whole number of 16 bytes into
    their memory (every tensor of call() starts 16-byte aligned on CUDA: runtime/checks.as_layout,
    whose docstring says why: PyTorch's cuDNN attention answered wrongly for a query 2 bytes off).
    Only the slices move where a view starts; over symbolic sizes their offsets are not told here."""
    if ctx.graph.symbolic:
        return False
    return all(op.offset.const * op.dtype.itemsize % 16 == 0 for op in (folded.q, folded.k, folded.v))


def _plain(ctx: KernelCtx, spec: AttentionSpec) -> bool:
    """Whether SDPA computes the group's attention node as the graph says, with a fused kernel:
    no mask or extra, q, k and v of one half dtype read through strided views, 4-D, one batch,
    and KV heads that are the query heads or a divisor of them under enable_gqa."""
    g, group = ctx.graph, ctx.group
    node = g.node(spec.node)
    if spec.mask is not None or len(node.args) != 3 or spec.kv_groups is None:
        return False
    if any(node.attrs.get(k, d) != d for k, d in EXTRA_DEFAULTS.items()):
        return False       # soft-capping, a window, a fill, eager's rounding: attention_ref's reference
    q, k, v = (g.node(x) for x in (spec.q, spec.k, spec.v))
    if not (q.dtype == k.dtype == v.dtype == node.dtype and node.dtype in DTYPES):
        return False
    if not (len(q.shape) == len(k.shape) == len(v.shape) == 4 and q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if k.shape[1] != q.shape[1] and not node.attrs.get("enable_gqa"):
        return False       # one KV head broadcast over the query heads: SDPA's math backend
    # a cast, or a view that copies in PyTorch (cat, flip, roll, pad): our kernel folds it into its loads
    return all(g.node(n).op in STRIDED for n in _prologue(ctx, spec))


def _trailing_views(ctx: KernelCtx, spec: AttentionSpec) -> list[int] | None:
    """The group's epilogue when it is only views of the result, each of the one before
    (`o.transpose(1, 2).reshape(b, s, -1)`), the last the group's one output; else None."""
    g, last, views = ctx.graph, spec.node, []
    for nid in spec.epilogue:
        node = g.node(nid)
        if node.op not in STRIDED or node.args[0] != last:
            return None
        views.append(last := nid)
    return views if list(ctx.group.outputs) == [last] else None


def computes(ctx: KernelCtx) -> bool:
    """Whether SDPA's fused kernels compute the group as the graph says (`_plain`, views only
    after it, q, k and v at 16-byte offsets), whichever kernel `choice` prefers for it:
    codegen/first_calls.py lets SDPA answer while that kernel compiles."""
    spec = ctx.group.spec
    if ctx.group.kind != "attention" or not isinstance(spec, AttentionSpec):
        return False
    if _trailing_views(ctx, spec) is None or not _plain(ctx, spec):
        return False
    if not any(ctx.graph.node(n).op == "slice" for n in _prologue(ctx, spec)):
        return True
    try:
        return _aligned(ctx, attention.Spec(ctx))
    except (Unsupported, SymbolicDim):
        return False


def emit(ctx: KernelCtx, out: CodeBuilder, opaque_slot: Callable[[Node], int], why: str | None = None) -> None:
    """Write the group as PyTorch lines of call(): the operand views, the SDPA call (the node's
    own form: `is_causal`, `scale`, and `enable_gqa=True` where the node says so), the views of
    the result, then the output's layout. `why` (default: `choice`'s reason) is the comment's."""
    g, spec = ctx.graph, ctx.group.spec
    why = why or choice(ctx)
    out.writeline(f"# calls SDPA through PyTorch ({comment_text(why)})")

    def line(nid: int) -> None:
        node = g.node(nid)
        out.writeline(f"{ctx.buf(nid)} = {torch_text(node, [ctx.buf(x) for x in node.args], opaque_slot)}"
                      f"  # %{nid} {node.op}")
    views = _trailing_views(ctx, spec)
    for nid in topo(g, _prologue(ctx, spec)):          # the group's own order
        line(nid)
    line(spec.node)
    for nid in views:
        line(nid)
    last = (views or [spec.node])[-1]
    out.writeline(f"{ctx.buf(last)} = _as_layout({ctx.buf(last)}, {py_value(ctx.strides(last))})")

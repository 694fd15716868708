"""The `attention` pass: find attention however it was written, and make it one node.

Pattern, read from the output back (`out = P @ V`):

    P      = [casts, leading-axis reshapes] softmax(z)   softmax as amax / sub / exp / sum / div
    z      = layers over S = Q @ K^T (attention_scores.py): casts, scalar scales, soft-capping
             (tanh), additive masks and biases (any number: padding masks, ALiBi), one
             where / masked_fill with a scalar fill, reshapes of the leading axes (Bloom's
             [B*H, S, S] views)
    Q      = q, or q * c (a scale folded into the query or key operand)
    K^T    = a permute of k (or anything: k becomes its transpose)

becomes one `attention` node (attention_ref.py defines its attributes) that computes what
eager computes, fully masked rows included:
- the additive terms become one float mask, kept in the dtype eager added it in (an fp32
  `finfo.min` mask under fp16 scores is not cast to fp16's -inf); `score_dtype` records a
  half-precision add, which rounds the masked scores (in fp16, `s + finfo.min` keeps only
  multiples of 32, so a fully masked row is an average weighted as eager weights it);
- a where/masked_fill becomes a boolean mask with `mask_fill`, masked scores taking
  exactly that value (a finite fill averages a fully masked row); both together only with
  a -inf fill (then the fill is folded into the float mask);
- a row whose scores are all -inf is NaN (`empty_rows="nan"`), as softmax gives, where SDPA
  gives 0;
- a mask that depends on no input is evaluated at compile time: all visible (no mask), causal
  (`tril(ones(Sq, Sk))` top-left, `is_causal=True`) or a causal band of width W (Mistral's
  sliding window: `is_causal=True, window=W`), the same in every batch and head, with every
  masked value at or below STRUCTURAL_FILL; otherwise it is passed along;
- k and v reached through reshape(expand(reshape(k0))) that repeats each KV head R times
  consecutively (`repeat_kv`, `repeat_interleave`) are replaced by k0, v0 with
  `enable_gqa=True`; a single KV head broadcast over the query heads (Falcon's multi-query
  `q @ k.transpose(-1, -2)` with k [B, 1, S, D]) is marked `enable_gqa=True` as well.
Guards: nothing changes if any intermediate (scores, probabilities, softmax pieces) has a
user outside the pattern or is a graph output, or the layers do not fit the node's form
(attention_scores.fold says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import torch

from minicomp.ir import composites
from minicomp.ir import dims as sizes
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import eval_node
from minicomp.passes.attention_scores import STRUCTURAL_FILL, Scores, fold, leading_reshape, peel, scalar, structure
from minicomp.passes.registry import Changes, register_pass

MAX_MASK_EVAL = 1 << 26   # elements of a constant mask evaluated at compile time


@dataclass
class Match:
    out: int
    q: int = 0
    kt: int = 0
    v: int = 0
    raw: int = 0                       # S = Q @ K^T
    scores: Scores = field(default_factory=Scores)
    z_shape: tuple[int, ...] = ()      # the softmax's shape: the attention node's batch and [Sq, Sk]
    reshaped: bool = False             # a reshape of the leading axes between S and P @ V
    interior: set[int] = field(default_factory=set)


def _last_axis(g: Graph, n) -> bool:
    rank = len(g.node(n.args[0]).shape)
    return tuple(n.attrs.get("axes", ())) == (rank - 1,) and bool(n.attrs.get("keepdim"))


def _softmax_input(g: Graph, nid: int, m: Match) -> int | None:
    """z for `div(exp(z - amax(z)), sum(exp(...)))`; records the softmax nodes."""
    div = g.node(nid)
    if div.op != "div":
        return None
    e, s = g.node(div.args[0]), g.node(div.args[1])
    if e.op != "exp" or s.op != "sum" or s.args[0] != e.id or not _last_axis(g, s):
        return None
    sub = g.node(e.args[0])
    if sub.op != "sub":
        return None
    mx = g.node(sub.args[1])
    if mx.op != "amax" or mx.args[0] != sub.args[0] or not _last_axis(g, mx):
        return None
    m.interior |= {div.id, e.id, s.id, sub.id, mx.id}
    return sub.args[0]


def _constant_subgraph(g: Graph, nid: int) -> bool:
    anc = nx.ancestors(g.nx, nid) | {nid}
    return all(g.node(a).op not in ("input", "opaque") for a in anc)


def _evaluate(g: Graph, nid: int) -> torch.Tensor:
    env: dict[int, torch.Tensor] = {}
    anc = nx.ancestors(g.nx, nid) | {nid}
    for a in g.topo_order():
        if a in anc:
            node = g.node(a)
            env[a] = eval_node(node, [env[x] for x in node.args], "cpu")
    return env[nid]


def _gqa_source(g: Graph, nid: int) -> tuple[int, int] | None:
    """(k0, R) when `nid` = reshape(expand(reshape(k0))) repeats each head of k0 R times in a row."""
    r2 = g.node(nid)
    if r2.op != "reshape" or len(r2.shape) < 3:
        return None
    e = g.node(r2.args[0])
    if e.op != "expand" or len(e.shape) != len(r2.shape) + 1:
        return None
    u = g.node(e.args[0])
    k0 = g.node(u.args[0]) if u.op == "reshape" else None
    h = len(e.shape) - 4           # head axis of k0; the repeat axis right after it
    if k0 is None or u.shape[h + 1] != 1 or tuple(k0.shape) != tuple(u.shape[:h + 1] + u.shape[h + 2:]):
        return None
    reps = e.shape[h + 1]
    want = tuple(k0.shape[:h]) + (k0.shape[h] * reps,) + tuple(k0.shape[h + 1:])
    return (k0.id, reps) if tuple(r2.shape) == want else None


def find(g: Graph, out: int) -> Match | None:
    """The attention pattern ending at matmul `out`, or None."""
    o = g.node(out)
    if o.op != "matmul":
        return None
    m = Match(out, v=o.args[1], interior={out})
    p = o.args[0]
    while g.node(p).op == "cast" or leading_reshape(g, p):   # P's cast back, Bloom's view
        m.reshaped |= g.node(p).op == "reshape"
        m.interior.add(p)
        p = g.node(p).args[0]
    z = _softmax_input(g, p, m)
    if z is None:
        return None
    peeled = peel(g, z, m.interior)
    if peeled is None:
        return None
    m.raw, layers = peeled
    m.interior.add(m.raw)
    m.q, m.kt = g.node(m.raw).args
    operand_scale = 1.0
    for attr in ("q", "kt"):       # a scale folded into an operand: (q * c) @ k^T
        x = g.node(getattr(m, attr))
        if x.op == "mul":
            for c, y in ((1, 0), (0, 1)):
                value = scalar(g, x.args[c])
                if value is not None and g.node(x.args[y]).shape == x.shape and value != 0:
                    m.interior.add(x.id)
                    operand_scale *= value
                    setattr(m, attr, x.args[y])
                    break
    scores = fold(layers, operand_scale, g.node(m.raw).shape)
    if scores is None:
        return None
    m.scores, m.z_shape = scores, tuple(g.node(z).shape)
    m.reshaped |= scores.reshaped
    inner = m.interior - {out}
    if any(u not in m.interior for i in inner for u in g.users(i)) or inner & set(g.outputs):
        return None
    return m


def _key(g: Graph, kt: int) -> int:
    """k such that kt = k^T (last two axes swapped), adding a permute when needed."""
    n = g.node(kt)
    rank = len(n.shape)
    swap = list(range(rank))
    swap[-2:] = [rank - 1, rank - 2]
    if n.op == "permute":
        dims = list(n.attrs["dims"])
        dims[-2:] = [dims[-1], dims[-2]]
        if dims == list(range(rank)):
            return n.args[0]
        return g.add("permute", n.args[0], dims=tuple(dims), origin=n.origin)
    return g.add("permute", kt, dims=tuple(swap), origin=n.origin)


def _batched(g: Graph, nid: int, batch: tuple[int, ...], origin) -> int | None:
    """`nid` [.., R, C] reshaped to batch + [R, C] (Bloom's [B*H, S, D] operands), or None."""
    n = g.node(nid)
    lead = tuple(n.shape[:-2])
    if len(lead) == len(batch) and all(a in (b, 1) for a, b in zip(lead, batch)):
        return nid       # already batched (a broadcast KV head included)
    if math.prod(lead) != math.prod(batch):
        return None
    return g.add("reshape", nid, shape=batch + tuple(n.shape[-2:]), origin=origin)


def _at_level(g: Graph, nid: int, level: tuple[int, ...], final: tuple[int, ...], origin) -> int | None:
    """A mask term or condition added to scores of shape `level`, seen at the scores' final shape."""
    shape = tuple(g.node(nid).shape)
    if level == final:
        return nid
    shape = (1,) * (len(level) - len(shape)) + shape
    tail = shape[-2:]
    if all(d == 1 for d in shape[:-2]):
        return g.add("reshape", nid, shape=(1,) * (len(final) - 2) + tail, origin=origin)
    full = g.add("expand", nid, shape=tuple(level[:-2]) + tail, origin=origin) if shape[:-2] != level[:-2] else nid
    if full == nid and len(shape) != len(g.node(nid).shape):
        full = g.add("reshape", nid, shape=shape, origin=origin)
    return g.add("reshape", full, shape=tuple(final[:-2]) + tail, origin=origin)


def _mask(g: Graph, m: Match, origin) -> tuple[int | None, dict] | None:
    """The attention node's mask operand and attributes for the match's scores, or None."""
    sc, final = m.scores, m.z_shape
    attrs: dict = {"mask_fill": -math.inf, "score_dtype": None}
    cond = None
    if sc.keep is not None:
        cond = _at_level(g, sc.keep, sc.keep_level, final, origin)
        if sc.keep_kind == "drop" and not sc.terms:
            cond = g.add("logical_not", cond, origin=origin)
    if not sc.terms:
        if cond is not None:
            attrs["mask_fill"] = sc.fill
        return cond, attrs
    total = None
    for t in sc.terms:
        x = _at_level(g, t.node, t.level, final, origin)
        if t.weight != 1.0:
            x = g.add("mul", x, g.constant(t.weight), origin=origin)
        total = x if total is None else g.add("add", total, x, origin=origin)
    if cond is not None:          # fill is -inf here: where(keep, s + B, -inf)
        ninf = g.constant(-math.inf)
        total = (g.add("where", cond, total, ninf, origin=origin) if sc.keep_kind == "keep"
                 else g.add("where", cond, ninf, total, origin=origin))
    attrs["score_dtype"] = sc.score_dtype
    return total, attrs


def _structural(g: Graph, mask: int, fill: float, sq: int, sk: int) -> tuple[bool, int] | None:
    """(is_causal, window) when the mask is a constant that only hides keys, in a fixed pattern."""
    node = g.node(mask)
    if not _constant_subgraph(g, mask) or sizes.is_symbolic(node.numel) or node.numel > MAX_MASK_EVAL:
        return None       # (over symbols: no value to look at; the mask stays an operand)
    value = _evaluate(g, mask)
    if value.dtype == torch.bool:
        keep = value
        if fill > STRUCTURAL_FILL and not bool(keep.all()):
            return None
    else:
        hidden = value <= STRUCTURAL_FILL
        if not bool(((value == 0) | hidden).all()):
            return None
        keep = ~hidden
    lead = tuple(keep.shape[:-2]) if keep.dim() >= 2 else ()
    return structure(torch.broadcast_to(keep, lead + (sq, sk)), sq, sk)


def rewrite(g: Graph, m: Match) -> bool:
    """Replace the pattern by one attention node; False (graph untouched) if shapes disagree."""
    before = set(g.nx.nodes)
    o = g.node(m.out)
    origin = o.origin
    q, v = m.q, m.v
    if min(len(g.node(n).shape) for n in (q, v, m.kt)) < 2 or len(m.z_shape) < 2:
        return False   # a matrix-vector product: no [.., S, D] query or value to attend with
    batch = m.z_shape[:-2]
    sq, sk = m.z_shape[-2:]
    k = _key(g, m.kt)
    if m.reshaped:
        q, k, v = (_batched(g, x, batch, origin) for x in (q, k, v))
        if None in (q, k, v):
            return _undo(g, before)
    gqa = False
    src_k, src_v = _gqa_source(g, k), _gqa_source(g, v)
    if src_k and src_v and src_k[1] == src_v[1]:
        k, v, gqa = src_k[0], src_v[0], True
    elif len(g.node(k).shape) >= 3 and g.node(k).shape[-3] == g.node(v).shape[-3] == 1 < g.node(q).shape[-3]:
        gqa = True           # one KV head for all query heads (multi-query attention)
    made = _mask(g, m, origin)
    mask, attrs = made
    causal, window = False, 0
    if mask is not None:
        found = _structural(g, mask, attrs["mask_fill"], sq, sk)
        if found is not None:
            (causal, window), mask = found, None
            attrs = {"mask_fill": -math.inf, "score_dtype": None}
    dts = {g.node(x).dtype for x in (q, k, v)}
    if len(dts) != 1:
        return _undo(g, before)
    sc = m.scores
    softcap, scale = (sc.alpha, sc.tanh_scale * sc.alpha) if sc.tanh_scale is not None else (0.0, sc.alpha)
    try:
        att = composites.attention(g, q, k, v, mask, scale, causal, gqa, origin=origin, softcap=softcap,
                                   window=window, empty_rows="nan", **attrs)
    except ValueError:
        return _undo(g, before)
    if g.node(att).shape != o.shape:
        if math.prod(g.node(att).shape) != math.prod(o.shape):
            return _undo(g, before)
        att = g.add("reshape", att, shape=tuple(o.shape), origin=origin)
    if g.node(att).dtype != o.dtype:
        att = g.add("cast", att, dtype=o.dtype, origin=origin)
    g.replace_all_uses(m.out, att)
    _sweep(g, m.interior | set(nx.ancestors(g.nx, m.out)) | {m.out} | (set(g.nx.nodes) - before))
    return True


def _undo(g: Graph, before: set[int]) -> bool:
    for nid in sorted(set(g.nx.nodes) - before, reverse=True):
        g.remove(nid)
    return False


def _sweep(g: Graph, candidates: set[int]) -> None:
    """Remove candidates (and what they alone used) that nothing uses any more."""
    keep = set(g.inputs) | set(g.outputs)
    changed = True
    while changed:
        changed = False
        for nid in sorted(candidates, reverse=True):
            if nid in g and nid not in keep and not g.users(nid):
                candidates = candidates | set(g.node(nid).args)
                g.remove(nid)
                changed = True


def match_attention(graph: Graph) -> Graph:
    """Rewrite every attention pattern into one `attention` node (a new graph)."""
    return _match(graph)[0]


def group_kv_heads(g: Graph, nid: int) -> bool:
    """attention(q, repeat(k0), repeat(v0)) -> attention(q, k0, v0, enable_gqa=True)."""
    n = g.node(nid)
    if n.op != "attention" or n.attrs.get("enable_gqa"):
        return False
    src_k, src_v = _gqa_source(g, n.args[1]), _gqa_source(g, n.args[2])
    if not (src_k and src_v and src_k[1] == src_v[1]):
        return False
    old_args = n.args
    g.set_args(nid, (n.args[0], src_k[0], src_v[0]) + tuple(n.args[3:]))
    n.attrs["enable_gqa"] = True
    _sweep(g, set(old_args[1:3]))
    return True


def structured_mask(g: Graph, nid: int) -> bool:
    """attention(q, k, v, constant causal or band mask) -> attention(q, k, v, is_causal=True[,
    window=W]): a mask built from aranges (an SDPA call's sliding window) need not be read."""
    n = g.node(nid)
    if n.op != "attention" or len(n.args) < 4 or n.attrs["is_causal"]:
        return False
    sq, sk = n.shape[-2], g.node(n.args[1]).shape[-2]
    found = _structural(g, n.args[3], n.attrs.get("mask_fill", -math.inf), sq, sk)
    if found is None:
        return False
    old_mask = n.args[3]
    g.set_args(nid, n.args[:3])
    n.attrs.update(is_causal=found[0], window=found[1], mask_fill=-math.inf, score_dtype=None)
    _sweep(g, {old_mask})
    return True


def _match(graph: Graph) -> tuple[Graph, int]:
    g = graph.copy()
    count = 0
    for nid in g.topo_order():
        if nid not in g:
            continue
        m = find(g, nid)
        if m is not None and rewrite(g, m):
            count += 1
            continue
        count += group_kv_heads(g, nid)
        count += structured_mask(g, nid)
    return g, count


@register_pass("attention")
def attention_pass(graph: Graph) -> tuple[Graph, Changes]:
    """Match matmul/scale/mask/softmax/matmul (however written) into one attention node."""
    g, count = _match(graph)
    return g, {"matched": count}

"""The `attention` pass: find attention however it was written, and make it one node.

Pattern, read from the output back (`out = P @ V`):

    P      = [cast back](softmax(z))         softmax as amax / sub / exp / sum / div
    z      = layers over S = Q @ K^T, in any order, each at most once:
               a cast (the `.float()` upcast),
               scales: mul by a scalar constant, div by one (`/ sqrt(d)`; several multiply),
               a mask: where(keep, s, -inf) / where(drop, -inf, s) (masked_fill) or s + M
    Q      = q, or q * c (a scale folded into the query or key operand)
    K^T    = a permute of k (or anything: k becomes its transpose)

becomes `attention(q, k, v[, mask], scale, is_causal, enable_gqa)`:
- a mask that depends on no input is evaluated at compile time; if it keeps exactly
  the lower triangle (top-left aligned, `tril(ones(Sq, Sk))`) in every batch and head,
  the node gets `is_causal=True` and no mask (the usual `tril(full)` / registered-buffer
  / additive `-inf` spellings); otherwise the mask is passed along (a boolean `keep`
  mask, or an additive float mask in q's dtype);
- k and v reached through reshape(expand(reshape(k0))) that repeats each KV head R
  times consecutively (`repeat_interleave` on the head axis) are replaced by k0, v0 with
  `enable_gqa=True`.
Guards: nothing changes if any intermediate (scores, probabilities, softmax pieces) has a
user outside the pattern or is a graph output; a -inf boolean mask under a negative
scale, or a finite fill on a mask that is not causal, is left alone (their meaning
differs from SDPA's on fully masked rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import torch

from minicomp.ir import composites
from minicomp.ir.graph import Graph, Node
from minicomp.ir.interpret import eval_node
from minicomp.passes.registry import Changes, register_pass

NEG_FILL = -1e30          # a finite masked_fill value at or below this counts as -inf
MAX_MASK_EVAL = 1 << 26   # elements of a constant mask evaluated at compile time


@dataclass
class Match:
    out: int
    q: int
    kt: int
    v: int
    scale: float = 1.0
    scale_above_mask: float = 1.0      # scale factors applied after the mask (they scale it too)
    mask: int | None = None
    mask_kind: str = ""                # "keep", "drop" or "add"
    mask_fill: float = -math.inf
    interior: set[int] = field(default_factory=set)


def _scalar(g: Graph, nid: int) -> float | None:
    n = g.node(nid)
    if n.op != "constant" or n.numel != 1:
        return None
    v = n.attrs["value"]
    return float(v.item() if isinstance(v, torch.Tensor) else v)


def _last_axis(g: Graph, n: Node) -> bool:
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


def _peel(g: Graph, nid: int, m: Match, seen: set[str]) -> int | None:
    """Walk down from the softmax input through casts, scales and a mask to S = Q @ K^T."""
    n = g.node(nid)
    if n.op == "matmul":
        return nid
    m.interior.add(nid)
    if n.op == "cast" and "cast" not in seen and n.dtype.is_floating_point:
        return _peel(g, n.args[0], m, seen | {"cast"})
    if n.op in ("mul", "div"):
        # mul by a scalar constant on either side; div by one on the right
        pairs = ((1, 0), (0, 1)) if n.op == "mul" else ((1, 0),)
        for c, x in pairs:
            value = _scalar(g, n.args[c])
            if value is None or value == 0:
                continue
            factor = value if n.op == "mul" else 1.0 / value
            m.scale *= factor
            if "mask" not in seen:
                m.scale_above_mask *= factor
            return _peel(g, n.args[x], m, seen)
        return None
    if "mask" in seen:
        return None
    if n.op == "where":
        cond, a, b = n.args
        for keep, fill_pos, s_pos, kind in ((cond, 2, 1, "keep"), (cond, 1, 2, "drop")):
            fill = _scalar(g, n.args[fill_pos])
            if fill is not None and fill <= NEG_FILL and g.node(cond).dtype == torch.bool:
                m.mask, m.mask_kind, m.mask_fill = cond, kind, fill
                return _peel(g, n.args[s_pos], m, seen | {"mask"})
        return None
    if n.op == "add":
        for s_pos, mask_pos in ((0, 1), (1, 0)):
            mask = g.node(n.args[mask_pos])
            if mask.numel <= 1 or not mask.dtype.is_floating_point:
                continue
            trial = Match(m.out, 0, 0, 0, interior=set())
            if _peel(g, n.args[s_pos], trial, seen | {"mask"}) is None:
                continue
            m.mask, m.mask_kind = mask.id, "add"
            return _peel(g, n.args[s_pos], m, seen | {"mask"})
    return None


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


def _is_causal(g: Graph, m: Match, sq: int, sk: int) -> bool:
    """Does the (constant) mask keep exactly tril(ones(sq, sk)) in every batch and head?"""
    mask = g.node(m.mask)
    if not _constant_subgraph(g, m.mask) or mask.numel > MAX_MASK_EVAL:
        return False
    value = _evaluate(g, m.mask)
    if m.mask_kind == "keep":
        keep = value.bool()
    elif m.mask_kind == "drop":
        keep = ~value.bool()
    else:
        masked = value <= NEG_FILL
        if not bool(((value == 0) | masked).all()):
            return False
        keep = ~masked
    if keep.dim() < 2 or tuple(keep.shape[-2:]) != (sq, sk):
        return False
    want = torch.ones(sq, sk, dtype=torch.bool).tril()
    return bool((keep.reshape(-1, sq, sk) == want).all())


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
    m = Match(out, 0, 0, o.args[1], interior={out})
    p = o.args[0]
    if g.node(p).op == "cast":
        m.interior.add(p)
        p = g.node(p).args[0]
    z = _softmax_input(g, p, m)
    if z is None:
        return None
    raw = _peel(g, z, m, set())
    if raw is None:
        return None
    m.interior.add(raw)
    m.q, m.kt = g.node(raw).args
    for attr in ("q", "kt"):       # a scale folded into an operand: (q * c) @ k^T
        x = g.node(getattr(m, attr))
        if x.op == "mul":
            for c, y in ((1, 0), (0, 1)):
                value = _scalar(g, x.args[c])
                if value is not None and g.node(x.args[y]).shape == x.shape and value != 0:
                    m.interior.add(x.id)
                    m.scale *= value
                    setattr(m, attr, x.args[y])
                    break
    inner = m.interior - {out}
    if any(u not in m.interior for i in inner for u in g.users(i)) or inner & set(g.outputs):
        return None
    if m.mask_kind in ("keep", "drop") and m.scale_above_mask <= 0:
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


def rewrite(g: Graph, m: Match) -> bool:
    """Replace the pattern by one attention node; False (graph untouched) if shapes disagree."""
    before = set(g.nx.nodes)
    o = g.node(m.out)
    q, v = m.q, m.v
    if min(len(g.node(n).shape) for n in (q, v, m.kt)) < 2:
        return False   # a matrix-vector product: no [.., S, D] query or value to attend with
    sq, sk = g.node(q).shape[-2], g.node(v).shape[-2]
    k = _key(g, m.kt)
    gqa = False
    src_k, src_v = _gqa_source(g, k), _gqa_source(g, v)
    if src_k and src_v and src_k[1] == src_v[1]:
        k, v, gqa = src_k[0], src_v[0], True
    mask, causal = None, False
    if m.mask is not None:
        causal = _is_causal(g, m, sq, sk)
        if not causal:
            if m.mask_kind != "add" and m.mask_fill != -math.inf:
                return _undo(g, before)
            mask = m.mask
            if m.mask_kind == "drop":
                mask = g.add("logical_not", mask, origin=o.origin)
            if m.mask_kind == "add":
                if m.scale_above_mask != 1.0:
                    mask = g.add("mul", mask, g.constant(m.scale_above_mask), origin=o.origin)
                if g.node(mask).dtype != g.node(q).dtype:
                    mask = g.add("cast", mask, dtype=g.node(q).dtype, origin=o.origin)
    dts = {g.node(x).dtype for x in (q, k, v)}
    if len(dts) != 1:
        return _undo(g, before)
    try:
        att = composites.attention(g, q, k, v, mask, m.scale, causal, gqa, origin=o.origin)
    except ValueError:
        return _undo(g, before)
    if g.node(att).shape != o.shape:
        return _undo(g, before)
    if g.node(att).dtype != o.dtype:
        att = g.add("cast", att, dtype=o.dtype, origin=o.origin)
    g.replace_all_uses(m.out, att)
    _sweep(g, m.interior | set(nx.ancestors(g.nx, m.out)) | {m.out})
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


def _match(graph: Graph) -> tuple[Graph, int]:
    g = graph.copy()
    count = 0
    for nid in g.topo_order():
        if nid not in g:
            continue
        m = find(g, nid)
        if m is not None and rewrite(g, m):
            count += 1
        elif group_kv_heads(g, nid):
            count += 1
    return g, count


@register_pass("attention")
def attention_pass(graph: Graph) -> tuple[Graph, Changes]:
    """Match matmul/scale/mask/softmax/matmul (however written) into one attention node."""
    g, count = _match(graph)
    return g, {"matched": count}

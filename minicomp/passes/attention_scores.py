"""What hand-written attention does to its scores between `Q @ K^T` and the softmax.

`peel(g, z)` walks down from the softmax input `z` to the score matmul through layers,
each at most as often as said:

    cast         to a float dtype (the `.float()` upcast, `softmax(dtype=...)`)
    scale        mul by a scalar constant (either side), div by one (`/ sqrt(d)`, `/ cap`)
    tanh         once: soft-capping, `tanh(s / cap) * cap` (Gemma2)
    add          a float tensor, any number of them: masks, ALiBi biases (Bloom, Falcon)
    where        once: where(keep, s, fill) / where(drop, fill, s) (masked_fill), a scalar fill
    reshape      one that keeps the last two axes (Bloom's [B*H, S, S] <-> [B, H, S, S] views)

and `fold(layers)` rewrites them, innermost first, into the one form the attention node
computes (attention_ref.py):

    t = where(keep, alpha * T(S) + sum_i w_i * B_i, fill),   T(S) = S or tanh(s0 * S)

with the scalars pushed through: a scale after a term scales the term (w_i) and the fill;
a tanh must see the bare scores; a term above a `where` needs fill = -inf (where(keep, x,
-inf) + B = where(keep, x + B, -inf) exactly, not so for a finite fill). A half-precision
add, or a cast to half after a term, means eager rounded t there: `score_dtype`.

`structure(value, ...)` reads a mask evaluated at compile time: all visible, causal, or a
causal band of width W (a sliding window), the same in every batch and head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from minicomp.ir.dtypes import HALF_DTYPES
from minicomp.ir.graph import Graph

# A mask value at or below this counts as "never attended" when a constant mask is read as
# causal or windowed: eager's exp(t - max) underflows to exactly 0 in fp32 once t lies more
# than ~104 below the row max, so this is exact unless one row's scores span ~65,000
# (finfo(float16).min, the highest finfo.min that transformers uses).
STRUCTURAL_FILL = -65504.0


@dataclass
class Term:
    node: int
    weight: float
    level: tuple[int, ...]       # the scores' shape where it was added (before any reshape above)


@dataclass
class Scores:
    """The folded layers: t = where(keep, alpha * T(S) + sum w_i B_i, fill)."""
    alpha: float = 1.0
    tanh_scale: float | None = None  # s0 when T(S) = tanh(s0 * S)
    terms: list[Term] = field(default_factory=list)
    keep: int | None = None
    keep_kind: str = ""              # "keep" (True attends) or "drop" (True is masked)
    keep_level: tuple[int, ...] = ()
    fill: float = -math.inf
    score_dtype: torch.dtype | None = None
    reshaped: bool = False


def scalar(g: Graph, nid: int) -> float | None:
    n = g.node(nid)
    if n.op != "constant" or n.numel != 1:
        return None
    v = n.attrs["value"]
    return float(v.item() if isinstance(v, torch.Tensor) else v)


def leading_reshape(g: Graph, nid: int) -> bool:
    """A reshape that only merges or splits the axes before the last two."""
    n = g.node(nid)
    if n.op != "reshape":
        return False
    src = g.node(n.args[0]).shape
    return len(src) >= 2 and len(n.shape) >= 2 and tuple(src[-2:]) == tuple(n.shape[-2:])


def peel(g: Graph, nid: int, interior: set[int]) -> tuple[int, list[tuple]] | None:
    """(the score matmul, layers outermost first) under the softmax input `nid`, or None.
    Every node passed through is added to `interior`."""
    layers: list[tuple] = []
    seen: set[str] = set()
    while True:
        n = g.node(nid)
        if n.op == "matmul":
            return nid, layers
        interior.add(nid)
        nxt = None
        if n.op == "cast" and n.dtype.is_floating_point:
            layers.append(("cast", n.dtype))
            nxt = n.args[0]
        elif n.op in ("mul", "div"):
            pairs = ((1, 0), (0, 1)) if n.op == "mul" else ((1, 0),)
            for c, x in pairs:
                value = scalar(g, n.args[c])
                if value is not None and value != 0 and math.isfinite(value):
                    layers.append(("scale", value if n.op == "mul" else 1.0 / value))
                    nxt = n.args[x]
                    break
        elif n.op == "tanh" and "tanh" not in seen:
            seen.add("tanh")
            layers.append(("tanh",))
            nxt = n.args[0]
        elif n.op == "where" and "where" not in seen and g.node(n.args[0]).dtype == torch.bool:
            seen.add("where")
            for fill_pos, s_pos, kind in ((2, 1, "keep"), (1, 2, "drop")):
                fill = scalar(g, n.args[fill_pos])
                if fill is not None and not math.isnan(fill):
                    fill = float(torch.tensor(fill, dtype=torch.float64).to(n.dtype))   # eager's fill, in n's dtype
                    layers.append(("where", n.args[0], kind, fill, n.shape))
                    nxt = n.args[s_pos]
                    break
        elif n.op == "add":
            for s_pos, t_pos in ((0, 1), (1, 0)):
                term = g.node(n.args[t_pos])
                if scalar(g, term.id) is None and term.dtype.is_floating_point and _reaches_matmul(g, n.args[s_pos]):
                    layers.append(("add", term.id, n.dtype, n.shape))
                    nxt = n.args[s_pos]
                    break
        elif leading_reshape(g, nid):
            layers.append(("reshape", n.shape))
            nxt = n.args[0]
        if nxt is None:
            return None
        nid = nxt


_LAYER_OPS = ("cast", "mul", "div", "tanh", "where", "add", "reshape")


def _reaches_matmul(g: Graph, nid: int, depth: int = 0) -> bool:
    """Whether a chain of layer ops leads from `nid` down to a matmul (which side of an add is the scores)."""
    n = g.node(nid)
    if n.op == "matmul":
        return True
    if n.op not in _LAYER_OPS or depth > 32:
        return False
    candidates = [a for a in n.args if scalar(g, a) is None and g.node(a).dtype.is_floating_point]
    return any(_reaches_matmul(g, a, depth + 1) for a in candidates)


def fold(layers: list[tuple], operand_scale: float, raw_shape: tuple[int, ...]) -> Scores | None:
    """The layers (outermost first) as one `Scores`, or None when they do not fit its form."""
    sc = Scores(alpha=operand_scale)
    level = tuple(raw_shape)
    for layer in reversed(layers):
        kind = layer[0]
        if kind == "scale":
            c = layer[1]
            sc.alpha *= c
            for t in sc.terms:
                t.weight *= c
            if sc.keep is not None:
                if c < 0:
                    return None     # a negative scale after a mask turns its fill into +inf
                sc.fill *= c
        elif kind == "tanh":
            if sc.tanh_scale is not None or sc.terms or sc.keep is not None:
                return None
            sc.tanh_scale, sc.alpha = sc.alpha, 1.0
        elif kind == "add":
            if sc.keep is not None and sc.fill != -math.inf:
                return None
            sc.terms.append(Term(layer[1], 1.0, level))
            if layer[2] in HALF_DTYPES:
                sc.score_dtype = layer[2]
        elif kind == "where":
            if sc.keep is not None:
                return None
            sc.keep, sc.keep_kind, sc.fill, sc.keep_level = layer[1], layer[2], layer[3], level
        elif kind == "cast":
            if layer[1] in HALF_DTYPES:
                if sc.terms:
                    sc.score_dtype = layer[1]
                if sc.keep is not None:
                    sc.fill = float(torch.tensor(sc.fill, dtype=torch.float64).to(layer[1]))
        elif kind == "reshape":
            level = tuple(layer[1])
            sc.reshaped = True
    if sc.tanh_scale is not None and sc.alpha <= 0:
        return None
    if sc.keep is not None and sc.terms and sc.fill != -math.inf:
        return None
    return sc


def structure(keep: torch.Tensor, sq: int, sk: int) -> tuple[bool, int] | None:
    """(is_causal, window) when the boolean `keep` [.., sq, sk] is the same in every batch and
    head and is all True (False, 0), causal top-left (True, 0) or a causal band of width W
    with no row left empty (True, W); None otherwise."""
    if keep.dim() < 2 or tuple(keep.shape[-2:]) != (sq, sk):
        return None
    planes = keep.reshape(-1, sq, sk)
    first = planes[0]
    if not bool((planes == first).all()):
        return None
    if bool(first.all()):
        return False, 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    causal = j <= i
    if bool((first == causal).all()):
        return True, 0
    width = int(first.sum(dim=1).max())
    band = causal & (j > i - width)
    if width > 0 and bool((first == band).all()) and bool(first.any(dim=1).all()):
        return True, width
    return None

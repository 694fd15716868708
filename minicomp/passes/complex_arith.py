"""The `complex` pass: a complex product read back as real pairs becomes real arithmetic.

Meta's reference Llama applies rotary embeddings with complex numbers:

    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)

Complex dtypes have no Triton type, so each of those ops ran through PyTorch (two opaque
views and a PyTorch product per tensor). Here `view_as_real(p * q)`, with p and q complex,
becomes the product on (real, imaginary) pairs:

    re = pr * qr - pi * qi,   im = pr * qi + pi * qr,   out = cat([re, im], -1)

where an operand's pairs are the real tensor that `view_as_complex` was given, or, for any
other complex tensor (a buffer such as `freqs_cis`, reached through reshapes), the real view
PyTorch gives it (`view_as_real`, one opaque node that launches nothing), reshaped the same
way. The result is computed as eager's complex64 product is: in fp32, the same two products
and one sum per component. Nothing else complex is rewritten; a product whose result is
also read as complex stays as it was.
"""

from __future__ import annotations

import torch

from minicomp.ir.graph import Graph, Node
from minicomp.passes.registry import Changes, register_pass

REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _target(n: Node) -> str:
    return str(n.attrs.get("target", ""))


def _is(n: Node, name: str) -> bool:
    return n.op == "opaque" and _target(n).startswith(f"aten.{name}")


def _pairs(g: Graph, nid: int, as_real: Node, memo: dict[int, int | None]) -> int | None:
    """A real node holding complex node `nid` as [..., 2] pairs, or None (made once per node)."""
    if nid not in memo:
        memo[nid] = _make_pairs(g, nid, as_real, memo)
    return memo[nid]


def _make_pairs(g: Graph, nid: int, as_real: Node, memo: dict[int, int | None]) -> int | None:
    n = g.node(nid)
    if n.dtype not in REAL_OF:
        return None
    if _is(n, "view_as_complex") and len(n.args) == 1:
        return n.args[0]
    if n.kind == "view" and n.op in ("reshape", "expand", "slice", "permute"):
        inner = _pairs(g, n.args[0], as_real, memo)
        if inner is None:
            return None
        rank = len(g.node(n.args[0]).shape)
        if n.op in ("reshape", "expand"):
            return g.add(n.op, inner, shape=tuple(n.shape) + (2,), origin=n.origin)
        if n.op == "slice":      # along a complex axis: the pairs' axis stays last
            return g.add("slice", inner, dim=n.attrs["dim"] % rank, start=n.attrs["start"], end=n.attrs["end"],
                         step=n.attrs["step"], origin=n.origin)
        return g.add("permute", inner, dims=tuple(d % rank for d in n.attrs["dims"]) + (rank,), origin=n.origin)
    if n.kind in ("input", "constant", "opaque"):
        # the real view PyTorch gives it: `as_real`'s own call on this operand
        return g.add("opaque", nid, fn=as_real.attrs["fn"], target=_target(as_real),
                     out_shape=tuple(n.shape) + (2,), out_dtype=REAL_OF[n.dtype], origin=n.origin)
    return None


def _half(g: Graph, x: int, k: int, origin) -> int:
    return g.add("slice", x, dim=-1, start=k, end=k + 1, step=1, origin=origin)


def rewrite(g: Graph) -> int:
    """Rewrite every `view_as_real(p * q)` of complex p, q (in place); returns how many."""
    count, memo = 0, {}
    for nid in g.topo_order():
        if nid not in g:
            continue
        r = g.node(nid)
        if not (_is(r, "view_as_real") and len(r.args) == 1):
            continue
        m = g.node(r.args[0])
        if m.op != "mul" or len(m.args) != 2 or m.dtype not in REAL_OF or g.users(m.id) != [r.id]:
            continue
        p, q = (_pairs(g, a, r, memo) for a in m.args)
        if p is None or q is None:
            continue
        o = r.origin
        pr, pi, qr, qi = _half(g, p, 0, o), _half(g, p, 1, o), _half(g, q, 0, o), _half(g, q, 1, o)
        re = g.add("sub", g.add("mul", pr, qr, origin=o), g.add("mul", pi, qi, origin=o), origin=o)
        im = g.add("add", g.add("mul", pr, qi, origin=o), g.add("mul", pi, qr, origin=o), origin=o)
        out = g.add("cat", re, im, dim=-1, origin=o)
        if tuple(g.node(out).shape) != tuple(r.shape) or g.node(out).dtype != r.dtype:
            continue          # a broadcast eager resolves otherwise: leave it (dead nodes go to DCE)
        g.replace_all_uses(r.id, out)
        g.remove(r.id)
        count += 1
    return count


@register_pass("complex")
def complex_pass(graph: Graph) -> tuple[Graph, Changes]:
    """Complex products read back as real pairs become real arithmetic (view_as_real(p * q))."""
    g = graph.copy()
    n = rewrite(g)
    return g, ({"rewritten": n} if n else {})

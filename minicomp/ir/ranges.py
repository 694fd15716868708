"""What an index tensor can hold: static value ranges, and the tensor in memory it is read from.

An indirect load (`index`, `gather`: minicomp/ir/ops/indexing.py) must never read outside its
source, and a bad index must raise eager's error. minicomp knows an index is good in one of
two ways, and the planner (plan/rules.py) and codegen (codegen/indirect.py, index_check.py)
ask the same two questions of this module:
- `value_range(graph, nid)`: inclusive bounds that hold for every element of node `nid`, from
  its op alone (an `arange`, a constant, `remainder` by a positive number, a clamp, sums and
  products of bounded values, views and casts of them). An index whose range lies inside the
  valid one needs no check at all (position ids from `arange`, take_along_dim's `% n`);
- `memory_sources(graph, nid, computed)`: the tensors in memory an index is read from, through
  the views and value-keeping integer casts a kernel computes (`computed`): `call()` checks
  those tensors' values, as the kernel will read them, before launching the kernel.
An index that is neither (`x[ids * 3]`) is computed in the kernel with no known bound: the
planner keeps it in a group of its own, so it reaches the indirect load through memory.
Invariant: a range is never narrower than the values can be (None when unsure).
"""

from __future__ import annotations

import torch

from minicomp.ir.dtypes import INT_DTYPES
from minicomp.ir.graph import Graph

Range = tuple[int, int]
VIEWS = ("reshape", "permute", "expand", "slice", "cat")

_LIMITS = {torch.int8: (-2**7, 2**7 - 1), torch.uint8: (0, 255), torch.int16: (-2**15, 2**15 - 1),
           torch.int32: (-2**31, 2**31 - 1), torch.int64: (-2**63, 2**63 - 1), torch.bool: (0, 1)}


def _fits(r: Range | None, dtype: torch.dtype) -> Range | None:
    """`r` if every value of it is a value of `dtype` (integer arithmetic that wraps is unbounded)."""
    if r is None or dtype not in _LIMITS:
        return None
    lo, hi = _LIMITS[dtype]
    return r if lo <= r[0] and r[1] <= hi else None


def _scalar(graph: Graph, nid: int) -> int | None:
    """The integer value of a scalar (or one-valued) constant, else None."""
    n = graph.node(nid)
    if n.op == "constant":
        v = n.attrs["value"]
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or v.dtype.is_floating_point or v.dtype.is_complex:
                return None
            v = v.item()
        return int(v) if isinstance(v, (bool, int)) else None
    if n.op == "full" and not n.dtype.is_floating_point:
        return int(n.attrs["value"])
    return None


def value_range(graph: Graph, nid: int, depth: int = 0) -> Range | None:
    """Inclusive (lo, hi) that every element of integer node `nid` lies in; None when unknown."""
    n = graph.node(nid)
    if depth > 64 or not (n.dtype in INT_DTYPES or n.dtype == torch.bool):
        return None
    if n.numel == 0:
        return None
    op, a = n.op, n.attrs
    rng = lambda i: value_range(graph, n.args[i], depth + 1)  # noqa: E731
    if op == "constant":
        v = a["value"]
        if isinstance(v, torch.Tensor):
            return (int(v.min()), int(v.max())) if v.numel() and not v.dtype.is_floating_point else None
        return (int(v), int(v)) if isinstance(v, (bool, int)) else None
    if op == "full":
        return _fits((int(a["value"]),) * 2, n.dtype)
    if op == "arange":
        first, last = a["start"], a["start"] + a["step"] * (n.shape[0] - 1)
        return (int(min(first, last)), int(max(first, last))) if isinstance(first, int) else None
    if op in VIEWS:
        parts = [value_range(graph, x, depth + 1) for x in n.args]
        if None in parts:
            return None
        return min(p[0] for p in parts), max(p[1] for p in parts)
    if op == "cast":
        return _fits(rng(0), n.dtype)
    if op in ("add", "sub", "mul", "minimum", "maximum"):
        x, y = rng(0), rng(1)
        if x is None or y is None:
            return None
        if op == "add":
            r = (x[0] + y[0], x[1] + y[1])
        elif op == "sub":
            r = (x[0] - y[1], x[1] - y[0])
        elif op == "mul":
            prods = [p * q for p in x for q in y]
            r = (min(prods), max(prods))
        elif op == "minimum":
            r = (min(x[0], y[0]), min(x[1], y[1]))
        else:
            r = (max(x[0], y[0]), max(x[1], y[1]))
        return _fits(r, n.dtype)
    if op == "neg":
        x = rng(0)
        return None if x is None else _fits((-x[1], -x[0]), n.dtype)
    if op == "remainder":
        # Python's remainder by a positive number m lies in [0, m)
        m = _scalar(graph, n.args[1])
        return (0, m - 1) if m is not None and m > 0 else None
    if op == "clamp" and isinstance(a.get("min"), int) and isinstance(a.get("max"), int):
        return (a["min"], max(a["min"], a["max"]))
    if op == "where":
        x, y = rng(1), rng(2)
        return None if x is None or y is None else (min(x[0], y[0]), max(x[1], y[1]))
    return None


def within(r: Range | None, valid: Range | None) -> bool:
    """Whether every value of range `r` is a valid index (`valid` None: any value is)."""
    if valid is None:
        return True
    return r is not None and valid[0] <= r[0] and r[1] <= valid[1]


def memory_sources(graph: Graph, nid: int, computed: set[int] | frozenset[int]) -> list[tuple[int, list[int]]] | None:
    """[(root, chain)]: the tensors in memory that index node `nid` is read from, each with the
    nodes a kernel computing `computed` passes it through, root side first: views and casts that
    keep every integer value. A `cat` reads several tensors; each is checked as it is, which
    is exact unless a slice above the cat leaves part of it out (then None). None when the
    kernel computes anything else on the way."""
    chain: list[int] = []
    sliced = False
    while nid in computed:
        n = graph.node(nid)
        if n.op == "cat":
            if sliced:
                return None
            out: list[tuple[int, list[int]]] = []
            for part in dict.fromkeys(n.args):
                got = memory_sources(graph, part, computed)
                if got is None:
                    return None
                out += got
            return out
        src = graph.node(n.args[0]) if n.args else None
        keeps = n.op in VIEWS[:-1] or (n.op == "cast" and src is not None and _widens(src.dtype, n.dtype))
        if not keeps:
            return None
        sliced = sliced or n.op == "slice"
        chain.append(nid)
        nid = n.args[0]
    return [(nid, list(reversed(chain)))]


def _widens(src: torch.dtype, dst: torch.dtype) -> bool:
    """A cast from integer `src` to integer `dst` that keeps every value."""
    if src not in _LIMITS or dst not in _LIMITS:
        return False
    return _LIMITS[dst][0] <= _LIMITS[src][0] and _LIMITS[src][1] <= _LIMITS[dst][1]

"""Indirect loads: `index` (advanced indexing, embedding, index_select) and `gather`.

Both read their first operand, the *source*, at positions held in integer index tensors:
- `index(x, i1, ..., ik, dims=(d1, ..., dk), mode=...)` is `x[..., i1, ..., ik, ...]` with the
  index tensors at the increasing dims `dims` of x and full slices elsewhere. The index tensors
  broadcast together to a shape B; as in PyTorch's advanced indexing, B takes the place of the
  indexed dims when they are adjacent, and goes first otherwise. `embedding(ids, w)` is
  `index(w, ids, dims=(0,))`, `index_select(x, d, i)` is `index(x, i, dims=(d,))`;
- `gather(x, idx, dim=d, mode=...)`: out[p] = x[p with coordinate d replaced by idx[p]], of
  idx's shape (every other dim of idx at most x's).

`mode` names the eager op the node stands for, which decides what an index outside its
dimension of size n does (`MODES`): `index` lets -n..-1 count from the end and raises
IndexError beyond; `embedding` and `index_select` allow 0..n-1 only (IndexError, RuntimeError);
`gather` allows 0..n-1 (RuntimeError); `take_along_dim` takes every index modulo n, as eager's
take_along_dim does (it computes `indices % n` first), so it never fails.

Kind "pointwise": the iteration space is the output's shape, and each output element is one
element of the source. codegen/indirect.py writes the load: the index is loaded (or computed),
wrapped as the mode says, and becomes a coordinate of the source's index (an `Indirect` atom of
codegen/indexing.py). Bad indices are found before any kernel reads through them: by the check
`call()` makes on every index tensor read from memory (codegen/index_check.py), or, for an
index the kernel computes, by its static range (`minicomp/ir/ranges.py`). The reference is the
eager op itself, so the reference interpreter and fallbacks raise eager's own errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import broadcast

INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class Mode:
    """What an index outside [0, n) does in the eager op a node stands for."""
    negative: str      # "wrap": -n..-1 count from the end; "modulo": taken modulo n; "error"
    error: str         # the builtin exception eager raises beyond that: "IndexError" or "RuntimeError"
    eager: str         # the eager call, for messages

    def bounds(self, n: int) -> tuple[int, int] | None:
        """The inclusive range of indices that are valid for a dimension of size n (None: all are)."""
        if self.negative == "modulo":
            return None
        return (-n if self.negative == "wrap" else 0), n - 1


MODES: dict[str, Mode] = {
    "index": Mode("wrap", "IndexError", "x[idx]"),
    "embedding": Mode("error", "IndexError", "F.embedding(idx, w)"),
    "index_select": Mode("error", "RuntimeError", "torch.index_select(x, dim, idx)"),
    "gather": Mode("error", "RuntimeError", "torch.gather(x, dim, idx)"),
    "take_along_dim": Mode("modulo", "RuntimeError", "torch.take_along_dim(x, idx, dim)"),
    "nll_loss": Mode("error", "IndexError", "F.nll_loss(x, target)"),   # a class read by the loss
}
INDEX_MODES = ("index", "embedding", "index_select")
GATHER_MODES = ("gather", "take_along_dim", "nll_loss")


def index_shape(shape: Sequence[int], dims: Sequence[int], bshape: Sequence[int]) -> tuple[int, ...]:
    """The shape of x[...] with index tensors of broadcast shape `bshape` at `dims` (increasing)."""
    dims = tuple(dims)
    rest = [s for i, s in enumerate(shape) if i not in dims]
    if dims == tuple(range(dims[0], dims[0] + len(dims))):
        return tuple(shape[:dims[0]]) + tuple(bshape) + tuple(shape[dims[-1] + 1:])
    return tuple(bshape) + tuple(rest)


def _key(x: torch.Tensor, idxs: Sequence[torch.Tensor], dims: Sequence[int]) -> tuple:
    key: list[Any] = [slice(None)] * x.dim()
    for d, i in zip(dims, idxs):
        key[d] = i
    return tuple(key)


def _index_ref(x, *idxs, dims, mode):
    if mode == "embedding":
        return F.embedding(idxs[0], x)
    if mode == "index_select":
        return torch.index_select(x, dims[0], idxs[0].reshape(-1)).reshape(
            index_shape(x.shape, dims, idxs[0].shape))
    return x[_key(x, idxs, dims)]


def _gather_ref(x, idx, *, dim, mode):
    if mode == "take_along_dim":
        return torch.take_along_dim(x, idx, dim)
    return torch.gather(x, dim, idx)


def _index_rule(operands, attrs):
    (shape, dtype), idxs = operands[0], operands[1:]
    dims, mode = attrs.get("dims"), attrs.get("mode")
    if mode not in INDEX_MODES or not isinstance(dims, tuple) or len(dims) != len(idxs) or not idxs:
        return None
    if any(not isinstance(d, int) or not 0 <= d < len(shape) for d in dims) or list(dims) != sorted(set(dims)):
        return None
    if any(d not in INDEX_DTYPES for _, d in idxs):
        return None
    if mode == "embedding" and (len(shape) != 2 or dims != (0,) or len(idxs) != 1):
        return None
    if mode == "index_select" and (len(idxs) != 1 or len(idxs[0][0]) != 1):
        return None
    bshape = broadcast(*(s for s, _ in idxs))
    if bshape is None:
        return None
    if any(shape[d] == 0 for d in dims) and 0 not in bshape:
        return None          # eager: every index is out of range
    return index_shape(shape, dims, bshape), dtype


def _gather_rule(operands, attrs):
    (shape, dtype), (ishape, idtype) = operands
    dim, mode = attrs.get("dim"), attrs.get("mode")
    if mode not in GATHER_MODES or idtype not in INDEX_DTYPES or not isinstance(dim, int):
        return None
    if len(ishape) != len(shape) or not shape or not 0 <= dim < len(shape):
        return None
    if any(i > s for k, (i, s) in enumerate(zip(ishape, shape)) if k != dim):
        return None
    if shape[dim] == 0 and 0 not in ishape:
        return None
    return tuple(ishape), dtype


def _index_text(x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    dims, mode = tuple(attrs["dims"]), attrs["mode"]
    if mode == "embedding":
        return f"torch.nn.functional.embedding({x[1]}, {x[0]})"
    if mode == "index_select":
        return f"torch.index_select({x[0]}, {int(dims[0])}, {x[1]}.reshape(-1)).reshape({tuple(shape)!r})"
    parts = [":"] * (max(dims) + 1 if dims else 0)
    for d, name in zip(dims, x[1:]):
        parts[d] = name
    return f"{x[0]}[{', '.join(parts)}{',' if len(parts) == 1 else ''}]"


def _gather_text(x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    if attrs["mode"] == "take_along_dim":
        return f"torch.take_along_dim({x[0]}, {x[1]}, {int(attrs['dim'])})"
    return f"torch.gather({x[0]}, {int(attrs['dim'])}, {x[1]})"


register(OpDef("index", "pointwise", _index_ref, arity=None, flops_per_element=0, attrs=("dims", "mode"),
               emitter="indirect", shape=_index_rule, pytorch=_index_text,
               aten=("index.Tensor", "_unsafe_index.Tensor", "embedding.default", "index_select.default")))
register(OpDef("gather", "pointwise", _gather_ref, arity=2, flops_per_element=0, attrs=("dim", "mode"),
               emitter="indirect", shape=_gather_rule, pytorch=_gather_text,
               aten=("gather.default", "take_along_dim.default")))

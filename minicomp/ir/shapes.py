"""Shape and dtype rules for the common cases of the registry's ops, without meta tensors.

`graph.infer` first asks `rule(op, operands, attrs)`. It falls back to running the op's
reference on meta tensors only when the rule returns None.

Why: in PyTorch 2.11-2.13 most meta kernels are Python references. They are wrapped in
`torch._disable_dynamo` or call `torch._check`, which import `torch._dynamo` and sympy on
first use: about 900 modules, 3-4 s in a fresh process without bytecode caches (the GPU
host's site-packages). The eager tracer (`frontend/fx_eager.py`) keeps capture off that
import. These rules keep building the IR off it too, for blocks made of float tensors.

The contract is narrow on purpose. A rule answers only for operands it fully understands:
float tensors (plus bool masks where an op takes one) whose shapes fit. For anything else,
including every case where PyTorch would raise, it returns None. The meta reference then
gives PyTorch's own answer or PyTorch's own error. `tests/test_shapes.py` checks, over random
ops, shapes and dtypes, that every answer a rule gives is the meta reference's answer.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence

import torch

Shape = tuple[int, ...]
Operand = tuple[Shape, torch.dtype]
Result = Optional[tuple[Shape, torch.dtype]]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def broadcast(*shapes: Shape) -> Shape | None:
    """NumPy broadcasting of `shapes`; None if they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _promote(*operands: Operand) -> torch.dtype:
    """PyTorch's promotion of float tensors; 0-d tensors rank below dimensioned ones."""
    dims = [d for s, d in operands if len(s)] or [d for _, d in operands]
    out = dims[0]
    for d in dims[1:]:
        out = torch.promote_types(out, d)
    return out


def _floats(*operands: Operand) -> bool:
    return all(d in FLOATS for _, d in operands)


def _axes(axes: Any, rank: int) -> tuple[int, ...] | None:
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    if any(not isinstance(a, int) or not -rank <= a < max(rank, 1) for a in axes):
        return None
    norm = tuple(sorted({a % rank if rank else 0 for a in axes}))
    return norm if len(norm) == len(axes) else None


# --------------------------------------------------------------------------- the rules

def _elementwise(result_dtype: Callable[..., torch.dtype | None]) -> Callable[..., Result]:
    def rule(operands: Sequence[Operand], attrs: dict) -> Result:
        shape = broadcast(*(s for s, _ in operands))
        dtype = result_dtype(operands, attrs)
        return None if shape is None or dtype is None else (shape, dtype)
    return rule


def _same_float(operands, attrs):
    return _promote(*operands) if _floats(*operands) else None


def _to_bool(operands, attrs):
    return torch.bool if _floats(*operands) else None


def _clamp(operands, attrs):
    both_none = attrs.get("min") is None and attrs.get("max") is None
    return None if both_none else _same_float(operands, attrs)


def _logical(operands, attrs):
    return torch.bool if all(d in FLOATS or d == torch.bool for _, d in operands) else None


def _where(operands, attrs):
    cond, *values = operands
    return _promote(*values) if cond[1] == torch.bool and _floats(*values) else None


def _cast(operands, attrs):
    ((shape, _),) = operands
    return (shape, attrs["dtype"]) if isinstance(attrs["dtype"], torch.dtype) else None


def _gelu(operands, attrs):
    return _same_float(operands, attrs) if attrs.get("approximate") in ("none", "tanh") else None


def _tri(operands, attrs):
    ((shape, dtype),) = operands
    return (shape, dtype) if len(shape) >= 2 and isinstance(attrs.get("diagonal"), int) else None


def _full(operands, attrs):
    shape, dtype, value = attrs.get("shape"), attrs.get("dtype"), attrs.get("value")
    if not isinstance(shape, (tuple, list)) or any(not isinstance(s, int) or s < 0 for s in shape):
        return None
    if (dtype in FLOATS or dtype == torch.bool) and type(value) in (bool, int, float) and math.isfinite(value):
        return tuple(shape), dtype
    return None


def _reduce(operands, attrs, *, needs_elements: bool = False):
    ((shape, dtype),) = operands
    axes = _axes(attrs["axes"], len(shape))
    if dtype not in FLOATS or not axes or not shape:       # no axes means all of them to PyTorch
        return None
    if needs_elements and any(shape[a] == 0 for a in axes):   # amax/amin of nothing is an error
        return None
    if attrs.get("keepdim"):
        return tuple(1 if i in axes else s for i, s in enumerate(shape)), dtype
    return tuple(s for i, s in enumerate(shape) if i not in axes), dtype


def _reshape(operands, attrs):
    ((shape, dtype),) = operands
    new = list(attrs["shape"])
    if any(not isinstance(s, int) or s < -1 for s in new) or new.count(-1) > 1:
        return None
    known = math.prod(s for s in new if s != -1)
    size = math.prod(shape)
    if -1 in new:
        if known == 0 or size % known:
            return None
        new[new.index(-1)] = size // known
    return (tuple(new), dtype) if math.prod(new) == size else None


def _permute(operands, attrs):
    ((shape, dtype),) = operands
    dims = _axes(attrs["dims"], len(shape))
    if dims is None or len(dims) != len(shape):
        return None
    return tuple(shape[d % len(shape)] for d in attrs["dims"]), dtype


def _expand(operands, attrs):
    ((shape, dtype),) = operands
    new = list(attrs["shape"])
    lead = len(new) - len(shape)
    if lead < 0 or any(not isinstance(s, int) or s < -1 for s in new) or -1 in new[:lead]:
        return None
    for i, s in enumerate(shape):
        want = new[lead + i]
        if want == -1:
            new[lead + i] = s
        elif s != want and s != 1:
            return None
    return tuple(new), dtype


def _slice(operands, attrs):
    ((shape, dtype),) = operands
    dim, start, end, step = attrs["dim"], attrs["start"], attrs["end"], attrs["step"]
    if not isinstance(dim, int) or not -len(shape) <= dim < len(shape) or not isinstance(step, int) or step < 1:
        return None
    if any(v is not None and not isinstance(v, int) for v in (start, end)):
        return None
    dim %= len(shape)
    length = len(range(*slice(start, end, step).indices(shape[dim])))
    return shape[:dim] + (length,) + shape[dim + 1:], dtype


def _cat(operands, attrs):
    shapes = [s for s, _ in operands]
    dtypes = {d for _, d in operands}
    dim = attrs["dim"]
    if not shapes or len(dtypes) != 1 or len({len(s) for s in shapes}) != 1 or not shapes[0]:
        return None
    rank = len(shapes[0])
    if not isinstance(dim, int) or not -rank <= dim < rank:
        return None
    dim %= rank
    if any(s[:dim] + s[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:] for s in shapes):
        return None
    out = list(shapes[0])
    out[dim] = sum(s[dim] for s in shapes)
    return tuple(out), dtypes.pop()


def _matmul(operands, attrs):
    (a, da), (b, db) = operands
    if da != db or da not in FLOATS or len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    batch = broadcast(a[:-2], b[:-2])
    return None if batch is None else (batch + (a[-2], b[-1]), da)


def _attention(operands, attrs):
    (q, dq), (k, dk), (v, dv), *mask = operands
    if not dq == dk == dv or dq not in FLOATS or not len(q) == len(k) == len(v) == 4:
        return None
    if q[0] != k[0] or k[:2] != v[:2] or q[3] != k[3] or k[2] != v[2]:
        return None
    if q[1] != k[1] and not (attrs.get("enable_gqa") and k[1] and q[1] % k[1] == 0):
        return None
    if mask:
        (m, dm), = mask
        if attrs.get("is_causal"):
            return None
        if (dm != torch.bool and dm != dq) or broadcast(m, (q[0], q[1], q[2], k[2])) != (q[0], q[1], q[2], k[2]):
            return None
    return q[:3] + (v[3],), dq


RULES: dict[str, Callable[[Sequence[Operand], dict], Result]] = {
    **{op: _elementwise(_same_float) for op in ("add", "sub", "mul", "div", "maximum", "minimum")},
    **{op: _elementwise(_to_bool) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{op: _elementwise(_same_float) for op in (
        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "tanh", "sigmoid", "relu", "silu",
        "pow")},
    "clamp": _elementwise(_clamp),
    "gelu": _elementwise(_gelu),
    **{op: _elementwise(_logical) for op in ("logical_and", "logical_or", "logical_not")},
    "where": _elementwise(_where),
    "cast": _cast, "tril": _tri, "triu": _tri, "full": _full,
    **{op: _reduce for op in ("sum", "mean", "var")},
    **{op: functools.partial(_reduce, needs_elements=True) for op in ("amax", "amin")},
    "reshape": _reshape, "permute": _permute, "expand": _expand, "slice": _slice, "cat": _cat,
    "matmul": _matmul, "attention": _attention,
}


def rule(op: str, operands: Sequence[Operand], attrs: dict) -> Result:
    """The shape and dtype of `op` by rule, or None: the meta reference decides."""
    fn = RULES.get(op)
    if fn is None:
        return None
    try:
        return fn(list(operands), attrs)
    except (KeyError, TypeError, ValueError):
        return None

"""The op registry: every operator minicomp knows is defined here, once.

An `OpDef` gives an op's kind (how the fusion planner treats it), its PyTorch reference
implementation (`ref(*tensors, **attrs)`), its flop count, and how Triton code writes it
(`triton`, a template over operand expressions `{0}`, `{1}`...; None where codegen has a
dedicated emitter). Shape and dtype inference is not written twice: `infer` runs `ref` on
meta tensors, so broadcasting and type promotion follow PyTorch exactly.

Kinds: input, constant, pointwise, reduction, view, gemm, attention, opaque.
Composite ops of the frontends (softmax, layer_norm, rms_norm, linear, ...) are not ops:
`composites.py` decomposes them into these primitives, so a hand-written softmax and
`F.softmax` reach the planner as the same graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

KINDS = ("input", "constant", "pointwise", "reduction", "view", "gemm", "attention", "opaque")


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    ref: Callable[..., torch.Tensor]
    arity: int | None = 1              # number of tensor operands; None = variadic
    flops_per_element: float = 1.0     # pointwise/reduction: flops per element (output / input)
    commutative: bool = False
    triton: str | None = None          # pointwise expression template over "{0}", "{1}", ...
    attrs: tuple[str, ...] = ()        # attribute names the op takes (all required)
    indexed: bool = False              # pointwise op whose value depends on the element index


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    assert op.kind in KINDS, op.kind
    assert op.name not in REGISTRY, op.name
    REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


# --------------------------------------------------------------------------- leaves

def _no_ref(*_a, **_k):
    raise RuntimeError("leaf nodes are bound by the interpreter, not evaluated")


def _constant_ref(*, value: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value if device is None else value.to(device)
    return torch.tensor(value, dtype=dtype, device=device)


register(OpDef("input", "input", _no_ref, arity=0, flops_per_element=0, attrs=("name",)))
register(OpDef("constant", "constant", _constant_ref, arity=0, flops_per_element=0, attrs=("value",)))


def _opaque_ref(*tensors, fn, **_):
    return fn(*tensors)


register(OpDef("opaque", "opaque", _opaque_ref, arity=None, flops_per_element=0, attrs=("fn", "target")))

# --------------------------------------------------------------------------- pointwise

_BINARY = {
    # name: (torch function, triton template, commutative)
    "add": (torch.add, "{0} + {1}", True),
    "sub": (torch.sub, "{0} - {1}", False),
    "mul": (torch.mul, "{0} * {1}", True),
    "div": (torch.div, "{0} / {1}", False),
    "maximum": (torch.maximum, "tl.maximum({0}, {1})", True),
    "minimum": (torch.minimum, "tl.minimum({0}, {1})", True),
    "eq": (torch.eq, "{0} == {1}", True),
    "ne": (torch.ne, "{0} != {1}", True),
    "lt": (torch.lt, "{0} < {1}", False),
    "le": (torch.le, "{0} <= {1}", False),
    "gt": (torch.gt, "{0} > {1}", False),
    "ge": (torch.ge, "{0} >= {1}", False),
    "logical_and": (torch.logical_and, "{0} & {1}", True),
    "logical_or": (torch.logical_or, "{0} | {1}", True),
}
for _name, (_fn, _tpl, _comm) in _BINARY.items():
    register(OpDef(_name, "pointwise", _fn, arity=2, commutative=_comm, triton=_tpl))

COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")

_UNARY = {
    # name: (torch function, triton template, flops per element)
    "neg": (torch.neg, "-{0}", 1),
    "abs": (torch.abs, "tl.abs({0})", 1),
    "exp": (torch.exp, "tl.exp({0})", 1),
    "log": (torch.log, "tl.log({0})", 1),
    "sqrt": (torch.sqrt, "tl.sqrt_rn({0})", 1),
    "rsqrt": (torch.rsqrt, "tl.rsqrt({0})", 1),
    "sin": (torch.sin, "tl.sin({0})", 1),
    "cos": (torch.cos, "tl.cos({0})", 1),
    "erf": (torch.erf, "tl.erf({0})", 1),
    "tanh": (torch.tanh, None, 1),                       # codegen: exp-based form
    "sigmoid": (torch.sigmoid, "1.0 / (1.0 + tl.exp(-{0}))", 3),
    "relu": (torch.relu, "tl.maximum({0}, 0.0)", 1),
    "silu": (F.silu, "{0} / (1.0 + tl.exp(-{0}))", 4),
    "logical_not": (torch.logical_not, "{0} == 0", 1),
}
for _name, (_fn, _tpl, _fl) in _UNARY.items():
    register(OpDef(_name, "pointwise", _fn, arity=1, flops_per_element=_fl, triton=_tpl))


def _gelu(x, *, approximate: str):
    return F.gelu(x, approximate=approximate)


register(OpDef("gelu", "pointwise", _gelu, flops_per_element=8, attrs=("approximate",)))


def _pow(x, *, exponent: float):
    return torch.pow(x, exponent)


register(OpDef("pow", "pointwise", _pow, attrs=("exponent",)))


def _clamp(x, *, min: float | None, max: float | None):
    return torch.clamp(x, min=min, max=max)


register(OpDef("clamp", "pointwise", _clamp, flops_per_element=2, attrs=("min", "max")))
register(OpDef("where", "pointwise", torch.where, arity=3, triton="tl.where({0}, {1}, {2})"))


def _cast(x, *, dtype: torch.dtype):
    return x.to(dtype)


register(OpDef("cast", "pointwise", _cast, flops_per_element=0, attrs=("dtype",)))


def _tril(x, *, diagonal: int):
    return torch.tril(x, diagonal)


def _triu(x, *, diagonal: int):
    return torch.triu(x, diagonal)


# tril/triu keep a mask symbolic: `tril(full(S, S, True))` is "causal" to the planner, not 16 MiB.
register(OpDef("tril", "pointwise", _tril, flops_per_element=1, attrs=("diagonal",), indexed=True))
register(OpDef("triu", "pointwise", _triu, flops_per_element=1, attrs=("diagonal",), indexed=True))


def _full(*, shape, value, dtype, device=None):
    return torch.full(shape, value, dtype=dtype, device=device)


def _arange(*, start, end, step, dtype, device=None):
    return torch.arange(start, end, step, dtype=dtype, device=device)


# Generators: no operands; values computed from the index, never stored as big constants.
register(OpDef("full", "pointwise", _full, arity=0, flops_per_element=0, attrs=("shape", "value", "dtype")))
register(OpDef("arange", "pointwise", _arange, arity=0, flops_per_element=0,
               attrs=("start", "end", "step", "dtype"), indexed=True))

# --------------------------------------------------------------------------- reductions


def _sum(x, *, axes, keepdim):
    return torch.sum(x, dim=axes, keepdim=keepdim)


def _mean(x, *, axes, keepdim):
    return torch.mean(x, dim=axes, keepdim=keepdim)


def _amax(x, *, axes, keepdim):
    return torch.amax(x, dim=axes, keepdim=keepdim)


def _amin(x, *, axes, keepdim):
    return torch.amin(x, dim=axes, keepdim=keepdim)


def _var(x, *, axes, keepdim, correction):
    return torch.var(x, dim=axes, keepdim=keepdim, correction=correction)


register(OpDef("sum", "reduction", _sum, attrs=("axes", "keepdim")))
register(OpDef("mean", "reduction", _mean, attrs=("axes", "keepdim")))
register(OpDef("amax", "reduction", _amax, attrs=("axes", "keepdim")))
register(OpDef("amin", "reduction", _amin, attrs=("axes", "keepdim")))
register(OpDef("var", "reduction", _var, flops_per_element=3, attrs=("axes", "keepdim", "correction")))

# --------------------------------------------------------------------------- views


def _reshape(x, *, shape):
    return x.reshape(shape)


def _permute(x, *, dims):
    return x.permute(dims)


def _expand(x, *, shape):
    return x.expand(shape)


def _slice(x, *, dim, start, end, step):
    index = [slice(None)] * x.dim()
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


def _cat(*xs, dim):
    return torch.cat(xs, dim=dim)


register(OpDef("reshape", "view", _reshape, flops_per_element=0, attrs=("shape",)))
register(OpDef("permute", "view", _permute, flops_per_element=0, attrs=("dims",)))
register(OpDef("expand", "view", _expand, flops_per_element=0, attrs=("shape",)))
register(OpDef("slice", "view", _slice, flops_per_element=0, attrs=("dim", "start", "end", "step")))
register(OpDef("cat", "view", _cat, arity=None, flops_per_element=0, attrs=("dim",)))

# --------------------------------------------------------------------------- gemm / attention

def _matmul(a, b):
    # Meta tensors accept mixed dtypes here; real PyTorch refuses them, so refuse them too.
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected both matmul operands to have the same dtype, got {a.dtype} and {b.dtype}")
    return torch.matmul(a, b)


register(OpDef("matmul", "gemm", _matmul, arity=2, flops_per_element=0))


def _attention(q, k, v, *mask, scale, is_causal, enable_gqa):
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"expected q, k and v to have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    attn_mask = mask[0] if mask else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)


# attention(q, k, v[, mask]): q [.., Hq, Sq, D], k/v [.., Hkv, Sk, D]; mask boolean (True keeps)
# or additive, broadcastable to [.., Hq, Sq, Sk].
register(OpDef("attention", "attention", _attention, arity=None, flops_per_element=0,
               attrs=("scale", "is_causal", "enable_gqa")))


# --------------------------------------------------------------------------- flops


def flops(op: str, arg_shapes: list[tuple[int, ...]], out_shape: tuple[int, ...], attrs: dict) -> int:
    """Flops of one node by the ledger's accounting (2 per multiply-add)."""
    d = get(op)
    if d.kind in ("pointwise",):
        return int(d.flops_per_element * math.prod(out_shape))
    if d.kind == "reduction":
        return int(d.flops_per_element * math.prod(arg_shapes[0]))
    if d.kind == "gemm":
        k = arg_shapes[0][-1]
        return 2 * math.prod(out_shape) * k
    if d.kind == "attention":
        q, kk = arg_shapes[0], arg_shapes[1]
        sq, sk, dh = q[-2], kk[-2], q[-1]
        batch_heads = math.prod(q[:-2])
        total = 4 * batch_heads * sq * sk * dh  # QK^T and PV, two flops per multiply-add
        if attrs.get("is_causal"):
            total //= 2
        return total
    return 0

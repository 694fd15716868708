"""matmul (batched, broadcasting batch dims) and attention; each has an emitter of its own.

codegen/gemm.py writes a matmul group (prologue casts and transposes folded into strides,
its elementwise epilogue fused); codegen/attention.py writes an attention group as a
flash-attention kernel. The passes/attention_match.py pass finds attention written out.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from minicomp.ir import attention_ref
from minicomp.ir.ops import OpDef, register
from minicomp.ir.ops.rules import FLOATS, broadcast
from minicomp.ir.ops.text import py_value


def _matmul(a, b):
    # Meta tensors accept mixed dtypes here; real PyTorch refuses them, so refuse them too.
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected both matmul operands to have the same dtype, got {a.dtype} and {b.dtype}")
    return torch.matmul(a, b)


def _matmul_rule(operands, attrs):
    (a, da), (b, db) = operands
    if da != db or da not in FLOATS or len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    batch = broadcast(a[:-2], b[:-2])
    return None if batch is None else (batch + (a[-2], b[-1]), da)


# addmm and friends are matmul then add (the bias becomes an epilogue); minicomp::matmul is
# the traced stand-in for `@` (frontend/fx_trace.py)
register(OpDef("matmul", "gemm", _matmul, arity=2, flops_per_element=0, emitter="gemm", shape=_matmul_rule,
               pytorch="torch.matmul({0}, {1})",
               aten=("mm.default", "bmm.default", "matmul.default", "dot.default", "mv.default", "addmm.default",
                     "baddbmm.default", "addmv.default", "minicomp::matmul.default")))


def _attention_rule(operands, attrs):
    (q, dq), (k, dk), (v, dv), *mask = operands
    if not dq == dk == dv or dq not in FLOATS:
        return None
    if len(q) == len(k) == len(v) == 3 and not attrs.get("enable_gqa"):   # [N, L, E] as SDPA takes it
        return _attention_rule([((q[0], 1) + q[1:], dq), ((k[0], 1) + k[1:], dk), ((v[0], 1) + v[1:], dv)]
                               + [((m[:1] + (1,) + m[1:]) if len(m) == 3 else m, dm) for m, dm in mask],
                               attrs) and (q[:2] + (v[2],), dq)
    if not len(q) == len(k) == len(v) == 4:
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


def _attention_text(x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    extra = {k: attrs.get(k, d) for k, d in attention_ref.EXTRA_DEFAULTS.items()}
    if extra != attention_ref.EXTRA_DEFAULTS or len(x) > 3:
        # soft-capping, a window, a fill, eager's rounding, or a mask (whose dtype may differ from
        # q's, which SDPA refuses): the node's reference runs, as in the interpreter; it calls SDPA
        # itself where SDPA means the same. Every value passed is a literal.
        kwargs = ", ".join(f"{k}={py_value(attrs[k])}" for k in ("scale", "is_causal", "enable_gqa"))
        kwargs += "".join(f", {k}={py_value(v)}" for k, v in extra.items())
        return f"__import__('minicomp.ir.attention_ref', fromlist=['reference']).reference({', '.join(x)}, {kwargs})"
    gqa = ", enable_gqa=True" if attrs.get("enable_gqa") else ""
    return (f"torch.nn.functional.scaled_dot_product_attention({x[0]}, {x[1]}, {x[2]}, "
            f"is_causal={attrs['is_causal']}, scale={py_value(attrs['scale'])}{gqa})")


# attention(q, k, v[, mask]): q [.., Hq, Sq, D], k/v [.., Hkv, Sk, D]; mask boolean (True keeps)
# or additive, broadcastable to [.., Hq, Sq, Sk]. SDPA's arguments, and the attributes of
# attention_ref.py (soft-capping, a sliding window, masked_fill's value, eager's rounding, what
# a row with no visible key gives), whose docstring defines them. minicomp::sdpa is the traced
# stand-in for F.scaled_dot_product_attention (frontend/fx_trace.py).
register(OpDef("attention", "attention", attention_ref.reference, arity=None, flops_per_element=0,
               emitter="attention", attrs=("scale", "is_causal", "enable_gqa") + tuple(attention_ref.EXTRA_DEFAULTS),
               shape=_attention_rule, pytorch=_attention_text,
               aten=("_scaled_dot_product_flash_attention_for_cpu.default", "minicomp::sdpa.default")))

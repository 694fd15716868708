"""PyTorch code for a group that runs without a generated kernel.

Opaque groups always run this way; any other group does when its emitter raised
`Unsupported`. Each node becomes one readable line of `call()`
(`buf7 = torch.matmul(buf3, buf5)  # %7 matmul`), and each output is put in the layout
later kernels were generated for (`_as_layout`, a no-op when it already is).

Invariant: the text computes exactly what the reference interpreter computes (the same
PyTorch functions with the node's attributes), so a fallback never changes results.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.errors import CompileError
from minicomp.ir.graph import Node

_TORCH_UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "tanh", "sigmoid",
                "relu", "logical_not")
_TORCH_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                 "logical_and", "logical_or")


def py_value(v: Any) -> str:
    """Python source for an attribute value (dtypes, inf/nan floats, nested tuples)."""
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return f"float('{v}')"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(py_value(x) for x in v)
        return f"({inner},)" if isinstance(v, tuple) and len(v) == 1 else (f"({inner})" if isinstance(v, tuple) else f"[{inner}]")
    return repr(v)


def _slice_text(x: str, node: Node) -> str:
    a = node.attrs
    parts = [":"] * (a["dim"] % max(len(node.shape), 1))
    fmt = lambda v: "" if v is None else str(v)
    parts.append(f"{fmt(a['start'])}:{fmt(a['end'])}:{fmt(a['step'])}")
    return f"{x}[{', '.join(parts)}]"


def torch_text(node: Node, args: list[str], opaque_slot: Callable[[Node], int]) -> str:
    """One PyTorch expression computing `node` from its operands' variable names."""
    op, a = node.op, node.attrs
    if op in _TORCH_BINARY:
        return f"torch.{op}({args[0]}, {args[1]})"
    if op in _TORCH_UNARY:
        return f"torch.{op}({args[0]})"
    table = {
        "silu": lambda: f"torch.nn.functional.silu({args[0]})",
        "gelu": lambda: f"torch.nn.functional.gelu({args[0]}, approximate={a['approximate']!r})",
        "pow": lambda: f"torch.pow({args[0]}, {py_value(a['exponent'])})",
        "clamp": lambda: f"torch.clamp({args[0]}, min={py_value(a['min'])}, max={py_value(a['max'])})",
        "where": lambda: f"torch.where({args[0]}, {args[1]}, {args[2]})",
        "cast": lambda: f"{args[0]}.to({a['dtype']})",
        "tril": lambda: f"torch.tril({args[0]}, {a['diagonal']})",
        "triu": lambda: f"torch.triu({args[0]}, {a['diagonal']})",
        "full": lambda: f"torch.full({py_value(tuple(a['shape']))}, {py_value(a['value'])}, dtype={a['dtype']}, device=device)",
        "arange": lambda: (f"torch.arange({py_value(a['start'])}, {py_value(a['end'])}, {py_value(a['step'])}, "
                           f"dtype={a['dtype']}, device=device)"),
        "var": lambda: (f"torch.var({args[0]}, dim={py_value(tuple(a['axes']))}, keepdim={a['keepdim']}, "
                        f"correction={py_value(a['correction'])})"),
        "reshape": lambda: f"{args[0]}.reshape({py_value(tuple(a['shape']))})",
        "permute": lambda: f"{args[0]}.permute({py_value(tuple(a['dims']))})",
        "expand": lambda: f"{args[0]}.expand({py_value(tuple(a['shape']))})",
        "slice": lambda: _slice_text(args[0], node),
        "cat": lambda: f"torch.cat([{', '.join(args)}], dim={a['dim']})",
        "matmul": lambda: f"torch.matmul({args[0]}, {args[1]})",
        "attention": lambda: _attention_text(args, a),
        "opaque": lambda: f"OPAQUE[{opaque_slot(node)}]({', '.join(args)})",
    }
    if op in ("sum", "mean", "amax", "amin"):
        return f"torch.{op}({args[0]}, dim={py_value(tuple(a['axes']))}, keepdim={a['keepdim']})"
    if op not in table:
        # tests/test_runtime.py checks every registry op has a form, so this is a minicomp bug
        raise CompileError(f"{node.describe()}: minicomp has no PyTorch form for op {op!r}")
    return table[op]()


def _attention_text(args: list[str], a: dict) -> str:
    mask = f", attn_mask={args[3]}" if len(args) > 3 else ""
    gqa = ", enable_gqa=True" if a.get("enable_gqa") else ""
    return (f"torch.nn.functional.scaled_dot_product_attention({args[0]}, {args[1]}, {args[2]}{mask}, "
            f"is_causal={a['is_causal']}, scale={py_value(a['scale'])}{gqa})")


def emit_torch(ctx: KernelCtx, reason: str, out: CodeBuilder, opaque_slot: Callable[[Node], int]) -> None:
    """Write the group's nodes as PyTorch lines of call(), then fix its outputs' layouts."""
    g = ctx.graph
    out.writeline(f"# runs through PyTorch: {reason}")
    order = {nid: i for i, nid in enumerate(g.topo_order())}
    for nid in sorted(ctx.group.nodes, key=order.__getitem__):
        node = g.node(nid)
        if node.kind in ("input", "constant"):
            continue
        text = torch_text(node, [ctx.buf(x) for x in node.args], opaque_slot)
        note = f"  # {node.op}" + (f" {node.attrs.get('target')}" if node.op == "opaque" else "")
        out.writeline(f"{ctx.buf(nid)} = {text}{note}")
    for o in ctx.group.outputs:
        out.writeline(f"{ctx.buf(o)} = _as_layout({ctx.buf(o)}, {py_value(ctx.strides(o))})")

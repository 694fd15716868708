"""PyTorch code for a group that runs without a generated kernel.

Opaque groups always run this way; any other group does when its emitter raised
`Unsupported`. Each node becomes one readable line of `call()`
(`buf7 = torch.matmul(buf3, buf5)  # %7 matmul`), and each output is put in the layout
later kernels were generated for (`_as_layout`, a no-op when it already is).

Invariant: the text computes exactly what the reference interpreter computes (the same
PyTorch functions with the node's attributes), so a fallback never changes results. Each
op's text is its op table entry's (`OpDef.pytorch`); only opaque calls are written here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.names import comment_text
from minicomp.errors import CompileError
from minicomp.ir import ops
from minicomp.ir.graph import Graph, Node
from minicomp.ir.ops.text import py_value
from minicomp.plan.rules import topo

__all__ = ["emit_torch", "py_value", "torch_text"]


def torch_text(node: Node, args: list[str], opaque_slot: Callable[[Node], int]) -> str:
    """One PyTorch expression computing `node` from its operands' variable names."""
    if node.op == "opaque":
        text = aten_call_text(node.attrs["fn"], args)
        return text if text is not None else f"OPAQUE[{opaque_slot(node)}]({', '.join(args)})"
    text = ops.get(node.op).torch_text(args, node.attrs, node.shape)
    if text is None:
        # tests/test_runtime.py checks every registry op has a form, so this is a minicomp bug
        raise CompileError(f"{node.describe()}: minicomp has no PyTorch form for op {node.op!r}")
    return text


def _arg_text(a: Any, operands: list[str]) -> str | None:
    """Python text of one captured argument of an aten call, or None if it has none."""
    if hasattr(a, "index") and type(a).__name__ == "_Slot":      # an operand of the opaque node
        return operands[a.index]
    if a is None or isinstance(a, (bool, int, str)):
        return repr(a)
    if isinstance(a, float):
        return py_value(a)
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return "device"                                         # the call's own device
    if isinstance(a, (torch.layout, torch.memory_format)):
        return str(a)
    if isinstance(a, (list, tuple)):
        parts = [_arg_text(x, operands) for x in a]
        if None in parts:
            return None
        inner = ", ".join(parts)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(parts) == 1 else ''})"
    return None


def aten_call_text(call: Any, operands: list[str]) -> str | None:
    """`torch.ops.aten.cumsum.default(x, 1)` for an opaque node's captured aten call (the
    frontend's record: `target`, `args`, `kwargs`, `output`), so the module runs it as plain
    PyTorch, on its own; None where an argument has no Python text (the loader's OPAQUE then)."""
    target = getattr(call, "target", None)
    if not isinstance(target, torch._ops.OpOverload):
        return None
    packet, overload = target.overloadpacket, target._overloadname
    namespace, name = packet._qualified_op_name.split("::", 1)
    if not (namespace.isidentifier() and name.isidentifier() and overload.isidentifier()):
        return None
    args = [_arg_text(a, operands) for a in call.args]
    kwargs = {k: _arg_text(v, operands) for k, v in call.kwargs.items()}
    if None in args or None in kwargs.values() or not all(k.isidentifier() for k in kwargs):
        return None
    text = f"torch.ops.{namespace}.{name}.{overload}({', '.join(args + [f'{k}={v}' for k, v in kwargs.items()])})"
    return text if call.output is None else f"{text}[{int(call.output)}]"


def emit_torch(ctx: KernelCtx, reason: str, out: CodeBuilder, opaque_slot: Callable[[Node], int]) -> None:
    """Write the group's nodes as PyTorch lines of call(), then fix its outputs' layouts."""
    out.writeline(f"# runs through PyTorch: {comment_text(reason)}")
    write_nodes(ctx, out, opaque_slot)


def scalar_line(ctx: KernelCtx, node: Node, fresh: bool = False) -> str:
    """`bufN = _rt.scalar(v, dtype, device)`: a scalar constant as the tensor PyTorch lines read,
    made on the device once and kept (runtime/checks.scalar: no host-to-device copy per call).
    `fresh`: a copy of its own each call (`.clone()`, on the device), where the caller may get
    it, or a view of it, back."""
    line = f"{ctx.buf(node.id)} = _rt.scalar({py_value(node.attrs['value'])}, {node.dtype}, device)"
    return line + ".clone()" if fresh else line


def returned_scalars(g: Graph) -> set[int]:
    """The scalar constants a call may hand back to its caller, or a view of: reached from a graph
    output through views, casts and opaque calls (each may return what it reads as it is).
    Those are made `fresh` each call (`scalar_line`), so a caller who writes into a result
    cannot change the kept tensor the next call reads."""
    found: set[int] = set()
    stack, seen = list(g.outputs), set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = g.node(nid)
        if node.op == "constant" and not isinstance(node.attrs["value"], torch.Tensor):
            found.add(nid)
        elif node.kind in ("view", "opaque") or node.op == "cast":
            stack.extend(node.args)
    return found


def write_nodes(ctx: KernelCtx, out: CodeBuilder, opaque_slot: Callable[[Node], int], layouts: bool = True) -> None:
    """The group's nodes as PyTorch lines, in graph order, then (`layouts`) its outputs' layouts."""
    g = ctx.graph
    # the group's own order (sorting the whole graph for each group took 3 ms a group in a
    # 4-layer Llama, whose every kernel now has PyTorch lines for its first calls: first_calls.py)
    for nid in topo(g, set(ctx.group.nodes)):
        node = g.node(nid)
        if node.kind in ("input", "constant"):
            continue
        text = torch_text(node, [ctx.buf(x) for x in node.args], opaque_slot)
        note = f"  # {node.op}" + (f" {comment_text(node.attrs.get('target'))}" if node.op == "opaque" else "")
        out.writeline(f"{ctx.buf(nid)} = {text}{note}")
    for o in ctx.group.outputs if layouts else ():
        out.writeline(f"{ctx.buf(o)} = _as_layout({ctx.buf(o)}, {py_value(ctx.strides(o))})")

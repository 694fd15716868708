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

from typing import Callable

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.names import comment_text
from minicomp.errors import CompileError
from minicomp.ir import ops
from minicomp.ir.graph import Node
from minicomp.ir.ops.text import py_value

__all__ = ["emit_torch", "py_value", "torch_text"]


def torch_text(node: Node, args: list[str], opaque_slot: Callable[[Node], int]) -> str:
    """One PyTorch expression computing `node` from its operands' variable names."""
    if node.op == "opaque":
        return f"OPAQUE[{opaque_slot(node)}]({', '.join(args)})"
    text = ops.get(node.op).torch_text(args, node.attrs, node.shape)
    if text is None:
        # tests/test_runtime.py checks every registry op has a form, so this is a minicomp bug
        raise CompileError(f"{node.describe()}: minicomp has no PyTorch form for op {node.op!r}")
    return text


def emit_torch(ctx: KernelCtx, reason: str, out: CodeBuilder, opaque_slot: Callable[[Node], int]) -> None:
    """Write the group's nodes as PyTorch lines of call(), then fix its outputs' layouts."""
    g = ctx.graph
    out.writeline(f"# runs through PyTorch: {comment_text(reason)}")
    order = {nid: i for i, nid in enumerate(g.topo_order())}
    for nid in sorted(ctx.group.nodes, key=order.__getitem__):
        node = g.node(nid)
        if node.kind in ("input", "constant"):
            continue
        text = torch_text(node, [ctx.buf(x) for x in node.args], opaque_slot)
        note = f"  # {node.op}" + (f" {comment_text(node.attrs.get('target'))}" if node.op == "opaque" else "")
        out.writeline(f"{ctx.buf(nid)} = {text}{note}")
    for o in ctx.group.outputs:
        out.writeline(f"{ctx.buf(o)} = _as_layout({ctx.buf(o)}, {py_value(ctx.strides(o))})")

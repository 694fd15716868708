"""Text and DOT renderings of a Graph.

The text dump is stable (same graph, same text) and one node a line:

    graph rmsnorm(%0: x, %1: w) {
      %2 = mul(%0, %0) : f32[4, 8]   # rmsnorm.mc:2:17
      ...
      return %9
    }

Tensor constants print by label (or shape) and a short content digest, never their data.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from minicomp.ir.dtypes import dtype_name, type_str


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    if isinstance(v, torch.Tensor):
        return f"<{type_str(tuple(v.shape), v.dtype)} #{tensor_digest(v)}>"
    if callable(v):
        return getattr(v, "__name__", type(v).__name__)
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def tensor_digest(t: torch.Tensor) -> str:
    """A short fingerprint of a tensor's contents, for dumps (equality checks use torch.equal)."""
    data = t.detach().cpu().flatten().to(torch.float64)
    key = (tuple(t.shape), str(t.dtype), float(data.sum()) if data.numel() else 0.0,
           float(data.abs().sum()) if data.numel() else 0.0, data[:8].tolist())
    return hashlib.sha1(repr(key).encode()).hexdigest()[:8]


def format_node(n) -> str:
    parts = [f"%{a}" for a in n.args]
    for k, v in n.attrs.items():
        if k == "fn":
            continue
        if n.op == "constant" and k == "value":
            parts.append(_fmt_value(v))
        else:
            parts.append(f"{k}={_fmt_value(v)}")
    text = f"%{n.id} = {n.op}({', '.join(parts)}) : {type_str(n.shape, n.dtype)}"
    if n.layout is not None:
        text += f" strides=[{', '.join(map(str, n.layout))}]"
    if n.origin:
        text += f"   # {n.origin}"
    return text


def dump(graph, show_origin: bool = True) -> str:
    params = ", ".join(f"%{i}: {graph.node(i).attrs['name']}" for i in graph.inputs)
    lines = [f"graph {graph.name}({params}) {{"]
    for n in graph.nodes():
        if n.op == "input":
            lines.append(f"  %{n.id} = input {n.attrs['name']} : {type_str(n.shape, n.dtype)}"
                         + (f" strides=[{', '.join(map(str, n.layout))}]" if n.layout is not None else ""))
            continue
        line = format_node(n)
        if not show_origin and "   # " in line:
            line = line.split("   # ")[0]
        lines.append("  " + line)
    lines.append(f"  return {', '.join(f'%{o}' for o in graph.outputs)}")
    lines.append("}")
    return "\n".join(lines)


def to_dot(graph, groups: dict[int, int] | None = None) -> str:
    """Graphviz DOT text; `groups` maps node id -> group id to colour nodes by group."""
    palette = ["#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99",
               "#1f78b4", "#33a02c", "#e31a1c", "#ff7f00", "#6a3d9a", "#b15928"]
    lines = [f'digraph "{graph.name}" {{', "  node [shape=box, style=filled, fontname=monospace];"]
    for n in graph.nodes():
        label = f"%{n.id} {n.op}\\n{type_str(n.shape, n.dtype)}"
        if n.op == "input":
            label = f"%{n.id} {n.attrs['name']}\\n{type_str(n.shape, n.dtype)}"
        colour = "#eeeeee"
        if groups and n.id in groups:
            colour = palette[groups[n.id] % len(palette)]
            label += f"\\ngroup {groups[n.id]}"
        shape = ", shape=ellipse" if n.op in ("input", "constant") else ""
        lines.append(f'  n{n.id} [label="{label}", fillcolor="{colour}"{shape}];')
    for a, b in sorted(graph.nx.edges):
        lines.append(f"  n{a} -> n{b};")
    for k, o in enumerate(graph.outputs):
        lines.append(f'  out{k} [label="output {k}", shape=plaintext];')
        lines.append(f"  n{o} -> out{k};")
    lines.append("}")
    return "\n".join(lines)

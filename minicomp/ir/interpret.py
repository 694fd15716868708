"""The reference interpreter: runs a Graph node by node with PyTorch ops.

It is the semantics every other stage is checked against: `--check`, the constant
folder, and the tests all compare with it (and it with eager PyTorch).
"""

from __future__ import annotations

from typing import Sequence

import torch

from minicomp.errors import GuardError
from minicomp.ir import ops
from minicomp.ir.graph import Graph, Node


def check_inputs(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    if len(inputs) != len(graph.inputs):
        raise GuardError(f"{graph.name} takes {len(graph.inputs)} input(s) "
                         f"({', '.join(graph.input_names())}), got {len(inputs)}")
    for nid, t in zip(graph.inputs, inputs):
        n = graph.node(nid)
        if not isinstance(t, torch.Tensor):
            raise GuardError(f"input {n.attrs['name']!r} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != n.shape or t.dtype != n.dtype:
            raise GuardError(f"input {n.attrs['name']!r} must be {n.type}, got "
                             f"{t.dtype}{list(t.shape)}")


def eval_node(n: Node, args: list[torch.Tensor], device: torch.device | str) -> torch.Tensor:
    d = ops.get(n.op)
    if n.op == "constant":
        v = n.attrs["value"]
        return v.to(device) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=n.dtype, device=device)
    kwargs = {k: v for k, v in n.attrs.items() if k in d.attrs}
    if n.op in ("full", "arange"):
        kwargs["device"] = device
    if n.op == "opaque":
        return n.attrs["fn"](*args)
    return d.ref(*args, **kwargs)


def run(graph: Graph, inputs: Sequence[torch.Tensor], check: bool = True) -> list[torch.Tensor]:
    """Evaluate `graph` on `inputs`; returns the outputs in order."""
    if check:
        check_inputs(graph, inputs)
    device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[int, torch.Tensor] = dict(zip(graph.inputs, inputs))
    remaining = {nid: graph.nx.out_degree(nid) for nid in graph.nx.nodes}
    keep = set(graph.outputs)
    for nid in graph.topo_order():
        n = graph.node(nid)
        if n.op != "input":
            env[nid] = eval_node(n, [env[a] for a in n.args], device)
        for a in set(n.args):  # free intermediates as soon as their last user ran
            remaining[a] -= 1
            if remaining[a] == 0 and a not in keep:
                env.pop(a, None)
    return [env[o] for o in graph.outputs]


def random_inputs(graph: Graph, seed: int = 0, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Seeded random tensors matching the graph's inputs (normal floats, small ints, coin-flip bools)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for nid in graph.inputs:
        n = graph.node(nid)
        if n.dtype.is_floating_point:
            t = torch.randn(n.shape, generator=gen).to(n.dtype)
        elif n.dtype == torch.bool:
            t = torch.rand(n.shape, generator=gen) > 0.5
        else:
            t = torch.randint(-8, 8, n.shape, generator=gen).to(n.dtype)
        out.append(t.to(device))
    return out

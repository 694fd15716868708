"""Dead-code elimination: drop every node that no graph output depends on.

Invariants: graph inputs always stay (they are the signature, used or not); outputs and
their ancestors stay; nothing else is touched. Opaque nodes are dropped like any other
when unused: an opaque node stands for a PyTorch op whose value is all the graph keeps of
it, so an unused one has no effect on the outputs.
"""

from __future__ import annotations

import networkx as nx

from minicomp.ir.graph import Graph
from minicomp.passes.registry import Changes, register_pass


def live_nodes(graph: Graph) -> set[int]:
    """Ids of the outputs, everything they depend on, and the inputs."""
    live = set(graph.inputs) | set(graph.outputs)
    for o in graph.outputs:
        live |= nx.ancestors(graph.nx, o)
    return live


@register_pass("dce", fixed_point=True)
def dce(graph: Graph) -> tuple[Graph, Changes]:
    """Dead-code elimination: drop nodes no output depends on."""
    g = graph.copy()
    live = live_nodes(g)
    dead = [nid for nid in g.topo_order() if nid not in live]
    for nid in reversed(dead):  # users before their operands, so `remove` never sees a user
        g.remove(nid)
    return g, {"removed": len(dead)}

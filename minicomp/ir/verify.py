"""`verify(graph)`: the IR's invariants, checked after the frontend and after every pass.

Checks: acyclic; every arg exists and edges mirror `args` exactly; every op is registered
with its attributes; shapes and dtypes agree with inference; inputs are `input` nodes and
outputs exist; every output is reachable from the inputs or constants. Each error names
the node, its op, its operands' types and its origin.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from minicomp.errors import VerifyError
from minicomp.ir import ops
from minicomp.ir.graph import Graph, infer


def _where(graph: Graph, n) -> str:
    operands = ", ".join(f"%{a}: {graph.node(a).type}" if a in graph else f"%{a}: <missing>" for a in n.args)
    origin = f" from {n.origin}" if n.origin else ""
    return f"node %{n.id} ({n.op}) with operands ({operands}){origin}"


def verify(graph: Graph) -> None:
    g = graph.nx
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        path = " -> ".join(f"%{a}" for a, _ in cycle) + f" -> %{cycle[0][0]}"
        raise VerifyError(f"graph {graph.name!r} has a cycle: {path}")
    for nid in g.nodes:
        n = graph.node(nid)
        if n.id != nid:
            raise VerifyError(f"node %{nid} ({n.op}) records id %{n.id}")
        if n.op not in ops.REGISTRY:
            raise VerifyError(f"{_where(graph, n)}: unknown op {n.op!r}")
        d = ops.get(n.op)
        missing = [a for a in d.attrs if a not in n.attrs]
        if missing:
            raise VerifyError(f"{_where(graph, n)}: missing attribute(s) {', '.join(missing)}")
        for a in n.args:
            if a not in g:
                raise VerifyError(f"{_where(graph, n)}: operand %{a} does not exist")
        if d.arity is not None and len(n.args) != d.arity:
            raise VerifyError(f"{_where(graph, n)}: {n.op} takes {d.arity} operand(s), got {len(n.args)}")
        # edges must mirror args, positions included
        want = Counter()
        for pos, a in enumerate(n.args):
            want[(a, pos)] += 1
        have = Counter()
        for a in g.predecessors(nid):
            for pos in g.edges[a, nid]["positions"]:
                have[(a, pos)] += 1
        if want != have:
            raise VerifyError(f"{_where(graph, n)}: edges {sorted(have)} do not match args {sorted(want)}")
        if n.kind in ("input", "constant", "opaque"):
            continue
        try:
            shape, dtype = infer(n.op, [graph.node(a) for a in n.args], n.attrs)
        except ValueError as e:
            raise VerifyError(f"{_where(graph, n)}: operands do not fit: {e}") from None
        if shape != n.shape or dtype != n.dtype:
            raise VerifyError(f"{_where(graph, n)}: recorded type {n.type} but inference gives "
                              f"{dtype}{list(shape)}")
    for i in graph.inputs:
        if i not in g or graph.node(i).op != "input":
            raise VerifyError(f"graph input %{i} is not an input node")
    if not graph.outputs:
        raise VerifyError(f"graph {graph.name!r} has no outputs")
    for o in graph.outputs:
        if o not in g:
            raise VerifyError(f"graph output %{o} does not exist")
    # reachability: every ancestor chain of an output must start at an input, constant or generator
    for o in graph.outputs:
        for a in nx.ancestors(g, o) | {o}:
            n = graph.node(a)
            if n.op == "input" and a not in graph.inputs:
                raise VerifyError(f"node %{a} (input {n.attrs.get('name')!r}) feeds output %{o} "
                                  "but is not a graph input")

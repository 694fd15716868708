"""The order in which a generated run() launches a plan's groups.

Each group runs after the groups that write what it reads (`_dependency_order`, in the plan's
order otherwise); a group that reads only the call's inputs moves to just before its first
reader (`_late_sources`).
"""

from __future__ import annotations

from minicomp.errors import CompileError
from minicomp.ir.graph import Graph
from minicomp.plan.records import Group, Plan


def group_order(graph: Graph, plan: Plan) -> list[Group]:
    """Plan groups in an order where each runs after the groups that write what it reads, and a
    group that reads only the call's inputs (transformers' rotary tables, from `inv_freq`) runs
    just before the first group that reads it (`_late_sources`)."""
    return _late_sources(graph, _dependency_order(graph, plan))


def _late_sources(graph: Graph, order: list[Group]) -> list[Group]:
    """`order` with each source group (it reads only inputs and constants, holds no PyTorch
    fallback node, which may draw random numbers in eager's order, and no graph output) moved to
    just before its first reader. The host queues the call's kernels one by one, and at the
    start of a call the GPU waits for each: a small kernel queued before the first large one
    (the tables before Llama's q projection) delays all that follows by its host time."""
    made_here = {o for g in order for o in g.outputs}
    outputs = set(graph.outputs)
    sources = [g for g in order if g.outputs and not any(i in made_here for i in g.inputs)
               and not outputs & set(g.outputs) and all(graph.node(n).op != "opaque" for n in g.nodes)]
    if not sources:
        return order
    rest = [g for g in order if g not in sources]
    out: list[Group] = []
    for g in rest:
        for src in [s for s in sources if set(s.outputs) & set(g.inputs)]:
            out.append(src)
            sources.remove(src)
        out.append(g)
    return out + sources          # read by no group (dead results): where they were, at the end


def _dependency_order(graph: Graph, plan: Plan) -> list[Group]:
    """Plan groups in an order where each runs after the groups that write what it reads."""
    ready = {n.id for n in graph.nodes() if n.kind in ("input", "constant")}
    pending, order = list(plan.groups), []
    while pending:
        for g in pending:
            if all(i in ready for i in g.inputs):
                order.append(g)
                pending.remove(g)
                ready |= set(g.outputs)
                break
        else:
            g = pending[0]
            missing = [f"%{i}" for i in g.inputs if i not in ready]
            raise CompileError(f"plan for {graph.name!r}: group {g.id} ({g.kind}) reads {', '.join(missing)}, "
                               "which no group writes")
    return order

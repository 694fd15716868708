"""The fusion planner's entry: which nodes share a kernel, decided by the bytes that fusion saves.

`plan_graph(graph, machine) -> Plan`. Start: one cluster per node (eager, `state.py`).
Greedy: apply the legal move (`moves.py`) that saves the most bytes, until none saves any
(`search.py`, incremental); then the final state becomes a Plan (`build.py`), with the
refused candidates that remain and their reasons. The planner reads the graph's nodes,
operands, shapes, dtypes and attributes, never its strides: layout is assigned after
planning, from the plan (`layout.py`).
"""

from __future__ import annotations

from dataclasses import replace

from minicomp.ir.graph import Graph
from minicomp.plan import cost as ledger
from minicomp.plan.build import build_plan, resymbolise
from minicomp.plan.records import Plan
from minicomp.plan.search import search
from minicomp.plan.state import initial_state


def plan_graph(graph: Graph, machine: "str | ledger.Machine" = "h200", *, baseline: Graph | None = None,
               library: dict[int, str] | None = None) -> Plan:
    """Group the nodes of `graph` into kernels for `machine`; see the module docstring and
    contracts.md. Planning is deterministic and leaves `graph` as it is.

    `baseline`: the program as written (before the passes), whose eager bytes the plan's
    `unfused_bytes` should count; by default `graph` itself. `library`: matmuls a library
    call computes (node id -> why; the caller's choice for its target, codegen/library_plan.py):
    each keeps a group of its own, whose epilogue fuses with what follows instead.
    """
    m = ledger.get_machine(machine)
    if graph.symbolic:
        # decisions at the hints (a static compile at those sizes would decide the same); the
        # ledger and the specs then from the symbolic graph: bytes and bounds as expressions
        hinted = plan_graph(graph.hinted(), m, baseline=None if baseline is None else baseline.hinted(),
                            library=library)
        return resymbolise(hinted, graph, m, baseline)
    final, recomputed = search(initial_state(graph, library))
    plan = build_plan(final, recomputed, m)
    if baseline is not None:
        plan = replace(plan, unfused_bytes=ledger.unfused_bytes(baseline))
    return plan

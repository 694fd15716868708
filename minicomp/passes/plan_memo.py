"""The layout pass's plan, left with the graph it returns, so a compile plans once.

The `layout` pass plans its graph to choose strides, sets the strides, and returns the
graph; `compile_graph` then plans that same graph again. Strides (`Node.layout`) are the
only difference, and the planner never reads them. So the layout pass leaves its plan
with the graph it returns (`leave_plan`), and `plan_graph` takes a copy of it
(`left_plan`) instead of planning, when asked for the same machine and the graph still has
the `fingerprint` it had then. Any change to the graph after the pass changes the
fingerprint, and then `plan_graph` plans as usual. The plan lives as long as the graph
object (a weak side table): nothing is shared between graphs or compiles.

The fingerprint holds everything the planner reads from a graph: its name, inputs and
outputs, and per node (in the graph's own order) the id, op, kind, operands, shape,
dtype and attributes, plus the edges. Attribute values that are not plain data (tensor
values of constants, the callable of an opaque node) are reduced to their type: the
planner never reads them (of attributes it reads `axes`, `keepdim`, `is_causal`,
`enable_gqa` and `target`), and the fingerprint keeps no reference to big objects.
`layout` and `origin` are left out: the planner reads neither.
"""

from __future__ import annotations

from typing import Any, Hashable
from weakref import WeakKeyDictionary

import torch

from minicomp.ir.graph import Graph
from minicomp.passes.cost import Machine
from minicomp.passes.plan import Plan

_left: WeakKeyDictionary[Graph, tuple[tuple, str, Plan]] = WeakKeyDictionary()


def _plain(v: Any) -> Hashable:
    """An attribute value as plain hashable data, or its type name when it is not data."""
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
        return (type(v).__name__, v)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_plain(x) for x in v))
    return ("object", type(v).__qualname__)


def fingerprint(graph: Graph) -> tuple:
    """Everything `plan_graph` reads from `graph` (see the module docstring)."""
    nodes = []
    for nid in graph.nx.nodes:
        n = graph.node(nid)
        attrs = tuple(sorted((k, _plain(v)) for k, v in n.attrs.items()))
        nodes.append((nid, n.op, n.kind, n.args, n.shape, n.dtype, attrs))
    return (graph.name, tuple(graph.inputs), tuple(graph.outputs), tuple(nodes), tuple(graph.nx.edges))


def leave_plan(graph: Graph, machine: Machine, plan: Plan) -> None:
    """Record that `plan` is `graph`'s plan for `machine`, as the graph is now."""
    _left[graph] = (fingerprint(graph), repr(machine), plan.copy())


def left_plan(graph: Graph, machine: Machine) -> Plan | None:
    """A copy of the plan left with `graph` for `machine`, if the graph is unchanged since."""
    entry = _left.get(graph)
    if entry is None or entry[1] != repr(machine) or entry[0] != fingerprint(graph):
        return None
    return entry[2].copy()

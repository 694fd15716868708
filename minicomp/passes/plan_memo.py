"""Planning a graph structure once per compilation.

`compile_graph` plans twice what is one structure: the `layout` pass plans the graph to
choose strides, then the compile plans the layout pass's result. The two graphs differ
only in `Node.layout`, which the planner never reads. Inside `with plan_memo():`,
`plan_graph` looks a graph up by `fingerprint` first and returns a copy of the plan it
made for the same fingerprint (and machine); outside such a block nothing is memoised,
and the memo is dropped when the outermost block ends (no plan outlives a compile).

The fingerprint holds everything the planner reads from a graph: its name, inputs and
outputs, and per node (in the graph's own order) the id, op, kind, operands, shape,
dtype and attributes, plus the edges. Attribute values that are not plain data (tensor
values of constants, the callable of an opaque node) are reduced to their type: the
planner never reads them (it reads `axes`, `keepdim`, `is_causal`, `enable_gqa` and
`target`), and the fingerprint keeps no reference to big objects. `layout` and `origin`
are left out: the planner reads neither.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Hashable, Iterator

import torch

from minicomp.ir.graph import Graph
from minicomp.passes.plan import Plan

_memo: dict[tuple, Plan] | None = None   # set only inside `plan_memo()`


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


@contextmanager
def plan_memo() -> Iterator[None]:
    """Within this block, `plan_graph` plans each (graph structure, machine) once."""
    global _memo
    outermost = _memo is None
    if outermost:
        _memo = {}
    try:
        yield
    finally:
        if outermost:
            _memo = None


def memo_key(graph: Graph, machine_key: Hashable) -> tuple | None:
    """The memo key of planning `graph` for a machine; None outside `plan_memo()`."""
    return None if _memo is None else (fingerprint(graph), machine_key)


def recall(key: tuple | None) -> Plan | None:
    """A copy of the plan stored under `key`, if any."""
    if key is None or _memo is None or key not in _memo:
        return None
    return _memo[key].copy()


def remember(key: tuple | None, plan: Plan) -> None:
    if key is not None and _memo is not None:
        _memo[key] = plan.copy()

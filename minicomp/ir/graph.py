"""The IR: a typed operator graph over one `networkx.DiGraph`.

Invariants (checked by `verify.verify`):
- a node is one operator; its `Node` record lives in the networkx node's attribute
  dict under the key "node" (`graph.nx.nodes[i]["node"]`);
- `Node.args` (ordered node ids) is the source of truth for operand order; there is an
  edge arg -> user for every distinct arg, with the attribute `positions` listing where
  it is used, so networkx algorithms (topological sort, ancestors, cycles) work;
- a shape is a tuple of dims, each an int or a symbolic `dims.Expr` (a DSL program without
  `--dim`, a function compiled with `dynamic=True`); strides likewise;
- `layout` is None ("free") until layout assignment (plan/layout.py) fixes a tuple of strides;
- `origin` says where the node came from (`model.py:12`, `prog.mc:3:7`), for errors.

`Graph.add` infers shape and dtype through the registry (meta tensors), so a builder only
says op, operands and attributes.
"""

from __future__ import annotations

import collections
import copy as _copy
from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx
import torch

from minicomp.ir import dims, ops, shapes
from minicomp.ir.dtypes import type_str


@dataclass
class Node:
    id: int
    op: str
    args: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: tuple[int, ...] | None = None
    origin: str | None = None

    @property
    def kind(self) -> str:
        return ops.get(self.op).kind

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type(self) -> str:
        return type_str(self.shape, self.dtype)

    def describe(self) -> str:
        """`%7 (add) from model.py:12` — how errors name a node."""
        where = f" from {self.origin}" if self.origin else ""
        return f"%{self.id} ({self.op}){where}"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `shape` (size-1 and size-0 dims get the stride they would have; never 0)."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d if isinstance(d, dims.Expr) else max(int(d), 1)   # a symbol is >= 2
    return tuple(reversed(strides))


def _dim(d: Any) -> "dims.Dim":
    return d if isinstance(d, dims.Expr) else int(d)


def meta_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass
class InferenceMemo:
    """Shape inference's memo of (op, operand types, attributes) -> result or error message,
    bounded (the oldest go first: a long-lived process meets many shapes), and the ops whose
    shape came from meta tensors (no rule in shapes.py answered): tests keep the samples'
    count at zero, since a meta inference imports torch._dynamo (see shapes.py)."""
    size: int = 1 << 16
    entries: dict[tuple, tuple[tuple[int, ...], torch.dtype] | str] = field(default_factory=dict)
    meta_counts: collections.Counter = field(default_factory=collections.Counter)

    def remember(self, key: tuple | None, value: tuple[tuple[int, ...], torch.dtype] | str) -> None:
        if key is None:
            return
        self.entries[key] = value
        while len(self.entries) > self.size:
            try:
                del self.entries[next(iter(self.entries))]
            except (KeyError, StopIteration, RuntimeError):   # another thread evicted it first
                break


INFERENCE_MEMO = InferenceMemo()   # the process's, shared by every graph (verify re-infers after each pass)


def infer(op: str, arg_nodes: list[Node], attrs: dict[str, Any],
          memo: InferenceMemo = INFERENCE_MEMO) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of `op` applied to `arg_nodes`: by rule (shapes.py) for the common cases,
    else by running the op's reference on meta tensors.

    Raises ValueError with PyTorch's message when the operands do not fit (shape mismatch...).
    Results are memoised in `memo` on (op, operand types, attributes): verify() re-infers every
    node after every pass, and meta-tensor dispatch is the slow part of that.
    """
    d = ops.get(op)
    try:
        key = (op, tuple((a.shape, a.dtype) for a in arg_nodes),
               # the value's type is part of the key: pow(x, 2) and pow(x, 2.0) differ for ints
               tuple(sorted((k, type(v).__name__, v) for k, v in attrs.items() if k in d.attrs)))
        hash(key)
    except TypeError:
        key = None
    hit = memo.entries.get(key) if key is not None else None
    if hit is not None:
        if isinstance(hit, str):
            raise ValueError(hit)
        return hit
    result = shapes.rule(op, [(a.shape, a.dtype) for a in arg_nodes], {k: v for k, v in attrs.items() if k in d.attrs})
    if result is not None:
        memo.remember(key, result)
        return result
    memo.meta_counts[op] += 1
    try:
        result = _infer_meta(d, arg_nodes, attrs)
    except ValueError as e:
        memo.remember(key, str(e))
        raise
    memo.remember(key, result)
    return result


def _infer_meta(d: "ops.OpDef", arg_nodes: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], torch.dtype]:
    op = d.name
    if any(dims.any_symbolic(a.shape) for a in arg_nodes):
        # a pointwise op broadcasts its operands (the rule), whatever its dtype rule: the dtype
        # from meta tensors at the hints, the shape by broadcasting; other ops need their rule
        out = shapes.broadcast(*(a.shape for a in arg_nodes)) if d.kind == "pointwise" and arg_nodes else None
        if out is None:
            shown = ", ".join(a.type for a in arg_nodes)
            raise dims.SymbolicDim(f"{op} has no shape rule for symbolic sizes ({shown})")
        hinted = [Node(a.id, a.op, a.args, a.attrs, dims.hints(a.shape), a.dtype) for a in arg_nodes]
        _, dtype = _infer_meta(d, hinted, dims.hinted(attrs))
        return out, dtype
    metas = [meta_tensor(a.shape, a.dtype) for a in arg_nodes]
    kwargs = {k: v for k, v in attrs.items() if k in d.attrs}
    if op in ("full", "arange"):
        kwargs["device"] = "meta"
    try:
        out = d.ref(*metas, **kwargs)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        raise ValueError(str(e).split("\n")[0]) from None
    return tuple(out.shape), out.dtype


class Graph:
    """An operator graph: nodes in a networkx DiGraph plus ordered inputs and outputs."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.nx = nx.DiGraph()
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self._next_id = 0

    # ----------------------------------------------------------------- access
    def node(self, nid: int) -> Node:
        try:
            return self.nx.nodes[nid]["node"]
        except KeyError:
            raise KeyError(f"no node %{nid} in graph {self.name!r}") from None

    def __contains__(self, nid: int) -> bool:
        return nid in self.nx

    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    def nodes(self) -> list[Node]:
        """All nodes in a deterministic topological order (ties broken by id)."""
        return [self.node(i) for i in self.topo_order()]

    def topo_order(self) -> list[int]:
        return list(nx.lexicographical_topological_sort(self.nx))

    def users(self, nid: int) -> list[int]:
        return sorted(self.nx.successors(nid))

    def input_names(self) -> list[str]:
        return [self.node(i).attrs["name"] for i in self.inputs]

    # ----------------------------------------------------------------- building
    def _new_id(self) -> int:
        nid = self._next_id
        self._next_id += 1
        return nid

    def _insert(self, node: Node) -> int:
        self.nx.add_node(node.id, node=node)
        self._connect(node.id, node.args)
        return node.id

    def _connect(self, nid: int, args: Iterable[int]) -> None:
        for pos, a in enumerate(args):
            if a not in self.nx:
                raise KeyError(f"node %{nid} uses %{a}, which is not in the graph")
            if self.nx.has_edge(a, nid):
                self.nx.edges[a, nid]["positions"].append(pos)
            else:
                self.nx.add_edge(a, nid, positions=[pos])

    def add_input(self, name: str, shape: Iterable[int], dtype: torch.dtype, origin: str | None = None) -> int:
        node = Node(self._new_id(), "input", (), {"name": name}, tuple(_dim(d) for d in shape), dtype, None, origin)
        self._insert(node)
        self.inputs.append(node.id)
        return node.id

    def constant(self, value: Any, dtype: torch.dtype | None = None, origin: str | None = None,
                 label: str | None = None) -> int:
        """A constant node: a Python scalar (0-d, default dtype by kind) or a tensor."""
        if isinstance(value, torch.Tensor):
            shape, dt = tuple(value.shape), value.dtype
            value = value.detach()
        else:
            if dtype is None:
                dtype = (torch.bool if isinstance(value, bool) else
                         torch.int64 if isinstance(value, int) else torch.float32)
            shape, dt = (), dtype
            value = bool(value) if dt == torch.bool else (int(value) if not dt.is_floating_point else float(value))
        attrs: dict[str, Any] = {"value": value}
        if label:
            attrs["label"] = label
        return self._insert(Node(self._new_id(), "constant", (), attrs, shape, dt, None, origin))

    def add(self, op: str, *args: int, origin: str | None = None, out_shape: tuple[int, ...] | None = None,
            out_dtype: torch.dtype | None = None, **attrs: Any) -> int:
        """Add `op(args, **attrs)`; shape and dtype are inferred unless given (opaque nodes)."""
        arg_nodes = [self.node(a) for a in args]
        shape, dtype = out_shape, out_dtype
        if shape is None or dtype is None:
            shape, dtype = infer(op, arg_nodes, attrs)
        node = Node(self._new_id(), op, tuple(args), dict(attrs), tuple(shape), dtype, None, origin)
        return self._insert(node)

    def set_outputs(self, outputs: Iterable[int]) -> None:
        self.outputs = list(outputs)

    # ----------------------------------------------------------------- rewriting
    def set_args(self, nid: int, args: Iterable[int]) -> None:
        """Replace the operands of `nid`, keeping edges in step with `args`."""
        node = self.node(nid)
        for a in set(node.args):
            self.nx.remove_edge(a, nid)
        node.args = tuple(args)
        self._connect(nid, node.args)

    def replace_all_uses(self, old: int, new: int) -> None:
        """Point every user of `old` (and the outputs) at `new`."""
        if old == new:
            return
        for user in list(self.nx.successors(old)):
            un = self.node(user)
            self.set_args(user, [new if a == old else a for a in un.args])
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove(self, nid: int) -> None:
        if any(True for _ in self.nx.successors(nid)):
            raise ValueError(f"cannot remove %{nid}: it still has users {self.users(nid)}")
        if nid in self.outputs:
            raise ValueError(f"cannot remove %{nid}: it is a graph output")
        if nid in self.inputs:
            raise ValueError(f"cannot remove %{nid}: it is a graph input")
        self.nx.remove_node(nid)

    def copy(self) -> "Graph":
        """A deep copy of structure and records; tensor constants are shared, not cloned."""
        g = Graph(self.name)
        g._next_id = self._next_id
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        for nid in self.nx.nodes:
            n = self.node(nid)
            attrs = {k: (v if isinstance(v, torch.Tensor) or callable(v) else _copy.deepcopy(v))
                     for k, v in n.attrs.items()}
            g.nx.add_node(nid, node=Node(n.id, n.op, n.args, attrs, n.shape, n.dtype, n.layout, n.origin))
        for a, b, data in self.nx.edges(data=True):
            g.nx.add_edge(a, b, positions=list(data["positions"]))
        return g


    @property
    def symbolic(self) -> bool:
        """True when some node's shape has a symbolic dim. Kept until a node is added or removed
        (codegen asks once per kernel and more; a 12-layer BERT asked 164 times, 0.46 s)."""
        key = (self.nx.number_of_nodes(), self._next_id)
        cached = getattr(self, "_symbolic", None)
        if cached is None or cached[0] != key:
            cached = self._symbolic = (key, any(dims.any_symbolic(self.node(n).shape) for n in self.nx.nodes))
        return cached[1]

    def hinted(self) -> "Graph":
        """A copy with every symbolic dim (in shapes, strides and attributes) at its hint: what
        the planner decides on, as a static compile at those sizes would."""
        return self.map_dims(dims.hint)

    def map_dims(self, fn) -> "Graph":
        """A copy with every symbolic dim `e` (in shapes, strides and attributes) as `fn(e)`."""
        g = self.copy()
        g._symbolic = None                # shapes change in place below
        for nid in g.nx.nodes:
            n = g.node(nid)
            n.shape = dims.map_exprs(n.shape, fn)
            n.layout = dims.map_exprs(n.layout, fn)
            n.attrs = {k: (v if isinstance(v, torch.Tensor) or callable(v) else dims.map_exprs(v, fn))
                       for k, v in n.attrs.items()}
        return g
    def renumbered(self) -> "Graph":
        """A copy whose ids are 0..n-1 in topological order (stable dumps for tests)."""
        mapping = {old: new for new, old in enumerate(self.topo_order())}
        g = Graph(self.name)
        for old in self.topo_order():
            n = self.node(old)
            g._insert(Node(mapping[old], n.op, tuple(mapping[a] for a in n.args), dict(n.attrs),
                           n.shape, n.dtype, n.layout, n.origin))
        g._next_id = len(mapping)
        g.inputs = [mapping[i] for i in self.inputs]
        g.outputs = [mapping[o] for o in self.outputs]
        return g

    def dump(self) -> str:
        from minicomp.ir.printer import dump
        return dump(self)

    def __str__(self) -> str:
        return self.dump()


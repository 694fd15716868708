"""Which outputs eager returns as an input itself, a view of one, or another output.

`return x` gives back `x` itself; `return x.t()` a view sharing `x`'s memory; `return y, y`
one object twice. A compiled call must do the same, and must never do it where eager does
not: `return x.clone()` is a new tensor even when the passes reduce it to `x`, and
`(x * 2, x * 2)` are two tensors even after CSE merges them.

Capture records, for each flat output, an `OutputAlias` read off the aten graph (views are
still views there: functionalisation removes mutations, not views), or None for a fresh
tensor. The runtime (`runtime/boundary.py`) replays each alias at every call on the
tensors of that call, with the same aten view ops, so strides, offsets and autograd are
eager's own. Fresh outputs that the generated module happens to return aliased are copied
there.

`AtenCall` (an aten op with its non-tensor arguments captured) is shared with the opaque
nodes of fx.py.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from minicomp.errors import MinicompError


@dataclass
class _Slot:
    """Where the i-th tensor operand goes in an opaque call's captured arguments."""
    index: int


@dataclass
class AtenCall:
    """The callable of an opaque node: an aten op with its captured non-tensor arguments."""
    target: Any
    args: tuple
    kwargs: dict
    output: int | None = None            # pick one output of a multi-output op
    __name__: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.__name__ = str(self.target) + ("" if self.output is None else f"[{self.output}]")

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        fill = lambda a: tensors[a.index] if isinstance(a, _Slot) else a  # noqa: E731
        out = self.target(*fx.node.map_aggregate(self.args, fill), **fx.node.map_aggregate(self.kwargs, fill))
        return out if self.output is None else out[self.output]


@dataclass(frozen=True)
class OutputAlias:
    """Eager's output is `steps` applied in order to graph input `input` or to output `output`
    (exactly one is set); no steps: that very object."""
    input: int | None
    output: int | None
    steps: tuple[AtenCall, ...] = ()


def is_view(node: Any) -> bool:
    """An aten call whose result shares its first operand's memory (and writes nothing)."""
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.is_mutable)


def _only_base(node: fx.Node) -> bool:
    """The view's first operand is its only tensor operand (so the view replays from it)."""
    others: list = []
    fx.node.map_arg((tuple(node.args[1:]), dict(node.kwargs)), others.append)
    return isinstance(node.args[0], fx.Node) and not others


def _view_step(node: fx.Node) -> tuple[AtenCall, fx.Node] | None:
    """(the view op replayed on a base, that base), if `node` is a view of one node."""
    if node.op != "call_function" or not node.args:
        return None
    if node.target is operator.getitem:          # one part of split / unbind / chunk
        parent, index = node.args
        if isinstance(parent, fx.Node) and is_view(parent) and _only_base(parent):
            return AtenCall(parent.target, (_Slot(0),) + tuple(parent.args[1:]), dict(parent.kwargs), index), \
                parent.args[0]
        return None
    if is_view(node) and _only_base(node):
        return AtenCall(node.target, (_Slot(0),) + tuple(node.args[1:]), dict(node.kwargs)), node.args[0]
    return None


def output_aliases(outputs: list[Any], input_position: dict[fx.Node, int]) -> list[OutputAlias | None]:
    """For each flat output node, how eager's result aliases an input or another output."""
    first: dict[Any, int] = {}
    for i, n in enumerate(outputs):
        first.setdefault(n, i)
    found: list[OutputAlias | None] = []
    for i, n in enumerate(outputs):
        if first[n] != i:
            found.append(OutputAlias(None, first[n]))
            continue
        steps: list[AtenCall] = []
        cur, alias = n, None
        while isinstance(cur, fx.Node):
            if cur in input_position:
                alias = OutputAlias(input_position[cur], None, tuple(reversed(steps)))
                break
            if cur is not n and cur in first:
                alias = OutputAlias(None, first[cur], tuple(reversed(steps)))
                break
            step = _view_step(cur)
            if step is None:
                break
            steps.append(step[0])
            cur = step[1]
        found.append(alias)
    return found


def functional_variant(target: Any) -> Any | None:
    """aten.add_.Scalar -> aten.add.Scalar, for in-place ops; None for pure ops."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return None
    name = target.overloadpacket.__name__
    if not name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def check_mutation(node: fx.Node, origin: str | None) -> None:
    """Refuse a mutation whose effect a pure graph could not keep (an input, or a view's base)."""
    mutated = node.args[0]
    where = origin or node.name
    if not isinstance(mutated, fx.Node):
        return
    if mutated.op in ("placeholder", "get_attr"):
        raise MinicompError(f"{where}: {node.target} mutates an input or weight in place; "
                            "minicomp graphs are pure: return the new value instead")
    if is_view(mutated) or any(is_view(u) for u in mutated.users if u is not node):
        raise MinicompError(f"{where}: {node.target} mutates a tensor that shares memory with a view; "
                            "write it without in-place ops")

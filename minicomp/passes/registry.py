"""The pass table: every graph pass minicomp knows, by name.

A pass is a function from a Graph to a Graph. It must not mutate the graph it is given
(copy first: `g = graph.copy()`); the manager also hands passes only graphs it owns, so a
caller's graph is safe either way. A pass may say what it did by returning
`(graph, changes)`, where `changes` counts its rewrites (`{"folded": 3}`); a pass that
returns only a Graph gets its changes counted by the manager (nodes added, removed,
modified).

Adding a pass is one decorator and one import:

    # minicomp/passes/my_pass.py
    from minicomp.passes.registry import register_pass

    @register_pass("my_pass", doc="what it does, one line")
    def my_pass(graph: Graph) -> Graph: ...

and the module's name in `PASS_MODULES` in `manager.py`,
which imports them so that the table is complete whenever the manager is imported.
`fixed_point=True` marks a pass that the manager may repeat together with its fixed-point
neighbours in a pipeline until none of them changes anything (the cleanup passes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from minicomp.ir.graph import Graph

Changes = dict[str, int]
PassFn = Callable[[Graph], Union[Graph, tuple[Graph, Changes]]]


@dataclass(frozen=True)
class Pass:
    name: str
    fn: PassFn
    fixed_point: bool = False   # repeat with neighbouring fixed-point passes until nothing changes
    doc: str = ""

    def run(self, graph: Graph) -> tuple[Graph, Changes | None]:
        """Apply the pass; returns the new graph and its changes (None if the pass reports none)."""
        result = self.fn(graph)
        if isinstance(result, tuple):
            new, changes = result
            changes = {k: int(v) for k, v in changes.items() if v}
        else:
            new, changes = result, None
        if not isinstance(new, Graph):
            raise TypeError(f"pass {self.name!r} returned {type(new).__name__}, not a Graph")
        return new, changes

    def __call__(self, graph: Graph) -> Graph:
        """`PASSES["dce"](g)`: the pass as a plain Graph -> Graph function."""
        return self.run(graph)[0]


PASSES: dict[str, Pass] = {}


def register_pass(name: str, *, fixed_point: bool = False, doc: str | None = None) -> Callable[[PassFn], PassFn]:
    """Decorator: put `fn` in `PASSES` under `name` (doc defaults to the docstring's first line)."""
    def decorate(fn: PassFn) -> PassFn:
        old = PASSES.get(name)
        # re-registering the same function (a module reload) is fine; two passes with one name are not
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"pass {name!r} is already registered by {old.fn.__module__}.{old.fn.__qualname__}")
        text = doc if doc is not None else (fn.__doc__ or "").strip().split("\n")[0]
        PASSES[name] = Pass(name, fn, fixed_point, text)
        return fn
    return decorate

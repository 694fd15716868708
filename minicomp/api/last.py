"""What a compiled callable shows of its last compiled signature: `plan`, `source`, `graph`
and `explain()`. `minicomp.compile`'s functions and `compile_dsl`'s share it, so the two
entry points show the same things the same way (the fallback list included)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minicomp.errors import MinicompError

if TYPE_CHECKING:
    from minicomp.api import Compiled
    from minicomp.ir.graph import Graph


class LastCompiled:
    """Mixed into a compiled callable that keeps its last `Compiled` in `self._last`."""

    _last: "Compiled | None"

    def _label(self) -> str:
        """The callable's name in messages."""
        return "function"

    def _need(self) -> "Compiled":
        if self._last is None:
            raise MinicompError(f"{self._label()} has not been called yet: plan, source and explain() exist "
                                "after the first call")
        return self._last

    @property
    def plan(self):
        return self._need().plan

    @property
    def source(self) -> str:
        return self._need().generated.source

    @property
    def graph(self) -> "Graph":
        return self._need().graph

    def explain(self) -> str:
        c = self._need()
        head = ""
        if c.graph.symbolic:             # one module for every size in these ranges (codegen/sizes.py)
            from minicomp.ir.dims import symbols
            syms = symbols(*(d for i in c.graph.inputs for d in c.graph.node(i).shape))
            head = ("compiled over symbolic sizes " + ", ".join(f"{s.name} in [{s.lo}, {s.hi}]" for s in syms)
                    + f"; planned at {', '.join(f'{s.name}={s.hint}' for s in syms)}\n\n")
        refused = getattr(getattr(self, "dynamic", None), "refused", {})
        if refused:
            head += "".join(f"compiled for concrete sizes: {why}\n" for why in dict.fromkeys(refused.values())) + "\n"
        return f"{head}{c.graph.dump()}\n\n{c.plan.table(fallbacks=c.generated.fallbacks, library=c.generated.library)}"

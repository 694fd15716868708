"""`minicomp.compile_dsl`: DSL programs (text or `.mc` files) compiled into callables.

    f = minicomp.compile_dsl("samples/rmsnorm.mc")
    h, y = f(x, residual, weight)       # compiled on this first call, for these shapes
    f.plan, f.source, f.explain()

Part of the api package (`minicomp.api`, whose `Options`, `compile_graph` and `run_compiled`
it uses), so the layering contract (.importlinter) places it with `minicomp.compile`: the DSL
frontend's graph goes through the same pipeline as a captured Python function's. `minicomp`
exports both.

Invariants:
- a syntax error, an entry the user must name, an unknown option or a file that cannot be
  a program is raised by `compile_dsl` itself, never at the first call;
- one specialisation per input `Signature` (shapes, dtypes, strides, device), compiled
  under the function's lock; inputs with the neg or conj bit are resolved first.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from minicomp.api import Compiled, Options, compile_graph, run_compiled
from minicomp.api.last import LastCompiled
from minicomp.errors import GuardError, MinicompError
from minicomp.ir.graph import Graph


class DslFunction(LastCompiled):
    """A DSL function compiled for each new input signature: what `compile_dsl` returns.

    The program is parsed and its entry chosen when this is made, so a syntax error or an
    entry the user must name is raised by `compile_dsl` itself. A call with a new signature
    (shapes, dtypes, strides, device) binds the entry function's symbols from the inputs'
    shapes and `dims`, lowers it to a graph (the input types are checked against the
    declared ones there) and compiles it; later calls with that signature reuse the
    result. Compiling holds a lock, so threads may share one.
    """

    def __init__(self, text: str, filename: str, entry: str | None, dims: dict[str, int] | None,
                 options: Options):
        from minicomp.frontend.dsl_entry import pick_entry
        from minicomp.frontend.dsl_parse import parse_module
        module = parse_module(text, filename)   # SourceError here, not at the first call
        self.functions = list(module.funcs)
        if not self.functions:
            raise MinicompError(f"{filename}: defines no function (expected 'func name(x: f32[N]) {{ ... }}')")
        self.text, self.filename = text, filename
        self.entry = pick_entry(module, filename, entry)   # the frontend's rule; UsageError when the user must choose
        self.dims = dict(dims or {})
        self.options = options
        self.__name__ = self.entry
        self._cache: dict[Any, Compiled] = {}
        self._last: Compiled | None = None
        self._lock = threading.Lock()
        self._graphs: dict[Any, Any] = {}      # mode="reduce-overhead": signature -> its GraphedCall
        self._last_graphed: Any = None         # the last call's

    def compile_for(self, *args: Any) -> Compiled:
        """The compiled specialisation for these inputs (compiling it if new), without running it."""
        return self._compiled(list(args))[1]

    def _compiled(self, args: list) -> tuple[Any, Compiled, list[torch.Tensor]]:
        """(signature, its compiled specialisation, the inputs to run it on)."""
        from minicomp.runtime.boundary import resolved
        from minicomp.runtime.guards import signature_of
        bad = sorted({type(a).__name__ for a in args if not isinstance(a, torch.Tensor)})
        if bad:
            raise GuardError(f"{self.__name__} takes tensors only; got {', '.join(bad)}")
        tensors = [resolved(t) for t in args]   # neg and conj bits applied: kernels read raw memory
        key = signature_of(tensors)
        with self._lock:
            if self.options.dynamic and key not in self._cache:
                over = self._over_symbols(tensors)
                if over is not None:
                    self._last = over
                    return key, over, tensors
            if key not in self._cache:
                from minicomp.frontend.dsl import load_dsl
                graph = load_dsl(self.text, self.filename, entry=self.entry, dims=self.dims, example_inputs=tensors)
                self.__name__ = graph.name
                self._cache[key] = compile_graph(graph, tensors, self.options)
            self._last = self._cache[key]
            return key, self._last, tensors

    def _over_symbols(self, tensors: list[torch.Tensor]) -> Compiled | None:
        """`compile_dsl(..., dynamic=True)`: one compile with the symbols `dims` leaves unbound
        symbolic, for every call of these ranks, dtypes and device it accepts (api/dynamic.py);
        None when it does not accept these tensors (the call compiles for its sizes, which
        also gives the declared types' errors)."""
        from minicomp.api.dynamic import accepts
        from minicomp.frontend.dsl import load_dsl
        where = ("symbolic", tuple((t.dim(), t.dtype, t.device.type) for t in tensors))
        if where not in self._cache:
            graph = load_dsl(self.text, self.filename, entry=self.entry, dims=self.dims, symbolic=True)
            if [graph.node(i).dtype for i in graph.inputs] != [t.dtype for t in tensors] or not tensors:
                return None
            self._cache[where] = compile_graph(graph, [None] * len(tensors), self.options, device=tensors[0].device)
        c = self._cache[where]
        return c if accepts([c.graph.node(i).shape for i in c.graph.inputs], tensors) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise GuardError(f"{self.__name__} was called with keyword argument(s) {', '.join(sorted(kwargs))}; "
                             "compiled functions take their tensors positionally")
        key, compiled, tensors = self._compiled(list(args))
        graphed = self._graphs.get(key)
        if graphed is not None:
            outs = graphed(*tensors)
        else:
            ran, outs = run_compiled(compiled, tensors)
            if ran is not compiled:  # Triton rejected a kernel, which now runs through PyTorch: keep what ran
                with self._lock:
                    self._cache[key] = self._last = ran
            if self.options.graphs:  # replayed as a CUDA graph from the next call (runtime/cuda_graphs.py)
                from minicomp.runtime.cuda_graphs import GraphedCall, hazards
                graphed = GraphedCall(ran.call, len(tensors), (), found=hazards(ran), name=self.__name__)
                graphed.warmed(tensors)
                self._graphs[key] = graphed
        self._last_graphed = graphed
        return outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def cuda_graphs(self):
        """mode="reduce-overhead": the `GraphStatus` of the last call's signature (else None)."""
        graphed = self._last_graphed
        return graphed.status if graphed is not None else None

    def explain(self) -> str:
        text = super().explain()
        status = self.cuda_graphs
        return f"mode='reduce-overhead': {status.describe()}\n\n{text}" if status is not None else text

    def _label(self) -> str:
        return self.__name__

    def __repr__(self) -> str:
        return f"<minicomp DSL function {self.__name__} from {self.filename}>"


def compile_dsl(text_or_path: Any, entry: str | None = None, dims: dict[str, int] | None = None,
                **options: Any) -> DslFunction:
    """Compile a DSL program, given as text or as a path to a `.mc` file, into a callable.

        f = minicomp.compile_dsl("samples/rmsnorm.mc")
        h, y = f(x, residual, weight)       # compiled on this first call, for these shapes
        f.plan, f.source, f.explain()

    A `pathlib.Path`, or a one-line string that ends in `.mc` or names an existing file, is
    read as a file (`read_program`: UTF-8, at most 16 MiB); any other string is program
    text, reported as `<string>` in errors. `entry` names the function to compile (left
    out, the frontend's own default); `dims` binds symbols (`{"N": 64}`) that the inputs'
    shapes do not; `options` are `minicomp.compile`'s (passes, machine, ...).
    """
    import os

    from minicomp.frontend.dsl_limits import is_program_path, read_program
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise MinicompError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if not isinstance(text_or_path, (str, os.PathLike)):
        raise MinicompError(f"compile_dsl takes DSL text or the path of a .mc file, not {type(text_or_path).__name__}")
    if dims is not None and not isinstance(dims, dict):
        raise MinicompError(f"dims must be a dict of symbol name to int, like {{'N': 64}}, not {type(dims).__name__}")
    if is_program_path(text_or_path):
        filename = os.fspath(text_or_path)
        text = read_program(filename)
    else:
        filename, text = "<string>", text_or_path
    return DslFunction(text, filename, entry, dims, Options(**options))

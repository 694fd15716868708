"""`minicomp.compile`: minicomp's own capture first, Dynamo where it cannot take the function whole.

    f = minicomp.compile(fn)
    f(x)             # own capture; or, if it refuses fn, torch.compile(fn, backend=minicomp's)
    print(f.explain())

Invariants:
- Every function is first compiled by minicomp's own capture (`api.CompiledFunction`): one
  static graph, the fast path. Only `CaptureRefused` sends it to Dynamo: valid PyTorch that one
  static graph cannot hold (a value read such as `.item()`, `if x.sum() > 0`, an output shape
  decided by values, a construct make_fx cannot trace). Every other MinicompError (bad input,
  the user's own error such as a shape mismatch) is raised as before: no silent fallback.
- The switch happens once per compiled function, with one warning that says why; afterwards
  every call goes through `torch.compile(fn, backend=minicomp.dynamo.Backend(**options))`, so
  the guards, recompiles and graph breaks are Dynamo's and each graph's kernels are minicomp's.
  (Capture runs the function once before refusing it, without writing anything of the
  caller's; a `print` in it shows once more at that first call.)
- Calls take tensors and None, positionally or by keyword, nested in lists, tuples and dicts
  (api/arguments.py). Any other argument (a Python number, a string, an object such as
  transformers' `Cache`, which `generate` hands to `forward` and whose tensors forward writes in
  place) or a result that is not a tensor (a model returning its `DynamicCache`) is Python
  state one static graph cannot hold: the own capture refuses it (`CaptureRefused`) and the
  function goes through Dynamo, which guards such values and functionalises in-place writes.
  An error the user's code raises under Dynamo is a MinicompError at the user's line, as
  under capture.
- `explain()` then lists the graphs Dynamo handed over (the backend's report) and each graph
  break with the user's file:line and Dynamo's reason; `plan`, `source` and `graph` belong to
  one graph and say so.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from minicomp import api
from minicomp.errors import CaptureRefused, MinicompError


@dataclass(frozen=True)
class GraphBreak:
    """Where Dynamo ended a graph before the function's end, and why (its reason's first line)."""
    where: str          # "file.py:12", or "?" where Dynamo gave no user frame
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def _graph_break(gm: Any) -> GraphBreak | None:
    """The break that ended the graph `gm` Dynamo hands a backend (`compile_subgraph_reason`,
    which torch._dynamo.output_graph sets), or None where the graph ran to a return."""
    from minicomp.frontend.fx_trace import short_path
    why = getattr(gm, "compile_subgraph_reason", None)
    if why is None or not why.graph_break:
        return None
    stack = list(why.user_stack or ())
    where = f"{short_path(stack[-1].filename)}:{stack[-1].lineno}" if stack else "?"
    text = why.reason.strip().splitlines()[0] if why.reason.strip() else "(no reason given)"
    return GraphBreak(where, text)


def _dynamo_error(exc: BaseException, name: str) -> MinicompError:
    """What the user's code raised under Dynamo, at the user's line: Dynamo wraps the error (its
    `__cause__` is the user's) and keeps the user's frames as `real_stack`."""
    from minicomp.frontend.fx_trace import is_user_file, short_path, user_error
    from minicomp.frontend.pyframes import frame_error
    cause = exc.__cause__ or exc
    frames = [f for f in (getattr(exc, "real_stack", None) or ()) if is_user_file(f.filename)]
    if not frames:
        return user_error(cause, f"running {name} through Dynamo failed")
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    message = f"running {name} through Dynamo failed: {type(cause).__name__}" + (f": {text}" if text else "")
    return frame_error(message, frames[-1], short_path(frames[-1].filename))


class _Recording:
    """A Dynamo backend that notes each graph's break, then hands the graph to minicomp's."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.breaks: list[GraphBreak] = []
        self._lock = threading.Lock()

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Callable:
        found = _graph_break(gm)
        if found is not None:
            with self._lock:
                self.breaks.append(found)
        return self.backend(gm, example_inputs, **kwargs)


class CompiledFunction(api.CompiledFunction):
    """`api.CompiledFunction`, going through Dynamo once its own capture refused the function.

    `refused` is that refusal (None while the own capture serves every call)."""

    def __init__(self, fn: Callable, options: api.Options):
        super().__init__(fn, options)
        self.refused: CaptureRefused | None = None
        self._dynamo: Callable | None = None
        self._recording: _Recording | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._dynamo is None:
            try:
                return super().__call__(*args, **kwargs)
            except CaptureRefused as exc:
                self._fall_back(exc)
        return self._via_dynamo(args, kwargs)

    def _fall_back(self, exc: CaptureRefused) -> None:
        import torch

        from minicomp.dynamo import Backend
        with self._lock:
            if self._dynamo is not None:           # another thread switched first
                return
            self._recording = _Recording(Backend(**self.options.__dict__))
            # `dynamic` means what it means to torch.compile: None symbolic after a size changes
            self._dynamo = torch.compile(self.fn, backend=self._recording, dynamic=self.options.dynamic)
            self.refused = exc
        first = str(exc).strip().splitlines()[0]
        warnings.warn(f"minicomp: {self._name}: its own capture cannot take it whole ({first}); compiling it "
                      "through Dynamo with the minicomp backend instead (explain() lists the graphs and breaks)",
                      stacklevel=3)

    def _via_dynamo(self, args: tuple, kwargs: dict) -> Any:
        # any arguments: Dynamo guards Python values and objects (a Cache) and traces into them
        try:
            return self._dynamo(*args, **kwargs)
        except MinicompError:
            raise
        except Exception as e:  # the user's code failed under Dynamo: at the user's line, as under capture
            raise _dynamo_error(e, self._name) from e

    @property
    def graph_breaks(self) -> list[GraphBreak]:
        """Dynamo's graph breaks so far, in the order it met them (empty on the own capture)."""
        return list(self._recording.breaks) if self._recording else []

    def backend_report(self):
        """The Dynamo backend's report (graphs, kernels, ops through PyTorch): after a fallback only."""
        if self._recording is None:
            raise MinicompError(f"{self._name} is compiled by minicomp's own capture, not through Dynamo: "
                                "plan, source and explain() describe it")
        return self._recording.backend.report()

    def _need(self) -> api.Compiled:
        if self._recording is not None:
            raise MinicompError(f"{self._name} was compiled through Dynamo ({len(self.backend_report().graphs)} "
                                "graph(s)), not as one graph: explain() lists its graphs and graph breaks")
        return super()._need()

    def explain(self) -> str:
        if self._recording is None:
            return super().explain()
        breaks = self.graph_breaks
        lines = [f"{self._name} went through Dynamo: minicomp's own capture refused it:",
                 f"    {str(self.refused).strip().splitlines()[0]}", "",
                 self.backend_report().table(), "",
                 f"{len(breaks)} graph break(s):"]
        lines += [f"    {b}" for b in breaks]
        return "\n".join(lines)


def compile(fn: Callable | None = None, **options: Any):
    """Compile a function or nn.Module: `@minicomp.compile` or `minicomp.compile(fn, passes=[...])`
    (own capture first, Dynamo when it refuses; see the module docstring)."""
    known = set(api.Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise MinicompError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    opts = api.Options(**options)
    if fn is None:
        return lambda f: CompiledFunction(f, opts)
    return CompiledFunction(fn, opts)

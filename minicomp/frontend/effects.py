"""Python side effects of a capture: found, undone, and refused.

Capture runs the user's function once (the eager tracer on real tensors, make_fx on fake
ones). A compiled call never runs the Python again, so an attribute write in `forward`
(`self.last = x.sum()`, `self.steps += 1` on an int, registering a buffer, appending to a
list attribute, rebinding a global) would happen once at capture and never on a call: a
silent difference from eager. So capture snapshots what `params.walk` found (every
module's `__dict__`, `_parameters`, `_buffers`, `_modules`; the globals the code names;
the lists, dicts and sets held there) and, after tracing, puts back whatever changed and
refuses the function, naming each change. Nothing a refused (or accepted) capture wrote
stays behind, and no FunctionalTensor or fake tensor is left on a module.

In-place writes to tensors are refused by the tracers before they happen
(fx_eager's `_Recorder`, fx_trace's `_NoOutsideWrites`); this module is about Python state.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from minicomp.errors import MinicompError
from minicomp.frontend.params import MISSING, Walk


@dataclass
class _Saved:
    label: str
    where: Any        # the live dict, list or set
    copy: Any         # its contents at snapshot time
    names: Any = None  # for a globals dict: only these keys are compared


def _differs(saved: _Saved) -> list[str]:
    """The keys (or `[...]`) of `saved.where` that changed since the snapshot."""
    now, then = saved.where, saved.copy
    if isinstance(now, dict):
        keys = saved.names if saved.names is not None else set(now) | set(then)
        # dict.get, not the object's own: dict subclasses may redefine get (transformers' registries do)
        return sorted(str(k) for k in keys if dict.get(now, k, MISSING) is not dict.get(then, k, MISSING))
    if isinstance(now, list):
        same = len(now) == len(then) and all(map(operator.is_, now, then))
        return [] if same else ["[...]"]
    return [] if now == then else ["{...}"]        # a set of hashable Python values


def _put_back(saved: _Saved) -> None:
    now, then = saved.where, saved.copy
    if isinstance(now, dict):
        for k in (saved.names if saved.names is not None else set(now) | set(then)):
            if dict.get(then, k, MISSING) is MISSING:
                now.pop(k, None)
            else:
                now[k] = dict.__getitem__(then, k)
    elif isinstance(now, list):
        now[:] = then
    else:
        now.clear()
        now.update(then)


class Snapshot:
    """The Python state `params.walk` found, taken before capture runs the function."""

    def __init__(self, w: Walk):
        self.saved: list[_Saved] = []
        for name, m in w.modules:
            label = name or type(m).__name__
            for attr in ("__dict__", "_parameters", "_buffers", "_modules"):
                d = m.__dict__ if attr == "__dict__" else m.__dict__.get(attr)
                if isinstance(d, dict):
                    self.saved.append(_Saved(label, d, dict(d)))
        for label, g, names in w.namespaces:
            self.saved.append(_Saved(label, g, {n: g.get(n, MISSING) for n in names}, set(names)))
        for label, c in w.containers:
            if isinstance(c, (list, dict, set)):
                self.saved.append(_Saved(label, c, c.copy()))

    def undo(self) -> list[str]:
        """Put everything back as it was; one `where: key` line per change found."""
        changes = []
        for saved in self.saved:
            keys = _differs(saved)
            if keys:
                changes += [f"{saved.label}: {k}" for k in keys]
                _put_back(saved)
        return changes


def refusal(what: str, changes: list[str]) -> MinicompError:
    shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
    return MinicompError(f"capturing {what} changed Python state ({shown}): an attribute or global written in "
                         "forward would happen once at capture and never on a compiled call, so minicomp refuses "
                         "it and has put everything back. Return the value instead; a cache that forward fills on "
                         "its first call can be filled by calling the model once before compiling")

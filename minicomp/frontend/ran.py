"""Which of the user's functions ran while capture ran the compiled one.

The walk (params.py) reaches every function a model can name: every method of every module's
class, and every global and closure cell those name. transformers' `LlamaForCausalLM` reaches
`from_pretrained`, `save_pretrained` and their helpers, so a 4-layer Llama had 755 equality and
937 identity guards, read again at every call (54 us of the call's host time on a 2-core CPU).
The graph depends only on what ran during capture. A function that did not run could start
running only if a value that decided to skip it changed, and that value was read by code that did
run, so it is guarded. The binding therefore guards the Python state of the functions that ran
(`params.walk(fn, ran=codes)`): 476 and 161 guards for that Llama, 23 us.

`recorded()` yields the set of code objects of user files (`fx_trace.is_user_file`) started
inside it:

- Python 3.12 and later: `sys.monitoring`'s PY_START event under a tool id of minicomp's own,
  for all threads. Code of other files (torch's, the standard library's) is disabled at its first
  start, so each costs one event per process.
- Earlier: `sys.settrace`'s global function for the calling thread (capture runs the function
  in it). The function returns None, so no line events follow.

It yields None where it cannot record: every monitoring tool id is taken, or on Python 3.11 a
debugger or coverage tool holds the trace function. The walk then guards every function it
reaches, as it did before.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

from minicomp.frontend.fx_trace import is_user_file

_lock = threading.Lock()
_active: tuple[set, ...] = ()       # the sets being filled now (captures in several threads)
_tool: list[int] = []              # the sys.monitoring tool id, once taken
_user: dict[str, bool] = {}        # is_user_file by file name (it normalises the path)
_local = threading.local()         # Python 3.11: this thread's sets being filled (`sets`)


def _is_user(filename: str) -> bool:
    known = _user.get(filename)
    if known is None:
        known = _user[filename] = is_user_file(filename)
    return known


def _started(code, offset):
    """sys.monitoring's PY_START callback."""
    if not _is_user(code.co_filename):
        return sys.monitoring.DISABLE
    for codes in _active:
        codes.add(code)
    return None


def _tool_id() -> int | None:
    """minicomp's monitoring tool id (taken once per process), or None when all six are in use."""
    if not _tool:
        m = sys.monitoring
        free = [i for i in (3, 4, 1, 0, 2, 5) if m.get_tool(i) is None]
        if not free:
            return None
        m.use_tool_id(free[0], "minicomp")
        m.register_callback(free[0], m.events.PY_START, _started)
        _tool.append(free[0])
    return _tool[0]


@contextlib.contextmanager
def _monitored() -> Iterator[set | None]:
    global _active
    codes: set = set()
    with _lock:
        tool = _tool_id()
        if tool is not None:
            _active = _active + (codes,)
            sys.monitoring.set_events(tool, sys.monitoring.events.PY_START)
    if tool is None:
        yield None
        return
    try:
        yield codes
    finally:
        with _lock:
            _active = tuple(c for c in _active if c is not codes)
            if not _active:
                sys.monitoring.set_events(tool, 0)


def _trace_started(frame, event, arg):
    """sys.settrace's global function: called at each new frame of the thread."""
    if _is_user(frame.f_code.co_filename):
        for codes in _local.sets:
            codes.add(frame.f_code)


@contextlib.contextmanager
def _traced() -> Iterator[set | None]:
    current = sys.gettrace()
    if current is not None and current is not _trace_started:   # a debugger or coverage: leave it be
        yield None
        return
    codes: set = set()
    _local.sets = (*getattr(_local, "sets", ()), codes)
    if current is None:
        sys.settrace(_trace_started)
    try:
        yield codes
    finally:
        _local.sets = tuple(c for c in _local.sets if c is not codes)
        if not _local.sets:
            sys.settrace(None)


def recorded() -> contextlib.AbstractContextManager[set | None]:
    """A context whose value fills with the code objects of user functions started inside it
    (None where they cannot be recorded; see the module docstring)."""
    return _monitored() if hasattr(sys, "monitoring") else _traced()

"""Running a generated module from the text minicomp verified, never from a file.

Every module, cached or not, is `compile()`d from a string in hand and `exec`ed into a
fresh module object: for a cache entry that string is the text `ModuleCache.fetch` read
and checked, so nothing on disk (a `__pycache__`, an entry swapped after its check) is
ever imported. Triton's `@triton.jit` reads a kernel's source with `inspect`, and its
CPU interpreter reads it again at the first launch; both go through `linecache`, where
the text is registered under a made-up file name that no file on disk can shadow (mtime
None: `linecache.checkcache` keeps such entries). The name is fixed by the text, so
loading one source many times keeps one linecache entry.

For CPU tensors the kernels run under Triton's interpreter: `TRITON_INTERPRET=1` is set
while the module body runs (that is when `@triton.jit` decides) and restored after.
Every load makes a fresh module object: two compiled graphs with the same source but
different constants never share `CONSTANTS`.
"""

from __future__ import annotations

import hashlib
import itertools
import linecache
import os
import types
from contextlib import contextmanager
from typing import Iterator

from minicomp.errors import CompileError
from minicomp.runtime.cache import Entry

_counter = itertools.count()


def check_interpreter() -> None:
    """Raise CompileError when triton was imported without its interpreter (CPU kernels cannot run)."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    if isinstance(tl.sum, JITFunction):
        raise CompileError("running minicomp kernels on CPU tensors needs Triton's interpreter, which must be "
                           "on before triton is first imported: set TRITON_INTERPRET=1 in the environment "
                           "(or import minicomp before triton)")


@contextmanager
def interpreter(enabled: bool) -> Iterator[None]:
    """Set TRITON_INTERPRET=1 for the duration when `enabled`; leave the environment alone otherwise."""
    if not enabled:
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def _exec(source: str, filename: str, key: str, interpret: bool) -> types.ModuleType:
    """A fresh module running `source`, its lines registered with linecache under `filename`."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"minicomp_generated_{key[:16]}_{next(_counter)}")
    module.__file__ = filename
    code = compile(source, filename, "exec", dont_inherit=True)
    with interpreter(interpret):
        exec(code, module.__dict__)
    return module


def import_entry(entry: Entry, key: str, interpret: bool) -> types.ModuleType:
    """Run the verified text of a cache entry (its path only names it in tracebacks)."""
    return _exec(entry.text, f"<minicomp-cache {entry.path}>", key, interpret)


def import_source(source: str, key: str, interpret: bool) -> types.ModuleType:
    """Run `source`, which has no cache entry (the cache could not be used)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return _exec(source, f"<minicomp-generated-{key[:16]}-{digest}>", key, interpret)

"""Importing a generated module, from its cache file or from memory.

Triton's `@triton.jit` reads a kernel's source with `inspect`, so the module must come
from a file Python can find again: the cache entry, or (when the cache cannot be
written) a `linecache` entry under a made-up file name, which `inspect` also reads.

For CPU tensors the kernels run under Triton's interpreter: `TRITON_INTERPRET=1` is set
while the module body runs (that is when `@triton.jit` decides) and restored after.
Every load makes a fresh module object: two compiled graphs with the same source but
different constants never share `CONSTANTS`.
"""

from __future__ import annotations

import importlib.util
import itertools
import linecache
import os
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from minicomp.errors import CompileError

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


def import_file(path: Path, key: str, interpret: bool) -> types.ModuleType:
    name = f"minicomp_generated_{key[:16]}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with interpreter(interpret):
        spec.loader.exec_module(module)
    return module


def import_source(source: str, key: str, interpret: bool) -> types.ModuleType:
    """Import `source` without a file: its lines are registered with linecache for inspect."""
    n = next(_counter)
    filename = f"<minicomp-generated-{key[:16]}-{n}>"
    # mtime None marks the entry as not backed by a file, so linecache.checkcache keeps it
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"minicomp_generated_{key[:16]}_{n}")
    module.__file__ = filename
    code = compile(source, filename, "exec")
    with interpreter(interpret):
        exec(code, module.__dict__)
    return module

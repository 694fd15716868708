"""Which function of a `.mc` file is compiled: the entry rule.

    pick_entry(module, filename, entry=None) -> str

In order:
1. `entry` when given (`--entry NAME`, `load_dsl(..., entry=NAME)`);
2. the function named `main`;
3. the only *exported* function. A function is exported when no other function of the
   file calls it and its name does not start with `_`: helpers are called by the entry
   (or are marked private), so a file with one top-level function needs no flag.

Anything else is a `UsageError` (the CLI exits 2) that lists the candidates: the user must
choose, since compiling one of several silently would compile the wrong program.
"""

from __future__ import annotations

import dataclasses

from minicomp.errors import UsageError
from minicomp.frontend.dsl_ast import Call, FuncDef, Module


def called_functions(f: FuncDef, names: set[str]) -> set[str]:
    """The functions among `names` that `f`'s body calls (not counting `f` itself)."""
    found: set[str] = set()
    # An explicit stack, not recursion: bodies may nest expressions thousands deep. Every
    # dataclass field is walked, so AST node types added later are covered too.
    stack: list[object] = list(f.body)
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not dataclasses.is_dataclass(node):
            continue
        if isinstance(node, Call) and node.func in names and node.func != f.name:
            found.add(node.func)
        stack.extend(getattr(node, fld.name) for fld in dataclasses.fields(node))
    return found


def exported(module: Module) -> list[str]:
    """Functions no other function of the file calls, without a leading `_`, in file order."""
    names = set(module.funcs)
    called: set[str] = set()
    for f in module.funcs.values():
        called |= called_functions(f, names)
    return [n for n in module.funcs if n not in called and not n.startswith("_")]


def pick_entry(module: Module, filename: str, entry: str | None = None) -> str:
    """The name of the function to compile (the rule in the module docstring)."""
    defined = ", ".join(module.funcs)
    if entry is not None:
        if entry not in module.funcs:
            raise UsageError(f"{filename}: no function named {entry!r}; it defines {defined}")
        return entry
    if "main" in module.funcs:
        return "main"
    candidates = exported(module)
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise UsageError(f"{filename}: several functions could be the entry ({', '.join(candidates)}): "
                         "pass --entry NAME (or entry=NAME), or name one of them main")
    raise UsageError(f"{filename}: no function is an entry (every one is called by another or starts "
                     f"with '_'; it defines {defined}): pass --entry NAME (or entry=NAME)")

"""What a captured function reads besides its arguments, and how a compiled call reads it again.

minicomp has no bytecode analysis (that is Dynamo's). It finds what a function can read by
walking what is reachable from it, before capture:

- an `nn.Module` (the function itself, or one reached below): every submodule, its
  parameters, buffers and `__dict__` (plain tensor attributes, Python values, objects);
- a function (the compiled one, a bound method's function, a user class's methods, helpers
  it calls): the globals its code names (`co_names` of the code and of nested code), its
  closure cells and its defaults; a user's own Python module read as `cfg.NAME`;
- one level into lists, tuples, dicts and objects of the user's own classes (a config
  object) found there; library objects (a logger) are guarded by identity only.

Each place is a zero-argument *read* (`dict.get` of the very dict, `getattr` of the very
cell) that gives the value there now. Three kinds of record come out of a walk:

- **sources**: where each tensor lives (`ln_1.weight`). Tensors the graph reads become
  graph inputs, and every compiled call reads them again: a rebinding, `.data = ...`,
  `load_state_dict`, `.to()` or an in-place update is seen by the next call.
- **equality guards**: Python values (`self.eps`, `self.training`, a global float, a tuple
  of ints, the number of forward hooks) compared with their value at capture.
- **identity guards**: objects that must still be the same object (every submodule in its
  parent, a config object, a helper function, a builtin such as `torch.tanh` held in an
  attribute, global or closure cell, a list holding tensors, a tied weight's second name still
  naming the first's tensor).

A call whose guards fail is captured again (`Binding.read()` returns None). Not covered,
and documented in docs/bad_input.md: values reached another way (an attribute of an
object two levels down, a class attribute, a tensor inside a nested container, a global
of a library module), and state mutated in place inside a container that holds Python
values only at the second level. Those are read at capture and kept.

Invariant: building a walk or a binding never changes anything it reads.
"""

from __future__ import annotations

import copy
import enum
import functools
import itertools
import operator
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from minicomp.frontend.fx_trace import is_user_file

MISSING = object()            # what a read gives where a name or key has gone
_DEPTH = 3                    # functions reached through functions, containers through containers
_ITEMS = 256                  # items of one container or object looked at
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size,
            torch.memory_format, torch.layout, type(Ellipsis), slice, range)
# nn.Module's own bookkeeping in every instance's __dict__ (hooks are guarded by count)
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) - {"training"}
_HOOKS = ("_forward_hooks", "_forward_pre_hooks")

Read = Callable[[], Any]


def is_scalar_tree(v: Any, depth: int = 0) -> bool:
    """A Python value that equality can guard: scalars, and small containers of them."""
    if isinstance(v, _SCALARS) or isinstance(v, enum.Enum):
        return True
    if depth >= _DEPTH or not isinstance(v, (tuple, list, set, frozenset, dict)) or len(v) > 64:
        return False
    items = itertools.chain.from_iterable(v.items()) if isinstance(v, dict) else v
    return all(is_scalar_tree(x, depth + 1) for x in items)


def held(obj: Any) -> Read:
    """A read that always gives `obj` (a tensor minicomp found but cannot name a place for)."""
    return itertools.repeat(obj).__next__


@dataclass(frozen=True)
class Source:
    label: str                 # `ln_1.weight`, `SCALE`, `mask[0]`: for dumps and messages
    read: Read


@dataclass
class Walk:
    """Everything the walk found; see the module docstring."""
    sources: dict[int, Source] = field(default_factory=dict)        # id(tensor) -> first place found
    aliases: dict[int, list[Source]] = field(default_factory=dict)  # id(tensor) -> its other places
    equal: list[tuple[Read, Any, str]] = field(default_factory=list)
    same: list[tuple[Read, Any, str]] = field(default_factory=list)
    modules: list[tuple[str, nn.Module]] = field(default_factory=list)
    namespaces: list[tuple[str, dict, set]] = field(default_factory=list)   # globals read, by dict
    containers: list[tuple[str, Any]] = field(default_factory=list)          # lists/dicts/sets held
    hooks: list[dict] = field(default_factory=list)   # every module's forward (pre-)hook tables
    keep: list = field(default_factory=list)     # keeps alive every object an id above names
    ran: set | None = None       # code objects that ran at capture (ran.py): only those are walked; None: all
    _seen: set = field(default_factory=set)

    # -------------------------------------------------------------- values
    def value(self, v: Any, read: Read, label: str, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            self.tensor(v, read, label)
        elif is_scalar_tree(v):
            self.equal.append((read, copy.deepcopy(v), label))
            if isinstance(v, (list, dict, set)) and self._first(v):
                self.containers.append((label, v))      # for effects.Snapshot: an append in forward
        elif isinstance(v, nn.Module):
            self.same.append((read, v, label))
            self.module(v, label)
        elif isinstance(v, (list, tuple, dict, set)):
            self.same.append((read, v, label))
            self.container(v, label, depth)
        elif isinstance(v, (types.FunctionType, types.MethodType, functools.partial)):
            self.same.append((read, v, label))
            self.callable(v, label, depth + 1)
        elif isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType, types.MethodDescriptorType,
                            types.WrapperDescriptorType)):
            # modules, classes and builtins (`self.act = torch.tanh`): the same object, not looked into
            self.same.append((read, v, label))
        else:
            self.same.append((read, v, label))
            if depth < _DEPTH - 1 and _user_class(type(v)):
                self.attributes(v, label)

    def tensor(self, t: torch.Tensor, read: Read, label: str) -> None:
        key = id(t)
        if key in self.sources:
            self.aliases.setdefault(key, []).append(Source(label, read))
        else:
            self.sources[key] = Source(label, read)
            self.keep.append(t)

    def _first(self, obj: Any) -> bool:
        """True the first time `obj` is met (each object is walked once)."""
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self.keep.append(obj)
        return True

    # -------------------------------------------------------------- places
    def container(self, c: Any, label: str, depth: int) -> None:
        if not self._first(c):
            return
        if not isinstance(c, tuple):
            self.containers.append((label, c))
            self.equal.append((functools.partial(len, c), len(c), f"len({label})"))
        if depth >= _DEPTH or isinstance(c, set):
            return
        items = c.items() if isinstance(c, dict) else enumerate(c)
        for key, item in itertools.islice(items, _ITEMS):
            read = (functools.partial(dict.get, c, key, MISSING) if isinstance(c, dict)
                    else functools.partial(operator.getitem, c, key))
            self.value(item, read, f"{label}[{key!r}]", depth + 1)

    def attributes(self, obj: Any, label: str) -> None:
        """One level into a plain object (a config): its Python values and tensors."""
        if not self._first(obj):
            return
        d = getattr(obj, "__dict__", None)
        if not isinstance(d, dict):
            return
        for k, v in itertools.islice(list(d.items()), _ITEMS):
            if isinstance(v, torch.Tensor) or is_scalar_tree(v):
                self.value(v, functools.partial(dict.get, d, k, MISSING), f"{label}.{k}", _DEPTH)

    def module(self, root: nn.Module, label: str) -> None:
        for name, m in root.named_modules(prefix=label):
            if not self._first(m):
                continue
            self.modules.append((name, m))
            dot = f"{name}." if name else ""
            for cname, child in m._modules.items():
                self.same.append((functools.partial(dict.get, m._modules, cname, MISSING), child, dot + cname))
            for table in (m._parameters, m._buffers):
                for pname, p in table.items():
                    read = functools.partial(dict.get, table, pname, MISSING)
                    if p is None:
                        self.same.append((read, None, dot + pname))
                    else:
                        self.tensor(p, read, dot + pname)
            d = m.__dict__
            for k, v in list(d.items()):
                if k not in _MODULE_INTERNALS:
                    self.value(v, functools.partial(dict.get, d, k, MISSING), dot + k, 1)
            self.hooks += [d[h] for h in _HOOKS if isinstance(d.get(h), dict)]
            for cls in type(m).__mro__:
                if cls is object or cls.__module__.split(".")[0] == "torch" or not self._first(cls):
                    continue
                for attr, f in vars(cls).items():
                    if attr.startswith("__") and attr != "__call__":   # forward never calls __init__
                        continue
                    f = getattr(f, "__func__", getattr(f, "fget", f))
                    if isinstance(f, types.FunctionType):
                        self.function(f, f"{cls.__name__}.{attr}", 1)

    def callable(self, f: Any, label: str, depth: int) -> None:
        if isinstance(f, types.MethodType):
            self.value(f.__self__, functools.partial(getattr, f, "__self__"), f"{label}.__self__", depth)
            f = f.__func__
        if isinstance(f, functools.partial):
            self.value(f.args, functools.partial(getattr, f, "args"), f"{label}.args", depth)
            self.value(f.keywords, functools.partial(getattr, f, "keywords"), f"{label}.keywords", depth)
            f = f.func
        if isinstance(f, types.FunctionType):
            self.function(f, label, depth)
        elif isinstance(f, nn.Module):
            self.module(f, "")

    def function(self, f: types.FunctionType, label: str, depth: int) -> None:
        code = f.__code__
        # library code (torch's own modules, the standard library) is not watched; the root always is
        if depth > _DEPTH or (depth and not is_user_file(code.co_filename)) or not self._first(f):
            return
        if depth and self.ran is not None and code not in self.ran:
            return          # it did not run at capture: what it reads cannot change the graph (ran.py)
        names = _names(code)
        g = f.__globals__
        read_here = {n for n in names if n in g}
        self.namespaces.append((f"globals of {f.__module__}", g, read_here))
        for name in sorted(read_here):
            v = g[name]
            read = functools.partial(dict.get, g, name, MISSING)
            if isinstance(v, types.ModuleType):
                self.same.append((read, v, name))
                if is_user_file(getattr(v, "__file__", None) or "<"):
                    self.python_module(v, name, names, depth)
            else:
                self.value(v, read, name, depth)
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:        # a cell not yet filled (a recursive inner function)
                continue
            self.value(v, functools.partial(getattr, cell, "cell_contents"), name, depth)
        if f.__defaults__:
            self.value(f.__defaults__, functools.partial(getattr, f, "__defaults__"), f"{label} defaults", depth)
        if f.__kwdefaults__:
            self.value(f.__kwdefaults__, functools.partial(getattr, f, "__kwdefaults__"), f"{label} defaults",
                       depth)

    def python_module(self, mod: types.ModuleType, label: str, names: set, depth: int) -> None:
        """`cfg.NAME` where cfg is the user's own Python module."""
        d = vars(mod)
        read_here = {n for n in names if n in d}
        self.namespaces.append((f"module {mod.__name__}", d, read_here))
        for name in sorted(read_here):
            v = d[name]
            if not isinstance(v, types.ModuleType):
                self.value(v, functools.partial(dict.get, d, name, MISSING), f"{label}.{name}", depth + 1)


def _user_class(cls: type) -> bool:
    """A class of the user's (a model's config), not the standard library's or torch's: only
    those are looked into (a `logging.Logger` keeps a cache it fills on every log call)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return path is not None and is_user_file(path) and "__dict__" in dir(cls)


def _names(code: types.CodeType) -> set[str]:
    """Global and attribute names the code (and code nested in it) can read."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def walk(fn: Any, ran: set | None = None) -> Walk:
    """Walk everything reachable from `fn` (a function, bound method, partial or module); with
    `ran` (the code objects that ran at capture, ran.py) functions other than `fn` itself are
    walked only where their code is in it."""
    w = Walk(hooks=[getattr(torch.nn.modules.module, f"_global{h}", {}) for h in _HOOKS], ran=ran)
    if isinstance(fn, nn.Module):
        w.module(fn, "")
    elif isinstance(fn, types.MethodType) and isinstance(fn.__self__, nn.Module):   # model.forward
        w.module(fn.__self__, "")
        w.function(fn.__func__, fn.__name__, 0)
    else:
        w.callable(fn, getattr(fn, "__name__", "fn"), 0)
    # a forward hook registered after compiling changes what eager computes: one count guards them all
    count = HookCount(w.hooks)
    w.equal.append((count, count(), "the number of forward hooks"))
    return w


class HookCount:
    """The number of forward hooks and pre-hooks of every module walked (and the global ones)."""

    def __init__(self, tables: list[dict]):
        self.tables = tables

    def __call__(self) -> int:
        return sum(map(len, self.tables))



def distinct(found: Walk, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """`args` with each tensor that is also a weight, or an earlier argument, replaced by a new
    tensor object over the same memory (`detach()`): the tracers know tensors by identity, and
    `f(x, x)` or `model(model.weight)` must not capture one input for two (the next call, with
    two different tensors, would read one of them twice)."""
    seen = set(found.sources)
    out = []
    for t in args:
        if id(t) in seen:
            t = t.detach()
        seen.add(id(t))
        out.append(t)
    return out

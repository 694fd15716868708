"""Load a Python model file: the callable to capture and its example inputs.

A model file (the CLI's `.py` input) defines:
- the callable: the attribute named by `entry`, else `model`, else the only candidate the
  file itself defines, looked for in this order — `nn.Module` instances, then `nn.Module`
  subclasses, then functions (private `_names` and `example_inputs` never count);
- `example_inputs()`, returning the callable's arguments (a tensor, or a list/tuple of them).

An `nn.Module` class is instantiated with no arguments; every module is put in `eval()`
(model files describe inference). Everything a user can get wrong — a missing file, a
syntax error, an exception while importing or building inputs — raises MinicompError, with
`file:line:col`, the line as written and a caret where one is known, never a traceback. An
ambiguous entry, or an `entry` that the file lacks, is a `UsageError` (the CLI exits 2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import torch.nn as nn

from minicomp.errors import MinicompError, SourceError, UsageError
from minicomp.frontend.pyframes import frame_error, shown_line


def _shown(path: Path) -> str:
    """How messages name a file: relative to the working directory when it is below it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def _in_file_error(exc: BaseException, path: Path, what: str) -> MinicompError:
    """`exc` reported at the innermost frame inside the model file (or just naming the file)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{what}: {type(exc).__name__}" + (f": {text}" if text else "")
    if not frames:
        return MinicompError(f"{_shown(path)}: {message}")
    return frame_error(message, frames[-1], _shown(path))


def import_file(path: str | Path) -> ModuleType:
    """Import a .py file by path under a private module name (it stays in sys.modules)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise MinicompError(f"{_shown(path)}: no such file")
    name = "_minicomp_model_" + hashlib.sha1(str(path).encode()).hexdigest()[:10] + "_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MinicompError(f"{_shown(path)}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        # e.text is the whole line and e.offset a 1-based character column into it
        raise SourceError(f"syntax error: {e.msg}", _shown(path), e.lineno or 0, e.offset or 1,
                          shown_line(e.text)) from None
    except Exception as e:
        sys.modules.pop(name, None)
        raise _in_file_error(e, path, "error while importing the model file") from None
    return module


def _defined_here(obj: Any, module: ModuleType) -> bool:
    return getattr(obj, "__module__", None) == module.__name__


def _candidates(module: ModuleType) -> list[tuple[str, Any]]:
    """The entry candidates of the first non-empty tier: module instances, classes, functions."""
    names = [(n, v) for n, v in vars(module).items() if not n.startswith("_") and n != "example_inputs"]
    instances = [(n, v) for n, v in names if isinstance(v, nn.Module)]
    classes = [(n, v) for n, v in names
               if inspect.isclass(v) and issubclass(v, nn.Module) and _defined_here(v, module)]
    functions = [(n, v) for n, v in names if inspect.isfunction(v) and _defined_here(v, module)]
    return instances or classes or functions


def _pick(module: ModuleType, path: Path, entry: str | None) -> tuple[str, Any]:
    if entry is not None:
        if not hasattr(module, entry):
            options = ", ".join(n for n, _ in _candidates(module)) or "none"
            raise UsageError(f"{_shown(path)}: no entry named {entry!r} (candidates: {options})")
        return entry, getattr(module, entry)
    if hasattr(module, "model"):
        return "model", module.model
    found = _candidates(module)
    if len(found) == 1:
        return found[0]
    if not found:
        raise MinicompError(f"{_shown(path)}: defines no model: add a function or nn.Module named `model` "
                            "(or pass --entry NAME)")
    raise UsageError(f"{_shown(path)}: several possible models ({', '.join(n for n, _ in found)}); "
                        "name one `model` or pass --entry NAME")


def _instantiate(name: str, obj: Any, path: Path) -> Callable:
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        try:
            obj = obj()
        except Exception as e:
            raise _in_file_error(e, path, f"cannot build {name}() with no arguments") from None
    if isinstance(obj, nn.Module):
        obj.eval()
    elif not callable(obj):
        raise MinicompError(f"{_shown(path)}: {name} is a {type(obj).__name__}, not a function or nn.Module")
    return obj


def _example_inputs(module: ModuleType, path: Path) -> list[torch.Tensor]:
    make = getattr(module, "example_inputs", None)
    if make is None:
        raise MinicompError(f"{_shown(path)}: defines no example_inputs(); add one returning the model's arguments "
                            "as a list of tensors")
    if not callable(make):
        raise MinicompError(f"{_shown(path)}: example_inputs must be a function returning a list of tensors")
    try:
        inputs = make()
    except Exception as e:
        raise _in_file_error(e, path, "example_inputs() failed") from None
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise MinicompError(f"{_shown(path)}: example_inputs() must return a tensor or a list of tensors, "
                            f"got {type(inputs).__name__}")
    return list(inputs)


def load_model_file(path: str | Path, entry: str | None = None) -> tuple[Callable, list[torch.Tensor]]:
    """Import `path` and return (the callable to capture, its example inputs)."""
    resolved = Path(path).resolve()
    module = import_file(resolved)
    name, obj = _pick(module, resolved, entry)
    return _instantiate(name, obj, resolved), _example_inputs(module, resolved)

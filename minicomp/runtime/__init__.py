"""Runtime: turn a GeneratedModule into a callable (disk cache, module import, guards).

`load(generated, device)` stores the source in the module cache (or compiles in memory
when the cache cannot be written), imports it (under Triton's interpreter for CPU
devices), fills its `CONSTANTS` (moved to `device`) and `OPAQUE`, and returns a
`CompiledCall`: `call(*inputs) -> list[Tensor]`, which checks its arguments first and
raises `GuardError` on a mismatch. Specialisation across signatures is the caller's:
keep a dict `Signature.of(inputs) -> CompiledCall` and compile again on a miss.

CPU runs need Triton's interpreter switched on before `triton` is first imported (its
own library functions such as `tl.sum` are decorated then). On a machine without CUDA
importing this package switches it on, so import minicomp before triton there.
"""

from __future__ import annotations

import functools
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything below imports triton

from minicomp.runtime.cache import ModuleCache, cache_key, cache_root
from minicomp.runtime.guards import GuardError, Signature, check_call, symbolic_shape, with_input_layouts
from minicomp.runtime.loader import check_interpreter, import_entry, import_source
from minicomp.runtime.progress import watch_autotuning

__all__ = ["load", "CompiledCall", "ModuleCache", "Signature", "GuardError", "cache_root",
           "with_input_layouts"]


@dataclass
class CompiledCall:
    module: types.ModuleType
    key: str
    path: Path | None          # the cache entry it was imported from (None: compiled in memory)
    generated: Any             # the GeneratedModule
    device: torch.device

    @property
    def source(self) -> str:
        return self.generated.source

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        g = self.generated
        check_call(g.graph_name, g.input_specs, self.device.type, inputs)
        return self._entry(*inputs)

    @functools.cached_property
    def _entry(self) -> Callable:
        """The module's run() where check_call has checked all its call() would: a static
        signature (call() checks each input's shape, dtype and device again, ~1 us an input: a
        model's ~200 weights through the Dynamo backend). A module over symbolic sizes keeps
        call(), which binds the sizes and checks that the inputs agree on them."""
        symbolic = any(symbolic_shape(shape) for _, shape, _ in self.generated.input_specs)
        run = getattr(self.module, "run", None)
        return self.module.call if symbolic or run is None else run


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or on CUDA a copy with its strides at a 16-byte aligned address (a weight that is a
    view at an odd offset): on CUDA kernels are only ever given aligned tensors (see
    `_as_layout` in codegen/module.py)."""
    if t.device.type != "cuda" or t.data_ptr() % 16 == 0:
        return t
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def load(generated, device: str | torch.device, cache: ModuleCache | None = None) -> CompiledCall:
    """Import `generated` for `device` ("cpu" runs under Triton's interpreter) and return its call."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise GuardError(f"minicomp runs on cpu or cuda devices, not {device}")
    if device.type != generated.device_type:
        raise GuardError(f"module for {generated.graph_name!r} was generated for {generated.device_type}, "
                         f"not {device.type}")
    cache = cache or ModuleCache()
    key = cache_key(generated.source, device)
    entry = cache.fetch(key, generated.source)    # the entry's text, read once and checked
    interpret = device.type == "cpu"
    if interpret:
        check_interpreter()
    if entry is not None:
        module = import_entry(entry, key, interpret)   # runs that text: the file is never imported
    else:
        module = import_source(generated.source, key, interpret)
    module.CONSTANTS[:] = [_aligned(c.to(device)) for c in generated.constants]
    module.OPAQUE[:] = list(generated.opaque)
    if not interpret:
        watch_autotuning(module, generated.kernel_groups)   # a long autotuning sweep prints its progress
    return CompiledCall(module, key, entry.path if entry is not None else None, generated, device)

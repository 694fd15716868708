"""Leaves of the graph: inputs, constants, and opaque calls into PyTorch.

They compute nothing minicomp writes: inputs are bound by whoever runs the graph, constants
hold their value, and an opaque node calls the PyTorch callable it holds (the fx frontend's
way to keep an op it cannot lower; codegen/fallback.py writes it as `OPAQUE[i](...)`).
"""

from __future__ import annotations

from typing import Any

import torch

from minicomp.ir.ops import OpDef, register


def _no_ref(*_a, **_k):
    raise RuntimeError("leaf nodes are bound by the interpreter, not evaluated")


def _constant_ref(*, value: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value if device is None else value.to(device)
    return torch.tensor(value, dtype=dtype, device=device)


def _opaque_ref(*tensors, fn, **_):
    return fn(*tensors)


register(OpDef("input", "input", _no_ref, arity=0, flops_per_element=0, attrs=("name",), emitter="load"))
register(OpDef("constant", "constant", _constant_ref, arity=0, flops_per_element=0, attrs=("value",),
               emitter="load", aten=("scalar_tensor.default",)))
register(OpDef("opaque", "opaque", _opaque_ref, arity=None, flops_per_element=0, attrs=("fn", "target"),
               emitter="pytorch"))

"""When `minicomp.compile` compiles over symbolic sizes, and which calls such a compile serves.

`minicomp.compile(fn, dynamic=...)`:
- `None` (the default), as Dynamo does: the first call of a given structure (argument
  nesting, ranks, dtypes, devices) compiles for its sizes; a later call whose sizes differ
  compiles once more with the dims that changed symbolic, and that compile serves every
  later call whose sizes differ only there. At most two compiles per structure while the
  changing dims stay the same ones;
- `True`: every dim of every tensor argument is symbolic from the first call (sizes 0 and 1
  stay concrete, as in Dynamo: they change broadcasting);
- `False`: one compile per distinct signature, as before;
- `mark_dynamic(x, dim)` (below) makes that dim of that tensor symbolic from the first call.

A compile over symbols can fail where a static one works: the trace assumed a fact about a
size that a module cannot re-check (a branch on `x.shape[1] > 64`), an op has no shape rule
over symbols, a size is used as a number. Then the call compiles for its sizes as before,
the structure is not tried again, and `explain()` says why (`DynamicState.refused`).
A disequality on one size (`Ne(s, 3)`: PyTorch asks whether `x[:, -3:]` is the whole row)
is no such fact: the trace is made again over the range on the first size's side of the
value (`fx_symbolic.narrowings`), which the module re-checks; the other side compiles again.

Which calls a symbolic specialisation serves is decided by its graph's input shapes
(`accepts`): each symbol is read from the first input dim that is exactly it, and every
input dim must then equal its expression, inside the symbols' ranges. The generated
module checks the same at its own call (codegen/sizes.py): this is the lookup, not the net.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from minicomp.ir import dims

_MARK = "_minicomp_dynamic_dims"


def mark_dynamic(t: torch.Tensor, dim: int | Sequence[int]) -> torch.Tensor:
    """Make dim `dim` (or each of several) of `t` symbolic when a compiled function is first
    called with `t`; returns `t`. A mark on a dim of size 0 or 1 is ignored (those sizes
    change what code does: they stay concrete)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic takes a tensor, not {type(t).__name__}")
    wanted = [dim] if isinstance(dim, int) else list(dim)
    for d in wanted:
        if isinstance(d, bool) or not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"mark_dynamic: dim {d!r} is out of range for a tensor of {t.dim()} dimension(s)")
    marked = set(getattr(t, _MARK, ())) | {d % t.dim() for d in wanted}
    setattr(t, _MARK, frozenset(marked))
    return t


def marked_dims(t: torch.Tensor) -> frozenset:
    return frozenset(getattr(t, _MARK, ()))


def structure(spec: Any, tensors: Sequence[torch.Tensor], modes: Any) -> tuple:
    """What a symbolic specialisation keeps fixed: the call's shape, the modes, and each
    tensor's rank, dtype and device."""
    return (spec, modes, tuple((t.dim(), t.dtype, t.device.type) for t in tensors))


def accepts(shapes: Sequence[tuple], tensors: Sequence[torch.Tensor]) -> bool:
    """Whether tensors of these sizes fit graph inputs of `shapes` (ints and Exprs)."""
    env: dict[str, int] = {}
    for shape, t in zip(shapes, tensors):
        if len(shape) != t.dim():
            return False
        for d, size in zip(shape, t.shape):
            s = dims.lone_symbol(d)
            if s is not None:
                if s.name not in env:
                    if not s.lo <= size <= s.hi:
                        return False
                    env[s.name] = int(size)
    try:
        return all(dims.evaluate(d, env) == size for shape, t in zip(shapes, tensors) for d, size in zip(shape, t.shape))
    except KeyError:          # a symbol no dim names alone
        return False


@dataclass
class DynamicState:
    """Per compiled function: the sizes seen per structure, and which structures could not
    be compiled over symbols (with why)."""
    mode: bool | None
    seen: dict[tuple, list[tuple]] = field(default_factory=dict)     # structure -> first sizes
    refused: dict[tuple, str] = field(default_factory=dict)          # structure -> why not symbolic

    def dims_for(self, key: tuple, tensors: Sequence[torch.Tensor]) -> list[frozenset] | None:
        """The dims to make symbolic for this call (None: compile for its sizes)."""
        sizes = tuple(tuple(t.shape) for t in tensors)
        first = self.seen.setdefault(key, list(sizes))
        marked = [marked_dims(t) for t in tensors]
        if self.mode is False or key in self.refused:
            return None
        if self.mode is True:
            chosen = [frozenset(range(t.dim())) for t in tensors]
        else:
            changed = [frozenset(i for i in range(len(a)) if a[i] != b[i]) for a, b in zip(first, sizes)]
            chosen = [c | m for c, m in zip(changed, marked)]
        chosen = [frozenset(i for i in c if t.shape[i] >= 2) for c, t in zip(chosen, tensors)]
        return chosen if any(chosen) else None

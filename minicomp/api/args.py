"""A compiled function's arguments as flat tensors: what `minicomp.compile`'s functions take
(tensors, nested in lists, tuples and dicts) and the function of flat tensors it captures.

Part of the api package; imports nothing of minicomp but its errors.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from minicomp.errors import GuardError


def flatten(args: Sequence[Any]) -> tuple[list[torch.Tensor], Any]:
    """The tensors in `args` (nested lists/tuples/dicts allowed) and the structure holding them."""
    flat, spec = torch.utils._pytree.tree_flatten(list(args))
    bad = [type(a).__name__ for a in flat if not isinstance(a, torch.Tensor)]
    if bad:
        raise GuardError(f"compiled functions take tensors only; got {', '.join(sorted(set(bad)))}")
    return flat, spec


def taking_flat(fn: Callable, spec: Any) -> Callable:
    """`fn` as a function of the flat tensors of arguments nested as `spec` describes."""
    @functools.wraps(fn)
    def flat_fn(*flat: torch.Tensor) -> Any:
        return fn(*torch.utils._pytree.tree_unflatten(list(flat), spec))
    return flat_fn

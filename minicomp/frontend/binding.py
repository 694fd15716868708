"""A captured graph's binding: what a compiled call reads again, and checks, at every call.

Built by capture from a `params.Walk` (see params.py for what is watched and what is not).
Reading is the hot path of every compiled call: each read is a C-level callable
(`dict.get` of the very dict, `getattr` of the very cell), mapped in one pass.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from minicomp.frontend.params import MISSING, Read, Walk, held


# --------------------------------------------------------------------------- binding

_call = getattr(operator, "call", None) or (lambda f: f())


_VERSION, _GRAD = operator.attrgetter("_version"), operator.attrgetter("requires_grad")


def _state(t: torch.Tensor) -> tuple:
    """What a frozen weight must keep: its version (in-place writes), storage (`.data = ...`)
    and grad flag (gradients still reach frozen weights, runtime/boundary.py)."""
    return t._version, t.data_ptr(), t.requires_grad


class _Tied:
    """True while a tied weight's second name still names the tensor its first name does."""

    def __init__(self, first: Read, other: Read):
        self.first, self.other = first, other

    def __call__(self) -> bool:
        return self.other() is self.first()


@dataclass
class Binding:
    """How a compiled call reads again, at each call, what its graph read at capture.

    `read()` checks every guard and returns the weight inputs' tensors now (in graph-input
    order, after the function's own arguments), or None when a guard fails: the caller then
    captures again. Weights frozen into the graph (`freeze=True`) are guarded by identity,
    version counter (`t._version`, bumped by every in-place write) and data pointer (a
    `.data = ...` swaps the storage and keeps both); `_storage` keeps the frozen storages
    alive, so no new tensor can take over an old address.
    """
    labels: list[str] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    equal: list[tuple[Read, Any, str]] = field(default_factory=list)
    same: list[tuple[Read, Any, str]] = field(default_factory=list)
    frozen: list[tuple[Read, torch.Tensor, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._equal_reads = [r for r, _, _ in self.equal]
        self._equal_values = [v for _, v, _ in self.equal]
        self._same_reads = [r for r, _, _ in self.same]
        self._same_objects = [v for _, v, _ in self.same]
        self._frozen_reads = [r for r, _, _ in self.frozen]
        self._frozen_objects = [t for _, t, _ in self.frozen]
        self._storage = [t.detach() for t in self._frozen_objects]
        self._states = [_state(t) for t in self._frozen_objects]
        self._versions, self._ptrs, self._grads = ([st[i] for st in self._states] for i in range(3))

    @classmethod
    def build(cls, w: Walk, weights: list[tuple[torch.Tensor, str]],
              frozen: list[tuple[torch.Tensor, str]]) -> "Binding":
        """The binding of a graph whose weight inputs are `weights` and whose frozen constants are `frozen`."""
        equal = list(w.equal)

        def read_of(t: torch.Tensor, label: str) -> Read:
            src = w.sources.get(id(t))
            read = src.read if src is not None else held(t)
            for other in w.aliases.get(id(t), ()):
                equal.append((_Tied(read, other.read), True, f"{other.label} is {label}"))
            return read

        reads = [read_of(t, label) for t, label in weights]
        frozen_reads = [(read_of(t, label), t, label) for t, label in frozen]
        return cls([label for _, label in weights], reads, equal, list(w.same), frozen_reads)

    def read(self) -> list[Any] | None:
        try:
            if self._equal_values and list(map(_call, self._equal_reads)) != self._equal_values:
                return None
            if self._same_objects and not all(map(operator.is_, map(_call, self._same_reads), self._same_objects)):
                return None
            if self._frozen_objects and not self._frozen_unchanged():
                return None
            return list(map(_call, self.reads))
        except Exception:       # a read that fails (a name gone, a list shortened): a changed program
            return None

    def _frozen_unchanged(self) -> bool:
        now = list(map(_call, self._frozen_reads))
        # three C-level passes (a Python function per tensor costs twice as much)
        return (all(map(operator.is_, now, self._frozen_objects)) and list(map(_VERSION, now)) == self._versions
                and list(map(torch.Tensor.data_ptr, now)) == self._ptrs and list(map(_GRAD, now)) == self._grads)

    def changes(self) -> tuple[list[str], bool]:
        """What no longer holds (labels), and whether an object was replaced or a frozen weight
        changed: a specialisation that can never match again (its caller drops it)."""
        def now(read: Read) -> Any:
            try:
                return read()
            except Exception:
                return MISSING
        changed, replaced = [], False
        for read, value, label in self.equal:
            try:
                same = bool(now(read) == value)
            except Exception:
                same = False
            if not same:
                changed.append(label)
        for read, obj, label in self.same:
            if now(read) is not obj:
                changed.append(label)
                replaced = True
        for (read, t, label), state in zip(self.frozen, self._states):
            if not (now(read) is t and _state(t) == state):
                changed.append(f"frozen weight {label}")
                replaced = True
        return changed, replaced

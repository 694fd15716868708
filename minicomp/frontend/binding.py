"""A captured graph's binding: what a compiled call reads again, and checks, at every call.

Built by capture from a `params.Walk` (see params.py for what is watched and what is not).
Reading is the hot path of every compiled call: each read is a C-level callable
(`dict.get` of the very dict, `getattr` of the very cell), mapped in one pass. Guards that
read keys of one dict (a module's `__dict__`, its `_modules`) or attributes of one object are
read together, by one `operator.itemgetter` / `attrgetter` bound to it (`_grouped`).
"""

from __future__ import annotations

import functools
import itertools
import operator
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from minicomp.frontend.params import MISSING, Read, Walk, held


# --------------------------------------------------------------------------- binding

_call = getattr(operator, "call", None) or (lambda f: f())


_VERSION, _GRAD = operator.attrgetter("_version"), operator.attrgetter("requires_grad")
_CONTENTS = operator.attrgetter("cell_contents")


def _cells(guards: list[tuple[Read, Any]]) -> tuple[tuple, list, list[tuple[Read, Any]]]:
    """The guards that read a closure cell (`getattr(cell, "cell_contents")`, one cell each) as
    (cells, their values), and the other guards. The cells are read by one `map` at each call:
    transformers' `deprecate_kwarg` wrappers alone close over 11 cells each, 89 cells in a Llama."""
    cells, values, rest = [], [], []
    for read, value in guards:
        if (isinstance(read, functools.partial) and read.func is getattr and not read.keywords
                and read.args[1:] == ("cell_contents",) and isinstance(read.args[0], types.CellType)):
            cells.append(read.args[0])
            values.append(value)
        else:
            rest.append((read, value))
    return tuple(cells), values, rest


def _state(t: torch.Tensor) -> tuple:
    """What a frozen weight must keep: its version (in-place writes), storage (`.data = ...`)
    and grad flag (gradients still reach frozen weights, runtime/boundary.py)."""
    return t._version, t.data_ptr(), t.requires_grad


def _place(read: Read) -> tuple[Any, Any, Any] | None:
    """(getter maker, container, key) when `read` is `partial(dict.get, d, key, MISSING)` or
    `partial(getattr, obj, name)`; else None (it stays a read of its own)."""
    if not isinstance(read, functools.partial) or read.keywords:
        return None
    if read.func is dict.get and len(read.args) == 3 and read.args[2] is MISSING and type(read.args[0]) is dict:
        return operator.itemgetter, read.args[0], read.args[1]
    if read.func is getattr and len(read.args) == 2 and isinstance(read.args[1], str):
        return operator.attrgetter, read.args[0], read.args[1]
    return None


def _grouped(guards: list[tuple[Read, Any]]) -> tuple[list[Read], list[Any], list[Read], list[tuple]]:
    """The guards' reads as (single reads, their values, grouped reads, their values' tuples):
    reads of two or more keys of one dict, or attributes of one object, become one
    `itemgetter(*keys)` / `attrgetter(*names)` bound to it, a C-level call giving the tuple of
    their values; a key read again for the same object is read once. An expected MISSING (a
    key guarded absent) stays single: itemgetter raises KeyError where `dict.get` gives
    MISSING (a raising read fails the guard, as it should)."""
    places: dict[tuple, tuple[Any, Any, list[tuple[Read, Any, Any]], set]] = {}
    single_reads, single_values = [], []
    for read, value in guards:
        place = _place(read) if value is not MISSING else None
        if place is None:
            single_reads.append(read)
            single_values.append(value)
        else:
            maker, container, key = place
            _, _, items, seen = places.setdefault((maker, id(container)), (maker, container, [], set()))
            if (key, id(value)) not in seen:      # the same global read through two functions: once
                seen.add((key, id(value)))
                items.append((read, key, value))
    grouped_reads, grouped_values = [], []
    for maker, container, items, _ in places.values():
        if len(items) == 1:
            single_reads.append(items[0][0])
            single_values.append(items[0][2])
        else:
            grouped_reads.append(functools.partial(maker(*(key for _, key, _ in items)), container))
            grouped_values.append(tuple(value for _, _, value in items))
    return single_reads, single_values, grouped_reads, grouped_values


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
        # equality: each read's value (or each group's tuple of values) against what it was
        self._equal_cells, self._equal_cell_values, rest = _cells([(r, v) for r, v, _ in self.equal])
        reads, values, group_reads, group_values = _grouped(rest)
        self._equal_reads, self._equal_values = reads + group_reads, values + group_values
        # identity: the objects read, single reads' then the groups' flattened, against the objects
        self._same_cells, self._same_cell_objects, rest = _cells([(r, v) for r, v, _ in self.same])
        reads, objects, group_reads, group_objects = _grouped(rest)
        self._same_reads, self._same_groups = reads, group_reads
        self._same_objects = objects + [o for group in group_objects for o in group]
        self._frozen_reads = [r for r, _, _ in self.frozen]
        self._frozen_objects = [t for _, t, _ in self.frozen]
        self._storage = [t.detach() for t in self._frozen_objects]
        self._states = [_state(t) for t in self._frozen_objects]
        self._versions, self._ptrs, self._grads = ([st[i] for st in self._states] for i in range(3))

    @classmethod
    def build(cls, w: Walk, weights: list[tuple[torch.Tensor, str]],
              frozen: list[tuple[torch.Tensor, str]], guards: Walk | None = None) -> "Binding":
        """The binding of a graph whose weight inputs are `weights` and whose frozen constants are
        `frozen`: tensors read from where `w` found them, Python state guarded as `guards` (default
        `w`) found it."""
        guards = guards or w
        equal = list(guards.equal)

        def read_of(t: torch.Tensor, label: str) -> Read:
            src = w.sources.get(id(t))
            read = src.read if src is not None else held(t)
            for other in w.aliases.get(id(t), ()):
                equal.append((_Tied(read, other.read), True, f"{other.label} is {label}"))
            return read

        reads = [read_of(t, label) for t, label in weights]
        frozen_reads = [(read_of(t, label), t, label) for t, label in frozen]
        return cls([label for _, label in weights], reads, equal, list(guards.same), frozen_reads)

    def read(self) -> list[Any] | None:
        try:
            if self._equal_cells and list(map(_CONTENTS, self._equal_cells)) != self._equal_cell_values:
                return None
            if self._equal_values and list(map(_call, self._equal_reads)) != self._equal_values:
                return None
            if self._same_cells and not all(map(operator.is_, map(_CONTENTS, self._same_cells),
                                                self._same_cell_objects)):
                return None
            if self._same_objects and not all(map(operator.is_, itertools.chain(
                    map(_call, self._same_reads), itertools.chain.from_iterable(map(_call, self._same_groups))),
                    self._same_objects)):
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

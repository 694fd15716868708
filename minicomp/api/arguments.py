"""How a call's arguments become the flat tensors minicomp's own capture compiles.

    f(x, [y, z])                      # positional, nested in lists, tuples and dicts
    m(input_ids=ids, attention_mask=mask, labels=None)    # by keyword too

Invariants:
- The own capture compiles a function of tensors. A call's positional and keyword arguments
  are flattened as one pytree; its tensors are the graph's inputs, in pytree order, and
  everything else about the call (the nesting, the keyword names and their order, where a
  None stands) is its `CallShape`, part of the key a specialisation is found by. A call of
  another shape compiles again; `f(x, y)` and `f(x, b=y)` are two shapes, both right.
- Any other leaf (a Python number, a string, an object such as transformers' `Cache`) makes
  the own capture refuse the call (`CaptureRefused`) before anything runs: such values are
  Python state that one static graph would bake in unguarded, and an object's tensors may be
  created or written in place by the call. `minicomp.compile` then goes through Dynamo,
  which guards Python values and functionalises in-place writes (entry.py).
- Input names (in error messages and the generated `call()`) are the parameter names for
  positional tensors and the keyword for keyword tensors when that is a plain identifier;
  `arg{i}` otherwise: a name the caller wrote is never taken as source text unchecked.
"""

from __future__ import annotations

import functools
import inspect
import keyword
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from minicomp.errors import CaptureRefused


@dataclass(frozen=True)
class CallShape:
    """Everything about a call but its tensors: the pytree structure of `(args, kwargs)` (just
    `args` when there are no keywords) and the leaf positions that hold None."""
    spec: Any                      # pytree.TreeSpec (hashable)
    nones: tuple[int, ...]
    keywords: tuple[str, ...]      # the keyword names, in the call's order

    @property
    def plain(self) -> bool:
        """True when the leaves are the positional arguments themselves: fn takes the tensors as they are."""
        return not self.keywords and not self.nones and all(c.is_leaf() for c in self.spec.children())

    @property
    def positional(self) -> int:
        """How many positional arguments the call has."""
        return (self.spec.child(0) if self.keywords else self.spec).num_children

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> tuple[list, dict]:
        """The call's (args, kwargs) with `tensors` in their places."""
        it = iter(tensors)
        leaves = [None if i in self.nones else next(it) for i in range(self.spec.num_leaves)]
        tree = pytree.tree_unflatten(leaves, self.spec)
        return (list(tree[0]), dict(tree[1])) if self.keywords else (list(tree), {})


def flatten_call(name: str, args: Sequence[Any], kwargs: dict[str, Any] | None = None
                 ) -> tuple[list[torch.Tensor], CallShape]:
    """The call's tensors and its shape; CaptureRefused for a leaf that is neither a tensor nor None."""
    tree: Any = (list(args), dict(kwargs)) if kwargs else list(args)
    leaves, spec = pytree.tree_flatten(tree)
    for i, leaf in enumerate(leaves):
        if leaf is not None and not isinstance(leaf, torch.Tensor):
            where = _where(tree, i, bool(kwargs))
            raise CaptureRefused(f"{name} was called with {where} = {_brief(leaf)}; minicomp's own capture takes "
                                 "tensors (and None), positionally or by keyword, nested in lists, tuples and dicts")
    nones = tuple(i for i, leaf in enumerate(leaves) if leaf is None)
    return [t for t in leaves if t is not None], CallShape(spec, nones, tuple(kwargs or ()))


def taking_flat(fn: Callable, shape: CallShape, param_names: list[str], name: str) -> Callable:
    """`fn` as a function of the call's flat tensors, named `name` (capture's messages say it),
    its parameters named for what they hold."""
    @functools.wraps(fn)
    def flat_fn(*tensors: torch.Tensor) -> Any:
        args, kwargs = shape.rebuild(tensors)
        return fn(*args, **kwargs)
    flat_fn.__name__ = flat_fn.__qualname__ = name
    names = _input_names(shape, param_names)
    flat_fn.__signature__ = inspect.Signature(   # type: ignore[attr-defined]  -- read by capture's input_names
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    return flat_fn


def _input_names(shape: CallShape, param_names: list[str]) -> list[str]:
    """One name per tensor: `mask`, `cache_0`, or `arg{i}` where the name is not a plain identifier."""
    positions = pytree.tree_unflatten(list(range(shape.spec.num_leaves)), shape.spec)
    names: list[str] = []
    for path, leaf in pytree.tree_flatten_with_path(positions)[0]:
        if leaf in shape.nones:
            continue
        keys = [k.idx if isinstance(k, pytree.SequenceKey) else k.key for k in path]
        in_kwargs = bool(shape.keywords) and keys[0] == 1
        keys = keys[1:] if shape.keywords else keys
        head = keys[0] if in_kwargs else (param_names[keys[0]] if keys[0] < len(param_names) else f"arg{keys[0]}")
        name = "_".join(str(k) for k in [head, *keys[1:]])
        if not name.isidentifier() or keyword.iskeyword(name):
            name = f"arg{len(names)}"
        while name in names:
            name += "_"
        names.append(name)
    return names


def _where(tree: Any, index: int, keywords: bool) -> str:
    """The argument that holds leaf `index`, as the caller wrote it: `argument 1`,
    `keyword argument cache`, `argument 0[1]['k']`."""
    path = [k.idx if isinstance(k, pytree.SequenceKey) else k.key for k in pytree.tree_flatten_with_path(tree)[0][index][0]]
    if keywords:                                   # the tree is (args, kwargs): path[0] says which
        in_kwargs, path = path[0] == 1, path[1:]
    else:
        in_kwargs = False
    head = f"keyword argument {path[0]}" if in_kwargs else f"argument {path[0]}"
    return head + "".join(f"[{k!r}]" for k in path[1:])


def _brief(value: Any) -> str:
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    return f"a {type(value).__name__}"

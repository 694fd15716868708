"""Shape and dtype by rule for the common cases of the table's ops, without meta tensors.

`graph.infer` first asks `rule(op, operands, attrs)`. It falls back to running the op's
reference on meta tensors only when the rule returns None.

Why: in PyTorch 2.11-2.13 most meta kernels are Python references. They are wrapped in
`torch._disable_dynamo` or call `torch._check`, which import `torch._dynamo` and sympy on
first use: about 900 modules, 3-4 s in a fresh process without bytecode caches (the GPU
host's site-packages). The eager tracer (`frontend/fx_eager.py`) keeps capture off that
import. These rules keep building the IR off it too, for blocks made of float tensors.

The contract is narrow on purpose. A rule answers only for operands it fully understands:
float tensors (plus bool masks where an op takes one) whose shapes fit. For anything else,
including every case where PyTorch would raise, it returns None. The meta reference then
gives PyTorch's own answer or PyTorch's own error. `tests/test_shapes.py` checks, over random
ops, shapes and dtypes, that every answer a rule gives is the meta reference's answer.

Each rule is written with its op, in the op table (`OpDef.shape`; the shared building blocks
are in `ops/rules.py`); `RULES` is the table's rules by op name.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

from minicomp.ir import ops
from minicomp.ir.ops.rules import Operand, Result, Rule, broadcast

__all__ = ["RULES", "broadcast", "rule"]


class _Rules(Mapping):
    """The table's shape rules by op name: a live view, so an op registered later has its rule."""

    def __getitem__(self, op: str) -> Rule:
        d = ops.REGISTRY.get(op)
        if d is None or d.shape is None:
            raise KeyError(op)
        return d.shape

    def __iter__(self) -> Iterator[str]:
        return (name for name, d in ops.REGISTRY.items() if d.shape is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


RULES: Mapping[str, Rule] = _Rules()


def rule(op: str, operands: Sequence[Operand], attrs: dict) -> Result:
    """The shape and dtype of `op` by rule, or None: the meta reference decides."""
    fn = RULES.get(op)
    if fn is None:
        return None
    try:
        return fn(list(operands), attrs)
    except (KeyError, TypeError, ValueError):
        return None

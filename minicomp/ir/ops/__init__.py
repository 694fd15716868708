"""The op table: every operator minicomp knows, each written once, in one `OpDef`.

An entry holds what every stage needs to know about its op:
- `name`, `kind` (how the planner treats it: input, constant, pointwise, reduction, scan,
  view, gemm, attention, opaque; a scan shares a reduction's row kernel), `arity` and
  `attrs` (attribute names, all required);
- `ref`, the PyTorch reference (`ref(*tensors, **attrs)`): the reference interpreter,
  constant folding, the DSL's compile-time folding and meta-tensor inference all run it, so
  broadcasting and type promotion follow PyTorch exactly;
- `shape`, a fast shape/dtype rule (`rules.py`) that `graph.infer` asks before the meta
  reference (`shapes.py` says why);
- `aten`, the aten overloads the fx frontend lowers to this op. The frontend lowers each one
  generically (tensor arguments become operands, schema arguments named like `attrs` become
  attributes) unless `frontend/fx_ops*.py` writes a handler for that name;
- `triton`, the Triton text of a pointwise op, and `operands`, how codegen converts each
  operand value before the form sees it (`OPERANDS`). Ops without a form name the code that
  writes them in `emitter` (reductions, views, GEMM and attention have emitters of their own);
- `pytorch`, the PyTorch text of the op, for groups that run without a kernel;
- `flops_per_element`, the ledger's count.

Layering, and the choice it forces: the IR imports nothing above it, yet an op's Triton
text is written here. So the forms are text over texts. Codegen keeps its value records
(`codegen/tlexpr.py`: literal or tensor, rounded or not) and converts each operand as the
entry's `operands` says; a Triton form `form(x, dtype, attrs) -> str` only combines the
converted texts `x`, knowing the node's `dtype` and attributes. A string form is a template
over `{0}`, `{1}`... and numeric attributes by name (`{negative_slope}`, a literal of the
compute type). The few spellings forms need (Triton dtypes, literals, the NaN flag) and
`Unsupported`, which a form raises for operands it has no exact text for (the group then
runs through PyTorch), moved down into `text.py`; codegen re-exports them. Moving codegen's
value records into the IR instead would have put kernel bookkeeping at the bottom.

`ATEN` maps every aten overload name the table claims to its op or composite (each is
claimed once); `RUNS_IN_PYTORCH` lists the ones whose group has no kernel yet, and why.

Families, registered in this order (the DSL lists its builtins in it): leaves.py (input,
constant, opaque), arith.py (binary ops), unary.py (math and activations), select.py (where,
cast, index-dependent generators), bitwise.py (bitwise ops, shifts), rounding.py (floor ...
round, sign, floor division, remainder), special.py (expm1, erfc, erfinv, predicates, xlogy,
lerp, tensor powers), activations.py (elu, hardswish, softplus, ...), indexing.py (index,
gather: indirect loads), reductions.py (with the composites of multi-output reductions),
scans.py, views.py, linalg.py (matmul, attention). `mathtext.py` holds the Triton texts of
what Triton lacks.
`composite.py` names what aten lowers to several ops (softmax, layer_norm, ...).
Adding a pointwise op is one `register(OpDef(...))` in a family file plus its tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

import torch

from minicomp.ir.ops.rules import Rule
from minicomp.ir.ops.text import Steps, Unsupported, py_literal, py_value

KINDS = ("input", "constant", "pointwise", "reduction", "scan", "view", "gemm", "attention", "opaque")

# How codegen converts operand values before an op's Triton form sees them (codegen/tlexpr.py):
OPERANDS = {
    "result": "each to the node's dtype; when all are literals the first becomes a tensor",
    "promoted": "each to the promotion of the operands' dtypes (comparisons), same literal rule",
    "bool": "each to a bool tensor",
    "own": "each to a tensor of its own dtype; the form is given the first operand's dtype, not the node's",
    "tensors": "each to a tensor of the node's dtype, literals too (forms that call tl functions on every operand)",
    "cond": "the first to a bool tensor, the others to the node's dtype",
}

# Who writes the Triton code of an op that has no `triton` form.
EMITTERS = {
    "expr": "its Triton form, by codegen/tlexpr.py",
    "cast": "codegen/tlexpr.py cast_text (rounding of half types)",
    "index": "codegen/lowering.py (its value depends on the element's index)",
    "literal": "codegen/lowering.py (a literal that broadcasts)",
    "size": "codegen/lowering.py (a size over symbols, from the kernel's size arguments)",
    "view": "codegen/lowering.py (moves the index; no code of its own)",
    "load": "codegen/lowering.py (a load, or a literal)",
    "indirect": "codegen/indirect.py (a load at positions an index tensor holds)",
    "reduction": "codegen/reduction.py",
    "scan": "codegen/scan.py (inside the row kernel of codegen/reduction.py)",
    "gemm": "codegen/gemm.py",
    "attention": "codegen/attention.py",
    "pytorch": "codegen/fallback.py (always runs through PyTorch)",
}

TritonForm = Callable[[Sequence[str], torch.dtype, Mapping[str, Any]], Union[str, Steps]]
TorchForm = Callable[[Sequence[str], Mapping[str, Any], tuple[int, ...]], str]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    ref: Callable[..., torch.Tensor]
    arity: int | None = 1              # number of tensor operands; None = variadic
    flops_per_element: float = 1.0     # pointwise/reduction: flops per element (output / input)
    commutative: bool = False
    triton: Union[str, TritonForm, None] = None   # pointwise form; None: `emitter` writes the op
    attrs: tuple[str, ...] = ()        # attribute names the op takes (all required)
    indexed: bool = False              # pointwise op whose value depends on the element index
    aten: tuple[str, ...] = ()         # aten overloads lowered to it ("add.Tensor", "minicomp::sdpa.default")
    shape: Rule | None = None          # fast shape/dtype rule; None: the meta reference decides
    operands: str = "result"           # conversion of operand values for `triton` (OPERANDS)
    pytorch: Union[str, TorchForm, None] = None   # PyTorch text: template over "{0}".. and "{attr}"
    emitter: str = "expr"              # EMITTERS: who writes its Triton code

    def triton_text(self, x: Sequence[str], dtype: torch.dtype, attrs: Mapping[str, Any]) -> str | Steps:
        """Triton text of the op over converted operand texts `x` (`Steps` when it needs temporaries)."""
        if self.triton is None:
            raise Unsupported(f"op {self.name!r} has no Triton form ({EMITTERS[self.emitter]} writes it)")
        if isinstance(self.triton, str):
            # numeric attributes are literals of the compute type: "{0} * {negative_slope}"
            shown = {k: py_literal(v, dtype) for k, v in attrs.items() if type(v) in (bool, int, float)}
            return self.triton.format(*x, **shown)
        return self.triton(x, dtype, attrs)

    def torch_text(self, x: Sequence[str], attrs: Mapping[str, Any], shape: tuple[int, ...]) -> str | None:
        """PyTorch text of the op over operand names `x`; None when it has none."""
        if self.pytorch is None:
            return None
        if isinstance(self.pytorch, str):
            # attributes print as Python values; sequences as tuples (axes, shapes, dims)
            shown = {k: py_value(tuple(v) if isinstance(v, list) else v) for k, v in attrs.items() if k in self.attrs}
            return self.pytorch.format(*x, **shown)
        return self.pytorch(x, attrs, shape)


REGISTRY: dict[str, OpDef] = {}
ATEN: dict[str, str] = {}          # aten overload name -> the op or composite it lowers to

# Overloads that lower, but whose group runs through PyTorch today, and why. docs/ops.md shows
# it; tests/test_aten_lowerings.py checks that each really falls back (and that no other does).
RUNS_IN_PYTORCH: dict[str, str] = {
    "dot.default": "the GEMM emitter takes matrices, not a 1-D operand",
    "mv.default": "the GEMM emitter takes matrices, not a 1-D operand",
    "addmv.default": "the GEMM emitter takes matrices, not a 1-D operand",
}


def claim_aten(names: Sequence[str], owner: str) -> None:
    """Record that `names` lower to `owner`; each name is claimed once in the whole table."""
    for name in names:
        assert name not in ATEN, f"{name} is claimed by both {ATEN[name]} and {owner}"
        ATEN[name] = owner


def register(op: OpDef) -> OpDef:
    assert op.kind in KINDS, op.kind
    assert op.name not in REGISTRY, op.name
    assert op.operands in OPERANDS, (op.name, op.operands)
    assert op.emitter in EMITTERS, (op.name, op.emitter)
    assert (op.triton is not None) == (op.emitter == "expr"), f"{op.name}: a Triton form, or an emitter"
    REGISTRY[op.name] = op
    claim_aten(op.aten, op.name)
    return op


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def _count(n):
    """A flop count: an int, or an expression of symbolic sizes (minicomp.ir.dims.Expr)."""
    return n if hasattr(n, "terms") else int(n)


def flops(op: str, arg_shapes: list[tuple[int, ...]], out_shape: tuple[int, ...], attrs: dict) -> int:
    """Flops of one node by the ledger's accounting (2 per multiply-add)."""
    d = get(op)
    if d.kind in ("pointwise",):
        return _count(d.flops_per_element * math.prod(out_shape))
    if d.kind in ("reduction", "scan"):
        return _count(d.flops_per_element * math.prod(arg_shapes[0]))
    if d.kind == "gemm":
        k = arg_shapes[0][-1]
        return 2 * math.prod(out_shape) * k
    if d.kind == "attention":
        q, kk = arg_shapes[0], arg_shapes[1]
        sq, sk, dh = q[-2], kk[-2], q[-1]
        batch_heads = math.prod(q[:-2])
        total = 4 * batch_heads * sq * sk * dh  # QK^T and PV, two flops per multiply-add
        if attrs.get("is_causal"):
            total //= 2
        return total
    return 0


# The families register themselves, in the order the table lists ops.
from minicomp.ir.ops import (  # noqa: E402,F401,I001
    leaves, arith, unary, select, bitwise, rounding, special, activations, indexing, reductions, scans, views,
    linalg,
    composite)
from minicomp.ir.ops.composite import COMPOSITES, Composite  # noqa: E402

__all__ = ["ATEN", "COMPOSITES", "Composite", "EMITTERS", "KINDS", "OPERANDS", "OpDef", "REGISTRY",
           "RUNS_IN_PYTORCH", "Unsupported", "flops", "get", "register"]

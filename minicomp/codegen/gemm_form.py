"""What a GEMM group's kernel is, before any text: its operands folded to memory and its form
(pointer loads or TMA descriptors). `gemm.py` writes the text.

The group's `GemmSpec` (minicomp/plan/specs.py) says what the planner decided: the matmuls
(the anchor first), the operands each reads and the output shape. This module derives what
depends on strides, which are chosen after planning: each operand's view chain folded into
an offset (`epilogue.fold_operand`), and the batch dims that fold into M (those operand B
does not read). It raises `Unsupported` (the group then runs through PyTorch) for what the
kernel cannot do: 1-D operands (matrix-vector), dtypes other than fp32/fp16/bf16, matmuls
of different shapes or not sharing operand A once folded, an output of another shape.

Which configs its autotuner tries is `gemm_configs.py`'s. An operand whose rows a descriptor
cannot read is copied in call() into padded rows (`pad_functions`, `pad_text`).

Index symbols: `am`/`ak` (A tile rows/cols), `bk`/`bn` (B tile), `rm`/`rn` (output tile),
`z0`, `z1`... (batch coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, Unsupported, group_spec
from minicomp.codegen.epilogue import Operand, fold_operand
from minicomp.ir import dims
from minicomp.ir.graph import contiguous_strides
from minicomp.plan.rules import regroups
from minicomp.plan.specs import GemmSpec

DOT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class GemmForm:
    """The GEMM as the kernel computes it: the plan's matmuls with operands folded to memory."""
    mms: list[int]             # the matmuls, anchor first; all share operand A
    shape: tuple[int, ...]     # the matmul output shape [..., M, N]
    batch: tuple[int, ...]     # batch dims decoded from the program id (the rest folded into M)
    m: int                     # M after folding
    n: int
    k: int
    out_idx: ix.Index          # the output tile's index (symbols rm, rn, z*)
    a: Operand
    bs: list[Operand]


def _batch_and_m(batch: tuple[int, ...], m: int, nfold: int, msym: str) -> tuple[list[ix.Expr], ix.Expr, int]:
    """Exprs of each batch coordinate and of M when the innermost `nfold` batch dims fold into M."""
    keep = len(batch) - nfold
    folded_m = math.prod(batch[keep:]) * m
    s = ix.sym(msym, folded_m)
    zs = [ix.sym(f"z{i}", batch[i]) for i in range(keep)]
    below, inner = m, []
    for i in reversed(range(keep, len(batch))):
        inner.insert(0, ix.mod(ix.floordiv(s, below), batch[i]))
        below *= batch[i]
    return zs + inner, ix.mod(s, m), folded_m


def _operands(ctx: KernelCtx, spec: GemmSpec, nfold: int) -> tuple[Operand, list[Operand]]:
    g = ctx.graph
    first = g.node(spec.matmuls[0])
    batch, (m, n) = first.shape[:-2], first.shape[-2:]
    k = g.node(spec.operands[0][0]).shape[-1]
    za, ma, _ = _batch_and_m(batch, m, nfold, "am")
    zb, _, _ = _batch_and_m(batch, m, nfold, "bm")   # B never depends on folded dims (checked)
    a_full = ix.dims_index(tuple(batch) + (m, k), za + [ma, ix.sym("ak", k)])
    b_full = ix.dims_index(tuple(batch) + (k, n), zb + [ix.sym("bk", k), ix.sym("bn", n)])
    a_op, bs = None, []
    for nid, (a_id, b_id) in zip(spec.matmuls, spec.operands):
        a = fold_operand(ctx, a_id, ix.broadcast(a_full, g.node(a_id).shape))
        if a_op is None:
            a_op = a
        elif (a.leaf, a.casts, a.offset) != (a_op.leaf, a_op.casts, a_op.offset):
            raise Unsupported(f"{g.node(nid).describe()}: the matmuls of one group must share operand A")
        bs.append(fold_operand(ctx, b_id, ix.broadcast(b_full, g.node(b_id).shape)))
    return a_op, bs


def analyse(ctx: KernelCtx) -> GemmForm:
    """The group's GEMM (its `GemmSpec`) with the operands folded to memory."""
    g, group = ctx.graph, ctx.group
    spec = group_spec(ctx, GemmSpec)
    mms, shape = list(spec.matmuls), spec.shape
    for nid, (a_id, b_id) in zip(mms, spec.operands):
        node, a, b = g.node(nid), g.node(a_id), g.node(b_id)
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise Unsupported(f"{node.describe()}: matrix-vector product (1-D operand)")
        if a.dtype not in DOT_DTYPES or b.dtype != a.dtype:
            raise Unsupported(f"{node.describe()}: matmul of {a.dtype} x {b.dtype}")
        if node.shape != shape:
            raise Unsupported(f"{node.describe()}: the matmuls of one group differ in shape")
    for out in group.outputs:       # or the rows grouped otherwise (plan/rules.py): the same elements
        if g.node(out).shape != shape and not regroups(g.node(out).shape, shape):
            raise Unsupported(f"{g.node(out).describe()}: output shape differs from the matmul's")

    batch, (m, n) = shape[:-2], shape[-2:]
    k = g.node(spec.operands[0][0]).shape[-1]
    # fold the innermost batch dims that B does not read into M
    _, bs = _operands(ctx, spec, 0)
    used = set().union(*(ix.syms(b.offset) for b in bs))
    nfold = 0
    while nfold < len(batch) and f"z{len(batch) - 1 - nfold}" not in used:
        nfold += 1
    a_op, bs = _operands(ctx, spec, nfold)
    for b in bs:
        if ix.syms(b.offset) - {"bk", "bn"} - {f"z{i}" for i in range(len(batch) - nfold)}:
            raise Unsupported("operand B depends on a folded batch dim")  # cannot happen; be safe
    zs, mo, folded_m = _batch_and_m(batch, m, nfold, "rm")
    out_idx = ix.dims_index(shape, zs + [mo, ix.sym("rn", n)])
    return GemmForm(mms, shape, tuple(batch[:len(batch) - nfold]), folded_m, n, k, out_idx, a_op, bs)


@dataclass
class TmaOperand:
    """A matrix operand as a TMA descriptor sees it: `rows x cols` with unit stride along cols."""
    ld: int               # leading stride, elements
    transposed: bool      # stored the other way round: A as [K, M], B as [N, K] (nn.Linear)
    pad: tuple[int, int] | None = None   # (L, P): read from a copy whose last dim L is padded to P


# An operand whose leading stride is not 16-byte aligned (an odd K: rows start 2 bytes apart) is
# copied, per call, into a buffer whose rows are (`_pad_text`), when the GEMM reuses each of its
# elements at least this many times (the dimension it does not span): the copy then costs about
# 2 * 160 / reuse of the GEMM's time at the H200's balance of ~160 FLOP/byte (estimated, not
# measured), against the pointer form's unvectorised loads of misaligned rows (0.40x cuBLAS at
# 4096 x 4095 x 4096, ceilings.md).
PAD_MIN_REUSE = 1024


def _tma_operand(ctx: KernelCtx, op: Operand, row: str, col: str, ranges: dict[str, object],
                 reuse: object) -> TmaOperand | None:
    """How `op` reads a plain matrix indexed (row, col), or None when a descriptor cannot say it.
    `ranges`: each index symbol's size; `reuse`: the GEMM dimension the operand does not span."""
    if op.casts or op.dtype not in (torch.float16, torch.bfloat16) or dims.is_symbolic(op.offset.const) \
            or op.offset.const:
        return None
    coeff = {}
    for atom, k in op.offset.terms:
        if not isinstance(atom, ix.Sym) or atom.name not in (row, col):
            return None
        if dims.is_symbolic(k):
            return None        # alignment would depend on the sizes: the pointer form serves them all
        coeff[atom.name] = k
    elem, unit = op.dtype.itemsize, 16 // op.dtype.itemsize
    # One row (a decode step's token) or one column: the index folded its symbol away. Its stride
    # never addresses memory, so any multiple of 16 bytes serves: the least that spans the other
    for sym, other in ((row, col), (col, row)):
        size, span = ranges.get(sym), ranges.get(other)
        if sym not in coeff and coeff.get(other) == 1 and not dims.any_symbolic((size, span)) and size == 1:
            coeff[sym] = -(-int(span) // unit) * unit
    if set(coeff) != {row, col}:
        return None
    if coeff[col] == 1 and (coeff[row] * elem) % 16 == 0:
        return TmaOperand(coeff[row], False)
    if coeff[row] == 1 and (coeff[col] * elem) % 16 == 0:
        return TmaOperand(coeff[col], True)
    return _padded(ctx, op, row, col, coeff, ranges, reuse)


def _padded(ctx: KernelCtx, op: Operand, row: str, col: str, coeff: dict, ranges: dict,
            reuse: object) -> TmaOperand | None:
    """The operand read from a copy with 16-byte aligned rows, when that is sound and worth it.

    Sound: the leaf is contiguous, the unit-stride symbol spans its whole last dim L and the
    other symbol's coefficient is L, so element (r, c) is row r, column c of the leaf viewed as
    [numel / L, L]; in the copy, laid out [numel / L, P] (P = L rounded up to 16 bytes), it is
    at r * P + c. The descriptor's shape stops at L: the padding is never read."""
    if dims.is_symbolic(reuse) or reuse < PAD_MIN_REUSE:
        return None
    leaf = ctx.graph.node(op.leaf)
    strides = ctx.strides(op.leaf)
    if dims.any_symbolic(tuple(leaf.shape)) or tuple(strides) != contiguous_strides(tuple(leaf.shape)):
        return None
    unit, lead = (col, row) if coeff[col] == 1 else (row, col) if coeff[row] == 1 else (None, None)
    if unit is None:
        return None
    last = leaf.shape[-1]
    if ranges[unit] != last or coeff[lead] != last:
        return None
    per = 16 // op.dtype.itemsize
    return TmaOperand(-(-last // per) * per, unit == row, (last, -(-last // per) * per))


def tma_form(ctx: KernelCtx, spec: GemmForm) -> tuple[TmaOperand, list[TmaOperand]] | None:
    """The operands as TMA descriptors, when the persistent TMA kernel applies (module docstring)."""
    # over symbolic sizes int64 offsets follow the top of the symbols' ranges: descriptors address
    # any size themselves, and the epilogue's offsets are int64 there (`_write_tma_body`)
    wide = needs_int64(ctx) and not ctx.graph.symbolic
    if (ctx.device_type != "cuda" and not ctx.target.tma_on_cpu) or spec.batch or wide:
        return None
    a = _tma_operand(ctx, spec.a, "am", "ak", {"am": spec.m, "ak": spec.k}, spec.n)
    bs = [_tma_operand(ctx, b, "bk", "bn", {"bk": spec.k, "bn": spec.n}, spec.m) for b in spec.bs]
    if a is None or any(b is None for b in bs):
        return None
    if not _pads_agree(ctx, spec, [a] + bs):
        return None
    return a, bs


def _pads_agree(ctx: KernelCtx, spec: GemmForm, tmas: list[TmaOperand]) -> bool:
    """A padded leaf's tensor is replaced by its copy for the whole kernel: every operand read of
    it must use the same padding, and nothing else in the group (an epilogue operand) reads it."""
    pads: dict[int, set] = {}
    for op, t in zip([spec.a] + spec.bs, tmas):
        pads.setdefault(op.leaf, set()).add(t.pad)
    padded = {leaf for leaf, p in pads.items() if p != {None}}
    if not padded:
        return True
    if any(len(pads[leaf]) > 1 for leaf in padded):
        return False
    g, group = ctx.graph, ctx.group
    computed = set(group.nodes) - set(group.inputs)
    allowed = set(spec.mms)
    for pair in group_spec(ctx, GemmSpec).operands:
        for nid in pair:
            while nid in computed:          # the operand's view/cast chain down to its leaf
                allowed.add(nid)
                nid = g.node(nid).args[0]
    return not any(set(g.node(n).args) & padded for n in computed - allowed)


def odd_store(ctx: KernelCtx) -> bool:
    """Some output's rows are not 16-byte aligned: its stores cannot be vectorised."""
    for out in ctx.group.outputs:
        node, strides = ctx.graph.node(out), ctx.strides(out)
        if len(strides) >= 2 and not dims.is_symbolic(strides[-2]) and (strides[-2] * node.dtype.itemsize) % 16:
            return True
    return False


def reads_tile(ctx: KernelCtx, spec: GemmForm) -> bool:
    """The epilogue reads a tensor with as many elements as the output tiles cover (a residual,
    a gate computed elsewhere): a load of a full tile beside the accumulator."""
    operands = {op.leaf for op in [spec.a] + spec.bs}
    out = math.prod(spec.shape)
    return any(nid not in operands and not dims.any_symbolic(tuple(ctx.graph.node(nid).shape))
               and math.prod(ctx.graph.node(nid).shape) >= out
               for nid in ctx.group.inputs)


def needs_int64(ctx: KernelCtx) -> bool:
    """True when some tensor the kernel touches spans 2**31 elements or more (over symbolic
    sizes: at the top of the symbols' ranges, as pointwise kernels decide)."""
    for nid in set(ctx.group.inputs) | set(ctx.group.outputs):
        node = ctx.graph.node(nid)
        if dims.any_symbolic(tuple(node.shape) + tuple(ctx.strides(nid))):
            # layouts are contiguous or permuted, so strides are positive; sizes are >= 2
            span = sum((d - 1) * s for d, s in zip(node.shape, ctx.strides(nid)) if d != 0)
            if dims.bounds(span)[1] >= 2 ** 31 - 1:
                return True
            continue
        span = sum((d - 1) * abs(s) for d, s in zip(node.shape, ctx.strides(nid)) if d > 0)
        if span >= 2 ** 31 - 1:
            return True
    return False


def pad_functions(name: str, spec: GemmForm,
                   tma: tuple[TmaOperand, list[TmaOperand]] | None) -> dict[int, tuple[tuple[int, int], str]]:
    """leaf -> ((L, P), the call()-side function copying it into rows padded from L to P)."""
    if not tma:
        return {}
    pads = {op.leaf: t.pad for op, t in zip([spec.a] + spec.bs, [tma[0]] + list(tma[1])) if t.pad}
    names = {pad: f"{name}_pad{i}" for i, pad in enumerate(sorted(set(pads.values())))}
    return {leaf: (pad, names[pad]) for leaf, pad in pads.items()}


def pad_text(fn: str, last: int, padded: int) -> str:
    """A Python function of call(): the tensor's copy whose last dim's stride is padded (TMA
    descriptors need 16-byte aligned row strides; the kernel reads only the first `last`)."""
    out = CodeBuilder()
    with out.block(f"def {fn}(t):"):
        out.writeline(f"# rows of {last} elements start 16-byte aligned in a [..., {padded}] buffer; "
                      "the padding is never read")
        out.writeline(f"out = torch.empty(tuple(t.shape[:-1]) + ({padded},), dtype=t.dtype, device=t.device)")
        out.writeline(f"return out[..., :{last}].copy_(t)")
    return out.getvalue()

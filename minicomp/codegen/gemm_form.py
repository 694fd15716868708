"""What a GEMM group's kernel is, before any text: its operands folded to memory, its form
(pointer loads or TMA descriptors) and its autotuning configs. `gemm.py` writes the text.

The group's `GemmSpec` (minicomp/plan/specs.py) says what the planner decided: the matmuls
(the anchor first), the operands each reads and the output shape. This module derives what
depends on strides, which are chosen after planning: each operand's view chain folded into
an offset (`epilogue.fold_operand`), and the batch dims that fold into M (those operand B
does not read). It raises `Unsupported` (the group then runs through PyTorch) for what the
kernel cannot do: 1-D operands (matrix-vector), dtypes other than fp32/fp16/bf16, matmuls
of different shapes or not sharing operand A once folded, an output of another shape.

The configs tried follow the problem: the table by form, dtype and fp32 precision (FMA
candidates for "ieee", tensor-core ones for TF32), cut to the tiles that fit, and to the
largest few for a big problem (`BIG_TILES`), plus `ODD_STORE_CONFIG` where a big TMA GEMM's
output rows are misaligned. An operand whose rows a descriptor cannot read is copied in call()
into padded rows (`pad_functions`, `pad_text`).

Index symbols: `am`/`ak` (A tile rows/cols), `bk`/`bn` (B tile), `rm`/`rn` (output tile),
`z0`, `z1`... (batch coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx, Unsupported, group_spec, next_pow2
from minicomp.codegen.epilogue import Operand, fold_operand
from minicomp.ir import dims
from minicomp.ir.graph import contiguous_strides
from minicomp.plan.rules import regroups
from minicomp.plan.specs import GemmSpec

DOT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): Hopper-sized tiles first, then smaller
# ones for small problems; `configs` drops those larger than the problem.
HALF_CONFIGS = [
    (128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4),
    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (32, 64, 64, 4, 4),
]
FP32_CONFIGS = [   # TF32: tensor cores, 32 fp32 (128 bytes) along K
    (128, 128, 32, 3, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (32, 32, 32, 4, 4),
]
# full-precision fp32 (`input_precision="ieee"`: FMA, no tensor cores): each thread's share of a
# larger output tile reuses each operand element it reads from shared memory more often, and a
# shorter K block leaves registers and shared memory for it. Candidates, not measured yet:
# 2048^3 ran at 0.89x cuBLAS with FP32_CONFIGS (ceilings.md); the autotuner picks. One entry more
# than FP32_CONFIGS: each is a compile on the first call
IEEE_CONFIGS = [
    (128, 128, 32, 3, 8), (128, 256, 16, 3, 8), (128, 128, 16, 4, 8), (64, 128, 32, 4, 4),
    (64, 64, 32, 4, 4), (32, 32, 32, 4, 4),
]
DUAL_CONFIGS = [  # two accumulators: smaller tiles per warp
    (128, 128, 64, 3, 8), (128, 64, 64, 4, 4), (64, 128, 64, 3, 4), (64, 64, 64, 4, 4), (32, 64, 64, 4, 4),
]
# the TMA form (persistent): the ablation's best three, then smaller tiles for small problems
TMA_CONFIGS = [
    (128, 256, 64, 3, 8), (128, 128, 64, 5, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4),
]
# Few rows (a static M of at most SKINNY_ROWS after folding: decode, batch 1 x 16): the GEMM
# streams B and reads A once, so its time is B's bytes over the bandwidth the programs keep in
# flight. Tiles of 16 rows waste no MMA rows on padding, narrow column blocks give N / BLOCK_N
# programs to spread B's read over the SMs, and long K blocks with several stages keep each
# SM's loads in flight. A candidate table, beside the smallest of the general one; the
# autotuner picks (not measured on a GPU when written: compare MINICOMP_LIBRARY_GEMM=0 at
# batch 1 x 16, where every GEMM is ours, against the default's cuBLAS calls)
SKINNY_ROWS = 64
SKINNY_MIN_KN = 256
SKINNY_CONFIGS = [
    (16, 32, 256, 4, 4), (16, 16, 256, 4, 4), (16, 64, 256, 3, 4), (16, 64, 128, 4, 4),
    (32, 32, 256, 4, 4), (64, 32, 128, 4, 4), (32, 64, 64, 4, 4),
]
SKINNY_DUAL_CONFIGS = [   # two B tiles a K step
    (16, 32, 256, 3, 4), (16, 16, 256, 4, 4), (16, 64, 128, 3, 4), (32, 32, 128, 4, 4), (32, 64, 64, 4, 4),
]
# 128x256 output tiles at least this many (two waves on 132 SMs): only the largest configs are tried
BIG_TILES = 264
CPU_PROGRAMS = 3        # the TMA form's persistent grid under the interpreter (a program walks several tiles)
GROUP_M = 8


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
    elem = op.dtype.itemsize
    for sym, other in ((row, col), (col, row)):
        size, span = ranges.get(sym), ranges.get(other)
        if sym not in coeff and coeff.get(other) == 1 and not dims.any_symbolic((size, span)) and size == 1:
            # One row (a decode step's single token) or one column: the index folded its symbol
            # away. Its stride never addresses memory, and a descriptor takes any multiple of 16
            # bytes there: the smallest that spans the other dim
            unit = 16 // elem
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


def _cap(size, least: int) -> float:
    """The largest block worth trying along a dimension: its size rounded up to a power of two
    (at least `least`); a symbolic size caps nothing (the autotuner picks per size bucket)."""
    return float("inf") if dims.is_symbolic(size) else max(least, next_pow2(size))


# A big TMA GEMM with a long epilogue: output rows not 16-byte aligned (N = 50257: an lm_head),
# stored element by element, or a tile of the output's size read from memory (the residual of
# o_proj/down_proj, the gate cuBLAS wrote for SwiGLU's up projection, `library_plan.split_pairs`).
# A tile-loading epilogue runs after the K loop (flattening the loops made it slower: gemm.py's
# "auto" form), not overlapping the next tile's loads, and a 128x256 tile's fp32 accumulator (128
# registers a thread at 8 warps) leaves little room for a loaded tile beside it: on the H100
# our GEMM with SiLU(gate) * up in its epilogue took 89.6 us where cuBLAS's plain GEMM of the
# shape took 59 (results/2026-12-06/session18-*). This config's
# 96 KiB of shared memory lets two programs share an SM, and it launches two per SM
# (`programs_per_sm`), so one runs its epilogue while the other computes. A candidate beside
# the 128x256 one, which keeps one program per SM; the autotuner picks
ODD_STORE_CONFIG = (128, 128, 64, 3, 8)


def programs_per_sm(spec: "GemmForm", tma: bool, cfg: tuple) -> int:
    """How many persistent programs of config `cfg` the TMA form launches per SM."""
    return 2 if tma and len(spec.mms) == 1 and cfg == ODD_STORE_CONFIG else 1


def configs(spec: GemmForm, device_type: str, tma: bool = False, precision: str = "ieee",
            long_epilogue: bool = False) -> list[tuple[int, int, int, int, int]]:
    if device_type != "cuda":
        # interpreter: few, large programs; a symbolic size gets the largest block
        clamp = lambda v: min(_cap(v, 16), 64)  # noqa: E731
        return [(clamp(spec.m), clamp(spec.n), clamp(spec.k), 1, 4)]
    table = DUAL_CONFIGS if len(spec.mms) > 1 else (
        TMA_CONFIGS if tma else HALF_CONFIGS if spec.a.dtype != torch.float32 else
        IEEE_CONFIGS if precision == "ieee" else FP32_CONFIGS)
    if skinny(spec):
        table = SKINNY_DUAL_CONFIGS if len(spec.mms) > 1 else SKINNY_CONFIGS
    fit = [c for c in table if c[0] <= _cap(spec.m, 32) and c[1] <= _cap(spec.n, 32) and c[2] <= _cap(spec.k, 32)]
    if dims.any_symbolic((spec.m, spec.n, spec.k)):
        # every size: the table's first three (what a big problem keeps, `big_from` times only
        # those) and its two smallest for small buckets; each config is a compile on the first call
        small = [c for c in fit[3:] if c[0] * c[1] <= 64 * 128][-2:]
        return (fit[:3] + small) or [min(table, key=lambda c: c[0] * c[1])]
    if -(-spec.m // 128) * -(-spec.n // 256) >= BIG_TILES:
        # a big problem: small tiles never win, and each config autotuned costs a compile of
        # seconds on the first call (a block's first call took 26-34 s, mostly that). The TMA
        # form's 128x256 config won all four cases of the ablation (two shapes x two weight
        # layouts, by 5-10%), so it alone is compiled; two or three configs otherwise
        fit = fit[:1] if tma and len(spec.mms) == 1 else fit[:2] if len(spec.mms) > 1 else fit[:3]
    if tma and len(spec.mms) == 1 and long_epilogue and fit and ODD_STORE_CONFIG[0] <= _cap(spec.m, 32) \
            and ODD_STORE_CONFIG[1] <= _cap(spec.n, 32):
        fit = fit + [ODD_STORE_CONFIG]
    return fit or [min(table, key=lambda c: c[0] * c[1])]


def skinny(spec: GemmForm) -> bool:
    """A GEMM of few rows (a static M of at most SKINNY_ROWS) over fp16/bf16 operands whose B
    is worth streaming (static K and N of at least SKINNY_MIN_KN): it takes SKINNY_CONFIGS."""
    sizes = (spec.m, spec.k, spec.n)
    return (not dims.any_symbolic(sizes) and spec.m <= SKINNY_ROWS and min(spec.k, spec.n) >= SKINNY_MIN_KN
            and spec.a.dtype in (torch.float16, torch.bfloat16))


def big_from(spec: GemmForm) -> tuple[int, dict[str, int]] | None:
    """Over a symbolic M with N concrete: from which M bucket on the problem is big (128x256
    tiles at least BIG_TILES), so a sweep times only the table's first three configs as a
    static kernel's does; None otherwise (`sizes.tune_tail`'s `top`)."""
    if not dims.is_symbolic(spec.m) or dims.any_symbolic((spec.n, spec.k)):
        return None
    rows = -(-BIG_TILES // -(-spec.n // 256))
    return 3, {"m_bucket": next_pow2(rows * 128)}


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

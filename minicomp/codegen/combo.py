"""Two small pointwise groups launched as one kernel (a combo kernel).

A RoPE model rotates q and k in two pointwise groups: their shapes differ (16 query heads, 8
key heads in the benchmark's Llama), so the planner cannot make them one kernel over one
iteration space, and each is a launch of a few microseconds of GPU time. At the start of a
call the GPU waits for the host at every such launch (session 21's timeline: the host needs
15-20 us a launch on the H100 machines, the GPU 3-5 us for one of these), and every launch
costs the host that time again in a call the host bounds.

When two groups that come one after the other in the launch order (`codegen/order.py`) are
both flat pointwise kernels of static sizes, neither reads what the other writes, and each is
small (`COMBO_MAX_US` of the ledger's bound), they run as one kernel: the first
`cdiv(n_a, BLOCK)` programs compute the first group's blocks, the rest the second's. Each
group's body is the text its own kernel would hold (`pointwise._build`), in a `@triton.jit`
function of its own that takes the block's number (`<kernel>_a`, `<kernel>_b`: locals stay
apart, Triton inlines them), and the kernel branches on the program id. The autotuner picks
one BLOCK for both, keyed on both sizes.

Invariants: the plan is unchanged (the groups, their outputs and the ledger are the plan's;
only the launch is shared, and the module's summary says which two share it); the two groups
write disjoint outputs and neither reads the other's, so the order of their blocks does not
matter; a tiled form (a transpose or a row broadcast), a view, symbolic sizes or an empty group
keep their own kernels.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from minicomp.codegen import gemm_combo
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, kernel_name, next_pow2
from minicomp.codegen.names import comment_text
from minicomp.codegen.pointwise import (CPU_BLOCK, CUDA_CONFIGS, _build, _wants_tiles, as_view, autotune_decorator,
                                        fixed_config, io_comment, needs_int64)
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.graph import Graph
from minicomp.plan.records import Group

# The ledger's lower bound (us) under which a pointwise group is small enough to share a launch:
# above it the group's own autotuned block size is worth more than a launch. Llama's q and k
# rotations at 4 x 512 read and write 8 and 4 MiB (about 5 and 3 us on the H200 model).
COMBO_MAX_US = 20.0


def partners(graph: Graph, order: list[Group], index: int, forced: dict, target) -> list[Group]:
    """The groups after `order[index]` that may share its launch: the next pointwise group
    (`eligible`), or sibling GEMMs reading the same A (codegen/gemm_combo.py; on CUDA, or the
    interpreter's TMA form in tests); [] for none."""
    first = order[index]
    if first.kind == "gemm" and (target.device_type == "cuda" or target.tma_on_cpu):
        return gemm_combo.partners(graph, order, index, forced, target.gemm_combo)
    after = order[index + 1] if index + 1 < len(order) else None
    return [after] if after is not None and eligible(graph, first, after, forced) else []


def emit(ctxs: list[KernelCtx]) -> tuple[Kernel, int] | None:
    """One kernel for the first groups of `ctxs` (`partners` chose them) and how many it computes,
    or None where the first two cannot share one (the first group is then written on its own)."""
    if ctxs[0].group.kind == "gemm":
        return gemm_combo.emit_run(ctxs)
    kernel = emit_pair(*ctxs) if len(ctxs) == 2 else None
    return None if kernel is None else (kernel, 2)


def partner_comments(groups: list[Group]) -> list[str]:
    """call()'s comment line for each group after the first that shares its launch."""
    first = groups[0]
    how = "codegen/gemm_combo.py" if first.kind == "gemm" else "codegen/combo.py"
    return [f"# group {g.id}: {comment_text(f'{g.kind} {g.name}'.strip())} [{', '.join(f'%{n}' for n in g.nodes)}] "
            f"(one launch with group {first.id}: {how})" for g in groups[1:]]


def eligible(graph: Graph, first: Group, second: Group, forced: dict) -> bool:
    """Whether `second`, launched right after `first`, may share its launch (module docstring);
    the kernels' own forms are checked when they are written (`emit_pair`)."""
    return (first.kind == second.kind == "pointwise" and not graph.symbolic
            and first.id not in forced and second.id not in forced
            and not set(first.outputs) & set(second.inputs)
            and all(0 < g.lower_bound_us < COMBO_MAX_US for g in (first, second)))


class _Part(NamedTuple):
    """One group's half of a combo kernel: what its flat pointwise kernel would hold."""
    tensors: list[int]       # read, then written
    pointers: list[str]      # their parameter names
    numel: int
    body: CodeBuilder
    wide: bool               # int64 offsets


def _part(ctx: KernelCtx) -> _Part | None:
    """The group's flat pointwise kernel as a `_Part`; None where its kernel is not one."""
    graph, group = ctx.graph, ctx.group
    if not group.outputs or as_view(ctx) is not None:
        return None
    shape = graph.node(group.outputs[0]).shape
    if any(graph.node(o).shape != shape for o in group.outputs):
        return None
    numel = math.prod(shape)
    try:
        if numel == 0 or _wants_tiles(ctx, shape):
            return None
    except SymbolicDim:
        return None
    low, body = _build(ctx, shape, tiled=False)
    reads = [n for n in low.pointers if n not in group.outputs]
    tensors = reads + list(group.outputs)
    return _Part(tensors, [low.pointers[n].name for n in tensors], numel, body, needs_int64(ctx, list(low.pointers), numel))


def emit_pair(first: KernelCtx, second: KernelCtx) -> Kernel | None:
    """One kernel computing both groups (module docstring), or None when either group's kernel
    is not a flat pointwise one."""
    a, b = _part(first), _part(second)
    if a is None or b is None:
        return None
    name = kernel_name(first, "pw2")
    sizes = ("n_elements", "n_elements_1")
    params: dict[str, int] = {}                 # pointer name -> tensor, in the order of first use
    for part in (a, b):
        for nid, p in zip(part.tensors, part.pointers):
            params.setdefault(p, nid)
    src = CodeBuilder()
    for part, suffix, ctx in ((a, "a", first), (b, "b", second)):
        src.writeline("@triton.jit")
        with src.block(f"def {name}_{suffix}({', '.join(part.pointers)}, n_elements, pid, BLOCK: tl.constexpr):"):
            src.writelines(io_comment(ctx, part.tensors[:-len(ctx.group.outputs)], ctx.group.outputs))
            src.writeline(f"offs = {'pid.to(tl.int64)' if part.wide else 'pid'} * BLOCK + tl.arange(0, BLOCK)")
            src.writeline("mask = offs < n_elements")
            src.splice(part.body.getvalue())
        src.writelines(["", ""])
    n_a, n_b = a.numel, b.numel
    configs: list[tuple[dict, int]] = []
    if first.device_type == "cuda":
        configs = [({"BLOCK": b}, w) for b, w in CUDA_CONFIGS if b <= max(next_pow2(max(n_a, n_b)), CUDA_CONFIGS[0][0])]
        src.writelines(autotune_decorator(configs, list(sizes)))
    src.writeline("@triton.jit")
    with src.block(f"def {name}({', '.join(params)}, {', '.join(sizes)}, BLOCK: tl.constexpr):"):
        src.writeline(f"# groups {first.group.id} and {second.group.id} in one launch: the first "
                      "cdiv(n_elements, BLOCK) programs compute the first")
        src.writeline("pid = tl.program_id(0)")
        src.writeline("first_blocks = tl.cdiv(n_elements, BLOCK)")
        with src.block("if pid < first_blocks:"):
            src.writeline(f"{name}_a({', '.join(a.pointers)}, n_elements, pid, BLOCK)")
        with src.block("else:"):
            src.writeline(f"{name}_b({', '.join(b.pointers)}, n_elements_1, pid - first_blocks, BLOCK)")
    args = tuple(Buf(nid) for nid in params.values()) + (n_a, n_b)
    if first.device_type == "cuda":
        launch = Launch(Grid.of(Blocks(n_a, "BLOCK", more=(n_b,))), args, fixed_config(configs))
    else:
        block = min(CPU_BLOCK, next_pow2(max(n_a, n_b)))
        launch = Launch(Grid.of(-(-n_a // block) + -(-n_b // block)), args, (("BLOCK", block),))
    return Kernel(name, src.getvalue(), [launch])

"""The index checks `call()` makes before a kernel that reads through index tensors.

For every indirect load a kernel group computes (`index`, `gather`), each index operand is
either known good by its static range (ir/ranges.py: `arange` position ids, constants,
take_along_dim's modulo), or read from a tensor in memory (`memory_sources`): then call() checks
that tensor, as the kernel reads it (through the same views: a slice checks only the part
the kernel reads), before launching: `_rt.check_index(ids.reshape((6,)), 0, 50256, 0, 50257,
'IndexError', '%5 (index) from model.py:12 (F.embedding(idx, w))')` (minicomp/runtime/checks.py).
One index tensor checked for one range is checked once per call: a later group reading it
again (an embedding the planner recomputes in two kernels) finds it checked (`lines(ctx, done)`).
On CUDA a check is a few small launches (two comparisons, `all`, an asynchronous assert).

Why in call() and not in the kernel: Triton's interpreter ignores `tl.device_assert`, and on
a GPU it is compiled only in debug mode; a check here raises eager's kind of error on the CPU
and costs one pass over the (small) index tensor. Groups that run through PyTorch need no
check: eager PyTorch raises its own error there.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.codegen.common import KernelCtx
from minicomp.codegen.indirect import OPS
from minicomp.ir import ops
from minicomp.ir.graph import Graph
from minicomp.ir.ops.indexing import MODES
from minicomp.ir.ranges import memory_sources, value_range, within


@dataclass(frozen=True)
class IndexCheck:
    """Check tensor `root`, read through `chain` (views and casts, root side first), against
    the valid indices [lo, hi] of dimension `dim` (of `size`) of the source of node `node`."""
    node: int
    root: int
    chain: tuple[int, ...]
    lo: int
    hi: int
    dim: int
    size: int


def _indexed(graph: Graph, nid: int) -> list[tuple[int, int]]:
    """(index operand, source dim it indexes) of an indirect node."""
    n = graph.node(nid)
    if n.op == "gather":
        return [(n.args[1], n.attrs["dim"])]
    return list(zip(n.args[1:], n.attrs["dims"]))


def checks(ctx: KernelCtx) -> list[IndexCheck]:
    """The checks the group's kernel needs before it launches."""
    g, group = ctx.graph, ctx.group
    computed = {n for n in group.nodes if g.node(n).kind not in ("input", "constant") and n not in group.inputs}
    out: dict[tuple, IndexCheck] = {}
    for nid in sorted(computed):
        n = g.node(nid)
        if n.op not in OPS:
            continue
        src = g.node(n.args[0])
        for idx, dim in _indexed(g, nid):
            valid = MODES[n.attrs["mode"]].bounds(src.shape[dim])
            if valid is None or within(value_range(g, idx), valid):
                continue
            sources = memory_sources(g, idx, computed)
            for root, chain in sources or ():     # None: codegen refuses the group (indirect.coordinate)
                key = (root, tuple(chain), valid)
                if key not in out:
                    out[key] = IndexCheck(nid, root, tuple(chain), valid[0], valid[1], dim, src.shape[dim])
    return list(out.values())


def _read_text(ctx: KernelCtx, check: IndexCheck) -> str:
    """PyTorch text of the index tensor as the kernel reads it (views applied; casts that keep
    every value are skipped: the check is the same)."""
    g = ctx.graph
    text = ctx.buf(check.root)
    for nid in check.chain:
        n = g.node(nid)
        if n.op == "cast":
            continue
        text = ops.get(n.op).torch_text([text], n.attrs, n.shape)
    return text


def lines(ctx: KernelCtx, done: set | None = None) -> list[str]:
    """call()'s lines checking the group's index tensors (none when it needs none), leaving out
    those `done` holds: the module's checks so far, which run before this group in every call
    (groups' lines are not conditional; a buffer's name is one value). `done` gains this group's."""
    out = []
    done = set() if done is None else done
    for c in checks(ctx):
        key = (_read_text(ctx, c), c.lo, c.hi)
        if key in done:
            continue
        done.add(key)
        node = ctx.graph.node(c.node)
        mode = MODES[node.attrs["mode"]]
        what = f"{node.describe()} ({mode.eager})"
        out.append(f"_rt.check_index({_read_text(ctx, c)}, {c.lo}, {c.hi}, {c.dim}, {c.size}, "
                   f"{mode.error!r}, {what!r})")
    return out

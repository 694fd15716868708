"""Which matmuls call cuBLAS, named on the graph before planning (CUDA targets).

The planner keeps each named matmul in a group of its own (plan/rules.py): strided views before
it, nothing after it but the bias cuBLAS adds itself, so what follows fuses with the next
kernel. `codegen/library.py` writes those groups (and the ones with nothing to fuse) as
PyTorch lines; its `choice` asks the same questions of each group.

`planned(graph, target)` gathers three rules (and library mode "all", every matmul cuBLAS takes):

- few rows (`few_rows`), in a module replayed as CUDA graphs (`Target.graphs`), from
  `graph_library_rows` rows on (`Target.graph_few_rows`, MINICOMP_GRAPH_FEW_ROWS): the matmul's
  epilogue fuses with what comes after it (the residual add with the next norm, SwiGLU's SiLU
  and product in one pointwise kernel). Below that, and in the default mode, our GEMM with its
  epilogue fused (one launch, the skinny configs of gemm_configs) computes it. In the default
  mode a call at such sizes is host-bound: a 4-layer Llama at 1 x 16 ran 2.07 ms against 2.46
  with the cuBLAS plan (H200, results/2026-12-05). Under CUDA graphs with PDL (H100,
  `benchmarks/ablations/host_share.py --no-tc --rounds 2`) our kernels won at 1 x 16 (0.336
  against 0.358; Qwen2 0.355 against 0.361; session 29), and cuBLAS won at 4 x 16 (0.368-0.372
  against 0.394-0.401; session 30). On the H200 (session 31) ours won at 1 x 1 (0.281 against
  0.358) and cuBLAS at 2 x 16 (Llama 0.321 against 0.341, Qwen2 0.321 against 0.347);
- at many rows (prefill), `split_pairs`: one matmul of each dual GEMM's pair (SwiGLU's gate),
  whose partner then meets cuBLAS's result as a tile: our GEMM with the join in its epilogue,
  or cuBLAS too by the next rule (`Target.split_dual`; MINICOMP_DUAL_GEMM=fused keeps the pair
  one kernel of ours);
- `tile_joins`: matmuls of many rows and at least `Target.join_min_flop` operations whose
  result meets a tile of its own size in a pointwise op (a residual add; the up projection once
  cuBLAS has the gate). Our GEMM would load that tile in its epilogue, where it runs far under
  cuBLAS, so cuBLAS computes the matmul and the join fuses with the next kernel (`JOIN`;
  MINICOMP_LIBRARY_JOINS=0 turns it off).
"""

from __future__ import annotations

import math

import networkx as nx
import torch

from minicomp.ir import dims
from minicomp.ir.composites import linear_bias
from minicomp.passes.rewrites import pointwise_join
from minicomp.plan.rules import regroups

# A GEMM of at most SMALL_ROWS output rows over K >= SMALL_MIN_K (`few_rows`) reads its
# weights (K x N) and little else: fusing its epilogue saves 2 * M * N elements against K * N
# read (under 7% at M = 64, K = 2048), while our tiles cover only N / BLOCK_N programs (32 of
# the H200's 132 SMs for N = 2048) and cuBLAS splits K to spread the read over every SM.
# Measured on the H200 (results/2026-12-01/session11-models-early.md): a 4-layer Llama at
# batch 1 x 16 under CUDA graphs took 0.534 ms with our fused GEMMs against torch.compile's
# 0.354 (cuBLAS + Triton pointwise). Our GEMM has since had skinny configs (gemm_configs) and
# PDL, and beat this rule on the H100 at 16 rows (session 29: 0.336 ms against 0.358) and on the
# H200 at one row (session 31: 0.281 against 0.358), but lost at 32 (H200, session 31: 0.321
# against 0.341-0.347) and 64 (H100, session 30: 0.368-0.372 against 0.394-0.401), so the rule
# holds from GRAPH_LIBRARY_ROWS rows on (`graph_library_rows`). Where it applies the planner
# keeps such a matmul in a group of its own (`planned`, plan/rules.py), so what follows it fuses
# with what comes next.
PLANNED = "{m}, where reading the weights is the work"
FEW = "cuBLAS: " + PLANNED
FEW_BIAS = "cuBLAS: " + PLANNED + ", and its bias (addmm)"
# A dual GEMM (SwiGLU's gate and up projections, sharing A) of many rows is compute-bound, and
# one tile holding two fp32 accumulators runs slower than two GEMMs of one each: on the H100
# (results/2026-12-06/session17-profile-llama-*.txt, 4-layer Llama at 4 x 512, N = 5632,
# K = 2048) our dual kernel took 156 us a layer (605 TFLOP/s) where cuBLAS's GEMM took 61.5 us
# for one of the pair. So cuBLAS computes one matmul of the pair; the other is our GEMM with the
# join (`silu(gate) * up`) in its epilogue reading cuBLAS's result, or cuBLAS's too (`JOIN`).
# At few rows a call is launch- or weight-read-bound and the fused kernel (one launch, A read
# once) stays.
SPLIT = "cuBLAS: one matmul of a dual GEMM over {m}"
SPLIT_MIN_ROWS = 512
# A GEMM of many rows whose result meets, in a pointwise op, another value of its own size (a
# residual add; SwiGLU's up projection once cuBLAS computed the gate) would load that tile in
# its epilogue, and our GEMM with a tile-loading epilogue runs far under cuBLAS: on the H100
# (results/2026-12-06/session18-*, session19-*) `silu(gate) * up` in the epilogue ran at 527
# TFLOP/s against 740 for the same kernel with a residual only, and routing every GEMM through
# cuBLAS (library mode "all") took the CUDA kernel time per call of a 4-layer Llama at 4 x 512
# from 1802 to 1729 us, Qwen2's from 1819 to 1718, BERT's from 1291 to 1139. cuBLAS computes
# such a matmul (its bias by addmm); the join fuses with the next kernel (the residual add into
# the next norm's row kernel, SiLU and the product into one pointwise kernel).
# The cuBLAS call costs more host time than our launch (PyTorch's dispatch, the row views
# around it), and the next norm's kernel reads one more tensor: where the call is host-bound
# that outweighs the GPU time saved. With every such GEMM of 4 x 512 rows joined, GPT-2's call
# (width 1024, host-bound: 1.0 ms wall for 0.85 ms of kernels) took 1.058 ms against 0.962
# while its kernels took 831 us against 873, and BERT's 3.109 against 2.997 (H100,
# results/2026-12-06/session19-library-choice-a4817e7.md). So only GEMMs of at least
# `Target.join_min_flop` join (Llama's and Qwen2's MLPs at 4 x 512: 47 and 56 GFLOP; not
# GPT-2's projections, 4.3 and 17, nor BERT's). Joining the rest too (MINICOMP_LIBRARY_JOINS=all)
# was measured again in session 20: Llama's o_proj through cuBLAS saved about what the next
# norm's extra read cost (1712 us of kernels either way), Qwen2's 41 us of 1740
# (results/2026-12-06/session20-library-choice-096ea36.md).
JOIN = "cuBLAS: its result meets a tile of its own size over {m} (the join fuses with the next kernel)"
ALL = "cuBLAS: library mode 'all' (every GEMM; what follows fuses with the next kernel)"
SMALL_ROWS = 64
SMALL_MIN_K = 1024
# Under CUDA graphs by default ("auto"), a few-rows GEMM of at least this many rows calls cuBLAS:
# ours won at 1 and 16 rows, cuBLAS at 32 and 64 (the measurements above). 17 to 31 not measured
GRAPH_LIBRARY_ROWS = 32
DTYPES = (torch.float32, torch.float16, torch.bfloat16)   # what cuBLAS multiplies and our kernels do too


def aligned_kn(graph, mm: int) -> bool:
    """Matmul `mm`'s K (A's last dim) and N, where static, are whole numbers of 16 bytes."""
    node = graph.node(mm)
    size = node.dtype.itemsize
    return all(dims.any_symbolic((d,)) or (int(d) * size) % 16 == 0
               for d in (graph.node(node.args[0]).shape[-1], node.shape[-1]))


def few_rows(graph, nid: int) -> int | None:
    """The rows of matmul `nid` when the few-rows rule holds for the node alone: cuBLAS takes it
    (`_takes`), and it has at most SMALL_ROWS static rows over a static K of at least
    SMALL_MIN_K (and a static N); else None."""
    if not _takes(graph, nid):
        return None
    mm = graph.node(nid)
    rows, k, n = math.prod(mm.shape[:-1]), graph.node(mm.args[0]).shape[-1], mm.shape[-1]
    if dims.any_symbolic((rows, k, n)):
        return None
    return int(rows) if rows <= SMALL_ROWS and k >= SMALL_MIN_K else None


def graph_library_rows(target) -> int | None:
    """The fewest rows at which a GEMM of few rows (`few_rows`) calls cuBLAS on `target`: only
    under CUDA graphs (`Target.graphs`), from GRAPH_LIBRARY_ROWS rows on by default, every such
    GEMM with MINICOMP_GRAPH_FEW_ROWS=1 and none with 0 (`Target.graph_few_rows`); None for none."""
    if not target.graphs or target.graph_few_rows == "off":
        return None
    return 1 if target.graph_few_rows == "on" else GRAPH_LIBRARY_ROWS


def graph_few_rows(graph, nid: int, target) -> int | None:
    """The rows of matmul `nid` where the few-rows rule sends it to cuBLAS on `target` (`few_rows`,
    from `graph_library_rows` rows on); else None. `planned` and `library.choice` both ask this."""
    least = graph_library_rows(target)
    rows = few_rows(graph, nid) if least is not None else None
    return rows if rows is not None and rows >= least else None


def planned(graph, target) -> dict[int, str]:
    """The matmuls cuBLAS computes whatever follows them on `target`, each with why: one of each
    split pair and the tile joins, and those of few rows from `graph_library_rows` rows on (our
    GEMM with its epilogue fused is one launch where cuBLAS and the epilogue's kernel are two,
    and won below that); in library mode "all"
    (`Target.library_all`) every matmul cuBLAS takes (`_takes`). Empty for a target that calls
    no library. The planner gives each a group of its own (plan/rules.py)."""
    if target.device_type != "cuda" or not target.library_gemm:
        return {}
    if target.library_all:
        return {nid: ALL for nid in graph.nx.nodes if _takes(graph, nid)}
    chosen = split_pairs(graph) if target.split_dual else {}
    chosen = tile_joins(graph, target) | chosen
    if graph_library_rows(target) is None:
        return chosen    # the default mode: at few rows our fused GEMM, one launch
    rows = {nid: graph_few_rows(graph, nid, target) for nid in graph.nx.nodes}
    return chosen | {nid: PLANNED.format(m=rows_text(m)) for nid, m in rows.items() if m is not None}


def tile_joins(graph, target) -> dict[int, str]:
    """The matmuls of many rows and at least `target.join_min_flop` operations (`JOIN`) whose
    result, past a bias along N and reshapes that regroup its rows, meets in a pointwise op a
    value of its own shape that does not depend on it: `x + o_proj(h)`, `silu(gate) * up`. Not
    `gelu(h)`, whose operands all come from the matmul's result."""
    return {nid: why for nid in sorted(graph.nx.nodes) if (why := join_of(graph, nid, target))}


def join_of(graph, nid: int, target) -> str | None:
    """`tile_joins`' answer for matmul `nid` alone under `target`'s switches: none with
    `library_joins` off, nor for a matmul of a dual GEMM kept one kernel of ours
    (MINICOMP_DUAL_GEMM=fused: `split_dual` off)."""
    if not target.library_joins or not _joins(graph, nid, target.join_min_flop):
        return None
    return None if not target.split_dual and _paired(graph, nid) else _over_rows(JOIN, graph, nid)


def _joins(graph, nid: int, min_flop: int) -> bool:
    mm = graph.node(nid)
    if mm.op != "matmul" or not _takes(graph, nid) or not _many(math.prod(mm.shape[:-1])):
        return False
    flop = 2 * math.prod(mm.shape) * graph.node(mm.args[0]).shape[-1]
    if not dims.any_symbolic((flop,)) and flop < min_flop:
        return False
    last = nid
    users = graph.users(last)
    if len(users) == 1 and linear_bias(graph, users[0], nid) is not None:
        last = users[0]
    while len(users := graph.users(last)) == 1 and graph.node(users[0]).op == "reshape" \
            and regroups(graph.node(users[0]).shape, mm.shape):
        last = users[0]
    shape = tuple(graph.node(last).shape)
    for u in set(graph.users(last)):
        node = graph.node(u)
        if node.kind != "pointwise" or len(node.args) != 2 or tuple(node.shape) != shape:
            continue
        other = node.args[1] if node.args[0] == last else node.args[0]
        if other != last and tuple(graph.node(other).shape) == shape and not nx.has_path(graph.nx, nid, other):
            return True
    return False


def _paired(graph, nid: int) -> bool:
    """Whether matmul `nid` and another reading its A meet in a pointwise join (a dual GEMM)."""
    return any(u != nid and pointwise_join(graph, nid, u, through=("reshape",)) for u in _sharing_a(graph, nid))


def _sharing_a(graph, mm: int) -> list[int]:
    """The matmuls whose A is matmul `mm`'s (`mm` among them), by id."""
    a = graph.node(mm).args[0]
    return sorted(u for u in set(graph.users(a)) if graph.node(u).op == "matmul" and graph.node(u).args[0] == a)


def _over_rows(reason: str, graph, mm: int) -> str:
    """`reason` (SPLIT, JOIN) with matmul `mm`'s row count, or that the sizes do not settle it."""
    rows = math.prod(graph.node(mm).shape[:-1])
    return reason.format(m="rows the sizes do not settle" if dims.any_symbolic((rows,)) else rows_text(int(rows)))


def _many(rows) -> bool:
    return dims.any_symbolic((rows,)) or rows >= SPLIT_MIN_ROWS


def split_pairs(graph) -> dict[int, str]:
    """One matmul of each dual GEMM of many rows, for cuBLAS (`SPLIT`): two matmuls reading the
    same A, of one shape and dtype, whose results meet in a pointwise join (SwiGLU's
    `silu(x @ w_gate) * (x @ w_up)`), with at least SPLIT_MIN_ROWS rows, or rows the sizes do
    not settle (a prefill over a symbolic length). The first of the pair (by node id) goes to
    cuBLAS; the planner then gives the other our GEMM with the join in its epilogue, reading
    cuBLAS's result as a tile (plan/rules.py: an epilogue may compute from memory alone)."""
    by_a: dict[int, list[int]] = {}
    for nid in sorted(graph.nx.nodes):
        if graph.node(nid).op == "matmul":
            by_a.setdefault(graph.node(nid).args[0], []).append(nid)
    return {m: _over_rows(SPLIT, graph, m) for mms in by_a.values() for m in _firsts(graph, mms)}


def split_of(graph, mm: int) -> str | None:
    """`split_pairs`' answer for matmul `mm` alone, from the matmuls reading its A (no walk of
    the whole graph: codegen asks once per GEMM group)."""
    return _over_rows(SPLIT, graph, mm) if mm in _firsts(graph, _sharing_a(graph, mm)) else None


def _firsts(graph, mms: list[int]) -> list[int]:
    """The first matmul of each pair `_split` takes among `mms` (one A's matmuls, by id), each
    matmul in one pair at most."""
    used: set[int] = set()
    firsts = []
    for i, m1 in enumerate(mms):
        for m2 in mms[i + 1:]:
            if m1 not in used and m2 not in used and _split(graph, m1, m2):
                used |= {m1, m2}
                firsts.append(m1)
    return firsts


def _split(graph, m1: int, m2: int) -> bool:
    """Whether matmuls `m1` and `m2` (same A) are a dual GEMM worth splitting: one shape and
    dtype, a pointwise join, cuBLAS takes `m1`, and many rows (or rows not settled)."""
    a, b = graph.node(m1), graph.node(m2)
    if a.shape != b.shape or a.dtype != b.dtype or not _takes(graph, m1) or \
            not pointwise_join(graph, m1, m2, through=("reshape",)):
        return False
    return _many(math.prod(a.shape[:-1]))


def _takes(graph, nid: int) -> bool:
    """Whether cuBLAS takes matmul `nid` as well as our kernel would: operands of its dtype, and
    every static K and N a whole number of 16 bytes (see library.py's `_aligned`)."""
    mm = graph.node(nid)
    if mm.op != "matmul":
        return False
    a, b = (graph.node(x) for x in mm.args)
    if len(a.shape) < 2 or len(b.shape) < 2 or not (a.dtype == b.dtype == mm.dtype and mm.dtype in DTYPES):
        return False
    return aligned_kn(graph, nid)


def rows_text(m: int) -> str:
    return f"{m} row" if m == 1 else f"{m} rows"

"""The ledger and the machine model: bytes and flops per node and per group, and a roofline.

Accounting (the seeds' ledger, DESIGN.md):
- a kernel reads each of its input tensors once and writes each of its outputs once;
  values that live only inside a kernel cost nothing;
- a view (reshape, permute, expand, slice, cat) is folded into the loads of the kernel
  that reads it: it moves no bytes of its own. Reading through a view costs the bytes of
  the storage it touches (an `expand` reads the small tensor once, a `slice` its part);
  several views of one tensor in one kernel never cost more than reading it whole;
- an indirect load (index, gather) reads at most one element of its source per output
  element (plan/indirect.py `read_share`): an embedding reads its tokens' rows;
- flops come from `minicomp.ir.ops.flops`: one per elementwise op or transcendental, two
  per multiply-add; views and casts are free;
- "unfused" is eager execution: every node that is not a leaf or a view is its own kernel
  (reads its operands, writes its result); `cat` counts as a kernel there, since
  `torch.cat` always copies.

A `Machine` holds peak bandwidth and peak compute (matmul peaks per operand dtype, and a
vector peak for elementwise math). The lower bound of a kernel is
max(bytes / bandwidth, flops / peak); whichever term wins says memory- or compute-bound.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch

from minicomp.errors import MinicompError
from minicomp.ir import dims, ops
from minicomp.ir.dtypes import dtype_name, itemsize
from minicomp.ir.graph import Graph, Node
from minicomp.ir.ops.views import STRIDED
from minicomp.plan import indirect


@dataclass(frozen=True)
class Machine:
    name: str
    bytes_per_s: float                                   # sustained device-memory bandwidth
    matmul_flops: dict[str, float] = field(default_factory=dict)   # dtype name -> tensor-core peak
    vector_flops: float = 0.0                            # fp32 elementwise peak (CUDA cores)
    source: str = ""                                     # where the figures come from
    sms: int = 132                                       # streaming multiprocessors (programs run at once per wave)
    launch_us: float = 4.0                               # fixed cost of one more kernel launch (assumed, not measured)

    def peak_flops(self, kind: str, dtype: torch.dtype | None) -> float:
        """Peak FLOP/s for a kernel of `kind` whose matmul operands have `dtype`."""
        if kind in ("gemm", "attention") and dtype is not None:
            return self.matmul_flops.get(dtype_name(dtype), self.vector_flops)
        return self.vector_flops

    @property
    def balance(self) -> float:
        """FLOP per byte at which a bf16 matmul stops being memory-bound."""
        return self.matmul_flops.get("bf16", self.vector_flops) / self.bytes_per_s


# fp32 matmuls run as full-precision dots (TF32 off, as eager), so they get the fp32 vector peak.
MACHINES: dict[str, Machine] = {
    "h200": Machine("H200", 4265e9, {"bf16": 685e12, "f16": 685e12, "f32": 67e12}, 67e12,
                    "measured copy bandwidth and cuBLAS bf16 8192^3 (shared/ceilings.md); "
                    "fp16 assumed equal to bf16; fp32 = spec CUDA-core peak"),
    "h100": Machine("H100", 3350e9, {"bf16": 989e12, "f16": 989e12, "f32": 67e12}, 67e12,
                    "NVIDIA H100 SXM5 spec sheet (dense), not measured"),
    "a100": Machine("A100", 2039e9, {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12}, 19.5e12,
                    "NVIDIA A100 SXM4 80GB spec sheet (dense), not measured", sms=108),
}


def get_machine(machine: str | Machine) -> Machine:
    if isinstance(machine, Machine):
        return machine
    try:
        return MACHINES[machine.lower()]
    except KeyError:
        raise MinicompError(f"unknown machine {machine!r}; known machines: {', '.join(MACHINES)}") from None


@dataclass(frozen=True)
class Cost:
    bytes_in: int = 0
    bytes_out: int = 0
    flops: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_in + self.bytes_out


class NodeLookup(Protocol):
    """What the per-group functions below need of a graph: its Node records by id. A
    `Graph` is one; the planner passes its own faster index (`state.Context`)."""

    def node(self, nid: int) -> Node: ...


_itemsize = functools.lru_cache(maxsize=None)(itemsize)   # itemsize() allocates a tensor per call


def nbytes(n: Node) -> int:
    return n.numel * _itemsize(n.dtype)


def is_view(n: Node) -> bool:
    return n.kind == "view"


def is_leaf(n: Node) -> bool:
    return n.op in ("input", "constant")


# --------------------------------------------------------------------------- reads through views


def footprint(graph: Graph | NodeLookup, nid: int, inside: set[int]) -> dict[int, float]:
    """Storage bytes that reading `nid` touches, by root. A view in `inside` is followed to
    its operands (an `expand` touches its operand once, a `slice` its share); any node not in
    `inside` is a root read whole; a non-view node in `inside` is computed there: no read."""
    n = graph.node(nid)
    if nid not in inside:
        b = nbytes(n)
        return {nid: b if isinstance(b, dims.Expr) else float(b)}
    if not is_view(n):
        return {}
    out: dict[int, float] = {}
    frac = 1.0
    if n.op == "slice":
        src = graph.node(n.args[0])
        frac = dims.ratio(n.numel, src.numel)
    for a in dict.fromkeys(n.args):
        for r, b in footprint(graph, a, inside).items():
            out[r] = out.get(r, 0.0) + b * frac
    return out


def _cap(graph: Graph | NodeLookup, per_root: dict[int, float]) -> dict[int, int]:
    """Several accesses of one root cost at most reading it whole."""
    return {r: _whole(dims.smin(b, nbytes(graph.node(r)))) for r, b in per_root.items()}


def _whole(b):
    return b if isinstance(b, dims.Expr) else int(b)


def _add(acc: dict[int, float], part: dict[int, float], share: float = 1.0) -> None:
    for r, b in part.items():
        acc[r] = acc.get(r, 0.0) + b * share


def _operands(n: Node) -> list[tuple[int, int]]:
    """(position, node) of each distinct operand of `n`, at its first position."""
    first: dict[int, int] = {}
    for i, a in enumerate(n.args):
        first.setdefault(a, i)
    return [(i, a) for a, i in first.items()]


# --------------------------------------------------------------------------- flops and costs


def node_flops(graph: Graph | NodeLookup, n: Node) -> int:
    if n.kind in ("input", "constant", "view", "opaque"):
        return 0
    return ops.flops(n.op, [graph.node(a).shape for a in n.args], n.shape, n.attrs)


# Ledger flops an element a pointwise kernel may spend recomputing values smaller than its
# iteration space (plan/rules.py). Broadcast adds and masks cost a few; HF's rotary cos/sin,
# recomputed for every head, cost over forty and ran at 40% of the copy bandwidth (session 19's
# profile of Llama at 4 x 512: 53 us where reading and writing q takes 22).
RECOMPUTE_FLOPS = 16
# Ops whose evaluation costs far more than the ledger's one flop an element (the seeds' count):
# libdevice's sin and cos reduce their argument first, about twenty instructions each.
EVALUATION_FLOPS = {"sin": 20, "cos": 20}


def recompute_flops(graph: Graph | NodeLookup, nodes: Iterable[int], space) -> tuple[float, int | None]:
    """(flops an element, costliest node): what a kernel over `space` elements spends
    evaluating values of fewer elements again at each of its elements (a pointwise kernel
    computes every node at every element of its iteration space: a node of n elements is
    computed space / n times). A value of one element is computed once a program (Triton keeps
    a scalar a scalar) and costs nothing here."""
    total, worst, most = 0.0, None, 0.0
    for nid in nodes:
        n = graph.node(nid)
        if n.kind != "pointwise" or n.numel == 1:
            continue
        share = dims.ratio(n.numel, space)
        if share >= 1.0:
            continue
        extra = max(ops.get(n.op).flops_per_element, EVALUATION_FLOPS.get(n.op, 0)) * (1.0 - share)
        total += extra
        if extra > most:
            worst, most = nid, extra
    return total, worst


def eager_views(graph: Graph) -> set[int]:
    """Views eager PyTorch makes without a kernel: the strided ones (`cat`, `flip`, `roll`
    and `constant_pad` always copy)."""
    return {i for i in graph.nx.nodes if is_view(graph.node(i)) and graph.node(i).op in STRIDED}


def node_cost(graph: Graph, nid: int, views: set[int] | None = None) -> Cost:
    """Eager cost of one node as its own kernel: reads its operands (through views, to their
    storage), writes its result. Views (but `cat`) and leaves cost nothing."""
    n = graph.node(nid)
    if views is None:
        views = eager_views(graph)
    if is_leaf(n) or nid in views:
        return Cost()
    acc: dict[int, float] = {}
    for i, a in _operands(n):
        _add(acc, footprint(graph, a, views), indirect.read_share(graph, n, i))
    return Cost(sum(_cap(graph, acc).values()), nbytes(n), node_flops(graph, n))


def unfused_cost(graph: Graph) -> Cost:
    """Every non-leaf, non-view node its own kernel (eager)."""
    views = eager_views(graph)
    costs = [node_cost(graph, nid, views) for nid in graph.nx.nodes]
    return Cost(sum(c.bytes_in for c in costs), sum(c.bytes_out for c in costs), sum(c.flops for c in costs))


def unfused_bytes(graph: Graph) -> int:
    return unfused_cost(graph).bytes


def group_reads(graph: Graph | NodeLookup, nodes: set[int], outputs: Iterable[int] = ()) -> dict[int, int]:
    """Roots a kernel computing `nodes` reads from memory, with their bytes. Accesses are the
    operands of its non-view nodes and the views it writes (`outputs`); a value computed only
    to be gathered from reads only what is gathered (`indirect.shares`)."""
    acc: dict[int, float] = {}
    share = indirect.shares(graph, nodes, set(outputs))
    for nid in nodes:
        n = graph.node(nid)
        if is_view(n):
            continue
        evaluated = share[nid] if share is not None else 1.0
        for i, a in _operands(n):
            _add(acc, footprint(graph, a, nodes), evaluated * indirect.read_share(graph, n, i))
    for o in outputs:
        if is_view(graph.node(o)):
            _add(acc, footprint(graph, o, nodes))
    return _cap(graph, acc)


def group_cost(graph: Graph | NodeLookup, nodes: set[int], outputs: Iterable[int]) -> Cost:
    """Ledger of one kernel: reads its inputs once, writes `outputs` once; inside is free."""
    outputs = set(outputs)
    reads = group_reads(graph, nodes, outputs)
    flops = sum(node_flops(graph, graph.node(n)) for n in nodes)
    return Cost(sum(reads.values()), sum(nbytes(graph.node(o)) for o in outputs), flops)


def lower_bound_us(machine: Machine, cost: Cost, kind: str, dtype: torch.dtype | None) -> tuple[float, str]:
    """(roofline lower bound in microseconds, "memory" or "compute")."""
    t_mem = cost.bytes / machine.bytes_per_s
    peak = machine.peak_flops(kind, dtype)
    t_cmp = cost.flops / peak if peak else 0.0
    bound = "compute" if dims.smax(t_cmp, t_mem) is t_cmp and t_cmp != t_mem else "memory"
    if dims.is_symbolic(t_mem) or dims.is_symbolic(t_cmp):
        try:
            t_mem >= t_cmp
        except dims.SymbolicDim:        # which term wins depends on the sizes: the hints' is shown
            bound += " (at the hints)"
    return dims.smax(t_mem, t_cmp) * 1e6, bound


@dataclass(frozen=True)
class Split:
    """A split (two-stage) reduction's shape: `splits` programs share each row, each reducing
    `chunk` consecutive elements of it (the last one the rest)."""
    splits: int
    chunk: int


def split_rows(row_programs: int, n_cols: int, fill: int, min_chunk: int, granule: int,
               read_bytes: int, partial_bytes: int) -> Split | None:
    """How to share rows of `n_cols` elements between programs when the rows alone give
    `row_programs` programs, fewer than `fill` (the programs that keep the device's memory
    system busy: two per SM by default); None when the rows fill it already or are too short.

    The split aims at twice `fill` programs (several resident programs per SM keep more loads in
    flight, and a memory-bound loop needs them), each with at least `min_chunk` elements, its
    chunk a multiple of `granule` (the largest column block its configs read). The ledger's
    price of a split is its partials: `partial_bytes` per split (all rows, all values), written
    once and read once; they stay under an eighth of the `read_bytes` the reduction reads."""
    if fill <= 0 or row_programs <= 0 or row_programs >= fill or n_cols < 2 * min_chunk:
        return None
    want = -(-2 * fill // row_programs)
    most = min(n_cols // min_chunk, read_bytes // max(16 * partial_bytes, 1))
    splits = min(want, most)
    if splits < 2:
        return None
    chunk = -(-n_cols // splits)
    chunk = -(-chunk // granule) * granule
    splits = -(-n_cols // chunk)
    return Split(splits, chunk) if splits >= 2 else None


def split_pays(machine: Machine, row_programs: int, fill: int, read_bytes: int) -> bool:
    """Whether a split's second launch costs less than the time a one-stage reduction loses to
    idle SMs: at `row_programs` of `fill` programs it streams at that fraction of the bandwidth
    (the roofline's memory term scaled by occupancy), a split at all of it plus one launch."""
    one_stage = read_bytes / (machine.bytes_per_s * min(1.0, row_programs / max(fill, 1)))
    return read_bytes / machine.bytes_per_s + machine.launch_us * 1e-6 < one_stage


def fmt_bytes(b: float) -> str:
    """`1.5 MB`-style figure (decimal units, as the ledger's tables)."""
    if isinstance(b, dims.Expr):
        return f"{b} B"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{int(b)} B"


def fmt_flops(f: float) -> str:
    if isinstance(f, dims.Expr):
        return str(f)
    for unit, scale in (("TF", 1e12), ("GF", 1e9), ("MF", 1e6), ("KF", 1e3)):
        if abs(f) >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{int(f)}"


def prod(shape: Iterable[int]) -> int:
    return math.prod(shape)

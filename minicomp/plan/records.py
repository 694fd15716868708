"""The Plan: what the fusion planner decided, as data the codegen consumes and tests compare.

A `Group` is one kernel to be: its kind, the nodes it computes (topological order), the
nodes it reads from memory (`inputs`: graph inputs, constants, other groups' outputs) and
the nodes it writes (`outputs`). A view or cheap pointwise node may appear in several
groups' `nodes` (it is recomputed in each); every node a group writes is written by
exactly one group. Input and constant nodes belong to no group. Reduction, GEMM and
attention groups carry their kind's `spec` (plan/specs.py): what codegen writes the kernel
from, so it never re-derives a planner decision.

The ledger figures on each group follow the seeds' accounting: each input read once, each
output written once, intermediates inside a kernel free.

Invariants: a Plan is immutable once built. Groups and the records beside them are frozen
dataclasses and hold tuples (lists given to a constructor become tuples), so a stage that
wants another plan builds one (`dataclasses.replace`). Whatever codegen finds on its way
(a group that runs through PyTorch after all, and why) lives on the generated module
(`GeneratedModule.fallbacks`), never here; `plan.table(fallbacks=...)` shows it.

`str(plan)` / `plan.table()` is what `--dump-plan` and `explain()` print: one row per
group (kind, nodes, bytes in/out, bytes saved, flops, roofline lower bound, bound), the
totals (unfused vs planned bytes and their ratio), the refused fusion candidates with
their reasons, and each recompute-or-materialise decision with the bytes behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Union

from minicomp.ir import dims
from minicomp.ir.graph import Graph
from minicomp.plan.specs import AttentionSpec, GemmSpec, ReductionSpec, derive_spec
from minicomp.plan.table import render

GROUP_KINDS = ("pointwise", "reduction", "gemm", "attention", "opaque")

Spec = Union[ReductionSpec, GemmSpec, AttentionSpec]


def _freeze(record: object, *names: str) -> None:
    """Store the named sequence fields of a frozen dataclass as tuples."""
    for name in names:
        object.__setattr__(record, name, tuple(getattr(record, name)))


@dataclass(frozen=True)
class Group:
    id: int
    kind: str
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str = ""                 # what it holds, for kernel names: "rmsnorm", "bias_gelu"
    anchor: int | None = None      # the reduction / matmul / attention node the group is built on
    bytes_in: int = 0
    bytes_out: int = 0
    bytes_saved: int = 0
    flops: int = 0
    lower_bound_us: float = 0.0
    bound: str = "memory"          # "memory" or "compute"
    reason: str = ""               # why these nodes share a kernel
    spec: Spec | None = None       # reduction, gemm, attention: what the kernel computes (plan/specs.py)

    def __post_init__(self) -> None:
        _freeze(self, "nodes", "inputs", "outputs")


@dataclass(frozen=True)
class Rejection:
    """A fusion candidate the planner refused, and why."""
    a: str                         # what was to be fused: group or node names
    b: str
    reason: str
    bytes: int = 0                 # the bytes the fusion would have saved (or cost)


@dataclass(frozen=True)
class Recompute:
    """A decision between recomputing a cheap value inside a consumer and reading it from memory."""
    node: int                      # the value
    op: str
    group: int                     # the consumer group
    chosen: bool                   # True: recomputed there; False: materialised and read
    bytes_recompute: int           # ledger bytes of the groups involved, recomputing
    bytes_materialise: int         # ... and materialising
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    graph_name: str
    groups: tuple[Group, ...]
    rejected: tuple[Rejection, ...] = ()
    unfused_bytes: int = 0         # bytes if every node were its own kernel
    machine: str = "H200"
    recomputed: tuple[Recompute, ...] = ()

    def __post_init__(self) -> None:
        _freeze(self, "groups", "rejected", "recomputed")

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes_in + g.bytes_out for g in self.groups)

    @property
    def total_flops(self) -> int:
        return sum(g.flops for g in self.groups)

    @property
    def ratio(self) -> float:
        """Planned bytes over unfused bytes (below 1 when fusion saves traffic)."""
        return dims.ratio(self.total_bytes, self.unfused_bytes) if self.unfused_bytes else 1.0

    @property
    def lower_bound_us(self) -> float:
        return sum(g.lower_bound_us for g in self.groups)

    def group_of(self, nid: int) -> Group | None:
        """The group that writes (or else computes) node `nid`."""
        for g in self.groups:
            if nid in g.outputs:
                return g
        for g in self.groups:
            if nid in g.nodes:
                return g
        return None

    def kinds(self) -> list[str]:
        return [g.kind for g in self.groups]

    def signature(self) -> str:
        """A stable one-line summary for tests: kinds and node counts in order."""
        return " | ".join(f"{g.kind}[{len(g.nodes)}]" for g in self.groups)

    def diff(self, other: "Plan") -> list[str]:
        """Human-readable differences between two plans (empty when they agree)."""
        out = []
        if self.kinds() != other.kinds():
            out.append(f"kinds: {self.kinds()} != {other.kinds()}")
        for a, b in zip(self.groups, other.groups):
            if (a.kind, sorted(a.nodes), sorted(a.outputs)) != (b.kind, sorted(b.nodes), sorted(b.outputs)):
                out.append(f"group {a.id}: {a.kind} nodes={sorted(a.nodes)} out={sorted(a.outputs)} != "
                           f"{b.kind} nodes={sorted(b.nodes)} out={sorted(b.outputs)}")
        return out

    def with_specs(self, graph: Graph) -> "Plan":
        """This plan with each group's spec derived from `graph` (a new Plan): for plans made
        by hand; the planner's own come with their specs."""
        groups = [replace(g, spec=derive_spec(graph, g.kind, g.nodes, g.anchor, g.id)) for g in self.groups]
        return replace(self, groups=groups)

    def table(self, fallbacks: Mapping[int, str] | None = None, library: Mapping[int, str] | None = None) -> str:
        """The plan as text: groups, totals, refused candidates, recompute decisions.
        `fallbacks` (group id -> why it runs through PyTorch: `GeneratedModule.fallbacks`)
        marks the groups codegen did not write a kernel for; `library` (`GeneratedModule.library`)
        the GEMMs with nothing to fuse that call cuBLAS instead."""
        return render(self, fallbacks or {}, library or {})

    def __str__(self) -> str:
        return self.table()

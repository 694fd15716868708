"""The Plan: what the fusion planner decided, as data the codegen consumes and tests compare.

A `Group` is one kernel to be: its kind, the nodes it computes (topological order), the
nodes it reads from memory (`inputs`: graph inputs, constants, other groups' outputs) and
the nodes it writes (`outputs`). A view or cheap pointwise node may appear in several
groups' `nodes` (it is recomputed in each); every node a group writes is written by
exactly one group. Input and constant nodes belong to no group.

The ledger figures on each group follow the seeds' accounting: each input read once, each
output written once, intermediates inside a kernel free.

`str(plan)` / `plan.table()` is what `--dump-plan` and `explain()` print: one row per
group (kind, nodes, bytes in/out, bytes saved, flops, roofline lower bound, bound), the
totals (unfused vs planned bytes and their ratio), the refused fusion candidates with
their reasons, and each recompute-or-materialise decision with the bytes behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GROUP_KINDS = ("pointwise", "reduction", "gemm", "attention", "opaque")


@dataclass
class Group:
    id: int
    kind: str
    nodes: list[int]
    inputs: list[int]
    outputs: list[int]
    name: str = ""                 # what it holds, for kernel names: "rmsnorm", "bias_gelu"
    anchor: int | None = None      # the reduction / matmul / attention node the group is built on
    bytes_in: int = 0
    bytes_out: int = 0
    bytes_saved: int = 0
    flops: int = 0
    lower_bound_us: float = 0.0
    bound: str = "memory"          # "memory" or "compute"
    reason: str = ""               # why these nodes share a kernel
    fallback: str | None = None    # set when the group runs through PyTorch, and why


@dataclass
class Rejection:
    """A fusion candidate the planner refused, and why."""
    a: str                         # what was to be fused: group or node names
    b: str
    reason: str
    bytes: int = 0                 # the bytes the fusion would have saved (or cost)


@dataclass
class Recompute:
    """A decision between recomputing a cheap value inside a consumer and reading it from memory."""
    node: int                      # the value
    op: str
    group: int                     # the consumer group
    chosen: bool                   # True: recomputed there; False: materialised and read
    bytes_recompute: int           # ledger bytes of the groups involved, recomputing
    bytes_materialise: int         # ... and materialising
    reason: str = ""


@dataclass
class Plan:
    graph_name: str
    groups: list[Group]
    rejected: list[Rejection] = field(default_factory=list)
    unfused_bytes: int = 0         # bytes if every node were its own kernel
    machine: str = "H200"
    recomputed: list[Recompute] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes_in + g.bytes_out for g in self.groups)

    @property
    def total_flops(self) -> int:
        return sum(g.flops for g in self.groups)

    @property
    def ratio(self) -> float:
        """Planned bytes over unfused bytes (below 1 when fusion saves traffic)."""
        return self.total_bytes / self.unfused_bytes if self.unfused_bytes else 1.0

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

    def copy(self) -> "Plan":
        """An independent copy (codegen records fallbacks on groups; the api sets totals)."""
        groups = [replace(g, nodes=list(g.nodes), inputs=list(g.inputs), outputs=list(g.outputs))
                  for g in self.groups]
        return replace(self, groups=groups, rejected=[replace(r) for r in self.rejected],
                       recomputed=[replace(r) for r in self.recomputed])

    def table(self) -> str:
        """The plan as text: groups, totals, refused candidates, recompute decisions."""
        from minicomp.passes.plan_table import render
        return render(self)

    def __str__(self) -> str:
        return self.table()

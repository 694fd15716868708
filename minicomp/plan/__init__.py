"""The planner, a stage of its own: frontend -> ir -> passes -> plan -> codegen -> runtime.

    plan = plan_graph(graph, machine, baseline=captured)   # which nodes share a kernel
    graph = assign_layout(graph, plan)                       # strides of what kernels write
    generate(graph, plan, target)                            # codegen reads the Plan

Modules, from the bottom up (each imports only those above it in this list):
- `cost.py`: the ledger (bytes and flops per node and group) and the machine model;
- `rules.py`: legality of one candidate group, with the reason when it is refused;
- `specs.py`: per-kind specs (reduction domain, GEMM operands and epilogue, attention form);
- `table.py`, `records.py`: the Plan and its groups (immutable), and its text;
- `state.py`: the search state (clusters of nodes);
- `moves.py`: the moves of the search and their legality;
- `search.py`: the greedy search; `build.py`: the final state as a Plan;
- `fusion.py`: `plan_graph`; `layout.py`: `assign_layout` (strides, from the plan).

Invariants: the planner never mutates the graph it is given and never reads strides; a
Plan is immutable once built; nothing here imports codegen, the runtime or the api.
"""

from minicomp.plan.cost import MACHINES, Machine, get_machine
from minicomp.plan.fusion import plan_graph
from minicomp.plan.layout import assign_layout
from minicomp.plan.records import Group, Plan, Recompute, Rejection
from minicomp.plan.specs import AttentionSpec, GemmSpec, ReductionSpec, derive_spec
from minicomp.plan.state import live_nodes

__all__ = ["MACHINES", "Machine", "get_machine", "plan_graph", "assign_layout", "Group", "Plan", "Recompute",
           "Rejection", "AttentionSpec", "GemmSpec", "ReductionSpec", "derive_spec", "live_nodes"]

"""From the planner's final state to a `Plan`: group order, ledger figures, names, reasons,
the refused candidates and the recompute decisions.

Groups are listed in a topological order of the group graph (ties: earliest node first),
so codegen can launch them in plan order. Each reduction, GEMM and attention group gets its
spec (`specs.derive_spec`). The Plan is built whole, at the end: it is immutable.
`bytes_saved` of a group is what its own nodes cost eagerly (each its own kernel) minus
what the group costs; the sum over the plan is unfused minus planned bytes (up to views
the plan must write as graph outputs).
"""

from __future__ import annotations

import re
from dataclasses import replace

import networkx as nx

from minicomp.ir import dims
from minicomp.ir.graph import Graph
from minicomp.plan import cost as ledger
from minicomp.plan.moves import Reach, legality, scored_moves
from minicomp.plan.records import Group, Plan, Recompute, Rejection
from minicomp.plan.rules import ROW_BLOCK_LIMIT, describe, kind_of, reduction_domain
from minicomp.plan.specs import derive_spec
from minicomp.plan.state import Move, State


def _ordered_clusters(state: State) -> list[int]:
    order = state.ctx.order
    first = {cid: min(order[n] for n in c.owned) for cid, c in state.clusters.items()}
    return list(nx.lexicographical_topological_sort(state.quotient(), key=lambda cid: first[cid]))


def _anchor(graph: Graph, kind: str, nodes: list[int]) -> int | None:
    wanted = {"gemm": "gemm", "attention": "attention", "reduction": "reduction", "opaque": "opaque"}.get(kind)
    found = next((n for n in nodes if graph.node(n).kind == wanted), None)
    if found is None and kind == "reduction":   # a row kernel of scans only
        found = next((n for n in nodes if graph.node(n).kind == "scan"), None)
    return found


def _dtype(graph: Graph, kind: str, anchor: int | None):
    if anchor is None or kind not in ("gemm", "attention"):
        return None
    return graph.node(graph.node(anchor).args[0]).dtype


# --------------------------------------------------------------------------- names


def _ident(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_") or "group"


def group_name(graph: Graph, kind: str, nodes: list[int], anchor: int | None) -> str:
    """What a group holds, for kernel names: `rmsnorm`, `bias_gelu`, `causal_attention`."""
    ops = [graph.node(n).op for n in nodes]
    computed = [n for n in nodes if graph.node(n).kind == "pointwise" and graph.node(n).op != "cast"]
    if kind == "opaque":
        return _ident(str(graph.node(anchor).attrs.get("target", "opaque")).split(".")[-1])
    if kind == "attention":
        a = graph.node(anchor).attrs
        return ("causal_" if a.get("is_causal") else "") + ("gqa_" if a.get("enable_gqa") else "") + "attention"
    if kind == "reduction":
        prefix = "add_" if any(graph.node(n).op == "add" and graph.node(n).shape == reduction_domain(graph, anchor)[0]
                               and nodes.index(n) < nodes.index(anchor) for n in nodes) else ""
        if "amax" in ops and "exp" in ops and "sum" in ops:
            return "log_softmax" if "log" in ops else "softmax"
        if ops.count("mean") >= 2 and "rsqrt" in ops and "sub" in ops:
            return prefix + "layernorm"
        if "mean" in ops and "rsqrt" in ops:
            return prefix + "rmsnorm"
        return prefix + "_".join(dict.fromkeys(graph.node(n).op for n in nodes
                                               if graph.node(n).kind in ("reduction", "scan")))
    if kind == "gemm":
        out_shape = graph.node(anchor).shape
        tokens = []
        for n in computed:
            node = graph.node(n)
            if node.op == "add":
                others = [graph.node(a) for a in node.args if a not in nodes]
                full = any(o.numel == node.numel and o.shape[-1:] == out_shape[-1:] for o in others)   # rows regrouped too
                tokens.append("residual" if full else "bias" if others else "add")
            elif node.op in ("mul", "div") and any(graph.node(a).numel == 1 for a in node.args):
                tokens.append("scale")
            else:
                tokens.append(node.op)
        tokens = list(dict.fromkeys(tokens))
        if ops.count("matmul") == 2:
            return "swiglu" if tokens[:2] == ["silu", "mul"] else "dual_" + "_".join(tokens)
        return "_".join(tokens) or "matmul"
    tokens = list(dict.fromkeys(graph.node(n).op for n in computed))
    return "_".join(tokens[:3]) or ("cast" if "cast" in ops else "copy")


def _reason(graph: Graph, kind: str, nodes: list[int], anchor: int | None, outputs: list[int]) -> str:
    inner = len([n for n in nodes if graph.node(n).kind != "view"])
    if kind == "opaque":
        return "runs through PyTorch"
    parts = []
    if kind == "reduction":
        S, A = reduction_domain(graph, anchor)
        row = ledger.prod(S[a] for a in A)
        parts.append(f"row kernel over {list(S)} reducing {list(A)}")
        if isinstance(row, dims.Expr):
            parts.append(f"a row of {row} elements: one block up to {ROW_BLOCK_LIMIT}, looped beyond")
        elif row > ROW_BLOCK_LIMIT:
            parts.append(f"looped: a row of {row} elements exceeds one block ({ROW_BLOCK_LIMIT})")
    elif kind == "gemm":
        mms = [n for n in nodes if graph.node(n).kind == "gemm"]
        if len(mms) == 2:
            parts.append(f"dual GEMM {describe(graph, mms[0])}, {describe(graph, mms[1])} share operand A")
    if inner > 1:
        parts.append(f"{inner} ops share one kernel")
    views = [n for n in nodes if graph.node(n).kind == "view"]
    if views:
        parts.append(f"{len(views)} view(s) folded into loads")
    if len(outputs) > 1:
        parts.append(f"writes {len(outputs)} outputs")
    return "; ".join(parts)


# --------------------------------------------------------------------------- decisions


def _local_bytes(before: State, after: State) -> tuple[int, int]:
    """Bytes of the clusters a move changed: (before, after)."""
    b = a = 0
    for cid in set(before.clusters) | set(after.clusters):
        kb = (before.clusters[cid].nodes, before.outputs[cid]) if cid in before.clusters else None
        ka = (after.clusters[cid].nodes, after.outputs[cid]) if cid in after.clusters else None
        if kb != ka:
            b += before.cost(cid).bytes if kb else 0
            a += after.cost(cid).bytes if ka else 0
    return b, a


def _consumer_group(state: State, consumer_owned, node: int, group_ids: dict[int, int]) -> int:
    """The final group that holds the recomputed copy of `node` for a consumer that owned
    `consumer_owned` when the decision was made (it may have merged since)."""
    holders = [cid for cid, c in state.clusters.items() if node in c.copies]
    for n in sorted(consumer_owned):
        cid = state.owner.get(n)
        if cid in holders:
            return group_ids[cid]
    return group_ids[holders[0]] if holders else -1


def _refusals(state: State, gid: dict[int, int], names: dict[int, str]) -> tuple[list[Rejection], list[tuple]]:
    rejected: list[Rejection] = []
    recompute: list[tuple] = []
    graph = state.graph
    reach = Reach(state)
    for gain, move, after in scored_moves(state):
        why = legality(state, after, move, reach)
        if move.kind == "recompute":
            if why is None and gain <= 0:
                recompute.append((move, state.commit(after)))
            continue
        ka, kb = kind_of(graph, state.clusters[move.a].nodes), kind_of(graph, state.clusters[move.b].nodes)
        if move.kind == "sibling" and (gain <= 0 or ka != kb):
            continue   # two unrelated readers of one tensor: only worth a line when fusing them would pay
        if why is None:
            if gain > 0:
                continue
            why = "no bytes saved" if gain == 0 else f"fusing costs {-gain} more bytes"
        first, second = sorted((move.a, move.b), key=gid.__getitem__)
        rejected.append(Rejection(f"g{gid[first]} {names[first]}", f"g{gid[second]} {names[second]}", why, gain))
    rejected.sort(key=lambda r: (int(r.a.split()[0][1:]), int(r.b.split()[0][1:])))
    return rejected, recompute


def build_plan(state: State, applied: list[tuple[Move, State, State]], machine: ledger.Machine) -> Plan:
    graph = state.graph
    order = _ordered_clusters(state)
    gid = {cid: i for i, cid in enumerate(order)}
    topo = graph.topo_order()
    eager_views = ledger.eager_views(graph)
    names: dict[int, str] = {}
    fields: list[dict] = []   # each group's Group fields; reasons grow with the recompute decisions below
    for cid in order:
        c = state.clusters[cid]
        nodes = [n for n in topo if n in c.nodes]
        kind = kind_of(graph, nodes)
        anchor = _anchor(graph, kind, nodes)
        outputs = [n for n in topo if n in state.outputs[cid]]
        inputs = [n for n in topo if n in state.reads[cid]]
        cost = state.cost(cid)
        lb, bound = ledger.lower_bound_us(machine, cost, kind, _dtype(graph, kind, anchor))
        eager = sum(ledger.node_cost(graph, n, eager_views).bytes for n in c.owned)
        names[cid] = group_name(graph, kind, nodes, anchor)
        fields.append(dict(id=gid[cid], kind=kind, nodes=nodes, inputs=inputs, outputs=outputs, name=names[cid],
                           anchor=anchor, bytes_in=cost.bytes_in, bytes_out=cost.bytes_out,
                           bytes_saved=eager - cost.bytes, flops=cost.flops, lower_bound_us=lb, bound=bound,
                           reason=_reason(graph, kind, nodes, anchor, outputs),
                           spec=derive_spec(graph, kind, nodes, anchor, gid[cid])))
    rejected, refused = _refusals(state, gid, names)
    decisions: list[Recompute] = []
    for move, before, after in applied:
        b, a = _local_bytes(before, after)
        g = _consumer_group(state, before.clusters[move.b].owned, move.node, gid)
        if g < 0:
            continue   # the consumer later merged with the owner: nothing is recomputed in the end
        decisions.append(Recompute(move.node, graph.node(move.node).op, g, True, a, b,
                                   f"recomputing {describe(graph, move.node)} saves {b - a} bytes"))
        fields[g]["reason"] = "; ".join(filter(None, [fields[g]["reason"], f"recomputes {describe(graph, move.node)}"]))
    for move, after in refused:
        b, a = _local_bytes(state, after)
        decisions.append(Recompute(move.node, graph.node(move.node).op, gid[move.b], False, a, b,
                                   f"recomputing {describe(graph, move.node)} would cost {a - b} more bytes"))
    groups = [Group(**f) for f in fields]
    return Plan(graph.name, groups, rejected, ledger.unfused_bytes(graph), machine.name, decisions)


def resymbolise(plan: Plan, graph: Graph, machine: ledger.Machine, baseline: Graph | None) -> Plan:
    """`plan`, made on `graph.hinted()`, with its ledger figures, reasons and specs from the
    symbolic `graph` (same node ids): bytes, flops and bounds become expressions in the
    symbols. Refused candidates and recompute decisions keep their figures at the hints."""
    eager_views = ledger.eager_views(graph)
    groups = []
    for g in plan.groups:
        cost = ledger.group_cost(graph, set(g.nodes), g.outputs)
        lb, bound = ledger.lower_bound_us(machine, cost, g.kind, _dtype(graph, g.kind, g.anchor))
        owned = [n for n in g.nodes if plan.group_of(n) is g]
        eager = sum(ledger.node_cost(graph, n, eager_views).bytes for n in owned)
        groups.append(replace(g, bytes_in=cost.bytes_in, bytes_out=cost.bytes_out, bytes_saved=eager - cost.bytes,
                              flops=cost.flops, lower_bound_us=lb, bound=bound,
                              reason=_reason(graph, g.kind, list(g.nodes), g.anchor, list(g.outputs)),
                              spec=derive_spec(graph, g.kind, list(g.nodes), g.anchor, g.id)))
    return replace(plan, groups=tuple(groups), unfused_bytes=ledger.unfused_bytes(baseline or graph))

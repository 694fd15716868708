"""Text rendering of a Plan (what `--dump-plan` and `compiled.explain()` print).

    plan for gpt_block; bounds on the H200 model (4265 GB/s, bf16 685 TFLOP/s)
     #  kind       name          nodes           in        out     saved   flops  bound µs  bound
     0  reduction  layernorm     %1-%12 (12)   2.1 MB   2.1 MB    8.4 MB  ...
    unfused 40.3 MB  ->  planned 12.1 MB  (0.30 of unfused, 3.33x fewer bytes); 9 groups (8 Triton
    kernels, 1 through PyTorch), ... flops, lower bound on the H200 model 12.345 µs
    refused:
      g0 layernorm -> g1 bias: the gemm prologue holds only views and casts; ...
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from minicomp.errors import MinicompError
from minicomp.ir import dims
from minicomp.plan.cost import fmt_bytes, fmt_flops, get_machine

# The bounds are a roofline on a machine *model* (cost.MACHINES), whatever device runs the
# kernels: every label that shows one names the model.


def compress_ids(ids: list[int]) -> str:
    """[3, 4, 5, 9] -> `%3-%5,%9`."""
    ids = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(f"%{ids[i]}" if i == j else f"%{ids[i]}-%{ids[j]}")
        i = j + 1
    return ",".join(parts)


def _model_name(machine: str) -> str:
    try:
        return get_machine(machine).name
    except MinicompError:        # a Plan built by hand may name a machine the table lacks
        return machine


def model_words(machine: str) -> str:
    """`the H200 model (4265 GB/s, bf16 685 TFLOP/s)`."""
    try:
        m = get_machine(machine)
    except MinicompError:
        return f"the {machine} model"
    peak = m.matmul_flops.get("bf16", m.vector_flops)
    return f"the {m.name} model ({m.bytes_per_s / 1e9:.0f} GB/s, bf16 {peak / 1e12:.0f} TFLOP/s)"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def callee(why: str) -> str:
    """The library a group calls, read from why it does (a `GeneratedModule.library` value, which
    names it first: "cuBLAS: nothing to fuse", "SDPA: nothing to fuse (...)")."""
    return why.split(":", 1)[0]


def library_counts(library: Mapping[int, str]) -> str:
    """`1 through cuBLAS, 2 through SDPA`: the `library` groups (group id -> why), per library."""
    called = Counter(callee(why) for why in library.values() if why)
    return ", ".join(f"{n} through {name}" for name, n in sorted(called.items(), key=lambda kv: kv[0].lower()))


def group_count(plan, fallbacks: Mapping[int, str], library: Mapping[int, str] | None = None) -> str:
    """`3 groups (1 Triton kernel, 1 through cuBLAS, 1 through PyTorch)`: a fallback is no kernel
    of ours, nor is a `library` group (group id -> why it calls cuBLAS or SDPA: `GeneratedModule.library`)."""
    library = {g.id: library[g.id] for g in plan.groups if (library or {}).get(g.id)}
    torch_groups = sum(1 for g in plan.groups if fallbacks.get(g.id) or g.kind == "opaque")
    parts = [_n(len(plan.groups) - torch_groups - len(library), "Triton kernel")]
    if library:
        parts.append(library_counts(library))
    if torch_groups:
        parts.append(f"{torch_groups} through PyTorch")
    return f"{_n(len(plan.groups), 'group')} ({', '.join(parts)})"


def _row(cells: list[str], widths: list[int], right: set[int]) -> str:
    return "  ".join(c.rjust(w) if k in right else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths))).rstrip()


def render(plan, fallbacks: Mapping[int, str], library: Mapping[int, str] | None = None) -> str:
    """`plan` as text; `fallbacks` (group id -> reason) marks the groups that run through PyTorch,
    `library` (group id -> reason) those that call a library (cuBLAS, SDPA)."""
    library = library or {}
    head = ["#", "kind", "name", "nodes", "in", "out", "saved", "flops", "bound µs", "bound"]
    rows = []
    for g in plan.groups:
        nodes = compress_ids(g.nodes)
        if len(nodes) > 28:
            nodes = nodes[:25] + "..."
        rows.append([str(g.id), g.kind, g.name or "-", f"{nodes} ({len(g.nodes)})", fmt_bytes(g.bytes_in),
                     fmt_bytes(g.bytes_out), fmt_bytes(g.bytes_saved), fmt_flops(g.flops),
                     f"{g.lower_bound_us:.3f}", g.bound + (" (fallback)" if fallbacks.get(g.id) else f" ({callee(library[g.id])})" if library.get(g.id) else "")])
    widths = [max(len(r[k]) for r in rows + [head]) for k in range(len(head))]
    right = {0, 4, 5, 6, 7, 8}
    lines = [f"plan for {plan.graph_name}; bounds on {model_words(plan.machine)}", _row(head, widths, right)]
    lines += [_row(r, widths, right) for r in rows]
    planned, unfused = plan.total_bytes, plan.unfused_bytes
    fewer = f", {dims.ratio(unfused, planned):.2f}x fewer bytes" if planned else ""
    lines.append(f"unfused {fmt_bytes(unfused)}  ->  planned {fmt_bytes(planned)}  "
                 f"({plan.ratio:.2f} of unfused{fewer}); {group_count(plan, fallbacks, library)}, "
                 f"{fmt_flops(plan.total_flops)} flops, lower bound on the {_model_name(plan.machine)} model "
                 f"{plan.lower_bound_us:.3f} µs")
    for g in plan.groups:
        if g.reason:
            lines.append(f"  g{g.id} {g.name}: {g.reason}")
        if fallbacks.get(g.id):
            lines.append(f"  g{g.id} runs through PyTorch: {fallbacks[g.id]}")
        if library.get(g.id):
            lines.append(f"  g{g.id} calls {library[g.id]}")
    if plan.rejected:
        lines.append("refused:")
        for r in plan.rejected:
            saved = f" (would save {fmt_bytes(r.bytes)})" if r.bytes > 0 else ""
            lines.append(f"  {r.a} + {r.b}: {r.reason}{saved}")
    if plan.recomputed:
        lines.append("recompute or materialise:")
        for d in plan.recomputed:
            verdict = "recomputed in" if d.chosen else "materialised for"
            lines.append(f"  %{d.node} ({d.op}) {verdict} g{d.group}: recompute {fmt_bytes(d.bytes_recompute)} "
                         f"vs materialise {fmt_bytes(d.bytes_materialise)}")
    return "\n".join(lines)

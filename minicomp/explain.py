"""How the CLI explains a compiled graph beyond the plan table: fallbacks, a picture, timings.

- `fallback_notes(plan, graph, fallbacks)`: one line per node or group that runs through
  PyTorch instead of a Triton kernel, and why (printed by `minicomp compile` on stderr).
- `graph_dot(graph, plan, fallbacks)` / `write_graph(path, graph, plan, fallbacks, notes)`: the
  graph as DOT, each node filled with the colour of the group that writes it (else the first
  that computes it), with a legend of the groups; SVG beside it when Graphviz's `dot` is
  installed, and else (or when `dot` fails) one line in `notes` saying why there is none.
- `device_words(device)` / `bound_line(plan, device)`: the device the kernels run (or would
  run) on, and the plan's roofline bound labelled with the machine model it is for; on a
  device that model does not describe, the line says so.
- `bench(compiled, inputs)` (CUDA only): the whole call's median time against the plan's
  lower bound, and each kernel group's own time (from the profiler) against its bound;
  `bench_lines` formats either, so the text is testable without a GPU.

"% of bound" is the group's roofline lower bound over its measured time: 100% would be a
kernel that moves its bytes (or does its flops) at the machine's peak. `fallbacks` is the
generated module's record (`GeneratedModule.fallbacks`: group id -> why it runs through
PyTorch); the plan holds only what the planner decided.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from minicomp.ir.graph import Graph
from minicomp.ir.printer import to_dot
from minicomp.plan.cost import MACHINES
from minicomp.plan.records import Plan
from minicomp.plan.table import callee


def fallback_notes(plan: Plan, graph: Graph, fallbacks: Mapping[int, str]) -> list[str]:
    """What runs through PyTorch rather than a Triton kernel: opaque nodes, then fallen-back groups."""
    notes = []
    opaque = [n for n in graph.nodes() if n.op == "opaque"]
    if opaque:
        notes.append(f"note: {len(opaque)} node(s) run through PyTorch (not compiled): " +
                     ", ".join(f"%{n.id} {n.attrs.get('target')}" + (f" ({n.origin})" if n.origin else "")
                               for n in opaque))
    for g in plan.groups:
        if fallbacks.get(g.id) and g.kind != "opaque":
            what = f"{g.kind} {g.name}".strip()
            notes.append(f"note: group {g.id} ({what}) runs through PyTorch, not a Triton kernel: {fallbacks[g.id]}")
    return notes


def node_groups(plan: Plan, graph: Graph) -> dict[int, int]:
    """Node id -> the group that writes it, else the first group that computes it."""
    out = {}
    for n in graph.nodes():
        g = plan.group_of(n.id)
        if g is not None:
            out[n.id] = g.id
    return out


def graph_dot(graph: Graph, plan: Plan, fallbacks: Mapping[int, str] | None = None) -> str:
    """DOT text: nodes coloured by group (the printer's palette) and a legend naming each group."""
    fallbacks = fallbacks or {}
    text = to_dot(graph, node_groups(plan, graph)).rstrip()
    assert text.endswith("}")
    rows = [f"g{g.id}: {g.kind} {g.name}".strip() + (" (PyTorch)" if fallbacks.get(g.id) else "")
            for g in plan.groups]
    legend = "\\l".join(rows) + "\\l"
    return text[:-1] + f'  legend [shape=note, label="{legend}", fillcolor="#ffffff"];\n}}\n'


def write_graph(path: str | Path, graph: Graph, plan: Plan, fallbacks: Mapping[int, str] | None = None,
                notes: list[str] | None = None) -> list[Path]:
    """Write the DOT file, and an SVG beside it when `dot` is on PATH; returns the files written.
    When no SVG is written, why is appended to `notes` (one line)."""
    path = Path(path)
    path.write_text(graph_dot(graph, plan, fallbacks))
    written = [path]
    svg = path.with_suffix(".svg")
    why = ""
    dot = shutil.which("dot")
    if dot is None:
        why = f"no {svg.name}: Graphviz's `dot` is not installed (install graphviz, or render {path.name} elsewhere)"
    else:
        try:
            r = subprocess.run([dot, "-Tsvg", str(path), "-o", str(svg)], capture_output=True, text=True,
                               timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"no {svg.name}: running {dot} failed ({type(e).__name__})"
        else:
            if r.returncode == 0:
                written.append(svg)
            else:
                detail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[0]
                why = f"no {svg.name}: {dot} failed: {detail}"
    if why and notes is not None:
        notes.append(why)
    return written


# ----------------------------------------------------------------------------- device and bounds

def device_words(device: Any) -> str:
    """`cpu (Triton's interpreter)` or `cuda:0 (NVIDIA H200)`."""
    import torch
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"{device.type} (Triton's interpreter)"


def bound_line(plan: Plan, device: Any) -> str:
    """The plan's lower bound, named as the machine model's, and how that model relates to `device`."""
    import torch
    device = torch.device(device)
    model = plan.machine
    line = f"bound on the {model} model: {plan.lower_bound_us:.3f} µs (a roofline of the plan's bytes and flops)"
    if device.type != "cuda":
        return line + f"; not a time for {device.type}, where the kernels run under Triton's interpreter"
    name = torch.cuda.get_device_name(device)
    if model.lower() in name.lower():
        return line + f"; this device is {name}"
    like = [k for k in MACHINES if k in name.lower()]
    hint = f"; --machine {like[0]} models it" if like else ""
    return line + f"; this device is {name}, not the {model}{hint}"


# ----------------------------------------------------------------------------- timings (CUDA)

@dataclass
class BenchResult:
    total_us: float                                              # median of the whole call
    group_us: dict[int, float] = field(default_factory=dict)     # group id -> its kernel's mean time


def _profile_kernels(call: Callable[[], Any], names: Sequence[str], reps: int = 20) -> dict[str, float]:
    """Mean device time (µs) per launch of each named kernel over `reps` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    out = {}
    for evt in prof.key_averages():
        if evt.key in names and evt.count:
            total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
            out[evt.key] = total / evt.count
    return out


def bench(compiled, inputs: Sequence[Any]) -> BenchResult:
    """Time a compiled call on CUDA: the whole call (do_bench), and each kernel if the profiler can."""
    import triton.testing

    run = lambda: compiled.call(*inputs)   # noqa: E731
    # the caller has waited for the kernels compiling in the background (a first call's eager
    # answers are not what this times): the CLI's check, the api's `report`
    result = BenchResult(total_us=triton.testing.do_bench(run) * 1000.0)
    gen = compiled.generated
    groups = gen.kernel_groups
    try:
        for name, us in _profile_kernels(run, list(groups)).items():
            # a kernel several groups launch (codegen/dedup.py): each is given its mean per launch
            for gid in gen.kernel_users.get(name) or [groups[name]]:
                result.group_us[gid] = result.group_us.get(gid, 0.0) + us
    except Exception as e:   # the profiler is optional: the whole-call figure still stands
        print(f"bench: per-kernel times unavailable ({type(e).__name__}: {e})")
    return result


def _pct(bound: float, measured: float) -> str:
    return f"{100.0 * bound / measured:5.1f}%" if measured > 0 else "    -"


def bench_lines(plan: Plan, result: BenchResult, fallbacks: Mapping[int, str] | None = None,
                library: Mapping[int, str] | None = None) -> list[str]:
    """The timings against the plan's bounds, one line for the call and one per group
    (`library`: the groups that call cuBLAS or SDPA, `GeneratedModule.library`)."""
    lines = [f"bench: {result.total_us:.1f} µs per call (median, triton.testing.do_bench); "
             f"bound on the {plan.machine} model {plan.lower_bound_us:.1f} µs: "
             f"{_pct(plan.lower_bound_us, result.total_us).strip()} of bound"]
    if not result.group_us:
        return lines
    width = max(len(f"{g.kind} {g.name}") for g in plan.groups)
    for g in plan.groups:
        what = f"{g.kind} {g.name}".ljust(width)
        if g.id in result.group_us:
            us = result.group_us[g.id]
            lines.append(f"  g{g.id:<3} {what}  {us:9.1f} µs  bound {g.lower_bound_us:9.1f} µs  "
                         f"{_pct(g.lower_bound_us, us)} of bound")
        else:
            called = (library or {}).get(g.id)
            why = "PyTorch" if (fallbacks or {}).get(g.id) else callee(called) if called else "no kernel"
            lines.append(f"  g{g.id:<3} {what}  {'-':>9}     bound {g.lower_bound_us:9.1f} µs  ({why})")
    return lines

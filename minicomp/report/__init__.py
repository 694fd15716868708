"""The report page of one compiled graph: `render(compiled)` -> HTML text, `write(path, compiled)`.

    minicomp report samples/llama_block.py -o report.html [--bench]
    f = minicomp.compile(fn); f(x); f.report("report.html")

One self-contained HTML file: the fused graph (inline SVG, laid out in pure Python by
`report.layout`, so it looks the same on every machine; no Graphviz), the plan with every
refused fusion, each kernel beside the user's lines, a roofline of the groups on the
machine model, and the ledger totals. It loads nothing: no script, no font, no stylesheet
from elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from minicomp.plan.cost import Machine, get_machine
from minicomp.report.page import PageInput, render_page

__all__ = ["render", "write", "signature_inputs", "source_file"]


def source_file(fn) -> str | None:
    """The file that defines `fn` (a function, an nn.Module instance or class), as a path relative
    to the working directory when it lies below it; None when Python cannot say."""
    import inspect
    target = fn if inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn) else type(fn)
    try:
        found = inspect.getsourcefile(target)
    except TypeError:
        return None
    if found is None:
        return None
    try:
        return os.path.relpath(found) if not os.path.relpath(found).startswith("..") else found
    except ValueError:   # another drive (Windows)
        return found


def signature_inputs(compiled) -> list:
    """Seeded random inputs of `compiled`'s signature (shapes, dtypes, strides, device): what
    `CompiledFunction.report(bench=True)` times when it has no inputs of the user's."""
    import torch

    from minicomp.ir.interpret import random_inputs
    device = getattr(compiled.call, "device", "cpu")
    out = []
    for nid, t in zip(compiled.graph.inputs, random_inputs(compiled.graph, seed=0)):
        strides = compiled.graph.node(nid).layout or t.stride()
        out.append(torch.empty_strided(t.shape, tuple(strides), dtype=t.dtype, device=device).copy_(t))
    return out


def _ran_on(compiled) -> str:
    device_type = getattr(compiled.generated, "device_type", "cpu")
    if device_type == "cuda":
        import torch
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "a CUDA device"
        return f"{name} (CUDA)"
    return "the CPU, under Triton's interpreter"


def render(compiled, *, machine: str | Machine | None = None, source: str | os.PathLike | None = None,
           bench=None, bench_requested: bool = False) -> str:
    """The page for `compiled` (a `minicomp.api.Compiled`). `machine`: the model the plan was
    made for (default: the plan's own); `source`: the program's file, for the header;
    `bench`: an `explain.BenchResult` for measured points; `bench_requested`: timings were
    asked for (the page then says why there are none, when there are none)."""
    model = get_machine(machine if machine is not None else compiled.plan.machine)
    ran_on = _ran_on(compiled)
    on_gpu = getattr(compiled.generated, "device_type", "cpu") == "cuda"
    if bench is not None and bench.group_us:
        note = f"timed on {ran_on}: each kernel's mean time from the PyTorch profiler."
    elif bench is not None:
        note = "the call was timed, but the profiler gave no per-kernel times."
    elif bench_requested and not on_gpu:
        note = ("none on the CPU: timings need a CUDA device (here the kernels run under Triton's "
                "interpreter).")
    elif on_gpu:
        note = "none: not timed (`minicomp report FILE --bench` adds them)."
    else:
        note = ("none: this compile runs on the CPU under Triton's interpreter; "
                "`minicomp report FILE --bench` on a GPU adds them.")
    page = PageInput(compiled, model, None if source is None else str(source), ran_on,
                     dict(bench.group_us) if bench is not None else None,
                     bench.total_us if bench is not None else None, note)
    return render_page(page)


def write(path: str | os.PathLike, compiled, **options) -> Path:
    """Write `render(compiled, **options)` to `path` (UTF-8); returns the path."""
    path = Path(path)
    path.write_text(render(compiled, **options), encoding="utf-8")
    return path

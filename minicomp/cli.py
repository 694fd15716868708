"""The `minicomp` command.

    minicomp compile FILE [--dump-ir] [--dump-plan] [--check] [--emit DIR] ...
    minicomp report FILE [-o report.html] [--bench]
    minicomp --version                   (also: python -m minicomp ...)

FILE is a `.py` model file (a callable plus `example_inputs()`) or a `.mc` DSL program,
whose entry is `--entry NAME`, else the function named `main`, else the only function that
no other function of the file calls (and whose name does not start with `_`).

Exit status: 0 success; 1 an error in the input (one paragraph on stderr, with
`file:line:col`, the line and a caret where there is one, never a traceback) or a failed
`--check`; 2 bad usage: an unknown option or command (argparse's own convention), a bad
`--dim`, `--passes` or `--machine`, or an entry the user must choose (`UsageError`).

Invariants:
- option values that need no FILE (`--dim`'s form, `--passes`, `--machine`, `--device`) are
  checked before FILE is read, so a typo costs no capture;
- nothing runs, and a `.mc` program's random inputs are not built, unless `--check` or
  `--bench` asks: dumps and `--emit` need only shapes and strides, which meta tensors
  carry without memory (so `--dump-ir` of a 100000 x 100000 program allocates nothing);
- times in the plan are roofline bounds on a machine *model* (`--machine`), labelled so,
  beside the device the kernels run, or would run, on.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from minicomp import __version__, check, explain
from minicomp.errors import MinicompError, UsageError


def _parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--dim expects NAME=INT, got {item!r}")
        try:
            dims[name] = int(value)
        except ValueError:
            raise UsageError(f"--dim {name}: {value!r} is not an integer") from None
        if dims[name] < 0:
            raise UsageError(f"--dim {name}={value}: a dimension is a non-negative integer")
    return dims


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"minicomp {__version__}"]
    for dist in ("torch", "triton"):   # read from metadata: importing triton here would cost ~1 s
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return ", ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minicomp", description="A small graph-to-Triton-kernel compiler.")
    p.add_argument("--version", action="version", version=_versions())
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model file (.py) or DSL program (.mc)")
    c.add_argument("file", help="a .py model file or a .mc DSL program")
    c.add_argument("--entry", help="the callable (.py) or function (.mc) to compile")
    c.add_argument("--dim", action="append", default=[], metavar="NAME=INT", help="bind a DSL dimension symbol")
    c.add_argument("--dump-ir", action="store_true", help="print the IR after the passes")
    c.add_argument("--dump-input-ir", action="store_true", help="print the IR as captured, before passes")
    c.add_argument("--dump-plan", action="store_true", help="print the fusion plan and its ledger")
    c.add_argument("--dump-graph", metavar="FILE.dot",
                   help="write the graph as DOT, coloured by group (and FILE.svg when Graphviz's dot is installed)")
    c.add_argument("--emit", metavar="DIR", help="write the generated Triton module (and its constants) to DIR")
    c.add_argument("--check", action="store_true", help="run the compiled kernels and compare with eager PyTorch")
    c.add_argument("--bench", action="store_true",
                   help="on a GPU, after the check: time the call and each kernel against the plan's bounds")
    c.add_argument("--device", choices=["cpu", "cuda"], help="where to run --check (default: cuda if present)")
    c.add_argument("--passes", help="comma-separated pass pipeline (default: the standard one)")
    c.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")
    c.add_argument("--dump-dir", metavar="DIR", help="write the IR after every pass to DIR/00N_<pass>.txt")
    c.add_argument("--time-passes", action="store_true", help="print how long each pass took")
    c.add_argument("--machine", default="h200",
                   help="machine model for the cost model's bounds: h200 (default), h100, a100")
    c.add_argument("--verify-target", metavar="cuda:NN",
                   help="also compile every kernel for this GPU with Triton's own compiler, no GPU needed "
                        "(cuda:90, cuda:80, ...; default $MINICOMP_VERIFY_TARGET)")

    # `minicomp report`: the HTML page (minicomp/report/); its own block, kept apart from `compile`'s
    r = sub.add_parser("report", help="write one self-contained HTML page: fused graph, plan, kernels, roofline")
    r.add_argument("file", help="a .py model file or a .mc DSL program")
    r.add_argument("-o", "--output", default="report.html", metavar="FILE.html", help="where (default report.html)")
    r.add_argument("--entry", help="the callable (.py) or function (.mc) to compile")
    r.add_argument("--dim", action="append", default=[], metavar="NAME=INT", help="bind a DSL dimension symbol")
    r.add_argument("--passes", help="comma-separated pass pipeline (default: the standard one)")
    r.add_argument("--machine", default="h200", help="machine model for the plan and the roofline (default h200)")
    r.add_argument("--device", choices=["cpu", "cuda"], help="where the kernels run (default: cuda if present)")
    r.add_argument("--bench", action="store_true",
                   help="on a GPU: check against eager, then time each kernel for the roofline's measured points")
    return p


@dataclass
class Job:
    """What `_load` found: the graph, and how to get inputs and the reference, on demand."""
    graph: Any                                     # minicomp.ir.graph.Graph, fresh from a frontend
    inputs: Callable[[], list]                     # the example inputs (a .mc program's are built here)
    shapes: Callable[[], list]                     # tensors with the inputs' shapes and strides, for layouts
    eager: Callable[[list], list]                  # inputs -> the reference outputs, flat
    reference: str                                 # what --check compares with, in words
    inputs_from: str                               # where the inputs come from, in words
    n_args: int | None = None                      # the user's arguments among the inputs (the rest: weights)


def _load(args, dims) -> Job:
    import torch

    runs = bool(getattr(args, "check", False) or getattr(args, "bench", False))

    path = Path(args.file)
    if not path.exists():
        raise MinicompError(f"{args.file}: no such file")
    if path.suffix == ".mc":
        from minicomp.frontend.dsl import load_dsl, read_program
        from minicomp.ir.interpret import run
        # symbols no --dim binds stay symbolic for the dumps; a run needs every size
        graph = load_dsl(read_program(path), str(args.file), entry=args.entry, dims=dims, symbolic=not runs)
        reference = graph.copy()
        return Job(graph, lambda: _random_inputs(graph, args.file), lambda: _meta_inputs(graph, args.file),
                   lambda ins: run(reference, ins),
                   "minicomp's reference interpreter (the program run op by op in PyTorch)",
                   "random, seed 0: normal floats, small integers, coin-flip bools")
    if dims:
        raise UsageError(f"--dim binds the symbols of a .mc program; {args.file} is not one")
    if path.suffix == ".py":
        from minicomp.frontend.fx import call_inputs, capture
        from minicomp.frontend.loader import load_model_file
        from minicomp.target import capture_mode
        fn, inputs = load_model_file(str(path), args.entry)
        graph = capture(fn, inputs, tracer=capture_mode())     # $MINICOMP_CAPTURE, read here at the boundary
        count = len(inputs)
        every = call_inputs(graph, inputs)      # the arguments, then the weights (graph inputs too)

        def eager(ins):
            with torch.no_grad():
                out = fn(*ins[:count])      # the arguments; the rest are the weights, which fn reads itself
            flat, _ = torch.utils._pytree.tree_flatten(out)
            return flat
        return Job(graph, lambda: list(every), lambda: list(every), eager, "eager PyTorch (the model file's "
                   "callable on the same inputs)", "from the file's example_inputs()", count)
    raise MinicompError(f"{args.file}: expected a .py model file or a .mc program, not {path.suffix or 'no suffix'!r}")


def _meta_inputs(graph, shown: str) -> list:
    """Tensors with the shapes, dtypes and (contiguous) strides of a .mc program's inputs, and
    no memory: what the layout pass needs when nothing runs."""
    import torch

    from minicomp.ir.dims import any_symbolic

    nodes = [graph.node(i) for i in graph.inputs]
    if any(any_symbolic(n.shape) for n in nodes):
        return [None] * len(nodes)      # symbolic sizes: contiguous layouts (compile_graph)
    try:
        return [torch.empty(n.shape, dtype=n.dtype, device="meta") for n in nodes]
    except (RuntimeError, TypeError, OverflowError) as e:      # sizes past int64
        raise MinicompError(f"{shown}: the inputs of {graph.name} are too large to describe: "
                            f"{str(e).splitlines()[0]}") from None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):             # no sysconf, or no such name here
        return None


def _random_inputs(graph, shown: str) -> list:
    """A .mc program's seeded random inputs, refused up front when they cannot fit in memory
    (a program's dims are easily huge, and a failed allocation would be a traceback)."""
    from minicomp.ir.dtypes import itemsize
    from minicomp.ir.interpret import random_inputs
    from minicomp.plan.cost import fmt_bytes

    need = sum(n.numel * itemsize(n.dtype) for n in map(graph.node, graph.inputs))
    have = _memory_bytes()
    what = f"{shown}: --check needs random inputs for {graph.name}"
    if have and need > have:
        raise MinicompError(f"{what}: {fmt_bytes(need)}, more than this machine's {fmt_bytes(have)} of memory; "
                            "bind smaller dims with --dim")
    try:
        return random_inputs(graph, seed=0)
    except (RuntimeError, MemoryError) as e:    # the allocator's refusal
        raise MinicompError(f"{what} ({fmt_bytes(need)}), which could not be built: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _options(args):
    """The compile options, every name checked (a bad one is a UsageError: exit 2)."""
    from minicomp.api import Options
    from minicomp.passes.manager import resolve_pipeline
    from minicomp.plan.cost import get_machine
    from minicomp.target import parse_verify_target

    try:
        get_machine(args.machine)
        parse_verify_target(getattr(args, "verify_target", None))
        passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
        resolve_pipeline(passes)
    except UsageError:
        raise
    except MinicompError as e:
        raise UsageError(str(e)) from None
    return Options(passes=passes, machine=args.machine, print_after_all=getattr(args, "print_after_all", False),
                   dump_dir=getattr(args, "dump_dir", None), time_passes=getattr(args, "time_passes", False),
                   verify_target=getattr(args, "verify_target", None))


def _device(args) -> str:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise MinicompError("--device cuda: no CUDA device is available here")
    return device          # CPU modules switch Triton's interpreter on as they load (runtime/loader.py)


def _check(compiled, inputs, job: Job, device: str):
    """-> (all outputs agree, the Compiled that ran: another one when Triton rejected a kernel)."""
    from minicomp.api import run_compiled

    compiled, got = run_compiled(compiled, inputs)   # a kernel Triton rejects on this GPU runs through PyTorch
    from minicomp.runtime import background
    if background.any_pending():    # eager answered for kernels still compiling (codegen/first_calls.py):
        background.wait_compiled()  # the check is of what the kernels compute
        compiled, got = run_compiled(compiled, inputs)
    want = job.eager(inputs)
    names = [job.graph.node(i).attrs.get("name", f"#{k}") for k, i in enumerate(job.graph.inputs)]
    n = len(inputs) if job.n_args is None else job.n_args
    shown = f"{check.describe_inputs(inputs[:n], names)} ({job.inputs_from})"
    if len(inputs) > n:    # the weights are inputs of the compiled call too; the model reads its own
        shown += f", and the model's {len(inputs) - n} weight tensor(s)"
    ok, lines = check.report(check.compare(got, want), len(got), len(want), job.reference,
                             explain.device_words(device), shown)
    print("\n".join(lines))
    return ok, compiled


def cmd_compile(args) -> int:
    from minicomp.api import compile_graph
    from minicomp.plan.table import group_count

    dims = _parse_dims(args.dim)
    options = _options(args)
    device = _device(args)
    job = _load(args, dims)
    if args.dump_input_ir:
        print(job.graph.dump(), end="\n\n")
    runs = args.check or args.bench    # timings of unchecked results mean nothing: --bench checks first
    if job.graph.symbolic:
        return _symbolic_dumps(args, job, options, device)
    if runs:
        inputs = [t.to(device) for t in job.inputs()]
        compiled = compile_graph(job.graph, inputs, options)
    else:
        compiled = compile_graph(job.graph, job.shapes(), options, device=device, load=False)
    fallbacks = _dumps(args, compiled)
    where = "runs on" if runs else "would run on"
    print(f"compiled {compiled.graph.name}: {group_count(compiled.plan, fallbacks, compiled.generated.library)} in "
          f"{compiled.compile_seconds * 1000:.0f} ms (before Triton's JIT); {where} {explain.device_words(device)}" + ("" if runs else "; --check runs it"))
    print(explain.bound_line(compiled.plan, device))
    if runs:
        ok, compiled = _check(compiled, inputs, job, device)
        if not ok:
            return 1
        if args.bench and device != "cuda":
            print("bench: skipped, timings need a CUDA device (the CPU runs Triton's interpreter)")
        elif args.bench:
            for line in explain.bench_lines(compiled.plan, explain.bench(compiled, inputs),
                                            fallbacks=compiled.generated.fallbacks,   # the module that ran
                                            library=compiled.generated.library):
                print(line)
    return 0


def _dumps(args, compiled) -> dict:
    """What --dump-ir, --dump-plan, --dump-graph and --emit ask for, after the fallback notes;
    returns the generated module's fallbacks."""
    fallbacks = compiled.generated.fallbacks
    for note in explain.fallback_notes(compiled.plan, compiled.graph, fallbacks):
        print(note, file=sys.stderr)
    if args.dump_ir:
        print(compiled.graph.dump(), end="\n\n")
    if args.dump_plan:
        print(compiled.plan.table(fallbacks=fallbacks, library=compiled.generated.library), end="\n\n")
    if args.dump_graph:
        notes: list[str] = []
        for path in explain.write_graph(args.dump_graph, compiled.graph, compiled.plan, fallbacks, notes):
            print(f"wrote {path}")
        for note in notes:
            print(note)
    if args.emit:
        print(f"wrote {compiled.generated.write(args.emit)}")
    return fallbacks


def _symbolic_dumps(args, job: Job, options, device: str) -> int:
    """A .mc program with sizes no --dim binds: its IR and plan over the symbols (the ledger's
    bytes and bounds as expressions), and with --emit the module that serves every size
    (codegen/sizes.py). Running it (--check, --bench) needs sizes: bind them with --dim."""
    from minicomp.api import compile_graph
    from minicomp.ir.dims import symbols
    from minicomp.plan.table import group_count

    shapes = [job.graph.node(i).shape for i in job.graph.inputs]
    syms = symbols(*(d for shape in shapes for d in shape))
    compiled = compile_graph(job.graph, [None] * len(shapes), options, device=device, load=False)
    fallbacks = _dumps(args, compiled)
    names = ", ".join(s.name for s in syms)
    print(f"compiled {compiled.graph.name} over symbolic sizes {names} (each in [2, 2**31 - 1]; the plan decides at "
          f"{', '.join(f'{s.name}={s.hint}' for s in syms)}): {group_count(compiled.plan, fallbacks, compiled.generated.library)}, one module for "
          f"every size; bind the sizes with --dim to --check it")
    print(explain.bound_line(compiled.plan, "cpu"))
    return 0


def _report_main(args) -> int:
    """`minicomp report FILE -o report.html [--bench]`: compile as `compile` does, write the page.
    Only `--bench` on a GPU runs anything (and builds a .mc program's inputs)."""
    from minicomp import report
    from minicomp.api import compile_graph

    dims = _parse_dims(args.dim)
    options = _options(args)
    device = _device(args)
    job = _load(args, dims)
    timed = None
    if args.bench and device == "cuda":
        inputs = [t.to(device) for t in job.inputs()]
        ok, compiled = _check(compile_graph(job.graph, inputs, options), inputs, job, device)
        if not ok:   # timings of wrong results mean nothing
            return 1
        timed = explain.bench(compiled, inputs)
    else:
        compiled = compile_graph(job.graph, job.shapes(), options, device=device, load=False)
        if args.bench:
            print("bench: skipped, timings need a CUDA device (the CPU runs Triton's interpreter); "
                  "the roofline shows bounds only")
    try:
        path = report.write(args.output, compiled, machine=args.machine, source=args.file, bench=timed,
                            bench_requested=args.bench)
    except OSError as e:
        raise MinicompError(f"-o {args.output}: cannot write the report: {e.strerror or e}") from None
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)    # argparse's own usage errors exit 2 from here
    try:
        if args.command == "compile":
            return cmd_compile(args)
        if args.command == "report":
            return _report_main(args)
    except UsageError as e:
        print(f"minicomp: usage error: {e}", file=sys.stderr)
        return 2
    except MinicompError as e:
        print(str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())

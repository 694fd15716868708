"""The `minicomp` command.

    minicomp compile FILE [--dump-ir] [--dump-plan] [--check] [--emit DIR] ...
    minicomp report FILE [-o report.html] [--bench]

FILE is a `.py` model file (a callable plus `example_inputs()`) or a `.mc` DSL program.
Exit status: 0 success, 1 a user error (printed as one paragraph, no traceback) or a
failed `--check`, 2 bad usage (argparse's own convention).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from minicomp import explain
from minicomp.errors import MinicompError


def _parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SystemExit(_usage_error(f"--dim expects NAME=INT, got {item!r}"))
        try:
            dims[name] = int(value)
        except ValueError:
            raise SystemExit(_usage_error(f"--dim {name}: {value!r} is not an integer")) from None
    return dims


def _usage_error(message: str) -> int:
    print(f"minicomp: usage error: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minicomp", description="A small graph-to-Triton-kernel compiler.")
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
    c.add_argument("--machine", default="h200", help="machine model for the cost model (default h200)")

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


def _load(args, dims):
    """-> (graph, inputs, eager) where eager() computes the reference outputs."""
    import torch

    from minicomp.ir.interpret import random_inputs, run

    path = Path(args.file)
    if not path.exists():
        raise MinicompError(f"{args.file}: no such file")
    if path.suffix == ".mc":
        from minicomp.frontend.dsl import load_dsl
        graph = load_dsl(path.read_text(), str(args.file), entry=args.entry, dims=dims)
        inputs = random_inputs(graph, seed=0)
        reference = graph.copy()
        return graph, inputs, lambda ins: run(reference, ins)
    if path.suffix == ".py":
        from minicomp.frontend.fx import call_inputs, capture
        from minicomp.frontend.loader import load_model_file
        fn, inputs = load_model_file(str(path), args.entry)
        graph = capture(fn, inputs)
        count = len(inputs)

        def eager(ins):
            with torch.no_grad():
                out = fn(*ins[:count])      # the arguments; the rest are the weights, which fn reads itself
            flat, _ = torch.utils._pytree.tree_flatten(out)
            return flat
        return graph, call_inputs(graph, inputs), eager
    raise MinicompError(f"{args.file}: expected a .py model file or a .mc program, not {path.suffix or 'no suffix'!r}")


def _check(compiled, inputs, eager) -> bool:
    import torch

    from minicomp.api import run_compiled
    _, got = run_compiled(compiled, inputs)   # a kernel Triton rejects on this GPU runs through PyTorch
    want = eager(inputs)
    ok = len(got) == len(want)
    print(f"check: {len(got)} output(s) against eager PyTorch on {inputs[0].device if inputs else 'cpu'}")
    for k, (a, b) in enumerate(zip(got, want)):
        a32, b32 = a.detach().float().cpu(), b.detach().float().cpu()
        same_shape = a.shape == b.shape and a.dtype == b.dtype
        finite = torch.isfinite(b32)
        diff = (a32 - b32).abs()
        diff = torch.where(finite | (a32 != b32), diff, torch.zeros_like(diff))  # equal infs: no error
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float((diff / b32.abs().clamp_min(1e-6)).max()) if diff.numel() else 0.0
        tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(b.dtype, 0.0)
        try:
            torch.testing.assert_close(a.cpu(), b.cpu(), atol=tol, rtol=tol, equal_nan=True)
            good = same_shape
        except AssertionError:
            good = False
        ok &= good
        print(f"  output {k}: {'ok  ' if good else 'FAIL'} {str(b.dtype).replace('torch.', '')}{list(b.shape)}"
              f"  max abs err {max_abs:.3g}  max rel err {max_rel:.3g}  (tolerance {tol:g})")
    print("check: " + ("compiled kernels agree with eager" if ok else "MISMATCH with eager"))
    return ok


def cmd_compile(args) -> int:
    import torch

    from minicomp.api import Options, compile_graph

    dims = _parse_dims(args.dim)
    graph, inputs, eager = _load(args, dims)
    if args.dump_input_ir:
        print(graph.dump(), end="\n\n")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise MinicompError("--device cuda: no CUDA device is available here")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    inputs = [t.to(device) for t in inputs]
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    options = Options(passes=passes, machine=args.machine, print_after_all=args.print_after_all,
                      dump_dir=args.dump_dir, time_passes=args.time_passes)
    compiled = compile_graph(graph, inputs, options)
    fallbacks = compiled.generated.fallbacks
    for note in explain.fallback_notes(compiled.plan, compiled.graph, fallbacks):
        print(note, file=sys.stderr)
    if args.dump_ir:
        print(compiled.graph.dump(), end="\n\n")
    if args.dump_plan:
        plan = compiled.plan
        print(plan.table(fallbacks=fallbacks), end="\n\n")
    if args.dump_graph:
        for path in explain.write_graph(args.dump_graph, compiled.graph, compiled.plan, fallbacks=fallbacks):
            print(f"wrote {path}")
    if args.emit:
        path = compiled.generated.write(args.emit)
        print(f"wrote {path}")
    print(f"compiled {compiled.graph.name}: {len(compiled.plan.groups)} kernel group(s) in "
          f"{compiled.compile_seconds * 1000:.0f} ms (before Triton's JIT)")
    if args.check or args.bench:   # timings of unchecked results mean nothing: --bench checks first
        if not _check(compiled, inputs, eager):
            return 1
        if args.bench and device != "cuda":
            print("bench: skipped, timings need a CUDA device (the CPU runs Triton's interpreter)")
        elif args.bench:
            for line in explain.bench_lines(compiled.plan, explain.bench(compiled, inputs), fallbacks=fallbacks):
                print(line)
    return 0


def _report_main(args) -> int:
    """`minicomp report FILE -o report.html [--bench]`: compile as `compile` does, write the page."""
    import torch

    from minicomp import report
    from minicomp.api import Options, compile_graph

    graph, inputs, eager = _load(args, _parse_dims(args.dim))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise MinicompError("--device cuda: no CUDA device is available here")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    inputs = [t.to(device) for t in inputs]
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    compiled = compile_graph(graph, inputs, Options(passes=passes, machine=args.machine))
    timed = None
    if args.bench and device == "cuda":
        if not _check(compiled, inputs, eager):   # timings of wrong results mean nothing
            return 1
        timed = explain.bench(compiled, inputs)
    elif args.bench:
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
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compile":
            return cmd_compile(args)
        if args.command == "report":
            return _report_main(args)
    except MinicompError as e:
        print(str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())

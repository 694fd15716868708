"""minicomp's own compile time per sample, with where it goes (no GPU needed).

    python benchmarks/compile_time.py [--bench] [--dtype f32|bf16] [--reps N] [SAMPLE ...]

For each `samples/*.py` (default: all), at the sample's default sizes or at its
`BENCH_SIZES` (`--bench`), in one warm process: capture with torch.fx, then
`compile_graph` (passes, plan, generated source, loaded module; Triton's JIT is lazy and
not included). Prints the best of `--reps` runs: capture seconds, `compile_seconds` (the
figure issue 7 holds to 0.3 s), and its parts: the graph passes (from the pass records),
planning with layout assignment (the `plan` column: `plan_graph` and `assign_layout`, timed
again on the optimised graph), and the rest (verify, codegen, loading). Nothing runs at
import time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:            # run as a script: make `minicomp` importable from the tree
    sys.path.insert(0, str(ROOT))


def load_sample(name: str):
    """Import samples/<name>.py (through the model-file loader the CLI uses)."""
    from minicomp.frontend.loader import import_file
    return import_file(ROOT / "samples" / f"{name}.py")


def measure(name: str, bench: bool, dtype, reps: int) -> dict[str, float]:
    from minicomp.api import compile_graph
    from minicomp.frontend.fx import call_inputs, capture
    from minicomp.plan import assign_layout, plan_graph
    sample = load_sample(name)
    fn, inputs = sample.build(dtype=dtype, **(sample.BENCH_SIZES if bench else {}))
    best: dict[str, float] | None = None
    for _ in range(reps):
        t0 = time.perf_counter()
        graph = capture(fn, inputs)
        captured = time.perf_counter() - t0
        compiled = compile_graph(graph, call_inputs(graph, inputs))   # arguments, then the weights
        passes = sum(r.seconds for r in compiled.pass_records)
        t1 = time.perf_counter()
        assign_layout(compiled.graph, plan_graph(compiled.graph, baseline=graph))   # the plan stage, again
        plan = time.perf_counter() - t1
        row = {"capture": captured, "compile": compiled.compile_seconds, "passes": passes, "plan": plan,
               "rest": compiled.compile_seconds - passes - plan, "groups": len(compiled.plan.groups)}
        if best is None or row["compile"] < best["compile"]:
            best = row
    return best


def main(argv: list[str] | None = None) -> int:
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", nargs="*", help="sample names (default: every samples/*.py)")
    parser.add_argument("--bench", action="store_true", help="at the samples' BENCH_SIZES")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    names = args.samples or sorted(p.stem for p in (ROOT / "samples").glob("*.py"))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    sizes = "BENCH_SIZES" if args.bench else "default sizes"
    print(f"minicomp compile time, {sizes}, {args.dtype}, best of {args.reps} (seconds; target: compile <= 0.3)")
    print(f"{'sample':<12} {'groups':>6} {'capture':>8} {'compile':>8} {'passes':>8} {'plan':>8} {'rest':>8}")
    for name in names:
        r = measure(name, args.bench, dtype, args.reps)
        print(f"{name:<12} {r['groups']:>6} {r['capture']:>8.3f} {r['compile']:>8.3f} {r['passes']:>8.3f} "
              f"{r['plan']:>8.3f} {r['rest']:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

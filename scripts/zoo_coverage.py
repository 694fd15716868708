"""Over the model zoo, how many aten calls compile to minicomp's kernels and how many run
through PyTorch (opaque nodes), per model and in total, and the fallback ops by count.

    .venv/bin/python scripts/zoo_coverage.py               # the zoo of tests/zoo_models.py
    .venv/bin/python scripts/zoo_coverage.py llama bert    # some of it
    MINICOMP_ZOO=all .venv/bin/python scripts/zoo_coverage.py   # with the extra models

Each model is built from its tiny random config, compiled with
`torch.compile(model, backend=minicomp.backend(verify_target="off"))` for each attention
implementation the zoo runs, called the ways the zoo calls it (plain, right- and left-padded
2-D masks), and each output compared with eager (a mismatch is printed, and the exit status
is 1). The counts are the backend report's (minicomp/dynamo.py): aten calls in the graphs
AOTAutograd handed over; views (no computation of their own) are counted apart, and the
fraction that matters is "computing aten calls run in kernels". Runs on the CPU under Triton's
interpreter: a few minutes for the whole zoo.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

import minicomp  # noqa: E402
from zoo_models import zoo  # noqa: E402


def _run(name: str, attn: str) -> tuple[minicomp.dynamo.BackendReport, list[str], float]:
    """The backend report of one model and attention implementation, and the calls that differ."""
    zm = zoo()[name]
    torch._dynamo.reset()
    model = zm.model(attn)
    backend = minicomp.backend(verify_target="off")
    compiled = torch.compile(model, backend=backend)
    wrong, start = [], time.perf_counter()
    for call in zm.calls:
        kwargs, valid = zm.inputs(call, model)
        with torch.no_grad():
            ref = getattr(model(**kwargs), zm.output)
            out = getattr(compiled(**kwargs), zm.output)
        if valid is not None and valid.shape == ref.shape[:2]:
            ref, out = ref[valid], out[valid]          # positions that hold tokens, as the zoo tests
        try:
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        except AssertionError as exc:
            wrong.append(f"{call}: {str(exc).splitlines()[0]}")
    return backend.report(), wrong, time.perf_counter() - start


def main(names: list[str]) -> int:
    import warnings
    warnings.filterwarnings("ignore", category=RuntimeWarning)   # the interpreter's inf/nan arithmetic
    rows = ["| model | attn | graphs | kernels | aten calls | views | through PyTorch | computing calls in kernels | s |",
            "|---|---|---|---|---|---|---|---|---|"]
    totals, ops, failed = Counter(), Counter(), []
    for name in names or list(zoo()):
        for attn in zoo()[name].attns:
            rep, wrong, seconds = _run(name, attn)
            computing = rep.aten_calls - rep.view_calls
            rows.append(f"| {name} | {attn} | {len(rep.graphs)} | {rep.kernels} | {rep.aten_calls} | "
                        f"{rep.view_calls} | {rep.pytorch_calls} | {rep.fraction_computed_in_kernels:.1%} | "
                        f"{seconds:.0f} |")
            totals.update(aten=rep.aten_calls, views=rep.view_calls, pytorch=rep.pytorch_calls,
                          kernels=rep.kernels, computing=computing, graphs_failed=len(rep.failures))
            ops.update(rep.pytorch_ops)
            failed += [f"{name}/{attn}: {w}" for w in wrong]
            failed += [f"{name}/{attn}: graph {g.index} ran eagerly: {g.error}" for g in rep.failures]
            print(rows[-1], flush=True)
    print("\n" + "\n".join(rows))
    through, computing, aten = totals["pytorch"], totals["computing"], totals["aten"]
    print(f"\ntotal: {aten} aten calls, {totals['views']} of them views; of the {computing} that compute, "
          f"{computing - through} ({(computing - through) / max(computing, 1):.1%}) run in minicomp's kernels and "
          f"{through} ({through / max(computing, 1):.1%}) through PyTorch; counting views as compiled, "
          f"{(aten - through) / max(aten, 1):.1%} of all aten calls; {totals['kernels']} kernels")
    print("\nops run through PyTorch, by count:")
    for op, n in ops.most_common():
        print(f"  {n:5d}  {op}")
    if failed:
        print("\nmismatches or graphs run eagerly:\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The pass manager: runs a named pipeline of graph passes, and lets you watch it.

`run_pipeline(graph, ["constant_fold", "simplify", "cse", "dce", ...])` (None: DEFAULT_PIPELINE,
the cleanup passes, then attention matching and cleanup again, then pre-transposition of
misaligned weights; strides are chosen after planning, by `minicomp.plan.assign_layout`):
- checks every name first (an unknown one is a MinicompError listing the known passes);
- copies the graph once: the caller's graph is never mutated, and each pass gets a graph
  the manager owns (passes also promise not to mutate their argument);
- runs consecutive fixed-point passes (the cleanup passes) as one group, round after
  round, until a whole round changes nothing; other passes run once, in order;
- verifies the graph after every pass; a VerifyError names the pass that broke it;
- records each run as a `PassRecord` (nodes before/after, what changed, seconds);
- optionally prints the IR after each pass (`print_after_all`; a pass that changed
  nothing prints its header only), writes it to `dump_dir/000_input.txt, 001_<pass>.txt,
  ...` (one file per step, each headed by a `#` line; `NNN_*.txt` files of an earlier run
  in that folder are removed first), and prints a timing table (`time_passes`).

The table of passes is `PASSES` (from `registry.py`); this module imports every pass
module so the table is complete once the manager is imported. Adding a pass: see
`registry.py` (a `@register_pass` decorator, plus the module's name in `PASS_MODULES`).
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

from minicomp.errors import MinicompError, VerifyError
from minicomp.ir.graph import Graph
from minicomp.ir.printer import format_node
from minicomp.ir.verify import verify
from minicomp.passes.registry import PASSES, Changes, Pass

__all__ = ["PASSES", "DEFAULT_PIPELINE", "CLEANUP_PIPELINE", "PassRecord", "run_pipeline", "resolve_pipeline", "describe_passes"]

# Pass modules, imported (in this order) to fill PASSES.
PASS_MODULES = ("constant_fold", "simplify", "cse", "dce", "attention_match", "pretranspose", "complex_arith")

# The cleanup passes, run together to a fixed point.
CLEANUP_PIPELINE: list[str] = ["constant_fold", "simplify", "cse", "dce"]

MAX_ROUNDS = 20  # fixed-point groups converge in 2-3 rounds; this bounds a buggy ping-pong


@dataclass
class PassRecord:
    """One run of one pass."""
    name: str
    nodes_before: int
    nodes_after: int
    changes: Changes = field(default_factory=dict)   # {"folded": 3}; empty when nothing changed
    seconds: float = 0.0
    round: int | None = None                         # round within a fixed-point group, else None

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def summary(self) -> str:
        """`27 nodes (was 31), folded 4` / `27 nodes, no change`."""
        count = f"{self.nodes_after} nodes"
        if self.nodes_after != self.nodes_before:
            count += f" (was {self.nodes_before})"
        what = ", ".join(f"{k} {v}" for k, v in self.changes.items()) if self.changes else "no change"
        return f"{count}, {what}"

    def title(self) -> str:
        return self.name + (f" (round {self.round})" if self.round is not None else "")


# --------------------------------------------------------------------------- names


def describe_passes() -> str:
    """One line per known pass: name, whether it runs to a fixed point, what it does."""
    width = max(len(n) for n in PASSES)
    return "\n".join(f"{p.name:<{width}}  {'fixed-point' if p.fixed_point else 'once':<11}  {p.doc}"
                     for p in PASSES.values())


def resolve_pipeline(pipeline: Sequence[str] | str | None) -> list[Pass]:
    """Pass records for a list of names (or "a,b,c"); None means DEFAULT_PIPELINE."""
    if pipeline is None:
        names = list(DEFAULT_PIPELINE)
    elif isinstance(pipeline, str):
        names = [s.strip() for s in pipeline.split(",") if s.strip()]
    else:
        names = list(pipeline)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        bad = unknown[0]
        close = difflib.get_close_matches(bad, list(PASSES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise MinicompError(f"unknown pass {bad!r}{hint}; known passes: {', '.join(PASSES)}")
    return [PASSES[n] for n in names]


def _stages(passes: list[Pass]) -> list[list[Pass]]:
    """Split a pipeline into stages: maximal runs of fixed-point passes, and single passes."""
    stages: list[list[Pass]] = []
    for p in passes:
        if p.fixed_point and stages and stages[-1][0].fixed_point:
            stages[-1].append(p)
        else:
            stages.append([p])
    return stages


# --------------------------------------------------------------------------- changes


def _diff(before: Graph, after: Graph) -> Changes:
    """What a pass that reports nothing did: nodes added, removed, modified (by their dump line)."""
    old, new = set(before.nx.nodes), set(after.nx.nodes)
    modified = sum(1 for i in old & new if format_node(before.node(i)) != format_node(after.node(i)))
    changes = {"added": len(new - old), "removed": len(old - new), "modified": modified}
    if before.outputs != after.outputs or before.inputs != after.inputs:
        changes["signature"] = 1
    return {k: v for k, v in changes.items() if v}


# --------------------------------------------------------------------------- watching


class _Watch:
    """Prints, dumps and times the runs of one pipeline."""

    def __init__(self, print_after_all: bool, dump_dir: str | Path | None, out: TextIO):
        self.print_after_all = print_after_all
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.out = out
        self.index = 0
        self.verify_seconds = 0.0
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            for old in self.dump_dir.glob("[0-9][0-9][0-9]_*.txt"):  # a previous run's files
                if re.fullmatch(r"\d{3}_[A-Za-z0-9_]+\.txt", old.name):
                    old.unlink()

    def show(self, graph: Graph, label: str, header: str, changed: bool = True) -> None:
        if self.print_after_all:
            bar = "=" * 8
            print(f"{bar} {self.index:03d} {header} {bar}", file=self.out)
            if changed:
                print(graph.dump(), file=self.out)
            print(file=self.out)
        if self.dump_dir is not None:
            path = self.dump_dir / f"{self.index:03d}_{label}.txt"
            path.write_text(f"# {self.index:03d} {header}\n{graph.dump()}\n")
        self.index += 1


def _print_times(records: list[PassRecord], verify_seconds: float, out: TextIO) -> None:
    rows: dict[str, list] = {}
    for r in records:
        row = rows.setdefault(r.name, [0, 0.0, {}])
        row[0] += 1
        row[1] += r.seconds
        for k, v in r.changes.items():
            row[2][k] = row[2].get(k, 0) + v
    total = sum(r.seconds for r in records) + verify_seconds
    width = max([len(n) for n in rows] + [len("(verify)"), len("pass")])
    print(f"{'pass':<{width}}  {'runs':>4}  {'ms':>9}  {'%':>5}  changes", file=out)
    for name, (runs, secs, changes) in rows.items():
        what = ", ".join(f"{k} {v}" for k, v in changes.items()) or "-"
        pct = 100 * secs / total if total else 0.0
        print(f"{name:<{width}}  {runs:>4}  {secs * 1e3:>9.2f}  {pct:>5.1f}  {what}", file=out)
    pct = 100 * verify_seconds / total if total else 0.0
    print(f"{'(verify)':<{width}}  {len(records) + 1:>4}  {verify_seconds * 1e3:>9.2f}  {pct:>5.1f}", file=out)
    print(f"{'total':<{width}}  {'':>4}  {total * 1e3:>9.2f}", file=out)


# --------------------------------------------------------------------------- running


def _verify(graph: Graph, watch: _Watch, after: str | None) -> None:
    t0 = time.perf_counter()
    try:
        verify(graph)
    except VerifyError as e:
        where = f"after pass {after!r}" if after else "in the input graph (before any pass)"
        raise VerifyError(f"{where}: {e}") from e
    finally:
        watch.verify_seconds += time.perf_counter() - t0


def _run_one(p: Pass, graph: Graph, round_: int | None, watch: _Watch) -> tuple[Graph, PassRecord]:
    before = len(graph)
    t0 = time.perf_counter()
    new, changes = p.run(graph)
    seconds = time.perf_counter() - t0
    if changes is None:
        changes = _diff(graph, new)
    _verify(new, watch, p.name)
    record = PassRecord(p.name, before, len(new), changes, seconds, round_)
    watch.show(new, p.name, f"after {record.title()}: {record.summary()}", changed=record.changed)
    return new, record


def run_pipeline(graph: Graph, pipeline: Sequence[str] | str | None = None, *, print_after_all: bool = False,
                 dump_dir: str | Path | None = None, time_passes: bool = False,
                 out: TextIO | None = None) -> tuple[Graph, list[PassRecord]]:
    """Run `pipeline` (default DEFAULT_PIPELINE) over a copy of `graph`.

    Returns the optimised graph and one PassRecord per pass run. `print_after_all` and
    `time_passes` print to `out` (default stdout); `dump_dir` gets one file per step.
    """
    passes = resolve_pipeline(pipeline)
    out = out if out is not None else sys.stdout
    watch = _Watch(print_after_all, dump_dir, out)
    _verify(graph, watch, None)
    work = graph.copy()
    watch.show(work, "input", f"input: {len(work)} nodes")
    records: list[PassRecord] = []
    for stage in _stages(passes):
        if not stage[0].fixed_point:
            work, record = _run_one(stage[0], work, None, watch)
            records.append(record)
            continue
        # round after round until every pass of the group, in turn, has changed nothing
        quiet = 0
        for round_ in range(1, MAX_ROUNDS + 1):
            for p in stage:
                work, record = _run_one(p, work, round_, watch)
                records.append(record)
                quiet = 0 if record.changed else quiet + 1
                if quiet == len(stage):
                    break
            if quiet == len(stage):
                break
    if time_passes:
        _print_times(records, watch.verify_seconds, out)
    return work, records


# --------------------------------------------------------------------------- the table


def _load_pass_modules() -> None:
    for name in PASS_MODULES:
        importlib.import_module(f"minicomp.passes.{name}")


def _default_pipeline() -> list[str]:
    """Complex products as real arithmetic first (what follows sees real pairs); cleanup; then
    attention matching and cleanup again (its rewrite leaves permutes and constants to tidy);
    then pre-transposition, last, once the graph no longer changes shape."""
    return ["complex"] + CLEANUP_PIPELINE + ["attention"] + CLEANUP_PIPELINE + ["pretranspose"]


# At the end, so a pass module that imports this one (for run_pipeline) finds it complete.
_load_pass_modules()
DEFAULT_PIPELINE: list[str] = _default_pipeline()

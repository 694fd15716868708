"""Helpers for the pass tests: run one pass and check its output dump, exactness, idempotence."""

from __future__ import annotations

import difflib
import textwrap

import torch

from minicomp.ir.graph import Graph
from minicomp.ir.interpret import random_inputs, run
from minicomp.ir.verify import verify
from minicomp.passes.manager import PASSES


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Bit-exact equality of values (NaN equal to NaN, -0.0 distinct from 0.0), dtype and shape."""
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.is_floating_point:
        nan_a, nan_b = a.isnan(), b.isnan()
        assert torch.equal(nan_a, nan_b), f"{what}: NaNs differ"
        a, b = a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0)
        assert torch.equal(torch.signbit(a), torch.signbit(b)), f"{what}: signs (of zeros) differ"
    assert torch.equal(a, b), f"{what}: values differ\n{a}\n{b}"


def assert_same_results(before: Graph, after: Graph, seed: int = 0) -> None:
    """The reference interpreter gives bit-identical outputs for the two graphs."""
    inputs = random_inputs(before, seed=seed)
    for i, (x, y) in enumerate(zip(run(before, inputs), run(after, inputs), strict=True)):
        assert_same(x, y, f"output {i}")


def dump(g: Graph) -> str:
    return g.renumbered().dump()


def check_pass(name: str, g: Graph, expected: str | None, changes: dict[str, int] | None = None) -> Graph:
    """Run pass `name` on g: the output dump is `expected`, results are unchanged, the input
    graph is untouched, and a second run changes nothing."""
    verify(g)
    original = g.dump()
    out, got_changes = PASSES[name].run(g)
    verify(out)
    assert g.dump() == original, "the pass mutated its input graph"
    got, want = dump(out), textwrap.dedent(expected or "").strip()
    assert expected is None or got == want, "output differs from expected:\n" + "\n".join(
        difflib.unified_diff(want.splitlines(), got.splitlines(), "expected", "got", lineterm=""))
    if changes is not None:
        assert got_changes == changes
    assert_same_results(g, out)
    again, second = PASSES[name].run(out)
    assert second == {}, f"not idempotent: second run changed {second}"
    assert dump(again) == dump(out)
    return out

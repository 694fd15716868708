"""benchmarks/ablations/library_choice.py: each variant runs under its own switches, and only those.

Session 18's first run of the script compiled each variant under its switches but called it
under the defaults, so minicomp's compile cache (keyed on the switches) compiled the default
plan again and every variant timed that. These tests hold the script to its variants."""

import os
import sys
from pathlib import Path

import pytest
import torch

import minicomp  # noqa: F401  (first: on the CPU it turns Triton's interpreter on)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.ablations import library_choice as lc  # noqa: E402
from minicomp.target import Target  # noqa: E402

VARIANTS = ["default", "fused", "split", "joins", "session18", "all", "backend", "auto", "plain", "overlap", "nopdl"]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_sets_switches_the_target_reads(name, monkeypatch):
    """Inside `switches(name)` the environment holds the variant's switches and none of the
    others (a stray MINICOMP_DUAL_GEMM from the caller is cleared), the CUDA target built from
    it says what the variant means, and leaving restores the caller's environment."""
    monkeypatch.setenv("MINICOMP_DUAL_GEMM", "fused")
    monkeypatch.delenv("MINICOMP_LIBRARY_JOINS", raising=False)
    with lc.switches(name):
        assert {k: os.environ[k] for k in lc.ENV if k in os.environ} == lc.variant_env(name)
        t = Target.for_device("cuda")
        assert t.split_dual == (name != "fused")
        assert t.library_all == (name == "all")
        assert t.library_joins == (name not in ("split", "session18"))
        assert (t.join_min_flop == 0) == (name == "joins")
        assert t.gemm_epilogue == {"session18": "plain", "plain": "plain", "overlap": "overlap"}.get(name, "auto")
    assert os.environ["MINICOMP_DUAL_GEMM"] == "fused" and "MINICOMP_LIBRARY_JOINS" not in os.environ


def test_an_unknown_variant_names_the_choices():
    with pytest.raises(SystemExit, match="unknown variant 'tiles'.*session18"):
        lc.variant_env("tiles")


def test_a_variant_is_called_under_its_switches_and_compiles_once(monkeypatch):
    """The callable `compile_variant` returns sets the variant's switches around every call: a
    call from a caller with other switches reuses the variant's compile instead of compiling
    the default plan (what `compiles()` would show as two compiles)."""
    monkeypatch.delenv("MINICOMP_GEMM_EPILOGUE", raising=False)
    x = torch.randn(8, 16)
    call = lc.compile_variant(lambda t: torch.relu(t) * 2, [x], "plain")
    for _ in range(2):
        torch.testing.assert_close(call(x), torch.relu(x) * 2)
    now, first = call.compiles()
    assert now == first == 1
    assert "MINICOMP_GEMM_EPILOGUE" not in os.environ

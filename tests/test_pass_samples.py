"""Every sample gives the same results before and after the pass pipeline.

Python samples are captured with torch.fx (`load_model_file` + `capture`) and run on their
own example inputs; DSL samples are loaded with the `--dim` values their header comment
gives, on seeded random inputs. The cleanup passes must be bit-exact; the default
pipeline (which may rewrite attention into one SDPA node) within dtype tolerance.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from conftest import tol
from minicomp.ir.interpret import random_inputs, run
from minicomp.passes.manager import CLEANUP_PIPELINE, DEFAULT_PIPELINE, run_pipeline
from pass_testing import assert_same

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PY_SAMPLES = sorted(SAMPLES.glob("*.py"))
MC_SAMPLES = sorted(SAMPLES.glob("*.mc"))


def load_py(path: Path):
    loader = pytest.importorskip("minicomp.frontend.loader")
    fx = pytest.importorskip("minicomp.frontend.fx")
    fn, inputs = loader.load_model_file(str(path))
    g = fx.capture(fn, inputs, name=path.stem)
    return g, fx.call_inputs(g, inputs)


def load_mc(path: Path):
    dsl = pytest.importorskip("minicomp.frontend.dsl")
    source = path.read_text()
    dims = {k: int(v) for k, v in re.findall(r"--dim (\w+)=(\d+)", source)}
    g = dsl.load_dsl(source, str(path), dims=dims)
    return g, random_inputs(g, seed=0)


def check_sample(g, inputs) -> None:
    original = g.dump()
    expected = run(g, inputs)
    cleaned, records = run_pipeline(g, CLEANUP_PIPELINE)
    for i, (want, got) in enumerate(zip(expected, run(cleaned, inputs), strict=True)):
        assert_same(want, got, f"output {i} after the cleanup passes")
    full, _ = run_pipeline(g, DEFAULT_PIPELINE)
    for want, got in zip(expected, run(full, inputs), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True, **tol(want.dtype))
    assert g.dump() == original
    assert len(cleaned) <= len(g)
    _, again = run_pipeline(cleaned, CLEANUP_PIPELINE)
    assert not any(r.changed for r in again)


@pytest.mark.parametrize("path", PY_SAMPLES, ids=[p.name for p in PY_SAMPLES])
def test_python_sample_same_before_and_after(path):
    check_sample(*load_py(path))


@pytest.mark.parametrize("path", MC_SAMPLES, ids=[p.name for p in MC_SAMPLES])
def test_dsl_sample_same_before_and_after(path):
    check_sample(*load_mc(path))


def test_there_are_samples():
    assert PY_SAMPLES and MC_SAMPLES

"""Test setup: CPU runs go through Triton's interpreter; `gpu` tests skip without CUDA; the
suite's generated modules go to a private temporary cache, never the user's.

The cache: `MINICOMP_CACHE_DIR` is set, before minicomp is imported, to a fresh directory
from `tempfile.mkdtemp` (mode 0700, owned by the user running the tests, as the cache
requires), for this process and the subprocesses tests start; it is removed at the end.
Triton's own cache (`TRITON_CACHE_DIR`, default `~/.triton/cache`) is left where it is: the
GPU-true check compiles every generated kernel for sm_90 (1268 kernel configs), and a fresh
cache per run made it wait 879 s for Triton's compiler (a run of 21.5 min on a shared
2-core machine), where a warm one serves them from disk.
"""

import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest
import torch

_CACHE_DIR = tempfile.mkdtemp(prefix="minicomp-test-cache-")
os.environ["MINICOMP_CACHE_DIR"] = _CACHE_DIR

if not torch.cuda.is_available():
    # Read by Triton when kernels are defined: must be set before any generated module loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minicomp.target import RowForm, Target  # noqa: E402  (after the cache directory is set)

# Where tests that allow it put their tensors: MINICOMP_TEST_DEVICE=cuda runs them on the GPU
# (the property tests and the samples; see GPU.md's recipe), CPU (Triton's interpreter) otherwise.
TEST_DEVICE = os.environ.get("MINICOMP_TEST_DEVICE", "cpu")

# Tolerances by dtype for comparing compiled results with eager PyTorch.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def tol(dtype: torch.dtype) -> dict:
    return TOLERANCES.get(dtype, dict(atol=0, rtol=0))


@dataclass(frozen=True)
class Form:
    """One row-kernel form a test runs in: `options` go to `minicomp.compile(fn, **options)`,
    `target` to `codegen.generate(graph, plan, target)`."""
    name: str                  # "single" or "looped"
    row_form: RowForm

    @property
    def options(self) -> dict:
        return {"row_form": self.row_form}

    @property
    def target(self) -> Target:
        return Target.for_device("cpu", row_form=self.row_form)


# the looped form with 16-wide column blocks, so short rows span several
LOOPED = RowForm(single_pass_max=0, cpu_loop_block=16)


@pytest.fixture(params=["single", "looped"])
def form(request) -> Form:
    """Run a test in both row-kernel forms (the looped one with 16-wide column blocks)."""
    return Form(request.param, LOOPED if request.param == "looped" else RowForm())


def compile_without_fallbacks(fn, *inputs, form: Form | None = None):
    """(compiled function, its output on `inputs`, in `form`'s row-kernel form when given),
    asserting no group ran through PyTorch."""
    import minicomp
    f = minicomp.compile(fn, **(form.options if form else {}))
    out = f(*inputs)
    c = f._need()
    assert not c.generated.fallbacks, c.generated.fallbacks
    return f, out


def assert_same(got, want, dtype=None):
    """Each output has eager's shape and dtype, and its values within `dtype`'s tolerance (default
    the output's own), NaN where eager has NaN."""
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want, strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        torch.testing.assert_close(g, w, equal_nan=True, **tol(dtype or w.dtype))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The GPU-true check: every module a test generates also has its kernels compiled by Triton's
# own compiler for sm_90, on this machine without a GPU (minicomp/codegen/target_check.py).
# MINICOMP_VERIFY_TARGET=off turns it off for a run. At the "sampled" depth a kernel's least
# demanding config goes down to a cubin and its most demanding, first and last configs through
# Triton's frontend and TritonGPU passes (target_worker.sample); MINICOMP_VERIFY_DEPTH=full
# compiles every config to a cubin.
os.environ.setdefault("MINICOMP_VERIFY_TARGET", "cuda:90")
os.environ.setdefault("MINICOMP_VERIFY_DEPTH", "sampled")
# The Gluon attention kernel wherever it fits: by default only attention big enough to pay for
# its compile gets it (attention_hopper.PAYS_FROM), and the suite's shapes are small.
# tests/test_attention_hopper.py checks the default's rule on its own.
os.environ.setdefault("MINICOMP_HOPPER_ATTENTION", "1")
# A GPU test that calls a module once checks the kernel of each group, not cuBLAS or SDPA
# answering while that kernel compiles in the background (codegen/first_calls.py, on by
# default): tests/test_first_calls.py turns it on where it tests it, on the GPU too.
os.environ.setdefault("MINICOMP_EAGER_FIRST", "0")


# Seconds each test spent waiting for the GPU-true check (its share of the test's duration):
# the summary lists the largest, so a slow suite shows whether its time is the check's.
_CHECK_SECONDS: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    from minicomp.codegen import target_check
    before = target_check.stats()["seconds"]
    yield
    spent = target_check.stats()["seconds"] - before
    if spent > 0:
        _CHECK_SECONDS[item.nodeid] = spent


def pytest_terminal_summary(terminalreporter):
    from minicomp.codegen import target_check
    s = target_check.stats()
    if s["configs"]:
        top = sorted(_CHECK_SECONDS.items(), key=lambda kv: -kv[1])[:int(os.environ.get("MINICOMP_CHECK_DURATIONS", "15"))]
        if top:
            terminalreporter.write_line("slowest tests by time in the GPU-true check:")
            for nodeid, seconds in top:
                terminalreporter.write_line(f"  {seconds:7.2f}s  {nodeid}")
        terminalreporter.write_line(
            f"GPU-true check ({os.environ.get('MINICOMP_VERIFY_TARGET')}): {s['kernels']} distinct kernels, "
            f"{s['configs']} (kernel, config) compiles ({s['cubins']} to a cubin, depth "
            f"{os.environ.get('MINICOMP_VERIFY_DEPTH', 'full')}), {s['seconds']:.1f} s waiting for Triton's compiler ("
            + ", ".join(f"{stage} {t:.1f} s" for stage, t in sorted(s["stages"].items())) + ")")


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)

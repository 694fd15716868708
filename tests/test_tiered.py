"""Background compiles (runtime/launcher.py `compile_later`, `compiled`, `wait_compiled`): a
kernel of a module's `_LATER` list compiles on a thread of its own while call() launches the
other form of its group; codegen's side is in tests/test_attention_hopper.py."""

from __future__ import annotations

import threading

import minicomp
from minicomp.runtime import launcher


class SlowKernel:
    """Stands for a JIT function: `warmup` compiles (here: waits for a go) or fails."""

    def __init__(self, fail: bool = False):
        self.go, self.fail, self.calls = threading.Event(), fail, []

    def warmup(self, *args, grid, **kwargs):
        self.calls.append((args, grid, kwargs))
        assert self.go.wait(30)
        if self.fail:
            raise RuntimeError("ptxas said no")
        return object()


def test_a_kernel_is_launched_only_once_its_background_compile_is_done():
    k = SlowKernel()
    assert launcher.compiled(k)          # never in the background: it compiles at its launch
    launcher.compile_later([(k, ("torch.bfloat16", 64), {"num_warps": 4})])
    assert not launcher.compiled(k)
    assert launcher.wait_compiled(timeout=0.05) is False
    k.go.set()
    assert minicomp.wait_compiled(30)
    assert launcher.compiled(k)
    assert k.calls == [(("torch.bfloat16", 64), (1,), {"num_warps": 4})]
    launcher.compile_later([(k, (), {})])      # once per kernel: a second module start changes nothing
    assert len(k.calls) == 1 and launcher.compiled(k)


def test_a_failed_background_compile_leaves_the_other_form_for_good():
    import pytest
    k = SlowKernel(fail=True)
    with pytest.warns(RuntimeWarning, match="did not compile in the background"):
        launcher.compile_later([(k, (), {})])
        k.go.set()
        assert launcher.wait_compiled(30)
    assert not launcher.compiled(k)


def test_compiling_at_once_hands_later_to_the_background_and_does_not_wait(monkeypatch):
    k = SlowKernel()
    started, pools = [], []
    monkeypatch.setattr(launcher, "compile_later",
                        lambda later, stubs=None, threads=1: (started.extend(later), pools.append(threads)))
    later = [(k, (), {})]
    with launcher.CompilingAtOnce([], threads=4, environ={"MINICOMP_COMPILE_THREADS": "4"}, later=later):
        # during the first call: marked compiling (its group's other form runs), not yet started,
        # so no compile thread takes the interpreter lock from the call
        assert not launcher.compiled(k) and started == []
    assert started == [(k, (), {})] and later == [] and pools == [2]   # half the compile threads
    from minicomp.runtime import background
    background._BACKGROUND.pop(k)                # the stand-in compile_later never compiles it
    # one compile thread: nothing in the background, the kernel compiles at its first launch
    started.clear()
    k2 = SlowKernel()
    with launcher.CompilingAtOnce([], environ={"MINICOMP_COMPILE_THREADS": "1"}, later=[(k2, (), {})]):
        assert launcher.compiled(k2)
    assert started == [] and launcher.compiled(k2)


class _Config:
    def __init__(self, block: int):
        self.block = block

    def all_kwargs(self) -> dict:
        return {"BLOCK": self.block}


class SlowAutotuner:
    """Stands for an autotuned kernel: its configs compile through `fn.warmup`, one job each."""

    def __init__(self, blocks=(16, 32, 64), fail_block: int | None = None):
        self.configs = [_Config(b) for b in blocks]
        self.fn = SlowKernel()
        self.fail_block = fail_block
        self.fn.warmup = self._warmup

    def _warmup(self, *args, grid, **kwargs):
        self.fn.calls.append(kwargs)
        assert self.fn.go.wait(30)
        if kwargs.get("BLOCK") == self.fail_block:
            raise RuntimeError("ptxas said no\nmore detail")
        return object()


def test_an_autotuned_kernel_compiles_each_config_and_is_done_when_all_are():
    k = SlowAutotuner()
    launcher.compile_later([(k, ("torch.float32",), {"num_warps": 4})], threads=3)
    assert not launcher.compiled(k)
    k.fn.go.set()
    assert launcher.wait_compiled(30)
    assert launcher.compiled(k)
    assert sorted(c["BLOCK"] for c in k.fn.calls) == [16, 32, 64]
    assert all(c["num_warps"] == 4 for c in k.fn.calls)


def test_a_config_that_fails_leaves_eager_for_good_and_says_so():
    import pytest
    k = SlowAutotuner(fail_block=32)
    with pytest.warns(RuntimeWarning, match=r"did not compile in the background \(ptxas said no\): PyTorch keeps"):
        launcher.compile_later([(k, (), {})])
        k.fn.go.set()
        assert launcher.wait_compiled(30)
    assert not launcher.compiled(k)


def test_a_benchmark_settles_a_module_before_it_checks_and_times_it():
    """benchmarks/measure.py `settle`: the first call starts the background compiles, the second
    (the returned result) comes after they finish; one that failed during the call is an error,
    so an ablation never times eager's stand-in for a kernel of ours."""
    import pytest

    from benchmarks import measure
    from minicomp.runtime import background
    k = SlowKernel()
    seen = []

    def call():
        if not seen:
            launcher.compile_later([(k, (), {})])
            threading.Timer(0.2, k.go.set).start()
        seen.append(launcher.compiled(k))
        return len(seen)

    assert measure.settle(call) == 2 and seen == [False, True]
    bad = SlowKernel(fail=True)

    def failing():
        launcher.compile_later([(bad, (), {})])
        bad.go.set()

    with pytest.warns(RuntimeWarning, match="did not compile"), pytest.raises(RuntimeError, match="failed to compile"):
        measure.settle(failing)
    assert background.failed_kernels()
    assert measure.settle(lambda: "plain") == "plain"      # earlier failures are not this call's

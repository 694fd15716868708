"""The garbage collector pauses while a graph compiles (`api.pipeline.gc_paused`) and comes back
as it was: on after a compile that found it on, off after one that found it off, on again after
a compile that raised, and only when the last of several nested or concurrent compiles ends."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import minicomp
from minicomp.api import pipeline


@pytest.fixture(autouse=True)
def _collector_on_afterwards():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_a_compile_runs_with_the_collector_off_and_leaves_it_as_it_found_it(monkeypatch):
    seen = []
    optimise = pipeline.optimise
    monkeypatch.setattr(pipeline, "optimise", lambda *a, **k: (seen.append(gc.isenabled()), optimise(*a, **k))[1])
    x = torch.randn(5, 7)
    for start in (True, False):
        (gc.enable if start else gc.disable)()
        f = minicomp.compile(lambda x: torch.tanh(x) * 2.0 + (1.0 if start else 2.0))
        torch.testing.assert_close(f(x), torch.tanh(x) * 2.0 + (1.0 if start else 2.0))
        assert gc.isenabled() is start
    assert seen == [False, False]


def test_a_compile_that_raises_still_turns_the_collector_back_on(monkeypatch):
    gc.enable()

    def fail(*args, **kwargs):
        assert not gc.isenabled()
        raise RuntimeError("a pass failed")
    monkeypatch.setattr(pipeline, "optimise", fail)
    with pytest.raises(RuntimeError, match="a pass failed"):
        minicomp.compile(lambda x: x + 1.0)(torch.ones(3))
    assert gc.isenabled()


def test_nested_and_concurrent_pauses_end_with_the_last_one_out():
    gc.enable()
    with pipeline.gc_paused():
        with pipeline.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()            # the outer compile still runs
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with pipeline.gc_paused():
            inside.set()
            leave.wait(10)
    t = threading.Thread(target=other)
    with pipeline.gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()                # this thread's pause ended; the other's has not
    leave.set()
    t.join(10)
    assert gc.isenabled()

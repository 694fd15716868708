"""Priming Triton's once-per-process state while capture runs (minicomp/runtime/prime.py)."""

from __future__ import annotations

import pytest
import torch

from minicomp.runtime import prime


@pytest.fixture
def fresh(monkeypatch):
    """As in a process that has not primed yet, on an sm_90 device, whatever this machine has."""
    prime._start.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    yield
    prime._start.cache_clear()


def test_primes_once_per_process_and_fills_triton_key(fresh):
    from triton.runtime.cache import triton_key
    triton_key.cache_clear()
    thread = prime.prime_triton(torch.device("cuda", 0))
    assert thread is not None and thread.daemon
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert triton_key.cache_info().currsize == 1          # the warm-up's compiles find it computed
    before = triton_key.cache_info().hits
    triton_key()
    assert triton_key.cache_info().hits == before + 1
    assert prime.prime_triton(torch.device("cuda", 0)) is thread   # once per process (and capability)
    assert prime._start.cache_info().currsize == 1


def test_nothing_to_prime_on_cpu_or_when_turned_off(fresh):
    assert prime.prime_triton(torch.device("cpu")) is None
    assert prime.prime_triton(torch.device("cuda", 0), enabled=False) is None
    assert prime._start.cache_info().currsize == 0   # turned off is not "done": a later call with it on primes


def test_the_environment_switch_is_read_into_the_target(monkeypatch):
    from minicomp.target import Target
    assert Target.for_device("cpu", {}).prime_triton
    assert not Target.for_device("cpu", {"MINICOMP_PRIME_TRITON": "0"}).prime_triton
    assert Target.for_device("cpu", {"MINICOMP_PRIME_TRITON": "1"}).prime_triton
    seen = []
    monkeypatch.setattr(prime, "prime_triton", lambda device, enabled=True: seen.append(enabled))
    monkeypatch.setenv("MINICOMP_PRIME_TRITON", "0")
    from minicomp.api import Options, compile_graph
    from minicomp.ir.graph import Graph
    g = Graph("g")
    g.set_outputs([g.add("exp", g.add_input("x", (3,), torch.float32))])
    x = torch.randn(3)
    (out,) = compile_graph(g, [x], Options()).call(x)
    torch.testing.assert_close(out, x.exp())
    assert seen == [False]                            # compile_graph passed the Target's switch down


def test_a_failing_step_is_swallowed(fresh, monkeypatch):
    """The thread fills caches Triton fills anyway: an error in it must not surface."""
    from triton.compiler import compiler

    def broken(target):
        raise RuntimeError("no backend for this target")
    monkeypatch.setattr(compiler, "make_backend", broken)
    thread = prime.prime_triton(torch.device("cuda", 0))
    thread.join(timeout=120)
    assert not thread.is_alive()

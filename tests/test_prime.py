"""Priming Triton's once-per-process state while capture runs (minicomp/runtime/prime.py)."""

from __future__ import annotations

import pytest
import torch

from minicomp.runtime import prime


@pytest.fixture
def fresh(monkeypatch):
    """As in a process that has not primed yet, on an sm_90 device, whatever this machine has."""
    monkeypatch.setattr(prime, "_started", False)
    monkeypatch.delenv("MINICOMP_PRIME_TRITON", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


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
    assert prime.prime_triton(torch.device("cuda", 0)) is None   # once per process


def test_nothing_to_prime_on_cpu_or_when_turned_off(fresh, monkeypatch):
    assert prime.prime_triton(torch.device("cpu")) is None
    monkeypatch.setenv("MINICOMP_PRIME_TRITON", "0")
    assert prime.prime_triton(torch.device("cuda", 0)) is None
    assert not prime._started          # turned off is not "done": a later call with it on primes


def test_a_failing_step_is_swallowed(fresh, monkeypatch):
    """The thread fills caches Triton fills anyway: an error in it must not surface."""
    from triton.compiler import compiler

    def broken(target):
        raise RuntimeError("no backend for this target")
    monkeypatch.setattr(compiler, "make_backend", broken)
    thread = prime.prime_triton(torch.device("cuda", 0))
    thread.join(timeout=120)
    assert not thread.is_alive()

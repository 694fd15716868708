"""A compiled call guards the Python state of the functions that ran at capture (frontend/ran.py).

The walk reaches every method of a model's classes and every global those name; only what ran
can change the graph. These tests change state that only a function that did not run reads (no
recompile, eager's answer), then make it run (a recompile, eager's answer again), and hold
transformers' Llama to fewer guards than the whole walk with the same logits.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch
import torch.nn as nn
from conftest import tol

import minicomp
from minicomp.frontend import params, ran


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "cache"))


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def same(compiled, eager, *args):
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), eager(*args), **tol(torch.float32))


SHIFT = 1.0
SCALE = 2.0


def shifted(x):
    return x + SHIFT


def scaled(x):
    return x * SCALE


class Branchy(nn.Module):
    """forward calls `scaled` only when `self.use_scale`; `describe` never runs in forward."""

    def __init__(self):
        super().__init__()
        self.use_scale = False
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        y = shifted(self.lin(x))
        return scaled(y) if self.use_scale else y

    def describe(self):
        return f"{SCALE}"


def _labels(f, x) -> set[str]:
    b = f._find((x,))[0].binding           # the specialisation this call takes
    return {label for _, _, label in b.equal} | {label for _, _, label in b.same}


def test_state_only_a_skipped_function_reads_does_not_recompile_and_the_branch_still_counts():
    global SHIFT, SCALE
    torch.manual_seed(0)
    m = Branchy().eval()
    f = minicomp.compile(m)
    x = rand(3, 5)
    saved = SHIFT, SCALE
    try:
        same(f, m, x)
        labels = _labels(f, x)
        assert "SHIFT" in labels and "use_scale" in labels
        assert "SCALE" not in labels            # read only by `scaled` and `describe`, which did not run
        compiles = f.compiles
        SCALE = -3.0                              # eager does not read it either
        same(f, m, x)
        assert f.compiles == compiles
        m.use_scale = True                       # now `scaled` runs: guarded attribute, a new capture
        same(f, m, x)
        assert f.compiles == compiles + 1 and "SCALE" in _labels(f, x)
        SCALE = 0.5                              # and its global is guarded now
        same(f, m, x)
        assert f.compiles == compiles + 2
        SHIFT = 4.0                              # read by a function that ran at every capture
        same(f, m, x)
    finally:
        SHIFT, SCALE = saved


def test_a_replaced_function_that_ran_is_seen():
    global shifted
    m = Branchy().eval()
    f = minicomp.compile(m)
    x = rand(3, 5)
    saved = shifted
    try:
        same(f, m, x)
        shifted = lambda x: x - 7.0              # noqa: E731
        same(f, m, x)
    finally:
        shifted = saved


def test_under_a_foreign_trace_function_every_function_is_guarded():
    """Python 3.11 records with sys.settrace: where a debugger holds it, minicomp leaves it be and
    guards what the whole walk found (on 3.12 sys.monitoring records beside it)."""
    m = Branchy().eval()
    f = minicomp.compile(m)
    x = rand(3, 5)
    calls = []

    def foreign(frame, event, arg):
        calls.append(event)

    sys.settrace(foreign)
    try:
        f(x)
    finally:
        sys.settrace(None)
    assert calls                                 # it stayed in place throughout
    expect_all = not hasattr(sys, "monitoring")
    assert ("SCALE" in _labels(f, x)) == expect_all
    same(f, m, x)


def _user_a():
    return _user_b() + 1


def _user_b():
    return 1


def _user_c():
    return 2


def test_recorded_sees_the_functions_started_nested_and_in_threads():
    with ran.recorded() as outer:
        with ran.recorded() as inner:
            _user_a()
        _user_c()
    assert outer is not None and inner is not None
    assert {_user_a.__code__, _user_b.__code__, _user_c.__code__} <= outer
    assert {_user_a.__code__, _user_b.__code__} <= inner and _user_c.__code__ not in inner
    assert not any("torch" in c.co_filename for c in outer)
    assert sys.gettrace() is None
    with ran.recorded() as again:               # a function seen before is seen again
        _user_b()
    assert _user_b.__code__ in again and _user_a.__code__ not in again
    with ran.recorded() as threaded:
        t = threading.Thread(target=_user_c)
        t.start()
        t.join()
    # sys.monitoring (3.12+) sees every thread; sys.settrace only the capturing one
    assert (_user_c.__code__ in threaded) == hasattr(sys, "monitoring")


def test_transformers_llama_guards_what_ran_and_matches_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval().requires_grad_(False)
    ids = torch.randint(0, 128, (2, 9))

    def fn(ids):
        return model(input_ids=ids).logits

    f = minicomp.compile(fn)
    same(f, fn, ids)
    labels = _labels(f, ids)
    whole = params.walk(fn)
    every = {label for _, _, label in whole.equal} | {label for _, _, label in whole.same}
    # from_pretrained's helpers are reachable through the model's class, and never ran
    assert "cached_file" in every and "cached_file" not in labels
    b = f._find((ids,))[0].binding
    assert len(b.equal) + len(b.same) < (len(whole.equal) + len(whole.same)) * 0.6
    assert "model.model.layers.0.self_attn.scaling" in labels
    compiles = f.compiles
    model.model.layers[0].self_attn.scaling = 0.5       # read in forward: guarded, a new capture
    same(f, fn, ids)
    assert f.compiles == compiles + 1


def test_closure_cells_read_together_see_each_change():
    """binding.py reads every guarded closure cell in one pass: a scalar cell (equality), a
    builtin's cell (identity: `torch.tanh` to `torch.sigmoid` went unseen before, a wrong answer)
    and a cell emptied by `del` each count."""
    scale, shift = 2.0, torch.tanh

    def fn(x):
        return shift(x) * scale

    f = minicomp.compile(fn)
    x = rand(4, 3)
    same(f, fn, x)
    compiles = f.compiles
    scale = -0.5
    same(f, fn, x)
    shift = torch.sigmoid
    same(f, fn, x)
    assert f.compiles == compiles + 2
    same(f, fn, x)
    assert f.compiles == compiles + 2          # nothing changed: the guards pass
    del scale
    with pytest.raises(NameError):
        fn(x)
    with pytest.raises(Exception, match="free variable 'scale'"):    # captured again: the user's error, at its line
        f(x)


class Activated(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.relu          # a builtin, as models choose activations

    def forward(self, x):
        return self.act(x) + 1


def test_a_builtin_attribute_or_global_replaced_is_seen():
    global ACT
    m = Activated().eval()
    f = minicomp.compile(m)
    x = rand(5, 4)
    same(f, m, x)
    m.act = torch.tanh
    same(f, m, x)
    g = minicomp.compile(activated_by_global)
    same(g, activated_by_global, x)
    saved = ACT
    try:
        ACT = torch.sigmoid
        same(g, activated_by_global, x)
    finally:
        ACT = saved


ACT = torch.exp


def activated_by_global(x):
    return ACT(x) * 2

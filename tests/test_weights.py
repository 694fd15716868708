"""Weights are read at call time; Python state is guarded; outputs alias as eager's do; gradients
are PyTorch's own.

Every case changes something between two calls of one compiled function the way users do
(rebinding, `.data = ...`, `load_state_dict`, `.to()`, an in-place update, a changed
`self.eps`, a global) and compares the next call with eager. `freeze=True` folds weights
and must notice the same changes. Outputs: `return x` is `x`, `x.clone()` never is, two
equal expressions are two tensors. Gradients through a compiled call equal eager's.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tol

import minicomp
from minicomp.errors import MinicompError

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "cache"))


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def same(compiled, eager, *args):
    """One call of each, compared output by output (under no_grad: values only)."""
    with torch.no_grad():
        got, want = compiled(*args), eager(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol(b.dtype))


def linear(n_in=13, n_out=7, dtype=torch.float32, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias).to(dtype)


# --------------------------------------------------------------------------- weights change


@pytest.mark.parametrize("dtype", DTYPES)
def test_rebinding_a_parameter_is_read_by_the_next_call(dtype):
    m = linear(dtype=dtype)
    f = minicomp.compile(m)
    x = rand(3, 5, 13, dtype=dtype)
    same(f, m, x)
    m.weight = nn.Parameter(rand(7, 13, dtype=dtype, seed=1))
    same(f, m, x)
    assert len(f._cache) == 1                                  # same signature: no recompile


def test_data_assignment_in_place_update_and_a_new_shape():
    m = linear()
    f = minicomp.compile(m)
    x = rand(4, 13)
    same(f, m, x)
    m.weight.data = rand(7, 13, seed=2)                        # same Parameter object, new storage
    same(f, m, x)
    with torch.no_grad():
        m.bias.mul_(-3)                                        # in place
    same(f, m, x)
    m.weight.data = rand(13, 7, seed=3).t()                    # transposed strides: recompiles
    same(f, m, x)
    m.weight = nn.Parameter(rand(9, 13, seed=4))               # a new shape: recompiles
    m.bias = nn.Parameter(rand(9, seed=5))
    same(f, m, x)
    assert len(f._cache[next(iter(f._cache))]) == 3


class Folded(nn.Module):
    """`x @ (w * g).t()` and a LayerNorm whose all-ones weight used to be dropped by the passes."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(rand(6, 10, seed=1))
        self.g = nn.Parameter(torch.ones(10))
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        return self.ln(x @ (self.w * self.g).t())


def test_in_place_updates_of_weights_the_passes_used_to_fold():
    m = Folded()
    f = minicomp.compile(m)
    x = rand(5, 10)
    same(f, m, x)
    with torch.no_grad():
        m.g.mul_(rand(10, seed=7))
        m.ln.weight.add_(rand(6, seed=8))                      # ones no more
        m.ln.bias.fill_(0.5)
    same(f, m, x)
    assert len(f._cache[next(iter(f._cache))]) == 1


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_with_and_without_assign(assign):
    m = Folded()
    f = minicomp.compile(m)
    x = rand(5, 10)
    same(f, m, x)
    other = Folded()
    with torch.no_grad():
        for p in other.parameters():
            p.copy_(rand(*p.shape, seed=p.numel()))
    m.load_state_dict(other.state_dict(), assign=assign)
    same(f, m, x)
    partial = {"ln.weight": torch.full((6,), 2.0)}             # only some weights
    m.load_state_dict(partial, strict=False, assign=assign)
    same(f, m, x)


def test_to_another_dtype_and_back():
    m = linear()
    f = minicomp.compile(m)
    x = rand(2, 13)
    same(f, m, x)
    m.to(torch.float64)
    same(f, m, x.double())
    m.half()
    same(f, m, x.half())
    m.float()
    same(f, m, x)


def test_tied_weights_untied_later():
    emb = nn.Linear(6, 6, bias=False)
    head = nn.Linear(6, 6, bias=False)
    head.weight = emb.weight                                   # tied: one graph input
    model = nn.Sequential(emb, nn.Tanh(), head)
    f = minicomp.compile(model)
    x = rand(3, 6)
    same(f, model, x)
    head.weight = nn.Parameter(rand(6, 6, seed=9))             # untied: two tensors now
    same(f, model, x)


def test_bias_removed_and_a_submodule_replaced():
    model = nn.Sequential(linear(8, 8), nn.GELU(), linear(8, 4, seed=1))
    f = minicomp.compile(model)
    x = rand(3, 8)
    same(f, model, x)
    model[0].bias = None
    same(f, model, x)
    model[1] = nn.ReLU()
    same(f, model, x)


def test_a_forward_hook_added_after_compiling():
    model = nn.Sequential(linear(8, 8), nn.Tanh())
    f = minicomp.compile(model)
    x = rand(3, 8)
    same(f, model, x)
    handle = model[0].register_forward_hook(lambda mod, inp, out: out * 2)
    same(f, model, x)
    handle.remove()
    same(f, model, x)


def test_weights_keep_their_names_in_the_dump():
    sys.path.insert(0, str(SAMPLES))
    import gpt_block
    block, inputs = gpt_block.build()
    f = minicomp.compile(block)
    same(f, block, *inputs)
    assert f.graph.input_names()[:3] == ["x", "ln_1.weight", "ln_1.bias"]
    assert "input ln_1.weight : f32[64]" in f.explain()


# --------------------------------------------------------------------------- Python state


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = 1e-5
        self.scale = 2.0
        self.shape = [4, 3]

    def forward(self, x):
        y = x.reshape(self.shape) * self.scale
        y = y / (y.abs().sum(-1, keepdim=True) + self.eps)
        return y * 3 if self.training else y * 5


def test_module_attributes_and_train_eval_are_guarded():
    m = Scaled().eval()
    f = minicomp.compile(m)
    x = rand(12)
    same(f, m, x)
    m.scale = -0.5
    same(f, m, x)
    m.eps = 10.0
    same(f, m, x)
    m.train()
    same(f, m, x)
    m.eval()
    same(f, m, x)
    m.shape[0], m.shape[1] = 3, 4                              # a list attribute changed in place
    same(f, m, x)


def test_guards_read_together_see_each_change():
    """binding.py reads the guards on one dict's keys (a module's attributes) with one
    itemgetter: each key still counts, a removed one included, and the same one twice."""
    m = Scaled().eval()
    f = minicomp.compile(m)
    x = rand(12)
    same(f, m, x)
    for name, value in (("eps", 2.0), ("scale", 0.25), ("eps", 1e-5)):
        setattr(m, name, value)
        same(f, m, x)
    compiles = f.compiles
    del m.__dict__["scale"]
    with pytest.raises(Exception):      # eager raises too: no attribute
        m(x)
    with pytest.raises(Exception):
        f(x)
    m.scale = 4.0
    same(f, m, x)
    assert f.compiles > compiles


def _twice(x):
    return x * FACTOR


def helper_read_twice(x):
    return _twice(x) + _twice(x * 2)


def test_a_global_read_through_two_functions_is_guarded_once_and_still_seen():
    global _twice
    f = minicomp.compile(helper_read_twice)
    x = rand(2, 5)
    same(f, helper_read_twice, x)
    saved = _twice
    try:
        _twice = lambda x: x - 1.0      # noqa: E731
        same(f, helper_read_twice, x)
    finally:
        _twice = saved
    same(f, helper_read_twice, x)


OFFSET = torch.arange(5.0)
FACTOR = 3.0


def scaled_by_globals(x):
    return x * FACTOR + OFFSET


def test_global_tensor_and_python_float():
    global OFFSET, FACTOR
    f = minicomp.compile(scaled_by_globals)
    x = rand(2, 5)
    same(f, scaled_by_globals, x)
    saved = OFFSET, FACTOR
    try:
        OFFSET.mul_(2)                                         # in place
        same(f, scaled_by_globals, x)
        OFFSET = rand(5, seed=3)                               # rebound
        same(f, scaled_by_globals, x)
        FACTOR = -1.5
        same(f, scaled_by_globals, x)
    finally:
        OFFSET, FACTOR = saved


def test_closure_tensor_and_closure_module():
    w = rand(5, 5)
    model = linear(5, 5)

    def fn(x):
        return model(x) @ w

    f = minicomp.compile(fn)
    x = rand(3, 5)
    same(f, fn, x)
    w.add_(1)
    same(f, fn, x)
    model.weight = nn.Parameter(rand(5, 5, seed=4))
    same(f, fn, x)
    w = rand(5, 5, seed=6)                                     # rebinds the cell fn closes over
    same(f, fn, x)


# --------------------------------------------------------------------------- freeze


def test_freeze_folds_weights_and_notices_a_change():
    m = Folded()
    f = minicomp.compile(m, freeze=True)
    x = rand(5, 10)
    same(f, m, x)
    assert f.graph.input_names() == ["x"]                      # weights are constants
    with torch.no_grad():
        m.g.mul_(2)
    with pytest.warns(UserWarning, match="frozen weight g changed since it was compiled with freeze=True"):
        same(f, m, x)
    m.ln.weight = nn.Parameter(torch.full((6,), 3.0))
    with pytest.warns(UserWarning, match="frozen weight ln.weight"):
        same(f, m, x)
    m.w.data = rand(6, 10, seed=11)
    with pytest.warns(UserWarning, match="frozen weight w"):
        same(f, m, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                        # unchanged: no warning, no recompile
        same(f, m, x)
    assert sum(len(v) for v in f._cache.values()) == 1         # stale specialisations are dropped


def test_pre_transposed_weights_only_under_freeze():
    m = linear(13, 8)                                           # rows of 52 bytes: stored transposed when frozen
    x = rand(3, 13)
    frozen, live = minicomp.compile(m, freeze=True), minicomp.compile(m)
    same(frozen, m, x)
    same(live, m, x)
    labels = {n.attrs.get("label") for n in frozen.graph.nodes() if n.op == "constant"}
    assert "weight.T" in labels
    assert not [n for n in live.graph.nodes() if n.op == "constant" and n.numel > 1]
    assert live.graph.input_names() == ["input", "weight", "bias"]     # nn.Linear.forward(self, input)


# --------------------------------------------------------------------------- outputs


def test_outputs_alias_exactly_as_eager():
    def fn(x):
        return x, x.clone(), x.t(), (x * 2, x * 2), x[1]

    f = minicomp.compile(fn)
    x = rand(3, 4)
    with torch.no_grad():
        ident, clone, view, (a, b), row = f(x)
    assert ident is x
    assert clone is not x and clone.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and view.stride() == x.t().stride()
    assert a is not b and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert row.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and row.storage_offset() == 4
    clone.zero_()
    assert x.abs().sum() > 0                                   # the copy is the caller's to write
    torch.testing.assert_close(a, x * 2)


def test_one_object_twice_and_views_of_an_output():
    def fn(x):
        y = torch.tanh(x)
        return y, y, y.view(-1)

    y1, y2, flat = minicomp.compile(fn)(rand(2, 3))
    assert y1 is y2
    assert flat.untyped_storage().data_ptr() == y1.untyped_storage().data_ptr()
    torch.testing.assert_close(flat, torch.tanh(rand(2, 3)).view(-1))


def test_a_constant_output_is_fresh_at_every_call():
    f = minicomp.compile(lambda x: (x + 1, torch.tensor([1.0, 2.0, 3.0])))
    x = rand(3)
    _, c = f(x)
    c.fill_(7)                                                 # the caller writes the result...
    _, again = f(x)
    torch.testing.assert_close(again, torch.tensor([1.0, 2.0, 3.0]))   # ...and the next call is not affected


def test_returning_a_weight_returns_the_parameter():
    m = linear(4, 4)
    f = minicomp.compile(lambda x: (x @ m.weight, m.weight))
    out, w = f(rand(2, 4))
    assert w is m.weight


# --------------------------------------------------------------------------- gradients


def grads_of(model, loss_fn, *args):
    model.zero_grad(set_to_none=True)
    for a in args:
        a.grad = None
    loss_fn(model, *args).backward()
    return [p.grad for p in model.parameters()] + [a.grad for a in args]


def test_a_compiled_linear_in_a_loss_gets_eager_gradients():
    m = linear(13, 7)
    f = minicomp.compile(m)
    x = rand(6, 13).requires_grad_()
    target = rand(6, 7, seed=3)
    got = grads_of(m, lambda mod, a: F.mse_loss(f(a), target), x)
    want = grads_of(m, lambda mod, a: F.mse_loss(mod(a), target), x)
    assert all(g is not None for g in got)                     # bias.grad used to stay None
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol(b.dtype))


def test_gradients_of_a_transformer_block_equal_eager():
    sys.path.insert(0, str(SAMPLES))
    import gpt_block
    block, (x,) = gpt_block.build(batch=2, seq=5, width=32, heads=2)
    x.requires_grad_()
    f = minicomp.compile(block)
    got = grads_of(block, lambda mod, a: (f(a) ** 2).mean(), x)
    want = grads_of(block, lambda mod, a: (mod(a) ** 2).mean(), x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_frozen_weights_still_get_gradients():
    m = linear(5, 3)
    f = minicomp.compile(m, freeze=True)
    x = rand(4, 5)
    got = grads_of(m, lambda mod, a: f(a).sum(), x)
    want = grads_of(m, lambda mod, a: mod(a).sum(), x)
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b)


def test_no_grad_and_integer_outputs_carry_no_autograd():
    m = linear(5, 3)
    f = minicomp.compile(lambda x: (m(x), m(x).argmax(-1)))
    x = rand(4, 5)
    out, idx = f(x)
    assert out.requires_grad and not idx.requires_grad and idx.dtype == torch.int64
    with torch.no_grad():
        assert not f(x)[0].requires_grad
    with torch.inference_mode():
        assert not f(x)[0].requires_grad


def test_what_backward_cannot_recompute_is_refused():
    drop = nn.Sequential(linear(6, 6), nn.Dropout(0.5)).train()
    out = minicomp.compile(drop)(rand(4, 6))
    with pytest.raises(MinicompError, match="draws random numbers"):
        out.sum().backward()
    m = linear(6, 6)
    out = minicomp.compile(m)(rand(4, 6))
    m.weight = nn.Parameter(rand(6, 6, seed=2))               # between forward and backward
    with pytest.raises(MinicompError, match="changed between the forward call and backward"):
        out.sum().backward()


def test_double_backward_is_eager():
    m = linear(6, 4)
    f = minicomp.compile(lambda a: torch.tanh(m(a)))
    x = rand(3, 6).requires_grad_()
    results = []
    for fn in (f, lambda a: torch.tanh(m(a))):
        m.zero_grad(set_to_none=True)
        x.grad = None
        (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        (g * x).sum().backward()                                # second order, through x and the weights
        results.append([g.detach(), x.grad, m.weight.grad, m.bias.grad])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_frozen_weights_get_gradients_on_the_fast_path_too():
    m = linear(5, 3)
    f = minicomp.compile(m, freeze=True)
    x = rand(4, 5)                                              # the input needs no grad: only the weights do
    for _ in range(3):
        got = grads_of(m, lambda mod, a: f(a).sum(), x)
        want = grads_of(m, lambda mod, a: mod(a).sum(), x)
        for a, b in zip(got[:2], want[:2]):
            torch.testing.assert_close(a, b)


def test_train_eval_toggling_keeps_both_specialisations_fast():
    m = Scaled()
    f = minicomp.compile(m)
    x = rand(12)
    for mode in (True, False, True, False):
        m.train(mode)
        same(f, m, x)
    [entries] = f._fast.values()
    assert len(entries) == 2 and all(len(s.checks) == 1 for s in entries)

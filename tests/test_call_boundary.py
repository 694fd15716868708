"""The call boundary: conjugate and negative-bit views, refused compiles that change nothing,
attribute writes in forward, and concurrent calls.

- A tensor with its neg bit set (`z.conj().imag`, `t._neg_view()`) holds its values negated
  in memory; kernels read memory, so the call resolves the bit first, as eager computes.
- A capture that is refused leaves every tensor and module attribute as it was: in-place
  writes are refused before they happen, Python attribute and global writes are undone.
- Calls from several threads give eager's answers (Triton's CPU interpreter is process-wide
  state: one lock serialises interpreted launches; compiling holds the function's lock).
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn
from conftest import tol

import minicomp
from minicomp.errors import GuardError, MinicompError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "cache"))


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --------------------------------------------------------------------------- neg and conj bits


@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 7, dtype=torch.complex64, generator=torch.Generator().manual_seed(1)).conj().imag,
    lambda: rand(5, 7)._neg_view(),
    lambda: rand(7, 5)._neg_view().t(),                        # a neg view, transposed
], ids=["conj_imag", "neg_view", "neg_view_strided"])
def test_negative_bit_inputs_compute_as_eager(make):
    x, y = make(), rand(5, 7, seed=2)
    assert x.is_neg()
    fn = lambda a, b: torch.tanh(a) * 2 + b.sum(-1, keepdim=True) * a   # noqa: E731
    f = minicomp.compile(fn)
    for _ in range(2):                                         # the fast path must not skip the resolution
        torch.testing.assert_close(f(x, y), fn(x, y), **tol(torch.float32))
    torch.testing.assert_close(f(x.resolve_neg(), y), fn(x, y), **tol(torch.float32))


def test_negative_bit_weight_and_identity_output():
    m = nn.Linear(4, 3)
    m.register_buffer("shift", rand(3)._neg_view())
    fn = lambda x: (m(x) + m.shift, x)                         # noqa: E731
    x = rand(2, 4)._neg_view()
    with torch.no_grad():
        got, same = minicomp.compile(fn)(x)
        torch.testing.assert_close(got, fn(x)[0], **tol(torch.float32))
    assert same is x and same.is_neg()                         # eager returns the view itself


def test_conjugate_complex_input_runs_through_pytorch_as_eager():
    z = torch.randn(6, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    fn = lambda a: a * 2                                       # noqa: E731
    torch.testing.assert_close(minicomp.compile(fn)(z.conj()), fn(z.conj()))


def test_autocast_is_refused_and_the_default_dtype_is_part_of_the_specialisation():
    w = rand(6, 4)
    fn = lambda a: (a @ w, torch.tensor(1.5) * a.sum())     # noqa: E731
    f = minicomp.compile(fn)
    x = rand(3, 6)
    for _ in range(2):
        torch.testing.assert_close(f(x), fn(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):          # eager would compute the matmul in bf16
        with pytest.raises(GuardError, match="called under torch.autocast"):
            f(x)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for _ in range(2):
            got, want = f(x), fn(x)
            assert got[1].dtype == want[1].dtype == torch.float64
            torch.testing.assert_close(got, want)
    finally:
        torch.set_default_dtype(previous)
    torch.testing.assert_close(f(x), fn(x))


# --------------------------------------------------------------------------- aliased arguments


def test_one_tensor_passed_twice_then_two_tensors():
    fn = lambda a, b: a - 2 * b                                # noqa: E731
    f = minicomp.compile(fn)
    x, y = rand(3, 5), rand(3, 5, seed=1)
    torch.testing.assert_close(f(x, x), fn(x, x))
    torch.testing.assert_close(f(x, y), fn(x, y))              # used to compute y - 2 * y
    torch.testing.assert_close(f(y, y), fn(y, y))


def test_a_weight_passed_as_the_argument_then_another_tensor():
    class AddsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(rand(5))

        def forward(self, x):
            return x * 3 + self.w

    m = AddsWeight()
    f = minicomp.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(f(m.w), m(m.w))
        torch.testing.assert_close(f(rand(5, seed=2)), m(rand(5, seed=2)))   # used to read x for self.w


# --------------------------------------------------------------------------- refused compiles

STATE = torch.zeros(3)


def writes_a_global(x):
    STATE.add_(1)
    return x + STATE


class Steps(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps += 1
        return x * 2


def test_a_refused_in_place_write_writes_nothing(monkeypatch):
    x = rand(3)
    for capture_mode in ("eager", "fake"):                     # both tracers
        monkeypatch.setenv("MINICOMP_CAPTURE", capture_mode)
        with pytest.raises(MinicompError, match="mutates an input or weight in place.*nothing was written|"
                                                "mutates an input or weight in place"):
            minicomp.compile(writes_a_global)(x)
        assert torch.equal(STATE, torch.zeros(3))
        steps = Steps()
        with pytest.raises(MinicompError, match="mutates an input or weight in place"):
            minicomp.compile(steps)(x)
        assert steps.steps.item() == 0
        bn = nn.BatchNorm1d(3).train()
        before = {k: v.clone() for k, v in bn.state_dict().items()}
        with pytest.raises(MinicompError, match="mutates an input or weight in place"):
            minicomp.compile(bn)(rand(4, 3))
        for k, v in bn.state_dict().items():
            assert torch.equal(v, before[k]), k               # running stats and num_batches_tracked kept


class Remembers(nn.Module):
    def forward(self, x):
        self.last = x.sum()
        return x * 2


class Counts(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.history = []

    def forward(self, x):
        self.calls += 1
        self.history.append(x)
        return x + 1


CALLS = 0


def counts_globally(x):
    global CALLS
    CALLS += 1
    return x - 1


@pytest.mark.parametrize("capture_mode", ["eager", "fake"])
def test_attribute_and_global_writes_in_forward_are_refused_and_undone(capture_mode, monkeypatch):
    monkeypatch.setenv("MINICOMP_CAPTURE", capture_mode)
    x = rand(4)
    r = Remembers()
    with pytest.raises(MinicompError, match=r"changed Python state \(Remembers: last\)"):
        minicomp.compile(r)(x)
    assert "last" not in vars(r)                                 # no FunctionalTensor, no fake tensor left
    c = Counts()
    with pytest.raises(MinicompError, match=r"Counts: calls.*history"):
        minicomp.compile(c)(x)
    assert c.calls == 0 and c.history == []
    f = minicomp.compile(counts_globally)
    with pytest.raises(MinicompError, match=r"CALLS"):
        f(x)
    assert CALLS == 0
    assert f.tracer == capture_mode                              # $MINICOMP_CAPTURE, read at the call


class OneArgGet(dict):
    """A dict whose `get` takes the key alone, as transformers' output-recording registry."""

    def get(self, key):
        return dict.get(self, key)


class Registry(nn.Module):
    def __init__(self, write: bool):
        super().__init__()
        self.table, self.write = OneArgGet(scale=2.0), write

    def forward(self, x):
        if self.write:
            self.table["seen"] = True
        return x * self.table.get("scale")


def test_state_held_in_a_dict_subclass_with_its_own_get_is_compared_by_dicts_rules():
    x = rand(5)
    m = Registry(write=False)
    torch.testing.assert_close(minicomp.compile(m)(x), m(x), **tol(x.dtype))
    w = Registry(write=True)
    with pytest.raises(MinicompError, match=r"changed Python state .*seen"):
        minicomp.compile(w)(x)
    assert dict(w.table) == {"scale": 2.0}


def test_a_model_that_registers_a_buffer_in_forward_is_refused_and_left_as_it_was():
    class Lazy(nn.Module):
        def forward(self, x):
            if not hasattr(self, "cache"):
                self.register_buffer("cache", torch.ones(4))
            return x * self.cache

    m = Lazy()
    with pytest.raises(MinicompError, match="calling the model once before compiling"):
        minicomp.compile(m)(rand(4))
    assert not hasattr(m, "cache") and not m._buffers
    m(rand(4))                                                   # filled eagerly: now it compiles
    f = minicomp.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(f(rand(4)), m(rand(4)))


# --------------------------------------------------------------------------- threads


def _hammer(f, make_inputs, eager, threads=4, calls=16) -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(calls):
            args = make_inputs(k * calls + i)
            try:
                with torch.no_grad():
                    torch.testing.assert_close(f(*args), eager(*args), **tol(torch.float32))
            except Exception as e:  # noqa: BLE001 - every failure is reported by the test
                errors.append(f"thread {k} call {i}: {type(e).__name__}: {e}")

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def test_four_threads_calling_one_compiled_function():
    m = nn.Sequential(nn.Linear(12, 9), nn.GELU(), nn.LayerNorm(9))
    f = minicomp.compile(m)
    errors = _hammer(f, lambda i: [rand(5, 12, seed=i)], m)    # the first calls compile concurrently
    assert errors == []
    assert sum(len(v) for v in f._cache.values()) == 1         # compiled once


def test_threads_calling_different_compiled_functions_and_shapes():
    fns = [lambda a: torch.softmax(a, -1), lambda a: a * torch.sigmoid(a), lambda a: a.sum(0) + 1]
    compiled = [minicomp.compile(fn) for fn in fns]

    def call(i):                                               # each thread mixes functions and shapes
        return compiled[i % 3](call.x[i])

    call.x = {i: rand(3 + i % 2, 7, seed=i) for i in range(64)}
    errors = _hammer(lambda i: call(int(i)), lambda i: [i], lambda i: fns[int(i) % 3](call.x[int(i)]))
    assert errors == []


def test_a_kernel_rejected_at_the_first_launch_falls_back_and_the_weights_stay_live(monkeypatch):
    """The first call of a specialisation goes through `api.run_compiled`: a kernel Triton rejects
    at its first launch (simulated here: on the CPU it cannot happen) makes its group run through
    PyTorch, and the specialisation keeps the module that ran, weights still read at each call."""
    from minicomp.runtime import CompiledCall
    from minicomp.runtime.launcher import KernelCompileError
    real = CompiledCall.__call__
    rejected: list[str] = []

    def first_call_rejects(self, *inputs):
        if not rejected and self.generated.kernel_names:
            rejected.append(self.generated.kernel_names[0])
            raise KernelCompileError(rejected[0], "simulated rejection")
        return real(self, *inputs)

    monkeypatch.setattr(CompiledCall, "__call__", first_call_rejects)
    m = nn.Sequential(nn.Linear(6, 5), nn.GELU())
    f = minicomp.compile(m)
    x = rand(3, 6)
    with pytest.warns(UserWarning, match="rejected by Triton's compiler"):
        with torch.no_grad():
            torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    assert rejected and "runs through PyTorch" in f.explain()
    m[0].weight = nn.Parameter(rand(5, 6, seed=4))
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x), **tol(torch.float32))


def test_a_call_its_fast_check_admits_skips_the_modules_input_checks(monkeypatch):
    """A loaded module's call (`CompiledCall`) checks every input (shape, dtype, device) before
    the module's `run`; a call the api's TensorCheck admitted (it compares all of that and the
    strides) goes to `run` directly. A call the check does not admit is checked again."""
    import minicomp.runtime as rt

    seen = []
    real = rt.check_call
    monkeypatch.setattr(rt, "check_call", lambda name, specs, *a: seen.append(name) or real(name, specs, *a))
    lin = torch.nn.Linear(6, 5)
    f = minicomp.compile(lambda x: torch.relu(lin(x)))
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), torch.relu(lin(x)), **tol(torch.float32))
        first = len(seen)
        assert first >= 1                          # the first call checked its inputs
        torch.testing.assert_close(f(x + 1), torch.relu(lin(x + 1)), **tol(torch.float32))
        assert len(seen) == first                  # admitted by the fast check: no second round
        y = torch.randn(6, 3).t()                  # other strides: not admitted, checked again
        torch.testing.assert_close(f(y), torch.relu(lin(y)), **tol(torch.float32))
        assert len(seen) > first


def test_a_fast_check_made_from_the_modules_own_strides_skips_comparing_them_again(monkeypatch):
    """The generated run() reads each input with the strides of its `LAYOUTS` and copies one that
    has others (`as_layouts`). A TensorCheck made from tensors whose strides are exactly those
    compared them already, so calls it admits skip that comparison (run(_laid_out=True)); a check
    made from other strides (a size-1 dimension's stride, which the module ignores) keeps it, and
    both answer as eager does."""
    from minicomp.runtime import checks

    compared = []
    real = checks.as_layouts
    monkeypatch.setattr(checks, "as_layouts", lambda ts, layouts: compared.append(len(ts)) or real(ts, layouts))
    monkeypatch.setattr("minicomp.runtime.launcher.as_layouts", checks.as_layouts)
    lin = torch.nn.Linear(6, 5)
    f = minicomp.compile(lambda x: torch.relu(lin(x)) * 2)
    x = torch.randn(1, 3, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), torch.relu(lin(x)) * 2, **tol(torch.float32))
        module = f._need().call.module
        assert module.LAYOUTS[0] == x.stride()
        compared.clear()
        for k in range(3):
            torch.testing.assert_close(f(x + k), torch.relu(lin(x + k)) * 2, **tol(torch.float32))
        assert compared == []                      # admitted with the module's own strides: not compared again
        y = torch.randn(3, 6).as_strided((1, 3, 6), (7, 6, 1))     # size-1 dim with another stride
        assert y.stride() != module.LAYOUTS[0]
        for _ in range(2):
            torch.testing.assert_close(f(y), torch.relu(lin(y)) * 2, **tol(torch.float32))
        assert f._need().call.module is module     # the same module serves it...
        assert compared                            # ...comparing its strides at each call

"""mode="reduce-overhead": CUDA graphs around compiled calls (minicomp/runtime/cuda_graphs.py).

CPU tests run `GraphedCall` with `FakeCuda`, which behaves like a capture where it matters:
capturing runs nothing the caller sees (the captured outputs hold garbage until a replay),
and a replay recomputes from the static buffers and live weights *into the same output
tensors*, so a result handed out without a copy would change under the caller. The api and
the Dynamo backend are run end to end on the CPU with it in place of torch.cuda. Real CUDA
graphs are captured by tests/test_cuda_graphs_gpu.py (the H200 only).
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from conftest import tol

import minicomp
from minicomp.errors import ModeError
from minicomp.frontend.fx_alias import AtenCall
from minicomp.runtime import cuda_graphs as cg


class FakeCuda(cg.CudaApi):
    """torch.cuda for a GraphedCall on the CPU (see the module docstring)."""

    def __init__(self, fail: BaseException | None = None):
        self.fail, self.captures, self.replays = fail, 0, 0
        self.device_index = 0

    def new_graph(self):
        return types.SimpleNamespace(thunk=None, outs=None)

    def capture(self, graph, thunk):
        if self.fail is not None:
            raise self.fail
        graph.thunk, graph.outs = thunk, list(thunk())
        for o in graph.outs:                # a capture computes nothing
            o.fill_(float("nan") if o.is_floating_point() else -7)
        self.captures += 1
        return graph.outs

    def replay(self, graph):
        for o, new in zip(graph.outs, graph.thunk()):
            o.copy_(new)
        self.replays += 1

    def device(self):
        return self.device_index

    def stream(self):
        return "stream"

    def synchronize(self):
        pass


def _graphed(fn, n_inputs, live=(), **kw):
    cuda = FakeCuda(kw.pop("fail", None))
    calls = []

    def launch(*inputs):
        calls.append(inputs)
        out = fn(*inputs)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    return cg.GraphedCall(launch, n_inputs, live, cuda=cuda, **kw), cuda, calls


# ------------------------------------------------------------------ the mode option

@pytest.mark.parametrize("make", [
    lambda: minicomp.compile(lambda x: x + 1, mode="max-autotune"),
    lambda: minicomp.compile_dsl("func f(x: f32[N]) -> f32[N] { return x + 1.0 }", mode="fast"),
    lambda: minicomp.backend(mode="reduce_overhead"),
])
def test_an_unknown_mode_is_a_clear_value_error(make):
    with pytest.raises(ValueError, match="unknown mode .*'default', 'reduce-overhead'") as info:
        make()
    assert isinstance(info.value, ModeError) and isinstance(info.value, minicomp.MinicompError)


def test_torch_compile_hands_its_mode_to_the_backend_and_a_bad_one_is_refused():
    """torch.compile passes a mode other than "default" to a backend as `mode=`."""
    with pytest.raises(Exception, match="unknown mode 'max-autotune'"):
        torch.compile(lambda x: x * 2, backend="minicomp", mode="max-autotune")(torch.ones(3))


def test_default_mode_explains_as_before_and_reports_no_graph_status():
    f = minicomp.compile(lambda x: x * 2 + 1)
    f(torch.ones(5))
    assert "reduce-overhead" not in f.explain() and f.cuda_graphs is None


def test_on_the_cpu_reduce_overhead_runs_the_normal_path_and_says_so():
    f = minicomp.compile(lambda x, y: torch.softmax(x, -1) * y, mode="reduce-overhead")
    x, y = torch.randn(3, 7), torch.randn(7)
    for _ in range(3):
        torch.testing.assert_close(f(x, y), torch.softmax(x, -1) * y, **tol(torch.float32))
    assert f.cuda_graphs.reason.startswith("its kernels run on cpu") and f.cuda_graphs.replays == 0
    assert f.explain().startswith("mode='reduce-overhead': runs without CUDA graphs: its kernels run on cpu")


def test_compile_dsl_takes_the_mode_and_says_why_it_runs_without_graphs_on_the_cpu():
    f = minicomp.compile_dsl("func f(x: f32[N]) -> f32[N] { return x * 2.0 }", mode="reduce-overhead")
    x = torch.randn(6)
    torch.testing.assert_close(f(x), x * 2)
    assert "its kernels run on cpu" in f.explain()


# ------------------------------------------------------------------ capture safety

@pytest.mark.parametrize("op, why", [
    (torch.ops.aten._local_scalar_dense.default, "tagged data_dependent_output"),
    (torch.ops.aten.nonzero.default, "tagged dynamic_output_shape"),
    (torch.ops.aten.masked_select.default, "dynamic_output_shape"),
])
def test_ops_that_read_values_back_or_size_outputs_by_them_are_hazards(op, why):
    assert why in cg._op_hazard(AtenCall(op, (), {}), str(op))


def test_ops_that_compute_on_the_device_are_not_hazards_and_a_move_to_the_cpu_is():
    assert cg._op_hazard(AtenCall(torch.ops.aten.topk.default, (), {}), "aten.topk") is None
    assert cg._op_hazard(AtenCall(torch.ops.aten.add.Tensor, (), {}), "aten.add") is None
    to_cpu = AtenCall(torch.ops.aten._to_copy.default, (), {"device": torch.device("cpu")})
    assert "moves a tensor to the CPU" in cg._op_hazard(to_cpu, "aten._to_copy")
    assert cg._op_hazard(lambda x: x, "a Python callable") is None   # left to the capture attempt


_hazards = cg.hazards


def _as_if_cuda(compiled):
    """hazards() of `compiled` as though its module ran on CUDA (the CPU test compiles for cpu)."""
    before = compiled.generated.device_type
    compiled.generated.device_type = "cuda"
    try:
        return _hazards(compiled)
    finally:
        compiled.generated.device_type = before


def test_hazards_read_the_compiled_graph_an_opaque_sync_is_named_with_its_node():
    f = minicomp.compile(lambda x: torch.topk(x, 3).values * 2)
    f(torch.randn(4, 9))
    compiled = f._need()
    assert cg.hazards(compiled) == ["its kernels run on cpu (CUDA graphs need CUDA tensors)"]
    assert _as_if_cuda(compiled) == []          # topk runs on the device: capture-safe
    node = next(n for n in compiled.graph.nodes() if n.op == "opaque")
    saved = node.attrs["fn"]
    node.attrs["fn"] = AtenCall(torch.ops.aten._local_scalar_dense.default, (), {})
    try:
        found = _as_if_cuda(compiled)
    finally:
        node.attrs["fn"] = saved
    assert len(found) == 1 and found[0].startswith(f"%{node.id} (") and "data_dependent_output" in found[0]


def test_scalar_constants_pytorch_lines_read_are_made_on_the_device_once_and_are_no_hazard():
    f = minicomp.compile(lambda a, b: (a @ b) * 3 + 1)      # an int64 matmul runs through PyTorch
    a, b = torch.randint(-3, 3, (4, 5)), torch.randint(-3, 3, (5, 2))
    for _ in range(2):
        torch.testing.assert_close(f(a, b), (a @ b) * 3 + 1)
    # no host-to-device copy per call (it would wait for the GPU, and no capture takes it)
    assert "torch.tensor(" not in f.source and f.source.count("= _rt.scalar(") == 2
    assert _as_if_cuda(f._need()) == []
    g = minicomp.compile(lambda a, b: (a @ b) * 3 + 1)      # float: one kernel, the scalars inlined
    g(torch.randn(4, 5), torch.randn(5, 2))
    assert _as_if_cuda(g._need()) == [] and "_rt.scalar(" not in g.source


def test_a_scalar_the_caller_gets_back_is_its_own_each_call():
    g = minicomp.compile(lambda x: (x * 2, torch.full((), 2.0)))
    x = torch.randn(3)
    _, s = g(x)
    assert "= _rt.scalar(2.0, torch.float32, device).clone()" in g.source
    s.add_(5.0)                                             # the caller writes into its result
    y, s2 = g(x)
    torch.testing.assert_close(s2, torch.tensor(2.0))
    torch.testing.assert_close(y, x * 2)
    assert s2.data_ptr() != s.data_ptr()
    # the module's copy is the only one: the call's boundary does not copy it again
    spec, _, _ = g._find((x,))
    assert spec.outputs.risky == [None, None] and not spec.outputs.copies
    t = torch.randn(2, 3)                                  # a tensor constant is copied at the boundary
    h = minicomp.compile(lambda x: (x + 1, t.permute(1, 0)), freeze=True)
    _, c = h(x)
    c.mul_(0.0)
    torch.testing.assert_close(h(x)[1], t.permute(1, 0))
    assert h._find((x,))[0].outputs.risky[1] == ("constant", -1)


def test_runtime_scalars_are_kept_per_value_type_dtype_and_device():
    from minicomp.runtime.checks import scalar
    cpu = torch.device("cpu")
    one = scalar(1.0, torch.float32, cpu)
    assert scalar(1.0, torch.float32, cpu) is one and one.item() == 1.0 and one.dim() == 0
    assert scalar(1, torch.float32, cpu) is not one and scalar(True, torch.float32, cpu) is not one
    assert scalar(1.0, torch.float64, cpu) is not one and scalar(1.0, torch.float64, cpu).dtype == torch.float64
    assert torch.signbit(scalar(-0.0, torch.float32, cpu)) and not torch.signbit(scalar(0.0, torch.float32, cpu))
    assert torch.isnan(scalar(float("nan"), torch.float32, cpu))
    with torch.inference_mode():        # first made under inference_mode, still usable with autograd
        third = scalar(1 / 3, torch.float32, cpu)
    assert not third.is_inference()
    x = torch.randn(3, requires_grad=True)
    (x * third).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 1 / 3))


def test_a_graph_the_check_cannot_read_is_not_captured_rather_than_a_crash():
    broken = types.SimpleNamespace(generated=types.SimpleNamespace(device_type="cuda", fallbacks={}), graph=None)
    (why,) = cg.hazards(broken)
    assert why.startswith("its graph could not be checked for capture safety (AttributeError")


def test_a_graph_with_hazards_never_captures_and_says_why():
    g, cuda, calls = _graphed(lambda x: x + 1, 1, found=["%3 (m.py:4): aten.nonzero is tagged dynamic_output_shape"])
    x = torch.arange(4.0)
    for _ in range(3):
        torch.testing.assert_close(g(x)[0], x + 1)
    assert cuda.captures == 0 and len(calls) == 3
    assert g.status.describe() == "runs without CUDA graphs: %3 (m.py:4): aten.nonzero is tagged dynamic_output_shape"


def test_a_capture_that_fails_runs_uncaptured_from_then_on_with_the_error_as_its_reason():
    g, cuda, calls = _graphed(lambda x: x * 3, 1, fail=RuntimeError("operation not permitted when stream is capturing"))
    x = torch.arange(5.0)
    torch.testing.assert_close(g(x)[0], x * 3)          # warm-up
    with pytest.warns(UserWarning, match="runs it without CUDA graphs: its capture failed"):
        torch.testing.assert_close(g(x + 1)[0], (x + 1) * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # said once
        torch.testing.assert_close(g(x + 2)[0], (x + 2) * 3)
    assert g.status.reason == "its capture failed (RuntimeError: operation not permitted when stream is capturing)"
    assert cuda.replays == 0


# ------------------------------------------------------------------ warm-up, copies, outputs

def test_the_first_call_warms_up_the_second_captures_and_later_calls_replay():
    g, cuda, calls = _graphed(lambda x, y: x * y, 2)
    for i in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 4)    # new tensors each call
        torch.testing.assert_close(g(x, y)[0], x * y)
        assert (cuda.captures, cuda.replays) == ((0, 0), (1, 1), (1, 2), (1, 3))[i]
    assert g.status.describe() == "runs as a CUDA graph: 1 capture(s), 3 replay(s); 2 input(s) copied in, 0 read in place"


def test_outputs_are_the_callers_to_keep_a_later_replay_does_not_overwrite_them():
    g, cuda, _ = _graphed(lambda x: (x + 1, x.sum()), 1)
    kept = []
    for i in range(4):
        x = torch.full((6,), float(i))
        kept.append(g(x))
    for i, (a, s) in enumerate(kept):
        torch.testing.assert_close(a, torch.full((6,), i + 1.0))
        torch.testing.assert_close(s, torch.tensor(6.0 * i))
    assert cuda.replays == 3


def test_outputs_keep_their_strides_a_transposed_or_expanded_result_stays_so():
    g, cuda, _ = _graphed(lambda x: (x.t(), x[:, :1].expand(4, 3), x * 2), 1)
    for i in range(3):
        x = torch.randn(4, 3) + i
        t, e, d = g(x)
        assert t.stride() == (1, 3) and e.stride() == (3, 0) and d.is_contiguous()
        torch.testing.assert_close(t, x.t())
        torch.testing.assert_close(e, x[:, :1].expand(4, 3))
        torch.testing.assert_close(d, x * 2)
    assert cuda.replays == 2


@pytest.mark.parametrize("make", [
    lambda base: (base, base),                              # one tensor twice
    lambda base: (base[1:], base[:-1]),                     # overlapping views of one tensor
    lambda base: (base.t(), base.t()),                      # non-contiguous
    lambda base: (base[:, :1].expand(5, 4), base[0]),       # stride 0: elements share memory
])
def test_aliased_and_strided_inputs_give_eagers_answer_every_call(make):
    fn = lambda a, b: a * 2 + b   # noqa: E731
    g, cuda, _ = _graphed(fn, 2)
    for i in range(4):
        base = torch.randn(5, 4) + i
        a, b = make(base)
        torch.testing.assert_close(g(a, b)[0], fn(a, b))
    assert cuda.replays == 3


def test_an_empty_input_is_fine():
    g, cuda, _ = _graphed(lambda x, y: (x * 2, y + 1), 2)
    for _ in range(3):
        e, y = torch.empty(0, 3), torch.randn(2)
        out = g(e, y)
        assert out[0].shape == (0, 3)
        torch.testing.assert_close(out[1], y + 1)


def test_live_weights_are_read_in_place_an_in_place_update_shows_and_a_replacement_captures_again():
    w = torch.nn.Parameter(torch.randn(4), requires_grad=False)
    g, cuda, _ = _graphed(lambda x, w: x * w, 2, live=[1])
    x = torch.randn(4)
    for _ in range(2):
        torch.testing.assert_close(g(x, w)[0], x * w)
    with torch.no_grad():
        w.add_(1.0)                                  # in place: the same memory, new values
    torch.testing.assert_close(g(x, w)[0], x * w)
    assert cuda.captures == 1
    w.data = torch.randn(4)                          # replaced: the graph would read the old memory
    torch.testing.assert_close(g(x, w)[0], x * w)
    assert cuda.captures == 2 and "captured again after a weight was replaced" in g.status.describe()


def test_a_weight_replaced_at_every_call_stops_the_capturing():
    g, cuda, _ = _graphed(lambda x, w: x + w, 2, live=[1])
    x = torch.randn(3)
    for _ in range(cg.MAX_RECAPTURES + 4):
        w = torch.randn(3)
        torch.testing.assert_close(g(x, w)[0], x + w)
    assert g.status.reason.startswith("its weights were replaced (not updated in place)")
    assert not g.graphs


def test_no_capture_while_a_kernel_compiles_in_the_background_the_first_comes_after(monkeypatch):
    """Meanwhile call() runs eager's lines for the kernel's group (codegen/first_calls.py), which
    a capture would keep for good, and which may copy a host scalar (no capture takes that)."""
    from minicomp.runtime import background
    pending = object()
    monkeypatch.setitem(background._BACKGROUND, pending, "pending")
    g, cuda, _ = _graphed(lambda x: x + 2, 1)
    x = torch.randn(5)
    for _ in range(4):
        torch.testing.assert_close(g(x)[0], x + 2)
    assert cuda.captures == 0 and g.status.reason is None
    background._BACKGROUND[pending] = "done"
    for _ in range(2):
        torch.testing.assert_close(g(x)[0], x + 2)
    assert cuda.captures == 1 and cuda.replays == 2


def test_by_layout_each_shape_warms_up_then_has_its_own_graph():
    g, cuda, _ = _graphed(lambda x: x.cumsum(0), 1, by_layout=True)
    for n in (3, 5, 3, 5, 3, 5):
        x = torch.randn(n)
        torch.testing.assert_close(g(x)[0], x.cumsum(0))
    assert (cuda.captures, cuda.replays) == (2, 4) and len(g.graphs) == 2


def test_past_the_graph_limit_new_layouts_run_uncaptured_and_the_status_says_so(monkeypatch):
    monkeypatch.setattr(cg, "MAX_GRAPHS", 2)
    g, cuda, _ = _graphed(lambda x: x * 2, 1, by_layout=True)
    for n in (3, 3, 4, 4, 5, 5, 5):
        x = torch.randn(n)
        torch.testing.assert_close(g(x)[0], x * 2)
    assert cuda.captures == 2 and len(g.graphs) == 2
    assert g.status.describe().endswith("; layouts past the first 2 run uncaptured")


def test_a_call_on_another_device_than_the_capture_runs_uncaptured():
    g, cuda, calls = _graphed(lambda x: x - 1, 1)
    x = torch.randn(3)
    g(x), g(x)
    cuda.device_index = 1
    torch.testing.assert_close(g(x)[0], x - 1)
    assert cuda.replays == 1 and len(calls) == 4    # warm-up, capture, the replay's thunk, the uncaptured call


def test_the_real_capture_warms_on_its_side_stream_then_captures_there(monkeypatch):
    """CudaApi.capture follows PyTorch's recipe (torch.cuda replaced by recorders here)."""
    events = []

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            events.append(f"{self.name} waits for {other.name}")

    @__import__("contextlib").contextmanager
    def stream(s):
        events.append(f"on {s.name}")
        yield
        events.append(f"off {s.name}")

    @__import__("contextlib").contextmanager
    def graph(g, stream=None, capture_error_mode="global"):
        events.append(f"capture on {stream.name} ({capture_error_mode})")
        try:
            yield
        finally:                                     # torch's exit ends the capture (and raises if it failed)
            events.append("capture ends")

    current = Stream("current")
    for name, value in {"current_device": lambda: 0, "Stream": lambda device: Stream(), "current_stream": lambda: current,
                        "stream": stream, "graph": graph,
                        "set_stream": lambda s: events.append(f"stream set to {s.name}")}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    api = cg.CudaApi()
    out = api.capture(object(), lambda: events.append("call") or [torch.ones(1)])
    assert len(out) == 1
    assert events == ["side waits for current", "on side", "call", "off side", "current waits for side",
                      "capture on side (thread_local)", "call", "capture ends", "stream set to current",
                      "current waits for side"]
    api.capture(object(), lambda: [])
    assert len(api._sides) == 1                  # one side stream per device, kept
    events.clear()
    runs = []

    def fails_when_captured():
        runs.append(1)
        if len(runs) == 2:                           # the warm-up runs, the capture fails
            raise RuntimeError("operation not permitted when stream is capturing")
        return []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    api.scratch = lambda: torch.zeros(1)
    with pytest.raises(RuntimeError, match="not permitted"):
        api.capture(object(), fails_when_captured)
    # the caller gets its stream back, then a one-op capture puts PyTorch's random generators out
    # of capture mode (its failed capture end left them in it)
    assert events[-5:] == ["capture ends", "stream set to current", "capture on side (thread_local)",
                           "capture ends", "stream set to current"], events


def _cuda_status(f):
    """The GraphStatus of each specialisation of a compiled function (or of each graph, where it
    went through Dynamo)."""
    if getattr(f, "_recording", None) is not None:
        return [s for g in f.backend_report().graphs for s in g.graphs]
    found = {id(s): s for entries in f._cache.values() for s in entries}
    return [s.launch.status for s in found.values()]


# ------------------------------------------------------------------ end to end on the CPU, with the fake

@pytest.fixture
def fake_cuda(monkeypatch):
    """The api and the backend on the CPU as though on CUDA: FakeCuda, and hazards() reading
    the graph as a CUDA module's."""
    made = []

    class Made(FakeCuda):
        def __init__(self):
            super().__init__()
            made.append(self)
    monkeypatch.setattr(cg, "CudaApi", Made)
    monkeypatch.setattr(cg, "hazards", _as_if_cuda)
    return made


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale + x


def test_minicomp_compile_replays_a_module_reads_its_weights_live_and_explains(fake_cuda):
    m = _Block().eval()
    f = minicomp.compile(m, mode="reduce-overhead")
    kept = []
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(3, 8)
            kept.append((x, f(x)))
        m.lin.weight.mul_(2.0)                              # in place
        x = torch.randn(3, 8)
        torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
        m.lin.bias.data = torch.randn(8)                    # replaced
        torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    m.lin.weight.data /= 2.0
    m.lin.bias.data = _Block().lin.bias.data
    with torch.no_grad():
        for x, got in kept:                                 # kept across calls, and eager's
            torch.testing.assert_close(got, m(x), **tol(torch.float32))
    status = f.cuda_graphs
    assert status.reason is None and status.captures == 2 and status.replays == 5
    assert f.explain().startswith("mode='reduce-overhead': runs as a CUDA graph: 2 capture(s), 5 replay(s); "
                                  "1 input(s) copied in, 3 read in place; captured again after a weight was replaced")
    graphed = f._last_specialisation().launch
    assert graphed.copied == [0] and len(graphed.live) == 3   # x copied; weight, bias, buffer in place


def test_with_grad_the_forward_replays_and_backward_is_eagers(fake_cuda):
    f = minicomp.compile(lambda x, w: torch.tanh(x * w).sum(-1), mode="reduce-overhead")
    w = torch.randn(7)
    for _ in range(3):
        x = torch.randn(4, 7, requires_grad=True)
        f(x, w).pow(2).sum().backward()
        x2 = x.detach().clone().requires_grad_()
        torch.tanh(x2 * w).sum(-1).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, **tol(torch.float32))
    assert f.cuda_graphs.replays == 2


def test_compile_dsl_replays_with_new_tensors_each_call(fake_cuda):
    f = minicomp.compile_dsl("func f(x: f32[N], y: f32[N]) -> f32[N] { return x * y + 1.0 }", mode="reduce-overhead")
    kept = [(x, y, f(x, y)) for x, y in ((torch.randn(9), torch.randn(9)) for _ in range(4))]
    for x, y, got in kept:
        torch.testing.assert_close(got, x * y + 1.0, **tol(torch.float32))
    assert f.cuda_graphs.replays == 3 and "runs as a CUDA graph: 1 capture(s), 3 replay(s)" in f.explain()


def test_the_torch_compile_backend_replays_with_parameters_and_buffers_in_place(fake_cuda):
    m = _Block().eval()
    backend = minicomp.backend()
    cm = torch.compile(m, backend=backend, mode="reduce-overhead")
    with torch.no_grad():
        outs = [(x, cm(x)) for x in (torch.randn(3, 8) for _ in range(4))]
        for x, got in outs:
            torch.testing.assert_close(got, m(x), **tol(torch.float32))
    report = backend.report()
    (status,) = report.graphs[0].graphs
    assert status.reason is None and status.replays == 3
    assert "graph 0 runs as a CUDA graph: 1 capture(s), 3 replay(s); 1 input(s) copied in, 3 read in place" \
        in report.table()


def test_the_backend_takes_the_mode_as_an_option_too(fake_cuda):
    backend = minicomp.backend()
    cm = torch.compile(lambda x, y: torch.tanh(x) @ y, backend=backend, options={"mode": "reduce-overhead"})
    for _ in range(3):
        x, y = torch.randn(4, 5), torch.randn(5, 2)
        torch.testing.assert_close(cm(x, y), torch.tanh(x) @ y, **tol(torch.float32))
    assert backend.report().graphs[0].graphs[0].replays == 2


def test_a_function_that_goes_through_dynamo_keeps_the_mode_and_explains_its_graphs(fake_cuda):
    def f(x, y):
        if x.sum() > 0:                              # a value read: minicomp's own capture refuses it
            return torch.sigmoid(x) * y
        return x - y
    g = minicomp.compile(f, mode="reduce-overhead")
    with pytest.warns(UserWarning, match="compiling it through Dynamo"):
        g(torch.ones(4, 6), torch.randn(6))
    for _ in range(3):
        x, y = torch.rand(4, 6) + 0.1, torch.randn(6)
        torch.testing.assert_close(g(x, y), torch.sigmoid(x) * y, **tol(torch.float32))
    text = g.explain()
    assert "went through Dynamo" in text and "runs as a CUDA graph: 1 capture(s), 3 replay(s)" in text, text


def test_tiny_llama_at_batch_1_by_16_through_the_fake_capture_matches_eager(fake_cuda):
    """The whole path a transformers model takes (the own capture refuses it, Dynamo's graph,
    AOTAutograd's static inputs) with every replay recomputing from the static buffers."""
    from zoo_models import ZOO
    model = ZOO["llama"].model("sdpa")
    model.config.use_cache = False

    def logits(ids):
        return model(input_ids=ids).logits

    f = minicomp.compile(logits, mode="reduce-overhead")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")              # the fallback to Dynamo says so once
        calls = [torch.randint(4, 128, (1, 16), generator=gen) for _ in range(4)]
        outs = [f(ids) for ids in calls]
        for ids, got in zip(calls, outs):
            torch.testing.assert_close(got, logits(ids), **tol(torch.float32))
    statuses = _cuda_status(f)
    assert statuses and all(s.reason is None and s.replays == 3 for s in statuses), [s.describe() for s in statuses]
    # input_ids copied; every weight and buffer (the rotary inv_freq too) read in place
    n_weights = len(list(model.parameters())) + 1    # + inv_freq (its buffer original_inv_freq is not read)
    assert [(s.copied, s.in_place) for s in statuses] == [(1, n_weights)], [s.describe() for s in statuses]
    run_graphs = [m for m in fake_cuda if m.captures]
    assert len(run_graphs) == len(statuses)


# ------------------------------------------------------------------ cuBLAS's workspace in a capture

def _recorded_cuda(monkeypatch) -> list[str]:
    """torch.cuda's stream and graph calls that CudaApi.capture makes, recorded in order (no GPU)."""
    events: list[str] = []

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(f"enter {self.name}")

        def __exit__(self, *exc):
            events.append(f"exit {self.name}")
            return False

    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(cg, "clear_blas_workspaces", lambda: events.append("clear"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Ctx("stream"))
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: Ctx("graph"))
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: None)
    return events


def test_a_capture_makes_cublas_take_its_workspace_from_the_graphs_own_pool(monkeypatch):
    # The warm-up's matmuls make PyTorch's per-stream workspace outside any graph; a capture that kept
    # it would replay into memory torch.compile's reduce-overhead mode frees (it clears the workspaces
    # and empties the cache around its own captures): the H100 replay then faulted (session 28).
    events = _recorded_cuda(monkeypatch)
    outs = cg.CudaApi().capture(object(), lambda: events.append("run") or [torch.ones(2)])
    assert events == ["enter stream", "run", "exit stream", "clear", "enter graph", "run", "exit graph", "clear"]
    assert torch.equal(outs[0], torch.ones(2))


def test_a_failed_capture_still_leaves_no_workspace_of_its_pool_behind(monkeypatch):
    events = _recorded_cuda(monkeypatch)
    monkeypatch.setattr(cg.CudaApi, "end_generator_capture", lambda self, side: events.append("end generators"))
    calls = []

    def thunk():
        calls.append(1)
        events.append("run")
        if len(calls) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return [torch.ones(1)]
    with pytest.raises(RuntimeError, match="not permitted"):
        cg.CudaApi().capture(object(), thunk)
    assert events[3:] == ["clear", "enter graph", "run", "exit graph", "end generators", "clear"]

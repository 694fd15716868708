"""`torch.compile(..., backend="minicomp")`: the entry point, graph breaks, options, mutation,
grads, symbolic sizes, outputs, the report, and a graph minicomp cannot compile."""

import importlib.metadata
import operator
import warnings

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import minicomp
import minicomp.dynamo
from conftest import tol
from minicomp.errors import MinicompError
from minicomp.frontend import aot
from minicomp.frontend.fx_trace import SDPA


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_entry_point_registers_the_backend_by_name():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert eps["minicomp"].value == "minicomp.dynamo:minicomp_backend"
    assert "minicomp" in torch._dynamo.list_backends()

    def f(x, w):
        return torch.softmax(x @ w, dim=-1) * 2
    x, w = torch.randn(5, 7), torch.randn(7, 9)
    minicomp.dynamo.DEFAULT.clear()
    out = torch.compile(f, backend="minicomp")(x, w)
    torch.testing.assert_close(out, f(x, w), **tol(torch.float32))
    rep = minicomp.backend_report()
    assert len(rep.graphs) == 1 and rep.graphs[0].kernels >= 1 and rep.pytorch_calls == 0
    assert rep.graphs[0].origin and "test_backend.py" in rep.graphs[0].origin


def test_options_pass_through_and_unknown_ones_are_refused(tmp_path):
    def f(x):
        return torch.relu(x) + 1
    x = torch.randn(6, 10)
    out = torch.compile(f, backend="minicomp", options={"dump_dir": str(tmp_path)})(x)
    torch.testing.assert_close(out, f(x))
    assert any(tmp_path.iterdir()), "dump_dir was not passed to minicomp"
    with pytest.raises(MinicompError, match="unknown minicomp option"):
        minicomp.backend(no_such_option=1)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown minicomp option"):
        torch.compile(f, backend="minicomp", options={"no_such_option": 1})(x)


def test_graph_breaks_give_several_graphs_and_eager_answers():
    def f(x):
        y = torch.tanh(x) * 3
        if y.sum() > 0:          # a value decides control flow: Dynamo breaks the graph here
            return y.exp() - 1
        return y * 2
    b = minicomp.backend()
    cf = torch.compile(f, backend=b)
    for sign in (1.0, -1.0):
        x = sign * (torch.rand(4, 9) + 0.1)
        torch.testing.assert_close(cf(x), f(x), **tol(torch.float32))
    rep = b.report()
    assert len(rep.graphs) >= 2 and not rep.failures
    assert minicomp.backend_report(cf).graphs == rep.graphs


class _Cache(nn.Module):
    """A static KV-cache-like buffer written in place at a position, then read whole."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 6, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, self.proj(x))
        return self.cache.sum(dim=1) * 2


def test_in_place_buffer_updates_like_a_static_cache():
    torch.manual_seed(0)
    eager, compiled = _Cache(), _Cache()
    compiled.load_state_dict(eager.state_dict())
    cm = torch.compile(compiled, backend="minicomp")
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 1, 4)
            pos = torch.tensor([step])
            torch.testing.assert_close(cm(x, pos), eager(x, pos), **tol(torch.float32))
    torch.testing.assert_close(compiled.cache, eager.cache, **tol(torch.float32))


def test_input_mutation_is_applied_to_the_callers_tensor():
    def f(x, y):
        x.mul_(2)
        y[:, 0] = 7.0
        return x + y
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    xe, ye = x.clone(), y.clone()
    out = torch.compile(f, backend="minicomp")(x, y)
    ref = f(xe, ye)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x, xe)
    torch.testing.assert_close(y, ye)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(12, 24), nn.LayerNorm(24), nn.Linear(24, 5)

    def forward(self, x):
        return self.fc2(F.gelu(self.ln(self.fc1(x))))


def test_grads_are_pytorchs():
    torch.manual_seed(0)
    eager, compiled = _Net(), _Net()
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(7, 12)
    target = torch.randn(7, 5)
    b = minicomp.backend()
    cm = torch.compile(compiled, backend=b)
    for model in (eager, cm):
        loss = F.mse_loss(model(x), target)
        loss.backward()
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        assert pc.grad is not None, name
        torch.testing.assert_close(pc.grad, pe.grad, **tol(torch.float32), msg=name)
    rep = b.report()
    assert [g.mode for g in rep.graphs] == ["forward"] and rep.kernels > 0


def test_grad_of_an_input_and_a_second_step():
    w = torch.randn(6, 6, requires_grad=True)

    def f(x):
        return (torch.sigmoid(x @ w) * x).sum()
    x1 = torch.randn(4, 6, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    cf = torch.compile(f, backend="minicomp")
    for _ in range(2):
        w.grad = None
        f(x1).backward()
        ge = w.grad.clone()
        w.grad = None
        cf(x2).backward()
        torch.testing.assert_close(w.grad, ge, **tol(torch.float32))
    torch.testing.assert_close(x2.grad, x1.grad, **tol(torch.float32))


def test_symbolic_sizes_are_compiled_once_for_every_size():
    def f(x, w):
        return F.silu(x @ w).mean(dim=-1)
    w = torch.randn(8, 16)
    b = minicomp.backend()
    cf = torch.compile(f, backend=b)
    for n in (5, 7, 9, 7, 33):   # the second size makes Dynamo mark the dimension dynamic
        x = torch.randn(n, 8)
        torch.testing.assert_close(cf(x, w), f(x, w), **tol(torch.float32))
    rep = b.report()
    symbolic = [g for g in rep.graphs if g.symbolic]
    assert len(symbolic) == 1, rep.table()
    # one compile of the graph over symbols serves 7, 9 and 33 (codegen/sizes.py)
    assert symbolic[0].shapes == 1 and symbolic[0].per_shape == "" and not rep.failures


def test_a_symbolic_graph_that_returns_a_size_computes_it_from_its_arguments():
    def f(x):
        return torch.tanh(x) * 2, x.shape[0] * 3
    b = minicomp.backend()
    cf = torch.compile(f, backend=b)
    for n in (5, 7, 9, 7):
        x = torch.randn(n, 4)
        got, size = cf(x)
        want, wsize = f(x)
        torch.testing.assert_close(got, want, **tol(torch.float32))
        assert size == wsize
    symbolic = [g for g in b.report().graphs if g.symbolic]
    # Dynamo hands the symbolic graph its size: x.shape[0] * 3 is computed from that argument
    assert [(g.shapes, g.per_shape) for g in symbolic] == [(1, "")], b.report().table()


def test_ops_minicomp_cannot_lower_run_through_pytorch_and_are_reported():
    def f(x):
        return torch.kthvalue(torch.exp(x), 2, dim=-1).values * 2     # kthvalue has no kernel
    x = torch.randn(3, 11)
    b = minicomp.backend()
    torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x), **tol(torch.float32))
    rep = b.report()
    assert rep.pytorch_ops == {"aten.kthvalue.default[0]": 1}
    assert rep.aten_calls == 3 and rep.view_calls == 0 and rep.pytorch_calls == 1      # exp, kthvalue, mul
    assert rep.fraction_compiled == pytest.approx(2 / 3) == rep.fraction_computed_in_kernels
    assert "aten.kthvalue.default" in rep.table()


def test_views_count_as_compiled_and_are_counted_apart():
    def f(x):
        return torch.kthvalue(x.t().reshape(-1, 2), 1, dim=0).values + 1
    b = minicomp.backend()
    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x), **tol(torch.float32))
    rep = b.report()
    assert rep.view_calls >= 1 and rep.pytorch_calls == 1, rep.table()
    assert rep.fraction_computed_in_kernels < rep.fraction_compiled < 1


def test_outputs_are_fresh_where_eagers_are():
    def f(x):
        return x.clone(), x * 2, x * 2, x.t()
    x = torch.randn(4, 6)
    outs = torch.compile(f, backend="minicomp")(x)
    for o, r in zip(outs, f(x)):
        torch.testing.assert_close(o, r)
        assert o.stride() == r.stride()
    clone, a, b, view = outs
    assert clone.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    clone.add_(1)
    a.add_(1)
    torch.testing.assert_close(b, x * 2)
    x.add_(1)
    torch.testing.assert_close(view, x.t())      # eager's x.t() is a view of x: so is this


def test_weights_are_read_at_call_time():
    torch.manual_seed(0)
    m = nn.Linear(5, 3)
    cm = torch.compile(m, backend="minicomp")
    x = torch.randn(4, 5)
    with torch.no_grad():
        cm(x)
        m.weight.mul_(2)
        torch.testing.assert_close(cm(x), m(x))
        m.bias = nn.Parameter(torch.randn(3))
        torch.testing.assert_close(cm(x), m(x))


def test_a_graph_minicomp_cannot_compile_runs_eagerly_and_says_why(monkeypatch):
    import minicomp.dynamo as dyn

    def broken(*args, **kwargs):
        raise MinicompError("no kernel today")
    monkeypatch.setattr(dyn, "compile_graph", broken)

    def f(x):
        return torch.sin(x) + 1
    x = torch.randn(3, 4)
    b = minicomp.backend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(f, backend=b)(x)
    torch.testing.assert_close(out, f(x))
    assert any("no kernel today" in str(w.message) for w in caught)
    rep = b.report()
    assert rep.failures and "no kernel today" in rep.failures[0].error
    assert "ran eagerly" in rep.table()


def test_the_report_outlives_dynamo_reset():
    b = minicomp.backend()
    torch.compile(lambda x: x * 3, backend=b)(torch.randn(4))
    torch._dynamo.reset()
    assert len(b.report().graphs) == 1


def test_backend_report_of_something_else_is_refused():
    with pytest.raises(MinicompError, match="not made by torch.compile with the minicomp backend"):
        minicomp.backend_report(torch.compile(lambda x: x + 1, backend="eager"))


def test_cuda_sdpa_ops_become_minicomps_attention():
    """The efficient-attention op (CUDA's choice for masked SDPA) is rewritten to minicomp::sdpa
    when only its output is read; the rewritten graph computes SDPA."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.randn(2, 3, 5, 5)
    g = fx.Graph()
    ph = [g.placeholder(n) for n in ("q", "k", "v", "mask")]
    call = g.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                           (*ph, False), {"scale": 0.3})
    out = g.call_function(operator.getitem, (call, 0))
    g.output((out,))
    gm = fx.GraphModule(nn.Module(), g)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (q, k, v, mask)]
        for p, f_ in zip(ph, fakes):
            p.meta["val"] = f_
        out.meta["val"] = torch.empty(2, 3, 5, 8)
    assert aot.rewrite_sdpa(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [SDPA]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(gm(q, k, v, mask)[0], ref, **tol(torch.float32))


def test_cuda_sdpa_with_fewer_kv_heads_becomes_grouped_query_attention():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    g = fx.Graph()
    ph = [g.placeholder(n) for n in "qkv"]
    call = g.call_function(torch.ops.aten._scaled_dot_product_flash_attention.default, (*ph, 0.0, True))
    out = g.call_function(operator.getitem, (call, 0))
    g.output((out,))
    gm = fx.GraphModule(nn.Module(), g)
    with FakeTensorMode() as mode:
        for p, t in zip(ph, (q, k, v)):
            p.meta["val"] = mode.from_tensor(t)
    out.meta["val"] = torch.empty(1, 4, 6, 8)
    assert aot.rewrite_sdpa(gm) == 1
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(gm(q, k, v)[0], ref, **tol(torch.float32))


def test_sdpa_ops_whose_other_outputs_are_read_stay():
    g = fx.Graph()
    q, k, v = (g.placeholder(n) for n in "qkv")
    call = g.call_function(torch.ops.aten._scaled_dot_product_flash_attention.default, (q, k, v))
    g.output((g.call_function(operator.getitem, (call, 0)), g.call_function(operator.getitem, (call, 1))))
    gm = fx.GraphModule(nn.Module(), g)
    assert aot.rewrite_sdpa(gm) == 0


@pytest.mark.parametrize("causal", [True, False])
def test_cpu_sdpa_with_fewer_kv_heads_is_grouped_query_attention_in_a_kernel(causal):
    """transformers passes enable_gqa=True when no mask is given; on the CPU AOTAutograd hands
    `_scaled_dot_product_flash_attention_for_cpu` k and v with fewer heads (it used to stay opaque)."""
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True) * 2

    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 1, 7, 8), torch.randn(2, 1, 7, 8)   # one KV head
    b = minicomp.backend()
    torch.testing.assert_close(torch.compile(f, backend=b)(q, k, v), f(q, k, v), **tol(torch.float32))
    rep = b.report()
    assert rep.pytorch_calls == 0 and rep.kernels >= 1, rep.table()

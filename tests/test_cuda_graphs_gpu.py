"""mode="reduce-overhead" with real CUDA graphs (minicomp/runtime/cuda_graphs.py), on the H200:
new tensors each call, outputs kept across calls, aliased and expanded inputs, parameters
updated in place and replaced, the torch.compile backend, a capture that syncs, and a tiny
Llama at batch 1 x 16, each against eager. The logic without a GPU is tests/test_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tol
from test_cuda_graphs import _Block, _cuda_status

import minicomp
from minicomp.runtime import cuda_graphs as cg

pytestmark = pytest.mark.gpu


@pytest.mark.gpu
def test_gpu_new_tensors_each_call_and_outputs_kept_across_calls():
    f = minicomp.compile(lambda x, y: (torch.softmax(x, -1) * y, (x * y).sum(-1)), mode="reduce-overhead")
    calls = [(torch.randn(37, 129, device="cuda"), torch.randn(129, device="cuda")) for _ in range(5)]
    outs = [f(x, y) for x, y in calls]
    for (x, y), (a, b) in zip(calls, outs):
        torch.testing.assert_close(a, torch.softmax(x, -1) * y, **tol(torch.float32))
        torch.testing.assert_close(b, (x * y).sum(-1), **tol(torch.float32))
    status = f.cuda_graphs
    assert status.reason is None, status.describe()
    assert status.captures == 1 and status.replays == 4
    if torch.cuda.get_device_capability() >= (9, 0):      # the replays ran kernels joined by PDL edges
        assert "launch_pdl=True" in f.source


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_aliased_inputs_views_and_an_expanded_input(dtype):
    f = minicomp.compile(lambda a, b: torch.nn.functional.gelu(a) + b * 2, mode="reduce-overhead")
    for i in range(4):
        base = torch.randn(65, 33, device="cuda", dtype=dtype)
        for a, b in ((base, base), (base[1:], base[:-1]), (base[:, :1].expand(65, 33), base[0])):
            torch.testing.assert_close(f(a, b), torch.nn.functional.gelu(a) + b * 2, **tol(dtype))
    statuses = _cuda_status(f)
    assert len(statuses) >= 2 and all(s.reason is None and s.replays >= 3 for s in statuses), \
        [s.describe() for s in statuses]


@pytest.mark.gpu
def test_gpu_pytorch_lines_that_read_scalar_constants_capture_and_replay():
    # a float64 matmul runs through PyTorch, and reads 3 and 1 as tensors: made on the device at
    # the first call and kept (runtime/checks.scalar), so the second call captures; the scalar
    # the call returns is the caller's own
    f = minicomp.compile(lambda a, b: ((a @ b) * 3 + 1, torch.full((), 7)), mode="reduce-overhead")
    kept = []
    for i in range(4):
        a, b = (torch.randn(s, device="cuda", dtype=torch.float64) for s in ((9, 5), (5, 4)))
        got, seven = f(a, b)
        torch.testing.assert_close(got, (a @ b) * 3 + 1)
        torch.testing.assert_close(seven, torch.tensor(7, device="cuda"))
        kept.append(seven)
        seven.add_(1)                       # the caller's to write: no later call sees it
    assert all(k.item() == 8 for k in kept)
    (status,) = _cuda_status(f)
    assert status.reason is None and status.captures == 1 and status.replays == 3, status.describe()


@pytest.mark.gpu
def test_gpu_a_parameter_updated_in_place_and_replaced_between_calls():
    m = _Block().cuda().eval()
    f = minicomp.compile(m, mode="reduce-overhead")
    x = torch.randn(5, 8, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
        m.lin.weight.add_(0.25)
        torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
        m.lin.weight.data = torch.randn(8, 8, device="cuda")
        for _ in range(2):
            torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    (status,) = _cuda_status(f)
    assert status.reason is None and status.captures == 2, status.describe()


@pytest.mark.gpu
def test_gpu_tiny_llama_batch_1_by_16_replays_and_matches_eager():
    from zoo_models import ZOO_EXTRA
    model = ZOO_EXTRA["llama_4layer"].model("sdpa").cuda()   # 4 layers, width 64
    model.config.use_cache = False

    def logits(ids):
        return model(input_ids=ids).logits

    f = minicomp.compile(logits, mode="reduce-overhead")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        calls = [torch.randint(4, 128, (1, 16), generator=gen).cuda() for _ in range(5)]
        outs = [f(ids) for ids in calls]
        for ids, got in zip(calls, outs):
            torch.testing.assert_close(got, logits(ids), **tol(torch.float32))
    statuses = _cuda_status(f)
    assert statuses and all(s.reason is None and s.replays >= 3 for s in statuses), \
        [s.describe() for s in statuses]


@pytest.mark.gpu
def test_gpu_the_backend_replays_a_module_with_its_parameters_in_place():
    m = _Block().cuda().eval()
    backend = minicomp.backend()
    cm = torch.compile(m, backend=backend, mode="reduce-overhead")
    with torch.no_grad():
        outs = [(x, cm(x)) for x in (torch.randn(6, 8, device="cuda") for _ in range(4))]
        for x, got in outs:
            torch.testing.assert_close(got, m(x), **tol(torch.float32))
    statuses = [st for g in backend.report().graphs for st in g.graphs]
    assert statuses and all(st.reason is None and st.replays == 3 for st in statuses), backend.report().table()


@pytest.mark.gpu
def test_gpu_a_call_that_syncs_fails_its_capture_cleanly_and_runs_uncaptured():
    def launch(x):
        return [x * x.sum().item()]          # a host sync: cannot be captured
    g = cg.GraphedCall(launch, 1, ())
    x = torch.randn(33, device="cuda")
    torch.testing.assert_close(g(x)[0], x * x.sum().item())
    with pytest.warns(UserWarning, match="its capture failed"):
        torch.testing.assert_close(g(x + 1)[0], (x + 1) * (x + 1).sum().item())
    torch.testing.assert_close(g(x - 1)[0], (x - 1) * (x - 1).sum().item())
    assert g.status.reason.startswith("its capture failed") and g.status.replays == 0
    torch.cuda.synchronize()                 # the device is fine afterwards
    assert (torch.ones(4, device="cuda") * 2).sum().item() == 8.0
    # and so is the default random generator (PyTorch leaves it in capture mode after a failed
    # capture; this raised "Offset increment outside graph capture" before the reset)
    assert torch.randn(1000, device="cuda").std().item() > 0.5


@pytest.mark.gpu
def test_gpu_a_replay_survives_cublas_workspaces_cleared_and_the_cache_emptied(monkeypatch):
    # what torch.compile(mode="reduce-overhead") does around each of its own captures: a graph that
    # kept the warm-up's cuBLAS workspace replayed into freed memory (session 28, H100: illegal
    # memory access). With MINICOMP_GRAPH_FEW_ROWS=1 a GEMM of few rows over K >= 1024 calls
    # cuBLAS under CUDA graphs.
    monkeypatch.setenv("MINICOMP_GRAPH_FEW_ROWS", "1")
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 256).cuda()
    f = minicomp.compile(lambda x: torch.relu(lin(x)) * 2.0, mode="reduce-overhead")
    xs = [torch.randn(4, 1024, device="cuda") for _ in range(5)]
    with torch.no_grad():
        for x in xs[:2]:                  # the first call warms up, the second captures
            f(x)
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        for x in xs:
            torch.testing.assert_close(f(x), torch.relu(lin(x)) * 2.0, **tol(torch.float32))
        torch.cuda.synchronize()
    status = f.cuda_graphs
    assert status.reason is None and status.captures == 1 and status.replays >= 5, status.describe()
    assert "cuBLAS" in f.source                    # the graph's matmul is the library's

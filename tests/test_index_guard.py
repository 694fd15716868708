"""runtime/index_guard.py: a compiled call's index check on CUDA, one kernel and one assertion.

The kernel runs here under Triton's interpreter on CPU tensors (what it decides for each range
and size); on the GPU a compiled embedding checks its ids that way, and a bad id stops the
process with a device-side assertion as eager's does (in a child process: the assertion leaves
the CUDA context unusable)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import triton

import minicomp  # noqa: F401  (first: on the CPU it turns Triton's interpreter on)
from minicomp.runtime import index_guard


def _flag_after(t: torch.Tensor, lo: int, hi: int) -> int:
    ok = torch.ones(1, dtype=torch.int32)
    flat = index_guard.flattened(t)
    n = flat.numel()
    index_guard._in_range[(triton.cdiv(n, index_guard.BLOCK),)](flat, n, lo, hi, ok, BLOCK=index_guard.BLOCK)
    return int(ok.item())


@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 3000])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_kernel_clears_the_flag_exactly_when_an_index_is_out_of_range(n, dtype):
    g = torch.Generator().manual_seed(n)
    t = torch.randint(0, 50, (n,), generator=g, dtype=dtype)
    assert _flag_after(t, 0, 49) == 1
    assert _flag_after(t, -50, 49) == 1                   # negative indices allowed: a wider range
    for where, value in ((0, 50), (n - 1, -1), (n // 2, 10**6)):
        bad = t.clone()
        bad[where] = value
        assert _flag_after(bad, 0, 49) == 0, (where, value)
    assert _flag_after(t, 1, 48) == int(bool(((t >= 1) & (t <= 48)).all()))


def test_a_strided_view_is_checked_where_it_reads():
    """A slice or an expanded view (BERT's token-type buffer, `buf.expand(4, 512)`) is checked
    through the elements it reads, not its whole storage."""
    base = torch.tensor([[0, 1, 99], [2, 3, 99]])
    assert _flag_after(base[:, 0:2], 0, 3) == 1
    assert _flag_after(base, 0, 3) == 0
    assert _flag_after(torch.tensor([1]).expand(4, 5), 0, 1) == 1
    types = torch.tensor([[0, 1, 2]])
    wide = types.expand(4, 3)                                 # an expand is checked in place, once per value
    assert index_guard.flattened(wide).data_ptr() == types.data_ptr() and index_guard.flattened(wide).numel() == 3
    assert _flag_after(wide, 0, 2) == 1 and _flag_after(wide, 0, 1) == 0
    odd = torch.arange(12).view(3, 4)[:, None, ::2].expand(3, 5, 2)     # strided after the expand: copied
    assert index_guard.flattened(odd).reshape(-1).tolist() == odd[:, 0].reshape(-1).tolist()
    assert _flag_after(odd, 0, 10) == 1 and _flag_after(odd, 0, 9) == 0
    square = torch.tensor([[0, 1], [2, 3]])                   # contiguous: read in place, not copied
    assert index_guard.flattened(square) is square
    assert _flag_after(square, 0, 3) == 1 and _flag_after(square, 0, 2) == 0


_COMPILE_FOR_SM90 = textwrap.dedent("""
    import os
    os.environ["TRITON_INTERPRET"] = "0"
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from minicomp.codegen.target_worker import StubDriver
    driver.set_active(StubDriver(GPUTarget("cuda", 90, 32)))
    from minicomp.runtime import index_guard as ig
    for dt in (torch.int64, torch.int32):
        k = ig._in_range.warmup(dt, 2048, -7, 31999, torch.int32, grid=(1,), BLOCK=ig.BLOCK)
        assert k.asm["cubin"], dt
    print("compiled for sm_90")
""")


def test_the_kernel_passes_tritons_compiler_for_sm90():
    """The GPU-true check for this runtime kernel (generated modules' kernels have theirs in the
    suite's verify hook): Triton's real compiler, to a cubin, without a GPU."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0 and "compiled for sm_90" in done.stdout, done.stderr[-3000:]


@pytest.mark.gpu
def test_gpu_compiled_embedding_checks_its_ids_in_one_kernel():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    w = torch.randn(37, 16, device="cuda")

    def fn(ids):
        return F.embedding(ids, w) * 2

    f = minicomp.compile(fn)
    for shape in [(3, 5), (2, 1029)]:
        ids = torch.randint(0, 37, shape, device="cuda")
        ids[0, 0], ids[-1, -1] = 0, 36                    # both ends of the range
        torch.testing.assert_close(f(ids), fn(ids))
    torch.cuda.synchronize()
    assert "_rt.check_index(" in f.compile_for(ids).generated.source
    assert int(index_guard.flag(torch.cuda.current_device()).item()) == 1


_BAD_ID = textwrap.dedent("""
    import torch, torch.nn.functional as F, minicomp
    w = torch.randn(37, 16, device="cuda")
    f = minicomp.compile(lambda ids: F.embedding(ids, w) * 2)
    ids = torch.randint(0, 37, (4, 9), device="cuda")
    f(ids); torch.cuda.synchronize()
    print("good ids passed", flush=True)
    ids[2, 3] = 37
    f(ids); torch.cuda.synchronize()
    print("bad id passed", flush=True)
""")


@pytest.mark.gpu
def test_gpu_a_bad_id_stops_the_call_with_a_device_side_assertion():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _BAD_ID], capture_output=True, text=True, timeout=300, env=env)
    assert "good ids passed" in done.stdout, done.stderr[-3000:]
    assert done.returncode != 0 and "bad id passed" not in done.stdout, (done.stdout, done.stderr[-3000:])
    assert "device-side assert" in done.stderr or "Assertion" in done.stderr, done.stderr[-3000:]

"""The generated CUDA modules' launch helper (codegen/launch.py), driven by stand-in kernels.

The helper is module text meant for CUDA; here it runs against fakes that record which path
each launch took, so its rules (Triton's path first, the compiled launcher after, Triton's path
again for misaligned tensors, another device, or a launcher that refuses the arguments) are
checked on a machine without a GPU. `pytest -m gpu` runs the real thing through every GPU test.
"""

from __future__ import annotations

import types

import pytest

import torch

from minicomp.codegen.launch import LAUNCH_HELPER, via_launch_helper


class FakeCompiled:
    def __init__(self, log, refuse=False):
        self.log, self.refuse = log, refuse

    def __getitem__(self, grid):
        def runner(*args):
            if self.refuse:
                raise TypeError("launcher wants other arguments")
            self.log.append(("fast", grid, args))
        return runner


class FakeKernel:
    """An autotuned Triton kernel as `_launch` sees it: `kernel[grid](*args, **kwargs)` returns the
    compiled kernel; `arg_names` and `best_config` say how to complete the arguments."""

    def __init__(self, returns=True, refuse=False, tuned=True):
        self.log = []
        self.arg_names = ["x_ptr", "y_ptr", "n_rows", "BLOCK_R", "BLOCK_C"]
        self.best_config = types.SimpleNamespace(kwargs={"BLOCK_R": 2}) if tuned else None
        self.returns, self.refuse = returns, refuse

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log, self.refuse) if self.returns else None
        return launch


def helper(device=0):
    current = {"device": device}
    fake_torch = types.SimpleNamespace(Tensor=torch.Tensor,
                                       cuda=types.SimpleNamespace(current_device=lambda: current["device"]))
    ns = {"torch": fake_torch}
    exec(compile(LAUNCH_HELPER, "<launch helper>", "exec"), ns)
    return ns, current


def grid(meta):
    return (-(-meta["n_rows"] // meta["BLOCK_R"]),)


def test_first_launch_through_triton_then_the_compiled_launcher():
    ns, _ = helper()
    k = FakeKernel()
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "fast"]
    # the grid evaluated with the autotuned config, padded to three axes; constexprs appended in order
    assert k.log[1][1] == (4, 1, 1) and k.log[1][2] == (x, y, 8, 2, 4)


def test_misaligned_tensors_and_another_device_go_through_triton():
    ns, current = helper()
    k = FakeKernel()
    x, y = torch.zeros(9, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)       # 2 bytes past an aligned start
    current["device"] = 1
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    current["device"] = 0
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "triton", "triton", "fast"]


def test_a_misaligned_first_launch_captures_nothing():
    ns, _ = helper()
    k = FakeKernel()
    x, y = torch.zeros(9, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[:8], y, 8, BLOCK_C=4)       # aligned at last: captured now
    ns["_launch"](k, grid, x[:8], y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "triton", "triton", "fast"]


def test_a_refusing_launcher_or_no_compiled_kernel_keeps_to_triton():
    for kernel in (FakeKernel(refuse=True), FakeKernel(returns=False)):
        ns, _ = helper()
        x, y = torch.zeros(8), torch.zeros(8)
        for _ in range(3):
            ns["_launch"](kernel, grid, x, y, 8, BLOCK_C=4)
        assert [e[0] for e in kernel.log] == ["triton"] * 3
        assert ns["_FAST"][kernel] is False


def test_untuned_kernels_and_literal_grids():
    ns, _ = helper()
    k = FakeKernel(tuned=False)
    x, y = torch.zeros(8), torch.zeros(8)
    for _ in range(2):
        ns["_launch"](k, (3, 2), x, y, 8, BLOCK_R=1, BLOCK_C=4)
    assert k.log[1] == ("fast", (3, 2, 1), (x, y, 8, 1, 4))


def test_launch_lines_are_rewritten_and_nothing_else():
    lines = ["grid = lambda meta: (triton.cdiv(64, meta['BLOCK_R']),)",
             "mc_red_x_0[grid](buf0, buf5, 64, 4096, BLOCK_C=4096)",
             '    mc_attn_a_1[lambda meta: (triton.cdiv(77, meta["BLOCK_M"]), 6)](buf0, buf1, SQ=77, SK=77)',
             "other[grid](buf0)", "# mc_red_x_0[grid](not a launch)"]
    out = via_launch_helper(lines, "mc_red_x_0")
    assert out == [lines[0], "_launch(mc_red_x_0, grid, buf0, buf5, 64, 4096, BLOCK_C=4096)"] + lines[2:]
    out = via_launch_helper(lines, "mc_attn_a_1")
    assert out[2] == ('    _launch(mc_attn_a_1, lambda meta: (triton.cdiv(77, meta["BLOCK_M"]), 6), buf0, buf1, '
                      'SQ=77, SK=77)')


# ----------------------------------------------------------------------------- GPU: the real launchers

@pytest.mark.gpu
@pytest.mark.parametrize("case", ["softmax", "affine_gelu", "linear_tma", "attention"])
def test_gpu_every_call_is_right_after_the_first(case):
    """The benchmarks check a compiled function's first call (Triton's launch path); this checks
    the calls after it, which go through the compiled kernels' own launchers: new data every
    call, an input at a misaligned address in between (Triton's path again), and back."""
    import math

    import torch.nn.functional as F

    import minicomp

    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, device=dev).mul(scale).to(dt)

    if case == "softmax":
        fn, make = (lambda x: torch.softmax(x, -1)), (lambda: [rnd(1000, 3000)])
    elif case == "affine_gelu":
        fn = lambda x, w, b: F.gelu(x * w + b, approximate="tanh")   # noqa: E731
        make = lambda: [rnd(777, 1024), rnd(1024), rnd(1024)]          # noqa: E731
    elif case == "linear_tma":
        fn = lambda x, w, b: F.linear(x, w, b)                          # noqa: E731
        make = lambda: [rnd(1000, 512), rnd(768, 512, scale=1 / math.sqrt(512)), rnd(768)]   # noqa: E731
    else:
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)   # noqa: E731
        make = lambda: [rnd(2, 4, 1000, 64) for _ in range(3)]                           # noqa: E731
    compiled = minicomp.compile(fn)
    for step in range(4):
        args = make()
        if step == 2:   # 2 bytes past an aligned start: Triton's path, then back to the fast one
            first = args[0]
            padded = torch.empty(first.numel() + 1, dtype=dt, device=dev)[1:].view(first.shape)
            padded.copy_(first)
            assert padded.data_ptr() % 16 != 0
            args[0] = padded
        torch.testing.assert_close(compiled(*args), fn(*args), atol=2e-2, rtol=2e-2)

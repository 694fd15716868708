"""Kernels the same up to names are written once and launched by every group that has one
(codegen/dedup.py): the canonical form, the modules it gives, and the launcher that keeps one
fast launcher per launch site of a shared kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import tol
from test_launch import FakeKernel, grid

import minicomp
from minicomp.codegen import dedup, generate
from minicomp.codegen.common import Kernel
from minicomp.runtime import launcher
from minicomp.target import Target

SM90 = Target("cuda", (9, 0))

ROWS = '''
@triton.jit
def {name}({a}_ptr, {b}_ptr, n, BLOCK: tl.constexpr):
    # computes %{node} pow
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    {v} = tl.load({a}_ptr + offs, mask=offs < n, other=0.0)
    {w} = {v} * {v} + {c}
    tl.store({b}_ptr + offs, {w}, mask=offs < n)
'''


def kernel(name="mc_pw_sq_1", a="x", b="buf3", v="x", w="pow3", c="1.0", node=3) -> Kernel:
    return Kernel(name, ROWS.format(name=name, a=a, b=b, v=v, w=w, c=c, node=node))


def test_kernels_that_differ_in_names_only_have_one_canonical_text():
    first = kernel()
    same = kernel("mc_pw_sq_7", a="buf6", b="buf9", v="ld6", w="pow9", node=9)
    assert dedup.canonical(first) == dedup.canonical(same)
    assert dedup.renamer(first, same) == {"mc_pw_sq_7": "mc_pw_sq_1", "buf6_ptr": "x_ptr", "buf9_ptr": "buf3_ptr"}


def test_a_different_constant_or_argument_order_is_another_kernel():
    first = kernel()
    assert dedup.canonical(first) != dedup.canonical(kernel("mc_pw_sq_2", c="2.0"))
    # the parameters used the other way round: another function of the positional arguments
    swapped = Kernel("mc_pw_sq_2", ROWS.format(name="mc_pw_sq_2", a="y", b="z", v="t", w="u", c="1.0", node=1)
                     .replace("y_ptr, z_ptr, n", "z_ptr, y_ptr, n"))
    assert dedup.canonical(first) != dedup.canonical(swapped)


def test_a_string_naming_a_parameter_is_compared_by_position():
    src = '''
@triton.jit(do_not_specialize=["{s}"])
def {name}(a, b, BLOCK: tl.constexpr):
    tl.store(a + tl.arange(0, BLOCK), b)
'''
    one = Kernel("mc_k_1", src.format(name="mc_k_1", s="a"))
    other = Kernel("mc_k_2", src.format(name="mc_k_2", s="b"))
    assert dedup.canonical(one) != dedup.canonical(other)
    assert dedup.canonical(one) == dedup.canonical(Kernel("mc_k_3", src.format(name="mc_k_3", s="a")))


def test_a_kernel_owns_its_name_and_derived_names_only():
    src = "mc_k_1_configs = [1]\n@triton.jit\ndef mc_k_1(a):\n    mc_k_10(a)\n"
    other = "mc_k_2_configs = [1]\n@triton.jit\ndef mc_k_2(a):\n    mc_k_10(a)\n"
    assert dedup.canonical(Kernel("mc_k_1", src)) == dedup.canonical(Kernel("mc_k_2", other))
    calls_itself = "mc_k_2_configs = [1]\n@triton.jit\ndef mc_k_2(a):\n    mc_k_20(a)\n"
    assert dedup.canonical(Kernel("mc_k_1", src)) != dedup.canonical(Kernel("mc_k_2", calls_itself))
    assert dedup.canonical(Kernel("mc_k_1", "def (:")) is None


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


def _two_blocks(width=24):
    torch.manual_seed(0)
    return nn.Sequential(Block(width), Block(width)).eval()


def test_two_identical_layers_share_their_kernels_and_match_eager():
    m = _two_blocks()
    x = torch.randn(3, 5, 24)
    f = minicomp.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    gen = f.compile_for(x).generated
    shared = {k: users for k, users in gen.kernel_users.items() if len(users) > 1}
    assert shared, gen.source[:2000]
    groups = [gid for users in gen.kernel_users.values() for gid in users]
    assert len(gen.kernel_names) < len(groups) and len(set(groups)) == len(groups)
    for name in gen.kernel_names:
        assert gen.source.count(f"def {name}(") == 1


def test_on_cuda_a_shared_kernel_is_launched_per_site_and_warmed_once():
    m = _two_blocks()
    x = torch.randn(3, 5, 24)
    c = minicomp.compile(m).compile_for(x)
    gen = generate(c.graph, c.plan, SM90)
    shared = [k for k, users in gen.kernel_users.items() if len(users) > 1]
    assert shared
    assert f"_launch.by_site({', '.join(shared)})" in gen.source
    warm = gen.source[gen.source.index("_WARM = ["):gen.source.index("def call(")]
    entries = [line.strip() for line in warm.splitlines() if line.strip().startswith("(")]
    assert len(entries) == len(set(entries))          # the second layer's launches compile nothing new
    for name in shared:
        assert gen.source.count(f"_launch({name},") == len(gen.kernel_users[name])


def test_symbolic_modules_share_kernels_too():
    m = _two_blocks()
    f = minicomp.compile(m, dynamic=True)
    with torch.no_grad():
        for n in (5, 9):
            x = torch.randn(2, n, 24)
            torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    gen = f.compile_for(torch.randn(2, 7, 24)).generated
    assert any(len(users) > 1 for users in gen.kernel_users.values())


def test_a_kernel_launched_by_several_sites_keeps_a_fast_launcher_per_site():
    k = FakeKernel()
    launch = launcher.Launcher({}, current_device=lambda: 0)
    launch.by_site(k)
    x16, y16 = torch.zeros(8, 4), torch.zeros(8, 4)
    xb = torch.zeros(8, 4, dtype=torch.bfloat16)
    for _ in range(2):
        launch(k, grid, x16, y16, 8, BLOCK_C=4)     # site 1
        launch(k, grid, x16, y16, 6, BLOCK_C=4)     # site 2: another size
        launch(k, grid, x16, y16, 8, BLOCK_C=8)     # site 3: another constexpr
        launch(k, grid, xb, y16, 8, BLOCK_C=4)      # site 4: another dtype
    assert [e[0] for e in k.log] == ["triton"] * 4 + ["fast"] * 4
    # each site's fast launch is its own: sizes and constexprs as that site passed them
    fast = [e for e in k.log if e[0] == "fast"]
    assert [e[2][2] for e in fast] == [8, 6, 8, 8] and [e[2][-1] for e in fast] == [4, 4, 8, 4]


def test_without_by_site_a_static_kernel_keeps_one_fast_launcher():
    k = FakeKernel()
    launch = launcher.Launcher({}, current_device=lambda: 0)
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    launch(k, grid, x, y, 8, BLOCK_C=4)
    launch(k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "fast"]


def _two_widths(x, w1, w2, b1, b2):
    # over symbolic sizes one GEMM+GELU kernel source serves both (N is an argument): the
    # launcher must keep a fast launcher per site, or the second would run with the first's N
    return torch.nn.functional.gelu(x @ w1 + b1), torch.nn.functional.gelu(x @ w2 + b2)


def test_over_symbols_two_gemms_of_other_widths_share_one_kernel():
    x, w1, w2, b1, b2 = torch.randn(30, 64), torch.randn(64, 96), torch.randn(64, 48), torch.randn(96), torch.randn(48)
    f = minicomp.compile(_two_widths, dynamic=True)
    for a, b in zip(f(x, w1, w2, b1, b2), _two_widths(x, w1, w2, b1, b2)):
        torch.testing.assert_close(a, b, **tol(torch.float32))
    c = f.compile_for(x, w1, w2, b1, b2)
    gen = generate(c.graph, c.plan, SM90)
    assert list(gen.kernel_users.values()) == [[0, 1]]
    name = gen.kernel_names[0]
    assert f"_launch.by_site({name})" in gen.source and gen.source.count(f"_launch({name},") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_a_shared_kernel_at_two_sites_with_other_sizes_matches_eager(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 64, device="cuda", generator=g).to(dtype)
    w1, w2 = (torch.randn(64, n, device="cuda", generator=g).to(dtype) * 0.1 for n in (96, 48))
    b1, b2 = (torch.randn(n, device="cuda", generator=g).to(dtype) for n in (96, 48))
    f = minicomp.compile(_two_widths, dynamic=True)
    for _ in range(3):                              # the first call through Triton, then the fast path
        got = f(x, w1, w2, b1, b2)
        for a, b in zip(got, _two_widths(x, w1, w2, b1, b2)):
            torch.testing.assert_close(a, b, **tol(dtype))
    gen = f.compile_for(x, w1, w2, b1, b2).generated
    assert any(len(users) > 1 for users in gen.kernel_users.values()), gen.source[:3000]


@pytest.mark.gpu
def test_gpu_two_identical_layers_match_eager_on_every_call():
    m = _two_blocks(64).cuda().to(torch.bfloat16)
    f = minicomp.compile(m)
    with torch.no_grad():
        for n in (1, 2, 3):
            x = torch.randn(4, 33, 64, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(f(x), m(x), **tol(torch.bfloat16))

"""Autotuning over symbolic sizes: what a kernel is specialised on, how a sweep is pruned by
its buckets, tuning records on disk (minicomp/runtime/tuning.py, codegen/sizes.py `jit_line`).

On the CPU these check the generated text and the helpers; `test_new_lengths_compile_nothing`
(GPU) counts Triton's compiles across lengths of every divisibility class."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicomp
from conftest import tol
from minicomp.ir import dims
from minicomp.runtime import tuning


class Config:                      # what a sweep's prune sees of a triton.Config
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_fit_buckets_keeps_the_blocks_a_bucket_fits():
    prune = tuning.fit_buckets({"BLOCK_M": ("m_bucket", 32)})["early_config_prune"]
    table = [Config(BLOCK_M=256), Config(BLOCK_M=128), Config(BLOCK_M=64), Config(BLOCK_M=32)]
    assert [c.kwargs["BLOCK_M"] for c in prune(table, {"m_bucket": 128})] == [128, 64, 32]
    assert [c.kwargs["BLOCK_M"] for c in prune(table, {"m_bucket": 4096})] == [256, 128, 64, 32]
    # a bucket under the smallest cap keeps what the cap allows
    assert [c.kwargs["BLOCK_M"] for c in prune(table, {"m_bucket": 2})] == [32]
    # nothing fits: the smallest blocks, never an empty sweep (Triton refuses one)
    assert [c.kwargs["BLOCK_M"] for c in prune(table[:2], {"m_bucket": 2})] == [128]


def test_tune_options_follow_triton_and_the_switch():
    import inspect

    import triton
    takes = "cache_results" in inspect.signature(triton.autotune).parameters
    assert tuning.tune_options({}) == ({"cache_results": True} if takes else {})
    assert tuning.tune_options({tuning.TUNE_CACHE_ENV: "0"}) == {}


def test_jit_line_leaves_row_counts_and_buckets_unspecialised():
    from minicomp.codegen import sizes
    from minicomp.ir.graph import Graph

    g = Graph("g")
    s0, s1 = dims.sym("s0", hint=100), dims.sym("s1", hint=64)      # the module's own names (sizes.rename)
    x = g.add_input("x", (s0, s1), torch.float32)
    g.node(x).layout = (s1, 1)              # rows of s1: the row stride is s1 itself
    y = g.add_input("y", (2, s0, 64), torch.float32)
    g.node(y).layout = (64 * s0, 64, 1)     # 64*s0: a multiple of 16 whatever s0 is
    params = ["x_ptr", "y_ptr", "n_rows", "n_cols", "s0", "s1", "n_rows_bucket", "BLOCK: tl.constexpr"]
    line = sizes.jit_line(g, [x, y], params, free=("n_rows",))
    # s1 is a stride (vector loads need it aligned) and n_cols bounds the contiguous axis: both
    # stay specialised; s0 only scales a stride by 64, n_rows bounds rows, a bucket keys tuning
    assert line == "@triton.jit(do_not_specialize=['n_rows', 's0', 'n_rows_bucket'])"
    assert sizes.aligned_symbols(g, [x, y]) == {"s1"}
    static = Graph("h")
    z = static.add_input("z", (4, 8), torch.float32)
    assert sizes.jit_line(static, [z], ["z_ptr", "n_rows"], free=("n_rows",)) == "@triton.jit"


class Mlp(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return torch.softmax(self.down(F.gelu(self.up(x))) + x, dim=-1)


def test_symbolic_kernels_carry_the_decorators():
    """The kernels of a module over a symbolic length: each names what it does not specialise
    on, and each sweep is pruned by its buckets."""
    torch.manual_seed(0)
    m = Mlp().eval()
    f = minicomp.compile(m, dynamic=True)
    with torch.no_grad():
        for s in (7, 20):
            x = torch.randn(2, s, 32)
            torch.testing.assert_close(f(x), m(x), **tol(torch.float32))
    assert f.compiles == 1 and f.graph.symbolic
    jits = re.findall(r"@triton\.jit(.*)", f.source)
    assert jits and all("do_not_specialize" in j for j in jits), jits


@pytest.mark.gpu
def test_new_lengths_compile_nothing():
    """On CUDA: after the first call of a module over a symbolic length, lengths of other
    divisibility classes and buckets compile no kernel (they only time configs for a new bucket)."""
    import triton

    torch.manual_seed(0)
    m = Mlp(64).cuda().to(torch.bfloat16).eval()
    f = minicomp.compile(m, dynamic=True)
    compiles: list[str] = []
    hooks = triton.knobs.runtime

    def count(*args, **kwargs):
        compiles.append(str(kwargs.get("fn", args[0] if args else "?")))

    with torch.no_grad():
        x = torch.randn(2, 200, 64, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(f(x), m(x), **tol(torch.bfloat16))
        before, hooks.jit_post_compile_hook = hooks.jit_post_compile_hook, count
        try:
            for s in (333, 512, 777, 1500, 17):
                x = torch.randn(2, s, 64, device="cuda", dtype=torch.bfloat16)
                torch.testing.assert_close(f(x), m(x), **tol(torch.bfloat16))
        finally:
            hooks.jit_post_compile_hook = before
    assert f.compiles == 1
    assert compiles == [], compiles


def test_a_big_bucket_times_only_the_tables_first_configs():
    prune = tuning.fit_buckets({"BLOCK_M": ("m_bucket", 32)}, top=(3, {"m_bucket": 2048}))["early_config_prune"]
    table = [Config(BLOCK_M=m) for m in (128, 256, 128, 64, 32)]
    assert len(prune(table, {"m_bucket": 4096})) == 3
    assert len(prune(table, {"m_bucket": 1024})) == 5
    assert [c.kwargs["BLOCK_M"] for c in prune(table, {"m_bucket": 64})] == [64, 32]


def _gemm_configs(sizes: dict) -> list[int]:
    """How many configs each GEMM kernel of samples/mlp.mc at these sizes carries, generated
    for sm_90 on this machine (1 where its launch passes the config)."""
    from pathlib import Path

    from minicomp.api import plan_only
    from minicomp.codegen.module import generate
    from minicomp.frontend.dsl import load_dsl
    from minicomp.target import Target

    text = (Path(__file__).resolve().parent.parent / "samples" / "mlp.mc").read_text()
    graph, plan = plan_only(load_dsl(text.replace("f32", "bf16"), "mlp.mc", dims=sizes))
    gen = generate(graph, plan, Target.for_device("cpu", verify_target="off").for_check(90))
    counts = []
    for k in gen.kernels:
        if "_gemm_" in k.name:
            counts.append(k.source.count("triton.Config(") or 1)
    return counts


def test_a_launch_bound_gemm_tunes_two_configs_and_a_big_one_its_table():
    from minicomp.codegen import common

    # 64 tokens of a 256-wide MLP: a ledger bound far under LAUNCH_BOUND_US
    small = _gemm_configs({"B": 2, "S": 32, "C": 256, "H": 1024})
    assert small and all(n <= 2 for n in small), small
    # 2048 tokens of a 1024-wide one: ~17 us a GEMM, under the big-problem cut: the fitting table
    big = _gemm_configs({"B": 2, "S": 1024, "C": 1024, "H": 4096})
    assert big and all(n >= 3 for n in big), big
    assert common.LAUNCH_BOUND_US > 0

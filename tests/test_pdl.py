"""Programmatic dependent launch (codegen/pdl.py, `Target.pdl`, on sm_90 unless $MINICOMP_PDL=0): every launched
Triton kernel waits for the kernel before it as its first statement and launches with
`launch_pdl=True`; Triton compiles each such kernel for sm_90 (the GPU-true check, no GPU here);
the Gluon attention kernel and the CPU target are left without it; CUDA-graph mode keeps it."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from library_testing import generate_quietly

from minicomp.codegen import pdl
from minicomp.errors import MinicompError
from minicomp.target import Target

SM90 = Target("cuda", (9, 0), library_gemm=False, library_attention=False, eager_first=False)
CHECKED = replace(SM90, pdl=True, verify_arch=90, verify_depth="sampled")   # each kernel compiled for sm_90


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def block(x, w1, b1, w2, g):
    """A pre-norm MLP block with causal attention over its own projections: pointwise, row
    reductions, GEMMs with epilogues and an attention kernel in one module."""
    h = F.layer_norm(x, (x.shape[-1],), g)
    q = (h @ w1 + b1).view(2, 16, 4, 16).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(2, 16, 64)
    y = x + F.gelu(a @ w2)
    return torch.softmax(y.float(), -1).sum(-1)


INPUTS = [_randn(2, 16, 64), _randn(64, 64, seed=1) * 0.1, _randn(64, seed=2), _randn(64, 64, seed=3) * 0.1,
          _randn(64, seed=4)]


def _launched_defs(source: str, names: set[str]) -> dict[str, list[str]]:
    """Each launched function's body lines (up to the next blank line)."""
    lines, bodies = source.split("\n"), {}
    for i, line in enumerate(lines):
        m = re.match(r"def (\w+)\(", line)
        if m and m.group(1) in names:
            body = []
            for nxt in lines[i + 1:]:
                if not nxt.strip():
                    break
                body.append(nxt)
            bodies[m.group(1)] = body
    return bodies


def test_every_launched_kernel_waits_first_and_compiles_for_sm90():
    gen = generate_quietly(block, INPUTS, CHECKED).generated
    assert not gen.fallbacks, gen.fallbacks           # Triton took every kernel with the wait, for sm_90
    assert len(gen.kernel_names) >= 4
    bodies = _launched_defs(gen.source, set(gen.kernel_names))
    assert set(bodies) == set(gen.kernel_names)
    for name, body in bodies.items():
        first = next(line for line in body if not line.strip().startswith("#"))
        assert first.strip() == pdl.WAIT, (name, first)
    run = gen.source[gen.source.index("\ndef run("):]
    launch_lines = [line for line in run.split("\n") if "_launch(" in line or "_launch.checked(" in line]
    assert launch_lines and all("launch_pdl=True" in line for line in launch_lines)
    warm = gen.source[gen.source.index("_WARM = ["):gen.source.index("\n]", gen.source.index("_WARM = ["))]
    assert warm.count("'launch_pdl': True") == warm.count("(mc_")      # warm-up compiles what is launched


def test_without_the_switch_nothing_changes():
    on = generate_quietly(block, INPUTS, replace(SM90, pdl=True)).generated.source
    off = generate_quietly(block, INPUTS, SM90).generated.source
    assert "gdc_wait" not in off and "launch_pdl" not in off
    strip = [line for line in on.split("\n") if "gdc_wait" not in line]
    site = re.compile(r"#[0-9a-f]{16}'")      # a launch's fast-launcher key digests its literal arguments
    assert site.sub("'", "\n".join(strip).replace(", launch_pdl=True", "").replace(", 'launch_pdl': True", "")) \
        == site.sub("'", off)


def test_the_gluon_kernel_launches_without_pdl():
    """The tiered attention: the block-language kernel takes the wait and PDL; the Gluon kernel,
    bound with `gluon.jit(...)`, is left alone."""
    q, k, v = (_randn(2, 4, 128, 64, seed=i) for i in range(3))
    gen = generate_quietly(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v],
                           replace(SM90, pdl=True, hopper_attention="1")).generated
    run = gen.source[gen.source.index("\ndef run("):]
    hopper = [line for line in run.split("\n") if "_launch(mc_attn_hopper" in line]
    block_language = [line for line in run.split("\n") if "_launch(mc_attn_" in line and "hopper" not in line]
    assert hopper and block_language
    assert all("launch_pdl" not in line for line in hopper)
    assert all("launch_pdl=True" in line for line in block_language)


def test_the_target_takes_pdl_on_hopper_only():
    assert not Target.for_device("cpu", environ={"MINICOMP_PDL": "1"}).pdl
    assert not Target.for_device("cuda", environ={}).pdl       # no GPU here: no capability to take it on
    assert not Target.for_device("cpu", environ={}).pdl
    assert replace(SM90, pdl=True).for_check(90).pdl
    assert not replace(SM90, pdl=True).for_check(80).pdl      # an sm_80 check of an sm_90 module: no PDL there
    with pytest.raises(MinicompError, match="pdl needs a CUDA target of capability 9.0"):
        Target("cuda", (8, 0), pdl=True)
    with pytest.raises(MinicompError, match="pdl needs"):
        Target("cpu", pdl=True)


def test_cuda_graph_mode_keeps_pdl_on_hopper(monkeypatch):
    # a capture records a PDL launch as a programmatic edge (tests/test_cuda_graphs_gpu.py replays one)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert Target.for_device("cuda", environ={}, graphs=True).pdl
    assert Target.for_device("cuda", environ={}).pdl
    assert not Target.for_device("cuda", environ={"MINICOMP_PDL": "0"}, graphs=True).pdl
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert not Target.for_device("cuda", environ={}, graphs=True).pdl


def test_a_signature_over_several_lines_is_left_without_pdl():
    from minicomp.codegen.common import Grid, Kernel, Launch
    k = Kernel("mc_x", "@triton.jit\ndef mc_x(a,\n         b):\n    pass\n", [Launch(Grid((1,)), ())])
    assert pdl.dependent(k) is k

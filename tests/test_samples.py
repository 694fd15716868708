"""Every Python sample: loads as a model file, captures with no opaque node, verifies, and the
reference interpreter equals calling the model eagerly; `build()` works at other sizes/dtypes."""

import inspect
from pathlib import Path

import pytest
import torch
from conftest import TEST_DEVICE, tol

from minicomp.frontend.fx import call_inputs, capture, opaque_nodes
from minicomp.frontend.loader import import_file, load_model_file
from minicomp.ir.interpret import run
from minicomp.ir.verify import verify

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
NAMES = ["mlp", "rmsnorm", "softmax", "layernorm", "attention", "gpt_block", "llama_block"]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check(fn, inputs):
    g = capture(fn, inputs)
    verify(g)
    assert not opaque_nodes(g), g.dump()
    got = run(g, call_inputs(g, inputs))
    with torch.no_grad():
        want = _flat(fn(*inputs))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, **tol(b.dtype))
    return g


@pytest.mark.parametrize("name", NAMES)
def test_sample_matches_eager(name):
    fn, inputs = load_model_file(SAMPLES / f"{name}.py")
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in inputs)
    _check(fn, inputs)


@pytest.mark.parametrize("name", NAMES)
def test_sample_build_other_size_bf16(name):
    module = import_file(SAMPLES / f"{name}.py")
    sizes = {k: v for k, v in dict(batch=1, seq=7, width=48, heads=3, kv_heads=1, hidden=40, rows=5, cols=33,
                                   head_dim=24).items() if k in inspect.signature(module.build).parameters}
    fn, inputs = module.build(dtype=torch.bfloat16, device=TEST_DEVICE, **sizes)
    assert all(t.dtype == torch.bfloat16 and t.device.type == TEST_DEVICE for t in inputs)
    _check(fn, inputs)


@pytest.mark.parametrize("name", NAMES)
def test_sample_bench_sizes_fit_build(name):
    module = import_file(SAMPLES / f"{name}.py")
    inspect.signature(module.build).bind(device="cuda", dtype=torch.bfloat16, **module.BENCH_SIZES)


def test_blocks_keep_attention_whole():
    for name in ("gpt_block", "llama_block"):
        fn, inputs = load_model_file(SAMPLES / f"{name}.py")
        ops = [n.op for n in capture(fn, inputs).nodes()]
        assert ops.count("attention") == 1 and ops.count("matmul") >= 4, (name, ops)


def test_attention_sample_is_matmul_softmax_matmul():
    fn, inputs = load_model_file(SAMPLES / "attention.py")
    ops = [n.op for n in capture(fn, inputs).nodes()]
    assert ops.count("matmul") == 2 and "tril" in ops and "attention" not in ops

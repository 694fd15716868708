"""Helpers of the library tests (tests/test_library_gemm.py, tests/test_library_attention.py):
a CUDA module generated without a GPU, and its PyTorch lines run on CPU tensors."""

from __future__ import annotations

import warnings

from minicomp.api import compile_graph
from minicomp.frontend.fx import capture
from minicomp.target import Target


def generate_quietly(fn, inputs, target: Target):
    """`fn` captured and compiled for `target` without running it (no GPU needed); no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(fn, inputs)
        return compile_graph(g, inputs, device=target.device_type, load=False, target=target)


def run_on_cpu(generated, inputs):
    """Run a CUDA module that holds no Triton kernel on CPU tensors: its lines are PyTorch."""
    assert not generated.kernels, generated.kernel_names
    ns: dict = {"__name__": "minicomp_library_test"}
    exec(compile(generated.source, "<generated>", "exec"), ns)
    ns["DEVICE_TYPE"] = "cpu"
    ns["CONSTANTS"][:] = generated.constants
    ns["OPAQUE"][:] = generated.opaque
    return ns["call"](*inputs)

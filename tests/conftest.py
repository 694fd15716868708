"""Test setup: CPU runs go through Triton's interpreter; `gpu` tests skip without CUDA."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Read by Triton when kernels are defined: must be set before any generated module loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tolerances by dtype for comparing compiled results with eager PyTorch.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def tol(dtype: torch.dtype) -> dict:
    return TOLERANCES.get(dtype, dict(atol=0, rtol=0))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

"""minicomp: a small graph-to-Triton-kernel compiler.

    import minicomp

    @minicomp.compile
    def f(x, w): ...

    g = minicomp.compile_dsl("samples/rmsnorm.mc")   # or DSL text; compiled at the first call

See README.md and DESIGN.md; the stages live in `ir`, `frontend`, `passes`, `plan`, `codegen`, `runtime`.
"""

import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    # With no GPU, generated kernels run under Triton's CPU interpreter, which Triton only
    # honours if the variable is set before triton is first imported (torch.fx capture
    # imports it through torch._dynamo), so it is set here, at minicomp's import.
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from minicomp.api.dsl import DslFunction, compile_dsl  # noqa: E402
from minicomp.api.dynamic import mark_dynamic  # noqa: E402
from minicomp.entry import CompiledFunction, compile  # noqa: E402
from minicomp.errors import MinicompError


def backend(**options):
    """A torch.compile backend of one's own: `torch.compile(m, backend=minicomp.backend(**options))`;
    its `report()` lists what it compiled (see `minicomp.dynamo`)."""
    from minicomp.dynamo import Backend
    return Backend(**options)


def backend_report(compiled=None):
    """Graphs, kernels and the ops that ran through PyTorch of a `torch.compile(...,
    backend="minicomp")` result (see `minicomp.dynamo.backend_report`)."""
    from minicomp.dynamo import backend_report as report
    return report(compiled)


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait for the kernels compiling in the background (on Hopper the Gluon attention kernel
    compiles while a block-language one serves a module's first calls); True when none is left.
    Call it before timing a compiled function or capturing it in a CUDA graph."""
    from minicomp.runtime.launcher import wait_compiled as wait
    return wait(timeout)


__version__ = "0.1.0"
__all__ = ["compile", "compile_dsl", "CompiledFunction", "DslFunction", "MinicompError", "backend", "mark_dynamic",
           "backend_report", "wait_compiled"]

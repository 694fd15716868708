"""minicomp: a small graph-to-Triton-kernel compiler.

    import minicomp

    @minicomp.compile
    def f(x, w): ...

See README.md and DESIGN.md; the stages live in `ir`, `frontend`, `passes`, `codegen`, `runtime`.
"""

from minicomp.api import CompiledFunction, compile
from minicomp.errors import MinicompError

__version__ = "0.1.0"
__all__ = ["compile", "CompiledFunction", "MinicompError"]

"""Errors minicomp reports to its users.

Every error a user can cause derives from `MinicompError`. The CLI and the decorator
print such an error as one paragraph (no traceback) and the CLI exits 1. Anything else
that escapes is a bug in minicomp and keeps its traceback.

`UsageError` is a command line or API call that names something that does not exist or is
ambiguous (an unknown pass or machine, a bad `--dim`, an entry that cannot be chosen): the
CLI exits 2 for it, as for argparse's own usage errors.

`SourceError` carries a position in a source file and renders the classic compiler
diagnostic: `file:line:col: message`, then the line and a caret under the column.
"""

from __future__ import annotations


class MinicompError(Exception):
    """A problem with the user's program or inputs, reported without a traceback."""


class UsageError(MinicompError):
    """Bad usage: an option's value, or a choice (the entry function) the user must make."""


class SourceError(MinicompError):
    """An error at a position in a source file (DSL text or a Python model file)."""

    def __init__(self, message: str, file: str, line: int, col: int, source_line: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.source_line = source_line
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.file}:{self.line}:{self.col}: error: {self.message}"
        if self.source_line is None:
            return head
        text = self.source_line.rstrip("\n")
        caret = " " * max(self.col - 1, 0) + "^"
        return f"{head}\n    {text}\n    {caret}"


class VerifyError(MinicompError):
    """The IR broke one of its invariants; the message names the node and its origin."""


class CompileError(MinicompError):
    """A graph minicomp could not compile (and could not fall back for)."""


class GuardError(MinicompError):
    """A compiled function was called with arguments it cannot accept."""


class OutOfBoundsError(MinicompError):
    """An index tensor holds an index outside the dimension it indexes. A compiled call finds it
    before any kernel reads through that index and raises it as the kind eager raises for the op:
    `OutOfBoundsIndexError` (x[idx], embedding) or `OutOfBoundsRuntimeError` (gather,
    index_select)."""


class OutOfBoundsIndexError(OutOfBoundsError, IndexError):
    """A bad index where eager raises IndexError."""


class OutOfBoundsRuntimeError(OutOfBoundsError, RuntimeError):
    """A bad index where eager raises RuntimeError."""


class CaptureRefused(MinicompError):
    """Valid PyTorch that minicomp's own capture, one static graph, cannot take whole: a tensor's
    value read into Python (`.item()`, `.tolist()`, `.numpy()`), control flow decided by a value,
    an output shape decided by values, a construct make_fx cannot trace (an `autograd.Function`
    without `setup_context`). `minicomp.compile` then goes through Dynamo (minicomp/entry.py);
    a user's own error (a shape mismatch, a bad index) is never one of these."""


class ModeError(UsageError, ValueError):
    """An unknown `mode=` (minicomp.compile, the torch.compile backend): a ValueError too."""

"""A `SourceError` at a line of a Python file, from a frame of a traceback.

    frame_error(message, frame, shown) -> SourceError

The error shows the line as the file has it, indentation included, and its column is the
one Python reports for the failing expression, so the caret stands under it. (A
`FrameSummary`'s own `.line` has its indentation stripped while `.colno` counts from the
start of the real line: the two cannot be combined.) The line is read through `linecache`,
which is where the traceback module reads it too.
"""

from __future__ import annotations

import linecache
import traceback

from minicomp.errors import SourceError


def shown_line(text: str | None) -> str | None:
    """A source line for an error: no line break, and a tab shown as one space, since
    Python's columns count a tab as one character."""
    if text is None:
        return None
    text = text.rstrip("\r\n")
    return text.replace("\t", " ") if text.strip() else None


def frame_error(message: str, frame: traceback.FrameSummary, shown: str) -> SourceError:
    """`message` at `frame`'s line of the file that messages call `shown`."""
    lineno = frame.lineno or 0
    line = shown_line(linecache.getline(frame.filename, lineno)) if lineno else None
    colno = getattr(frame, "colno", None)     # Python 3.11+: a UTF-8 byte offset into the line
    if line is None:
        return SourceError(message, shown, lineno, (colno or 0) + 1)
    if colno is None:                          # no column known: the line's first character
        col = len(line) - len(line.lstrip()) + 1
    else:
        col = len(line.encode()[:colno].decode("utf-8", errors="ignore")) + 1
    return SourceError(message, shown, lineno, col, line)

"""A small source builder: lines, indentation blocks, and unique names.

Generated modules are written through this (never by concatenating strings), so the
indentation of nested blocks is always right and the text reads like hand-written code.
A line never holds a line break (`writeline` refuses one): user text reaches generated
source only through codegen/names.py, and this keeps a forgotten path from adding code.

    buf = CodeBuilder()
    buf.writeline("@triton.jit")
    with buf.block("def kernel(x_ptr, n, BLOCK: tl.constexpr):"):
        buf.writeline("pid = tl.program_id(0)")
    source = buf.getvalue()
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

# every character str.splitlines splits on: none may appear inside one line of generated source
_LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


class CodeBuilder:
    def __init__(self, indent: str = "    "):
        self._lines: list[str] = []
        self._level = 0
        self._indent = indent

    def writeline(self, line: str = "") -> None:
        if _LINE_BREAK.search(line):
            from minicomp.errors import CompileError
            raise CompileError(f"minicomp bug: a generated line holds a line break: {line[:80]!r}")
        self._lines.append(self._indent * self._level + line if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    def splice(self, text: str) -> None:
        """Insert a multi-line block at the current indentation (split on newlines only, so a
        stray line separator inside a line is refused by `writeline`)."""
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            self.writeline(line)

    @contextmanager
    def indent(self) -> Iterator[None]:
        self._level += 1
        try:
            yield
        finally:
            self._level -= 1

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        """`header` (ending in ':') then an indented body."""
        self.writeline(header)
        with self.indent():
            yield

    def getvalue(self) -> str:
        return "\n".join(self._lines) + "\n"


class NameScope:
    """Hands out unique identifiers: `fresh("acc")` -> acc, acc_1, acc_2 ..."""

    def __init__(self):
        self._used: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

"""A small source builder: lines, indentation blocks, and unique names.

Generated modules are written through this (never by concatenating strings), so the
indentation of nested blocks is always right and the text reads like hand-written code.

    buf = CodeBuilder()
    buf.writeline("@triton.jit")
    with buf.block("def kernel(x_ptr, n, BLOCK: tl.constexpr):"):
        buf.writeline("pid = tl.program_id(0)")
    source = buf.getvalue()
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class CodeBuilder:
    def __init__(self, indent: str = "    "):
        self._lines: list[str] = []
        self._level = 0
        self._indent = indent

    def writeline(self, line: str = "") -> None:
        self._lines.append(self._indent * self._level + line if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    def splice(self, text: str) -> None:
        """Insert a multi-line block at the current indentation."""
        for line in text.splitlines():
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

"""The DSL's syntax tree, and the source text it came from.

Every node carries the `Pos` (1-based line and column) of the token that best names it:
the operator of a binary expression, the callee's name of a call, the parameter's name...
so that semantic errors can point a caret at the right character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from minicomp.errors import SourceError
from minicomp.frontend.dsl_limits import printable


@dataclass(frozen=True)
class Pos:
    line: int
    col: int


@dataclass
class Num:
    value: int | float
    pos: Pos


@dataclass
class Str:
    value: str
    pos: Pos


@dataclass
class Bool:
    value: bool
    pos: Pos


@dataclass
class Name:
    name: str
    pos: Pos


@dataclass
class ListExpr:
    items: list["Expr"]
    pos: Pos


@dataclass
class Neg:
    operand: "Expr"
    pos: Pos


@dataclass
class BinOp:
    op: str            # the source spelling: "+", "@", "<=", ...
    lhs: "Expr"
    rhs: "Expr"
    pos: Pos           # the operator's position


@dataclass
class Keyword:
    name: str
    value: "Expr"
    pos: Pos


@dataclass
class Call:
    func: str
    args: list["Expr"]
    kwargs: list[Keyword]
    pos: Pos


Expr = Union[Num, Str, Bool, Name, ListExpr, Neg, BinOp, Call]


@dataclass
class Dim:
    value: int | str   # an int literal or a symbol
    pos: Pos


@dataclass
class TypeSpec:
    dtype: str
    dims: list[Dim]
    pos: Pos           # the dtype name's position

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d.value) for d in self.dims)}]"


@dataclass
class Param:
    name: str
    type: TypeSpec
    pos: Pos


@dataclass
class Assign:
    targets: list[Name]
    value: Expr
    pos: Pos


@dataclass
class Return:
    values: list[Expr]
    pos: Pos


Stmt = Union[Assign, Return]


@dataclass
class FuncDef:
    name: str
    params: list[Param]
    returns: list[TypeSpec] | None   # None: no `->` annotation
    body: list[Stmt]
    pos: Pos                         # the function name's position


@dataclass
class Module:
    source: "Source"
    funcs: dict[str, FuncDef] = field(default_factory=dict)   # in file order


# ------------------------------------------------------------------ source and errors


@dataclass
class Source:
    """The text of one DSL file, for positions in error messages.

    Lines are split at '\\n' only, as lark counts them (a '\\r' before it is dropped):
    `str.splitlines` also splits at '\\x0c', '\\x85', '\\u2028'..., which would echo
    the wrong line under an error. Echoed lines and messages are made printable first.
    """

    text: str
    filename: str

    def line(self, n: int) -> str | None:
        lines = self.text.split("\n")
        return lines[n - 1].removesuffix("\r") if 1 <= n <= len(lines) else None

    def origin(self, pos: Pos) -> str:
        return f"{self.filename}:{pos.line}:{pos.col}"

    def error(self, message: str, pos: Pos) -> SourceError:
        line = self.line(pos.line)
        # a tab counts as one column: show it as one space so the caret stays under the culprit
        shown = printable(line).replace("\t", " ") if line is not None else None
        return SourceError(printable(message, escape=True), self.filename, pos.line, pos.col, shown)

    def end(self) -> Pos:
        """The position just after the last character (where "unexpected end of file" points)."""
        lines = self.text.split("\n")
        if len(lines) > 1 and lines[-1] == "":  # a final newline ends the last line, it opens none
            lines.pop()
        return Pos(len(lines), len(lines[-1].removesuffix("\r")) + 1)

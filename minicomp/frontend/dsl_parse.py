"""DSL text -> AST (`dsl_ast`): the lark parser, the tree-to-AST transformer, and syntax errors.

The grammar lives in `minicomp.lark`; the parser is built once per process.

Invariants:
- parsing never raises anything but `SourceError` (lark's exceptions are translated, with
  the expected tokens in plain words, and a hint for the usual mistakes: `**`, methods,
  `if`/`for`, `def`);
- nothing here recurses over the tree: lark's LALR parser keeps an explicit stack and the
  tree becomes an AST through `Transformer_NonRecursive`, so any depth of nesting parses
  (the lowering bounds it; see `dsl_limits.MAX_NESTING`);
- integer literals and dims are 64-bit; a float literal that overflows to inf is refused;
- a `Module` has unique function names (a duplicate is a SourceError at the second one).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Iterator

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from minicomp.errors import SourceError
from minicomp.frontend import dsl_hints as hints
from minicomp.frontend.dsl_limits import INT64_MAX, shown_int
from minicomp.frontend.dsl_ast import (BinOp, Bool, Call, Dim, Expr, FuncDef, Keyword, ListExpr, Module, Name, Neg,
                                       Num, Param, Pos, Return, Assign, Source, Stmt, Str, TypeSpec)

# ------------------------------------------------------------------ parser


class NewlineFilter:
    """Post-lexer: drops newlines inside ( ) and [ ], where a statement cannot end."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0  # local to this parse: the parser object is shared
        for tok in stream:
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB"):
                depth = max(depth - 1, 0)
            elif tok.type == "_NL" and depth:
                continue
            yield tok


@functools.lru_cache(maxsize=None)
def parser() -> Lark:
    return Lark.open("minicomp.lark", rel_to=__file__, parser="lalr", propagate_positions=True,
                     maybe_placeholders=True, postlex=NewlineFilter())


def _pos(tok: Token) -> Pos:
    return Pos(tok.line, tok.column)


class _Error(Exception):
    """Raised inside the transformer (lark wraps it in VisitError; `parse` unwraps it)."""

    def __init__(self, message: str, pos: Pos):
        super().__init__(message)
        self.message, self.pos = message, pos


@v_args(inline=True)
class ToAst(Transformer_NonRecursive):
    """One method per grammar rule or alias; each returns an AST node."""

    # -- literals and names
    def number(self, tok: Token) -> Num:
        text = str(tok)
        if any(c in text for c in ".eE"):
            value = float(text)
            if math.isinf(value):
                raise _Error(f"the number {text[:24]} is too large for a float (the largest is about 1.8e308; "
                             "write inf for infinity)", _pos(tok))
            return Num(value, _pos(tok))
        value = int(text)
        if value > INT64_MAX:
            raise _Error(f"the integer {shown_int(value)} does not fit in 64 bits (the largest is {INT64_MAX}); "
                         "write it as a float (1e30) if a float is meant", _pos(tok))
        return Num(value, _pos(tok))

    def string(self, tok: Token) -> Str:
        return Str(str(tok)[1:-1], _pos(tok))

    def true(self, tok: Token) -> Bool:
        return Bool(True, _pos(tok))

    def false(self, tok: Token) -> Bool:
        return Bool(False, _pos(tok))

    def name(self, tok: Token) -> Name:
        return Name(str(tok), _pos(tok))

    def list(self, lsqb: Token, *items) -> ListExpr:
        return ListExpr([i for i in items if i is not None], _pos(lsqb))

    # -- operators and calls
    def neg(self, minus: Token, operand) -> Neg:
        return Neg(operand, _pos(minus))

    def binop(self, lhs, op: Token, rhs) -> BinOp:
        return BinOp(str(op), lhs, rhs, _pos(op))

    def kwarg(self, name: Token, value) -> Keyword:
        return Keyword(str(name), value, _pos(name))

    def args(self, *items) -> list:
        return [i for i in items if i is not None]

    def call(self, name: Token, args) -> Call:
        args = args or []
        positional = [a for a in args if not isinstance(a, Keyword)]
        kwargs = [a for a in args if isinstance(a, Keyword)]
        seen: set[str] = set()
        for i, a in enumerate(args):
            if isinstance(a, Keyword):
                if a.name in seen:
                    raise _Error(f"keyword argument '{a.name}' given twice", a.pos)
                seen.add(a.name)
            elif seen:
                raise _Error("positional argument after a keyword argument", _expr_pos(a))
        return Call(str(name), positional, kwargs, _pos(name))

    # -- types
    def dim_int(self, tok: Token) -> Dim:
        text = str(tok)
        if not text.isdigit():
            raise _Error(f"a dimension must be an integer or a symbol, not {text[:24]}", _pos(tok))
        if int(text) > INT64_MAX:
            raise _Error(f"the dimension {shown_int(int(text))} does not fit in 64 bits (the largest is "
                         f"{INT64_MAX})", _pos(tok))
        return Dim(int(text), _pos(tok))

    def dim_sym(self, tok: Token) -> Dim:
        return Dim(str(tok), _pos(tok))

    def type(self, dtype: Token, *dims) -> TypeSpec:
        return TypeSpec(str(dtype), [d for d in dims if d is not None], _pos(dtype))

    def ret_types(self, *types) -> list[TypeSpec]:
        return list(types)

    def param(self, name: Token, type_: TypeSpec) -> Param:
        return Param(str(name), type_, _pos(name))

    def params(self, *params) -> list[Param]:
        out = [p for p in params if p is not None]
        seen: set[str] = set()
        for p in out:
            if p.name in seen:
                raise _Error(f"parameter '{p.name}' declared twice", p.pos)
            seen.add(p.name)
        return out

    # -- statements and functions
    def assign(self, *children) -> Assign:
        *targets, value = children
        names = [Name(str(t), _pos(t)) for t in targets]
        return Assign(names, value, names[0].pos)

    def return_(self, tok: Token, *values) -> Return:
        return Return(list(values), _pos(tok))

    def block(self, *stmts) -> list:
        out = [s for s in stmts if s is not None]
        for i, s in enumerate(out[:-1]):
            if isinstance(s, Return):
                raise _Error("statement after 'return' is never run", _stmt_pos(out[i + 1]))
        return out

    def func(self, _kw: Token, name: Token, params, _arrow, returns, body) -> FuncDef:
        return FuncDef(str(name), params or [], returns, body, _pos(name))

    def start(self, *items) -> list[FuncDef]:
        return [f for f in items if isinstance(f, FuncDef)]


def _expr_pos(e: Expr) -> Pos:
    return e.pos


def _stmt_pos(s: Stmt) -> Pos:
    return s.pos


# ------------------------------------------------------------------ syntax errors in plain words

# Terminal name -> how an error message says it.
_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "COMPARE": "a comparison",
    "_NL": "end of line", "$END": "end of file", "FUNC": "'func'", "RETURN": "'return'",
    "TRUE": "'true'", "FALSE": "'false'", "ARROW": "'->'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "SLASH2": "'//'", "AT": "'@'", "LSQB": "'['", "RSQB": "']'", "LPAR": "'('",
    "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='",
}
# Sets of terminals that read better as one word.
_EXPR_START = {"NAME", "NUMBER", "STRING", "TRUE", "FALSE", "LSQB", "LPAR", "MINUS"}
_OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "SLASH2", "AT", "COMPARE"}


def _expected_words(expected: set[str]) -> str:
    expected = set(expected)
    words: list[str] = []
    if {"NAME", "NUMBER", "LPAR"} <= expected:
        expected -= _EXPR_START
        words.append("an expression")
    if len(expected & _OPERATORS) >= 3:
        expected -= _OPERATORS
        words.append("an operator")
    words += sorted(_WORDS.get(t, t) for t in expected)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


def _found_words(tok: Token) -> str:
    if tok.type in ("$END", "_NL"):
        return _WORDS[tok.type]
    if tok.type == "NAME":
        return f"name '{tok}'"
    if tok.type in ("NUMBER", "STRING"):
        return f"{tok.type.lower()} {tok}"
    return f"'{tok}'"


def _syntax_error(src: Source, e: UnexpectedInput) -> SourceError:
    if isinstance(e, UnexpectedCharacters):
        char = src.text[e.pos_in_stream] if e.pos_in_stream < len(src.text) else ""
        pos = Pos(e.line, e.column)
        # the lexer's allowed set is every token of the state, too broad to help: name the character
        return src.error(f"unexpected character {char!r}{_char_hint(src, e.pos_in_stream, char)}", pos)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        # `accepts` (what the parser would really take here) is exact; `expected` is LALR's
        # merged lookahead set, which can list tokens that would fail one step later.
        expected = getattr(e, "accepts", None) or e.expected
        pos = src.end() if tok.type == "$END" else Pos(tok.line, tok.column)
        if tok.type == "_NL" and tok.line is not None:
            # point at the end of the line the statement broke on, not the next one
            code = (src.line(tok.line) or "").split("#")[0]
            pos = Pos(tok.line, len(code.rstrip()) + 1)
        before = src.text[:tok.start_pos].rstrip(" \t") if tok.start_pos is not None else ""
        if tok.type == "STAR" and before.endswith("*"):
            # `x ** 2` lexes as two `*`: say what to write instead
            first_star = _pos_at(src.text, len(before) - 1)
            return src.error("there is no '**' operator: write pow(x, 2) (or x * x)", first_star)
        message = f"unexpected {_found_words(tok)}: expected {_expected_words(expected)}"
        return src.error(message + _statement_hint(src, pos.line), pos)
    return src.error(f"syntax error: {e}", Pos(getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1))


def _pos_at(text: str, offset: int) -> Pos:
    """The line and column (1-based, as lark counts them: lines end at '\\n') of a text offset."""
    return Pos(text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1)


# A character the grammar has no use for -> what the user probably meant.
_CHAR_HINTS = {
    "%": "there is no '%' operator: write remainder(a, b) (Python's %) or fmod(a, b) (C's)",
    "&": "write logical_and(a, b) (bitwise_and(a, b) for integers)",
    "|": "write logical_or(a, b) (bitwise_or(a, b) for integers)", "!": "write logical_not(x) (or a != b)",
    "~": "write logical_not(x) (bitwise_not(x) for integers)",
    "^": "there is no '^' operator; for a power write pow(x, 2), for exclusive or ne(a, b) or bitwise_xor(a, b)",
    ";": "statements end at the end of a line, without ';'",
    "\ufeff": "a byte-order mark may only open the file",
}
# A line that starts with one of these is Python (or another language), not the DSL.
_STATEMENT_HINTS = {
    "if": "there is no if: programs are straight-line code; choose values with where(cond, a, b)",
    "elif": "there is no if: choose values with where(cond, a, b)",
    "else": "there is no if: choose values with where(cond, a, b)",
    "for": "there are no loops: programs are straight-line code over whole tensors",
    "while": "there are no loops: programs are straight-line code over whole tensors",
    "def": "functions start with 'func': func name(x: f32[N]) -> f32[N] { ... }",
    "import": "there are no imports: every function of the file and every builtin is in scope",
    "let": "assign with 'name = expr'", "var": "assign with 'name = expr'", "const": "assign with 'name = expr'",
}


def _char_hint(src: Source, at: int, char: str) -> str:
    if char == "." and at > 0 and (src.text[at - 1].isalnum() or src.text[at - 1] in "_)]"):
        word = re.search(r"[A-Za-z_]\w*$", src.text[max(0, at - 64):at])
        after = re.match(r"\.([A-Za-z_]\w*)", src.text[at:])
        return hints.before_dot(word.group(0) if word else "", after.group(1) if after else "")
    hint = _CHAR_HINTS.get(char)
    return f": {hint}" if hint else ""


def _statement_hint(src: Source, line: int) -> str:
    words = re.match(r"\s*([A-Za-z_]\w*)", src.line(line) or "")
    hint = _STATEMENT_HINTS.get(words.group(1)) if words else None
    return f" ({hint})" if hint else ""


def parse_module(source: str, filename: str) -> Module:
    """Parse DSL text; raises SourceError on a syntax error or a duplicate definition."""
    src = Source(source, filename)
    try:
        tree = parser().parse(source)
        funcs = ToAst().transform(tree)
    except UnexpectedInput as e:
        raise _syntax_error(src, e) from None
    except VisitError as e:
        if isinstance(e.orig_exc, _Error):
            raise src.error(e.orig_exc.message, e.orig_exc.pos) from None
        raise
    module = Module(src)
    for f in funcs:
        if f.name in module.funcs:
            first = module.funcs[f.name].pos
            raise src.error(f"function '{f.name}' is already defined at line {first.line}", f.pos)
        module.funcs[f.name] = f
    return module

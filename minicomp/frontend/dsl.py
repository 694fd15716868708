"""The DSL frontend: `.mc` text -> Graph.

    load_dsl(source, filename, entry=None, dims=None, example_inputs=None) -> Graph
    list_functions(source, filename) -> list[str]

Stages and files: `dsl_parse` turns text (grammar: `minicomp.lark`) into the AST of
`dsl_ast`; `dsl_symbols.bind_symbols` gives every symbolic dim of the entry function a value
(from `dims`, i.e. `--dim M=4`, and/or the example inputs' shapes); `Lowerer` below walks the
entry function's body and builds the graph, inlining calls to other functions of the file
(each binds its own symbols from its arguments) and mapping builtins through `dsl_builtins`
(with `dsl_nn` and `dsl_views`).

Name lookup, innermost first: variables and parameters, the function's symbols (ints),
dtype names (`cast(x, bf16)`), then `inf`, `nan`, `pi`. Calls: the file's functions shadow
builtins. Values are graph tensors (`TensorVal`) or compile-time Python values; arithmetic
on numbers alone is folded (`1.0 / sqrt(D)` is a number, not a node).

Invariants:
- every node's `origin` is `file:line:col` of the expression that made it (for a binary
  expression, its operator);
- shapes in the graph are concrete: symbols are bound before any node is built;
- every problem the user can cause raises `SourceError` pointing at the culprit, and the
  graph returned has passed `verify`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from minicomp.errors import MinicompError, SourceError
from minicomp.frontend import dsl_hints as hints
from minicomp.frontend.dsl_ast import (BinOp, Bool, Call, Expr, FuncDef, ListExpr, Module, Name, Neg, Num, Pos,
                                       Return, Source, Str)
from minicomp.frontend.dsl_builtins import (BUILTINS, REQUIRED, CallError, Emit, TensorVal, Value, bind_args,
                                            call_builtin, describe, pointwise)
from minicomp.frontend.dsl_entry import pick_entry
from minicomp.frontend.dsl_limits import MAX_NESTING, fits_dtype, fits_int64, read_program, size_error  # noqa: F401
from minicomp.frontend.dsl_parse import parse_module
from minicomp.frontend.dsl_symbols import Bound, Mismatch, bind_symbols, check_dtypes, shown, unify
from minicomp.ir.dtypes import dtype_name, parse_dtype
from minicomp.ir import dims
from minicomp.ir.graph import Graph
from minicomp.ir.verify import verify

# Infix operators -> registry ops (`@` goes through the matmul builtin for its dtype check).
BINARY_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div",
              "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
# Names that mean a number wherever no variable shadows them.
CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi}
_NESTED_TOO_DEEP = (f"expressions nest deeper than {MAX_NESTING} levels here (each call, list and parenthesised "
                    "operand is a level, counted on through the functions being inlined); split the expression "
                    "with assignments")


def list_functions(source: str, filename: str) -> list[str]:
    """Names of the functions in a DSL file, in file order."""
    return list(parse_module(source, filename).funcs)


def load_dsl(source: str, filename: str, entry: str | None = None, dims: dict[str, int] | None = None,
             example_inputs: Sequence[torch.Tensor] | None = None, symbolic: bool = False) -> Graph:
    """Parse DSL text and lower function `entry` to a Graph (default: `main`, else the only
    function no other one calls; see `dsl_entry`). With `symbolic`, the symbols `dims` and the
    example inputs leave unbound stay symbolic in the graph's shapes."""
    module = parse_module(source, filename)
    src = module.source
    if not module.funcs:
        raise src.error("this file defines no function (expected 'func name(...) { ... }')", Pos(1, 1))
    entry = pick_entry(module, filename, entry)
    check_dtypes(src, module.funcs.values())
    f = module.funcs[entry]
    symbols = bind_symbols(src, f, dict(dims or {}), example_inputs, symbolic)
    lowerer = Lowerer(module)
    try:
        graph = lowerer.lower_entry(f, symbols)
    except RecursionError:
        # a backstop: MAX_NESTING keeps the lowering ~500 frames deep, which only a caller that
        # is itself near Python's recursion limit can push over it
        raise MinicompError(f"{filename}: the program nests too deeply to lower here (Python's recursion "
                            f"limit); split deep expressions with assignments") from None
    verify(graph)
    return graph


@dataclass
class Frame:
    """One function being inlined: its variables and its bound symbols."""

    func: FuncDef
    symbols: dict[str, Bound]
    vars: dict[str, Value] = field(default_factory=dict)


class Lowerer:
    def __init__(self, module: Module):
        self.module = module
        self.src: Source = module.source
        self.g: Graph | None = None
        self.stack: list[str] = []  # functions being inlined, to refuse recursion
        self.depth = 0              # levels of expression nesting and inlining now being evaluated

    # ------------------------------------------------------------------ functions

    def lower_entry(self, f: FuncDef, symbols: dict[str, Bound]) -> Graph:
        self.g = Graph(f.name)
        frame = Frame(f, symbols)
        for p in f.params:
            shape = [d.value if isinstance(d.value, int) else symbols[d.value].value for d in p.type.dims]
            too_big = size_error(tuple(shape), parse_dtype(p.type.dtype))
            if too_big:
                raise self.src.error(f"parameter '{p.name}': {too_big}", p.type.pos)
            nid = self.g.add_input(p.name, shape, parse_dtype(p.type.dtype), origin=self.src.origin(p.pos))
            frame.vars[p.name] = TensorVal(nid)
        results = self.run_body(frame)
        self.g.set_outputs([r.nid for r in results])
        return self.g

    def run_body(self, frame: Frame) -> list[TensorVal]:
        """Run a function's statements; returns its checked return values."""
        self.stack.append(frame.func.name)
        try:
            for stmt in frame.func.body:
                if isinstance(stmt, Return):
                    values = [self.eval_single(v, frame) for v in stmt.values]
                    return self.check_returns(frame, stmt, values)
                self.assign(stmt.targets, stmt.value, frame)
        finally:
            self.stack.pop()
        raise self.src.error(f"function '{frame.func.name}' ends without 'return'", frame.func.pos)

    def assign(self, targets: list[Name], expr: Expr, frame: Frame) -> None:
        value = self.eval(expr, frame)
        if len(targets) == 1:
            if isinstance(value, tuple):
                raise self.src.error(f"this returns {len(value)} values; assign them to {len(value)} names",
                                     expr.pos)
            frame.vars[targets[0].name] = value
            return
        values = value if isinstance(value, tuple) else (value,)
        if len(values) != len(targets):
            raise self.src.error(f"cannot assign {len(values)} value(s) to {len(targets)} names", targets[0].pos)
        for t, v in zip(targets, values):
            frame.vars[t.name] = v

    def check_returns(self, frame: Frame, stmt: Return, values: list[Value]) -> list[TensorVal]:
        f = frame.func
        if f.returns is not None and len(f.returns) != len(values):
            raise self.src.error(f"'{f.name}' declares {len(f.returns)} return value(s) but returns "
                                 f"{len(values)}", stmt.pos)
        out = []
        for i, (expr, v) in enumerate(zip(stmt.values, values)):
            spec = f.returns[i] if f.returns is not None else None
            dtype = parse_dtype(spec.dtype) if spec else None
            nid = self.to_tensor(v, expr.pos, dtype, what="a function returns")
            if spec is not None:
                n = self.g.node(nid)
                declared = shown(spec, frame.symbols)
                declared = str(spec) if declared == str(spec) else f"{spec} = {declared}"
                try:
                    unify(spec, n.shape, n.dtype, frame.symbols, f"return value {i + 1}")
                except Mismatch as m:
                    detail = "" if m.conflict else m.detail
                    raise self.src.error(f"'{f.name}' returns {n.type}, but its declared return type is "
                                         f"{declared}{detail}", expr.pos) from None
            out.append(TensorVal(nid))
        return out

    def to_tensor(self, v: Value, pos: Pos, dtype: torch.dtype | None, what: str) -> int:
        if isinstance(v, TensorVal):
            return v.nid
        if isinstance(v, (bool, int, float)):
            if dtype is not None and not fits_dtype(v, dtype):
                raise self.src.error(f"{describe(v, self.g)} does not fit in {dtype_name(dtype)}", pos)
            return self.g.constant(v, dtype=dtype, origin=self.src.origin(pos))
        raise self.src.error(f"{what} tensors or numbers, not {describe(v, self.g)}", pos)

    def call_function(self, f: FuncDef, call: Call, frame: Frame) -> Value:
        """Inline a call to another function of the file."""
        if f.name in self.stack:
            raise self.src.error(f"'{f.name}' calls itself (functions are inlined, so recursion is not "
                                 "supported)", call.pos)
        names = [p.name for p in f.params]
        args, kwargs, arg_pos = self.eval_args(call, frame, names)
        bound = self.guard(call.pos, arg_pos, None,
                           lambda: bind_args(f.name, names, [REQUIRED] * len(names), args, kwargs))
        callee = Frame(f, {})
        for p in f.params:
            pos = arg_pos.get(p.name, call.pos)
            nid = self.to_tensor(bound[p.name], pos, parse_dtype(p.type.dtype), what=f"'{f.name}' takes")
            n = self.g.node(nid)
            try:
                unify(p.type, n.shape, n.dtype, callee.symbols, f"argument '{p.name}'")
            except Mismatch as m:
                detail = f": {m.detail}" if m.conflict else m.detail
                raise self.src.error(f"argument '{p.name}' of '{f.name}' must be {p.type}, got {n.type}{detail}",
                                     pos) from None
            callee.vars[p.name] = TensorVal(nid)
        try:
            results = self.run_body(callee)
        except SourceError as err:
            if "(in '" in err.message:  # already says where it was called from
                raise
            raise SourceError(f"{err.message} (in '{f.name}', called at line {call.pos.line})",
                              err.file, err.line, err.col, err.source_line) from None
        return results[0] if len(results) == 1 else tuple(results)

    # ------------------------------------------------------------------ expressions

    def eval_single(self, expr: Expr, frame: Frame) -> Value:
        v = self.eval(expr, frame)
        if isinstance(v, tuple):
            raise self.src.error(f"this returns {len(v)} values; assign them first (a, b = ...)", expr.pos)
        return v

    def eval(self, expr: Expr, frame: Frame) -> Value:
        if isinstance(expr, (Num, Str, Bool)):
            return expr.value
        if isinstance(expr, Name):
            return self.lookup(expr, frame)
        self.depth += 1  # one level of Python recursion per level of nesting: bounded here
        try:
            if self.depth > MAX_NESTING:
                raise self.src.error(self.nesting_message(), expr.pos)
            if isinstance(expr, ListExpr):
                return [self.eval_single(i, frame) for i in expr.items]
            if isinstance(expr, Neg):
                return self.negate(expr, frame)
            if isinstance(expr, BinOp):
                return self.binop_chain(expr, frame)
            if isinstance(expr, Call):
                return self.call(expr, frame)
        finally:
            self.depth -= 1
        raise AssertionError(f"unknown expression {expr!r}")

    def nesting_message(self) -> str:
        if len(self.stack) < 2:
            return _NESTED_TOO_DEEP
        chain = self.stack if len(self.stack) <= 6 else self.stack[:3] + ["..."] + self.stack[-2:]
        return (f"expressions nest deeper than {MAX_NESTING} levels here, counted on through the "
                f"{len(self.stack)} functions being inlined into each other ({' -> '.join(chain)}); "
                "call fewer functions inside each other, or split expressions with assignments")

    def negate(self, expr: Neg, frame: Frame) -> Value:
        """A run of unary minus (`---x`), walked in a loop: a run of any length is one level."""
        run = [expr]
        while isinstance(run[-1].operand, Neg):
            run.append(run[-1].operand)
        v = self.eval_single(run[-1].operand, frame)
        for neg in reversed(run):
            v = self.guard(neg.pos, {"#0": neg.operand.pos}, lambda: f"cannot negate {describe(v, self.g)}",
                           lambda: pointwise(self.emit(neg.pos), "neg", [v]))
        return v

    def lookup(self, name: Name, frame: Frame) -> Value:
        if name.name in frame.vars:
            return frame.vars[name.name]
        if name.name in frame.symbols:
            return frame.symbols[name.name].value
        dtype = parse_dtype(name.name)
        if dtype is not None:
            return dtype
        if name.name in CONSTANTS:
            return CONSTANTS[name.name]
        known = list(frame.vars) + list(frame.symbols) + list(CONSTANTS)
        raise self.src.error(f"unknown name '{name.name}'{hints.unknown_name(name.name, known)}", name.pos)

    def binop_chain(self, expr: BinOp, frame: Frame) -> Value:
        """`a + b - c * d ...`: the left operands form a spine (`((a + b) - c) ...`), walked in a
        loop, so a chain of any length is one level of nesting; right operands nest as written."""
        spine = [expr]
        while isinstance(spine[-1].lhs, BinOp):
            spine.append(spine[-1].lhs)
        lhs = self.eval_single(spine[-1].lhs, frame)
        for b in reversed(spine):
            lhs = self.binop(b, lhs, self.eval_single(b.rhs, frame))
        return lhs

    def binop(self, expr: BinOp, lhs: Value, rhs: Value) -> Value:
        arg_pos = {"#0": expr.lhs.pos, "#1": expr.rhs.pos, "a": expr.lhs.pos, "b": expr.rhs.pos}
        e = self.emit(expr.pos)
        what = lambda: f"cannot apply '{expr.op}' to {describe(lhs, self.g)} and {describe(rhs, self.g)}"
        if _is_size(lhs) and _is_size(rhs) and (dims.is_symbolic(lhs) or dims.is_symbolic(rhs)):
            return self.size_arith(expr, lhs, rhs)
        if expr.op == "//":
            if not (_is_int(lhs) and _is_int(rhs)):
                raise self.src.error(f"'//' divides integers known at compile time (dims), not "
                                     f"{describe(lhs, self.g)} and {describe(rhs, self.g)}", expr.pos)
            if rhs == 0:
                raise self.src.error("integer division by zero", expr.pos)
            if not fits_int64(lhs // rhs):
                raise self.src.error(f"integer overflow: {lhs} // {rhs} does not fit in 64 bits", expr.pos)
            return lhs // rhs
        if expr.op == "@":
            return self.guard(expr.pos, arg_pos, what, lambda: call_builtin(e, BUILTINS["matmul"], [lhs, rhs], []))
        return self.guard(expr.pos, arg_pos, what, lambda: pointwise(e, BINARY_OPS[expr.op], [lhs, rhs]))

    def size_arith(self, expr: BinOp, lhs: "dims.Dim", rhs: "dims.Dim") -> "dims.Dim":
        """Arithmetic of sizes when one is symbolic: +, -, * always; // only where it is exact
        for every value of the symbols (`(N * D) // D`)."""
        if expr.op in ("+", "-", "*"):
            return {"+": lhs + rhs, "-": lhs - rhs, "*": lhs * rhs}[expr.op]
        if expr.op == "//":
            q = dims.exact_div(lhs, rhs)
            if q is not None:
                return q
            raise self.src.error(f"{lhs} // {rhs} is not exact for every value of the symbols: bind them with "
                                 f"--dim ({', '.join(s.name for s in dims.symbols(lhs, rhs))})", expr.pos)
        raise self.src.error(f"'{expr.op}' of the symbolic sizes {lhs} and {rhs}: only +, -, * and an exact // "
                             "work on symbols; bind them with --dim", expr.pos)

    def call(self, call: Call, frame: Frame) -> Value:
        if call.func in self.module.funcs:  # the file's own functions shadow builtins
            return self.call_function(self.module.funcs[call.func], call, frame)
        b = BUILTINS.get(call.func)
        if b is None:
            known = list(self.module.funcs) + list(BUILTINS)
            raise self.src.error(f"unknown function '{call.func}'{hints.unknown_function(call.func, known)}",
                                 call.pos)
        args, kwargs, arg_pos = self.eval_args(call, frame, [p.name for p in b.params])
        shown_args = lambda: ", ".join([describe(a, self.g) for a in args] +
                                       [f"{k}={describe(v, self.g)}" for k, v in kwargs])
        return self.guard(call.pos, arg_pos, lambda: f"{call.func}({shown_args()})",
                          lambda: call_builtin(self.emit(call.pos), b, args, kwargs))

    def eval_args(self, call: Call, frame: Frame,
                  names: list[str]) -> tuple[list[Value], list[tuple[str, Value]], dict[str, Pos]]:
        """Evaluated arguments and where each one is: by position (`#i`), by parameter name."""
        args = [self.eval_single(a, frame) for a in call.args]
        kwargs = [(k.name, self.eval_single(k.value, frame)) for k in call.kwargs]
        arg_pos: dict[str, Pos] = {}
        for i, a in enumerate(call.args):
            arg_pos[f"#{i}"] = a.pos
            if i < len(names):
                arg_pos[names[i]] = a.pos
        for k in call.kwargs:
            arg_pos[k.name] = k.pos
        return args, kwargs, arg_pos

    def guard(self, pos: Pos, arg_pos: dict[str, Pos], what: Callable[[], str] | None, thunk: Callable[[], Any]):
        """Run `thunk`, turning CallError and Graph.add's ValueError into SourceError."""
        first = self.g._next_id
        try:
            out = thunk()
        except CallError as err:
            raise self.src.error(err.message, arg_pos.get(err.arg, pos)) from None
        except dims.SymbolicDim as err:   # a builtin that needs concrete sizes, given symbols
            names = ", ".join(f"--dim {s.name}=VALUE" for s in self._symbols_in_scope())
            raise self.src.error(f"{what() + ': ' if what else ''}{err} (bind the sizes: {names})", pos) from None
        except (ValueError, IndexError, RuntimeError, TypeError) as err:
            # ValueError: Graph.add's inference (PyTorch's message); the others: operands a
            # composite did not expect (a 0-d query...). All are the program's fault.
            prefix = f"{what()}: " if what else ""
            first_line = str(err).split("\n")[0]  # PyTorch's messages can run on; one line is the fact
            raise self.src.error(f"{prefix}{first_line}", pos) from None
        for nid in range(first, self.g._next_id):  # meta tensors let element counts overflow silently
            too_big = nid in self.g and size_error(self.g.node(nid).shape, self.g.node(nid).dtype)
            if too_big:
                raise self.src.error(too_big, pos)
        return out

    def _symbols_in_scope(self) -> list["dims.Sym"]:
        return list(dims.symbols(*(d for n in map(self.g.node, self.g.inputs) for d in n.shape)))

    def emit(self, pos: Pos) -> Emit:
        return Emit(self.g, self.src.origin(pos))


def _is_int(v: Value) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_size(v: Value) -> bool:
    return _is_int(v) or dims.is_symbolic(v)

"""Kernels that are the same up to names: written once, launched by every group that has one.

A model repeats its layers, and a layer repeats its shapes: the q, k and v projections of a
Llama layer are one GEMM three times, its two RMSNorms one reduction twice, and a four-layer
model holds each of them four times over. Codegen names every kernel after its group
(`mc_gemm_matmul_1`, `_2`, ...) and its pointer parameters after the tensors they read
(`layer_self_attn_q_proj_weight_ptr`), so the texts differ while the programs do not. Triton
keys its compile cache on the text, so each copy compiled (and tuned) again: eleven compiles
for a layer with eight distinct kernels, forty-four for four layers.

`canonical(kernel)` is the kernel's source with those names taken out: the kernel's own name
(and every name it derives from it, `<name>_configs`, `<name>_small`) becomes a placeholder, and
each function's parameters become their positions (in the body, and in strings that name a
parameter, such as an autotuner's `key`), and its local variables their order of appearance. Two kernels with the same canonical text compute the
same function of their positional arguments (alpha-equivalence of the syntax tree: comments and
layout are not in it), so the second group launches the first kernel. `renamer(first, dup)`
maps the duplicate's parameter and function names to the first's, for the launches' keyword
arguments and `fn` names.

Invariants: a source that does not parse is never shared (`canonical` returns None); names are
compared whole (`mc_k_1` does not own `mc_k_10`); nothing here writes source, it only compares.
"""

from __future__ import annotations

import ast

from dataclasses import replace

from minicomp.codegen.common import Blocks, Grid, Kernel, Launch, Ready

_PLACEHOLDER = "_mc_kernel"


def _owned(name: str, kernel: str) -> bool:
    return name == kernel or name.startswith(kernel + "_")


def _params(tree: ast.Module) -> list[list[str]]:
    """Each top-level function's parameter names, in order."""
    return [[a.arg for a in f.args.args] for f in tree.body if isinstance(f, ast.FunctionDef)]


class _Canon(ast.NodeTransformer):
    """Rename the kernel's own names to the placeholder, each function's parameters to `_p<i>`
    (strings equal to a parameter name too: autotuner keys, do_not_specialize) and its local
    variables to `_v<i>` in the order they first appear (codegen names them after graph nodes:
    `pow3_sq` in one copy is `pow49_sq` in the next)."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.params: dict[str, str] = {}
        self.locals: set[str] = set()
        self.numbered: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name in self.params:
            return self.params[name]
        if name in self.locals:
            return self.numbered.setdefault(name, f"_v{len(self.numbered)}")
        if _owned(name, self.kernel):
            return _PLACEHOLDER + name[len(self.kernel):]
        return name

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        outer = self.params, self.locals, self.numbered
        # decorators are evaluated outside the function: they see the outer names, but their
        # strings name this function's parameters
        self.params = {a.arg: f"_p{i}" for i, a in enumerate(node.args.args)}
        self.locals, self.numbered = set(), {}
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.name = self._name(node.name)
        self.locals = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                       and isinstance(n.ctx, (ast.Store, ast.Del))} - set(self.params)
        for a in node.args.args:
            a.arg = self.params[a.arg]
            a.annotation = self.visit(a.annotation) if a.annotation is not None else None
        node.body = [self.visit(s) for s in node.body]
        node.returns = None
        self.params, self.locals, self.numbered = outer
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):
            node.value = self._name(node.value)
        return node


def canonical(kernel: Kernel) -> str | None:
    """`kernel.source` with its own names and its parameters' names taken out (module
    docstring), or None where it does not parse."""
    try:
        tree = ast.parse(kernel.source)
    except SyntaxError:
        return None
    return ast.dump(_Canon(kernel.name).visit(tree), annotate_fields=False)


def renamer(first: Kernel, dup: Kernel) -> dict[str, str]:
    """The duplicate's names (its own, its parameters') -> the first kernel's: what its
    launches' keyword arguments and `fn` names become. Only for kernels whose canonical texts
    are equal (the same functions with the same parameter counts, in the same order)."""
    mapping: dict[str, str] = {}
    a, b = ast.parse(first.source), ast.parse(dup.source)
    for fa, fb in zip(_params(a), _params(b)):
        mapping.update({pb: pa for pa, pb in zip(fa, fb) if pa != pb})
    names = {n.id for n in ast.walk(b) if isinstance(n, ast.Name)} | {
        f.name for f in b.body if isinstance(f, ast.FunctionDef)}
    for name in names:
        if _owned(name, dup.name):
            mapping[name] = first.name + name[len(dup.name):]
    return mapping


def renamed(launch: Launch, names: dict[str, str]) -> Launch:
    """`launch` of a duplicate kernel, with its function and keyword names the first kernel's."""
    def block(f):
        return Blocks(f.n, names.get(f.block, f.block)) if isinstance(f, Blocks) else f
    grid = Grid(tuple(tuple(block(f) for f in d) for d in launch.grid.dims), launch.grid.persistent,
                names.get(launch.grid.share, launch.grid.share))
    when = launch.when
    if isinstance(when, Ready):
        when = Ready(names.get(when.fn, when.fn), when.ready)
    return replace(launch, grid=grid, kwargs=tuple((names.get(k, k), v) for k, v in launch.kwargs),
                   fn=names.get(launch.fn, launch.fn), when=when)

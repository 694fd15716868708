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
from dataclasses import dataclass, replace

from minicomp.codegen.common import Blocks, Grid, Kernel, Launch, Ready

_PLACEHOLDER = "_mc_kernel"


def _owned(name: str, kernel: str) -> bool:
    return name == kernel or name.startswith(kernel + "_")


def _rename(root: ast.AST, name_of) -> None:
    """Rename, in place, every name and string constant under `root` through `name_of`."""
    for n in ast.walk(root):
        if isinstance(n, ast.Name):
            n.id = name_of(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            n.value = name_of(n.value)


@dataclass(frozen=True)
class Form:
    """What one parse of a kernel's source tells: its canonical text (module docstring), each
    function's parameter names in order, and the names it owns (its own and those derived
    from it). Two kernels of equal `text` are renamed onto each other from the rest alone."""
    text: str
    params: tuple[tuple[str, ...], ...]
    owned: frozenset[str]


def form(kernel: Kernel) -> Form | None:
    """`kernel`'s Form, or None where its source does not parse."""
    try:
        tree = ast.parse(kernel.source)
    except SyntaxError:
        return None
    own = kernel.name
    # each top-level function's parameter names, in order
    params_of = tuple(tuple(a.arg for a in f.args.args) for f in tree.body if isinstance(f, ast.FunctionDef))
    owned = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and _owned(f.name, own)}

    def outer(name: str) -> str:
        return _PLACEHOLDER + name[len(own):] if _owned(name, own) else name

    for stmt in tree.body:
        if not isinstance(stmt, ast.FunctionDef):
            owned.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and _owned(n.id, own))
            _rename(stmt, outer)
            continue
        params = {a.arg: f"_p{i}" for i, a in enumerate(stmt.args.args)}
        names = [n for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        owned.update(n.id for n in names if _owned(n.id, own))
        local = {n.id for n in names if isinstance(n.ctx, (ast.Store, ast.Del))} - set(params)
        numbered: dict[str, str] = {}

        def inner(name: str, params=params, local=local, numbered=numbered) -> str:
            if name in params:
                return params[name]
            if name in local:
                return numbered.setdefault(name, f"_v{len(numbered)}")
            return outer(name)

        # decorators are evaluated outside the function, but their strings name its parameters
        for d in stmt.decorator_list:
            _rename(d, lambda name, params=params: params.get(name) or outer(name))
        stmt.name, stmt.returns = outer(stmt.name), None
        for a in stmt.args.args:
            a.arg = params[a.arg]
            if a.annotation is not None:
                _rename(a.annotation, outer)
        for body in stmt.body:
            _rename(body, inner)
    return Form(ast.dump(tree, annotate_fields=False), params_of, frozenset(owned))


def canonical(kernel: Kernel) -> str | None:
    """`kernel.source` with its own names and its parameters' and locals' names taken out
    (module docstring), or None where it does not parse. Each function's parameters become
    `_p<i>` (strings equal to a parameter name too: autotuner keys, do_not_specialize) and its
    local variables `_v<i>` in the order a walk of its body first meets them (codegen names
    them after graph nodes: `pow3_sq` in one copy is `pow49_sq` in the next)."""
    f = form(kernel)
    return None if f is None else f.text


def _renaming(first: Kernel, first_form: Form, dup: Kernel, dup_form: Form) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for fa, fb in zip(first_form.params, dup_form.params):
        mapping.update({pb: pa for pa, pb in zip(fa, fb) if pa != pb})
    for name in dup_form.owned:
        mapping[name] = first.name + name[len(dup.name):]
    return mapping


def renamer(first: Kernel, dup: Kernel) -> dict[str, str]:
    """The duplicate's names (its own, its parameters') -> the first kernel's: what its
    launches' keyword arguments and `fn` names become. Only for kernels whose canonical texts
    are equal (the same functions with the same parameter counts, in the same order)."""
    a, b = form(first), form(dup)
    if a is None or b is None or a.text != b.text:
        raise ValueError(f"{dup.name} is not {first.name} up to names")
    return _renaming(first, a, dup, b)


def renamed(launch: Launch, names: dict[str, str]) -> Launch:
    """`launch` of a duplicate kernel, with its function and keyword names the first kernel's."""
    def block(f):
        return replace(f, block=names.get(f.block, f.block)) if isinstance(f, Blocks) else f
    grid = Grid(tuple(tuple(block(f) for f in d) for d in launch.grid.dims), launch.grid.persistent,
                names.get(launch.grid.share, launch.grid.share))
    when = launch.when
    if isinstance(when, Ready):
        when = replace(when, fn=names.get(when.fn, when.fn), together=tuple(names.get(f, f) for f in when.together))
    return replace(launch, grid=grid, kwargs=tuple((names.get(k, k), v) for k, v in launch.kwargs),
                   fn=names.get(launch.fn, launch.fn), when=when)


def shared(kernel: Kernel, seen: dict[str, tuple[Kernel, Form]],
           kernel_groups: dict[str, int]) -> tuple[Kernel, int | None]:
    """`kernel`, or where an earlier group's kernel is the same up to names, `kernel`'s launches
    renamed onto that one, and the earlier kernel's first group. `seen` maps each canonical text
    to its first kernel and that kernel's Form (a module's record, added to here); `kernel_groups`
    each kernel's first group. Each kernel's source is parsed once."""
    f = form(kernel) if kernel.launches else None
    if f is None:
        return kernel, None
    hit = seen.get(f.text)
    if hit is None:
        seen[f.text] = (kernel, f)
        return kernel, None
    first, first_form = hit
    names = _renaming(first, first_form, kernel, f)
    launches = [renamed(launch, names) for launch in kernel.launches]
    return replace(kernel, name=first.name, source="", launches=launches), kernel_groups[first.name]

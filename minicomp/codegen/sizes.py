"""Symbolic sizes in generated code: one module serves every size in the symbols' ranges.

A graph whose shapes carry symbols (minicomp/ir/dims.py) is generated once. Its symbols get
the module's own names (`s0`, `s1`, ... in order of first appearance in the inputs: never
a user's name, which only appears in comments); every shape, stride and size that codegen
prints is then Python (and Triton) text over those names, so `call()` and the kernels compute
them at run time:

- `call()` reads each symbol from the first input dimension that is exactly that symbol
  (`_rt.bind_size`: the input is a tensor of the right rank and the size is in the symbol's
  range, else a GuardError naming the input, the dimension and the range), then checks every
  input's whole shape against its expressions, as a static module checks literals;
- a kernel takes the symbols its group's tensors use as runtime arguments after its own
  scalars (`size_params`, `size_args`): Triton specialises integer arguments only on
  divisibility by 16 (and on 1, which a symbol never is), so a compiled kernel serves many
  sizes;
- an emitter meets a decision the symbols' ranges do not settle (`SymbolicDim`) and the group
  runs through PyTorch, visibly (GeneratedModule.fallbacks), unless it picks a form that
  serves every size. Which kinds write kernels over symbols is `SYMBOLIC_KINDS`.
"""

from __future__ import annotations

import re

from minicomp.codegen.common import Runtime, next_pow2
from minicomp.errors import CompileError
from minicomp.ir import dims
from minicomp.ir.graph import Graph
from minicomp.plan.records import Plan

SYMBOLIC_KINDS = ("pointwise", "reduction", "gemm", "attention")    # group kinds whose emitters take symbolic sizes


def _dims_of(n) -> tuple:
    """A node's shape, and the size a `size_value` computes (a symbol no shape may carry)."""
    return (*n.shape, n.attrs["value"]) if n.op == "size_value" else tuple(n.shape)


def rename(graph: Graph, plan: Plan) -> tuple[Graph, Plan, dict[str, str]]:
    """`graph` and `plan` with the symbols renamed `s0, s1, ...`; returns them and
    {module name: the user's name} (for comments)."""
    order: list[dims.Sym] = []
    for nid in graph.inputs:
        for d in graph.node(nid).shape:
            for s in dims.symbols(d):
                if s not in order:
                    order.append(s)
    for s in dims.symbols(*(d for n in graph.nodes() for d in _dims_of(n))):
        if s not in order:
            order.append(s)
    env = {s: dims.Expr({(dims.Sym(f"s{k}", s.lo, s.hi, s.hint),): 1}) for k, s in enumerate(order)}
    renamed = graph.map_dims(lambda e: dims.substitute(e, env))
    return renamed, plan.with_specs(renamed), {f"s{k}": s.name for k, s in enumerate(order)}


def module_names(graph: Graph) -> list[str]:
    """The names `rename` gives this graph's symbols (call() must not give them to tensors)."""
    # node order does not matter for a count: no topological sort (this runs once per group).
    # A graph of static shapes has none: a symbol is some input's dimension (`bind_lines`), and
    # `Graph.symbolic` is kept between calls where this scan of every node was not (a 12-layer
    # BERT: 86 groups, 0.2 s of its 1.1 s compile under cProfile)
    if not graph.symbolic:
        return []
    n = len(dims.symbols(*(d for nid in graph.nx.nodes for d in _dims_of(graph.node(nid)))))
    return [f"s{k}" for k in range(n)]


def bind_lines(graph: Graph, arg_names: list[str], labels: dict[str, str]) -> list[str]:
    """call()'s lines that read each symbol from an input's dimension."""
    lines, bound = [], set()
    for nid, name in zip(graph.inputs, arg_names):
        n = graph.node(nid)
        for axis, d in enumerate(n.shape):
            s = dims.lone_symbol(d)
            if s is None or s.name in bound:
                continue
            bound.add(s.name)
            lines.append(f"{s.name} = _rt.bind_size({name}, {n.attrs['name']!r}, {len(n.shape)}, {axis}, "
                         f"{s.lo}, {s.hi}, {labels.get(s.name, s.name)!r})")
    missing = [labels.get(s.name, s.name) for s in dims.symbols(*(d for n in graph.nodes() for d in _dims_of(n)))
               if s.name not in bound]
    if missing:
        raise CompileError(f"{graph.name}: the symbolic size(s) {', '.join(missing)} are not a dimension of any "
                           "input, so a call cannot read them")
    return lines


def used_symbols(graph: Graph, nids) -> list[str]:
    """Module names of the symbols the shapes and strides of these nodes use, sorted."""
    found: set[dims.Sym] = set()
    for nid in nids:
        n = graph.node(nid)
        found.update(dims.symbols(*_dims_of(n), *(n.layout or ())))
    return sorted((s.name for s in found), key=lambda name: int(name[1:]))


def size_params(graph: Graph, nids) -> list[str]:
    """A kernel's parameters for the symbols its tensors use (runtime integers)."""
    return used_symbols(graph, nids)


def size_args(graph: Graph, nids) -> tuple:
    """The matching launch arguments: the symbols themselves, written as their names in call()."""
    return tuple(dims.Expr({(dims.Sym(name),): 1}) for name in used_symbols(graph, nids))


_SYMBOL = re.compile(r"s[0-9]+")


def aligned_symbols(graph: Graph, nids) -> set[str]:
    """The symbols whose divisibility an address depends on: those of a stride term of these
    nodes whose coefficient is not a multiple of 16 (a stride `s1`, or `3*s1`; not `2048*s0`,
    which Triton knows is a multiple of 16 whatever s0 is)."""
    found: set[str] = set()
    for nid in nids:
        for stride in graph.node(nid).layout or ():
            if dims.is_symbolic(stride):
                for monomial, coeff in stride.terms:
                    if coeff % 16:
                        found.update(s.name for s in monomial)
    return found


def jit_line(graph: Graph, nids, params: list[str], free: tuple[str, ...] = ()) -> str:
    """The `@triton.jit` line of a kernel over these nodes with these parameters.

    Triton compiles a kernel once per class of its integer arguments (divisible by 16 or not,
    equal to 1), so over symbolic sizes a length that changes class compiles every kernel (and
    every autotuning config) again. Arguments whose divisibility nothing depends on are not
    specialised: the power-of-two buckets (only the autotuner reads them), the bounds `free`
    names (the emitter's row counts: masks across rows, which load contiguous runs either way)
    and symbols no stride needs aligned (`aligned_symbols`). What stays specialised: strides
    that are a symbol (vector loads need them aligned) and masks along the contiguous axis
    (`n_cols`, `n_elements`: a mask constant over 16 elements keeps loads vectorised); a size
    such as 4096*s0 is always divisible by 16, so its class never changes. A static graph's
    kernels keep the plain decorator (their sizes are literals)."""
    if not graph.symbolic:
        return "@triton.jit"
    aligned = aligned_symbols(graph, nids)
    names = [p.split(":")[0].strip() for p in params if "constexpr" not in p]
    loose = [n for n in names if n.endswith("_bucket") or n in free or (_SYMBOL.fullmatch(n) and n not in aligned)]
    return f"@triton.jit(do_not_specialize={loose!r})" if loose else "@triton.jit"


def tune_tail(fit: dict[str, tuple[str, int]] | None = None, top: tuple[int, dict[str, int]] | None = None) -> str:
    """The keyword arguments that end a generated `@triton.autotune(...)`: the module's timing
    (`_tune_bench`), over symbolic sizes a prune by the call's buckets (`fit`: block name ->
    (bucket parameter, smallest cap); `top`: how many of the table's first configs a big
    problem times, and from which buckets on; minicomp/runtime/tuning.py), and
    `**_tune_options` (tuning records on disk, where this Triton keeps them)."""
    prune = (f"prune_configs_by=_rt.fit_buckets({fit!r}{f', top={top!r}' if top else ''}), " if fit else "")
    return f"do_bench=_tune_bench, {prune}**_tune_options"


def bucket_fit(pairs: list[tuple[str, str, int]], key: list[str]) -> dict[str, tuple[str, int]]:
    """`tune_tail`'s `fit` for the (block, bucket parameter, smallest cap) triples whose bucket
    is in the autotune key (a concrete size's table is cut when it is written)."""
    return {block: (b, least) for block, b, least in pairs if b in key}


OWN_NAMES = dims.OWN_NAMES  # `dims.py(d, OWN_NAMES)`: a size as call()'s text over its size names


def bucket(size: dims.Expr) -> Runtime:
    """The power-of-two bucket of a symbolic size, computed in call(): an autotune key of it
    instead of the size tunes once per bucket (every length of a bucket shares the config)."""
    return Runtime(f"_rt.next_pow2({dims.py(size, OWN_NAMES)})", next_pow2(dims.hint(size)))


def tuning_key(sizes: list[tuple[str, "dims.Dim"]]) -> tuple[list[str], list[str], tuple]:
    """An autotune key over these (parameter name, size) pairs: a concrete size keys as itself,
    a symbolic one by its power-of-two bucket, an extra parameter `<name>_bucket` that call()
    computes (`bucket`). Returns (key, extra parameters, their launch arguments)."""
    key, params, args = [], [], []
    for name, d in sizes:
        if dims.is_symbolic(d):
            key.append(f"{name}_bucket")
            params.append(f"{name}_bucket")
            args.append(bucket(d))
        else:
            key.append(name)
    return key, params, tuple(args)

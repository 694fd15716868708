"""Symbolic dims (minicomp/ir/dims.py) and what is built on them so far: DSL programs planned
over their symbols, with the ledger's bytes, flops and bounds as expressions.

The ledger's expressions are checked against the static plans: evaluated at concrete sizes,
every figure equals what a compile with those sizes bound by --dim computes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torch
import torch.nn.functional as F

from conftest import tol
import minicomp
from minicomp.api import plan_only
from minicomp.errors import GuardError
from minicomp.frontend.dsl import load_dsl
from minicomp.ir import dims
from minicomp.ir.dims import SymbolicDim, sym

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


# --------------------------------------------------------------------------- the expression type

def test_constants_normalise_to_ints_and_equality_is_structural():
    S, B = sym("S"), sym("B", hint=4)
    assert (S - S) == 0 and isinstance(S - S, int)
    assert (S * 3) // 3 == S and (B * S * 64) // (S * 64) == B
    assert S * B == B * S and hash(S * B) == hash(B * S)
    assert S != 3 and S != 1 and (S == 64) is False        # a symbol is never one constant
    assert {S: "x"}[sym("S")] == "x"
    assert str(2048 * B * S + 3) == "2048*B*S + 3" and str(S * S - S) == "S*S - S"


def test_nothing_silently_picks_a_value():
    S = sym("S")
    for thunk in (lambda: int(S), lambda: range(S), lambda: S < 100, lambda: S // 3, lambda: S % 2,
                  lambda: [0][S - 2 + 0 * S]):
        with pytest.raises(SymbolicDim):
            thunk()
    # what the range decides is answered: every symbol is at least 2
    assert S > 1 and S >= 2 and not (S < 2) and bool(S) and max(S, 1) == S


def test_exact_division_bounds_and_hints():
    M, N = sym("M", hint=8), sym("N", lo=4, hi=64, hint=16)
    assert dims.exact_div(6 * M * N, 3 * N) == 2 * M
    assert dims.exact_div(M * N + M, M) == N + 1
    assert dims.exact_div(M + 1, M) is None and dims.exact_div(M * N, M + N) is None
    assert dims.bounds(N) == (4, 64) and dims.bounds(3 * N - 4) == (8, 188)
    assert dims.hint(M * N + 1) == 8 * 16 + 1 and dims.hinted(((M, 2), [N], {"k": M})) == ((8, 2), [16], {"k": 8})
    assert dims.ratio(M * 4, M * 8) == 0.5 and dims.ratio(N, M * N) == pytest.approx(1 / 8)
    with pytest.raises(ValueError):
        dims.Sym("bad", lo=1)                # sizes 0 and 1 are never symbolic


_ATOMS = st.sampled_from(["a", "b", "c"])


def _exprs():
    leaf = st.one_of(st.integers(-50, 50).map(lambda v: ("int", v)), _ATOMS.map(lambda n: ("sym", n)))
    return st.recursive(leaf, lambda inner: st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner), max_leaves=8)


def _build(tree, syms):
    if tree[0] == "int":
        return tree[1]
    if tree[0] == "sym":
        return syms[tree[1]]
    op, a, b = tree
    x, y = _build(a, syms), _build(b, syms)
    return x + y if op == "+" else x - y if op == "-" else x * y


@settings(max_examples=int(os.environ.get("MINICOMP_FUZZ_EXAMPLES", "150")), deadline=None)
@given(tree=_exprs(), env=st.fixed_dictionaries({n: st.integers(2, 10**6) for n in "abc"}))
def test_polynomial_arithmetic_agrees_with_python_ints(tree, env):
    syms = {n: sym(n) for n in "abc"}
    e = _build(tree, syms)
    assert dims.evaluate(e, env) == _build(tree, env)
    lo, hi = dims.bounds(e)
    assert lo <= dims.evaluate(e, env) <= hi or not dims.is_symbolic(e)
    # the Python text of the expression computes the same value from variables
    names = {n: f"v_{n}" for n in "abc"}
    assert eval(dims.py(e, names), {f"v_{n}": v for n, v in env.items()}) == _build(tree, env)


# --------------------------------------------------------------------------- DSL programs over symbols

SYMBOLIC_SAMPLES = ["softmax.mc", "layernorm.mc", "rmsnorm.mc", "mlp.mc"]


def _plan(name: str, bound: dict[str, int] | None):
    text = (SAMPLES / name).read_text()
    graph = load_dsl(text, name, dims=bound, symbolic=bound is None)
    return graph, plan_only(graph)[1]


def _concrete_sizes(graph) -> dict[str, int]:
    # odd sizes, none of them the hints the plan decides at
    odd = [37, 67, 5, 129]
    names = [s.name for s in dims.symbols(*(d for i in graph.inputs for d in graph.node(i).shape))]
    return {n: odd[k % len(odd)] for k, n in enumerate(names)}


@pytest.mark.parametrize("name", SYMBOLIC_SAMPLES)
def test_symbolic_ledger_evaluates_to_the_static_plans_figures(name):
    graph, plan = _plan(name, None)
    assert graph.symbolic and any(dims.is_symbolic(g.bytes_in) for g in plan.groups)
    env = _concrete_sizes(graph)
    _, static = _plan(name, env)
    assert plan.signature() == static.signature(), "the same grouping at these sizes"
    for g, s in zip(plan.groups, static.groups):
        assert (dims.evaluate(g.bytes_in, env), dims.evaluate(g.bytes_out, env)) == (s.bytes_in, s.bytes_out), g.id
        assert dims.evaluate(g.flops, env) == s.flops, g.id
        bound = dims.evaluate(g.lower_bound_us, env)
        if g.bound.split()[0] == s.bound:
            assert bound == pytest.approx(s.lower_bound_us, rel=1e-9), g.id
        else:   # the other roofline term wins at these sizes: the expression is the smaller term
            assert "at the hints" in g.bound and bound < s.lower_bound_us, (g.id, g.bound, s.bound)
    assert dims.evaluate(plan.unfused_bytes, env) == static.unfused_bytes


@pytest.mark.parametrize("name", SYMBOLIC_SAMPLES)
def test_symbolic_plan_decides_as_a_static_compile_at_the_hints(name):
    graph, plan = _plan(name, None)
    at_hints = {s.name: s.hint for s in dims.symbols(*(d for i in graph.inputs for d in graph.node(i).shape))}
    _, static = _plan(name, at_hints)
    assert plan.signature() == static.signature()
    assert [sorted(g.nodes) for g in plan.groups] == [sorted(g.nodes) for g in static.groups]


def test_symbolic_reshape_expand_and_full():
    text = ("func f(x: f32[N, D]) {\n  y = reshape(x, [N * D])\n  z = reshape(y, [N, -1])\n"
            "  return z + 1.0, full([N, 3], 0.0), expand(reshape(sum(x, axis=1), [N, 1]), [N, D])\n}\n")
    g = load_dsl(text, "f.mc", symbolic=True)
    N, D = sym("N"), sym("D")
    assert [g.node(o).shape for o in g.outputs] == [(N, D), (N, 3), (N, D)]
    with pytest.raises(Exception, match=r"f.mc:2:24: .*N // 2 is not exact"):
        load_dsl("func f(x: f32[N, D]) {\n  return reshape(x, [N // 2, -1])\n}\n", "f.mc", symbolic=True)


@pytest.mark.parametrize("src, where, fragment", [
    ("func f(x: f32[N]) {\n  return x / N\n}\n", "2:14", "the symbolic size N (a number only once --dim binds it)"),
    ("func f(x: f32[N, D]) {\n  return reshape(x, [N // D, D, D])\n}\n", "2:24",
     "N // D is not exact for every value of the symbols"),
    ("func f(x: f32[N]) {\n  return slice(x, 0, 0, N)\n}\n", "2:25", "symbolic size N"),
])
def test_a_size_used_as_a_number_says_where_and_to_bind_it(src, where, fragment, tmp_path):
    path = tmp_path / "p.mc"
    path.write_text(src)
    r = _cli(str(path), "--dump-ir")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"p.mc:{where}: error: " in r.stderr and fragment in r.stderr, r.stderr


# --------------------------------------------------------------------------- the CLI

def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MINICOMP_VERIFY_TARGET="off")
    return subprocess.run([sys.executable, "-m", "minicomp", "compile", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_cli_dumps_softmax_over_its_symbols():
    r = _cli("samples/softmax.mc", "--dump-ir", "--dump-plan")
    assert r.returncode == 0, r.stderr
    assert "%0 = input x : f32[M, N] strides=[N, 1]" in r.stdout
    assert "%5 = div(%0" not in r.stdout and ": f32[M, 1]" in r.stdout
    assert "4*M*N B" in r.stdout                                  # bytes in and out of the row kernel
    assert "lower bound on the H200 model 1.876e-06*M*N µs" in r.stdout, r.stdout
    assert "compiled softmax_rows over symbolic sizes M, N" in r.stdout


def test_cli_emits_one_module_for_every_size_and_needs_sizes_to_run(tmp_path):
    r = _cli("samples/rmsnorm.mc", "--emit", str(tmp_path))
    assert r.returncode == 0 and "one module for every size" in r.stdout, r.stderr
    (module,) = tmp_path.glob("rmsnorm_*.py")
    text = module.read_text()
    assert "s2 = _rt.bind_size(x, 'x', 3, 2, 2, 2147483647, 'C')" in text
    # the module runs on its own, as a script, at small sizes of its symbols
    run = subprocess.run([sys.executable, str(module)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0 and "output 0: (16, 16, 16) torch.float32" in run.stdout, run.stderr
    r = _cli("samples/softmax.mc", "--check", "--dim", "M=3")
    assert r.returncode == 1 and "--dim N=VALUE" in r.stderr, r.stderr


def _sym_compile(text: str, name: str = "p.mc"):
    from minicomp.api import compile_graph
    g = load_dsl(text, name, symbolic=True)
    return compile_graph(g, [None] * len(g.inputs), device="cpu")


@pytest.mark.parametrize("name", ["softmax.mc", "rmsnorm.mc", "layernorm.mc"])
def test_one_module_serves_every_size(name):
    """Compiled once over its symbols, each sample runs at odd sizes (long rows take the looped
    form, chosen at run time) and equals the interpreter on the program bound to those sizes."""
    from minicomp.ir.interpret import run
    text = (SAMPLES / name).read_text()
    compiled = _sym_compile(text, name)
    assert compiled.generated.fallbacks == {} and compiled.graph.symbolic
    syms = [s.name for s in dims.symbols(*(d for i in compiled.graph.inputs for d in compiled.graph.node(i).shape))]
    for values in ((3, 5, 7), (2, 9000, 3), (37, 2, 67), (8, 16, 2)):
        env = dict(zip(syms, values))
        static = load_dsl(text, name, dims=env)
        gen = torch.Generator().manual_seed(sum(values))
        inputs = [torch.randn([int(d) for d in static.node(i).shape], generator=gen) for i in static.inputs]
        for got, want in zip(compiled.call(*inputs), run(static, inputs)):
            torch.testing.assert_close(got, want, **tol(torch.float32))


def test_pointwise_broadcast_and_a_bad_size_over_symbols():
    compiled = _sym_compile("func f(x: f32[M, N], b: f32[N]) {\n  return gelu(x * 2.0 + b)\n}\n")
    assert compiled.generated.fallbacks == {}
    for m, n in ((3, 5), (37, 67), (2, 2)):
        x, b = torch.randn(m, n), torch.randn(n)
        x = x.t().contiguous().t() if m == n else x        # a column-major input where it is square
        torch.testing.assert_close(compiled.call(x, b)[0], F.gelu(x * 2.0 + b), **tol(torch.float32))
    with pytest.raises(GuardError, match=r"dimension 0 \(M\) is 1, outside the range \[2, 2147483647\]"):
        compiled.call(torch.randn(1, 5), torch.randn(5))
    with pytest.raises(TypeError, match="must be torch.float32 of shape"):
        compiled.call(torch.randn(3, 5), torch.randn(6))


def test_compile_dsl_dynamic_compiles_once_for_every_size():
    f = minicomp.compile_dsl(str(SAMPLES / "softmax.mc"), dynamic=True)
    first = None
    for m, n in ((3, 5), (17, 300), (2, 9000)):
        x = torch.randn(m, n)
        torch.testing.assert_close(f(x), torch.softmax(x, dim=-1), **tol(torch.float32))
        c = f.compile_for(x)
        first = first or c
        assert c is first and c.graph.symbolic
    # a call the symbolic module does not take (a size of 1) compiles for its sizes, as before
    x = torch.randn(1, 7)
    torch.testing.assert_close(f(x), torch.softmax(x, dim=-1), **tol(torch.float32))
    assert not f.compile_for(x).graph.symbolic

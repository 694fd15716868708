"""The op table (minicomp/ir/ops): consistent, complete, layered, and enough on its own.

- every aten name it claims exists in this PyTorch, is claimed once, and is lowered;
- the fx frontend writes handlers only for names the table claims;
- every op with a Triton form computes what its PyTorch reference computes, for every
  dtype its reference accepts (odd shapes, broadcasting, a non-contiguous operand);
- adding a pointwise op is one entry: a new entry is captured, inferred, compiled and
  documented with nothing else changed;
- the IR imports nothing above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import tol

from minicomp.api import compile_graph
from minicomp.codegen.fallback import torch_text
from minicomp.frontend import fx_ops, ops_doc
from minicomp.frontend.fx import capture, opaque_nodes
from minicomp.ir import ops
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import run
from minicomp.ir.ops.rules import SAME_FLOAT

ROOT = Path(__file__).resolve().parent.parent


def test_every_claimed_overload_exists_and_is_lowered():
    lowered = {fx_ops.table_name(t) for t in fx_ops.LOWERINGS}
    assert [n for n in ops.ATEN if fx_ops.resolve(n) is None] == []
    assert lowered == set(ops.ATEN)
    assert set(ops.RUNS_IN_PYTORCH) <= set(ops.ATEN)


def test_handlers_are_written_only_for_claimed_names():
    assert set(fx_ops.HANDLERS) <= set(ops.ATEN)
    with pytest.raises(KeyError, match="no op table entry claims it"):
        fx_ops.lowers("sinh.default")(lambda cx, x: x.id)


def test_a_claim_that_does_not_fit_the_generic_lowering_is_refused():
    # add.Tensor has an alpha argument that `add` has no attribute for: it needs its handler
    with pytest.raises(TypeError, match="does not fit op 'add'"):
        fx_ops.direct(ops.get("add"), torch.ops.aten.add.Tensor)


def test_every_op_names_who_writes_its_code():
    writers = {"pointwise": {"expr", "cast", "index", "literal", "size", "indirect"}, "reduction": {"reduction"},
               "scan": {"scan"}, "view": {"view"},
               "gemm": {"gemm"}, "attention": {"attention"}, "input": {"load"}, "constant": {"load"},
               "opaque": {"pytorch"}}
    for name, d in ops.REGISTRY.items():
        assert d.emitter in writers[d.kind], name
        assert (d.pytorch is None) == (d.kind in ("input", "constant", "opaque")), name


# --------------------------------------------------------------------------- every Triton form vs eager

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.bool]
EXPR_OPS = [n for n, d in ops.REGISTRY.items() if d.emitter == "expr"]
ATTRS = {"gelu": [{"approximate": "none"}, {"approximate": "tanh"}],
         "pow": [{"exponent": e} for e in (2, 3, -1, 0.5, 2.5, 87)],
         "clamp": [{"min": -0.5, "max": 0.75}, {"min": None, "max": 0.0}],
         "round": [{"decimals": 0}, {"decimals": 2}, {"decimals": -1}],
         "nan_to_num": [{"nan": None, "posinf": None, "neginf": None}, {"nan": 1.0, "posinf": 2.0, "neginf": -3.0}],
         "elu": [{"alpha": 1.0, "scale": 1.0, "input_scale": 1.0}, {"alpha": 0.7, "scale": 1.05, "input_scale": 2.0}],
         "leaky_relu": [{"negative_slope": 0.01}, {"negative_slope": -0.5}],
         "hardtanh": [{"min_val": -1.0, "max_val": 1.0}, {"min_val": 0.0, "max_val": 6.0}],
         "softplus": [{"beta": 1.0, "threshold": 20.0}, {"beta": 2.0, "threshold": 1.0}],
         "logit": [{"eps": None}, {"eps": 1e-3}]}
POSITIVE = ("log", "sqrt", "rsqrt")       # the reference of these is NaN below zero; keep to its domain
# ops whose Triton form is float-only today: a reference on integer operands gives an
# integer result the form cannot compute exactly
FLOAT_ONLY: set[str] = set()


def _tol(dtype: torch.dtype) -> dict:
    # fp64 kernels use Triton's own transcendentals (a few ulp from PyTorch's), and tanh's
    # small-|x| series is written for fp32: it agrees with eager's fp64 tanh to about 3e-8
    return dict(atol=1e-7, rtol=1e-7) if dtype == torch.float64 else tol(dtype)


def _operand(shape, dtype, op, gen, transposed=False):
    if transposed:
        return _operand(shape[::-1], dtype, op, gen).t()
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        low = 1 if op in POSITIVE else -4
        return torch.randint(low, 5, shape, generator=gen).to(dtype)
    x = torch.randn(shape, generator=gen)
    return (x.abs() + 0.1 if op in POSITIVE else x).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", EXPR_OPS)
def test_triton_form_matches_eager(op, dtype):
    d = ops.get(op)
    if op in FLOAT_ONLY and not dtype.is_floating_point:
        pytest.skip("float-only form")
    gen = torch.Generator().manual_seed(len(op))
    shapes = [(5, 7), (7,), (5, 1)][: d.arity]
    ran = 0
    for attrs in ATTRS.get(op, [{}]):
        inputs = [_operand(s, torch.bool if (op == "where" and i == 0) else dtype, op, gen, transposed=(i == 0))
                  for i, s in enumerate(shapes)]
        try:
            want = d.ref(*inputs, **attrs)
        except RuntimeError:
            continue            # eager refuses these operands (e.g. neg of bool): nothing to match
        g = Graph(op)
        args = [g.add_input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(inputs)]
        g.set_outputs([g.add(op, *args, **attrs)])
        got = compile_graph(g, inputs).call(*inputs)[0]
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **_tol(want.dtype), equal_nan=True)
        torch.testing.assert_close(run(g, inputs)[0], want, **tol(want.dtype), equal_nan=True)
        ran += 1
    if not ran:
        pytest.skip("eager accepts no operands of this dtype")


# --------------------------------------------------------------------------- one entry is a whole op

NEW = "hardshrink_for_test"     # not a minicomp op: registered by this test, removed after it


def _hardshrink(x, *, lambd):
    return torch.nn.functional.hardshrink(x, lambd)


@pytest.fixture
def new_op(monkeypatch):
    """A pointwise op added the way a contributor adds one: one OpDef, nothing else."""
    assert "hardshrink.default" not in ops.ATEN, "hardshrink is lowered now: pick another overload here"
    ops.register(ops.OpDef(NEW, "pointwise", _hardshrink, attrs=("lambd",), shape=SAME_FLOAT,
                           triton="tl.where(tl.abs({0}) > {lambd}, {0}, 0.0)",
                           pytorch="torch.nn.functional.hardshrink({0}, {lambd})", aten=("hardshrink.default",)))
    monkeypatch.setattr(fx_ops, "LOWERINGS", fx_ops.build_lowerings())
    yield ops.get(NEW)
    del ops.REGISTRY[NEW]
    del ops.ATEN["hardshrink.default"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_adding_a_pointwise_op_is_one_entry(new_op, dtype):
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(0)).to(dtype).t()   # non-contiguous
    fn = lambda x: torch.nn.functional.hardshrink(x, 0.3) * 2  # noqa: E731
    g = capture(fn, [x])
    assert not opaque_nodes(g) and NEW in {n.op for n in g.nodes()}, g.dump()
    compiled = compile_graph(g, [x])
    assert compiled.plan.kinds() == ["pointwise"] and not compiled.generated.fallbacks
    assert "tl.abs(" in compiled.generated.source and " > 0.3," in compiled.generated.source
    torch.testing.assert_close(compiled.call(x)[0], fn(x), **tol(dtype))
    node = g.node(next(n.id for n in g.nodes() if n.op == NEW))
    assert torch_text(node, ["buf0"], lambda _n: 0) == "torch.nn.functional.hardshrink(buf0, 0.3)"
    assert "| `aten.hardshrink.default` | `hardshrink_for_test` | pointwise | yes |" in ops_doc.render()


# --------------------------------------------------------------------------- layering


def test_the_ir_imports_nothing_above_it():
    above = ("minicomp.frontend", "minicomp.passes", "minicomp.codegen", "minicomp.runtime", "minicomp.api",
             "minicomp.cli")
    for path in sorted((ROOT / "minicomp" / "ir").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.startswith(above)]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


# --------------------------------------------------------------------------- a wrong answer, fixed


def test_conj_of_a_complex_tensor_is_not_an_identity():
    # aten._conj used to lower to "the operand itself": x.conj() returned x
    import minicomp

    x = torch.randn(5, dtype=torch.complex64)
    f = minicomp.compile(lambda x: (x.conj() * 2).resolve_conj())
    torch.testing.assert_close(f(x), x.conj() * 2)
    g = minicomp.compile(lambda x: torch.conj_physical(x) + x.conj())
    torch.testing.assert_close(g(x), 2 * x.conj())

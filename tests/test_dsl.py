"""The DSL frontend: samples against eager PyTorch, builtins, symbols, and every error kind.

Samples are compared through the reference interpreter (no Triton): each `.mc` program
must verify and equal a hand-written eager function of the same math, at odd sizes, in
fp32 and bf16 (the same program retyped). Error tests pin the exact `file:line:col`, the
echoed source line and the caret column; CLI tests check the same on stderr, exit 1 and no
traceback.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import tol
from minicomp.errors import MinicompError, SourceError
from minicomp.frontend.dsl import list_functions, load_dsl
from minicomp.ir.dtypes import dtype_name
from minicomp.ir.interpret import run
from minicomp.ir.verify import verify

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
DTYPES = [torch.float32, torch.bfloat16]


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def sample_source(name: str, dtype: torch.dtype) -> str:
    """A sample's text; for another dtype, the same program with its f32 types retyped."""
    text = (SAMPLES / f"{name}.mc").read_text()
    return text if dtype == torch.float32 else text.replace("f32[", f"{dtype_name(dtype)}[")


def run_sample(name: str, inputs: list[torch.Tensor], dtype: torch.dtype, **kw) -> list[torch.Tensor]:
    g = load_dsl(sample_source(name, dtype), f"samples/{name}.mc", example_inputs=inputs, **kw)
    verify(g)
    return run(g, inputs)


# ------------------------------------------------------------------ samples vs eager


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_sample(dtype):
    x, r, w = rand(2, 7, 33, dtype=dtype), rand(2, 7, 33, dtype=dtype, seed=1), rand(33, dtype=dtype, seed=2)
    h, y = run_sample("rmsnorm", [x, r, w], dtype)
    hf = (x + r).float()
    want = (hf * torch.rsqrt((hf * hf).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    torch.testing.assert_close(h, x + r, **tol(dtype))
    torch.testing.assert_close(y, want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_sample(dtype):
    x = rand(7, 33, dtype=dtype) * 4
    (y,) = run_sample("softmax", [x], dtype)
    e = torch.exp(x - x.amax(-1, keepdim=True))
    torch.testing.assert_close(y, e / e.sum(-1, keepdim=True), **tol(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(y, torch.softmax(x, -1), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_sample(dtype):
    x, w, b = rand(2, 7, 33, dtype=dtype), rand(33, dtype=dtype, seed=1), rand(33, dtype=dtype, seed=2)
    (y,) = run_sample("layernorm", [x, w, b], dtype)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) * (x - mu)).mean(-1, keepdim=True)
    torch.testing.assert_close(y, (x - mu) * torch.rsqrt(var + 1e-5) * w + b, **tol(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(y, F.layer_norm(x, (33,), w, b, 1e-5), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_sample(dtype):
    x = rand(2, 7, 33, dtype=dtype)
    w1, b1 = rand(20, 33, dtype=dtype, seed=1) / 6, rand(20, dtype=dtype, seed=2)
    w2, b2 = rand(33, 20, dtype=dtype, seed=3) / 4, rand(33, dtype=dtype, seed=4)
    (y,) = run_sample("mlp", [x, w1, b1, w2, b2], dtype)
    want = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    torch.testing.assert_close(y, want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_sample(dtype):
    q, k, v = (rand(2, 3, 11, 5, dtype=dtype, seed=s) for s in range(3))
    (y,) = run_sample("attention", [q, k, v], dtype)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(5))
    keep = torch.ones(11, 11, dtype=torch.bool).tril()
    p = torch.softmax(scores.float().masked_fill(~keep, float("-inf")), -1).to(dtype)
    torch.testing.assert_close(y, p @ v, **tol(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(y, F.scaled_dot_product_attention(q, k, v, is_causal=True), **tol(dtype))


def load_py_sample(name: str):
    spec = importlib.util.spec_from_file_location(f"_dsl_test_sample_{name}", SAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Each .mc sample against its Python twin (samples/*.py), at odd sizes. A module's weights are
# passed to the DSL function after its inputs, in named_parameters() order, then its buffers.
TWINS = [
    ("rmsnorm", dict(batch=2, seq=7, width=33)),
    ("softmax", dict(rows=7, cols=33)),
    ("layernorm", dict(batch=1, seq=7, width=33)),
    ("mlp", dict(batch=1, seq=7, width=33, hidden=20)),
    ("attention", dict(batch=2, heads=3, seq=11, head_dim=5)),
    ("gpt_block", dict(batch=2, seq=7, width=36)),                  # 4 heads of 9
    ("llama_block", dict(batch=2, seq=7, width=40, hidden=77)),     # 4 query heads, 2 kv heads of 10
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,sizes", TWINS, ids=[t[0] for t in TWINS])
def test_sample_equals_its_python_twin(name, sizes, dtype):
    model, inputs = load_py_sample(name).build(dtype=dtype, **sizes)
    dsl_inputs = list(inputs)
    if isinstance(model, torch.nn.Module):
        dsl_inputs += [p.detach() for p in model.parameters()] + list(model.buffers())
    got = run_sample(name, dsl_inputs, dtype)
    with torch.no_grad():
        want = model(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol(dtype))


def test_sample_files_parse_and_their_entry_is_the_last_function():
    for path in sorted(SAMPLES.glob("*.mc")):
        names = list_functions(path.read_text(), str(path))
        assert names, path
    assert list_functions((SAMPLES / "layernorm.mc").read_text(), "layernorm.mc") == ["moments", "layernorm"]


# ------------------------------------------------------------------ language features

PROG = """\
func f(x: f32[M, N], y: f32[M, N], w: f32[N]) {
  return EXPR
}
"""
M, N = 7, 33
X, Y, W = rand(M, N), rand(M, N, seed=1), rand(N, seed=2)

# (DSL expression, the same in eager PyTorch)
BUILTIN_CASES = [
    ("exp(x) + log(abs(y) + 1.0) - sqrt(abs(x)) * rsqrt(abs(y) + 1)",
     lambda x, y, w: torch.exp(x) + torch.log(y.abs() + 1) - x.abs().sqrt() * torch.rsqrt(y.abs() + 1)),
    ("tanh(x) * sigmoid(y) + relu(x) - silu(y) + sin(x) * cos(y) + erf(x)",
     lambda x, y, w: torch.tanh(x) * torch.sigmoid(y) + torch.relu(x) - F.silu(y) + x.sin() * y.cos() + torch.erf(x)),
    ('gelu(x) + gelu(y, approximate="tanh")', lambda x, y, w: F.gelu(x) + F.gelu(y, approximate="tanh")),
    ("maximum(x, y) - minimum(x, 0.5) + pow(x, 2.0) + pow(x, 3)",
     lambda x, y, w: torch.maximum(x, y) - torch.minimum(x, torch.tensor(0.5)) + x ** 2.0 + x ** 3),
    ("clamp(x, min=-0.5, max=0.5) + clamp(y, max=0.1)",
     lambda x, y, w: x.clamp(-0.5, 0.5) + y.clamp(max=0.1)),
    ("where(x > y, x, -y) + where(logical_not(x <= 0), 1.0, 0.0)",
     lambda x, y, w: torch.where(x > y, x, -y) + torch.where(~(x <= 0), 1.0, 0.0)),
    ("cast(x == y, f32) + cast(x != y, f32) * 2 + cast(x >= 0.5, f32) + cast(y < 0, i64)",
     lambda x, y, w: (x == y).float() + (x != y).float() * 2 + (x >= 0.5).float() + (y < 0).long()),
    ("cast(x, bf16)", lambda x, y, w: x.to(torch.bfloat16)),
    ("-x / 3 * -w @ transpose(y, 0, 1)", lambda x, y, w: (-x / 3 * -w) @ y.T),
    ("sum(x, axis=[0, 1]) + mean(x) + amax(y, axis=0) - amin(y, axis=-1, keepdim=true)",
     lambda x, y, w: x.sum((0, 1)) + x.mean() + y.amax(0) - y.amin(-1, keepdim=True)),
    ("var(x, axis=-1, keepdim=true) + var(y, axis=0, keepdim=true, correction=0)",
     lambda x, y, w: x.var(-1, keepdim=True) + y.var(0, keepdim=True, correction=0)),
    ("softmax(x, axis=0) + log_softmax(y)", lambda x, y, w: torch.softmax(x, 0) + torch.log_softmax(y, -1)),
    ("layer_norm(x, w, w * 0.5, eps=1e-3) + layer_norm(y)",
     lambda x, y, w: F.layer_norm(x, (N,), w, w * 0.5, 1e-3) + F.layer_norm(y, (N,))),
    ("rms_norm(x, w, eps=1e-6) + rms_norm(y)",
     lambda x, y, w: F.rms_norm(x, (N,), w, 1e-6) + F.rms_norm(y, (N,))),
    ("linear(x, y) + matmul(x, transpose(y, -1, -2))", lambda x, y, w: F.linear(x, y) + x @ y.T),
    ("permute(reshape(x, [M, 3, -1]), [2, 0, 1])", lambda x, y, w: x.reshape(M, 3, -1).permute(2, 0, 1)),
    ("expand(unsqueeze(w, 0), [5, -1]) + squeeze(unsqueeze(w, -1), -1)",
     lambda x, y, w: w.unsqueeze(0).expand(5, -1) + w.unsqueeze(-1).squeeze(-1)),
    ("cat([slice(x, 1, 0, 10), slice(y, -1, -5), slice(x, 1, 3, 30, 4)], axis=-1)",
     lambda x, y, w: torch.cat([x[:, 0:10], y[:, -5:], x[:, 3:30:4]], -1)),
    ("tril(x) + triu(y, diagonal=1) + cast(causal_mask(M, N), f32)",
     lambda x, y, w: x.tril() + y.triu(1) + torch.ones(M, N, dtype=torch.bool).tril().float()),
    ("full([M, 2], 0.25) + arange(2) + cast(arange(1, 5, 2), f32)",
     lambda x, y, w: torch.full((M, 2), 0.25) + torch.arange(2) + torch.arange(1, 5, 2).float()),
    ("x * (1.0 / sqrt(N)) + M // 2 - (N - 1) / 4 + pi", lambda x, y, w: x * (1.0 / math.sqrt(N)) + 3 - 8 + math.pi),
]


@pytest.mark.parametrize("expr,eager", BUILTIN_CASES, ids=[c[0][:40] for c in BUILTIN_CASES])
def test_builtins_match_eager(expr, eager):
    g = load_dsl(PROG.replace("EXPR", expr), "b.mc", example_inputs=[X, Y, W])
    verify(g)
    (got,) = run(g, [X, Y, W])
    want = eager(X, Y, W)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, **tol(torch.float32))


def test_attention_builtin_matches_sdpa():
    src = """\
    func f(q: f32[B, H, S, D], k: f32[B, G, S, D], v: f32[B, G, S, D], m: b8[S, S]) {
      a = attention(q, k, v, is_causal=true, enable_gqa=true)
      return a, attention(q, k, v, mask=m, scale=0.5, enable_gqa=true)
    }
    """
    q, k, v = rand(2, 4, 9, 5), rand(2, 2, 9, 5, seed=1), rand(2, 2, 9, 5, seed=2)
    m = rand(9, 9, seed=3) > 0
    g = load_dsl(textwrap.dedent(src), "a.mc", example_inputs=[q, k, v, m])
    a, b = run(g, [q, k, v, m])
    torch.testing.assert_close(a, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    torch.testing.assert_close(b, F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.5, enable_gqa=True))


def test_functions_inline_with_their_own_symbols_multi_returns_and_shadow_builtins():
    src = """\
    # a user function named like a builtin wins
    func softmax(t: f32[R, C]) -> f32[R, C] {
      return t * 2.0
    }
    func stats(t: f32[P, Q]) -> f32[P, 1], f32[1, Q] {
      return sum(t, axis=1, keepdim=true), amax(t, axis=0,
                                                keepdim=true)   # newlines inside ( ) are fine
    }
    func main(x: f32[M, N], y: f32[N, M]) -> f32[M, N], f32[N, 1] {
      r, c = stats(x)
      s, _ = stats(y)
      return softmax(x) + r + c, s
    }
    """
    x, y = rand(4, 6), rand(6, 4, seed=1)
    g = load_dsl(textwrap.dedent(src), "m.mc", example_inputs=[x, y])
    assert g.name == "main" and g.input_names() == ["x", "y"]
    a, b = run(g, [x, y])
    torch.testing.assert_close(a, x * 2 + x.sum(1, keepdim=True) + x.amax(0, keepdim=True))
    torch.testing.assert_close(b, y.sum(1, keepdim=True))


def test_entry_selection_dims_and_origins():
    src = "func a(x: f32[N]) -> f32[N] {\n  return x\n}\nfunc b(x: f32[N]) -> f32[N] {\n  return exp(x) + 1\n}\n"
    assert list_functions(src, "e.mc") == ["a", "b"]
    g = load_dsl(src, "e.mc", entry="b", dims={"N": 5})    # neither calls the other: no default
    assert g.name == "b" and g.node(g.inputs[0]).shape == (5,)
    add = g.node(g.outputs[0])
    assert add.op == "add" and add.origin == "e.mc:5:17"           # a binary node: its operator
    assert g.node(add.args[0]).origin == "e.mc:5:10"               # a call: its name
    assert g.node(g.inputs[0]).origin == "e.mc:4:8"                # an input: its parameter
    assert load_dsl(src, "e.mc", entry="a", dims={"N": 5}).name == "a"
    with pytest.raises(MinicompError, match="no function named 'c'; it defines a, b"):
        load_dsl(src, "e.mc", entry="c", dims={"N": 5})
    # dims and example inputs together, consistent
    assert load_dsl(src, "e.mc", entry="b", dims={"N": 3}, example_inputs=[rand(3)]).node(0).shape == (3,)


def test_half_precision_stays_half_with_python_scalars_and_scalar_params():
    src = "func f(x: bf16[M, N], s: f32) -> bf16[M, N] {\n  return x * 2 + 1e-6 - x * s\n}\n"
    x, s = rand(3, 5, dtype=torch.bfloat16), torch.tensor(0.5)
    g = load_dsl(src, "h.mc", example_inputs=[x, s])
    (y,) = run(g, [x, s])
    torch.testing.assert_close(y, x * 2 + 1e-6 - x * s)


# Random infix expressions: the DSL must parse them with Python's precedence and associativity
# for these operators (unary minus above * / @, above + -, above comparisons), so Python's own
# evaluation of the same text is the reference.
_LEAVES = st.sampled_from(["x", "y", "w", "2", "0.5", "3"])


def _combine(children):
    binary = st.tuples(children, st.sampled_from([" + ", " - ", " * ", " / "]), children).map("".join)
    return st.one_of(binary, children.map(lambda c: "-" + c), children.map(lambda c: f"({c})"))


EXPRESSIONS = st.recursive(_LEAVES, _combine, max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=EXPRESSIONS, compare=st.sampled_from(["", " < x", " >= 0.5"]))
def test_infix_precedence_matches_python(expr, compare):
    text = expr + compare
    g = load_dsl(PROG.replace("EXPR", text), "p.mc", example_inputs=[X, Y, W])
    (got,) = run(g, [X, Y, W])
    try:
        want = eval(text, {"x": X, "y": Y, "w": W})
    except ZeroDivisionError:  # Python's ints refuse 1 / 0; the DSL folds it to inf, like torch
        assume(False)
    want = want if isinstance(want, torch.Tensor) else torch.tensor(want)
    torch.testing.assert_close(got, want.expand(got.shape).to(got.dtype), equal_nan=True, **tol(torch.float32))


def test_caret_stays_under_the_culprit_on_lines_with_tabs():
    with pytest.raises(SourceError) as info:
        load_dsl("func f(x: f32[N]) {\n\treturn exq(x)\n}\n", "t.mc", dims={"N": 2})
    head, echoed, caret = str(info.value).split("\n")
    assert head.startswith("t.mc:2:9: error: unknown function 'exq'")
    assert echoed.index("exq") == caret.index("^")


# ------------------------------------------------------------------ errors: exact positions

ERROR_CASES = [
    # (id, source, load_dsl kwargs, line, col, message fragment)
    ("syntax-eol", "func f(x: f32[N]) {\n  y = x +\n  return y\n}\n", {}, 2, 10,
     "unexpected end of line: expected an expression"),
    ("syntax-token", "func f(x: f32[N]) {\n  y = x x\n  return y\n}\n", {}, 2, 9,
     "unexpected name 'x': expected an operator"),
    ("syntax-char", "func f(x: f32[N]) {\n  return x $ 1\n}\n", {}, 2, 12, "unexpected character '$'"),
    ("syntax-eof", "func f(x: f32[N]) {\n  return x\n", {}, 2, 11, "unexpected end of file: expected 'return', '}'"),
    ("syntax-chained-compare", "func f(x: f32[N]) {\n  return x < 1 < 2\n}\n", {}, 2, 16, "unexpected '<'"),
    ("syntax-kw-order", "func f(x: f32[N]) {\n  return sum(axis=0, x)\n}\n", {}, 2, 22,
     "positional argument after a keyword argument"),
    ("dead-code", "func f(x: f32[N]) {\n  return x\n  y = x\n}\n", {}, 3, 3, "statement after 'return' is never run"),
    ("unknown-name", "func f(x: f32[N]) {\n  return exp(xx) * 2\n}\n", {"dims": {"N": 4}}, 2, 14,
     "unknown name 'xx' (did you mean 'x'?)"),
    ("unknown-function", "func f(x: f32[N]) {\n  return x + sofmax(x)\n}\n", {"dims": {"N": 4}}, 2, 14,
     "unknown function 'sofmax' (did you mean 'softmax'?"),  # the near names after it grow with the builtins
    ("too-many-args", "func f(x: f32[N]) {\n  return exp(x, x)\n}\n", {"dims": {"N": 4}}, 2, 17,
     "exp() takes 1 argument (x), got 2"),
    ("missing-arg", "func f(x: f32[N]) {\n  return 1 + softmax(axis=0)\n}\n", {"dims": {"N": 4}}, 2, 14,
     "softmax() is missing argument 'x'"),
    ("unknown-keyword", "func f(x: f32[N]) {\n  return sum(x, dim=0)\n}\n", {"dims": {"N": 4}}, 2, 17,
     "sum() has no argument named 'dim' (its arguments: x, axis, keepdim)"),
    ("bad-argument", "func f(x: f32[N]) {\n  return sum(x, axis=1.5)\n}\n", {"dims": {"N": 4}}, 2, 17,
     "argument 'axis' of sum() must be an int or a list of ints, got float 1.5"),
    ("bad-string", 'func f(x: f32[N]) {\n  return x + "a"\n}\n', {"dims": {"N": 4}}, 2, 14, 'expected a tensor or a number, got string "a"'),
    ("shape-mismatch", "func f(x: f32[M, N], y: f32[M, K]) {\n  s = exp(x)\n  return s + y\n}\n",
     {"dims": {"M": 4, "N": 8, "K": 5}}, 3, 12, "shapes f32[4, 8] and f32[4, 5] do not broadcast (dimension -1: 5 vs 8)"),
    ("matmul-shape", "func f(x: f32[M, N], y: f32[M, N]) {\n  return x @ y\n}\n", {"dims": {"M": 4, "N": 8}}, 2, 12,
     "cannot apply '@' to f32[4, 8] and f32[4, 8]"),
    ("call-shape", "func f(x: f32[M, N], w: f32[M, M]) {\n  return linear(x, w)\n}\n", {"dims": {"M": 4, "N": 8}},
     2, 10, "linear(f32[4, 8], f32[4, 4]): "),
    ("reshape-numel", "func f(x: f32[M, N]) {\n  return reshape(x, [3, -1])\n}\n", {"dims": {"M": 4, "N": 5}}, 2, 10,
     "reshape(f32[4, 5], list [int 3, int -1]): shape '[3, -1]' is invalid for input of size 20"),
    ("axis-range", "func f(x: f32[M, N]) {\n  return softmax(x, axis=2)\n}\n", {"dims": {"M": 4, "N": 5}}, 2, 10,
     "axis 2 is out of range for a tensor of rank 2"),
    ("dtype-matmul", "func f(x: f32[M, N], y: bf16[N, M]) {\n  return x @ y\n}\n", {"dims": {"M": 4, "N": 8}}, 2, 12,
     "matmul needs operands of one dtype, got a: f32[4, 8], b: bf16[8, 4] (insert a cast)"),
    ("return-dtype", "func f(x: f32[M, N]) -> bf16[M, N] {\n  y = exp(x)\n  return y\n}\n",
     {"dims": {"M": 4, "N": 8}}, 3, 10,
     "'f' returns f32[4, 8], but its declared return type is bf16[M, N] = bf16[4, 8] (dtype f32 is not bf16)"),
    ("return-shape", "func f(x: f32[M, N]) -> f32[M, N] {\n  return sum(x, axis=1, keepdim=true)\n}\n",
     {"dims": {"M": 4, "N": 8}}, 2, 10,
     "'f' returns f32[4, 1], but its declared return type is f32[M, N] = f32[4, 8]"),
    ("return-count", "func f(x: f32[N]) -> f32[N], f32[N] {\n  return x\n}\n", {"dims": {"N": 8}}, 2, 3,
     "'f' declares 2 return value(s) but returns 1"),
    ("no-return", "func f(x: f32[N]) {\n  y = x\n}\n", {"dims": {"N": 8}}, 1, 6, "function 'f' ends without 'return'"),
    ("unbound-symbol", "func f(x: f32[M, N], w: f32[N]) {\n  return x * w\n}\n", {"dims": {"N": 8}}, 1, 15,
     "unbound symbol M: give example inputs or --dim M=VALUE"),
    ("inconsistent-symbol", "func f(x: f32[M, N], y: f32[M, N]) {\n  return x + y\n}\n",
     {"example_inputs": [rand(4, 8), rand(5, 8)]}, 1, 29,
     "symbol M is bound inconsistently: M=4 from dim 0 of 'x', but M=5 from dim 0 of 'y'"),
    ("inconsistent-dim-flag", "func f(x: f32[M, N]) {\n  return x\n}\n",
     {"dims": {"M": 3}, "example_inputs": [rand(4, 8)]}, 1, 15,
     "symbol M is bound inconsistently: M=3 from --dim, but M=4 from dim 0 of 'x'"),
    ("example-dtype", "func f(x: f32[M, N]) {\n  return x\n}\n", {"example_inputs": [rand(4, 8, dtype=torch.bfloat16)]},
     1, 11, "example input 'x' is bf16[4, 8], but 'x' is declared f32[M, N] (dtype bf16 is not f32)"),
    ("example-count", "func f(x: f32[M, N]) {\n  return x\n}\n", {"example_inputs": []}, 1, 6,
     "'f' takes 1 input(s) (x), got 0 example input(s)"),
    ("unknown-dim-flag", "func f(x: f32[M]) {\n  return x\n}\n", {"dims": {"M": 2, "K": 3}}, 1, 6,
     "--dim K=3: 'f' has no symbol K (its symbols: M)"),
    ("duplicate-function", "func f(x: f32[N]) {\n  return x\n}\n\nfunc f(x: f32[N]) {\n  return x\n}\n", {}, 5, 6,
     "function 'f' is already defined at line 1"),
    ("duplicate-param", "func f(x: f32[N], x: f32[N]) {\n  return x\n}\n", {}, 1, 19, "parameter 'x' declared twice"),
    ("unknown-dtype", "func f(x: f33[N]) {\n  return x\n}\n", {}, 1, 11, "unknown dtype 'f33' (known: f32, f16, bf16"),
    ("float-dim", "func f(x: f32[2.5]) {\n  return x\n}\n", {}, 1, 15, "a dimension must be an integer or a symbol"),
    ("recursion", "func f(x: f32[N]) {\n  return f(x)\n}\n", {"dims": {"N": 2}}, 2, 10, "'f' calls itself"),
    ("callee-argument", "func g(t: f32[K, K]) {\n  return t\n}\nfunc f(x: f32[M, N]) {\n  return g(x)\n}\n",
     {"dims": {"M": 2, "N": 3}}, 5, 12, "argument 't' of 'g' must be f32[K, K], got f32[2, 3]: symbol K is bound inconsistently: "
     "K=2 from dim 0 of argument 't', but K=3 from dim 1 of argument 't'"),
    ("callee-arity", "func g(t: f32[K]) {\n  return t\n}\nfunc f(x: f32[M]) {\n  return g(x, x)\n}\n",
     {"dims": {"M": 2}}, 5, 15, "g() takes 1 argument (t), got 2"),
    ("inside-callee", "func g(t: f32[K]) {\n  return t @ t @ t\n}\nfunc f(x: f32[M]) {\n  return g(x)\n}\n",
     {"dims": {"M": 2}}, 2, 12,
     "matmul needs tensors of rank 1 or more, got f32[] (in 'g', called at line 5)"),
    ("tuple-as-value", "func g(t: f32[K]) {\n  return t, t\n}\nfunc f(x: f32[M]) {\n  return g(x) + 1\n}\n",
     {"dims": {"M": 2}}, 5, 10, "this returns 2 values; assign them first"),
    ("unpack-count", "func f(x: f32[M]) {\n  a, b = x\n  return a\n}\n", {"dims": {"M": 2}}, 2, 3,
     "cannot assign 1 value(s) to 2 names"),
    ("floordiv-tensor", "func f(x: f32[M]) {\n  return x // 2\n}\n", {"dims": {"M": 2}}, 2, 12,
     "'//' divides integers known at compile time"),
    ("return-non-tensor", "func f(x: f32[M]) {\n  return [x]\n}\n", {"dims": {"M": 2}}, 2, 10,
     "a function returns tensors or numbers, not list [f32[2]]"),
    ("gelu-approximate", 'func f(x: f32[M]) {\n  return gelu(x, approximate="fast")\n}\n', {"dims": {"M": 2}}, 2, 18,
     'approximate must be "none" or "tanh", got "fast"'),
    ("empty-file", "# nothing here\n", {}, 1, 1, "this file defines no function"),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_point_at_the_culprit(case):
    _, src, kwargs, line, col, fragment = case
    with pytest.raises(SourceError) as info:
        load_dsl(src, "prog.mc", **kwargs)
    err = info.value
    head, echoed, caret = str(err).split("\n")
    assert head.startswith(f"prog.mc:{line}:{col}: error: "), head
    assert fragment in head, head
    assert echoed == "    " + src.splitlines()[line - 1]
    assert caret == "    " + " " * (col - 1) + "^"
    assert (err.file, err.line, err.col) == ("prog.mc", line, col)


# ------------------------------------------------------------------ errors through the CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minicomp.cli", "compile", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


CLI_CASES = [
    # (id, source, extra flags, line, col, message fragment)
    ("syntax", "func f(x: f32[M]) {\n  return x +* 2\n}\n", ["--dim", "M=4"], 2, 13, "unexpected '*': expected an expression"),
    ("shape", "func f(x: f32[M, N], y: f32[N, N]) {\n  return x + y\n}\n", ["--dim", "M=4", "--dim", "N=8"], 2, 12,
     "do not broadcast"),
    ("dtype", "func f(x: f32[M, N], y: bf16[N, M]) {\n  return x @ y\n}\n", ["--dim", "M=4", "--dim", "N=8"], 2, 12,
     "matmul needs operands of one dtype"),
    # a dump plans over symbols (tests/test_symbolic.py); running needs every size
    ("unbound", "func f(x: f32[M, N]) {\n  return x\n}\n", ["--dim", "M=4", "--check"], 1, 18, "--dim N=VALUE"),
    ("entry", "func g(x: f32[M]) {\n  return exp(x, x)\n}\nfunc f(x: f32[M]) {\n  return x\n}\n",
     ["--entry", "g", "--dim", "M=4"], 2, 17, "exp() takes 1 argument"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_reports_dsl_errors_with_position_and_caret(case, tmp_path):
    _, src, flags, line, col, fragment = case
    path = tmp_path / "prog.mc"
    path.write_text(src)
    r = run_cli(str(path), "--dump-ir", *flags)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{path}:{line}:{col}: error: " in r.stderr and fragment in r.stderr
    assert "    " + src.splitlines()[line - 1] + "\n" in r.stderr
    assert "\n    " + " " * (col - 1) + "^" in r.stderr

"""Bad input, each kind with a test: what a user can get wrong, and awkward but valid data.

Every user error is a `MinicompError` (one paragraph, no traceback in the CLI, naming
where: `file:line:col` with a caret for source errors, the input's name for call-time
errors). Awkward data — strided views, zero-size dimensions, NaN and inf, integer and
bool tensors — compiles and agrees with eager exactly as eager would have it (NaN where
eager has NaN), or runs a visible PyTorch fallback. `docs/bad_input.md` is the table of
these cases; each row names its test here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

import minicomp
from minicomp.api import compile_graph
from minicomp.cli import main
from minicomp.errors import GuardError, MinicompError, SourceError
from minicomp.frontend.dsl import load_dsl

NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "cache"))


def same_as_eager(fn, *inputs, exact: bool = False):
    """Compile fn, run it on inputs, and compare every output with eager (NaN where eager has NaN)."""
    compiled = minicomp.compile(fn)
    got, want = compiled(*inputs), fn(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        exact_here = exact and b.dtype != torch.float64     # f64: rounding still differs in the last bit
        tolerance = dict(atol=0, rtol=0) if exact_here else tol(b.dtype)
        if b.dtype == torch.float64 and not exact_here:
            tolerance = dict(atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(a, b, equal_nan=True, **tolerance)
    return compiled


def dsl_error(source: str, **kw) -> SourceError:
    with pytest.raises(SourceError) as e:
        load_dsl(source, "bad.mc", **kw)
    return e.value


# ----------------------------------------------------------------------------- DSL syntax errors

@pytest.mark.parametrize("body, where, words", [
    ("  return x + 1\n", (2, 15), "unexpected end of file"),                # missing closing brace
    ("  return x $ 1\n}\n", (2, 12), "unexpected character '$'"),
    ("  return x < 1 < 2\n}\n", (2, 16), "unexpected '<'"),                  # comparisons do not chain
    ("  y = = x\n  return y\n}\n", (2, 7), "unexpected '='"),
])
def test_dsl_syntax_error_points_at_the_culprit(body, where, words):
    err = dsl_error("func f(x: f32[4]) -> f32[4] {\n" + body)
    assert (err.line, err.col) == where and words in err.message
    text = str(err)
    assert text.startswith(f"bad.mc:{where[0]}:{where[1]}: error:") and text.splitlines()[-1].strip() == "^"


def test_dsl_syntax_error_in_the_cli_is_one_paragraph(tmp_path, capsys):
    f = tmp_path / "bad.mc"
    f.write_text("func f(x: f32[4]) -> f32[4] {\n  return x $ 1\n}\n")
    assert main(["compile", str(f)]) == 1
    err = capsys.readouterr().err
    assert "bad.mc:2:12: error: unexpected character '$'" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- unknown ops and names

@pytest.mark.parametrize("expr, words", [
    ("frobnicate(x)", "unknown function 'frobnicate'"),
    ("sigmod(x)", "unknown function 'sigmod' (did you mean 'sigmoid'?"),
    ("x + y", "unknown name 'y'"),
])
def test_dsl_unknown_function_or_name(expr, words):
    err = dsl_error(f"func f(x: f32[4]) -> f32[4] {{\n  return {expr}\n}}\n")
    assert err.line == 2 and words in err.message


def test_dsl_unknown_dtype_lists_the_known_ones():
    err = dsl_error("func f(x: f33[4]) -> f32[4] {\n  return x\n}\n")
    assert (err.line, err.col) == (1, 11) and "unknown dtype 'f33'" in err.message and "bf16" in err.message


def test_python_op_minicomp_cannot_compile_runs_through_pytorch_visibly(capsys, tmp_path):
    # cumsum compiles to a scan kernel now: kthvalue is the op without a kernel
    c = same_as_eager(lambda x: torch.kthvalue(x, 2, 0).values * 2 + 1, torch.randn(7, 3))
    assert "opaque" in c.plan.kinds()
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef f(x):\n    return torch.kthvalue(x, 2, 0).values * 2\n\n"
                     "def example_inputs():\n    return [torch.randn(5, 3)]\n")
    assert main(["compile", str(model), "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert "run through PyTorch" in out.err and "aten.kthvalue" in out.err and "model.py:4" in out.err


# ----------------------------------------------------------------------------- shape and dtype mismatches

@pytest.mark.parametrize("sig, expr, words", [
    ("x: f32[4], y: f32[3]", "x + y", "shapes f32[4] and f32[3] do not broadcast"),
    ("x: f32[4, 5], y: f32[3, 2]", "x @ y", "must have same reduction dim"),
    ("x: f32[4, 5], y: f16[5, 4]", "x @ y", "matmul needs operands of one dtype"),
])
def test_dsl_shape_and_dtype_mismatch(sig, expr, words):
    err = dsl_error(f"func f({sig}) -> f32[4] {{\n  return {expr}\n}}\n")
    assert (err.line, err.col) == (2, 12) and words in err.message


def test_dsl_declared_types_are_checked_against_the_body_and_the_inputs():
    err = dsl_error("func f(x: f32[4]) -> f16[4] {\n  return x\n}\n")
    assert "declared return type is f16[4] (dtype f32 is not f16)" in err.message
    err = dsl_error("func f(x: f32[4]) -> f32[4] {\n  return x\n}\n", example_inputs=[torch.randn(5)])
    assert "example input 'x' is f32[5], but 'x' is declared f32[4]" in err.message
    err = dsl_error("func f(x: f32[N], y: f32[N]) -> f32[N] {\n  return x + y\n}\n",
                    example_inputs=[torch.randn(4), torch.randn(5)])
    assert "symbol N is bound inconsistently" in err.message


@pytest.mark.parametrize("fn, inputs, words", [
    (lambda a, b: a + b, (torch.randn(4, 5), torch.randn(3)), "broadcast"),
    (lambda a, b: a @ b, (torch.randn(4, 5), torch.randn(3, 2)), "same reduction dim"),
    (lambda a, b: a @ b, (torch.randn(4, 5), torch.randn(5, 2).half()), "matmul expects operands of one dtype"),
    (lambda a, b: F.linear(a, b), (torch.randn(2, 3), torch.randn(4, 3).double()), "linear expects operands"),
    (lambda a, b: F.linear(a, b), (torch.randn(2, 3), torch.randn(4, 5)), "cannot be multiplied"),
    (lambda a, b: a @ b, (torch.randn(2, 4, 5), torch.randn(3, 5, 2)), "broadcast"),
])
def test_python_shape_and_dtype_mismatch_is_refused_at_capture_at_the_users_line(fn, inputs, words):
    with pytest.raises(SourceError) as e:
        minicomp.compile(fn)(*inputs)
    assert words in str(e.value) and e.value.file.endswith("test_bad_input.py")


def test_python_model_error_in_the_cli_has_no_traceback(tmp_path, capfd):
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef f(x, w):\n    return x + w\n\n"
                     "def example_inputs():\n    return [torch.randn(4, 5), torch.randn(3)]\n")
    assert main(["compile", str(model)]) == 1
    err = capfd.readouterr().err
    assert "model.py:4:12: error: capturing f failed" in err
    assert "Traceback" not in err and "fake_tensor" not in err   # torch's own log stays quiet


# ----------------------------------------------------------------------------- call-time arguments

def test_compiled_function_wrong_number_of_arguments():
    f = minicomp.compile(lambda a, b: a * b)
    with pytest.raises(MinicompError, match="missing 1 required positional argument: 'b'"):
        f(torch.randn(3))
    with pytest.raises(MinicompError, match="takes 2 positional arguments but 3 were given"):
        f(torch.randn(3), torch.randn(3), torch.randn(3))


def test_compiled_function_given_a_non_tensor_goes_through_dynamo():
    # used to be refused (GuardError); a Python value is valid PyTorch that Dynamo guards
    f = minicomp.compile(lambda a, b: a * b)
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="called with argument 1 = 2.0; minicomp's own capture takes tensors"):
        torch.testing.assert_close(f(x, 2.0), x * 2.0)
    g = minicomp.compile(lambda a, b: a * b)
    with pytest.warns(UserWarning, match=r"argument 1\[0\] = a str"), \
            pytest.raises(MinicompError, match=r"test_bad_input.py:\d+:\d+: error: running <lambda> through Dynamo failed"):
        g(x, ["x"])                           # the user's own error, at the user's line


def test_compiled_function_nested_arguments_keep_their_structure():
    # regression: f(x, [y, z]) used to be captured as f(x, y, z) and gave a wrong answer
    f = lambda a, b: a * b[0] + b[1]   # noqa: E731
    x, y, z = torch.randn(5), torch.randn(5), torch.randn(5)
    compiled = same_as_eager(f, x, [y, z])
    torch.testing.assert_close(compiled(x, (z, y)), f(x, (z, y)))
    torch.testing.assert_close(minicomp.compile(lambda d: d["a"] - d["b"])({"a": x, "b": y}), x - y)


def test_keyword_arguments_are_taken_at_the_call():
    # used to be refused (GuardError); see tests/test_call_arguments.py
    f = minicomp.compile(lambda a, b: a * b)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(f(x, b=y), x * y)
    assert f.refused is None


def test_unknown_compile_options_are_named():
    with pytest.raises(MinicompError, match=r"unknown option\(s\) pases; known: .*passes"):
        minicomp.compile(lambda a: a, pases=["cse"])


def test_inputs_that_require_grad_give_eager_values_and_gradients():
    x = torch.randn(4, requires_grad=True)
    out = minicomp.compile(lambda a: torch.tanh(a) * 2)(x)
    torch.testing.assert_close(out, torch.tanh(x) * 2)
    assert out.requires_grad                        # kernels forward, PyTorch's backward (tests/test_weights.py)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * (1 - torch.tanh(x.detach()) ** 2))


def test_compiled_call_guards_count_shape_dtype_and_type():
    x = torch.randn(4, 3)
    graph = load_dsl("func f(x: f32[4, 3]) -> f32[4, 3] {\n  return x * 2\n}\n", "f.mc")
    call = compile_graph(graph, [x]).call
    torch.testing.assert_close(call(x)[0], x * 2)
    with pytest.raises(GuardError, match=r"f takes 1 input\(s\) \(x\), got 2"):
        call(x, x)
    with pytest.raises(GuardError, match=r"input 'x' must be f32\[4, 3\], got f32\[3, 4\]"):
        call(x.t().contiguous())
    with pytest.raises(GuardError, match=r"input 'x' must be f32\[4, 3\], got f64\[4, 3\]"):
        call(x.double())
    with pytest.raises(GuardError, match="input 'x' must be a torch.Tensor, got list"):
        call(x.tolist())


def test_repeated_calls_take_the_fast_path_only_for_identical_layouts():
    """A call whose tensors match an earlier call's exactly skips flattening and guards; any
    difference in shape, dtype or strides goes through the full signature path again."""
    f = minicomp.compile(lambda a, b: (a * b, a.sum(-1)))
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    for _ in range(2):
        out = f(x, y)
        assert isinstance(out, tuple) and len(out) == 2       # the output structure survives the fast path
        torch.testing.assert_close(out[0], x * y)
    assert len(f._cache) == 1 and len(f._fast) == 1 and len(next(iter(f._fast.values()))[0].checks) == 1
    x2 = torch.randn(4, 6)
    torch.testing.assert_close(f(x2, y)[1], x2.sum(-1))      # new data, same layout: fast, and right
    assert len(f._cache) == 1
    xt = torch.randn(6, 4).t()                                # same shape, transposed strides
    torch.testing.assert_close(f(xt, y)[0], xt * y)
    torch.testing.assert_close(f(x.double(), y.double())[0], x.double() * y.double())
    assert len(f._cache) == 3 and sum(len(s.checks) for s in {id(s): s for v in f._fast.values() for s in v}.values()) == 3
    with pytest.warns(UserWarning, match="through Dynamo"):
        torch.testing.assert_close(f(x, 2.0)[0], x * 2.0)    # a Python value: through Dynamo from now on


# ----------------------------------------------------------------------------- devices

def test_meta_tensors_are_refused_with_a_clear_error():
    with pytest.raises(GuardError, match="tensor argument 0 is on device meta; minicomp runs kernels on cuda"):
        minicomp.compile(lambda a: a * 2)(torch.randn(4, device="meta"))


def test_mixed_devices_are_a_guard_error():
    with pytest.raises(GuardError, match=r"several devices \(cpu, meta\)"):
        minicomp.compile(lambda a, b: a * b)(torch.randn(4), torch.randn(4, device="meta"))


def test_call_compiled_for_cpu_refuses_another_device():
    x = torch.randn(4)
    graph = load_dsl("func f(x: f32[4]) -> f32[4] {\n  return x * 2\n}\n", "f.mc")
    call = compile_graph(graph, [x]).call
    with pytest.raises(GuardError, match="input 'x' is on meta, but this call was compiled for cpu"):
        call(torch.randn(4, device="meta"))


# ----------------------------------------------------------------------------- strided inputs: correct, not refused

def _strided(shape):
    """Every other column of a wider tensor: not contiguous, with a storage offset."""
    wide = torch.randn(shape[:-1] + (2 * shape[-1] + 1,))
    return wide[..., 1::2]


@pytest.mark.parametrize("make", [
    lambda: torch.randn(7, 5).t(),                          # transposed
    lambda: _strided((5, 7)),                               # step 2 and an offset
    lambda: torch.randn(9, 7)[2:7],                         # rows of a bigger tensor
    lambda: torch.randn(1, 7).expand(5, 7),                 # stride 0
    lambda: torch.randn(7, 3, 5).permute(1, 2, 0)[1:],      # permuted 3-D, then sliced
], ids=["transposed", "step", "offset", "expanded", "permuted"])
@pytest.mark.parametrize("fn", [
    lambda x: torch.exp(x) * 2 - 1,
    lambda x: x.sum(-1, keepdim=True) + x.amax(0),
    lambda x: torch.softmax(x, -1),
    lambda x: F.layer_norm(x, x.shape[-1:]),
], ids=["pointwise", "reductions", "softmax", "layernorm"])
def test_strided_inputs_give_eager_results(make, fn):
    same_as_eager(fn, make())


def test_strided_matmul_operands():
    a, b = torch.randn(7, 5).t(), _strided((7, 6))
    same_as_eager(lambda a, b: torch.relu(a @ b), a, b)


def test_dsl_call_with_strided_input_after_compiling_for_contiguous():
    x = torch.randn(4, 3)
    graph = load_dsl("func f(x: f32[4, 3]) -> f32[4, 3] {\n  return softmax(x, axis=0)\n}\n", "f.mc")
    call = compile_graph(graph, [x]).call
    y = torch.randn(3, 4).t()
    torch.testing.assert_close(call(y)[0], torch.softmax(y, 0))


# ----------------------------------------------------------------------------- zero-size dimensions

@pytest.mark.parametrize("fn, shapes", [
    (lambda x: torch.exp(x) + 1, [(0, 5)]),
    (lambda x: torch.softmax(x, -1), [(0, 4)]),
    (lambda x: torch.softmax(x, -1), [(3, 0)]),
    (lambda x: F.layer_norm(x, (4,)), [(0, 4)]),
    (lambda x: x.sum(-1), [(4, 0)]),                         # sum over nothing: zeros
    (lambda x: x.mean(0, keepdim=True), [(0, 4)]),           # mean over nothing: NaN
    (lambda a, b: a @ b, [(0, 4), (4, 3)]),                  # empty result
    (lambda a, b: a @ b, [(4, 0), (0, 3)]),                  # K = 0: zeros
    (lambda a, b: a + b, [(2, 0, 3), (3,)]),
], ids=["pointwise", "softmax-rows", "softmax-cols", "layernorm", "sum-empty-axis", "mean-empty-axis",
        "matmul-m0", "matmul-k0", "broadcast"])
def test_zero_size_dimensions(fn, shapes):
    same_as_eager(fn, *[torch.randn(s) for s in shapes])


def test_zero_size_reduction_without_identity_fails_like_eager():
    with pytest.raises(SourceError, match="zero-size dimension"):
        minicomp.compile(lambda x: x.amax(-1))(torch.randn(4, 0))
    for fn in (lambda x: torch.max(x, 0), lambda x: torch.min(x, -1, keepdim=True)):
        # an empty result: aten's meta kernel accepts it, eager's kernels do not
        with pytest.raises(MinicompError, match="non-zero size"):
            minicomp.compile(fn)(torch.randn(0, 0))


def test_zero_size_from_a_dsl_dimension():
    x = torch.randn(0, 6)
    graph = load_dsl("func f(x: f32[N, C]) -> f32[N, C] {\n  return softmax(x) * 2.0\n}\n", "f.mc",
                     example_inputs=[x])
    out = compile_graph(graph, [x]).call(x)[0]
    assert out.shape == (0, 6)


# ----------------------------------------------------------------------------- NaN and inf as eager has them

def _special(rows: int, cols: int) -> torch.Tensor:
    x = torch.randn(rows, cols)
    x[0, 1], x[-1, 0] = NAN, INF
    x[1 % rows, cols - 1] = -INF
    return x


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.relu(x),
    lambda x, y: torch.maximum(x, y),
    lambda x, y: torch.minimum(x, y),
    lambda x, y: torch.clamp(x, -0.5, 0.5),
    lambda x, y: x.amax(-1),
    lambda x, y: x.amin(0, keepdim=True),
    lambda x, y: x.amax(),
    lambda x, y: (x.sum(-1), x.mean(0), x.var(-1)),
    lambda x, y: x / (y - y),                                # division by zero: inf, -inf, NaN
    lambda x, y: (torch.log(x), torch.sqrt(x), torch.exp(x * 100)),
    lambda x, y: x - x,                                      # inf - inf
    lambda x, y: torch.where(x > 0, x, y),                   # NaN > 0 is false
], ids=["relu", "maximum", "minimum", "clamp", "amax", "amin", "amax-all", "sum-mean-var", "div0",
        "log-sqrt-exp", "inf-inf", "where"])
def test_nan_and_inf_propagate_as_in_eager(fn):
    x = _special(6, 9)
    y = torch.randn(9)
    y[2] = NAN
    same_as_eager(fn, x, y)


def test_nan_in_long_rows_looped_kernel():
    x = torch.randn(2, 9000)           # longer than one tile: the looped row kernel
    x[0, 8500] = NAN
    same_as_eager(lambda x: (x.amax(-1), torch.softmax(x, -1), x.amin(-1)), x)


def test_softmax_of_rows_of_minus_inf():
    x = torch.tensor([[-INF, -INF, -INF], [1.0, -INF, 2.0], [-INF, 0.0, -INF]])
    same_as_eager(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)), x)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    same_as_eager(lambda s: torch.softmax(torch.where(mask, s, -INF), -1), torch.randn(2, 3, 3))


def test_softmax_of_a_single_element_and_all_ones_shapes():
    # regression: a one-element output computed as a block crashed tl.store
    same_as_eager(lambda x: torch.softmax(x, 0), torch.randn(1, 1))
    same_as_eager(lambda x: (x.amax(-1, keepdim=True), x.sum()), torch.randn(1, 1, 1))


# ----------------------------------------------------------------------------- integer and bool tensors

@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b: a + b * 2 - 1, (torch.arange(-6, 6, dtype=torch.int32), torch.arange(12, dtype=torch.int32))),
    (lambda a, b: a / b, (torch.arange(12), torch.arange(1, 13))),                     # true division: f32
    (lambda a: (a.sum(-1), a.amax(0), a.amin(-1, keepdim=True)), (torch.randint(-9, 9, (3, 5)),)),
    (lambda a: torch.abs(a) * a, (torch.randint(-9, 9, (7,), dtype=torch.int8),)),
    (lambda a: a * a, (torch.tensor([2**31 - 1, 70000, -3], dtype=torch.int32),)),      # wraps like eager
    (lambda a: a + 250, (torch.arange(10, dtype=torch.uint8),)),
    (lambda a, b: ((a & b) | ~a, torch.logical_xor(a, b)), (torch.rand(9) < 0.5, torch.rand(9) < 0.5)),
    (lambda a: (a.sum(), a.float().mean()), (torch.rand(3, 4) < 0.5,)),
    (lambda a, b: torch.where(a > 0, a, b) + (a == b).to(torch.int64), (torch.randint(-3, 3, (6,)),
                                                                         torch.randint(-3, 3, (6,)))),
    (lambda a: torch.softmax(a, -1) * 2, (torch.randn(3, 5, dtype=torch.float64),)),
    (lambda a, b: (a // b, a % b, torch.fmod(a, b)), (torch.arange(-6, 6), torch.tensor([4, -4, 3] * 4))),
    (lambda a: (a * 2**31, a * 300, a < 300), (torch.arange(-6, 6, dtype=torch.int32),)),   # scalars wrap first
    (lambda a, b: (a << b, a >> b), (torch.arange(-6, 6), torch.arange(-1, 71, 6))),         # past the width
    (lambda a: torch.pow(a, 87), (torch.arange(-6, 6, dtype=torch.int32),)),
    (lambda a, b: (a + b, a * b), (torch.rand(9) < 0.5, torch.rand(9) < 0.5)),               # or, and
], ids=["int32-arith", "int-true-div", "int64-reductions", "int8", "int32-overflow", "uint8-wrap", "bool-logic",
        "bool-sum", "int-where-compare", "f64-softmax", "floordiv-remainder", "int-scalar-wraps", "shifts",
        "int-pow", "bool-arith"])
def test_integer_bool_and_f64_tensors_compile(fn, inputs):
    c = same_as_eager(fn, *inputs, exact=True)
    fallbacks = c._need().generated.fallbacks
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("fn, inputs, why", [
    (lambda a, b: a @ b, (torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))), "matmul of torch.int64"),
    (lambda a: a * 2, (torch.randn(4, dtype=torch.complex64),), "complex64 has no Triton type"),
], ids=["int-matmul", "complex"])
def test_integer_cases_without_kernels_fall_back_visibly(fn, inputs, why):
    c = same_as_eager(fn, *inputs, exact=True)
    reasons = [c._need().generated.fallbacks.get(g.id, "") for g in c.plan.groups] + [g.kind for g in c.plan.groups]
    assert any(why in r for r in reasons), reasons
    assert "runs through PyTorch" in c.explain() or "opaque" in c.explain()


def test_cli_lists_groups_that_fall_back(tmp_path, capsys):
    model = tmp_path / "intmm.py"
    model.write_text("import torch\n\ndef f(x, w):\n    return x @ w\n\n"
                     "def example_inputs():\n    return [torch.randint(-5, 5, (4, 5)), torch.randint(-5, 5, (5, 2))]\n")
    assert main(["compile", str(model), "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert "runs through PyTorch" in out.err and "matmul of torch.int64 x torch.int64" in out.err
    assert "compiled kernels agree with eager" in out.out


def test_zero_dimensional_and_identity_graphs():
    same_as_eager(lambda a: a * 2 + math.pi, torch.tensor(3.0))
    same_as_eager(lambda a: a, torch.randn(3))                    # no group at all: the input is the output


def test_docs_table_names_only_tests_that_exist():
    here = Path(__file__).resolve().parent
    doc = (here.parent / "docs" / "bad_input.md").read_text()
    named = set(re.findall(r"`(?:tests/\w+\.py::)?(test_\w+)", doc))
    source = "".join(f.read_text() for f in sorted(here.glob("test_*.py")))
    assert len(named) > 30 and not [n for n in named if f"def {n}(" not in source]


def test_strides_of_size_one_dims_do_not_recompile_and_stay_correct():
    f = minicomp.compile(lambda a, b: a * b + 1)
    y = torch.randn(1, 4, 3)
    x = torch.randn(1, 4, 3)
    x_t = torch.randn(4, 1, 3).transpose(0, 1)      # same shape, stride 3 (not 12) on the size-1 dim
    torch.testing.assert_close(f(x, y), x * y + 1)
    torch.testing.assert_close(f(x_t, y), x_t * y + 1)
    assert len(f._cache) == 1


def _sdpa_with(q, k, v, m):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.parametrize("mask", [torch.zeros(8), torch.zeros(3, 8, 8), torch.zeros(8, 8, dtype=torch.float16)],
                         ids=["1-d", "does-not-broadcast", "other-dtype"])
def test_an_attention_mask_eager_refuses_is_refused_at_capture(mask):
    """The eager tracer hands the user's own error to make_fx, whose stand-in used to accept
    any mask: a 1-D mask eager rejects was compiled and gave an answer."""
    q = k = v = torch.randn(2, 4, 8, 16)
    with pytest.raises(Exception):
        _sdpa_with(q, k, v, mask)
    with pytest.raises(minicomp.MinicompError, match="capturing _sdpa_with failed"):
        minicomp.compile(_sdpa_with)(q, k, v, mask)

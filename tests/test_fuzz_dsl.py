"""The DSL frontend never crashes: fuzzing in CI, one pinned test per crash class, zero dims in every op.

Fuzzing (inputs from tests/dsl_fuzz.py): every input must end in a verified graph (which
the reference interpreter then runs, when small) or in SourceError/MinicompError. CI runs
DEFAULT_EXAMPLES inputs on a fixed seed; `MINICOMP_FUZZ_EXAMPLES=20000` runs that many
(and `MINICOMP_FUZZ_SEED` picks another seed). A share of the graphs that compile is
also compiled end to end and compared with the reference interpreter.

The pinned tests below hold each crash class that fuzzing found (issue 23's 2,042-input
run and this suite's own) to its fixed behaviour; docs/bad_input.md lists them.
"""

from __future__ import annotations

import collections
import os
import random

import pytest
import torch

import dsl_fuzz
from conftest import tol
from minicomp.api import compile_graph
from minicomp.errors import MinicompError, SourceError
from minicomp.frontend.dsl import load_dsl
from minicomp.ir.interpret import random_inputs, run

DEFAULT_EXAMPLES = 300
EXAMPLES = int(os.environ.get("MINICOMP_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
SEED = int(os.environ.get("MINICOMP_FUZZ_SEED", 0))
END_TO_END = max(4, EXAMPLES // 200)       # graphs compiled and run under Triton's interpreter


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINICOMP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def _shown(case: dsl_fuzz.Case) -> str:
    text = case.text if isinstance(case.text, str) else repr(case.text)
    return f"made by {case.how}, dims {case.dims}, entry {case.entry}:\n{ascii(text[:1500])}"


def test_fuzzed_inputs_give_a_graph_or_a_minicomp_error(tmp_path):
    rng = random.Random(SEED)
    pool = dsl_fuzz.seeds()
    outcomes: collections.Counter = collections.Counter()
    crashes: dict[str, tuple[dsl_fuzz.Case, object]] = {}
    small: list = []
    for _ in range(EXAMPLES):
        case = dsl_fuzz.draw(rng, pool)
        kind, result = dsl_fuzz.judge(case, tmp_path)
        outcomes[kind] += 1
        if kind.startswith("crash"):
            crashes.setdefault(kind, (case, result))
        elif kind == "ok" and len(small) < END_TO_END and _runs_quickly(result):
            small.append((case, result))
    report = "\n\n".join(f"{kind} ({outcomes[kind]}x): {err!r}\n{_shown(case)}"
                         for kind, (case, err) in crashes.items())
    assert not crashes, f"{sum(outcomes[k] for k in crashes)} of {EXAMPLES} inputs crashed:\n{report}"
    # the fuzzer must stay useful: both valid programs and broken ones, in numbers
    assert outcomes["ok"] >= EXAMPLES // 10 and outcomes["SourceError"] >= EXAMPLES // 4, outcomes
    assert len(small) == END_TO_END, f"only {len(small)} small graphs among {outcomes['ok']} that compiled"
    for case, graph in small:
        inputs = random_inputs(graph, seed=1)
        want = run(graph.copy(), inputs)
        got = compile_graph(graph, inputs).call(*inputs)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, equal_nan=True, **tol(b.dtype), msg=lambda m: f"{m}\n{_shown(case)}")


def _runs_quickly(graph) -> bool:
    return len(graph.nx) <= 60 and sum(graph.node(n).numel for n in graph.nx.nodes) <= 4000


# ------------------------------------------------------------------ pinned crash classes

F32 = "func f(x: f32[4]) -> f32[4] {\n  return %s\n}\n"


def _error(src: str, **kw) -> SourceError:
    with pytest.raises(SourceError) as info:
        load_dsl(src, "p.mc", **kw)
    return info.value


@pytest.mark.parametrize("depth", [300, 5000])
@pytest.mark.parametrize("wrap", ["exp(%s)", "[%s]", "x - (%s)", "relu(-(%s))"])
def test_deep_nesting_is_an_error_naming_the_limit(wrap, depth):
    expr = "x"
    for _ in range(depth):
        expr = wrap % expr
    err = _error(F32 % expr)
    assert "nest deeper than 100 levels" in err.message and err.line == 2


def test_nesting_up_to_the_limit_compiles():
    expr = "x"
    for _ in range(99):  # 99 calls inside `return`'s expression: 99 levels
        expr = f"exp({expr})"
    graph = load_dsl(F32 % expr, "p.mc")
    assert sum(graph.node(n).op == "exp" for n in graph.nx.nodes) == 99


def _left_sum(x: torch.Tensor, n: int) -> torch.Tensor:
    out = x
    for _ in range(n - 1):  # as eager evaluates `x + x + ...`: left to right, in f32
        out = out + x
    return out


@pytest.mark.parametrize("expr,eager", [("(" * 5000 + "x" + ")" * 5000, lambda x: x), ("-" * 5001 + "x", lambda x: -x),
                                        (" + ".join(["x"] * 5000), lambda x: _left_sum(x, 5000))],
                         ids=["parentheses", "unary-minus", "operator-chain"])
def test_parentheses_unary_minus_and_operator_chains_of_any_length_compile(expr, eager):
    graph = load_dsl(F32 % expr, "p.mc")
    x = torch.randn(4)
    (y,) = run(graph, [x])
    torch.testing.assert_close(y, eager(x), **tol(torch.float32))


def _chain(n: int) -> str:
    funcs = [f"func f{i}(x: f32[4]) -> f32[4] {{\n  return f{i + 1}(x) + 1.0\n}}\n" for i in range(n)]
    return "".join(funcs) + f"func f{n}(x: f32[4]) -> f32[4] {{\n  return x\n}}\n"


def test_functions_calling_each_other_deeper_than_the_limit_is_an_error_naming_the_chain():
    err = _error(_chain(164), entry="f0")
    assert "nest deeper than 100 levels" in err.message and "f0 -> f1 -> f2 -> ..." in err.message


def test_a_chain_of_fifty_functions_compiles_and_adds_up():
    graph = load_dsl(_chain(50), "p.mc", entry="f0")
    x = torch.randn(4)
    torch.testing.assert_close(run(graph, [x])[0], x + 50.0)


@pytest.mark.parametrize("text,fragment", [
    ("x + 1" + "0" * 400, "does not fit in 64 bits"),
    ("x + 9223372036854775808", "the integer 9223372036854775808 does not fit in 64 bits"),
    ("x + 1e400", "the number 1e400 is too large for a float"),
    ("x * (9223372036854775807 + 1)", "integer overflow: add of 9223372036854775807, 1 does not fit in 64 bits"),
    ("x * (3037000500 * 3037000500)", "integer overflow: mul"),
    ("x * ((-9223372036854775807 - 1) // -1)", "integer overflow: -9223372036854775808 // -1"),
    ("x + abs(-9223372036854775807 - 1)", "integer overflow: abs"),
    ("x * pow(2, 1000)", "integer overflow: pow(2, 1000) does not fit in 64 bits"),  # int64 folding gave 0
    ("x + sum(full([100000, 100000, 100000, 100000, 100000], 1.0))", "would take"),
    ("x + sum(reshape(expand(reshape(x, [1, 1, 4]), [4294967296, 4294967296, 4]), [-1]))", "overflow"),
])
def test_huge_numbers_are_refused_where_they_are_written(text, fragment):
    err = _error(F32 % text)
    assert fragment in err.message and err.line == 2


def test_huge_dims_are_refused_at_the_type_or_the_binding():
    assert "dimension 100000000000000000000 does not fit" in _error(
        "func f(x: f32[100000000000000000000]) {\n  return x\n}\n").message
    assert "a dimension must fit in 64 bits" in _error("func f(x: f32[N]) {\n  return x\n}\n",
                                                       dims={"N": 2 ** 64}).message
    err = _error("func f(x: f32[N, N, N]) {\n  return x\n}\n", dims={"N": 2 ** 40})
    assert "would take" in err.message and "bytes, more than 2**63 - 1" in err.message
    # no elements, yet PyTorch's stride arithmetic overflows: random_inputs used to crash on it
    err = _error("func f(x: f32[7, N, 0]) {\n  return x\n}\n", dims={"N": 2 ** 63 - 1})
    assert "PyTorch cannot make a tensor of shape [7, 9223372036854775807, 0]: Storage size calculation overflowed" \
        in err.message


def test_huge_dims_that_fit_compile_to_a_graph_without_allocating():
    # 2**60 elements: the frontend builds a graph (shapes only); nothing is allocated
    graph = load_dsl("func f(x: f32[N, N]) {\n  return softmax(x * 2.0, axis=-1)\n}\n", "p.mc", dims={"N": 2 ** 30})
    assert graph.node(graph.outputs[0]).shape == (2 ** 30, 2 ** 30)


@pytest.mark.parametrize("src,fragment", [
    ("func f(x: i8[4]) -> i8 {\n  return 300\n}\n", "int 300 does not fit in i8"),
    ("func f(x: i8[4]) {\n  return x + full([4], 300, dtype=i8)\n}\n", "value 300 does not fit in i8"),
    ("func f(x: i32[4]) {\n  return x + full([4], nan, dtype=i32)\n}\n", "value nan does not fit in i32"),
    ("func f(x: f16[4]) {\n  return x + full([4], 1e300, dtype=f16)\n}\n", "value 1e+300 does not fit in f16"),
    ("func g(y: u8[4]) {\n  return y\n}\nfunc f(x: u8[4]) {\n  return g(-1)\n}\n", "int -1 does not fit in u8"),
])
def test_numbers_stored_into_integer_tensors_must_fit(src, fragment):
    assert fragment in _error(src, entry="f").message


@pytest.mark.parametrize("expr", ["relu(x > 0.0)", "abs(x > 0.0)", "-(x > 0.0)", "(x > 0.0) - (x < 1.0)"])
def test_ops_the_kernels_refuse_on_bool_are_refused_like_eager(expr):
    # shape inference on meta tensors accepts these; eager (and the reference interpreter) do not
    assert "b8" in _error(F32.replace(" -> f32[4]", "") % expr).message


@pytest.mark.parametrize("expr", ["pow(x, 4294967297)", "clamp(x, min=1e10)", "pow(x, 1e10)"])
def test_attributes_that_overflow_the_tensors_dtype_are_refused_like_eager(expr):
    # PyTorch converts the exponent or bound to f16 and refuses what overflows it
    err = _error("func f(x: f16[4]) {\n  return %s\n}\n" % expr)
    assert "of f16 is not supported (PyTorch: value cannot be converted to type c10::Half without overflow)" \
        in err.message


def test_a_slice_step_past_the_axis_takes_one_element():
    # a step of 2**63 - 1 used to overflow the view's strides in the reference run; Python's
    # slicing takes element 1 (eager's own x[1:5:2**63 - 1] overflows too, and comes out empty)
    graph = load_dsl("func f(x: f32[5, 3]) {\n  return slice(x, 0, 1, 5, 9223372036854775807)\n}\n", "p.mc")
    x = torch.randn(5, 3)
    assert list(range(5))[1:5:9223372036854775807] == [1]
    torch.testing.assert_close(run(graph, [x])[0], x[1:2])


def test_pow_keeps_an_integer_tensor_integer_as_eager_does():
    graph = load_dsl("func f(x: i32[5]) {\n  return pow(x, 3)\n}\n", "p.mc")
    x = torch.arange(-2, 3, dtype=torch.int32)
    (y,) = run(graph, [x])
    assert y.dtype == torch.int32 and torch.equal(y, torch.pow(x, 3))  # used to be f32


def test_head_dim_zero_attention_gives_eagers_answer():
    src = "func f(q: f32[1, 2, 3, 0], v: f32[1, 2, 3, 4]) {\n  return attention(q, q, v)\n}\n"
    graph = load_dsl(src, "p.mc")  # used to raise ZeroDivisionError (1 / sqrt(0))
    q, v = torch.randn(1, 2, 3, 0), torch.randn(1, 2, 3, 4)
    want = torch.nn.functional.scaled_dot_product_attention(q, q, v)
    torch.testing.assert_close(run(graph, [q, v])[0], want)
    torch.testing.assert_close(compile_graph(graph, [q, v]).call(q, v)[0], want)


@pytest.mark.parametrize("char", ["\x1b[31m", "\ud800", "\u202e", "\x00", "\u200b"])
def test_errors_echo_the_line_printably_with_the_caret_aligned(char):
    err = _error(F32 % f"x +{char} 1.0")
    str(err).encode("utf-8")  # a lone surrogate used to make the message unprintable
    assert all(c.isprintable() for c in err.source_line) and "\x1b" not in str(err)
    assert err.source_line[err.col - 1] == "?"  # the culprit, one column wide, under the caret


@pytest.mark.parametrize("sep", ["\x0c", "\u2028", "\x85", "\x0b"])
def test_lines_are_counted_as_the_parser_counts_them(sep):
    # str.splitlines splits at these too; lark does not: the echoed line used to be another one
    err = _error(f"# a comment with {sep} in it\nfunc f(x: f32[4]) {{\n  return x + $\n}}\n")
    assert err.line == 3 and err.source_line.strip() == "return x + $"


# ------------------------------------------------------------------ reading programs from files


def test_non_utf8_bytes_are_a_source_error_at_the_byte(tmp_path):
    from minicomp.frontend.dsl import read_program
    path = tmp_path / "bad.mc"
    path.write_bytes(b"func f(x: f32[4]) {\n  return x + \xc3\xa9 + \xff\n}\n")
    with pytest.raises(SourceError) as info:
        read_program(path)
    err = info.value
    assert (err.line, err.col) == (2, 18) and "byte 0xff" in err.message and err.source_line[err.col - 1] == "\ufffd"


def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(tmp_path):
    from minicomp.frontend.dsl import read_program
    path = tmp_path / "bom.mc"
    path.write_bytes(b"\xef\xbb\xbffunc f(x: f32[4]) {\r\n  return x * 2.0\r\n}\r\n")
    graph = load_dsl(read_program(path), str(path))
    x = torch.randn(4)
    torch.testing.assert_close(run(graph, [x])[0], 2 * x)


def test_directories_missing_files_fifos_and_huge_files_are_minicomp_errors(tmp_path):
    from minicomp.frontend.dsl import read_program
    (tmp_path / "dir.mc").mkdir()
    os.mkfifo(tmp_path / "fifo.mc")
    with open(tmp_path / "huge.mc", "wb") as f:
        f.truncate(17 * 1024 * 1024)  # sparse: no disk used
    cases = {"dir.mc": "is a directory", "none.mc": "no such file", "fifo.mc": "is not a regular file",
             "huge.mc": "may hold at most 16777216 bytes", "none/x.mc": "no such file"}
    for name, fragment in cases.items():
        with pytest.raises(MinicompError, match=fragment):
            read_program(tmp_path / name)  # the FIFO is never waited on


def test_the_cli_reports_bad_program_files_in_one_paragraph(tmp_path, capsys):
    from minicomp.cli import main
    (tmp_path / "dir.mc").mkdir()
    (tmp_path / "latin1.mc").write_bytes(b"# caf\xe9\nfunc f(x: f32[4]) {\n  return x\n}\n")
    assert main(["compile", str(tmp_path / "dir.mc"), "--dump-ir"]) == 1
    assert main(["compile", str(tmp_path / "latin1.mc"), "--dump-ir"]) == 1
    err = capsys.readouterr().err
    assert "is a directory" in err and "latin1.mc:1:6: error: the file is not UTF-8 text: byte 0xe9" in err
    assert "Traceback" not in err

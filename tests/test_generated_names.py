"""Nothing a user names is spliced into generated source as code (codegen/names.py).

Names of inputs, parameters, buffers, functions and classes, and the paths of source files,
reach a generated module as safe identifiers, as comments of one line, or as repr'd strings.
Each test here used to run attacker code, crash the module, or give a wrong answer.
"""

import builtins
import string

import pytest
import torch
import torch.nn as nn
from conftest import tol
from hypothesis import given, settings
from hypothesis import strategies as st

import minicomp
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.names import comment_text, safe_ident
from minicomp.errors import CompileError
from minicomp.frontend.dsl import load_dsl
from minicomp.api import compile_graph

PAYLOAD = '\nsetattr(__import__("builtins"), "MINICOMP_PWNED", True)\n'  # no "." (nn.Module refuses it in names)
SEPARATORS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00"]


@pytest.fixture(autouse=True)
def _not_pwned():
    yield
    assert not hasattr(builtins, "MINICOMP_PWNED"), "a name ran code inside a generated module"


class Scaled(nn.Module):
    """A module whose parameter and buffer names hold line breaks and code."""

    def __init__(self, pname: str, bname: str):
        super().__init__()
        self.register_parameter(pname, nn.Parameter(torch.randn(7)))
        self.register_buffer(bname, torch.randn(7))
        self.pname, self.bname = pname, bname

    def forward(self, x):
        return x * getattr(self, self.pname) + getattr(self, self.bname)


@pytest.mark.parametrize("sep", SEPARATORS)
def test_parameter_and_buffer_names_with_line_breaks_stay_data(sep):
    m = Scaled(f"w{sep}{PAYLOAD}#", f"b{sep}'''\"\"\"{{x}}{sep}raise SystemExit(3)")
    x = torch.randn(3, 7)
    got = minicomp.compile(m)(x)
    torch.testing.assert_close(got, m(x), **tol(torch.float32))


def test_function_and_class_names_stay_data():
    def f(x, y):
        return torch.relu(x - y)
    f.__name__ = f.__qualname__ = f'f"""{PAYLOAD}'
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    compiled = minicomp.compile(f)
    torch.testing.assert_close(compiled(x, y), f(x, y))
    with pytest.raises(minicomp.MinicompError):
        compiled.compile_for(x)       # a wrong call: the message names the function, as data
    Weird = type(f"W{PAYLOAD}'", (nn.Module,), {"forward": lambda self, x: x.exp() * 2})
    m = Weird()
    torch.testing.assert_close(minicomp.compile(m)(x), m(x))


def collisions(buf0, len, tl, inputs, device, call, mc_pw_sub_0, CONSTANTS):
    return (buf0 - len) * tl + inputs - device * call + mc_pw_sub_0 / (CONSTANTS.abs() + 1)


def test_argument_names_that_match_the_modules_own_names_are_renamed():
    """`x - buf0` gave 0: the argument was overwritten by call()'s own buffer named buf0; `len`,
    `tl`, a kernel's name and the module's globals crashed the module."""
    args = [torch.randn(3, 6, generator=torch.Generator().manual_seed(k)) for k in range(8)]
    compiled = minicomp.compile(collisions)
    torch.testing.assert_close(compiled(*args), collisions(*args), **tol(torch.float32))
    source = compiled.source
    assert "v_buf0" in source and "v_len" in source


def test_dsl_parameters_named_like_buffers():
    text = "func main(x: f32[5], buf0: f32[5], len: f32[5]) -> f32[5] {\n  return x - buf0 + len\n}\n"
    graph = load_dsl(text, "prog.mc")
    xs = [torch.randn(5) for _ in range(3)]
    out = compile_graph(graph, xs).call(*xs)
    torch.testing.assert_close(out[0], xs[0] - xs[1] + xs[2])


@pytest.mark.parametrize("sep", ["\n", "\u2028", "\r"])
def test_a_source_path_with_a_line_break_stays_in_comments(sep):
    """Origins are `file:line`; a file name holding a line break used to end a comment line."""
    text = "func main(x: f32[5], w: f32[5]) -> f32[5] {\n  return exp(x) * w + 1.0\n}\n"
    graph = load_dsl(text, f"evil{sep}{PAYLOAD}.mc")
    xs = [torch.randn(5), torch.randn(5)]
    out = compile_graph(graph, xs).call(*xs)
    torch.testing.assert_close(out[0], xs[0].exp() * xs[1] + 1.0, **tol(torch.float32))


def test_a_line_break_inside_a_generated_line_is_refused():
    with pytest.raises(CompileError, match="line break"):
        CodeBuilder().writeline("# a comment\nimport os")
    with pytest.raises(CompileError, match="line break"):
        CodeBuilder().splice("x = 1\n# tail\u2028y = 2")


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.text(min_size=0, max_size=24))
def test_comment_text_is_one_line_and_safe_ident_an_identifier(text):
    assert len(("# " + comment_text(text)).splitlines()) == 1
    ident = safe_ident(text)
    assert ident.isidentifier() and ident.isascii()
    assert not ident.startswith("_") and not hasattr(builtins, ident)
    compile(f"{ident} = 1", "<test>", "exec")


NAME_CHARS = st.text(alphabet=st.characters(blacklist_characters=".", blacklist_categories=("Cs",)), min_size=1,
                     max_size=12)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(NAME_CHARS, NAME_CHARS, st.text(alphabet=string.printable + "\u2028\x85é中", min_size=1, max_size=12))
def test_random_names_and_paths_compile_to_eager_answers(pname, bname, path):
    """Random Unicode names through the Python frontend (parameters, buffers) and random file
    names through the DSL frontend (origins) compile and give eager's answer."""
    if pname == bname:
        bname = bname + "b"
    try:
        m = Scaled(pname, bname)
    except (KeyError, AttributeError):      # a name nn.Module itself refuses (e.g. an existing attribute)
        return
    x = torch.randn(2, 7)
    torch.testing.assert_close(minicomp.compile(m)(x), m(x), **tol(torch.float32))
    text = "func main(x: f32[3]) -> f32[3] {\n  return x * 2.0 + 1.0\n}\n"
    xs = [torch.randn(3)]
    out = compile_graph(load_dsl(text, path + ".mc"), xs).call(*xs)
    torch.testing.assert_close(out[0], xs[0] * 2.0 + 1.0)

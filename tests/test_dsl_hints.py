"""Error hints for the usual mistakes: each names what to write instead, at the right column.

Python and PyTorch habits (`**`, `True`, `None`, `x.sum()`, `torch.exp`, `dim=`, `max`,
`if`, `def`, `;`) each get a message that says how the DSL spells it; an unknown builtin
lists the nearest names. Every case pins the line, the column and the hint.
"""

from __future__ import annotations

import re

import pytest

from minicomp.errors import SourceError
from minicomp.frontend.dsl import load_dsl
from minicomp.frontend.dsl_builtins import BUILTINS

BODY = "func f(x: f32[4, 8], y: f32[4, 8]) {\n  return %s\n}\n"

CASES = [
    # (id, expression in `return ...`, column of the caret, the message)
    ("power", "x ** 2", 12, "there is no '**' operator: write pow(x, 2) (or x * x)"),
    ("power-no-space", "x**2", 11, "there is no '**' operator: write pow(x, 2) (or x * x)"),
    ("True", "sum(x, axis=1, keepdim=True)", 33, "unknown name 'True': booleans are written true and false"),
    ("False", "mean(x, axis=1, keepdim=False)", 34, "unknown name 'False': booleans are written true and false"),
    ("None", "clamp(x, min=None, max=1.0)", 23,
     "unknown name 'None': leave the argument out to get its default (there is no None)"),
    ("typo-one", "layer_nrom(x)", 10, "unknown function 'layer_nrom' (did you mean 'layer_norm'?)"),
    ("no-near", "frobnicate(x)", 10, "unknown function 'frobnicate' (docs/dsl.md lists the builtins)"),
    ("max", "max(x)", 10,
     "unknown function 'max': for the largest element write amax(x, axis=...); for the larger of two, maximum(a, b)"),
    ("view", "view(x, [32])", 10, "unknown function 'view': write reshape(x, [...])"),
    ("dim", "sum(x, dim=1)", 17,
     "sum() has no argument named 'dim' (its arguments: x, axis, keepdim); the DSL calls it axis="),
    ("keepdims", "amax(x, axis=1, keepdims=true)", 26,
     "amax() has no argument named 'keepdims' (its arguments: x, axis, keepdim); the DSL calls it keepdim="),
    ("typo-keyword", "softmax(x, axs=1)", 21,
     "softmax() has no argument named 'axs' (its arguments: x, axis); did you mean axis=?"),
    ("method", "x.sum()", 11,
     "unexpected character '.': there are no methods or attributes; write sum(x, ...) for x.sum(...)"),
    ("method-after-call", "exp(x).mean()", 16,
     "unexpected character '.': there are no methods or attributes; write mean(x, ...) for x.mean(...)"),
    ("module", "torch.exp(x)", 15, "unexpected character '.': there are no modules; write exp(...) for "
     "torch.exp(...) (docs/dsl.md lists the builtins)"),
    ("module-name", "torch", 10, "unknown name 'torch': there are no modules; builtins are called by their own "
     "name, as in exp(x)"),
    ("percent", "x % 2", 12,
     "unexpected character '%': there is no '%' operator: write remainder(a, b) (Python's %) or fmod(a, b) (C's)"),
    ("or", "(x > 0.0) | (y > 0.0)", 20,
     "unexpected character '|': write logical_or(a, b) (bitwise_or(a, b) for integers)"),
    ("not", "~(x > 0.0)", 10, "unexpected character '~': write logical_not(x) (bitwise_not(x) for integers)"),
    ("semicolon", "x;", 11, "unexpected character ';': statements end at the end of a line, without ';'"),
    ("len", "len(x)", 10,
     "unknown function 'len': dims are names: a parameter typed f32[N] makes N an int in the body"),
    ("internal-op", "div_trunc(x, y)", 10, "unknown function 'div_trunc': write div(a, b, rounding_mode=\"trunc\")"),
    ("internal-pow", "pow_tensor(x, y)", 10,
     "unknown function 'pow_tensor': write pow(x, exponent): the exponent may be a tensor"),
    ("bitwise-and", "(x > 0.0) & (y > 0.0)", 20,
     "unexpected character '&': write logical_and(a, b) (bitwise_and(a, b) for integers)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_usual_mistakes_get_a_hint_at_the_culprit(case):
    _, expr, col, message = case
    with pytest.raises(SourceError) as info:
        load_dsl(BODY % expr, "m.mc")
    err = info.value
    assert (err.line, err.col, err.message) == (2, col, message)
    assert str(err).splitlines()[2] == " " * (4 + col - 1) + "^"


@pytest.mark.parametrize("typo,best", [("sofmax", "softmax"), ("sigmod", "sigmoid"), ("unsqeeze", "unsqueeze"),
                                       ("matmull", "matmul")])
def test_a_typo_names_the_nearest_builtin_first_then_at_most_two_more(typo, best):
    # The near names after the best one change as builtins are added (sofmax is near fmax since
    # the op table has fmax): each must be a builtin, not pinned here.
    with pytest.raises(SourceError) as info:
        load_dsl(BODY % f"{typo}(x)", "m.mc")
    err = info.value
    found = re.fullmatch(rf"unknown function '{typo}' \(did you mean '{best}'\?(?: also near: ([a-z_0-9, ]+))?\)",
                         err.message)
    assert found and (err.line, err.col) == (2, 10), err.message
    also = found.group(1).split(", ") if found.group(1) else []
    assert len(also) <= 2 and best not in also and all(name in BUILTINS for name in also), err.message


@pytest.mark.parametrize("src,line,col,fragment", [
    ("func f(x: f32[4]) {\n  if x > 0 {\n    return x\n  }\n}\n", 2, 6,
     "(there is no if: programs are straight-line code; choose values with where(cond, a, b))"),
    ("func f(x: f32[4]) {\n  for i in x {\n  }\n  return x\n}\n", 2, 7,
     "(there are no loops: programs are straight-line code over whole tensors)"),
    ("def f(x: f32[4]) {\n  return x\n}\n", 1, 1,
     "(functions start with 'func': func name(x: f32[N]) -> f32[N] { ... })"),
    ("import torch\nfunc f(x: f32[4]) {\n  return x\n}\n", 1, 1,
     "(there are no imports: every function of the file and every builtin is in scope)"),
])
def test_statements_from_other_languages_say_what_the_dsl_has(src, line, col, fragment):
    with pytest.raises(SourceError) as info:
        load_dsl(src, "m.mc")
    err = info.value
    assert (err.line, err.col) == (line, col) and err.message.endswith(fragment), err.message


def test_a_variable_named_like_a_hint_word_is_just_a_variable():
    # hints are for names that are unknown: a parameter called `max` or `True`-like names shadow nothing
    graph = load_dsl("func f(max: f32[4], view: f32[4]) {\n  return maximum(max, view)\n}\n", "m.mc")
    assert [graph.node(n).op for n in graph.outputs] == ["maximum"]

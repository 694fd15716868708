"""Hints for the usual mistakes in DSL programs, most of them Python or PyTorch habits.

Each function returns the tail of an error message (starting with its own punctuation),
or "" when it has nothing to add. The messages name what to write instead, spelled as the
DSL spells it; docs/dsl.md shows the same mistakes in its "Errors" section.
"""

from __future__ import annotations

import difflib
from typing import Iterable

# Python spellings of values the DSL spells differently.
_VALUE_NAMES = {
    "True": "booleans are written true and false",
    "False": "booleans are written true and false",
    "None": "leave the argument out to get its default (there is no None)",
    "none": "leave the argument out to get its default (there is no none)",
    "self": "there is no self: a function's parameters are its only inputs",
}
# Modules a Python program reaches builtins through.
MODULES = ("torch", "F", "nn", "math", "np", "numpy", "tl", "triton")

# PyTorch or NumPy names -> what the DSL calls them (or how to write them).
_FUNCTION_ALIASES = {
    "max": "for the largest element write amax(x, axis=...); for the larger of two, maximum(a, b)",
    "min": "for the smallest element write amin(x, axis=...); for the smaller of two, minimum(a, b)",
    "mm": "write matmul(a, b) or a @ b", "bmm": "write matmul(a, b) or a @ b", "dot": "write matmul(a, b) or a @ b",
    "einsum": "there is no einsum: write matmul (or @) with transpose or permute",
    "view": "write reshape(x, [...])", "flatten": "write reshape(x, [-1])",
    "concat": "write cat([a, b], axis=...)", "concatenate": "write cat([a, b], axis=...)",
    "stack": "write cat([unsqueeze(a, 0), unsqueeze(b, 0)], axis=0)",
    "zeros": "write full([...], 0.0)", "ones": "write full([...], 1.0)", "empty": "write full([...], 0.0)",
    "zeros_like": "write x * 0.0 (or full([...], 0.0))", "ones_like": "write x * 0.0 + 1.0",
    "repeat": "write expand(x, [...]) (a size-1 axis may be expanded)",
    "square": "write x * x (or pow(x, 2))", "power": "write pow(x, exponent)",
    "true_divide": "write div(a, b) or a / b", "mod": "write remainder(a, b) (Python's %) or fmod(a, b)",
    "std": "write sqrt(var(x, axis=...))", "logsumexp": "write log(sum(exp(x), axis=...))",
    "to": "write cast(x, f32)", "float": "write cast(x, f32)", "half": "write cast(x, f16)",
    "int": "write cast(x, i32)", "type": "write cast(x, f32) or type_as(x, other)",
    "scaled_dot_product_attention": "write attention(q, k, v, ...)",
    "sdpa": "write attention(q, k, v, ...)", "rmsnorm": "write rms_norm(x, w)",
    "layernorm": "write layer_norm(x, w, b)",
    "len": "dims are names: a parameter typed f32[N] makes N an int in the body",
    "shape": "dims are names: a parameter typed f32[N] makes N an int in the body",
    "size": "dims are names: a parameter typed f32[N] makes N an int in the body",
    "dropout": "there is no dropout: programs describe inference",
}
# Op-table names that are not builtins: the registry's own spellings of what a builtin
# already writes (dsl_builtins skips them when it makes the elementwise builtins).
INTERNAL_OPS = {
    "div_trunc": 'write div(a, b, rounding_mode="trunc")',
    "pow_tensor": "write pow(x, exponent): the exponent may be a tensor",
}
# Keyword names from PyTorch -> the DSL's own.
_KEYWORD_ALIASES = {"dim": "axis", "keepdims": "keepdim", "axes": "axis", "approx": "approximate", "bias": "b",
                    "weight": "w", "input": "x", "attn_mask": "mask"}


def near(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, sorted(set(known)), n=n, cutoff=0.6)


def _nearest(name: str, known: Iterable[str]) -> str:
    close = near(name, known)
    if not close:
        return ""
    also = f" also near: {', '.join(close[1:])}" if len(close) > 1 else ""
    return f" (did you mean '{close[0]}'?{also})"


def unknown_name(name: str, known: Iterable[str]) -> str:
    """Tail for "unknown name 'x'"."""
    if name in _VALUE_NAMES:
        return f": {_VALUE_NAMES[name]}"
    if name in MODULES:
        return ": there are no modules; builtins are called by their own name, as in exp(x)"
    return _nearest(name, known)


def unknown_function(name: str, known: Iterable[str]) -> str:
    """Tail for "unknown function 'f'": an alias's advice, else the near names, else where the list is."""
    advice = _FUNCTION_ALIASES.get(name) or INTERNAL_OPS.get(name)
    if advice:
        return f": {advice}"
    close = _nearest(name, known)
    return close or " (docs/dsl.md lists the builtins)"


def unknown_keyword(key: str, names: Iterable[str]) -> str:
    """Tail for "f() has no argument named 'dim'"."""
    names = list(names)
    alias = _KEYWORD_ALIASES.get(key)
    if alias in names:
        return f"; the DSL calls it {alias}="
    close = near(key, names, n=1)
    return f"; did you mean {close[0]}=?" if close else ""


def before_dot(word: str, after: str) -> str:
    """Tail for "unexpected character '.'" after `word` (a name, or "" when it is not one)."""
    if word in MODULES:
        return (f": there are no modules; write {after or 'exp'}(...) for {word}.{after or 'exp'}(...) "
                "(docs/dsl.md lists the builtins)")
    name = after or "sum"
    return f": there are no methods or attributes; write {name}(x, ...) for x.{name}(...)"

"""The generated parts of docs/dsl.md: the dtype table and the builtin reference.

    python -m minicomp.frontend.dsl_doc            # rewrite the generated sections in place
    python -m minicomp.frontend.dsl_doc --check    # exit 1 if docs/dsl.md is stale

Invariants:
- every builtin in `dsl_builtins.BUILTINS` appears exactly once, with the signature and
  argument kinds read from its table entry (the same data `bind_args` checks calls with),
  so the page cannot list an argument the DSL does not take, or miss one it does;
- a builtin without an entry in `_ABOUT` (say, a pointwise op newly added to the op
  registry, which becomes a builtin by itself) is still listed, under "Elementwise", with
  a plain description; tests/test_dsl_docs.py fails when the page is stale;
- the text between `<!-- generated:NAME -->` and `<!-- end:NAME -->` is owned by this
  module; everything else in the page is written by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from minicomp.frontend.dsl_builtins import _KIND_WORDS, BUILTINS, REQUIRED, Builtin, _show_default
from minicomp.ir.dtypes import NAME_TO_DTYPE

DOC = Path(__file__).resolve().parents[2] / "docs" / "dsl.md"

GROUPS = ["Elementwise", "Reductions and normalisation", "Matrix products and attention", "Views and layout",
          "Making tensors", "Dtypes"]
# builtin -> (group, what it computes). Kept beside the generator, not in the builtin table,
# whose structure other code reads.
_ABOUT: dict[str, tuple[str, str]] = {
    "add": ("Elementwise", "a + b"), "sub": ("Elementwise", "a - b"), "mul": ("Elementwise", "a * b"),
    "div": ("Elementwise", 'a / b (true division; integers give floats); rounding_mode="trunc" rounds the quotient '
                           'toward zero, "floor" down (floor_divide), as torch.div'),
    "maximum": ("Elementwise", "the larger of a and b (NaN if either is NaN)"),
    "minimum": ("Elementwise", "the smaller of a and b (NaN if either is NaN)"),
    "eq": ("Elementwise", "a == b, as b8"), "ne": ("Elementwise", "a != b, as b8"),
    "lt": ("Elementwise", "a < b, as b8"), "le": ("Elementwise", "a <= b, as b8"),
    "gt": ("Elementwise", "a > b, as b8"), "ge": ("Elementwise", "a >= b, as b8"),
    "logical_and": ("Elementwise", "a and b, as b8"), "logical_or": ("Elementwise", "a or b, as b8"),
    "logical_not": ("Elementwise", "not x, as b8"), "neg": ("Elementwise", "-x"),
    "abs": ("Elementwise", "absolute value"),
    "exp": ("Elementwise", "e to the x"), "log": ("Elementwise", "natural logarithm"),
    "sqrt": ("Elementwise", "square root"), "rsqrt": ("Elementwise", "1 / sqrt(x)"), "sin": ("Elementwise", "sine"),
    "cos": ("Elementwise", "cosine"), "erf": ("Elementwise", "the error function"),
    "tanh": ("Elementwise", "hyperbolic tangent"), "sigmoid": ("Elementwise", "1 / (1 + exp(-x))"),
    "relu": ("Elementwise", "max(x, 0)"), "silu": ("Elementwise", "x * sigmoid(x)"),
    "where": ("Elementwise", "a where cond is true, else b (cond is b8)"),
    "gelu": ("Elementwise", 'GELU; approximate is "none" (erf) or "tanh"'),
    "pow": ("Elementwise", "x to the power exponent, a number (pow(x, 2) for x squared: there is no `**`; an int "
                           "exponent keeps integers integer) or a tensor (elementwise powers)"),
    "clamp": ("Elementwise", "x limited to [min, max]; give min=, max= or both"),
    "tril": ("Elementwise", "zero above the diagonal (of the last two axes); diagonal shifts it"),
    "triu": ("Elementwise", "zero below the diagonal (of the last two axes); diagonal shifts it"),
    "fmax": ("Elementwise", "the larger of a and b, ignoring a NaN (NaN only where both are)"),
    "fmin": ("Elementwise", "the smaller of a and b, ignoring a NaN (NaN only where both are)"),
    "bitwise_and": ("Elementwise", "a & b, bit by bit, of integers or b8 (floats are refused)"),
    "bitwise_or": ("Elementwise", "a \\| b, bit by bit, of integers or b8 (floats are refused)"),
    "bitwise_xor": ("Elementwise", "a ^ b, bit by bit, of integers or b8 (floats are refused)"),
    "bitwise_not": ("Elementwise", "~x, bit by bit, of integers or b8 (floats are refused)"),
    "bitwise_left_shift": ("Elementwise", "a << b, of integers"),
    "bitwise_right_shift": ("Elementwise", "a >> b, of integers (keeping the sign of a signed a)"),
    "floor": ("Elementwise", "x rounded down (integers are kept)"),
    "ceil": ("Elementwise", "x rounded up (integers are kept)"),
    "trunc": ("Elementwise", "x rounded toward zero (integers are kept)"),
    "frac": ("Elementwise", "x - trunc(x)"),
    "sign": ("Elementwise", "-1, 0 or 1 as x is negative, zero or positive"),
    "signbit": ("Elementwise", "whether x's sign bit is set (true for -0.0), as b8"),
    "floor_divide": ("Elementwise", "a / b rounded down, as Python's // (div(a, b, rounding_mode=\"floor\"))"),
    "remainder": ("Elementwise", "a - floor_divide(a, b) * b: the sign of b, as Python's %"),
    "fmod": ("Elementwise", "a - trunc(a / b) * b: the sign of a, as C's fmod"),
    "expm1": ("Elementwise", "exp(x) - 1, accurate near 0"), "log1p": ("Elementwise", "log(1 + x), accurate near 0"),
    "log2": ("Elementwise", "base-2 logarithm"), "erfc": ("Elementwise", "1 - erf(x)"),
    "erfinv": ("Elementwise", "the inverse of erf"), "isnan": ("Elementwise", "whether x is NaN, as b8"),
    "isinf": ("Elementwise", "whether x is infinite, as b8"), "xlogy": ("Elementwise", "a * log(b), 0 where a is 0"),
    "lerp": ("Elementwise", "start + weight * (end - start)"),
    "hardsigmoid": ("Elementwise", "0 below -3, 1 above 3, x / 6 + 1/2 between"),
    "hardswish": ("Elementwise", "x * hardsigmoid(x)"), "mish": ("Elementwise", "x * tanh(log(1 + exp(x)))"),
    "cast": ("Dtypes", "x converted to dtype, as PyTorch's .to(dtype)"),
    "type_as": ("Dtypes", "x converted to other's dtype"),
    "full": ("Making tensors", "a tensor of shape filled with value; dtype defaults from the value (b8, i64, f32)"),
    "arange": ("Making tensors", "start, start + step, ... below end (one argument: 0 to start); i64 by default"),
    "causal_mask": ("Making tensors", "b8[sq, sk], true on and below the diagonal"),
    "sum": ("Reductions and normalisation", "sum over axis (all axes when left out)"),
    "mean": ("Reductions and normalisation", "mean over axis (all axes when left out)"),
    "amax": ("Reductions and normalisation", "largest element over axis (refused over an empty axis, as eager)"),
    "amin": ("Reductions and normalisation", "smallest element over axis (refused over an empty axis, as eager)"),
    "var": ("Reductions and normalisation", "variance over axis; correction=1 is the unbiased estimate, 0 the biased"),
    "softmax": ("Reductions and normalisation", "softmax along axis, computed in f32 for half inputs"),
    "log_softmax": ("Reductions and normalisation", "log of softmax along axis"),
    "layer_norm": ("Reductions and normalisation",
                   "LayerNorm over as many trailing axes as w has (the last axis without w), then * w + b"),
    "rms_norm": ("Reductions and normalisation",
                 "RMSNorm over as many trailing axes as w has; eps defaults to the dtype's machine epsilon, as "
                 "PyTorch's"),
    "matmul": ("Matrix products and attention", "matrix product with PyTorch's broadcasting rules; a @ b is the same"),
    "linear": ("Matrix products and attention", "x @ transpose(w, -2, -1) + b: w is [out_features, in_features]"),
    "attention": ("Matrix products and attention",
                  "softmax(q @ k^T * scale + mask) @ v (scaled dot-product attention); scale defaults to "
                  "1/sqrt(head dim); mask is b8 (true = attend) or an additive float; is_causal=true masks the "
                  "future; enable_gqa=true lets k and v have fewer heads"),
    "reshape": ("Views and layout", "the same elements in a new shape; one -1 is inferred"),
    "expand": ("Views and layout", "size-1 axes repeated to shape (-1 keeps an axis)"),
    "permute": ("Views and layout", "axes reordered: dims lists every axis once"),
    "transpose": ("Views and layout", "two axes swapped"),
    "unsqueeze": ("Views and layout", "a size-1 axis inserted at dim"),
    "squeeze": ("Views and layout", "size-1 axes removed (all of them, or those named by dim)"),
    "contiguous": ("Views and layout", "x itself (layouts are chosen by the compiler)"),
    "slice": ("Views and layout", "x[start:end:step] along dim, bounds clamped as in Python; step > 0"),
    "cat": ("Views and layout", "tensors joined along axis"),
}
# How the page names an argument kind (the table's own words, shortened for a table cell).
_KIND_CELL = {"Value": "tensor or number", "Tensor": "tensor or number", "list[Tensor]": "list of tensors",
              "int": "int", "float": "number", "Number": "number or bool", "bool": "bool", "str": "string",
              "Dtype": "dtype name", "Shape": "list of ints", "Axes": "int or list of ints"}


def _kind(kind: str) -> str:
    optional = kind.endswith(" | None")
    base = kind.removesuffix(" | None")
    word = _KIND_CELL.get(base) or _KIND_WORDS.get(base, base)  # a new kind: the binder's own words
    return f"{word}, optional" if optional else word


def signature(b: Builtin) -> str:
    return b.signature()


def arguments(b: Builtin) -> str:
    parts = []
    for p in b.params:
        default = "" if p.default is REQUIRED or p.default is None else f" (default {_show_default(p.default)})"
        parts.append(f"`{p.name}`: {_kind(p.kind)}{default}")
    return "; ".join(parts) or "none"


def about(name: str) -> tuple[str, str]:
    return _ABOUT.get(name, ("Elementwise", f"elementwise `{name}`, as PyTorch's `torch.{name}`"))


def builtins_section() -> str:
    """The builtin reference, grouped, one table row per builtin, in table order within a group."""
    lines = []
    for group in GROUPS:
        rows = [b for b in BUILTINS.values() if about(b.name)[0] == group]
        if not rows:
            continue
        lines += [f"### {group}", "", "| builtin | arguments | computes |", "|---|---|---|"]
        for b in rows:
            lines.append(f"| `{signature(b)}` | {arguments(b)} | {about(b.name)[1]} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def dtypes_section() -> str:
    by_dtype: dict[object, list[str]] = {}
    for name, dt in NAME_TO_DTYPE.items():
        by_dtype.setdefault(dt, []).append(name)
    lines = ["| dtype | names | PyTorch |", "|---|---|---|"]
    for dt, names in by_dtype.items():
        kind = "float" if dt.is_floating_point else "bool" if str(dt) == "torch.bool" else "integer"
        lines.append(f"| {kind} | {', '.join(f'`{n}`' for n in names)} | `{dt}` |")
    return "\n".join(lines)


def grammar_section() -> str:
    """The grammar's rules (up to its terminals), without comments and tree-building aliases."""
    text = (Path(__file__).with_name("minicomp.lark")).read_text(encoding="utf-8")
    rules = text.split("// ------------------------------------------------------------------ terminals")[0]
    lines = []
    for line in rules.splitlines():
        code = line.split("//")[0].rstrip()
        code = re.sub(r"\s+->\s+\w+$", "", code)
        if code.strip():
            lines.append(code)
        elif lines and lines[-1] != "":
            lines.append("")
    return "```\n" + "\n".join(lines).strip("\n") + "\n```"


SECTIONS = {"grammar": grammar_section, "dtypes": dtypes_section, "builtins": builtins_section}


def render(text: str) -> str:
    """`text` (the page) with every generated section rewritten."""
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- generated:{name} -->\n)(?:.*?\n)?(<!-- end:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"docs/dsl.md has no '<!-- generated:{name} -->' ... '<!-- end:{name} -->' section")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    current = DOC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print(f"{DOC} is stale: run python -m minicomp.frontend.dsl_doc", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        DOC.write_text(fresh, encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

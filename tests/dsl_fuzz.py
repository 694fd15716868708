"""Grammar-aware inputs for the DSL fuzz suite (tests/test_fuzz_dsl.py), and how one is judged.

An input is DSL text (or raw bytes, read through `read_program` from a file) plus `--dim`
bindings. Inputs come from two kinds of seed programs:
- the sample programs (samples/*.mc), each with dims that bind its symbols;
- programs drawn by `generate`: straight-line code over a few inputs whose shapes the
  generator tracks, so that most of them are valid before mutation;
and from mutations of them (`mutate`): token deletions, duplications, swaps and insertions
(grammar tokens, builtin names, near-miss names, odd literals, odd Unicode), odd keyword
arguments added to calls, numbers and dims replaced by odd values (0, huge), expressions
wrapped in deep nesting, function chains, and byte-level damage (invalid UTF-8).

`judge` runs one input through the frontend and names its outcome: `ok` (a verified graph,
which the reference interpreter then runs when it is small), `SourceError`,
`MinicompError`, or `crash: <type> at <file:line>` for anything else; the place is the
innermost frame inside minicomp, which groups crashes into classes.

Everything is drawn from one `random.Random`, so a seed names an input exactly.
"""

from __future__ import annotations

import math
import random
import re
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path


from minicomp.errors import MinicompError, SourceError
from minicomp.frontend.dsl import load_dsl
from minicomp.frontend.dsl_builtins import BUILTINS
from minicomp.ir.interpret import random_inputs, run

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DIMS = {
    "attention": {"B": 1, "H": 2, "S": 5, "D": 4},
    "gpt_block": {"B": 1, "S": 3, "C": 8, "C3": 24, "F": 16},
    "layernorm": {"B": 2, "S": 3, "C": 5},
    "llama_block": {"B": 1, "S": 3, "C": 8, "CQ": 8, "CKV": 4, "F": 12, "D": 2},
    "mlp": {"B": 1, "S": 3, "C": 4, "H": 6},
    "rmsnorm": {"B": 2, "S": 3, "C": 5},
    "softmax_rows": {"M": 3, "N": 7},
}

# One token of DSL text: a name, a number, a string, an operator, a bracket, a comment, space.
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|\"[^\"\n]*\"|'[^'\n]*'"
                    r"|->|==|!=|<=|>=|//|#[^\n]*|\n|[ \t]+|.", re.S)
GRAMMAR_TOKENS = ["func", "return", "true", "false", "->", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/",
                  "//", "@", "(", ")", "[", "]", "{", "}", ",", ":", "=", "\n", " ", "f32", "bf16", "i32", "b8"]
MISTAKES = ["**", "True", "False", "None", "none", "x.sum()", ".", "dim", "keepdim=True", "max", "min", "%", "if",
            "for", "&", "|", "!", "~", "^", "'str'", ";", "\\", "`", "$"]
ODD_NUMBERS = ["0", "-0", "0.0", "-1", "1e400", "1e-400", "9223372036854775807", "9223372036854775808",
               "99999999999999999999999999", "1" + "0" * 400, "18446744073709551616", "2147483648", "4294967297",
               "0.5", "1e38", "3.4e39", ".0", "0e0", "1_000", "0x10", "nan", "inf", "-inf"]
ODD_CHARS = ["é", "ß", "中", "😀", "\u2028", "\u2029", "\u200b", "\ufeff", "\x00", "\x1b[31m", "\r", "\t",
             "\x0c", "\x0b", "\x85", "\u202e", "e\u0301", "\ud800", "\U0010ffff", "\x7f", "ｆｕｎｃ", "Σ"]
ODD_BYTES = [b"\xff", b"\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xc0\xaf", b"\xef\xbb\xbf"]
# keyword arguments (a name of some builtin, a value of some kind) added to a call
ODD_KEYWORDS = ["axis", "keepdim", "dim", "diagonal", "correction", "eps", "scale", "mask", "is_causal", "approximate",
                "min", "max", "step", "start", "end", "dtype", "shape", "dims", "w", "b", "value", "exponent"]
ODD_VALUES = ["[]", "[0, 0]", "[-1, -1]", "-1", "99", "9223372036854775807", "-9223372036854775807", "0", "true",
              "1.5", "nan", "-inf", '"tanh"', '"none"', '""', "f16", "b8", "i8", "[1.5]", "[true]", "x0", "[x0, x0]"]
HUGE_DIMS = [0, 1, 2 ** 31, 2 ** 32 + 1, 10 ** 12, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30]
DEPTHS = [10, 60, 100, 150, 300, 1000, 4000]


@dataclass
class Case:
    """One fuzz input: text (or raw file bytes), its --dim bindings and how it was made."""

    text: str | bytes
    dims: dict[str, int] = field(default_factory=dict)
    how: list[str] = field(default_factory=list)
    entry: str | None = None


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


# ------------------------------------------------------------------ generated valid programs

_UNARY = ["exp({x})", "log(abs({x}) + 1.0)", "sqrt(abs({x}))", "rsqrt(abs({x}) + 0.5)", "tanh({x})",
          "sigmoid({x})", "relu({x})", "silu({x})", "gelu({x})", 'gelu({x}, approximate="tanh")', "-{x}",
          "abs({x})", "erf({x})", "sin({x})", "pow({x}, 2)", "clamp({x}, min=-1.0)", "{x} * 0.5", "1.0 - {x}",
          "cast({x}, f32)", "where({x} > 0.0, {x}, 0.0)", "{x} / (abs({x}) + 1.0)"]
_BINARY = ["{x} + {y}", "{x} - {y}", "{x} * {y}", "maximum({x}, {y})", "minimum({x}, {y})", "{x} / ({y} * {y} + 1.0)"]
_REDUCE = ["sum", "mean", "amax", "amin", "var"]


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def generate(rng: random.Random) -> Case:
    """A random straight-line program; its shapes are tracked so most steps are well typed."""
    syms = ["M", "N", "K"][: rng.randint(1, 3)]
    size = {s: rng.choice([0, 1, 1, 2, 3, 5, 7]) if rng.random() < 0.9 else rng.choice(HUGE_DIMS) for s in syms}
    dtype = rng.choice(["f32", "f32", "f32", "f16", "bf16", "i32", "b8"])
    full = syms[: rng.randint(0, len(syms))]
    params, shapes = [], {}
    for i in range(rng.randint(1, 3)):
        dims = full[rng.randint(0, len(full)):] if full else []
        name = f"x{i}"
        params.append(f"{name}: {dtype}[{', '.join(dims)}]")
        shapes[name] = tuple(size[d] for d in dims)
    body = []
    for k in range(rng.randint(1, 6)):
        x = rng.choice(list(shapes))
        sx, expr, shape = shapes[x], None, None
        roll = rng.random()
        if roll < 0.3:
            expr, shape = rng.choice(_UNARY).format(x=x), sx
        elif roll < 0.55:
            y = rng.choice(list(shapes))
            shape = _broadcast(sx, shapes[y])
            if shape is not None:
                expr = rng.choice(_BINARY).format(x=x, y=y)
        elif roll < 0.7 and sx:
            axis, keep = rng.randrange(-len(sx), len(sx)), rng.random() < 0.5
            expr = f"{rng.choice(_REDUCE)}({x}, axis={axis}, keepdim={'true' if keep else 'false'})"
            shape = tuple(1 if i == axis % len(sx) else d for i, d in enumerate(sx) if keep or i != axis % len(sx))
        elif roll < 0.78 and sx:
            expr, shape = f"{rng.choice(['softmax', 'log_softmax'])}({x}, axis=-1)", sx
        elif roll < 0.84 and len(sx) >= 2:
            expr, shape = f"{x} @ transpose({x}, -2, -1)", sx[:-1] + (sx[-2],)
        elif roll < 0.87 and len(sx) >= 2:
            expr, shape = f"transpose({x}, 0, 1)", (sx[1], sx[0]) + sx[2:]
        elif roll < 0.89 and len(sx) >= 2:
            expr, shape = f"attention({x}, {x}, {x}{rng.choice(['', ', is_causal=true', ', scale=0.5'])})", sx
        elif roll < 0.91:
            expr, shape = f"reshape({x}, [-1])", (math.prod(sx),)
        elif roll < 0.92:
            n = rng.choice(list(size))
            expr, shape = rng.choice([(f"full([{n}], 2.0)", (size[n],)), (f"arange({n})", (size[n],)),
                                      (f"causal_mask({n}, {n})", (size[n], size[n]))])
        elif roll < 0.94 and sx:
            expr, shape = rng.choice([f"layer_norm({x})", f"rms_norm({x})"]), sx
        elif roll < 0.97 and sx:
            expr, shape = f"cat([{x}, {x}], axis=0)", (2 * sx[0],) + sx[1:]
        elif sx:
            expr, shape = f"slice({x}, -1, 0, 1)", sx[:-1] + (min(1, sx[-1]),)
        if expr is None:
            continue
        body.append(f"  t{k} = {expr}")
        shapes[f"t{k}"] = shape
    outs = [rng.choice(list(shapes))] + ([rng.choice(list(shapes))] if rng.random() < 0.2 else [])
    text = f"func fuzz({', '.join(params)}) {{\n" + "\n".join(body) + f"\n  return {', '.join(outs)}\n}}\n"
    return Case(text, {s: v for s, v in size.items() if s in " ".join(params)}, ["generate"])


def seeds() -> list[Case]:
    out = []
    for path in sorted((ROOT / "samples").glob("*.mc")):
        name = path.stem if path.stem != "softmax" else "softmax_rows"
        out.append(Case(path.read_text(), dict(SAMPLE_DIMS[name]), [f"sample {path.name}"]))
    return out


# ------------------------------------------------------------------ mutations


def _body_names(toks: list[str]) -> list[int]:
    """Indices of name tokens used as values inside function bodies (not callees, not keywords)."""
    out, depth = [], 0
    for i, t in enumerate(toks):
        depth += t == "{"
        depth -= t == "}"
        nxt = next((u for u in toks[i + 1:] if not u.isspace()), "")
        if depth and re.fullmatch(r"[A-Za-z_]\w*", t) and t not in ("return", "true", "false") \
                and nxt not in ("(", "=") and not (t[0].islower() and t[1:].isdigit() and t[0] in "fiub"):
            out.append(i)
    return out


def _deep(rng: random.Random, expr: str) -> tuple[str, str]:
    n = rng.choice(DEPTHS)
    kind = rng.choice(["call", "paren", "neg", "list", "sum", "rsub", "mixed"])
    if kind == "call":
        return "exp(" * n + expr + ")" * n, f"deep call {n}"
    if kind == "paren":
        return "(" * n + expr + ")" * n, f"deep paren {n}"
    if kind == "neg":
        return "-" * n + expr, f"deep neg {n}"
    if kind == "list":
        return "sum(" + "[" * n + expr + "]" * n + ")", f"deep list {n}"
    if kind == "sum":
        return " + ".join([expr] * n), f"long sum {n}"
    if kind == "rsub":
        return f"{expr} - (" * n + expr + ")" * n, f"right-nested sub {n}"
    return "".join(rng.choice(["exp(", "(-", "relu(", "(1.0 + "]) for _ in range(n)) + expr + ")" * n, \
        f"mixed nesting {n}"


def _chain(rng: random.Random) -> Case:
    n = rng.choice([10, 100, 164, 500])  # 2000 and more only cost time: lark parses ~0.3 ms a line
    funcs = [f"func f{i}(x: f32[N]) -> f32[N] {{\n  return f{i + 1}(x) + 1.0\n}}\n" for i in range(n)]
    funcs.append(f"func f{n}(x: f32[N]) -> f32[N] {{\n  return x\n}}\n")
    if rng.random() < 0.5:
        funcs.reverse()
    return Case("".join(funcs), {"N": rng.choice([0, 3])}, [f"function chain {n}"], entry="f0")


def _mutate_once(rng: random.Random, case: Case) -> Case:
    text = case.text if isinstance(case.text, str) else case.text.decode("utf-8", "replace")
    toks = tokens(text)
    dims, how = dict(case.dims), list(case.how)
    roll = rng.random()
    i = rng.randrange(len(toks)) if toks else 0
    if roll < 0.12 and toks:
        how.append(f"delete {toks[i]!r}")
        del toks[i]
    elif roll < 0.20 and toks:
        how.append(f"duplicate {toks[i]!r}")
        toks.insert(i, toks[i])
    elif roll < 0.30 and len(toks) > 1:
        j = min(i + rng.choice([1, 2, 3]), len(toks) - 1)
        how.append(f"swap {toks[i]!r} {toks[j]!r}")
        toks[i], toks[j] = toks[j], toks[i]
    elif roll < 0.42:
        t = rng.choice(GRAMMAR_TOKENS + MISTAKES + list(BUILTINS))
        how.append(f"insert {t!r}")
        toks.insert(i, t)
    elif roll < 0.52:
        nums = [k for k, t in enumerate(toks) if t[:1].isdigit() or t[:1] == "."] or [i]
        k, v = rng.choice(nums), rng.choice(ODD_NUMBERS)
        how.append(f"number {v[:24]}")
        toks[k] = v
    elif roll < 0.60 and dims:
        name, v = rng.choice(sorted(dims)), rng.choice(HUGE_DIMS)
        how.append(f"--dim {name}={v}")
        dims[name] = v
    elif roll < 0.66:
        lits = [k for k, t in enumerate(toks) if t.isdigit()] or [i]
        k, v = rng.choice(lits), str(rng.choice(HUGE_DIMS))
        how.append(f"literal {v}")
        toks[k] = v
    elif roll < 0.76:
        names = _body_names(toks)
        if names:
            k = rng.choice(names)
            toks[k], what = _deep(rng, toks[k])
            how.append(what)
    elif roll < 0.80:
        closes = [k for k, t in enumerate(toks) if t == ")"] or [i]
        k = rng.choice(closes)
        kw = f", {rng.choice(ODD_KEYWORDS)}={rng.choice(ODD_VALUES)}" if rng.random() < 0.7 else \
            f", {rng.choice(ODD_VALUES)}"
        how.append(f"argument {kw[2:]!r}")
        toks.insert(k, kw)
    elif roll < 0.85:
        c = rng.choice(ODD_CHARS)
        how.append(f"char {c!r}")
        toks.insert(i, c)
    elif roll < 0.88:
        names = [k for k, t in enumerate(toks) if t in BUILTINS] or [i]
        k = rng.choice(names)
        old = toks[k]
        toks[k] = rng.choice([rng.choice(list(BUILTINS)), old[:-1], old + "s", old.capitalize()])
        how.append(f"callee {old!r} -> {toks[k]!r}")
    elif roll < 0.93:
        lines = "".join(toks).split("\n")
        k = rng.randrange(len(lines))
        if rng.random() < 0.5:
            lines.insert(k, lines[k])
            how.append(f"duplicate line {k + 1}")
        else:
            del lines[k]
            how.append(f"delete line {k + 1}")
        return Case("\n".join(lines), dims, how, case.entry)
    else:
        data = "".join(toks).encode("utf-8", "surrogatepass")
        k, b = rng.randrange(len(data) + 1), rng.choice(ODD_BYTES)
        how.append(f"bytes {b!r} at {k}")
        return Case(data[:k] + b + data[k:], dims, how, case.entry)
    return Case("".join(toks), dims, how, case.entry)


def draw(rng: random.Random, pool: list[Case]) -> Case:
    """One fuzz input: a seed program (sample or generated) with 0-3 mutations, or a function chain."""
    roll = rng.random()
    if roll < 0.04:
        return _chain(rng)
    case = rng.choice(pool) if roll < 0.5 else generate(rng)
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        case = _mutate_once(rng, case)
        if isinstance(case.text, bytes):
            break
    return case


# ------------------------------------------------------------------ judging

MAX_REFERENCE_ELEMENTS = 20_000  # the reference interpreter runs graphs up to this many elements in all


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/minicomp/" in f.filename]
    if not frames:
        return "outside minicomp"
    f = frames[-1]
    return f"{f.filename[f.filename.rindex('/minicomp/') + 1:]}:{f.name}"


def load(case: Case, workdir: Path):
    """The frontend on one input: text straight to load_dsl; bytes through a file and read_program."""
    from minicomp.frontend.dsl import read_program
    if isinstance(case.text, bytes):
        path = workdir / "fuzz.mc"
        path.write_bytes(case.text)
        return load_dsl(read_program(path), str(path), entry=case.entry, dims=case.dims)
    return load_dsl(case.text, "fuzz.mc", entry=case.entry, dims=case.dims)


def judge(case: Case, workdir: Path) -> tuple[str, object]:
    """(outcome, graph or error): 'ok', 'SourceError', 'MinicompError' or 'crash: ...'."""
    try:
        graph = load(case, workdir)
    except SourceError as e:
        problem = _bad_rendering(e)
        return (f"crash: {problem}", e) if problem else ("SourceError", e)
    except MinicompError as e:
        return "MinicompError", e
    except BaseException as e:  # noqa: BLE001 - classifying every escape is the point
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"crash: {type(e).__name__} at {_where(e)}", e
    elements = sum(graph.node(n).numel for n in graph.nx.nodes)
    if elements <= MAX_REFERENCE_ELEMENTS:
        try:
            run(graph, random_inputs(graph, seed=0))
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            return f"crash: reference run {type(e).__name__} at {_where(e)}", e
    return "ok", graph


def _bad_rendering(e: SourceError) -> str | None:
    """What is wrong with how a SourceError reads, if anything (it must print, and point somewhere)."""
    try:
        str(e).encode("utf-8")
    except UnicodeEncodeError:
        return "SourceError that cannot be printed as UTF-8"
    if e.line < 1 or e.col < 1:
        return "SourceError without a position"
    if e.source_line is not None and any(ch in e.source_line for ch in "\n\r\x1b"):
        return "SourceError echoing control characters"
    return None


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="minicomp-fuzz-"))

"""Random well-typed tensor programs for the property tests, written both as DSL text and Python.

A `Program` is straight-line code over named values: inputs, then steps `vN = <expr>`, then
one or more outputs. Each step holds the same expression twice, as DSL text and as PyTorch
source, so one drawn program yields a `.mc` function (compiled through `load_dsl`) and a
Python function (compiled through `minicomp.compile`), both checked against eager PyTorch.

Invariants:
- every step is well typed: the generator runs its Python text on zero-filled CPU tensors
  before keeping it (meta tensors accept some ops that CPU kernels refuse, e.g. relu of bool) (a step PyTorch refuses is dropped, never emitted), so the shape and dtype of
  every value are PyTorch's own, and the DSL function's signature is written from them;
- the two texts mean the same computation (tests compare both with the same eager result);
- everything is drawn through hypothesis, so shrinking yields a shorter program with
  fewer, smaller inputs; `Program.describe()` prints both texts for the failure message.

Shapes stay tiny (dims 1..9, rank <= 3 before views): the kernels run under Triton's
interpreter.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import hypothesis.strategies as st
import torch
import torch.nn.functional as F

from minicomp.ir.dtypes import dtype_name

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
PY_DTYPE = {torch.float32: "torch.float32", torch.float16: "torch.float16", torch.bfloat16: "torch.bfloat16",
            torch.int32: "torch.int32", torch.int64: "torch.int64", torch.bool: "torch.bool"}

# name -> (DSL call, Python call); the operand is spliced in for {x}.
UNARY = {
    "exp": ("exp({x})", "torch.exp({x})"),
    "log": ("log({x})", "torch.log({x})"),
    "sqrt": ("sqrt({x})", "torch.sqrt({x})"),
    "rsqrt": ("rsqrt({x})", "torch.rsqrt({x})"),
    "sin": ("sin({x})", "torch.sin({x})"),
    "cos": ("cos({x})", "torch.cos({x})"),
    "tanh": ("tanh({x})", "torch.tanh({x})"),
    "sigmoid": ("sigmoid({x})", "torch.sigmoid({x})"),
    "erf": ("erf({x})", "torch.erf({x})"),
    "relu": ("relu({x})", "torch.relu({x})"),
    "silu": ("silu({x})", "F.silu({x})"),
    "gelu": ("gelu({x})", "F.gelu({x})"),
    "gelu_tanh": ('gelu({x}, approximate="tanh")', 'F.gelu({x}, approximate="tanh")'),
    "neg": ("-{x}", "-{x}"),
    "abs": ("abs({x})", "torch.abs({x})"),
    "square": ("{x} * {x}", "{x} * {x}"),
    "clamp": ("clamp({x}, min=-0.5, max=0.75)", "torch.clamp({x}, min=-0.5, max=0.75)"),
    "pow3": ("pow({x}, 3)", "torch.pow({x}, 3)"),
    "pow_half": ("pow({x}, 0.5)", "torch.pow({x}, 0.5)"),
}
INT_UNARY = ("neg", "abs", "relu", "square")        # the ones that keep integer inputs integer
DOMAIN = ("log", "sqrt", "rsqrt", "pow_half")                    # NaN below zero: usually fed abs(x) + 0.5
BINARY = {
    "+": ("{a} + {b}", "{a} + {b}"),
    "-": ("{a} - {b}", "{a} - {b}"),
    "*": ("{a} * {b}", "{a} * {b}"),
    "/": ("{a} / {b}", "{a} / {b}"),
    "maximum": ("maximum({a}, {b})", "torch.maximum({a}, {b})"),
    "minimum": ("minimum({a}, {b})", "torch.minimum({a}, {b})"),
}
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
REDUCE = {"sum": "torch.sum", "mean": "torch.mean", "amax": "torch.amax", "amin": "torch.amin",
          "var": "torch.var"}


@dataclass
class Value:
    name: str
    meta: torch.Tensor          # a zero-filled CPU stand-in: the value's shape and dtype, as eager infers them

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.meta.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.meta.dtype


@dataclass
class Program:
    inputs: list[Value] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)                  # per input: see LAYOUTS
    steps: list[tuple[str, str, str]] = field(default_factory=list)   # (name, DSL expr, Python expr)
    values: list[Value] = field(default_factory=list)                 # every step's result, in order
    outputs: list[Value] = field(default_factory=list)

    def dsl(self) -> str:
        params = ", ".join(f"{v.name}: {_dsl_type(v)}" for v in self.inputs)
        rets = ", ".join(_dsl_type(v) for v in self.outputs)
        lines = [f"func prog({params}) -> {rets} {{"]
        lines += [f"  {name} = {d}" for name, d, _ in self.steps]
        lines.append(f"  return {', '.join(v.name for v in self.outputs)}")
        return "\n".join(lines + ["}"]) + "\n"

    def python(self, f64: bool = False) -> str:
        """The program as a Python function; `f64`: every float dtype it names becomes float64
        (with float64 inputs, that computes the same program in double precision: an oracle)."""
        lines = [f"def prog({', '.join(v.name for v in self.inputs)}):"]
        lines += [f"    {name} = {_to_f64(p) if f64 else p}" for name, _, p in self.steps]
        outs = ", ".join(v.name for v in self.outputs)
        lines.append(f"    return {outs}" + ("," if len(self.outputs) > 1 else ""))
        return "\n".join(lines) + "\n"

    def loosest_float(self) -> torch.dtype | None:
        """The least precise float dtype any value passes through (kernels keep half values in
        fp32 until stored, eager rounds each one: an f32 result inherits a half step's error)."""
        order = [torch.float32, torch.float16, torch.bfloat16]
        seen = [v.dtype for v in self.inputs + self.values if v.dtype in order]
        return max(seen, key=order.index) if seen else None

    def __repr__(self) -> str:
        return "\n" + self.describe()

    def _repr_pretty_(self, printer, cycle) -> None:   # what hypothesis prints for a failing example
        printer.text(repr(self))

    def describe(self) -> str:
        sig = "; ".join(f"{v.name}: {_dsl_type(v)}" + (f" ({how})" if how != "contiguous" else "")
                        for v, how in zip(self.inputs, self.layouts))
        return f"inputs {sig}\n--- DSL ---\n{self.dsl()}--- Python ---\n{self.python()}"


def _to_f64(py: str) -> str:
    for name in ("torch.float32", "torch.float16", "torch.bfloat16"):
        py = py.replace(name, "torch.float64")
    return py


def _dsl_type(v: Value) -> str:
    return f"{dtype_name(v.dtype)}[{', '.join(map(str, v.shape))}]"


def _eager_eval(expr: str, env: dict[str, torch.Tensor]) -> torch.Tensor | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = eval(expr, {"torch": torch, "F": F}, dict(env))   # noqa: S307 (our own generated text)
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
        return None
    return out if isinstance(out, torch.Tensor) else None


class Builder:
    """Draws steps onto a Program; a step whose Python text PyTorch refuses is not kept."""

    def __init__(self, draw, dtype: torch.dtype):
        self.draw = draw
        self.dtype = dtype
        self.p = Program()

    # ------------------------------------------------------------------ values

    @property
    def pool(self) -> list[Value]:
        return self.p.inputs + self.p.values

    def env(self) -> dict[str, torch.Tensor]:
        return {v.name: v.meta for v in self.pool}

    def add_input(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Value:
        v = Value(f"x{len(self.p.inputs)}", torch.zeros(shape, dtype=dtype or self.dtype))
        self.p.inputs.append(v)
        self.p.layouts.append(self.draw(st.sampled_from(LAYOUTS)) if len(shape) >= 1 else "contiguous")
        return v

    def emit(self, dsl: str, py: str) -> Value | None:
        meta = _eager_eval(py, self.env())
        if meta is None or meta.numel() == 0:
            return None
        v = Value(f"v{len(self.p.values)}", meta)
        self.p.steps.append((v.name, dsl, py))
        self.p.values.append(v)
        return v

    def pick(self, want=lambda v: True) -> Value | None:
        """A value from the pool (recent ones more likely: they make deeper programs)."""
        choices = [v for v in self.pool if want(v)]
        if not choices:
            return None
        return choices[-1 - self.draw(st.integers(0, len(choices) - 1))]

    def dim(self) -> int:
        return self.draw(st.integers(1, 9))

    # ------------------------------------------------------------------ step kinds

    def unary(self) -> Value | None:
        x = self.pick()
        floating = x.dtype.is_floating_point
        name = self.draw(st.sampled_from(sorted(UNARY) if floating else INT_UNARY))
        d, p = UNARY[name]
        dx, px = x.name, x.name
        if name in DOMAIN and self.draw(st.booleans()):
            dx, px = f"(abs({x.name}) + 0.5)", f"(torch.abs({x.name}) + 0.5)"
        return self.emit(d.format(x=dx), p.format(x=px))

    def binary(self) -> Value | None:
        a = self.pick()
        op = self.draw(st.sampled_from(sorted(BINARY)))
        d, p = BINARY[op]
        if self.draw(st.integers(0, 3)) == 0:          # a Python number on one side
            num = self.draw(st.sampled_from(["2.0", "0.5", "-1.5", "3"]))
            if op in ("maximum", "minimum"):
                clamp = "clamp_min" if op == "maximum" else "clamp_max"
                return self.emit(f"{op}({a.name}, {num})", f"torch.{clamp}({a.name}, {num})")
            if self.draw(st.booleans()):
                return self.emit(d.format(a=num, b=a.name), p.format(a=num, b=a.name))
            return self.emit(d.format(a=a.name, b=num), p.format(a=a.name, b=num))
        b = self.pick(lambda v: _compatible(v.shape, a.shape))     # may broadcast both ways: [3, 1] + [4]
        return self.emit(d.format(a=a.name, b=b.name), p.format(a=a.name, b=b.name))

    def select(self) -> Value | None:
        a = self.pick()
        b = self.pick(lambda v: _broadcasts(v.shape, a.shape))
        op = self.draw(st.sampled_from(COMPARE))
        cond = self.emit(f"{a.name} {op} {b.name}", f"{a.name} {op} {b.name}")
        if cond is None or self.draw(st.integers(0, 3)) == 0:
            return cond
        c = self.pick(lambda v: _broadcasts(v.shape, cond.shape) and v.dtype != torch.bool)
        other = self.draw(st.sampled_from([b.name, "0.0", "-inf"])) if c is not None else "1.0"
        c_name = c.name if c is not None else a.name
        return self.emit(f"where({cond.name}, {c_name}, {other})",
                         f"torch.where({cond.name}, {c_name}, {_py_num(other)})")

    def cast(self) -> Value | None:
        x = self.pick()
        to = self.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.bool]))
        if to == x.dtype:
            return None
        return self.emit(f"cast({x.name}, {dtype_name(to)})", f"{x.name}.to({PY_DTYPE[to]})")

    def reduce(self) -> Value | None:
        x = self.pick(lambda v: v.meta.dim() >= 1)
        if x is None:
            return None
        op = self.draw(st.sampled_from(sorted(REDUCE)))
        rank = x.meta.dim()
        axes = self.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                                  unique_by=lambda a: a % rank))
        keep = self.draw(st.booleans())
        dsl_axis = str(axes[0]) if len(axes) == 1 else f"[{', '.join(map(str, axes))}]"
        py_axis = str(axes[0]) if len(axes) == 1 else f"({', '.join(map(str, axes))},)"
        return self.emit(f"{op}({x.name}, axis={dsl_axis}, keepdim={'true' if keep else 'false'})",
                         f"{REDUCE[op]}({x.name}, dim={py_axis}, keepdim={keep})")

    def softmax(self) -> Value | None:
        x = self.pick(lambda v: v.meta.dim() >= 1 and v.dtype.is_floating_point)
        if x is None:
            return None
        axis = self.draw(st.integers(-x.meta.dim(), x.meta.dim() - 1))
        log = self.draw(st.booleans())
        fn = "log_softmax" if log else "softmax"
        return self.emit(f"{fn}({x.name}, axis={axis})", f"torch.{fn}({x.name}, dim={axis})")

    def norm(self) -> Value | None:
        x = self.pick(lambda v: v.meta.dim() >= 1 and v.dtype.is_floating_point)
        if x is None:
            return None
        n = x.shape[-1]
        w = self.add_input((n,), x.dtype)
        if self.draw(st.booleans()):
            b = self.add_input((n,), x.dtype)
            return self.emit(f"layer_norm({x.name}, {w.name}, {b.name})",
                             f"F.layer_norm({x.name}, ({n},), {w.name}, {b.name})")
        return self.emit(f"rms_norm({x.name}, {w.name}, eps=1e-6)", f"F.rms_norm({x.name}, ({n},), {w.name}, eps=1e-6)")

    def matmul(self) -> Value | None:
        x = self.pick(lambda v: v.meta.dim() >= 1 and v.dtype.is_floating_point)
        if x is None:
            return None
        k = x.shape[-1]
        batched = x.meta.dim() == 3 and self.draw(st.booleans())
        w = self.add_input((x.shape[0], k, self.dim()) if batched else (k, self.dim()), x.dtype)
        if not batched and self.draw(st.integers(0, 2)) == 0:   # linear: weight [N, K], optional bias
            wt = self.emit(f"transpose({w.name}, 0, 1)", f"{w.name}.t()")
            b = self.add_input((w.shape[1],), x.dtype)
            return self.emit(f"linear({x.name}, {wt.name}, {b.name})", f"F.linear({x.name}, {wt.name}, {b.name})")
        return self.emit(f"{x.name} @ {w.name}", f"{x.name} @ {w.name}")

    def attention(self) -> Value | None:
        """Scores, scale, optional causal mask, softmax, weighted sum: the attention pass's pattern."""
        dt = self.dtype if self.dtype.is_floating_point else torch.float32
        lead = tuple(self.dim() for _ in range(self.draw(st.integers(0, 2))))
        s_q, s_k, d = self.dim(), self.dim(), self.draw(st.sampled_from([1, 2, 4, 8, 16]))
        q, k, v = (self.add_input(lead + (n, d), dt) for n in (s_q, s_k, s_k))
        scale = self.draw(st.sampled_from([1.0, 0.5, 0.125]))
        scores = self.emit(f"(({q.name} @ transpose({k.name}, -2, -1)) * {scale})",
                           f"(({q.name} @ {k.name}.transpose(-2, -1)) * {scale})")
        if scores is None:
            return None
        if self.draw(st.booleans()):
            keep = self.emit(f"causal_mask({s_q}, {s_k})",
                             f"torch.ones({s_q}, {s_k}, dtype=torch.bool, device={q.name}.device).tril()")
            scores = self.emit(f"where({keep.name}, {scores.name}, -inf)",
                               f"torch.where({keep.name}, {scores.name}, float('-inf'))")
        p = self.emit(f"softmax({scores.name}, axis=-1)", f"torch.softmax({scores.name}, dim=-1)")
        return self.emit(f"{p.name} @ {v.name}", f"{p.name} @ {v.name}")

    def view(self) -> Value | None:
        x = self.pick(lambda v: v.meta.dim() >= 1)
        if x is None:
            return None
        shape, rank = list(x.shape), x.meta.dim()
        how = self.draw(st.sampled_from(["permute", "reshape", "slice", "expand", "transpose", "cat", "tril"]))
        if how == "cat":
            y = self.pick(lambda v: v.meta.dim() == rank and v.dtype == x.dtype)
            d = self.draw(st.integers(0, rank - 1))
            if any(a != b for i, (a, b) in enumerate(zip(y.shape, shape)) if i != d):
                return None
            return self.emit(f"cat([{x.name}, {y.name}], axis={d})", f"torch.cat([{x.name}, {y.name}], dim={d})")
        if how == "tril":
            if rank < 2:
                return None
            fn = self.draw(st.sampled_from(["tril", "triu"]))
            k = self.draw(st.integers(-2, 2))
            return self.emit(f"{fn}({x.name}, diagonal={k})", f"torch.{fn}({x.name}, diagonal={k})")
        if how == "permute":
            dims = self.draw(st.permutations(range(rank)))
            return self.emit(f"permute({x.name}, {list(dims)})", f"{x.name}.permute({tuple(dims)})")
        if how == "transpose":
            a, b = self.draw(st.integers(0, rank - 1)), self.draw(st.integers(0, rank - 1))
            return self.emit(f"transpose({x.name}, {a}, {b})", f"{x.name}.transpose({a}, {b})")
        if how == "reshape":
            new = _reshaped(self.draw, shape)
            return self.emit(f"reshape({x.name}, {new})", f"{x.name}.reshape({tuple(new)})")
        if how == "slice":
            d = self.draw(st.integers(0, rank - 1))
            start = self.draw(st.integers(0, shape[d] - 1))
            end = self.draw(st.integers(start + 1, shape[d]))
            step = self.draw(st.integers(1, 3))
            index = ", ".join([":"] * d + [f"{start}:{end}:{step}"])
            return self.emit(f"slice({x.name}, {d}, {start}, {end}, {step})", f"{x.name}[{index}]")
        new = [s if s != 1 else self.draw(st.integers(1, 5)) for s in shape]
        if rank < 3 and self.draw(st.booleans()):
            new = [self.draw(st.integers(2, 4))] + new
        return self.emit(f"expand({x.name}, {new})", f"{x.name}.expand({tuple(new)})")


def _py_num(text: str) -> str:
    return "float('-inf')" if text == "-inf" else text


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """True when broadcasting a with b gives b's shape (so the result keeps b's shape)."""
    if len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(reversed(a), reversed(b)))


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


def _reshaped(draw, shape: list[int]) -> list[int]:
    """Merge two neighbouring dims, split one into two, or insert a 1."""
    rank = len(shape)
    how = draw(st.sampled_from(["merge", "split", "unsqueeze"] if rank >= 2 else ["split", "unsqueeze"]))
    if how == "merge":
        i = draw(st.integers(0, rank - 2))
        return shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
    i = draw(st.integers(0, rank - 1 if how == "split" else rank))
    if how == "unsqueeze":
        return shape[:i] + [1] + shape[i:]
    factors = [f for f in range(1, shape[i] + 1) if shape[i] % f == 0]
    f = draw(st.sampled_from(factors))
    return shape[:i] + [f, shape[i] // f] + shape[i + 1:]


# How an input tensor is laid out in memory: the values are the same, the strides are not.
LAYOUTS = ("contiguous", "contiguous", "transposed", "strided")
STEP_KINDS = ("unary", "binary", "select", "cast", "reduce", "softmax", "norm", "matmul", "attention", "view")


@st.composite
def programs(draw, kinds: tuple[str, ...], dtypes: tuple[torch.dtype, ...] = (torch.float32,),
             max_steps: int = 5) -> Program:
    """A program of 1..max_steps steps drawn from `kinds`, over 1..3 inputs of one dtype (each laid out
    contiguously, transposed or strided)."""
    b = Builder(draw, draw(st.sampled_from(dtypes)))
    rank = draw(st.integers(1, 3))
    base = tuple(b.dim() for _ in range(rank))
    for _ in range(draw(st.integers(1, 3))):
        # a broadcast variant of the base shape: some dims 1, or fewer leading dims
        keep = draw(st.integers(1, rank))
        shape = tuple(s if draw(st.integers(0, 4)) else 1 for s in base[rank - keep:])
        b.add_input(shape if draw(st.booleans()) else base)
    for _ in range(draw(st.integers(1, max_steps))):
        getattr(b, draw(st.sampled_from(kinds)))()
    if not b.p.values:
        b.unary()
    if not b.p.values:
        b.emit(f"{b.p.inputs[0].name} + {b.p.inputs[0].name}", f"{b.p.inputs[0].name} + {b.p.inputs[0].name}")
    outs = [b.p.values[-1]]
    extra = [v for v in b.p.values[:-1]]
    if extra and draw(st.integers(0, 3)) == 0:
        outs.append(draw(st.sampled_from(extra)))
    b.p.outputs = outs
    return b.p


def program(inputs: list[tuple[tuple[int, ...], torch.dtype]], steps: list[tuple[str, str]],
            outputs: tuple[int, ...] = (-1,)) -> Program:
    """A hand-written Program (a regression found by the generator): input (shape, dtype)s, then
    (DSL, Python) expressions over x0.. and v0..; outputs index the steps."""
    p = Program()
    for k, (shape, dtype) in enumerate(inputs):
        p.inputs.append(Value(f"x{k}", torch.zeros(shape, dtype=dtype)))
        p.layouts.append("contiguous")
    for dsl, py in steps:
        meta = _eager_eval(py, {v.name: v.meta for v in p.inputs + p.values})
        assert meta is not None, f"eager refuses {py}"
        v = Value(f"v{len(p.values)}", meta)
        p.steps.append((v.name, dsl, py))
        p.values.append(v)
    p.outputs = [p.values[i] for i in outputs]
    return p


def make_inputs(p: Program, seed: int) -> list[torch.Tensor]:
    """The program's inputs (seeded), on conftest's TEST_DEVICE, each with its drawn layout."""
    from conftest import TEST_DEVICE
    gen = torch.Generator().manual_seed(seed)
    out = []
    for v, how in zip(p.inputs, p.layouts):
        if v.dtype.is_floating_point:
            t = torch.randn(v.shape, generator=gen).to(v.dtype)
        elif v.dtype == torch.bool:
            t = torch.rand(v.shape, generator=gen) < 0.5
        else:
            t = torch.randint(-5, 6, v.shape, generator=gen).to(v.dtype)
        out.append(_laid_out(t.to(TEST_DEVICE), how))
    return out


def _laid_out(t: torch.Tensor, how: str) -> torch.Tensor:
    """`t`'s values with other strides: last two dims swapped in memory, or every other element."""
    if how == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "strided" and t.dim() >= 1:
        wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


def python_function(p: Program, filename: str, f64: bool = False):
    """Compile the program's Python text into a function (linecache keeps its source for fx)."""
    import linecache
    src = p.python(f64)
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    namespace = {"torch": torch, "F": F, "math": math}
    exec(compile(src, filename, "exec"), namespace)   # noqa: S102 (our own generated text)
    return namespace["prog"]

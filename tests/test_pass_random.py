"""Random graphs: the whole pipeline (and each pass alone) keeps the interpreter's results bit-exact.

A seeded generator builds graphs of pointwise, reduction and view ops over a few inputs,
mixed with constants, generators (`full`, `arange`, `tril`), identity elements (1, -0.0,
+0.0), duplicated subexpressions, cast chains and dead code — the material every pass
works on. For each seed: the pipeline's output computes bit-identical outputs (NaN and
the sign of zero included), each pass is idempotent, and the caller's graph is untouched.
A failing seed is reproducible: `random_graph(seed).dump()`.
"""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from minicomp.ir.graph import Graph
from minicomp.ir.verify import verify
from minicomp.passes.manager import DEFAULT_PIPELINE, PASSES, run_pipeline
from pass_testing import assert_same_results

f32, f16, bf16, i32, i64, b8 = torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool
FLOATS = (f32, f16, bf16)
DTYPES = (f32, f32, f32, f16, bf16, i32, i64, b8)
SCALARS = (1.0, 1, 0.0, -0.0, 0, 2.0, 0.5, -1.5, 3, True, False, math.nan, math.inf)
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "tanh", "sigmoid", "relu", "silu", "erf")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "ge", "logical_and", "logical_or")
COMMUTATIVE = ("add", "mul", "maximum", "minimum", "eq", "ne", "logical_and", "logical_or")


class Builder:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.g = Graph(f"random{seed}")
        self.base = self.rng.choice([(3, 5), (2, 3, 4), (7,), (1, 6), (4, 1, 3)])
        self.pool: list[int] = []

    # ------------------------------------------------------------------ picking
    def shape(self) -> tuple[int, ...]:
        """The base shape or one that broadcasts to it."""
        b, r = self.base, self.rng.random()
        if r < 0.5:
            return b
        if r < 0.65:
            return b[1:]
        if r < 0.8:
            return ()
        i = self.rng.randrange(len(b))
        return b[:i] + (1,) + b[i + 1:]

    def pick(self, floats: bool = False) -> int:
        candidates = [n for n in self.pool if not floats or self.g.node(n).dtype in FLOATS] or self.pool
        if self.rng.random() < 0.5:  # prefer recent nodes: deeper graphs
            return self.rng.choice(candidates[-4:])
        return self.rng.choice(candidates)

    def add(self, op: str, *args: int, **attrs) -> int:
        if op == "sub" and any(self.node(a).dtype == b8 for a in args):
            raise ValueError("PyTorch refuses bool subtraction (at run time; meta inference allows it)")
        return self.g.add(op, *args, **attrs)

    def node(self, nid: int):
        return self.g.node(nid)

    # ------------------------------------------------------------------ makers
    def constant(self) -> int:
        if self.rng.random() < 0.6:
            v = self.rng.choice(SCALARS)
            dtype = None
            if isinstance(v, float) and self.rng.random() < 0.3:
                dtype = self.rng.choice(FLOATS)
            return self.g.constant(v, dtype=dtype)
        shape = self.shape()
        values = [self.rng.choice((1.0, 0.0, -0.0, 2.0, -3.0, 0.25, math.nan)) for _ in range(math.prod(shape))]
        return self.g.constant(torch.tensor(values).reshape(shape).to(self.rng.choice(DTYPES[:5])))

    def generator(self) -> int:
        r = self.rng.random()
        if r < 0.4:
            return self.add("full", shape=self.shape(), value=self.rng.choice((1.0, 0.0, -0.0, 2.5)),
                              dtype=self.rng.choice(FLOATS))
        if r < 0.7:
            n = self.base[-1]
            return self.add("arange", start=0, end=n, step=1, dtype=self.rng.choice((f32, i64)))
        rows, cols = (self.base + (1,))[:2] if len(self.base) >= 2 else (self.base[0], self.base[0])
        full = self.add("full", shape=(rows, cols), value=True, dtype=b8)
        return self.add(self.rng.choice(("tril", "triu")), full, diagonal=self.rng.choice((0, 1, -1)))

    def unary(self) -> int:
        x = self.pick(floats=True)
        if self.node(x).dtype not in FLOATS:
            return self.add("logical_not" if self.node(x).dtype == b8 else "neg", x)
        op = self.rng.choice(UNARY + ("pow", "clamp"))
        if op == "pow":
            return self.add("pow", x, exponent=self.rng.choice((2.0, -0.5, 3)))
        if op == "clamp":
            return self.add("clamp", x, min=self.rng.choice((-1.0, None, -0.0)), max=self.rng.choice((1.0, None)))
        return self.add(op, x)

    def binary(self) -> int:
        op = self.rng.choice(BINARY)
        a = self.pick()
        b = self.constant() if self.rng.random() < 0.3 else self.pick()
        if self.rng.random() < 0.5:
            a, b = b, a
        return self.add(op, a, b)

    def where(self) -> int:
        cond = self.add("gt", self.pick(floats=True), self.g.constant(0.0))
        return self.add("where", cond, self.pick(), self.pick())

    def reduction(self) -> int:
        x = self.pick(floats=True)
        rank = len(self.node(x).shape)
        if rank == 0 or self.node(x).dtype not in FLOATS:
            raise ValueError("nothing to reduce")
        axes = tuple(sorted(self.rng.sample(range(rank), self.rng.randint(1, rank))))
        op = self.rng.choice(("sum", "mean", "amax", "amin", "var"))
        factor = math.prod(self.node(x).shape[a] for a in axes)
        extra = {"correction": 1 if factor > 1 else 0} if op == "var" else {}
        return self.add(op, x, axes=axes, keepdim=self.rng.random() < 0.5, **extra)

    def view(self) -> int:
        x = self.pick()
        shape = self.node(x).shape
        r = self.rng.random()
        if r < 0.35 and len(shape) >= 2:
            dims = list(range(len(shape)))
            self.rng.shuffle(dims)
            y = self.add("permute", x, dims=tuple(dims))
            if self.rng.random() < 0.5:
                dims2 = list(range(len(shape)))
                self.rng.shuffle(dims2)
                y = self.add("permute", y, dims=tuple(dims2))
            return y
        if r < 0.6:
            y = self.add("reshape", x, shape=(-1,))
            if self.rng.random() < 0.6:
                y = self.add("reshape", y, shape=self.rng.choice((shape, (1,) + shape, (-1, 1))))
            return y
        if r < 0.8:
            if 1 not in shape and self.rng.random() < 0.5:
                return self.add("expand", x, shape=shape)          # an expand that changes nothing
            y = self.add("expand", x, shape=self.base)
            return self.add("expand", y, shape=(2,) + self.base) if self.rng.random() < 0.4 else y
        if not shape:
            raise ValueError("nothing to slice")
        dim = self.rng.randrange(len(shape))
        step = self.rng.choice((1, 1, 2))
        return self.add("slice", x, dim=dim, start=0, end=shape[dim], step=step)

    def cast(self) -> int:
        x = self.pick()
        y = self.add("cast", x, dtype=self.rng.choice(DTYPES + (torch.float64, torch.int8)))
        if self.rng.random() < 0.6:
            y = self.add("cast", y, dtype=self.rng.choice((self.node(x).dtype,) + DTYPES))
        return y

    def identity(self) -> int:
        x = self.pick()
        op, value = self.rng.choice((("mul", 1.0), ("mul", 1), ("add", -0.0), ("add", 0.0), ("sub", 0.0),
                                     ("sub", -0.0), ("div", 1.0), ("add", 0)))
        c = self.g.constant(value)
        return self.add(op, *((c, x) if op in COMMUTATIVE and self.rng.random() < 0.5 else (x, c)))

    def duplicate(self) -> int:
        ops = [n for n in self.pool if self.node(n).op not in ("input", "constant")]
        if not ops:
            raise ValueError("nothing to duplicate")
        n = self.node(self.rng.choice(ops))
        args = n.args[::-1] if n.op in COMMUTATIVE else n.args
        return self.add(n.op, *args, **n.attrs)

    def neg_neg(self) -> int:
        x = self.pick(floats=True)
        if self.node(x).dtype == b8:
            raise ValueError("no neg of bool")
        return self.add("neg", self.add("neg", x))

    # ------------------------------------------------------------------ the graph
    def build(self) -> Graph:
        for i in range(self.rng.randint(1, 3)):
            shape = self.base if i == 0 else self.shape()
            dtype = f32 if i == 0 else self.rng.choice(DTYPES)
            self.pool.append(self.g.add_input(f"x{i}", shape, dtype))
        makers = [self.constant, self.generator, self.unary, self.unary, self.binary, self.binary,
                  self.binary, self.where, self.reduction, self.view, self.view, self.cast,
                  self.identity, self.identity, self.duplicate, self.neg_neg]
        for _ in range(self.rng.randint(6, 22)):
            try:
                self.pool.append(self.rng.choice(makers)())
            except ValueError:  # operands that do not fit (shapes, dtypes): try another
                continue
        ops = [n for n in self.pool if self.node(n).op != "input"] or self.pool
        outputs = [ops[-1]] + self.rng.sample(ops, min(len(ops), self.rng.randint(0, 2)))
        self.g.set_outputs(outputs)
        verify(self.g)
        return self.g


def random_graph(seed: int) -> Graph:
    return Builder(seed).build()


@functools.lru_cache(maxsize=None)
def optimised(seed: int) -> tuple[Graph, str, Graph, list]:
    """(random graph, its dump, pipeline output, records), computed once per seed."""
    g = random_graph(seed)
    original = g.dump()
    out, records = run_pipeline(g)
    return g, original, out, records


SEEDS = range(150)


@pytest.mark.parametrize("seed", SEEDS)
def test_pipeline_keeps_results_bit_exact(seed):
    g, original, out, records = optimised(seed)
    assert g.dump() == original
    assert_same_results(g, out, seed=seed)
    _, again = run_pipeline(out)
    assert not any(r.changed for r in again), [(r.name, r.changes) for r in again if r.changed]


@pytest.mark.parametrize("name", sorted(set(DEFAULT_PIPELINE)))
def test_each_pass_alone_is_exact_and_idempotent(name):
    for seed in range(0, len(SEEDS), 4):
        g = random_graph(seed)
        once, _ = PASSES[name].run(g)
        verify(once)
        assert_same_results(g, once, seed=seed)
        twice, changes = PASSES[name].run(once)
        assert changes == {}, f"seed {seed}: {name} not idempotent: {changes}"
        assert twice.dump() == once.dump()


def test_the_generator_exercises_every_pass():
    """A guard against a generator that silently stops producing work for the passes."""
    totals: dict[str, int] = {}
    for seed in SEEDS:
        records = optimised(seed)[3]
        for r in records:
            for k, v in r.changes.items():
                totals[k] = totals.get(k, 0) + v
    for key in ("folded", "merged", "removed", "mul_one", "add_zero", "sub_zero", "div_one", "neg_neg",
                "permute_permute", "reshape_reshape", "cast_chain", "expand_expand", "slice_whole"):
        assert totals.get(key, 0) > 0, (key, totals)

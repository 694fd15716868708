"""Every DSL builtin on zero-size dims and on each kind of dtype: eager's answer, or a
SourceError where eager refuses.

Each builtin is called on an input whose shape has a zero (or, for comparison, none), in
f32, and on i32, b8 and f16 inputs, with its dims bound as symbols. Where eager PyTorch
computes the same expression, the frontend must give a verified graph whose reference run
equals eager's result (shape, dtype and values); where eager raises, the frontend must
raise SourceError (never another exception, and never a graph: head dim 0 used to raise
ZeroDivisionError, and softmax of an i32 tensor quietly gave zeros). One shape per dtype
also runs end to end.
A builtin missing from the table below fails `test_every_builtin_is_covered`, except
elementwise registry ops, which are covered by their arity.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import tol
from minicomp.api import compile_graph
from minicomp.errors import CompileError, SourceError
from minicomp.frontend.dsl import load_dsl
from minicomp.frontend.dsl_builtins import BUILTINS
from minicomp.ir import ops
from minicomp.ir.interpret import run

# (shape, dtype): zero dims in every position in f32; other dtypes on a plain and an empty shape
CASES = [(s, torch.float32) for s in [(0,), (0, 3), (3, 0), (2, 0, 3), (0, 0), (2, 3)]] + \
    [(s, dt) for dt in (torch.int32, torch.bool, torch.float16) for s in [(2, 3), (3, 0)]]
END_TO_END = {((3, 0), torch.float32), ((2, 3), torch.int32), ((2, 3), torch.bool)}
# End-to-end runs known to fail outside the frontend, pinned as they fail today (so a fix shows up).
# (name, shape, dtype) -> why: a kernel Triton's compiler rejects for cuda:90 (none now: amin of
# b8, whose loop-carried accumulator changed type, is fixed by the reductions branch's row kernels)
KNOWN_CODEGEN_BUGS: dict = {}
DSL_DTYPE = {torch.float32: "f32", torch.int32: "i32", torch.bool: "b8", torch.float16: "f16"}


def _dims(rank: int) -> str:
    return ", ".join(f"D{i}" for i in range(rank))


# builtin -> (DSL expression over x with dims D0.., eager function of x)
TABLE = {
    "where": ("where(x > 0.0, x, 0.0)", lambda x: torch.where(x > 0, x, 0.0)),
    "gelu": ('gelu(x, approximate="tanh")', lambda x: F.gelu(x, approximate="tanh")),
    "silu": ("silu(x)", F.silu),
    "pow": ("pow(x, 2)", lambda x: torch.pow(x, 2)),
    "clamp": ("clamp(x, min=-0.5, max=0.5)", lambda x: torch.clamp(x, -0.5, 0.5)),
    "cast": ("cast(x, f16)", lambda x: x.to(torch.float16)),
    "type_as": ("type_as(x, cast(x, bf16))", lambda x: x.to(torch.bfloat16)),
    "tril": ("tril(x, diagonal=1)", lambda x: torch.tril(x, 1)),
    "triu": ("triu(x, diagonal=-1)", lambda x: torch.triu(x, -1)),
    "full": ("full([{dims}], 1.5)", lambda x: torch.full(x.shape, 1.5)),
    "arange": ("arange(D0)", lambda x: torch.arange(x.shape[0])),
    "causal_mask": ("causal_mask(D0, D{last})", lambda x: torch.ones(x.shape[0], x.shape[-1], dtype=torch.bool).tril()),
    "sum": ("sum(x, axis=-1)", lambda x: torch.sum(x, -1)),
    "mean": ("mean(x, axis=0, keepdim=true)", lambda x: torch.mean(x, 0, keepdim=True)),
    "amax": ("amax(x, axis=-1)", lambda x: torch.amax(x, -1)),
    "amin": ("amin(x, axis=0)", lambda x: torch.amin(x, 0)),
    "var": ("var(x, axis=-1, correction=0)", lambda x: torch.var(x, -1, correction=0)),
    "softmax": ("softmax(x, axis=-1)", lambda x: torch.softmax(x, -1)),
    "log_softmax": ("log_softmax(x, axis=0)", lambda x: torch.log_softmax(x, 0)),
    "layer_norm": ("layer_norm(x)", lambda x: F.layer_norm(x, x.shape[-1:])),
    "rms_norm": ("rms_norm(x)", lambda x: F.rms_norm(x, x.shape[-1:])),
    "matmul": ("x @ transpose(x, 0, -1)", lambda x: x @ x.transpose(0, -1)),
    "linear": ("linear(x, x)", lambda x: F.linear(x, x)),
    "attention": ("attention(x, x, x)", lambda x: F.scaled_dot_product_attention(x, x, x)),
    "reshape": ("reshape(x, [-1])", lambda x: x.reshape(-1)),
    "expand": ("expand(unsqueeze(x, 0), [2, {dims}])", lambda x: x.unsqueeze(0).expand(2, *x.shape)),
    "permute": ("permute(x, [{reversed}])", lambda x: x.permute(*reversed(range(x.dim())))),
    "transpose": ("transpose(x, 0, -1)", lambda x: x.transpose(0, -1)),
    "unsqueeze": ("unsqueeze(x, -1)", lambda x: x.unsqueeze(-1)),
    "squeeze": ("squeeze(x)", lambda x: x.squeeze()),
    "contiguous": ("contiguous(x) + 0.0", lambda x: x + 0.0),
    "slice": ("slice(x, -1, 1, 3)", lambda x: x[..., 1:3]),
    "cat": ("cat([x, x * 2.0], axis=-1)", lambda x: torch.cat([x, x * 2.0], -1)),
    # not torch.* names: torch.nn.functional's
    "hardsigmoid": ("hardsigmoid(x)", F.hardsigmoid),
    "hardswish": ("hardswish(x)", F.hardswish),
    "mish": ("mish(x)", F.mish),
    # integer division by an element that is 0 is data, which eager refuses and kernels divide
    # by 1 (docs/bad_input.md): the rule here is about dtypes, so the divisor is a number
    "div": ('div(x, -3, rounding_mode="trunc")', lambda x: torch.div(x, -3, rounding_mode="trunc")),
    "floor_divide": ("floor_divide(x, -3)", lambda x: torch.floor_divide(x, -3)),
    "remainder": ("remainder(x, -3)", lambda x: torch.remainder(x, -3)),
    "fmod": ("fmod(x, -3)", lambda x: torch.fmod(x, -3)),
}


def _case(name: str) -> tuple[str, object]:
    if name in TABLE:
        return TABLE[name]
    arity = ops.get(name).arity  # an elementwise registry op: operands only
    fn = getattr(torch, name)
    return f"{name}({', '.join(['x'] * arity)})", lambda x: fn(*[x] * arity)


def test_the_op_tables_internal_ops_are_not_builtins():
    # div_trunc and pow_tensor are the table's spellings of div's rounding mode and of pow with
    # a tensor exponent: the DSL has PyTorch's names only (docs/dsl.md, "Builtins")
    assert {"div_trunc", "pow_tensor"} <= set(ops.REGISTRY)
    assert not {"div_trunc", "pow_tensor"} & set(BUILTINS)


def test_every_builtin_is_covered():
    uncovered = [n for n in BUILTINS if n not in TABLE and not (n in ops.REGISTRY and hasattr(torch, n))]
    assert not uncovered, f"add these builtins to TABLE: {uncovered}"


def _eager(fn, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var over an empty axis warns, as eager does
        try:
            return fn(x), None
        except (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError) as err:
            return None, err


def _program(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[str, dict[str, int]]:
    template, _ = _case(name)
    expr = template.format(dims=_dims(len(shape)), last=max(len(shape) - 1, 0),
                           reversed=", ".join(str(i) for i in reversed(range(len(shape)))))
    src = f"func f(x: {DSL_DTYPE[dtype]}[{_dims(len(shape))}]) {{\n  return {expr}\n}}\n"
    return src, {f"D{i}": d for i, d in enumerate(shape)}


def _input(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen).to(dtype)


@pytest.mark.parametrize("shape,dtype", CASES, ids=[f"{DSL_DTYPE[d]}-{'x'.join(map(str, s))}" for s, d in CASES])
@pytest.mark.parametrize("name", list(BUILTINS))
def test_eagers_answer_or_a_source_error_where_eager_refuses(name, shape, dtype):
    src, dims = _program(name, shape, dtype)
    x = _input(shape, dtype)
    want, refused = _eager(_case(name)[1], x)
    # the DSL's rules do not depend on sizes: what eager's kernels refuse for a dtype is refused
    # at every shape (eager skips the kernel, and so its dtype check, on an empty tensor)
    _, refused_when_full = _eager(_case(name)[1], _input(tuple(d or 2 for d in shape), dtype))
    refused = refused or refused_when_full
    if refused is not None:
        with pytest.raises(SourceError):
            load_dsl(src, "z.mc", dims=dims)
        return
    graph = load_dsl(src, "z.mc", dims=dims)
    (got,) = run(graph, [x])
    assert got.shape == want.shape and got.dtype == want.dtype, src
    torch.testing.assert_close(got, want, equal_nan=True, **tol(want.dtype))
    if (name, shape, dtype) in KNOWN_CODEGEN_BUGS and os.environ.get("MINICOMP_VERIFY_TARGET") != "off":
        with pytest.raises(CompileError, match="rejected by Triton's compiler"):
            compile_graph(graph, [x])
    elif (shape, dtype) in END_TO_END:
        (compiled,) = compile_graph(graph, [x]).call(x)
        torch.testing.assert_close(compiled, want, equal_nan=True, **tol(want.dtype))


# PyTorch's spellings of the table's internal ops: div's rounding modes and pow with a tensor
# exponent, with broadcasting, an odd shape and each kind of dtype, end to end against eager.
SPELLINGS = [
    ('div(x, y, rounding_mode="trunc")', lambda x, y: torch.div(x, y, rounding_mode="trunc")),
    ('div(x, y, rounding_mode="floor")', lambda x, y: torch.div(x, y, rounding_mode="floor")),
    ("div(x, y)", torch.div),
    ("pow(x, y)", torch.pow),
    ("pow(2.0, y)", lambda x, y: torch.pow(2.0, y)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=["f32", "f16", "i32"])
@pytest.mark.parametrize("expr,eager", SPELLINGS, ids=[e for e, _ in SPELLINGS])
def test_rounding_modes_and_tensor_exponents_are_pytorchs(expr, eager, dtype):
    name = DSL_DTYPE[dtype]
    gen = torch.Generator().manual_seed(1)
    if dtype.is_floating_point:
        x, y = torch.randn(5, 7, generator=gen).to(dtype), torch.randn(7, generator=gen).to(dtype)
    else:  # divisors and exponents with no zero or negative element: those are data, not types
        x, y = torch.randint(-9, 10, (5, 7), generator=gen, dtype=dtype), torch.randint(1, 4, (7,), generator=gen,
                                                                                            dtype=dtype)
    src = f"func f(x: {name}[5, 7], y: {name}[7]) {{\n  return {expr}\n}}\n"
    want = eager(x, y)
    graph = load_dsl(src, "z.mc")
    (got,) = compile_graph(graph, [x, y]).call(x, y)
    assert got.dtype == want.dtype, src
    torch.testing.assert_close(got, want, equal_nan=True, **tol(want.dtype))


@pytest.mark.parametrize("expr,eager,message", [
    ("floor_divide(x, 0)", lambda x: torch.floor_divide(x, 0),
     "floor_divide: integer division by zero (eager raises RuntimeError: ZeroDivisionError)"),
    ('div(x, 0, rounding_mode="trunc")', lambda x: torch.div(x, 0, rounding_mode="trunc"),
     "div_trunc: integer division by zero"),
    ("remainder(x, full([3], 0, dtype=i32))", lambda x: torch.remainder(x, torch.zeros(3, dtype=torch.int32)),
     "remainder: integer division by zero"),
    ("fmod(x, false)", lambda x: torch.fmod(x, False), "fmod: integer division by zero"),
    ('div(x, 2, rounding_mode="round")', lambda x: torch.div(x, 2, rounding_mode="round"),
     'rounding_mode must be "trunc" or "floor" (or left out), got "round"'),
    ("lerp(x, x, 0.5)", lambda x: torch.lerp(x, x, 0.5),
     "lerp of a i32 start is not supported (eager raises NotImplementedError)"),
], ids=["floor_divide-0", "div-trunc-0", "remainder-full-0", "fmod-false", "rounding-mode", "lerp-int"])
def test_what_eager_refuses_whatever_the_data_is_a_source_error(expr, eager, message):
    src = f"func f(x: i32[3]) {{\n  return {expr}\n}}\n"
    x = torch.tensor([-7, 7, 5], dtype=torch.int32)
    with pytest.raises((RuntimeError, NotImplementedError)):
        eager(x)
    with pytest.raises(SourceError) as info:
        load_dsl(src, "z.mc")
    assert info.value.message.startswith(message), info.value.message


def test_a_bool_exponent_is_refused():
    # eager would take True as 1; in a program it is a mistake (the exponent is a number or a tensor)
    with pytest.raises(SourceError, match="argument 'exponent' of pow\\(\\) must be a tensor, an int or a float, "
                                          "got bool true"):
        load_dsl("func f(x: f32[3]) {\n  return pow(x, true)\n}\n", "z.mc")


def test_a_float_division_by_zero_is_eagers_inf():
    x = torch.tensor([-1.0, 0.0, 2.0])
    graph = load_dsl("func f(x: f32[3]) {\n  return floor_divide(x, 0) + fmod(x, 0.0)\n}\n", "z.mc")
    (got,) = compile_graph(graph, [x]).call(x)
    torch.testing.assert_close(got, torch.floor_divide(x, 0) + torch.fmod(x, 0.0), equal_nan=True)


@pytest.mark.parametrize("name", ["amin", "amax"])
def test_amin_amax_of_b8_compile_for_cuda90(name):
    # the looped kernel of amin of b8 used to be rejected by Triton's compiler for cuda:90
    x = _input((2, 3), torch.bool)
    graph = load_dsl(f"func f(x: b8[D0, D1]) {{\n  return {name}(x, axis=-1)\n}}\n", "z.mc", dims={"D0": 2, "D1": 3})
    (compiled,) = compile_graph(graph, [x]).call(x)
    assert torch.equal(compiled, getattr(torch, name)(x, -1))

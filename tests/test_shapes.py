"""Shape rules (minicomp/ir/shapes.py) against the meta references they stand in for.

Every answer a rule gives must be the meta reference's answer: same shape, same dtype, and
no error where the reference raises one. A rule may decline (None) anything.
"""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minicomp.ir import graph as graph_mod
from minicomp.ir import ops
from minicomp.ir.shapes import RULES, broadcast, rule

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.int64, torch.int32]
dims = st.sampled_from([0, 1, 2, 3, 5])
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
dtypes = st.sampled_from(DTYPES)
small_ints = st.integers(min_value=-6, max_value=6)


def meta(op: str, operands, attrs):
    """(shape, dtype) from the meta reference, or the ValueError it raises."""
    nodes = [SimpleNamespace(shape=s, dtype=d) for s, d in operands]
    try:
        return graph_mod._infer_meta(ops.get(op), nodes, attrs)
    except ValueError as e:
        return e


def related(draw, base):
    """A shape that often broadcasts with `base`: some dims kept, some set to 1, some dropped."""
    out = [draw(st.sampled_from([s, 1, s, 3])) for s in base]
    return tuple(out[draw(st.integers(0, len(out))):])


@st.composite
def cases(draw):
    op = draw(st.sampled_from(sorted(RULES)))
    d = ops.get(op)
    base = draw(shapes)
    arity = d.arity if d.arity is not None else draw(st.integers(1, 3))
    if op == "attention":
        b, h, sq, sk, hd = (draw(st.sampled_from([1, 2, 3])) for _ in range(5))
        hk = draw(st.sampled_from([h, 1, 2]))
        dt = draw(dtypes)
        operands = [((b, h, sq, hd), dt), ((b, hk, sk, hd), draw(st.sampled_from([dt, dt, torch.float32]))),
                    ((b, hk, sk, draw(st.sampled_from([hd, 2]))), dt)]
        if draw(st.booleans()):
            operands.append((related(draw, (b, h, sq, sk)), draw(st.sampled_from([torch.bool, dt, torch.float32]))))
        attrs = dict(scale=None, is_causal=draw(st.booleans()), enable_gqa=draw(st.booleans()))
        return op, operands, attrs
    if op == "matmul":
        k = draw(dims)
        a = base + (draw(dims), k) if draw(st.booleans()) else draw(shapes)
        b = related(draw, base) + (draw(st.sampled_from([k, k, 2])), draw(dims))
        dt = draw(dtypes)
        return op, [(a, dt), (b, draw(st.sampled_from([dt, dt, torch.float16])))], {}
    operands = [(base if i == 0 else related(draw, base), draw(dtypes)) for i in range(arity)]
    if op == "where" and draw(st.booleans()):
        operands[0] = (operands[0][0], torch.bool)
    attrs = {}
    for name in d.attrs:
        if name in ("axes", "dims"):
            attrs[name] = tuple(draw(st.lists(small_ints, max_size=len(base) + 1)))
        elif name == "shape":
            attrs[name] = tuple(draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3, 5, 6, 15]), max_size=5)))
        elif name in ("dim", "diagonal", "axis"):
            attrs[name] = draw(small_ints)
        elif name in ("start", "end"):
            attrs[name] = draw(st.one_of(st.none(), small_ints))
        elif name == "step":
            attrs[name] = draw(st.integers(-1, 3))
        elif name == "keepdim":
            attrs[name] = draw(st.booleans())
        elif name == "correction":
            attrs[name] = draw(st.sampled_from([0, 1]))
        elif name == "dtype":
            attrs[name] = draw(dtypes)
        elif name == "value":
            attrs[name] = draw(st.sampled_from([0, 1, 2.5, True, float("-inf")]))
        elif name == "approximate":
            attrs[name] = draw(st.sampled_from(["none", "tanh", "exact"]))
        elif name == "exponent":
            attrs[name] = draw(st.sampled_from([2, 0.5, -1.0]))
        elif name in ("min", "max"):
            attrs[name] = draw(st.sampled_from([None, -1.0, 2]))
        elif name == "decimals":
            attrs[name] = draw(st.sampled_from([0, 2, -1]))
        elif name in ("nan", "posinf", "neginf", "eps"):
            attrs[name] = draw(st.sampled_from([None, 0.5, -2.0]))
        elif name in ("alpha", "scale", "input_scale", "negative_slope", "beta", "threshold", "min_val", "max_val"):
            attrs[name] = draw(st.sampled_from([1.0, 0.5, -1.0, 2]))
        elif name == "shifts":
            attrs[name] = tuple(draw(st.lists(small_ints, max_size=len(base) + 1)))
        elif name == "pad":
            attrs[name] = tuple(draw(st.lists(st.integers(-3, 3), max_size=2 * len(base) + 2)))
    return op, operands, attrs


@settings(max_examples=1500, deadline=None)
@given(cases())
def test_a_rule_answers_only_what_the_meta_reference_answers(case):
    op, operands, attrs = case
    got = rule(op, operands, attrs)
    if got is None:
        return
    want = meta(op, operands, attrs)
    assert not isinstance(want, Exception), f"{op}{operands} {attrs}: rule says {got}, meta raises {want}"
    assert got == (tuple(want[0]), want[1]), f"{op}{operands} {attrs}"


@pytest.mark.parametrize("op, operands, attrs, want", [
    ("add", [((2, 3), torch.float16), ((), torch.float32)], {}, ((2, 3), torch.float16)),
    ("mul", [((4, 1, 3), torch.bfloat16), ((5, 1), torch.float32)], {}, ((4, 5, 3), torch.float32)),
    ("lt", [((3,), torch.float32), ((2, 1), torch.float32)], {}, ((2, 3), torch.bool)),
    ("where", [((3, 3), torch.bool), ((1, 3), torch.float16), ((), torch.float32)], {}, ((3, 3), torch.float16)),
    ("mean", [((2, 5, 7), torch.float32)], {"axes": (-1,), "keepdim": True}, ((2, 5, 1), torch.float32)),
    ("reshape", [((2, 6), torch.float16)], {"shape": (3, -1)}, ((3, 4), torch.float16)),
    ("permute", [((2, 3, 5), torch.float32)], {"dims": (2, 0, 1)}, ((5, 2, 3), torch.float32)),
    ("expand", [((3, 1), torch.float32)], {"shape": (2, -1, 4)}, ((2, 3, 4), torch.float32)),
    ("slice", [((7, 3), torch.float32)], {"dim": 0, "start": 2, "end": None, "step": 2}, ((3, 3), torch.float32)),
    ("matmul", [((2, 1, 5, 3), torch.float16), ((4, 3, 6), torch.float16)], {}, ((2, 4, 5, 6), torch.float16)),
    ("attention", [((2, 8, 5, 16), torch.bfloat16), ((2, 2, 7, 16), torch.bfloat16), ((2, 2, 7, 4), torch.bfloat16)],
     {"scale": None, "is_causal": True, "enable_gqa": True}, ((2, 8, 5, 4), torch.bfloat16)),
    ("full", [], {"shape": (3, 3), "value": 1, "dtype": torch.bool}, ((3, 3), torch.bool)),
])
def test_rules_answer_the_common_cases_like_meta(op, operands, attrs, want):
    assert rule(op, operands, attrs) == want
    assert meta(op, operands, attrs) == want


@pytest.mark.parametrize("op, operands, attrs", [
    ("add", [((2, 3), torch.float32), ((4,), torch.float32)], {}),                # does not broadcast
    ("neg", [((2,), torch.bool)], {}),                                             # PyTorch refuses neg of bool
    ("matmul", [((2, 3), torch.float16), ((3, 4), torch.float32)], {}),            # mixed dtypes
    ("reshape", [((2, 3), torch.float32)], {"shape": (4, -1)}),                    # 6 is not a multiple of 4
    ("amax", [((0, 3), torch.float32)], {"axes": (0,), "keepdim": False}),         # max of nothing
    ("mean", [((2, 3), torch.int64)], {"axes": (0,), "keepdim": False}),           # mean of ints
])
def test_rules_decline_what_pytorch_refuses(op, operands, attrs):
    assert rule(op, operands, attrs) is None
    assert isinstance(meta(op, operands, attrs), ValueError)


def test_broadcast():
    assert broadcast((2, 1, 3), (4, 1), ()) == (2, 4, 3)
    assert broadcast((0, 3), (1, 3)) == (0, 3)
    assert broadcast((2, 3), (3, 2)) is None

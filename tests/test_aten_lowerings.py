"""Every aten overload the op table lowers, one test each (the test column of docs/ops.md).

For each overload, on the example of `aten_examples.py`:
- its handler (`fx_ops.LOWERINGS`) lowers the call without giving up, to nodes of exactly
  the shape and dtype eager PyTorch gives, using the op or composite the table says;
- the reference interpreter and the compiled module (Triton kernels under the interpreter)
  both equal eager PyTorch;
- the compiled plan holds a group of the kind docs/ops.md lists for it;
- capturing a function that calls the overload reaches that handler, unless PyTorch
  decomposes the overload before capture sees it (docs/ops.md says which).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from aten_examples import EXAMPLES, example
from conftest import tol

from minicomp.api import compile_graph
from minicomp.frontend import fx_ops, ops_doc
from minicomp.frontend.fx import capture, opaque_nodes
from minicomp.frontend.fx_ops import Ctx, T
from minicomp.ir import ops
from minicomp.ir.graph import Graph
from minicomp.ir.interpret import run
from minicomp.ir.verify import verify

LOWERED = sorted(fx_ops.table_name(t) for t in fx_ops.LOWERINGS)


def test_every_lowered_overload_has_an_example():
    assert sorted(EXAMPLES) == LOWERED


def _bind(target: Any, args: tuple, kwargs: dict) -> list:
    """The arguments in schema order with defaults filled in, as the fx frontend passes them."""
    out = []
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        else:
            out.append(a.default_value)
    return out


def _lower(name: str):
    """(graph, inputs, wanted outputs) for the example of `name`, lowered by its handler."""
    target = fx_ops.resolve(name)
    args, kwargs = example(name)
    with torch.no_grad():
        want = target(*args, **kwargs)
    g = Graph(name.replace(".", "_").replace(":", "_"))
    inputs: list[torch.Tensor] = []

    def traced(v):
        if isinstance(v, torch.Tensor):
            inputs.append(v)
            return T(g.add_input(f"in{len(inputs) - 1}", tuple(v.shape), v.dtype))
        if isinstance(v, list):
            return [traced(x) for x in v]
        return v

    bound = _bind(target, tuple(traced(a) for a in args), {k: traced(v) for k, v in kwargs.items()})
    out = fx_ops.LOWERINGS[target](Ctx(g, "example", want), *bound)
    pairs = list(zip(out, want)) if isinstance(out, list) else [(out, want)]
    pairs = [(o, w) for o, w in pairs if o is not None]
    g.set_outputs([o for o, _ in pairs])
    return g, inputs, [w for _, w in pairs]


def _compute_ops(g: Graph) -> set[str]:
    return {n.op for n in g.nodes() if n.kind not in ("input", "constant")}


@pytest.mark.parametrize("name", LOWERED, ids=lambda n: str(fx_ops.resolve(n)))
def test_lowering(name):
    g, inputs, wants = _lower(name)
    assert wants, "no output of the overload was lowered"
    verify(g)
    for o, w in zip(g.outputs, wants):
        assert (g.node(o).shape, g.node(o).dtype) == (tuple(w.shape), w.dtype), g.dump()

    # the table's claim: the op it names is in the graph, or only the composite's ops are
    owner = ops.ATEN[name]
    used = _compute_ops(g)
    if owner in ops.REGISTRY:
        d = ops.REGISTRY[owner]
        assert owner in used or (d.kind == "constant" and any(n.op == "constant" for n in g.nodes())), g.dump()
    else:
        c = ops.COMPOSITES[owner]
        assert used <= set(c.ops) | {"cast", "reshape"}, g.dump()
        assert bool(used) == bool(c.ops), g.dump()

    for got, w in zip(run(g, inputs), wants):
        torch.testing.assert_close(got, w, **tol(w.dtype), equal_nan=True)
    compiled = compile_graph(g, inputs)
    for got, w in zip(compiled.call(*inputs), wants):
        torch.testing.assert_close(got, w, **tol(w.dtype), equal_nan=True)

    kind = ops_doc.group_kind(name)
    if kind in ("pointwise", "reduction", "gemm", "attention"):
        assert kind in compiled.plan.kinds(), str(compiled.plan)
    # a kernel, unless the table lists the overload as running through PyTorch (and then it must)
    assert bool(compiled.generated.fallbacks) == (name in ops.RUNS_IN_PYTORCH), compiled.generated.fallbacks


def _spy(monkeypatch, target) -> list:
    calls: list = []
    handler = fx_ops.LOWERINGS[target]
    monkeypatch.setitem(fx_ops.LOWERINGS, target, lambda *a: calls.append(1) or handler(*a))
    return calls


@pytest.mark.parametrize("name", LOWERED, ids=lambda n: str(fx_ops.resolve(n)))
def test_capture_reaches_the_handler(name, monkeypatch):
    target = fx_ops.resolve(name)
    args, kwargs = example(name)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if any(isinstance(a, list) and any(isinstance(x, torch.Tensor) for x in a) for a in args) or any(
            isinstance(v, torch.Tensor) for v in kwargs.values()):
        pytest.skip("the example passes tensors inside a list or by keyword")
    calls = _spy(monkeypatch, target)

    def fn(*ts):
        it = iter(ts)
        out = target(*[next(it) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out   # the outputs after the first stay opaque

    g = capture(fn, tensors)
    seen = ops_doc.captured(name)
    if seen == "yes":
        assert calls, f"capture never asked the handler of {target}:\n{g.dump()}"
        assert not opaque_nodes(g), g.dump()
    elif seen.startswith("no"):
        assert not calls, f"{target} reached capture, but docs/ops.md says: {seen}"


def test_make_fx_capture_lifts_a_tensor_made_inside_the_function(monkeypatch):
    # the one case docs/ops.md lists for lift_fresh_copy
    calls = _spy(monkeypatch, torch.ops.aten.lift_fresh_copy.default)
    x = torch.randn(3, 2)
    g = capture(lambda x: x + torch.tensor([1.0, 2.0]), [x], tracer="fake")
    assert calls and not opaque_nodes(g), g.dump()
    torch.testing.assert_close(run(g, [x])[0], x + torch.tensor([1.0, 2.0]))

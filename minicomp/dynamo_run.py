"""How the Dynamo backend runs a graph it compiled (minicomp/dynamo.py): the boxed callables
AOTAutograd calls (`HostScalars`: a graph compiled with the numbers it is handed in 0-d CPU
tensors as constants), and the fixes that make the module's outputs alias and stride as the
graph's own would (two outputs that are one tensor, an alias of an input the graph does not
return, strides that differ from the graph's meta).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from minicomp.api import Compiled, run_compiled
from minicomp.frontend import aot


def _expected_outputs(gm: fx.GraphModule) -> list[tuple[fx.Node, bool]]:
    """Each tensor output's node, and whether the graph itself returns an alias of an input."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [(n, _aliases_input(n)) for n in out.args[0]]


def _aliases_input(node: Any) -> bool:
    while isinstance(node, fx.Node):
        if node.op == "placeholder":
            return True
        schema = getattr(node.target, "_schema", None)
        if not (schema and schema.returns and schema.returns[0].alias_info is not None and not schema.is_mutable):
            return False
        node = node.args[0]
    return False


class _Run:
    """The boxed callable AOTAutograd calls with the graph's flat tensor arguments."""
    _boxed_call = True

    def __init__(self, compiled: Compiled, layout: aot.OutputLayout, expected: list[tuple[fx.Node, bool]],
                 record: Any, graphs: bool = False, static: frozenset[int] = frozenset()):   # dynamo.GraphRecord
        self.compiled, self.layout, self.expected, self.record = compiled, layout, expected, record
        self.fixes: list[str] | None = None      # per output: "", "copy" or "restride"
        self.graphs, self.static = graphs, static   # mode="reduce-overhead"; the parameters' and buffers' positions
        self.graphed: Callable[..., list[torch.Tensor]] | None = None

    def __call__(self, args: list) -> list:
        outs = self.graphed(*args) if self.graphed is not None else self._launch(*args)
        if self.fixes is None:
            self.fixes = self._plan_fixes(args, outs)
            if self.graphs:
                self.graphed = self._graphed(args)
        if any(self.fixes):
            outs = [_fix(o, how, self.expected[i][0]) for i, (o, how) in enumerate(zip(outs, self.fixes))]
        return self.layout.merge(outs)

    def _launch(self, *args: torch.Tensor) -> list[torch.Tensor]:
        ran, outs = run_compiled(self.compiled, args)
        if ran is not self.compiled:             # a kernel Triton rejected now runs through PyTorch
            self.compiled = ran
            self.record.pytorch_ops += [f"group {g} runs through PyTorch: {why}" for g, why in ran.forced.items()]
        return outs

    def _graphed(self, args: Sequence[Any]) -> Callable[..., list[torch.Tensor]]:
        """This graph's call replayed as CUDA graphs from its next call (runtime/cuda_graphs.py):
        parameters and buffers read in place, the other inputs copied in."""
        from minicomp.runtime.cuda_graphs import GraphedCall, hazards
        found = hazards(self.compiled)
        if any(alias for _, alias in self.expected):
            # AOTAutograd rebuilds such an output on the caller's input from the one returned
            found.append("an output of the graph is a view of one of its inputs")
        live = set(self.static) | {i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)}
        graphed = GraphedCall(self._launch, len(args), sorted(live), by_layout=self.compiled.graph.symbolic,
                              found=found, name=f"graph {self.record.index}")
        graphed.warmed(args)
        self.record.graphs.append(graphed.status)
        return graphed

    def _plan_fixes(self, args: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> list[str]:
        in_storage = {_storage(a) for a in args if isinstance(a, torch.Tensor)}
        fixes, seen = [], {}
        for i, (o, (node, graph_alias)) in enumerate(zip(outs, self.expected)):
            want = node.meta["val"]
            how = ""
            twin = seen.get(id(o))
            if twin is not None and self.expected[twin][0] is not node:
                how = "copy"                     # two outputs that are one tensor; the graph's are two
            elif not graph_alias and _storage(o) in in_storage:
                how = "copy"                     # an alias of an input the graph does not return
            if o.numel() > 1 and _concrete_strides(want) and _strides(o) != _strides(want):
                how = "restride"                 # (over symbolic sizes the module's are contiguous)
            fixes.append(how)
            seen.setdefault(id(o), i)
        return fixes


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else -id(t)


def _concrete_strides(t: torch.Tensor) -> bool:
    return not any(isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride()))


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    # strides of size-1 dimensions address nothing
    return tuple(int(s) for s, n in zip(t.stride(), t.shape) if n != 1)


def _fix(t: torch.Tensor, how: str, node: fx.Node) -> torch.Tensor:
    if how == "copy":
        return t.clone()
    if how == "restride":
        want = node.meta["val"]
        out = torch.empty_strided(tuple(t.shape), tuple(int(s) for s in want.stride()), dtype=t.dtype, device=t.device)
        return out.copy_(t)
    return t


class HostScalars:
    """A graph some of whose inputs are numbers in 0-d CPU tensors (`aot.host_scalars`).

    It is compiled (by `compile(graph, example inputs, static positions)`, the backend's
    compile of one graph) with each such input a constant of its value, which every call
    checks (a CPU read, no device sync): `math.pi` and a model's `eps` fold into the kernels.
    A call with other values compiles again for them, up to `VERSIONS` sets; a number that
    keeps changing (a float argument of the function) then gets one compile that reads it as a
    tensor on the graph's device, copied there at each call."""
    _boxed_call = True
    VERSIONS = 4

    def __init__(self, gm: fx.GraphModule, inputs: list[Any], values: dict[int, Any], static: frozenset[int],
                 compile: Callable[[fx.GraphModule, list[Any], frozenset[int]], Callable[[list], list]]):
        self.gm, self.inputs, self.static, self.compile = gm, inputs, static, compile
        self.positions = sorted(values)
        self.versions: dict[tuple, Callable[[list], list]] = {}
        self.general: Callable[[list], list] | None = None
        self._version(tuple(values[i] for i in self.positions))   # at compile time, as every graph

    def _version(self, values: tuple) -> Callable[[list], list]:
        key = tuple("nan" if v != v else v for v in values)     # NaN equals nothing, "nan" itself
        run = self.versions.get(key)
        if run is not None:
            return run
        if len(self.versions) >= self.VERSIONS:
            if self.general is None:
                self.general = self._as_tensors()
            return self.general
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        baked, keep = aot.bake_scalars(self.gm, dict(zip(self.positions, values)))
        with unset_fake_temporarily():
            inner = self.compile(baked, [self.inputs[i] for i in keep],
                                 frozenset(k for k, i in enumerate(keep) if i in self.static))
        run = self.versions[key] = lambda args: inner([args[i] for i in keep])
        return run

    def _as_tensors(self) -> Callable[[list], list]:
        """The graph compiled with the numbers as 0-d inputs on the other inputs' device."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        device = next((a.device for a in self.inputs if isinstance(a, torch.Tensor) and a.device.type != "cpu"),
                      torch.device("cpu"))
        examples = list(self.inputs)
        with unset_fake_temporarily():
            for i in self.positions:
                examples[i] = torch.zeros((), dtype=self.inputs[i].dtype, device=device)
            inner = self.compile(self.gm, examples, self.static)
        if device.type == "cpu":
            return inner
        positions = self.positions

        def run(args: list) -> list:
            args = list(args)
            for i in positions:
                args[i] = args[i].to(device, non_blocking=True)
            return inner(args)
        return run

    def __call__(self, args: list) -> list:
        return self._version(tuple(args[i].item() for i in self.positions))(args)

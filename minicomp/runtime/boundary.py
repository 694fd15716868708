"""The call boundary: what happens around a generated module's `call()` at every call.

- **Fast checks** (`TensorCheck`): one C-level check that the tensors of a call have exactly
  the dtype, device, shape, strides and dispatch keys (requires_grad, the neg and conj bits,
  Parameter or not) of an earlier, fully checked call. It is torch's own
  `torch._C._dynamo.guards.TensorGuards` (a C++ class; using it imports no Python of
  `torch._dynamo`), ~70 ns a tensor; where that private class is missing, a Python tuple
  compare.
- **Outputs** (`OutputPlan`): eager's aliasing is replayed (`frontend/fx_alias.py`): an output
  that eager returns as an input itself, or as a view of an input or of another output, is
  rebuilt so on this call's tensors. Every other output is fresh: where the generated module
  returned it sharing memory with an input, a constant or another output (a graph the passes
  reduced to `x`, two outputs CSE merged), it is copied.
- **Gradients** (`Differentiable`): when grad mode is on and a tensor the call reads requires
  grad, the kernels run inside an `autograd.Function`; its backward runs PyTorch's own
  backward of the original function, recomputed eagerly from the saved inputs
  (`Rerun.backward`; with `create_graph=True` the recomputation's graph is kept, so double
  backward is eager's too). The forward stays compiled, so inference without
  `torch.no_grad()` keeps the kernels' speed; gradients are eager's, never silently missing.
  It refuses (with a `MinicompError`) what a recomputation cannot reproduce: random ops, and
  weights or Python state changed between forward and backward.
- **Threads**: Triton's CPU interpreter patches `triton.language` for as long as a kernel
  runs, so interpreted calls from two threads corrupt each other. `INTERPRETER_LOCK`
  serialises every call of a CPU module, across all compiled functions of the process.
"""

from __future__ import annotations

import functools

import operator
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from minicomp.errors import MinicompError

INTERPRETER_LOCK = threading.RLock()


def _raw_key(tensors: Sequence[Any]) -> tuple:
    return tuple((type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.is_neg(), t.is_conj())
                 if isinstance(t, torch.Tensor) else (type(t),) for t in tensors)


class TensorCheck:
    """Are these tensors laid out exactly like the ones this check was made from? (see above)"""

    def __init__(self, tensors: Sequence[torch.Tensor], grad: bool):
        self.grad = grad            # a call it admits needs autograd (when grad mode is on)
        self.launch: Callable[..., list[torch.Tensor]] | None = None  # what the calls it admits run (`fast_launch`)
        try:
            from torch._C._dynamo.guards import TensorGuards
            guards = TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                  dynamic_dims_strides=[list(t.stride()) for t in tensors])
            self.check: Callable[..., bool] = guards.check
            if not guards.check(*tensors):
                raise ValueError("TensorGuards refuses the tensors it was made from")
        except Exception:           # no such private class in this torch, or it changed
            key = _raw_key(tensors)
            self.check = lambda *ts: _raw_key(ts) == key


def fast_launch(run: Callable[..., list[torch.Tensor]] | None, layouts: Sequence[tuple] | None,
                tensors: Sequence[torch.Tensor]) -> Callable[..., list[torch.Tensor]] | None:
    """What a call admitted by a TensorCheck made from `tensors` launches: the module's `run`
    (no input checks; None: the specialisation's own launch), told `_laid_out` where each
    tensor's strides are exactly its entry of the module's `LAYOUTS` (the strides run() reads
    the input with), so run() tests alignment only: the check compared everything else."""
    if run is None or layouts is None or len(tensors) != len(layouts) or \
            not all(t.stride() == s for t, s in zip(tensors, layouts)):
        return run
    return functools.partial(run, _laid_out=True)


def resolved(t: torch.Tensor) -> torch.Tensor:
    """`t` with its neg or conj bit applied (a copy, as eager's kernels compute it); kernels
    read raw memory, where `z.conj().imag` holds the imaginary part with the wrong sign."""
    if t.is_neg():
        t = t.resolve_neg()
    if t.is_conj():
        t = t.resolve_conj()
    return t


def _shares(a: torch.Tensor, b: Any) -> bool:
    return isinstance(b, torch.Tensor) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@dataclass
class OutputPlan:
    """How the generated module's outputs become the call's results (see the module docstring).

    `eager[i]`: an `OutputAlias` (input or output position, view steps) or None (fresh).
    `risky[i]`: for a fresh output, what the module's result may share memory with:
    ("input", k), ("output", j) or ("constant", -1), read off the compiled graph; else None.
    """
    eager: list[Any]
    risky: list[tuple[str, int] | None]
    fresh: list[int] = field(init=False)
    order: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.fresh = [i for i, a in enumerate(self.eager) if a is None]
        self.order, placed = [], set(self.fresh)
        pending = [i for i, a in enumerate(self.eager) if a is not None]
        while pending:          # an alias of output j after j itself
            ready = [i for i in pending if self.eager[i].output is None or self.eager[i].output in placed]
            if not ready:
                raise MinicompError("outputs alias each other in a cycle")   # cannot happen for a DAG
            self.order += ready
            placed |= set(ready)
            pending = [i for i in pending if i not in placed]
        self.copies = any(self.risky[i] is not None for i in self.fresh)

    @classmethod
    def of(cls, eager: list[Any] | None, graph: Any) -> "OutputPlan":
        eager = list(eager) if eager is not None else [None] * len(graph.outputs)
        return cls(eager, [_risk(graph, i) for i in range(len(graph.outputs))])

    def fix_fresh(self, inputs: Sequence[torch.Tensor], outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy each fresh output the module returned sharing memory with what it must not."""
        if not self.copies:
            return outs
        fixed = list(outs)
        for i in self.fresh:
            risk = self.risky[i]
            if risk is None:
                continue
            kind, k = risk
            if kind == "constant" or _shares(outs[i], inputs[k] if kind == "input" else outs[k]):
                fixed[i] = outs[i].clone()
        return fixed

    def replay(self, inputs: Sequence[torch.Tensor], outs: list[Any]) -> list[Any]:
        """Fill in the outputs eager returns as inputs, or views of inputs or outputs."""
        for i in self.order:
            alias = self.eager[i]
            v = inputs[alias.input] if alias.input is not None else outs[alias.output]
            for step in alias.steps:
                v = step(v)
            outs[i] = v
        return outs


def _risk(graph: Any, i: int) -> tuple[str, int] | None:
    """What output i of the compiled graph may share memory with: follow views (and opaque
    PyTorch calls, which may return views) down to an input, a constant or another output."""
    outs = graph.outputs
    if outs.index(outs[i]) != i:
        return ("output", outs.index(outs[i]))
    n = graph.node(outs[i])
    while True:
        if n.op == "input":
            return ("input", graph.inputs.index(n.id))
        if n.op == "constant":
            # a scalar constant the call hands back is a copy of its own already: the module
            # clones it each call (codegen/fallback.py `returned_scalars`, which walks as this does)
            return None if not isinstance(n.attrs["value"], torch.Tensor) else ("constant", -1)
        if n.id != outs[i] and n.id in outs:
            return ("output", outs.index(n.id))
        if n.kind not in ("view", "opaque") or not n.args:
            return None
        n = graph.node(n.args[0])


@dataclass
class Rerun:
    """Backward of a compiled call by PyTorch: recompute the function eagerly and differentiate."""
    fn: Callable[..., Any]        # the user's function, of the flat argument tensors
    n_args: int                   # saved tensors: arguments, then weight inputs, then frozen weights
    fresh: list[int]              # flat output positions the autograd.Function returned
    binding: Any
    random_ops: list[str]
    name: str

    def backward(self, saved: Sequence[torch.Tensor], grads: Sequence[Any]) -> list[Any]:
        if self.random_ops:
            raise MinicompError(f"{self.name}: cannot differentiate a compiled call that draws random numbers "
                                f"({', '.join(self.random_ops)}): recomputing it would draw others. Call it in "
                                "eval() or under torch.no_grad(), or train the model uncompiled")
        args, weights = list(saved[:self.n_args]), list(saved[self.n_args:])
        now = self.binding.read()
        if now is None or not all(map(operator.is_, now + [read() for read, _, _ in self.binding.frozen], weights)):
            raise MinicompError(f"{self.name}: its weights or Python state changed between the forward call and "
                                "backward(); minicomp recomputes the forward for backward and cannot reproduce it")
        # create_graph (grad mode is on in backward): differentiate through the saved tensors
        # themselves, so the gradients carry the graph of the recomputation (double backward)
        create = torch.is_grad_enabled()
        leaves = args if create else [t.detach().requires_grad_(t.requires_grad) for t in args]
        with torch.enable_grad():
            outs = pytree.tree_leaves(self.fn(*leaves))
        pairs = [(outs[i], g) for i, g in zip(self.fresh, grads)
                 if g is not None and isinstance(outs[i], torch.Tensor) and outs[i].requires_grad]
        wrt = [k for k, t in enumerate(leaves + weights) if t.requires_grad]
        result: list[Any] = [None] * len(saved)
        if pairs and wrt:
            everything = leaves + weights
            got = torch.autograd.grad([o for o, _ in pairs], [everything[k] for k in wrt], [g for _, g in pairs],
                                      allow_unused=True, create_graph=create)
            for k, g in zip(wrt, got):
                result[k] = g
        return result


class Differentiable(torch.autograd.Function):
    """Kernels forward, PyTorch backward (see `Rerun`); returns the fresh outputs only."""

    @staticmethod
    def forward(ctx, run: Callable[[], list[torch.Tensor]], rerun: Rerun, *tensors: torch.Tensor):
        outs = run()
        ctx.rerun = rerun
        ctx.save_for_backward(*tensors)
        ctx.set_materialize_grads(False)
        fixed = [o for o in outs if not (o.is_floating_point() or o.is_complex())]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.rerun.backward(ctx.saved_tensors, grads))


@dataclass
class Specialisation:
    """One compiled graph of a function, with everything its calls need around the module."""
    compiled: Any                         # api.Compiled
    binding: Any                          # frontend.binding.Binding
    outputs: OutputPlan
    rerun: Rerun
    out_spec: Any                         # pytree structure of the result (None: a tensor or flat tuple)
    weight_sig: Any                       # runtime Signature of the weight inputs
    launch: Callable[..., list[torch.Tensor]]
    cpu: bool
    checks: list[TensorCheck] = field(default_factory=list)
    warm: bool = False                    # its first call (Triton's JIT on CUDA) is done
    checked_launch: Callable[..., list[torch.Tensor]] | None = None   # the module's run(): no input checks

    def __post_init__(self) -> None:
        spec = self.out_spec
        if spec is not None and (spec.is_leaf() or (spec.type is tuple and spec.num_leaves > 1
                                                    and all(c.is_leaf() for c in spec.children()))):
            self.out_spec = None          # a tensor, or a flat tuple of them: no unflattening
        # the common case: a flat result, nothing to copy or replay
        self.plain = not (self.outputs.copies or self.outputs.order or self.out_spec is not None)

    def frozen_now(self) -> list[torch.Tensor]:
        return [read() for read, _, _ in self.binding.frozen]

    def _module(self, inputs: Sequence[torch.Tensor], launch: Callable[..., list[torch.Tensor]]) -> list[torch.Tensor]:
        if self.cpu:
            with INTERPRETER_LOCK:
                outs = launch(*inputs)
        else:
            outs = launch(*inputs)
        return self.outputs.fix_fresh(inputs, outs)

    def run(self, inputs: Sequence[torch.Tensor], originals: Sequence[torch.Tensor], grad: bool,
            launch: Callable[..., list[torch.Tensor]] | None = None) -> Any:
        """Launch on `inputs` (arguments then weights, neg/conj resolved) and build the result;
        `originals` are the same tensors as the caller has them, for the outputs eager aliases.
        `launch`: what the TensorCheck that admitted `inputs` launches (`TensorCheck.launch`);
        None: the specialisation's own launch, which checks the inputs."""
        launch = launch or self.launch
        if self.plain and not grad:
            if self.cpu:
                with INTERPRETER_LOCK:
                    outs = launch(*inputs)
            else:
                outs = launch(*inputs)
            return outs[0] if len(outs) == 1 else tuple(outs)
        if grad:
            n = self.rerun.n_args
            tensors = list(inputs[:n]) + list(originals[n:]) + self.frozen_now()
            fresh = Differentiable.apply(lambda: [o for i, o in enumerate(self._module(inputs, launch))
                                                  if self.outputs.eager[i] is None], self.rerun, *tensors)
            outs: list[Any] = [None] * len(self.outputs.eager)
            for i, o in zip(self.outputs.fresh, fresh):
                outs[i] = o
        else:
            outs = self._module(inputs, launch)
        if self.outputs.order:
            outs = self.outputs.replay(originals, list(outs))
        if self.out_spec is not None:
            return pytree.tree_unflatten(list(outs), self.out_spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

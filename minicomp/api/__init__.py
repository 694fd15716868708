"""`minicomp.compile`: the decorator, and the one place (with cli.py) that wires the stages.

    @minicomp.compile
    def f(x, w): ...

    f(x, w)          # first call: capture -> passes -> plan -> layout -> Triton module -> run
    f.plan, f.source, f.graph, f.explain()

Calls take tensors and None, positionally or by keyword, nested in lists, tuples and dicts;
anything else is `CaptureRefused` (api/arguments.py). A compiled function is specialised on
the call's shape and its inputs' shapes, dtypes, strides and device; a new signature compiles
again (the previous ones stay cached in memory, and generated modules are cached on disk by
the runtime). Inputs on CPU run the same kernels under Triton's interpreter.

Weights (parameters, buffers, tensors of globals and closures) are inputs of the compiled
graph, read again at every call, and their signatures are part of the specialisation; the
Python state the function can see is guarded (frontend/params.py, frontend/binding.py).
`compile(fn, freeze=True)` folds the weights in instead, guarded too. What happens around
the generated module at each call (output aliasing, autograd, neg/conj bits, the
interpreter's lock) is runtime/boundary.py. `compile(fn, mode="reduce-overhead")` replays each
specialisation's module as CUDA graphs from its second call (runtime/cuda_graphs.py: the
arguments copied in, the weights read in place, the outputs copied out); `explain()` and
`f.cuda_graphs` say whether it does, and why not.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable

import torch

from minicomp.api.arguments import CallShape, flatten_call, taking_flat
from minicomp.api.dynamic import DynamicState, accepts, mark_dynamic, structure  # noqa: F401  (mark_dynamic: the package's)
from minicomp.api.last import LastCompiled
from minicomp.api.pipeline import (Compiled, Options, compile_graph, optimise, plan_only,  # noqa: F401  (the api's)
                                   run_compiled, set_input_layouts)
from minicomp.errors import GuardError, MinicompError
from minicomp.target import Target, codegen_switches, read_matmul_precision

# the runtime (and triton with it) is imported at the first compile, not at `import minicomp`
if TYPE_CHECKING:
    from minicomp.runtime.boundary import Specialisation

_log = logging.getLogger(__name__)


def _module_call(compiled: Compiled) -> Callable[..., list[torch.Tensor]]:
    """The generated module's own `call` (the api checked the arguments already)."""
    module = getattr(compiled.call, "module", None)
    return module.call if module is not None else compiled.call


def _module_run(compiled: Compiled) -> Callable[..., list[torch.Tensor]] | None:
    """The generated module's `run`: its `call` without the input checks, for calls a
    TensorCheck admitted (it compares every input's shape, dtype, device and strides); None
    where the module has none."""
    return getattr(getattr(compiled.call, "module", None), "run", None)


def _modes() -> tuple:
    """Process state that changes what eager computes and capture records: the default dtype
    (`torch.tensor(1.0)`), and autocast (per device type, with its dtype); and the fp32 matmul
    precision PyTorch's TF32 switches allow, which the GEMM kernels follow (Target.matmul_precision);
    and the codegen switches: which GEMMs call cuBLAS ($MINICOMP_LIBRARY_GEMM, target.library_mode;
    $MINICOMP_LIBRARY_JOINS), whether attention may call SDPA ($MINICOMP_LIBRARY_ATTENTION), whether
    SwiGLU's pair is split ($MINICOMP_DUAL_GEMM), and the GEMM epilogue's form ($MINICOMP_GEMM_EPILOGUE)."""
    autocast = ()
    if torch._C._is_any_autocast_enabled():
        autocast = tuple((d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d))
    return (torch.get_default_dtype(), autocast, read_matmul_precision(), *codegen_switches())


def _shape_key(args: tuple) -> tuple | None:
    """The modes and the shapes of the arguments when all are tensors (else None): picks the
    specialisations whose fast checks are worth trying; the checks compare everything else."""
    try:
        return _modes(), tuple([a.shape for a in args])
    except AttributeError:
        return None


_CAPTURE_LOCK = threading.RLock()   # capture sets process-wide fx state (node meta, stack traces)
_MAX_CHECKS = 8                     # fast checks kept per specialisation (grad or not, Parameter or not...)


class CompiledFunction(LastCompiled):
    """A callable that compiles `fn` for each new input signature and runs the kernels.

    A specialisation is found by the arguments' structure and `Signature`, then by its
    binding (the weights read now, with their own signature, and the guards on the
    function's Python state; frontend/binding.py). A call that matches an earlier checked
    call exactly takes the fast path: shapes -> specialisations -> binding read -> one
    `TensorCheck` over arguments and weights. Compiling (and a specialisation's first call)
    holds this function's lock; concurrent calls are safe (runtime/boundary.py).
    """

    def __init__(self, fn: Callable, options: Options):
        self.fn = fn
        self.options = options
        self._cache: dict[tuple, list[Specialisation]] = {}   # (arg structure, arg Signature) -> specialisations
        self._fast: dict[tuple, list[Specialisation]] = {}    # argument shapes -> specialisations with fast checks
        self._last: Compiled | None = None
        self._lock = threading.RLock()
        self._name = getattr(fn, "__name__", type(fn).__name__)
        self.compiles = 0                  # specialisations compiled so far (capture to loaded module)
        self.tracer = ""                   # which tracer captured (or refused) the last signature: "eager", "fake"
        self.dynamic = DynamicState(options.dynamic)   # sizes seen; structures that could not go symbolic
        self._symbolic: list[tuple[tuple, Specialisation]] = []   # (structure, specialisation over symbols)
        functools.update_wrapper(self, fn, updated=())

    def compile_for(self, *args: Any) -> Compiled:
        return self._find(args)[0].compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return self._slow(args, kwargs)             # no fast path: it checks positional tensors
        for s in self._fast.get(_shape_key(args), ()):       # like an earlier, checked call?
            weights = s.binding.read()
            if weights is None:
                continue
            inputs = [*args, *weights]
            for check in s.checks:
                if check.check(*inputs):
                    self._last = s.compiled
                    return s.run(inputs, inputs, check.grad and torch.is_grad_enabled(), launch=check.launch)
        return self._slow(args)

    def _slow(self, args: tuple, kwargs: dict | None = None) -> Any:
        from minicomp.runtime.boundary import TensorCheck, fast_launch, resolved
        s, tensors, weights = self._find(args, kwargs)
        originals = tensors + weights
        inputs = [resolved(t) for t in originals]
        needs_grad = any(t.requires_grad for t in originals + s.frozen_now())
        grad = needs_grad and torch.is_grad_enabled()
        if not s.warm:
            with self._lock:
                s.launch = self._first_launch(s)
                try:
                    out = s.run(inputs, originals, grad)
                finally:
                    s.launch = _module_call(s.compiled)
                if self.options.graphs:
                    s.launch = self._graphed(s, inputs)
                else:
                    s.checked_launch = _module_run(s.compiled)
                s.warm = True
        else:
            out = s.run(inputs, originals, grad)
        # later calls like this one take the fast path; not with neg/conj bits (resolved here
        # only) nor nested arguments (flattened here only)
        as_given = (all(a is b for a, b in zip(inputs, originals)) and not kwargs
                    and all(isinstance(a, torch.Tensor) for a in args))
        known = any(check.check(*originals) for check in s.checks)
        if as_given and not known and len(s.checks) < _MAX_CHECKS:
            check = TensorCheck(originals, needs_grad)
            check.launch = fast_launch(s.checked_launch, getattr(getattr(s.compiled.call, "module", None), "LAYOUTS", None),
                                       originals)
            s.checks.append(check)
            entries = self._fast.setdefault(_shape_key(args), [])
            if s not in entries:
                entries.append(s)
        return out

    def _first_launch(self, s: Specialisation) -> Callable[..., list[torch.Tensor]]:
        """The first call's launch: where Triton rejects one of the kernels at its first launch,
        `run_compiled` regenerates the module with that group through PyTorch, and the
        specialisation keeps the version that ran."""
        def launch(*tensors: torch.Tensor) -> list[torch.Tensor]:
            ran, outs = run_compiled(s.compiled, tensors)
            if ran is not s.compiled:
                s.compiled = self._last = ran
            return outs
        return launch

    def _graphed(self, s: Specialisation, inputs: list[torch.Tensor]) -> Callable[..., list[torch.Tensor]]:
        """mode="reduce-overhead": the specialisation's launch, replayed as CUDA graphs after this
        first call (runtime/cuda_graphs.py): the arguments are copied in, the weights read in place."""
        from minicomp.runtime.cuda_graphs import GraphedCall, hazards
        found = hazards(s.compiled)
        graphed = GraphedCall(s.launch, len(inputs), range(s.rerun.n_args, len(inputs)),
                              by_layout=s.compiled.graph.symbolic, found=found, name=self._name)
        graphed.warmed(inputs)
        if found:
            _log.info("%s: mode='reduce-overhead' runs without CUDA graphs: %s", self._name, "; ".join(found))
        return graphed

    @property
    def cuda_graphs(self):
        """The last compiled signature's `GraphStatus` (runtime/cuda_graphs.py) under
        mode="reduce-overhead"; None in the default mode or before its first call ends."""
        s = self._last_specialisation()
        return getattr(s.launch, "status", None) if s is not None and self.options.graphs else None

    def _last_specialisation(self) -> Specialisation | None:
        found = [s for entries in self._cache.values() for s in entries] + [s for _, s in self._symbolic]
        return next((s for s in found if s.compiled is self._last), None)

    def explain(self) -> str:
        text = super().explain()
        if not self.options.graphs:
            return text
        status = self.cuda_graphs
        line = status.describe() if status is not None else "runs as a CUDA graph after its first call"
        return f"mode='reduce-overhead': {line}\n\n{text}"

    def _find(self, args: tuple, kwargs: dict | None = None
              ) -> tuple[Specialisation, list[torch.Tensor], list[torch.Tensor]]:
        """The specialisation for the call (compiled now if none fits), the flat argument tensors
        and the weights read now."""
        from minicomp.runtime.boundary import resolved
        from minicomp.runtime.guards import signature_of, weights_fit
        tensors, spec = flatten_call(self._name, args, kwargs)
        # the call's shape is part of the key (f(x, [y]) is not f(x, y)), and so are the modes
        key = (spec, signature_of([resolved(t) for t in tensors]), _modes())
        if key[2][1]:
            raise GuardError(f"{self._name} was called under torch.autocast ({', '.join(d for d, _ in key[2][1])}); "
                             "minicomp's capture does not follow autocast's casts: call it outside autocast, with "
                             "inputs and weights in the dtype you want")
        with self._lock:
            for s in list(self._cache.get(key, ())):
                weights = s.binding.read()
                if weights is not None and weights_fit(weights, s.weight_sig):
                    self._last = s.compiled
                    return s, tensors, weights
                if weights is None:
                    self._forget_if_stale(key, s)
            s = self._over_symbols(key, tensors, spec) or self._specialise(key, tensors, spec)
            self._cache.setdefault(key, []).append(s)
            self._last = s.compiled
            weights = s.binding.read()
            if weights is None:
                raise MinicompError(f"{self._name}: the state minicomp watches changed while it was captured")
            return s, tensors, weights

    def _forget_if_stale(self, key: tuple, s: Specialisation) -> None:
        """Drop a specialisation whose watched objects were replaced (it cannot match again, and
        would keep the old objects alive); one whose Python values differ (eval/train) stays."""
        changed, replaced = s.binding.changes()
        _log.info("%s: a specialisation no longer fits: %s changed", self._name, ", ".join(changed))
        frozen = [c for c in changed if c.startswith("frozen weight")]
        if frozen:
            warnings.warn(f"{self._name}: {', '.join(frozen)} changed since it was compiled with freeze=True; "
                          "compiling again (freeze=True folds weights into the kernels: leave it off for weights "
                          "that change)", stacklevel=4)
        if replaced:
            self._cache[key].remove(s)
            for entries in self._fast.values():
                if s in entries:
                    entries.remove(s)

    def _over_symbols(self, key: tuple, tensors: list[torch.Tensor], spec: CallShape) -> Specialisation | None:
        """A specialisation over symbolic sizes that serves this call (api/dynamic.py)."""
        from minicomp.runtime.guards import weights_fit
        where = structure(spec, tensors, key[2])
        for k, s in self._symbolic:
            if k == where and accepts([s.compiled.graph.node(i).shape for i in s.compiled.graph.inputs], tensors):
                weights = s.binding.read()
                if weights is not None and weights_fit(weights, s.weight_sig):
                    return s
        return None

    def _specialise(self, key: tuple, tensors: list[torch.Tensor], spec: CallShape) -> Specialisation:
        where = structure(spec, tensors, key[2])
        chosen = self.dynamic.dims_for(where, tensors)
        if chosen is not None:
            try:
                s = self._specialise_as(key, tensors, spec, chosen)
                if s.compiled.graph.symbolic:
                    self._symbolic.append((where, s))
                    return s
                self.dynamic.refused[where] = "every size was fixed while tracing"
            except Exception as e:  # noqa: BLE001 -- not over symbols: the static path, which works, and why
                text = str(e).splitlines()[0] if str(e) else ""
                self.dynamic.refused[where] = text if isinstance(e, MinicompError) else f"{type(e).__name__}: {text}"
                _log.info("%s: compiling for concrete sizes: %s", self._name, self.dynamic.refused[where])
        return self._specialise_as(key, tensors, spec, None)

    def _specialise_as(self, key: tuple, tensors: list[torch.Tensor], spec: CallShape,
                       symbolic: list | None) -> Specialisation:
        from minicomp.frontend.fx import capture
        from minicomp.frontend.fx_trace import input_names
        from minicomp.runtime.boundary import OutputPlan, Rerun, Specialisation, resolved
        from minicomp.runtime.guards import Signature, signature_of
        from minicomp.runtime.prime import prime_triton
        plain = [resolved(t) for t in tensors]
        target = Target.for_options(plain[0].device.type if plain else "cpu", self.options)   # read once
        if plain:
            prime_triton(plain[0].device, target.prime_triton)   # Triton's one-time state, built while capture runs
        fn = self.fn if spec.plain else taking_flat(self.fn, spec, input_names(self.fn, spec.positional), self._name)
        with _CAPTURE_LOCK:
            if symbolic is not None:          # make_fx over fake inputs with those dims symbolic
                from minicomp.frontend.fx_symbolic import check_guards, fake_inputs, narrowings, shape_env_of
                trace = functools.partial(capture, fn, freeze=self.options.freeze, tracer="symbolic",
                                          on_tracer=functools.partial(setattr, self, "tracer"))
                fakes = fake_inputs(plain, symbolic)
                graph = trace(fakes)
                ranges = narrowings(shape_env_of(fakes), fakes)
                if ranges:                    # `Ne(s, 3)`: trace again over ranges that exclude 3
                    fakes = fake_inputs(plain, symbolic, ranges)
                    graph = trace(fakes)
                check_guards(shape_env_of(fakes))
            else:
                graph = capture(fn, plain, freeze=self.options.freeze, tracer=target.capture,
                                on_tracer=functools.partial(setattr, self, "tracer"))
        weights = graph.binding.read()
        if weights is None:
            raise MinicompError(f"{self._name}: the state minicomp watches changed while it was captured")
        inputs = plain + [resolved(w) for w in weights]
        signature_of(inputs)                    # arguments and weights on one device
        compiled = compile_graph(graph, inputs, self.options, target=target)   # (its own for the weights' device)
        self.compiles += 1
        outputs = OutputPlan.of(getattr(graph, "out_alias", None), compiled.graph)
        rerun = Rerun(fn, len(tensors), outputs.fresh, graph.binding, getattr(graph, "random_ops", []), self._name)
        return Specialisation(compiled, graph.binding, outputs, rerun, getattr(graph, "out_spec", None),
                              Signature.of(inputs[len(plain):]), _module_call(compiled),
                              inputs[0].device.type == "cpu" if inputs else True)

    def _label(self) -> str:
        return getattr(self.fn, "__name__", "function")

    def report(self, path: str, *, bench: bool = False):
        """Write the HTML report of the last compiled signature to `path` (see minicomp.report);
        returns its Path. `bench=True` on CUDA first times the kernels (on seeded random inputs
        of that signature) for the roofline's measured points; on the CPU the page says why
        there are none."""
        from minicomp import report
        c = self._need()
        timed = None
        if bench and c.generated.device_type == "cuda":
            from minicomp.explain import bench as time_kernels
            from minicomp.runtime.background import wait_compiled
            inputs = report.signature_inputs(c)
            c.call(*inputs)        # eager answers while kernels compile in the background: time the kernels
            wait_compiled()
            c.call(*inputs)        # the call that autotunes them
            timed = time_kernels(c, inputs)
        return report.write(path, c, machine=self.options.machine, source=report.source_file(self.fn),
                            bench=timed, bench_requested=bench)


def compile(fn: Callable | None = None, **options: Any):
    """Compile a function or nn.Module: `@minicomp.compile` or `minicomp.compile(fn, passes=[...])`."""
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise MinicompError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    opts = Options(**options)
    if fn is None:
        return lambda f: CompiledFunction(f, opts)
    return CompiledFunction(fn, opts)

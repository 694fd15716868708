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
interpreter's lock) is runtime/boundary.py.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from minicomp.api.arguments import CallShape, flatten_call, taking_flat
from minicomp.api.last import LastCompiled
from minicomp.errors import CompileError, GuardError, MinicompError
from minicomp.ir.graph import Graph
from minicomp.ir.verify import verify
from minicomp.target import RowForm, Target

# the runtime (and triton with it) is imported at the first compile, not at `import minicomp`
if TYPE_CHECKING:
    from minicomp.runtime.boundary import Specialisation

_log = logging.getLogger(__name__)


@dataclass
class Options:
    passes: Sequence[str] | None = None      # None: the default pipeline
    machine: str = "h200"
    print_after_all: bool = False
    dump_dir: str | None = None
    time_passes: bool = False
    verify_target: str | None = None         # "cuda:90": also compile every kernel for that GPU (None: $MINICOMP_VERIFY_TARGET)
    freeze: bool = False                     # fold weights into the kernels (guarded: a changed weight recompiles)
    row_form: RowForm | None = None          # row-kernel form knobs (None: RowForm(); tests force the looped form)


@dataclass
class Compiled:
    """Everything one specialisation produced."""
    graph: Graph                 # after passes and layout assignment
    plan: Any                    # minicomp.plan.Plan
    generated: Any               # minicomp.codegen.GeneratedModule
    call: Callable[..., list[torch.Tensor]]
    pass_records: list = field(default_factory=list)
    compile_seconds: float = 0.0  # capture to loaded module, excluding Triton's JIT (lazy, at first launch)
    forced: dict[int, str] = field(default_factory=dict)  # group id -> why it runs through PyTorch after all


def run_compiled(compiled: Compiled, tensors: Sequence[torch.Tensor]) -> tuple[Compiled, list[torch.Tensor]]:
    """Run `compiled` on `tensors`; when Triton's compiler rejects one of its kernels on this
    device (found at the kernel's first launch on a GPU), generate the module again with that
    kernel's group run through PyTorch, say so once, and run that: the answer is eager's, never
    a Triton traceback. Returns the Compiled that ran (the same one unless a kernel failed).

    Rerunning the whole call is safe: kernels only write buffers the call allocated."""
    from minicomp.runtime.launcher import KernelCompileError

    while True:
        try:
            return compiled, compiled.call(*tensors)
        except KernelCompileError as exc:
            if exc.kernel not in compiled.generated.kernel_groups:
                raise
            compiled = _without_kernel(compiled, exc.kernel, exc.cause)


def _without_kernel(compiled: Compiled, kernel: str, cause: str) -> Compiled:
    """`compiled` generated again with `kernel`'s group run through PyTorch."""
    import warnings

    from minicomp.codegen import generate
    from minicomp.runtime import load

    gen = compiled.generated
    gid = gen.kernel_groups[kernel]
    first = cause.strip().splitlines()[0] if cause.strip() else "(no message)"
    reason = f"kernel {kernel} was rejected by Triton's compiler on {compiled.call.device}: {first}"
    warnings.warn(f"minicomp: {compiled.graph.name}: group {gid} runs through PyTorch: {reason}", stacklevel=3)
    forced = {**compiled.forced, gid: reason}
    target = replace(gen.target, verify_arch=None)   # the check already ran on this plan
    generated = generate(compiled.graph, compiled.plan, target, forced_fallbacks=forced)
    call = load(generated, compiled.call.device)
    return replace(compiled, generated=generated, call=call, forced=forced)


def set_input_layouts(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    """Record the actual strides of the inputs: kernels read them as they are, no copies.

    Strides of size-1 dimensions never address anything; they are normalised (as the
    runtime's `Signature` does) so `x[:, None]` and `x.unsqueeze(1).contiguous()` share a kernel.
    An input given as None (a graph of symbolic sizes compiled with `load=False`) is contiguous.
    """
    from minicomp.ir.graph import contiguous_strides
    from minicomp.runtime.guards import TensorSig
    for nid, t in zip(graph.inputs, inputs):
        node = graph.node(nid)
        node.layout = contiguous_strides(node.shape) if t is None else TensorSig.of(t).stride


def optimise(graph: Graph, options: Options) -> tuple[Graph, list]:
    from minicomp.passes.manager import run_pipeline
    return run_pipeline(graph, options.passes, print_after_all=options.print_after_all,
                        dump_dir=options.dump_dir, time_passes=options.time_passes)


def _not_loaded(*inputs: Any) -> list[torch.Tensor]:
    raise MinicompError("this graph was compiled with load=False: its module was generated, not loaded")


def plan_only(graph: Graph, options: Options | None = None) -> tuple[Graph, Any]:
    """Graph -> passes -> plan -> layout, no code: the CLI's dumps of a program whose sizes are
    symbolic (codegen takes concrete sizes so far; `compile_graph` needs them bound)."""
    from minicomp.plan import assign_layout, plan_graph

    options = options or Options()
    verify(graph)
    set_input_layouts(graph, [None] * len(graph.inputs))
    captured = graph
    graph, _ = optimise(graph, options)
    plan = plan_graph(graph, options.machine, baseline=captured)
    return assign_layout(graph, plan), plan


def compile_graph(graph: Graph, inputs: Sequence[torch.Tensor], options: Options | None = None, *,
                  device: str | torch.device | None = None, load: bool = True,
                  target: Target | None = None) -> Compiled:
    """Graph (fresh from a frontend) -> passes -> plan -> layout -> generated module -> loaded call.

    `inputs` give the shapes, dtypes and strides to specialise on; `device` (default: the inputs',
    else cuda when present) the target, `target` its record (default: `Target.for_options`, read now).
    `load=False` stops at the generated module (`call` raises) and takes meta tensors as `inputs`
    (the CLI's dumps and `--emit`, which run nothing)."""
    from minicomp.codegen import generate
    from minicomp.plan import assign_layout, plan_graph
    from minicomp.runtime import load as load_module

    options = options or Options()
    start = time.perf_counter()
    if device is not None:
        device = torch.device(device)
    else:
        device = inputs[0].device if inputs else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if target is None or target.device_type != device.type:
        target = Target.for_options(device.type, options)
    if load:
        from minicomp.runtime.prime import prime_triton
        prime_triton(device, target.prime_triton)   # Triton's one-time state, built while the passes run
    verify(graph)
    set_input_layouts(graph, inputs)
    captured = graph
    graph, records = optimise(graph, options)   # the manager works on a copy: `captured` stays as it was
    # the unfused baseline is the user's program as written (before attention matching)
    plan = plan_graph(graph, options.machine, baseline=captured)
    graph = assign_layout(graph, plan)            # strides of what the plan's kernels write
    generated = generate(graph, plan, target)     # with the GPU-true check when the target asks for it
    call = load_module(generated, device) if load else _not_loaded
    return Compiled(graph, plan, generated, call, records, time.perf_counter() - start)


def _module_call(compiled: Compiled) -> Callable[..., list[torch.Tensor]]:
    """The generated module's own `call` (the api checked the arguments already)."""
    module = getattr(compiled.call, "module", None)
    return module.call if module is not None else compiled.call


def _modes() -> tuple:
    """Process state that changes what eager computes and capture records: the default dtype
    (`torch.tensor(1.0)`), and autocast (per device type, with its dtype)."""
    autocast = ()
    if torch._C._is_any_autocast_enabled():
        autocast = tuple((d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d))
    return torch.get_default_dtype(), autocast


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
                    return s.run(inputs, inputs, check.grad and torch.is_grad_enabled())
        return self._slow(args)

    def _slow(self, args: tuple, kwargs: dict | None = None) -> Any:
        from minicomp.runtime.boundary import TensorCheck, resolved
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
                s.warm = True
        else:
            out = s.run(inputs, originals, grad)
        # later calls like this one take the fast path; not with neg/conj bits (resolved here
        # only) nor nested arguments (flattened here only)
        as_given = (all(a is b for a, b in zip(inputs, originals)) and not kwargs
                    and all(isinstance(a, torch.Tensor) for a in args))
        known = any(check.check(*originals) for check in s.checks)
        if as_given and not known and len(s.checks) < _MAX_CHECKS:
            s.checks.append(TensorCheck(originals, needs_grad))
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
            s = self._specialise(key, tensors, spec)
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

    def _specialise(self, key: tuple, tensors: list[torch.Tensor], spec: CallShape) -> Specialisation:
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
            timed = time_kernels(c, report.signature_inputs(c))
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

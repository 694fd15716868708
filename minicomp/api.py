"""`minicomp.compile`: the decorator, and the one place (with cli.py) that wires the stages.

    @minicomp.compile
    def f(x, w): ...

    f(x, w)          # first call: capture -> passes -> plan -> Triton module -> run
    f.plan, f.source, f.graph, f.explain()

A compiled function is specialised on its inputs' shapes, dtypes, strides and device; a
new signature compiles again (the previous ones stay cached in memory, and generated
modules are cached on disk by the runtime). Inputs on CPU run the same kernels under
Triton's interpreter.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from minicomp.errors import CompileError, GuardError, MinicompError
from minicomp.ir.graph import Graph
from minicomp.ir.verify import verify
from minicomp.target import Target


@dataclass
class Options:
    passes: Sequence[str] | None = None      # None: the default pipeline
    machine: str = "h200"
    print_after_all: bool = False
    dump_dir: str | None = None
    time_passes: bool = False
    verify_target: str | None = None         # "cuda:90": also compile every kernel for that GPU (None: $MINICOMP_VERIFY_TARGET)


@dataclass
class Compiled:
    """Everything one specialisation produced."""
    graph: Graph                 # after passes
    plan: Any                    # minicomp.passes.plan.Plan
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
    """
    from minicomp.runtime.guards import TensorSig
    for nid, t in zip(graph.inputs, inputs):
        graph.node(nid).layout = TensorSig.of(t).stride


def optimise(graph: Graph, options: Options) -> tuple[Graph, list]:
    from minicomp.passes.manager import run_pipeline
    return run_pipeline(graph, options.passes, print_after_all=options.print_after_all,
                        dump_dir=options.dump_dir, time_passes=options.time_passes)


def compile_graph(graph: Graph, inputs: Sequence[torch.Tensor], options: Options | None = None) -> Compiled:
    """Graph (fresh from a frontend) -> passes -> plan -> generated module -> loaded call."""
    from minicomp.codegen import generate
    from minicomp.passes.fusion import plan_graph
    from minicomp.runtime import load

    options = options or Options()
    start = time.perf_counter()
    if inputs:
        from minicomp.runtime.prime import prime_triton
        prime_triton(inputs[0].device)      # Triton's one-time state, built while the passes run
    verify(graph)
    set_input_layouts(graph, inputs)
    captured = graph
    graph, records = optimise(graph, options)   # the manager works on a copy: `captured` stays as it was
    # the unfused baseline is the user's program as written (before attention matching)
    plan = plan_graph(graph, options.machine, baseline=captured)
    device = inputs[0].device if inputs else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = Target.for_device(device.type, verify_target=options.verify_target)
    generated = generate(graph, plan, target)     # with the GPU-true check when the target asks for it
    call = load(generated, device)
    return Compiled(graph, plan, generated, call, records, time.perf_counter() - start)


def _flatten(args: Sequence[Any]) -> tuple[list[torch.Tensor], Any]:
    """The tensors in `args` (nested lists/tuples/dicts allowed) and the structure holding them."""
    flat, spec = torch.utils._pytree.tree_flatten(list(args))
    bad = [type(a).__name__ for a in flat if not isinstance(a, torch.Tensor)]
    if bad:
        raise GuardError(f"compiled functions take tensors only; got {', '.join(sorted(set(bad)))}")
    return flat, spec


def _taking_flat(fn: Callable, spec: Any) -> Callable:
    """`fn` as a function of the flat tensors of arguments nested as `spec` describes."""
    @functools.wraps(fn)
    def flat_fn(*flat: torch.Tensor) -> Any:
        return fn(*torch.utils._pytree.tree_unflatten(list(flat), spec))
    return flat_fn


def _signature(tensors: Sequence[torch.Tensor]):
    """The runtime's `Signature` (shape, dtype, strides bar size-1 dims, device), after device checks."""
    from minicomp.runtime.guards import Signature
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise GuardError(f"inputs are on several devices ({', '.join(sorted(map(str, devices)))}); "
                         "move them to one device")
    for k, t in enumerate(tensors):
        if t.device.type not in ("cpu", "cuda"):
            raise GuardError(f"tensor argument {k} is on device {t.device}; minicomp runs kernels on cuda "
                             "(or on cpu under Triton's interpreter)")
    return Signature.of(tensors)


def _fast_key(args: tuple) -> tuple | None:
    """The raw (shape, strides, dtype, device) of each argument when all are tensors, else None.
    Finer than the Signature (size-1 strides are not normalised), so equal fast keys imply equal
    signatures: a hit may skip flattening, signature building and the guard checks, which took
    ~25 of the ~30 microseconds of Python per call spent outside the generated module."""
    key = []
    for t in args:
        if not isinstance(t, torch.Tensor):
            return None
        key.append((t.shape, t.stride(), t.dtype, t.device))
    return tuple(key)


class CompiledFunction:
    """A callable that compiles `fn` for each new input signature and runs the kernels."""

    def __init__(self, fn: Callable, options: Options):
        self.fn = fn
        self.options = options
        self._cache: dict[tuple, Compiled] = {}
        self._fast: dict[tuple, tuple[Callable, Compiled, Any]] = {}   # _fast_key -> (module call, compiled, out spec)
        self._last: Compiled | None = None
        self._out_spec = {}
        functools.update_wrapper(self, fn, updated=())

    def compile_for(self, *args: Any) -> Compiled:
        return self._compiled(args)[0]

    def _compiled(self, args: tuple) -> tuple[Compiled, list[torch.Tensor], tuple]:
        tensors, spec = _flatten(args)
        key = (spec, _signature(tensors))  # the nesting is part of the signature: f(x, [y]) is not f(x, y)
        if key not in self._cache:
            from minicomp.frontend.fx import capture
            from minicomp.runtime.prime import prime_triton
            if tensors:
                prime_triton(tensors[0].device)     # Triton's one-time state, built while capture runs
            flat = all(isinstance(a, torch.Tensor) for a in args)
            graph = capture(self.fn if flat else _taking_flat(self.fn, spec), tensors)
            self._out_spec[key] = getattr(graph, "out_spec", None)
            self._cache[key] = compile_graph(graph, tensors, self.options)
        self._last = self._cache[key]
        return self._last, tensors, key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise GuardError(f"{getattr(self.fn, '__name__', 'the compiled function')} was called with keyword "
                             f"argument(s) {', '.join(sorted(kwargs))}; compiled functions take their tensors "
                             "positionally")
        fast = _fast_key(args)
        hit = self._fast.get(fast) if fast is not None else None
        if hit is not None:               # inputs exactly like an earlier, checked call's
            run, compiled, spec = hit
            self._last = compiled
            outs = run(*args)
        else:
            compiled, tensors, key = self._compiled(args)
            ran, outs = run_compiled(compiled, tensors)
            if ran is not compiled:          # a kernel failed to compile: keep the version that ran
                self._cache[key] = self._last = compiled = ran
            spec = self._out_spec.get(key)
            module = getattr(compiled.call, "module", None)
            if fast is not None and module is not None:
                self._fast[fast] = (module.call, compiled, spec)
        if spec is not None:
            return torch.utils._pytree.tree_unflatten(list(outs), spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _need(self) -> Compiled:
        if self._last is None:
            raise MinicompError(f"{getattr(self.fn, '__name__', 'function')} has not been called yet: "
                                "plan, source and explain() exist after the first call")
        return self._last

    @property
    def plan(self):
        return self._need().plan

    @property
    def source(self) -> str:
        return self._need().generated.source

    @property
    def graph(self) -> Graph:
        return self._need().graph

    def explain(self) -> str:
        c = self._need()
        return f"{c.graph.dump()}\n\n{c.plan.table()}"

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

"""What every kernel emitter shares: the `Kernel` record, the `KernelCtx` it is given, `Unsupported`.

Invariants:
- an emitter (`pointwise.emit`, `reduction.emit`, `gemm.emit`, `attention.emit`) takes a
  `KernelCtx` and returns one `Kernel`, or raises `Unsupported` with a one-line reason; the
  module wrapper then runs the group through PyTorch and records why on the generated module
  (`GeneratedModule.fallbacks[group.id] = str(e)`); emitters of reduction, GEMM and attention
  groups read the group's spec (`ctx.group.spec`, minicomp/plan/specs.py), not the graph, for
  what the planner decided;
- `Kernel.source` is top-level module text (one or more `@triton.jit` functions, optionally
  autotuned), after any `Kernel.shared` text (a library kernel several groups bind, written
  once per module); `Kernel.launches` are `Launch` records: the grid, the arguments (tensors
  as `Buf(nid)`, which the wrapper binds or allocates with `ctx.strides(nid)` before launching;
  numbers as themselves; a temporary the launches share as `Scratch`, named `mc_...`: never a
  user's name) and the keyword arguments. The wrapper writes them as `call()` lines (allocating
  each `Scratch` once) and as the first call's `_WARM` entries; nothing reads generated text back;
- shapes and strides are ints, or symbolic sizes written over the module's size names
  (codegen/sizes.py); a value computed from them at run time is a `Runtime`, a launch for
  some sizes only carries a `When`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, Union

import torch

from minicomp.errors import CompileError
from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.ir.ops.text import Unsupported  # noqa: F401  (op forms raise it too: it lives in the IR)
from minicomp.plan.records import Group
from minicomp.target import Target


@dataclass(frozen=True)
class Buf:
    """A tensor argument of a launch: node `nid`'s tensor in call()."""
    nid: int
    align16: bool = False   # copied to a 16-byte aligned address first if it is not (TMA descriptors)
    wrap: str = ""          # a function of the kernel's source (codegen's name) the tensor passes through first


@dataclass(frozen=True)
class Blocks:
    """ceil(n / BLOCK): how many blocks of the autotuned (or given) size `block` cover `n`; with
    `more`, the sum of that count over n and each size of `more` (a combo kernel's grid: the
    blocks of each group it computes, codegen/combo.py)."""
    n: int
    block: str
    more: tuple = ()

    def count(self, block: int) -> int:
        return sum(-(-n // block) for n in (self.n, *self.more))


Factor = Union[int, Blocks]


@dataclass(frozen=True)
class Grid:
    """A launch grid: each dimension a product of factors; `persistent` caps the first
    dimension at the device's SM count (a program per SM walks several tiles)."""
    dims: tuple[tuple[Factor, ...], ...]
    persistent: bool = False
    share: str = ""          # persistent: a config key multiplying the SM count (programs per SM)

    @staticmethod
    def of(*dims: "Factor | tuple[Factor, ...]", persistent: bool = False, share: str = "") -> "Grid":
        return Grid(tuple(d if isinstance(d, tuple) else (d,) for d in dims), persistent, share)

    def needs_meta(self) -> bool:
        return any(isinstance(f, Blocks) for d in self.dims for f in d)

    def evaluate(self, meta: dict) -> tuple[int, ...]:
        """The grid for block sizes `meta` (the persistent cap aside)."""
        out = []
        for d in self.dims:
            v = 1
            for f in d:
                v *= f.count(meta[f.block]) if isinstance(f, Blocks) else f
            out.append(v)
        return tuple(out)


@dataclass(frozen=True)
class Runtime:
    """A launch value computed in call() from symbolic sizes (codegen/sizes.py): `text` is
    Python over the module's size names (written by codegen, never from a user's string),
    `hint` its value at the sizes' hints (the first call's warm-up list compiles with it)."""
    text: str
    hint: int


@dataclass(frozen=True)
class When:
    """A launch's condition on a symbolic size: `size <= limit` (or `>` when not `at_most`):
    a kernel with two forms launches the one that fits the call's sizes."""
    size: object               # a dims.Dim
    limit: int
    at_most: bool = True


@dataclass(frozen=True)
class Ready:
    """A launch's condition on a background compile (`runtime.background.compiled`): launched
    when kernel `fn` has compiled (`ready`), or while it has not. The state turns from not
    compiled to compiled once and never back, and call() tests the not-yet launch first: a
    call between the two tests runs both (the same result twice), never neither.

    A kernel of several launches, or of launches with size conditions (codegen/first_calls.py),
    tests `together`, all of its functions, once: its first launch's test keeps the answer in
    `var` (`if (mc_ready := ...):`) and the other launches read it, so that a compile ending
    between two launches cannot run one without the other; `inner` is the launch's own size
    condition, tested after `var`, and the eager lines run under `if not var:`."""
    fn: str
    ready: bool = True
    together: tuple[str, ...] = ()     # every function the kernel's launches call, tested at its first
    var: str = ""                      # where that answer is kept ("": a single launch, tested alone)
    first: bool = True                 # this launch makes the test; the others read `var`
    inner: "When | None" = None        # the launch's size condition, if it has one


@dataclass(frozen=True)
class Scratch:
    """A temporary buffer that one kernel's launches share (a first launch's partial results,
    which a second combines: split reductions, split-KV decode): call() allocates it uninitialised (`torch.empty`) before the
    kernel's first launch, so each call has its own. `name` is the kernel's name plus a
    suffix (unique in the module: kernel names are, and `mc_` is never a user's name);
    `numel` is an int or a size expression over the module's size names."""
    name: str
    numel: object               # int or dims.Expr
    dtype: torch.dtype = torch.float32


Arg = Union[Buf, int, float, bool, Runtime, Scratch]


@dataclass(frozen=True)
class Launch:
    """One launch of a kernel, as data: `kernel[grid](*args, **kwargs)`."""
    grid: Grid
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Union[int, float, bool, Runtime]], ...] = ()
    tma: bool = False        # builds TMA descriptors: Triton's allocator must be installed first
    fn: str = ""             # the @triton.jit function it launches, when not the kernel's own name
    when: When | Ready | None = None  # launched only when the call's sizes (or a compile) meet this


@dataclass
class Kernel:
    name: str            # "mc_gemm_bias_gelu_3": says what it holds
    source: str          # top-level text: one or more @triton.jit (optionally @triton.autotune) functions
    launches: list[Launch] = field(default_factory=list)   # what call() launches; none: nothing to compute
    shared: str = ""     # module text this kernel's source needs (a library kernel), written once per module
    note: str = ""       # why there is no launch ("nothing to compute (0 elements)")


@dataclass
class KernelCtx:
    graph: Graph
    group: Group
    index: int           # position of the group in the plan (unique kernel names)
    target: Target       # what the kernels are for (a device type string means `Target(that)`)
    names: dict[int, str] | None = None   # node id -> its tensor's name in call() (default `buf{nid}`)

    def __post_init__(self) -> None:
        if isinstance(self.target, str):
            self.target = Target(self.target)

    @property
    def device_type(self) -> str:
        """"cuda" or "cpu" (cpu = Triton interpreter: no autotune sweep, no bf16 tl.dot)."""
        return self.target.device_type

    def buf(self, nid: int) -> str:
        """Variable name of node nid's tensor in call(): the user's name for inputs and weights
        (made safe, codegen/names.py), `buf{nid}` for everything else."""
        if self.names and nid in self.names:
            return self.names[nid]
        return f"buf{nid}"

    def strides(self, nid: int) -> tuple[int, ...]:
        """The node's fixed layout, else contiguous strides of its shape."""
        node = self.graph.node(nid)
        if node.layout is not None:
            return tuple(node.layout)
        return contiguous_strides(node.shape)


SpecT = TypeVar("SpecT")


def group_spec(ctx: KernelCtx, kind: type[SpecT]) -> SpecT:
    """The group's spec, which the planner gave it; a plan made by hand gets its groups' specs
    from `plan.with_specs(graph)`."""
    spec = ctx.group.spec
    if not isinstance(spec, kind):
        have = "none" if spec is None else f"a {type(spec).__name__}"
        raise CompileError(f"group {ctx.group.id} ({ctx.group.kind}) needs a {kind.__name__} and has {have}: "
                           "plans made by hand get their specs from plan.with_specs(graph)")
    return spec


def kernel_name(ctx: KernelCtx, tag: str) -> str:
    """`mc_{tag}_{what}_{index}`: what = the group's name, else its distinctive ops ("add_gelu")."""
    what = ctx.group.name
    if not what:
        seen: list[str] = []
        for nid in ctx.group.nodes:
            node = ctx.graph.node(nid)
            if node.kind not in ("view", "input", "constant") and node.op not in seen and node.op != "cast":
                seen.append(node.op)
        what = "_".join(seen[:3]) or "copy"
    what = "".join(ch if ch.isalnum() else "_" for ch in what.lower()).strip("_") or "group"
    return f"mc_{tag}_{what}_{ctx.index}"


# A group of concrete sizes whose ledger lower bound is under this many microseconds is
# launch-bound: its configs' times differ by less than a launch costs, while each config
# autotuned is a compile of 0.3-1 s on the first call. It tries the two that fill the GPU best.
LAUNCH_BOUND_US = 5.0
WAVE = 132      # programs one wave of the H200 holds (one per SM): the ledger's machine


def few_configs(ctx: KernelCtx, cfgs: list, programs, short_too: bool = False) -> list:
    """`cfgs`, or for a launch-bound group (`LAUNCH_BOUND_US`) two of them: those launching
    the fewest programs that still fill a wave, then those launching the most. `programs(c)`
    counts a config's programs. `short_too` adds, where two filled a wave, the config of fewest
    programs under a wave as a third: BERT's 2048 x 768 GEMMs (K = 768) took 13.4 us with 192
    tiles of 128 x 64 where cuBLAS's 132 tiles of 96 x 128 took 7.3 (H100, session 21's
    records), and a wave of fewer, larger tiles (96 of 128 x 128) is the nearest form of ours.
    Over symbolic sizes the table stays (its sweeps are per bucket)."""
    if (ctx.device_type != "cuda" or ctx.graph.symbolic or len(cfgs) <= 2
            or not 0 < ctx.group.lower_bound_us < LAUNCH_BOUND_US):
        return cfgs
    filling = sorted((c for c in cfgs if programs(c) >= WAVE), key=programs)
    short = sorted((c for c in cfgs if programs(c) < WAVE), key=programs, reverse=True)
    return (filling + short)[:2] + (short[:1] if short_too and len(filling) >= 2 else [])


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()

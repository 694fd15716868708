"""What every kernel emitter shares: the `Kernel` record, the `KernelCtx` it is given, `Unsupported`.

Invariants:
- an emitter (`pointwise.emit`, `reduction.emit`, `gemm.emit`, `attention.emit`) takes a
  `KernelCtx` and returns one `Kernel`, or raises `Unsupported` with a one-line reason; the
  module wrapper then runs the group through PyTorch and records `group.fallback = str(e)`;
- `Kernel.source` is top-level module text (one or more `@triton.jit` functions, optionally
  autotuned), after any `Kernel.shared` text (a library kernel several groups bind, written
  once per module); `Kernel.launch` are lines of `call()` that refer to tensors only as
  `ctx.buf(nid)` (`buf{nid}`), which the wrapper binds (inputs, constants) or allocates
  (every group output, with `ctx.strides(nid)`) before the launch lines run;
- shapes and strides are concrete: a compiled module is specialised on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.ir.ops.text import Unsupported  # noqa: F401  (op forms raise it too: it lives in the IR)
from minicomp.passes.plan import Group
from minicomp.target import Target


@dataclass
class Kernel:
    name: str            # "mc_gemm_bias_gelu_3": says what it holds
    source: str          # top-level text: one or more @triton.jit (optionally @triton.autotune) functions
    launch: list[str]    # Python lines for call() that launch it; tensors referred to as ctx.buf(nid)
    shared: str = ""     # module text this kernel's source needs (a library kernel), written once per module


@dataclass
class KernelCtx:
    graph: Graph
    group: Group
    index: int           # position of the group in the plan (unique kernel names)
    target: Target       # what the kernels are for (a device type string means `Target(that)`)

    def __post_init__(self) -> None:
        if isinstance(self.target, str):
            self.target = Target(self.target)

    @property
    def device_type(self) -> str:
        """"cuda" or "cpu" (cpu = Triton interpreter: no autotune sweep, no bf16 tl.dot)."""
        return self.target.device_type

    def buf(self, nid: int) -> str:
        """Variable name of node nid's tensor in call()."""
        return f"buf{nid}"

    def strides(self, nid: int) -> tuple[int, ...]:
        """The node's fixed layout, else contiguous strides of its shape."""
        node = self.graph.node(nid)
        if node.layout is not None:
            return tuple(node.layout)
        return contiguous_strides(node.shape)


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


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()

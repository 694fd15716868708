"""The generated module: header, imports, kernels, `call(*inputs)`, and a script entry.

One module per compiled graph, readable and runnable on its own (like Inductor's output_code.py).
`call()` checks its inputs (count, shape, dtype, device type), binds each graph input and constant
to `buf{nid}`, then runs the groups in dependency order: a kernel group allocates its outputs
with the strides codegen assumed (or takes a dead buffer's memory: buffers.py) and launches; any
other group runs as PyTorch lines (fallback.py; a GEMM or an attention with nothing to fuse:
library.py, cuBLAS; library_attention.py, SDPA). Module-level lists the loader fills: `CONSTANTS`
(tensor constants, in the layout kernels read) and `OPAQUE` (opaque nodes' callables). Run as a script
(`python mod.py [inputs.pt [outputs.pt]]`) it reads `<its name>.constants.pt` beside itself
(checking the digest its file name carries, `GeneratedModule.write`), runs on the given or on
seeded random inputs, and prints the output shapes (that block: codegen/script.py).

The machinery around the kernels is imported, not written into each module: launches, the first
call's compiles and the input checks from `minicomp.runtime.launcher` (`_rt`), the Triton helpers
kernels call from `minicomp.runtime.kernel_lib`. On CUDA the module carries `_WARM` and `_LATER`,
every launch written with dtypes in place of tensors (codegen/launch.py): the first call compiles
`_WARM`'s kernels at once (`_rt.CompilingAtOnce`), and `_LATER`'s in the background while eager's
lines answer for them (first_calls.py). Invariants: kernel names are unique (group index suffix);
`generate` mutates neither the graph nor the plan: why a group runs through PyTorch after all is
the module's record (`GeneratedModule.fallbacks`); kernels are written from the groups' specs; on
CUDA every tensor a kernel is given starts 16-byte aligned (`_as_layout`, the loader's `_aligned`);
codegen writes launches from `Launch` records and reads no generated text back.
"""

from __future__ import annotations

from typing import Callable

import torch

from minicomp.codegen import (attention, combo, dedup, fallback, first_calls, gemm, index_check, library, library_attention,
                              pdl, pointwise, reduction, sizes, target_check)
from minicomp.codegen.buffers import BufferPlan
from minicomp.codegen.builder import CodeBuilder, NameScope
from minicomp.codegen.common import Kernel, KernelCtx, Unsupported
from minicomp.codegen.launch import launch_lines, queue_warm, scratch_lines
from minicomp.codegen.lowering import ident, user_label
from minicomp.codegen.names import comment_text, line_order
from minicomp.codegen.order import group_order
from minicomp.codegen.generated import GeneratedModule
from minicomp.codegen.script import script_block
from minicomp.errors import CompileError
from minicomp.ir.dims import SymbolicDim
from minicomp.ir.dtypes import type_str
from minicomp.ir.graph import Graph, Node
from minicomp.plan.records import Group, Plan
from minicomp.target import Target

_EMITTERS: dict[str, Callable[[KernelCtx], Kernel]] = {
    "pointwise": pointwise.emit, "reduction": reduction.emit, "gemm": gemm.emit, "attention": attention.emit,
}

MODULE_NAMES = ("torch", "triton", "tl", "os", "sys", "device", "inputs", "grid", "call", "CONSTANTS",
                "OPAQUE", "DEVICE_TYPE", "LAYOUTS", "run", "_rt", "_empty", "_as_layout", "_launch", "_align16", "_tma_ready", "_sm_count",
                "_WARM", "_LATER", "_tune_bench", "_tune_options", "_round_bf16", "_max_nan", "_min_nan")


def _emitter(kind: str) -> tuple[Callable[[KernelCtx], Kernel] | None, str]:
    """The kind's `emit`, or None and why not (opaque groups run through PyTorch)."""
    emit = _EMITTERS.get(kind)
    return (emit, "") if emit else (None, "opaque op" if kind == "opaque" else f"no emitter for group kind {kind!r}")


class ModuleWriter:
    def __init__(self, graph: Graph, plan: Plan, target: Target, forced: dict[int, str] | None = None,
                 labels: dict[str, str] | None = None):
        self.graph, self.plan, self.target = graph, plan, target
        self.device_type = target.device_type
        self.forced = dict(forced or {})       # group id -> why it must run through PyTorch (a kernel that failed to compile)
        self.symbolic = graph.symbolic         # sizes as runtime values (codegen/sizes.py: renamed s0, s1, ...)
        self.labels = dict(labels or {})       # module name of a symbol -> the user's name
        self.kernel_groups: dict[str, int] = {}
        self.kernel_users: dict[str, list[int]] = {}   # a kernel the same up to names serves several groups
        self.canonical: dict[str, tuple[Kernel, dedup.Form]] = {}   # dedup's canonical text -> the kernel written for it, its Form
        self.names = _call_names(graph)        # node id -> its tensor's name in call(), for leaves the user named
        self.kernels: list[Kernel] = []
        self.constants: list[torch.Tensor] = []
        self.const_slot: dict[int, int] = {}
        self.opaque: list[Callable] = []
        self.opaque_slot_of: dict[int, int] = {}
        self.call = CodeBuilder()
        self.body = CodeBuilder()          # the groups' part of call(), written before the bindings
        self.scalars_used: set[int] = set()  # scalar constants PyTorch code needs as tensors
        self.index_checked: set = set()    # index tensors call() has checked already (index_check.lines)
        self.summary: list[str] = []
        self.fallbacks: dict[int, str] = {}
        self.library: dict[int, str] = {}     # groups with nothing to fuse that call cuBLAS or SDPA (not fallbacks)
        self.warm: list[str] = []          # `_WARM` entries (CUDA): what the first call compiles at once
        self.later: list[str] = []         # `_LATER` entries: what compiles in the background meanwhile
        # aligned on CUDA (TMA operands skip `_align16`): inputs, constants, the buffers run() allocates
        self.aligned: set[int] = ({n.id for n in graph.nodes() if n.kind in ("input", "constant")}
                                  if self.device_type == "cuda" else set())
        self.tma_used = False              # some launch builds TMA descriptors: run() installs Triton's allocator once
        self.buffers = BufferPlan()        # what each launch reads and allocates: dead buffers' memory reused

    def opaque_slot(self, node: Node) -> int:
        if node.id not in self.opaque_slot_of:
            self.opaque_slot_of[node.id] = len(self.opaque)
            self.opaque.append(node.attrs["fn"])
        return self.opaque_slot_of[node.id]

    # ------------------------------------------------------------------ call()
    def write_call(self) -> None:
        g, b = self.graph, self.call
        arg_names = [self.names[i] for i in g.inputs]
        unpack = f"{', '.join(arg_names)}{',' if len(arg_names) == 1 else ''} = inputs"
        with b.block("def call(*inputs):"):
            b.writeline(f'"""Run the compiled graph: takes {len(g.inputs)} tensor(s), returns a list of '
                        f'{len(g.outputs)} tensor(s)."""')
            with b.block(f"if len(inputs) != {len(g.inputs)}:"):
                expected = f"{g.name} takes {len(g.inputs)} input(s) ({', '.join(g.input_names())}), got "
                b.writeline(f"raise TypeError({expected!r} + str(len(inputs)))")
            if g.inputs:
                b.writeline(unpack)
                if self.symbolic:
                    b.writeline("# the symbolic sizes, read from the inputs (codegen/sizes.py)")
                    b.writelines(sizes.bind_lines(g, arg_names, self.labels))
                for nid, name in zip(g.inputs, arg_names):
                    n = g.node(nid)
                    b.writeline(f"_rt.check_input({name}, {n.attrs['name']!r}, {tuple(n.shape)!r}, {n.dtype}, DEVICE_TYPE)")
            b.writeline("return run(*inputs)")
        b.writelines(["", ""])
        ctx0 = KernelCtx(g, Group(-1, "opaque", [], [], []), -1, self.target, self.names)
        # static sizes: every input laid out in one call (a loop over ~200 weights, not 200 calls)
        at_once = bool(g.inputs) and not self.symbolic and [ctx0.buf(nid) for nid in g.inputs] == arg_names
        if at_once:
            b.writeline(f"LAYOUTS = {tuple(map(ctx0.strides, g.inputs))!r}  # each input's strides, as run() reads it")
            b.writelines(["", ""])
        with b.block("def run(*inputs, _laid_out=False):" if at_once else "def run(*inputs):"):
            b.writeline('"""call() without its input checks, for a caller that made them (minicomp\'s api: its '
                        'guards compare every input\'s shape, dtype, device and strides)."""')
            if at_once:
                b.writeline("# _laid_out: the caller's guards found each input's strides equal to LAYOUTS")
            if g.inputs:
                aligned = " and _rt.aligned(inputs)" if self.device_type == "cuda" else ""
                b.writeline(f"{unpack[:-9]} = inputs if _laid_out{aligned} else _rt.as_layouts(inputs, LAYOUTS)"
                            if at_once else unpack)
                if self.symbolic:
                    b.writelines(sizes.bind_lines(g, arg_names, self.labels))
                b.writeline(f"device = {arg_names[0]}.device")
            else:
                b.writeline("device = torch.device(DEVICE_TYPE)")
            b.writeline("_empty = _rt.allocator(device)  # empty(shape, strides, dtype) on device")
            for nid, name in zip(g.inputs, arg_names if not at_once else ()):
                b.writeline(f"{ctx0.buf(nid)} = _as_layout({name}, {ctx0.strides(nid)!r})")
            order, written = group_order(g, self.plan), set()
            for index, group in enumerate(order):     # a group may share the launch of one before it (combo.py)
                if group.id not in written:
                    written |= self._write_group(group, index, combo.partners(g, order, index, self.forced, self.target))
            self.scalars_used |= set(g.outputs)
            self._bind_constants(ctx0)
            if self.tma_used:         # Triton's allocator for TMA descriptors, once a call
                b.writeline("_tma_ready()")
            if self.device_type == "cuda" and self.kernels:
                with b.block(f"if _WARM{' or _LATER' if self.later else ''}:  # the first call: kernels compile at once"):
                    with b.block("with _rt.CompilingAtOnce(_WARM, later=_LATER):" if self.later else "with _rt.CompilingAtOnce(_WARM):"):
                        b.writeline("return run(*inputs)")
            body = self.body.getvalue().rstrip("\n")
            b.splice(self.buffers.apply(body, set(g.outputs)) if self.target.reuse_buffers else body)
            b.writeline(f"return [{', '.join(ctx0.buf(o) for o in g.outputs)}]")

    def _bind_constants(self, ctx0: KernelCtx) -> None:
        g, b = self.graph, self.call
        used = {a for n in g.nodes() for a in n.args} | set(g.outputs)
        fresh = fallback.returned_scalars(g)     # the caller may get these back: a copy per call
        for n in g.nodes():
            if n.op != "constant" or n.id not in used:
                continue
            value = n.attrs["value"]
            label = f" {comment_text(n.attrs['label'])}" if n.attrs.get("label") else ""
            if not isinstance(value, torch.Tensor) and n.id not in self.scalars_used:
                continue  # inlined into the kernels that use it
            if isinstance(value, torch.Tensor):
                strides = ctx0.strides(n.id)
                t = value.detach()
                if any(d != 1 and a != b for d, a, b in zip(n.shape, t.stride(), strides)):
                    # re-lay out where it stays (a CUDA weight is not sent through the host)
                    t = torch.empty_strided(n.shape, strides, dtype=n.dtype, device=t.device).copy_(t)
                self.const_slot[n.id] = len(self.constants)
                self.constants.append(t)
                b.writeline(f"{ctx0.buf(n.id)} = CONSTANTS[{self.const_slot[n.id]}]  # {type_str(n.shape, n.dtype)}{label}")
            else:
                b.writeline(fallback.scalar_line(ctx0, n, n.id in fresh) + (f"  #{label}" if label else ""))

    def _write_group(self, group: Group, index: int, partners: list[Group] = ()) -> set[int]:
        """Write the group's lines, and those of the first `partners` (the groups after it) that one
        kernel computes with it (codegen/combo.py); the ids of the groups written."""
        g, b = self.graph, self.body
        ctx = KernelCtx(g, group, index, self.target, self.names)
        b.writeline("")
        if all(0 in g.node(o).shape for o in group.outputs):
            # a zero-size dimension: the outputs hold no element, so there is nothing to launch
            # (index arithmetic over a size-0 dimension has no meaning either)
            b.writeline(f"# group {group.id}: {group.kind} [{', '.join(f'%{n}' for n in group.nodes)}] has only empty outputs: no kernel")
            self.summary.append(f"group {group.id:<3} {group.kind:<24} -> nothing (empty outputs)")
            for o in group.outputs:
                n = g.node(o)
                b.writeline(f"{ctx.buf(o)} = _empty({tuple(n.shape)!r}, {ctx.strides(o)!r}, {n.dtype})")
            return {group.id}
        ctxs = [ctx] + [KernelCtx(g, p, index + 1 + i, self.target, self.names) for i, p in enumerate(partners)]
        kernel, shared = (combo.emit(ctxs) if partners else None) or (None, 1)   # sibling GEMMs leave cuBLAS
        ctxs, groups = ctxs[:shared], [c.group for c in ctxs[:shared]]
        what = f"{group.kind}" + (f" {group.name}" if group.name else "")
        nodes = ", ".join(f"%{n}" for n in group.nodes)
        b.writeline(f"# group {group.id}: {comment_text(what)} [{nodes}]")
        lib = library_attention if group.kind == "attention" else library     # SDPA, or cuBLAS for a GEMM
        self.buffers.read(index, [n for c in ctxs for n in c.group.inputs])     # and a group not a kernel of ours:
        alias = lambda: self.buffers.may_alias(index, group.inputs, group.outputs)  # noqa: E731  its outputs may view its inputs
        if kernel is None and (library_call := None if group.id in self.forced else lib.choice(ctx)) is not None:
            self.library[group.id] = library_call          # nothing to fuse: a library call, no kernel, no fallback
            self.summary.append(f"group {group.id:<3} {what:<24} -> {library_call}")
            if group.kind == "gemm" and self.device_type == "cuda":
                self.aligned |= set(group.outputs)     # cuBLAS's new tensor, or `_as_layout`'s aligned one
            lib.emit(ctx, b, self.opaque_slot)
            alias()
            return {group.id}
        if kernel is None and group.kind == "pointwise" and group.id not in self.forced and (view := pointwise.as_view(ctx)):
            self.summary.append(f"group {group.id:<3} {what:<24} -> {view[0]}")
            b.writelines(view[1])
            alias()
            return {group.id}
        emit, reason = _emitter(group.kind)
        if group.id in self.forced:
            emit, reason = None, self.forced[group.id]
        if emit is not None and self.symbolic and group.kind not in sizes.SYMBOLIC_KINDS:
            emit, reason = None, f"{group.kind} kernels take concrete sizes so far"
        b.writelines(combo.partner_comments(groups))
        if emit is not None and kernel is None:
            try:
                kernel = emit(first_calls.context(ctx))
            except Unsupported as e:
                reason = str(e) or "unsupported"
            except SymbolicDim as e:      # a decision the symbols' ranges do not settle
                reason = f"symbolic sizes: {e}"
        if kernel is None:
            self.fallbacks[group.id] = reason
            self.summary.append(f"group {group.id:<3} {what:<24} -> PyTorch ({reason})")
            fallback.emit_torch(ctx, reason, b, self.opaque_slot)
            alias()
            self.scalars_used |= {a for n in group.nodes for a in g.node(n).args}
            return {group.id}
        kernel = first_calls.tier(ctx, pdl.dependent(kernel) if self.target.pdl else kernel)
        kernel, first = dedup.shared(kernel, self.canonical, self.kernel_groups)
        if first is None:
            self.kernels.append(kernel)
        self.kernel_groups.setdefault(kernel.name, group.id)
        self.kernel_users.setdefault(kernel.name, []).extend(grp.id for grp in groups)
        for launch in kernel.launches:          # a second form of the kernel (codegen/sizes.py)
            if launch.fn:
                self.kernel_groups.setdefault(launch.fn, group.id)
        for grp in groups:
            others = ", ".join(str(o.id) for o in groups if o is not grp)
            self.summary.append(f"group {grp.id:<3} {grp.kind + (f' {grp.name}' if grp.name else ''):<24} -> {kernel.name}"
                                + (f" (the kernel of group {first})" if first is not None else "")
                                + (f" (one launch with group{'s' if len(groups) > 2 else ''} {others})" if others else ""))
            for o in grp.outputs:
                n = g.node(o)
                line = f"{ctx.buf(o)} = _empty({tuple(n.shape)!r}, {ctx.strides(o)!r}, {n.dtype})"
                b.writeline(line)
                self.buffers.alloc(index, o, ctx.buf(o), line, (tuple(n.shape), ctx.strides(o), n.dtype))
                self.aligned |= {o} if self.device_type == "cuda" else set()   # a new buffer (or a reused one): aligned
        # index tensors the kernel reads through, checked first (once a call): eager's error for a bad index
        for c in ctxs:
            b.writelines(index_check.lines(c, self.index_checked) if kernel.launches else [])
        b.writelines(scratch_lines(kernel.launches))
        cuda = self.device_type == "cuda"
        if not kernel.launches:
            b.writeline(f"# {kernel.name}: {kernel.note or 'nothing to launch'}")
        for launch in kernel.launches:
            b.writelines(launch_lines(kernel.name, launch, ctx.buf, cuda, lambda nid: g.node(nid).dtype,
                                      self.aligned, tma_ready=False))
            self.tma_used |= launch.tma
        first_calls.write_else(ctxs, kernel, b, self.opaque_slot)   # eager answers until the kernel compiles
        if cuda:
            queue_warm(kernel, first is not None, lambda nid: str(g.node(nid).dtype), self.warm, self.later)
        return {grp.id for grp in groups}

    # ------------------------------------------------------------------ whole module
    def source(self) -> str:
        self.plan_groups = {grp.id: grp for grp in self.plan.groups}
        self.write_call()
        g = self.graph
        out = CodeBuilder()
        out.writeline(f"# minicomp: generated module for graph {comment_text(repr(g.name))} (device type: {self.device_type})")
        out.writeline(f"# plan: {len(self.plan.groups)} group(s), {len(self.kernels)} Triton kernel(s), "
                      f"{len(self.fallbacks)} through PyTorch{library.header_note(self.library)}")
        for line in self.summary:
            out.writeline(f"#   {comment_text(line)}")
        ins = ", ".join(f"{comment_text(g.node(i).attrs['name'])} {g.node(i).type}" for i in g.inputs)
        outs = ", ".join(f"%{o} {g.node(o).type}" for o in g.outputs)
        out.writeline(f"# inputs: {ins or 'none'}")
        out.writeline(f"# outputs: {outs}")
        out.writeline("# run as a script: python this.py [inputs.pt [outputs.pt]] (random inputs by default)")
        out.writeline("")
        out.writelines(["import os", "import sys", ""])
        out.writeline(f"DEVICE_TYPE = {self.device_type!r}")
        with out.block('if DEVICE_TYPE == "cpu" and "triton" not in sys.modules:'):
            out.writeline("# CPU tensors run under Triton's interpreter, which must be on before triton is imported")
            out.writeline('os.environ.setdefault("TRITON_INTERPRET", "1")')
        out.writeline("")
        out.writelines(["import torch", "import triton", "import triton.language as tl", ""])
        out.writeline("# minicomp's runtime (minicomp/runtime/launcher.py): launches, the first call's compiles, checks")
        out.writeline("from minicomp.runtime import launcher as _rt")
        out.writeline("from minicomp.runtime.kernel_lib import _max_nan, _min_nan, _round_bf16")
        out.writeline("")
        out.writeline("CONSTANTS = []  # tensor constants: set by minicomp's loader, or read from <this file>.constants.pt")
        out.writeline(f"OPAQUE = []  # {len(self.opaque)} PyTorch callable(s) for opaque nodes, set by minicomp's loader")
        out.writeline("_as_layout, _align16, _tma_ready, _sm_count = _rt.as_layout, _rt.align16, _rt.tma_ready, "
                      "_rt.sm_count")
        if self.device_type == "cuda" and self.kernels:
            by_sizes = ", by_sizes=True" if self.symbolic else ""
            out.writeline(f"_launch, _tune_bench = _rt.Launcher(globals(){by_sizes}, aligned=True), _rt.tune_bench")
            out.writeline("_tune_options = _rt.tune_options()  # tuning records on disk, where this Triton keeps them")
        for shared in dict.fromkeys(k.shared for k in self.kernels if k.shared):
            out.writeline("")
            out.writeline("")
            out.splice(shared.rstrip("\n"))
        for k in self.kernels:
            out.writeline("")
            out.writeline("")
            users = [self.plan_groups[gid] for gid in self.kernel_users[k.name]]
            where = sorted(dict.fromkeys(g.node(n).origin for grp in users for n in grp.nodes if g.node(n).origin),
                           key=line_order)
            if len(users) > 1:
                out.writeline(f"# {k.name} serves groups {', '.join(str(grp.id) for grp in users)} "
                              "(the same kernel up to names: codegen/dedup.py)")
            if where:
                out.writeline(f"# {k.name} computes {comment_text(', '.join(where))}")
            out.splice(k.source.rstrip("\n"))
        sites = [k.name for k in self.kernels if len(self.kernel_users[k.name]) > 1]
        if self.device_type == "cuda" and sites:
            out.writeline("")
            out.writeline("# launched by several groups: their fast launchers are kept per argument values")
            out.writeline(f"_launch.by_site({', '.join(sites)})")
        if self.device_type == "cuda" and self.kernels:
            out.writelines(["", ""])
            out.writeline("# what the first call compiles at once, before launching anything: (kernel, arguments")
            out.writeline("# with tensors as their dtypes, keyword arguments); autotuned kernels: every config")
            with out.block("_WARM = ["):
                out.writelines(self.warm)
            out.writeline("]")
            if self.later:
                out.writeline("# compiled in the background, while another form (a kernel, or cuBLAS) serves")
                with out.block("_LATER = ["):
                    out.writelines(self.later)
                out.writeline("]")
        out.writeline("")
        out.writeline("")
        out.splice(self.call.getvalue().rstrip("\n"))
        out.writelines(["", ""])
        out.splice(script_block(self.graph, bool(self.constants), len(self.opaque)))
        return out.getvalue()


def _call_names(graph: Graph) -> dict[int, str]:
    """call()'s variable for each input and each labelled tensor constant: the user's name made
    safe (`ln_1.weight` -> `ln_1_weight`; never a keyword, builtin, `buf<N>` or one of the
    module's own names), unique; other tensors are `buf{nid}` (KernelCtx.buf)."""
    scope = NameScope()
    for reserved in MODULE_NAMES + tuple(sizes.module_names(graph)):
        scope.fresh(reserved)
    names = {}
    for n in graph.nodes():
        label = user_label(n)
        if label is not None and (n.op == "input" or isinstance(n.attrs.get("value"), torch.Tensor)):
            names[n.id] = scope.fresh(ident(label))
    return names


def generate(graph: Graph, plan: Plan, target: Target | str,
             forced_fallbacks: dict[int, str] | None = None) -> GeneratedModule:
    """The readable Triton module for `graph` as `plan` groups it, for `target` (a device type
    string "cuda" or "cpu" means `Target.for_device(that)`: this machine's device and the
    environment's switches). When the target asks for the GPU-true check (`verify_arch`),
    every kernel is also compiled for that GPU (codegen/target_check.py).
    `forced_fallbacks` (group id -> reason) runs those groups through PyTorch: the runtime's
    answer to a kernel that Triton's compiler rejected."""
    if isinstance(target, str):
        if target not in ("cuda", "cpu"):
            raise CompileError(f"unknown device type {target!r} (expected 'cuda' or 'cpu')")
        target = Target.for_device(target)
    labels: dict[str, str] = {}
    if graph.symbolic:
        graph, plan, labels = sizes.rename(graph, plan)
    w = ModuleWriter(graph, plan, target, forced_fallbacks, labels)
    source = w.source()
    generated = GeneratedModule(source=source, constants=w.constants, opaque=w.opaque,
                           kernel_names=[k.name for k in w.kernels], graph_name=graph.name,
                           device_type=target.device_type, fallbacks=w.fallbacks, library=w.library,
                           kernel_groups=w.kernel_groups, kernel_users=w.kernel_users, kernels=list(w.kernels), target=target,
                           input_specs=[(graph.node(i).attrs["name"], graph.node(i).shape, graph.node(i).dtype)
                                        for i in graph.inputs])
    if target.verify_arch is not None and w.kernels:
        check = generated
        if target.arch != target.verify_arch or target.device_type != "cuda":
            check = generate(graph, plan, target.for_check(target.verify_arch), forced_fallbacks)
        target_check.verify(graph, plan, target.verify_arch, check, target.verify_depth)
    return generated

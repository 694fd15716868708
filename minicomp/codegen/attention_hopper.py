"""Attention groups on Hopper: when one runs on the Gluon kernel, and how it is launched.

Triton's block language waits for every `tl.dot` of codegen/attention.py's key loop at
once, so the tensor cores idle while the softmax runs (that module's docstring has the
profile). attention_hopper_kernel.py is written in Gluon, Triton's explicit dialect for
Hopper: a loader warp feeds two consumer warpgroups by TMA, and each leaves P @ V on the
tensor cores while it computes the next softmax; programs are persistent. On the H200
(benchmarks/ablations/attention_hopper_ab.py, hand-written causal attention, d128 bf16, each against
SDPA in the same run):

    shape                    Gluon kernel   block-language kernel   SDPA
    B4 H32 S4096             1.037 ms       1.293                   1.061
    B8 H16 S1024 (gpt)       0.094          0.111                   0.091
    B4 H32/8 S2048 (llama)   0.289          0.354                   0.291

`why_not(ctx, spec)` is None when a group fits the kernel, else the reason, which the
block-language kernel's source then records in a comment. The kernel covers the common
case only (the block-language kernel covers the rest):

- a CUDA device of compute capability 9.0 and a Triton with Gluon's Hopper API;
- no mask tensor, sliding window or soft-capping, a positive scale; causal only with Sq == Sk (PyTorch's top-left
  alignment then puts the diagonal on the tile diagonal);
- q, k, v of one half dtype (fp16/bf16), read as they are (no casts in the group);
- Sq and Sk multiples of 128 (the kernel masks nothing but the causal diagonal); D == Dv,
  64 or 128; at most two batch dimensions (batch, heads);
- q, k and v each addressable by one 2-D TMA descriptor (`tma_view`): unit stride along the
  head dim, a row stride of whole 16 bytes, and every (batch, head) tile inside one row of
  the descriptor. Contiguous [B, H, S, D] tensors and [B, S, H, D] ones seen through a
  transpose both qualify;
- the group's one output is the attention result (no fused epilogue), stored with unit
  stride along its last dimension.

- enough work to pay for its compile (`PAYS_FROM` flops): the kernel takes ~4.4 s to compile
  on the H200's host, the block-language kernel's configs ~1 s each in parallel, and below a
  few GFLOP (a Llama layer at batch 2 x 512) the two kernels' times differ by microseconds.

MINICOMP_HOPPER_ATTENTION=0 turns the kernel off (benchmarks compare the two that way); =1
takes it wherever it fits, however small (the test suite runs so: its shapes are small).

Generated modules carry the kernel's file verbatim (`Kernel.shared`, once per module) and
bind one `gluon.jit(attn_fwd_hopper)` per group.
"""

from __future__ import annotations

import functools
import importlib
import math
from dataclasses import replace
from pathlib import Path

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.common import Buf, Grid, Kernel, KernelCtx, Launch, Ready, kernel_name
from minicomp.codegen.epilogue import LOG2E, Operand
from minicomp.target import HOPPER_ATTENTION_ENV

ENV_VAR = HOPPER_ATTENTION_ENV
KERNEL_FILE = Path(__file__).with_name("attention_hopper_kernel.py")
ROWS_PER_PROGRAM = 128      # two consumer warpgroups of 64 query rows
KEYS_PER_BLOCK = 128
STAGES = 2


@functools.cache
def gluon_hopper_available() -> bool:
    """Whether this Triton has the Gluon API the kernel uses (Triton 3.6 and later)."""
    try:
        gl = importlib.import_module("triton.experimental.gluon.language")
        hopper = importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
    except ImportError:
        return False
    return (hasattr(gl, "warp_specialize") and hasattr(hopper, "warpgroup_mma")
            and hasattr(hopper.tma, "make_tensor_descriptor") and hasattr(hopper.mbarrier, "expect"))


@functools.cache
def kernel_text() -> str:
    """The kernel file, read once per process (each module that uses it carries a copy)."""
    return KERNEL_FILE.read_text()


def _batch_heads(batch: tuple[int, ...]) -> tuple[int, int]:
    """(B, H) of the kernel's grid for the spec's batch dims (H is the last; missing ones are 1)."""
    if len(batch) == 2:
        return batch[0], batch[1]
    return 1, (batch[0] if batch else 1)


def tma_view(op: Operand, zs: tuple[str, str], row: str, col: str, groups: int, bh: tuple[int, int],
             seq: int, d: int) -> tuple[dict[str, int] | None, str]:
    """The operand's offset `C + b*SB + h*SH + s*SS + d` as {C, SB, SH, SS, ROWS} for the
    kernel's 2-D descriptor [ROWS, SS], or None and why not. `zs` are the names of the batch
    and head symbols (either may be absent from the offset: a size-1 dimension), `groups` the
    query heads per KV head (the head term is then `(h // groups) * SH`)."""
    coef = {"C": op.offset.const, "SB": 0, "SH": 0, "SS": 0, "D": 0}
    for atom, k in op.offset.terms:
        if isinstance(atom, ix.Sym) and atom.name in (zs[0], zs[1], row, col):
            key = {zs[0]: "SB", zs[1]: "SH", row: "SS", col: "D"}[atom.name]
            if groups > 1 and key == "SH":
                return None, "its head index is not h // groups"
        elif (groups > 1 and isinstance(atom, ix.FloorDiv) and atom.div == groups
              and atom.arg.single_atom() == ix.Sym(zs[1], bh[1])):
            key = "SH"
        else:
            return None, "its offset is not linear in batch, head, row and column"
        coef[key] = k
    if coef["D"] != 1 or coef["SS"] <= 0 or min(coef["SB"], coef["SH"], coef["C"]) < 0:
        return None, "it is not read row by row with unit stride along the head dim"
    ss = coef["SS"]
    if ss % 8:
        return None, f"its row stride ({ss} elements) is not a whole 16 bytes"
    heads = bh[1] // groups
    if any((coef["C"] + b * coef["SB"] + h * coef["SH"]) % ss + d > ss for b in range(bh[0]) for h in range(heads)):
        return None, "a head's tile would straddle two rows of its TMA descriptor"
    last = coef["C"] + (bh[0] - 1) * coef["SB"] + (heads - 1) * coef["SH"] + (seq - 1) * ss + d - 1
    rows = last // ss + 1
    if rows >= 2 ** 31:
        return None, "more rows than a TMA coordinate holds"
    return {"C": coef["C"], "SB": coef["SB"], "SH": coef["SH"], "SS": ss, "ROWS": rows}, ""


# attention flops (4 * batch*heads * Sq * Sk * D, halved when causal) from which the kernel pays
# for its compile: ~7 us of the H200's dense bf16 rate; a Llama layer (16 heads of 128) at
# batch 2 reaches it at about 720 tokens, gpt_block's suite size (8 x 1024, 16 heads) has 8x it
PAYS_FROM = 2 ** 32


def why_not(ctx: KernelCtx, spec, capability: tuple[int, int] | None = None) -> str | None:
    """None when the group runs on the Hopper kernel, else why it does not. `capability`
    defaults to the target's."""
    if ctx.device_type != "cuda":
        return "not a CUDA module"
    if ctx.target.hopper_attention == "0":
        return f"{ENV_VAR}=0"
    capability = capability if capability is not None else ctx.target.capability
    if capability != (9, 0):
        return f"compute capability {capability}, not 9.0"
    if not gluon_hopper_available():
        return "this Triton has no Gluon for Hopper"
    if spec.mask is not None:
        return "a mask tensor"
    if spec.window or spec.softcap:
        return "a sliding window or soft-capping"
    if spec.scale <= 0:
        return f"scale {spec.scale} is not positive"
    if spec.q.dtype not in (torch.float16, torch.bfloat16):
        return f"{spec.q.dtype} operands"
    if any(op.casts for op in (spec.q, spec.k, spec.v)):
        return "q, k or v is cast inside the group"
    if ctx.graph.symbolic:
        # its form is fixed per length (multiples of 128, TMA views sized at compile time): a graph
        # over symbolic sizes runs the block-language kernel, which serves every length
        return "symbolic sizes (the Gluon kernel takes concrete lengths)"
    if spec.causal and spec.sq != spec.sk:
        return f"causal with Sq={spec.sq} != Sk={spec.sk}"
    if spec.sq % ROWS_PER_PROGRAM or spec.sk % KEYS_PER_BLOCK:
        return f"Sq={spec.sq} or Sk={spec.sk} is not a multiple of 128"
    if spec.d != spec.dv or spec.d not in (64, 128):
        return f"head dims D={spec.d}, Dv={spec.dv} (needs 64 or 128, equal)"
    if len(spec.batch) > 2:
        return f"{len(spec.batch)} batch dimensions"
    if list(ctx.group.outputs) != [spec.node.id]:
        return "a fused epilogue or another output"
    if ctx.strides(spec.node.id)[-1] != 1:
        return "the output's last stride is not 1"
    return too_small(ctx, spec, "does not pay for its compile")


def too_small(ctx: KernelCtx, spec, what: str) -> str | None:
    """Why a static attention of under PAYS_FROM flops keeps the block-language kernel (`what`
    the faster path does not do for it), or None: it is big enough, or MINICOMP_HOPPER_ATTENTION=1
    takes the faster paths however small (the test suite runs so)."""
    flops = 4 * math.prod(spec.batch) * spec.sq * spec.sk * spec.d // (2 if spec.causal else 1)
    if ctx.target.hopper_attention != "1" and flops < PAYS_FROM:
        return f"{flops / 1e9:.2g} GFLOP {what} (from {PAYS_FROM / 1e9:.2g}; {ENV_VAR}=1 takes it anyway)"
    return None


def tiered(kernel: Kernel, first: Kernel) -> Kernel:
    """The Gluon kernel `kernel` with the block-language kernel `first` in front of it. The Gluon
    kernel takes ~4.4 s to compile on the H200's host, the block-language one ~1 s a config in
    parallel with the module's other kernels: the first call would wait for the Gluon compile.
    Instead it compiles in the background (the module's `_LATER`, runtime/launcher.py) and
    call() launches `first` until it has (`Ready`): the first calls run the block-language
    kernel, later ones the Gluon kernel. Both compute the same attention within rounding, so a
    call's result can differ in its last bits between those calls. `minicomp.wait_compiled()`
    waits for background compiles (benchmarks time the settled module; CUDA graphs capture it)."""
    later = [replace(launch, when=Ready(launch.fn or kernel.name)) for launch in kernel.launches]
    now = [replace(launch, fn=launch.fn or first.name, when=Ready(kernel.name, ready=False))
           for launch in first.launches]
    return Kernel(kernel.name, first.source + "\n\n" + kernel.source, now + later, shared=kernel.shared)


def emit(ctx: KernelCtx, spec) -> tuple[Kernel | None, str]:
    """The group's launch of the Hopper kernel (for a group `why_not` passed), or None and
    why not: an operand without a TMA view."""
    bh = _batch_heads(spec.batch)
    zs = ("z0", "z1") if len(spec.batch) == 2 else ("-", "z0")
    groups = spec.groups
    consts: dict[str, object] = {"BH": bh[0] * bh[1], "H": bh[1], "G": groups, "SQ": spec.sq, "SK": spec.sk, "D": spec.d,
                                 "CAUSAL": spec.causal}
    for tag, op, row, col, seq, g in (("Q", spec.q, "qm", "qd", spec.sq, 1), ("K", spec.k, "kn", "kd", spec.sk, groups),
                                      ("V", spec.v, "vn", "vd", spec.sk, groups)):
        view, why = tma_view(op, zs, row, col, g, bh, seq, spec.d)
        if view is None:
            return None, f"{tag.lower()} ({ctx.graph.node(op.leaf).describe()}): {why}"
        consts.update({f"{tag}_{k}": v for k, v in view.items()})
    o_strides = ctx.strides(spec.node.id)
    o_batch = dict(zip(("SB", "SH") if len(spec.batch) == 2 else ("SH",), o_strides[:-2]))
    consts.update({"O_C": 0, "O_SB": o_batch.get("SB", 0), "O_SH": o_batch.get("SH", 0), "O_SS": o_strides[-2],
                   "STAGES": STAGES})

    name = kernel_name(ctx, "attn_hopper")
    nbh = math.prod(spec.batch)
    what = ("causal " if spec.causal else "") + f"attention on Hopper (Gluon, warp-specialised): softmax(q @ k^T * " \
        f"{spec.scale:.6g}) @ v over {nbh} batch x head(s), Sq={spec.sq}, Sk={spec.sk}, D={spec.d}"
    source = f"# {what}\n{name} = gluon.jit(attn_fwd_hopper)\n"
    bufs = tuple(Buf(op.leaf) for op in (spec.q, spec.k, spec.v)) + (Buf(spec.node.id),)
    tiles = spec.sq // ROWS_PER_PROGRAM * nbh
    # persistent: at most a program per SM
    launch = Launch(Grid.of(tiles, persistent=True), bufs + (spec.scale * LOG2E,),
                    tuple(consts.items()) + (("num_warps", 4),), tma=True)
    return Kernel(name, source, [launch], shared=kernel_text()), ""

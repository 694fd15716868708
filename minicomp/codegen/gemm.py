"""GEMM groups: one tiled `tl.dot` kernel with its prologue folded into the loads and its
epilogue applied before the single store.

The kernel iterates over (batch..., M, N, K). Each program owns one [BLOCK_M, BLOCK_N]
output tile of one batch entry (tiles ordered in bands of GROUP_M row blocks, so a band
reuses each column block of B from L2) and walks K in BLOCK_K steps, accumulating in
fp32.

What the kernel computes is the plan's (the group's `GemmSpec`); `gemm_form.py` folds its
operands to memory and picks the form and configs; this module writes the text.

Invariants and decisions:
- operands are read where they lie: views between a matmul and memory (transpose,
  permute, expand, slice, reshape) fold into the address; prologue casts are applied
  after the load (`epilogue.fold_operand`);
- batch dims that operand B does not depend on fold into M (a linear layer over
  [B, S, K] is one [B*S, K] GEMM); the others are decoded from the program id (`z0`...);
- a dual GEMM (matmuls sharing operand A: SwiGLU) loads A once per K step and keeps one
  accumulator per matmul;
- the epilogue is codegen's pointwise lowering with the accumulators as leaves; every
  group output has the matmul's shape, or its rows regrouped (`[B*S, N]` viewed as
  `[B, S, N]`: the same elements, plan/rules.py), and is stored once, masked;
- fp32 operands use the dot precision of the Target (`matmul_precision`: PyTorch's TF32
  switches, read when the record is made; the compile cache keys on them, api._modes);
  under the CPU interpreter half operands are widened to fp32 before the dot;
- shapes and strides are baked in; M, N, K are constexpr and the autotune key (Triton
  adds the pointer dtypes to it). Over symbolic sizes (codegen/sizes.py) a symbolic M, N or
  K is a runtime argument (K's tail is masked at run time, `K % BLOCK_K`), the size symbols
  that strides use are parameters too, and the autotune key holds the size's power of two
  (`m_bucket = _rt.next_pow2(M)`, computed in call()) instead of the size, so every
  length of a bucket shares the config tuned for the first; configs are not cut by a
  symbolic size. Offsets are int64 when the top of the symbols' ranges needs it.
- K tails: when some config's BLOCK_K does not divide K (or K is symbolic), the pointer form's
  loop runs over the full K blocks with unmasked loads and one masked step follows for the
  tail (`if K % BLOCK_K != 0`, constexpr for a concrete K); an aligned K keeps the single loop
  whose constexpr test picks the unmasked loads (the text is unchanged for it).

Index symbols: `am`/`ak` (A tile rows/cols), `bk`/`bn` (B tile), `rm`/`rn` (output tile),
`z0`, `z1`... (batch coordinates).

Two forms of the kernel:
- pointer loads, one output tile per program: any layout, batch dims, int64 offsets, fp32;
- on CUDA, when every operand is a plain fp16/bf16 matrix: TMA descriptor loads in a
  persistent kernel (`gemm_tma.py`).

Unsupported (the group falls back to PyTorch): see `gemm_form.py`.
"""

from __future__ import annotations

import math

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, few_configs, kernel_name
from minicomp.codegen.epilogue import TileLowering, split_offset
from minicomp.codegen.gemm_configs import CPU_PROGRAMS, GROUP_M, big_from, configs, programs_per_sm
from minicomp.codegen.gemm_form import (GemmForm, analyse, needs_int64, odd_store, pad_functions, pad_text, reads_tile,
                                        tma_form)
from minicomp.codegen.gemm_tile import (LOCALS, operand_names, write_configs, write_dots, write_epilogue,
                                        write_tile_coords)
from minicomp.codegen.gemm_tma import write_tma_body
from minicomp.codegen.sizes import bucket, jit_line, size_args, size_params, tune_tail
from minicomp.ir import dims

# --------------------------------------------------------------------------- emission


def _write_program_ids(body: CodeBuilder, spec: GemmForm, w: str) -> None:
    body.writeline("pid = tl.program_id(0)")
    body.writeline("num_pid_m = tl.cdiv(M, BLOCK_M)")
    body.writeline("num_pid_n = tl.cdiv(N, BLOCK_N)")
    if spec.batch:
        body.writeline("pid_batch = pid // (num_pid_m * num_pid_n)")
        body.writeline("pid = pid % (num_pid_m * num_pid_n)")
        for i, size in enumerate(spec.batch):
            below = math.prod(spec.batch[i + 1:])
            text = "pid_batch" + (f" // {ix.size_text(below)}" if below != 1 else "") + (
                f" % {ix.size_text(size)}" if i else "")
            body.writeline(f"z{i} = ({text}){w}")
    write_tile_coords(body, "pid", w)
    body.writeline(f"offs_k = tl.arange(0, BLOCK_K){w}")


def _write_main_loop(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering,
                     k_tail: bool) -> list[str]:
    """The K loop; returns the accumulator names (one per matmul). `k_tail`: some config's
    BLOCK_K does not divide K (or K is symbolic): the loop runs over the full blocks unmasked
    and a masked step follows for the tail, instead of masking every step."""
    body.writeline("# operand rows/columns past the edge wrap around instead of being masked: never stored")
    body.writeline("offs_am = offs_m")
    with body.block("if M % BLOCK_M != 0:"):
        body.writeline("offs_am = offs_m % M")
    body.writeline("offs_bn = offs_n")
    with body.block("if N % BLOCK_N != 0:"):
        body.writeline("offs_bn = offs_n % N")
    body.writeline("am = offs_am[:, None]")
    body.writeline("bn = offs_bn[None, :]")
    a_out, a_in = split_offset(spec.a.offset, {"ak"})
    body.writeline(f"a_rows = {low.pointer(spec.a.leaf)} + {low.offset_text(a_out, ('am',))}")
    tiles, accs = operand_names(spec)
    b_parts = []
    for tile, b in zip(tiles, spec.bs):
        out, inner = split_offset(b.offset, {"bk"})
        low.names.fresh(f"{tile}_cols")
        low.names.fresh(f"{tile}_ptrs")
        body.writeline(f"{tile}_cols = {low.pointer(b.leaf)} + {low.offset_text(out, ('bn',))}")
        b_parts.append(inner)
    for acc in accs:
        body.writeline(f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
    if not k_tail:
        with body.block("for k0 in range(0, K, BLOCK_K):"), low.scope():
            _write_k_step(ctx, spec, body, low, a_in, b_parts, None)
        return accs
    body.writeline("# full K blocks unmasked; only the last, partial block (when K % BLOCK_K != 0) is masked")
    with body.block("for k0 in range(0, K - K % BLOCK_K, BLOCK_K):"), low.scope():
        _write_k_step(ctx, spec, body, low, a_in, b_parts, False)
    with body.block("if K % BLOCK_K != 0:"), low.scope():
        body.writeline("k0 = K - K % BLOCK_K")
        _write_k_step(ctx, spec, body, low, a_in, b_parts, True)
    return accs


def _write_k_step(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering, a_in: ix.Expr,
                  b_parts: list[ix.Expr], masked: bool | None) -> None:
    """One K block: the operand tiles' loads (masked along K when `masked`; None: the loop of
    an aligned K, which picks at compile time) and the dots."""
    tiles, accs = operand_names(spec)
    body.writeline("offs_kk = k0 + offs_k")
    body.writeline("ak = offs_kk[None, :]")
    body.writeline("bk = offs_kk[:, None]")
    body.writeline(f"a_ptrs = a_rows + {low.offset_text(a_in, ('ak',))}")
    for tile, inner in zip(tiles, b_parts):
        body.writeline(f"{tile}_ptrs = {tile}_cols + {low.offset_text(inner, ('bk',))}")
    if masked is None:
        with body.block("if K % BLOCK_K == 0:"):
            _write_loads(body, tiles, False)
        with body.block("else:"):
            _write_loads(body, tiles, True)
    else:
        _write_loads(body, tiles, masked)
    write_dots(ctx, spec, body, tiles, accs)


def _write_loads(body: CodeBuilder, tiles: list[str], masked: bool) -> None:
    if masked:
        body.writeline("a = tl.load(a_ptrs, mask=ak < K, other=0.0)")
        for tile in tiles:
            body.writeline(f"{tile} = tl.load({tile}_ptrs, mask=bk < K, other=0.0)")
    else:
        body.writeline("a = tl.load(a_ptrs)")
        for tile in tiles:
            body.writeline(f"{tile} = tl.load({tile}_ptrs)")


def _write_body(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering, wide: bool,
                k_tail: bool) -> None:
    _write_program_ids(body, spec, ".to(tl.int64)" if wide else "")
    accs = _write_main_loop(ctx, spec, body, low, k_tail)
    write_epilogue(ctx, spec, body, low, accs)


def emit(ctx: KernelCtx) -> Kernel:
    spec = analyse(ctx)
    name = kernel_name(ctx, "gemm")
    tma = tma_form(ctx, spec)
    cfgs = few_configs(ctx, configs(spec, ctx.device_type, tma is not None, ctx.target.matmul_precision,
                                    odd_store(ctx) or reads_tile(ctx, spec)),
                       lambda c: -(-spec.m // c[0]) * -(-spec.n // c[1]) * math.prod(spec.batch), short_too=True)
    body = CodeBuilder()
    masks = {"rm": "mask_m[:, None]", "rn": "mask_n[None, :]"}
    low = TileLowering(ctx, body, masks, reserved=LOCALS + tuple(f"z{i}" for i in range(len(spec.batch))))
    if tma:
        write_tma_body(ctx, spec, body, low, *tma, wide=needs_int64(ctx))
    else:
        k_tail = dims.is_symbolic(spec.k) or any(spec.k % c[2] for c in cfgs)
        _write_body(ctx, spec, body, low, needs_int64(ctx), k_tail)

    g = ctx.graph
    nbatch = math.prod(spec.batch)
    cuda = ctx.device_type == "cuda"
    sizes = (("M", spec.m), ("N", spec.n), ("K", spec.k))
    # over symbolic sizes a size is a runtime argument, and the autotuner keys on its power-of-two
    # bucket instead (`m_bucket`...): a new length in a tuned bucket reuses that bucket's config
    buckets = tuple((f"{d.lower()}_bucket", bucket(v))
                    for d, v in sizes if dims.is_symbolic(v))
    tuned = cuda and len(cfgs) > 1
    # some config launches more than one persistent program per SM: a config key says how many
    share = cuda and tuned and any(programs_per_sm(spec, bool(tma), c) > 1 for c in cfgs)
    src = CodeBuilder()
    if tuned:       # one config is no choice: the launch passes it (`fixed` below)
        write_configs(src, name, cfgs, (lambda c: programs_per_sm(spec, bool(tma), c)) if share else None)
        key = ", ".join(f"\"{f'{d.lower()}_bucket' if dims.is_symbolic(v) else d}\"" for d, v in sizes)
        fit = {f"BLOCK_{b.split('_')[0].upper()}": (b, 32) for b, _ in buckets}     # m_bucket -> BLOCK_M
        src.writeline(f"@triton.autotune(configs={name}_configs, key=[{key}], {tune_tail(fit, big_from(spec))})")
    pointers = list(low.pointers.values())
    touched = list(ctx.group.nodes) + list(ctx.group.inputs)
    params = ([p.name for p in pointers] + size_params(g, touched)
              + [d if dims.is_symbolic(v) else f"{d}: tl.constexpr" for d, v in sizes]
              + ([b for b, _ in buckets] if tuned else [])
              + [f"{d}: tl.constexpr" for d in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
              + (["SM_SHARE: tl.constexpr"] if share else []))
    src.writeline(jit_line(g, touched, params, free=("M",)))
    with src.block(f"def {name}({', '.join(params)}):"):
        a = g.node(spec.a.leaf)
        reads = ", ".join(g.node(p.nid).type for p in pointers if p.nid not in ctx.group.outputs)
        writes = ", ".join(g.node(o).type for o in ctx.group.outputs)
        src.writeline(f"# {len(spec.mms)} matmul(s) [{spec.m}, {spec.k}] @ [{spec.k}, {spec.n}]"
                      f"{f' x {nbatch} batches' if spec.batch else ''}; A from %{a.id} {a.type}")
        src.writeline(f"# reads {reads}; writes {writes}")
        src.splice(body.getvalue())

    tma_leaves = {spec.a.leaf} | {b.leaf for b in spec.bs} if tma else set()
    pads = pad_functions(name, spec, tma)
    for (last, padded), fn in sorted(set(pads.values()), key=lambda p: p[1]):
        src.writeline("")
        src.writeline("")
        src.splice(pad_text(fn, last, padded))
    args = tuple(Buf(p.nid, align16=p.nid in tma_leaves and p.nid not in pads,
                     wrap=pads[p.nid][1] if p.nid in pads else "") for p in pointers) + size_args(g, touched)
    bm, bn, bk, stages, warps = cfgs[0]
    blocks = (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("GROUP_M", GROUP_M))
    if tuned:
        sizes += buckets
    if cuda:
        fixed = blocks + (("num_stages", stages), ("num_warps", warps)) if len(cfgs) == 1 else ()
        tiles = (Blocks(spec.m, "BLOCK_M"), Blocks(spec.n, "BLOCK_N"))
        if tma:
            launch = Launch(Grid.of(tiles, persistent=True, share="SM_SHARE" if share else ""), args,
                            sizes + fixed, tma=True)
            return Kernel(name, src.getvalue(), [launch])
        grid = Grid.of(tiles + ((nbatch,) if nbatch != 1 else ()))
        return Kernel(name, src.getvalue(), [Launch(grid, args, sizes + fixed)])
    if dims.any_symbolic((spec.m, spec.n, nbatch)):
        # the tile count is computed in call() from the sizes (the launch passes the blocks)
        grid = Grid.of((Blocks(spec.m, "BLOCK_M"), Blocks(spec.n, "BLOCK_N")) + ((nbatch,) if nbatch != 1 else ()))
        if tma:
            grid = Grid.of(CPU_PROGRAMS)      # persistent: each program walks tiles until num_tiles
        return Kernel(name, src.getvalue(), [Launch(grid, args, sizes + blocks, tma=bool(tma))])
    tiles = -(-spec.m // bm) * -(-spec.n // bn)
    if tma:
        return Kernel(name, src.getvalue(), [Launch(Grid.of(min(CPU_PROGRAMS, tiles)), args, sizes + blocks, tma=True)])
    return Kernel(name, src.getvalue(), [Launch(Grid.of(tiles * nbatch), args, sizes + blocks)])


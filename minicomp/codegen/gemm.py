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
- on CUDA, when every operand is a plain fp16/bf16 matrix (row- or column-major, leading
  stride a multiple of 16 bytes, no batch dims left, no cast): TMA descriptor loads
  (`tl.make_tensor_descriptor`; tiles past the edge read as zeros, so no operand masks) in
  a persistent kernel, one program per SM walking the output tiles. On the H200
  (`benchmarks/ablations/run.py`, bf16, bias epilogue) this took nn.Linear-layout weights at
  8192x2048 -> 6144 from 0.366 ms to 0.298 ms (cuBLAS 0.271) and 4096^3 from 0.235 to
  0.198 ms; for [K, N] weights it is on par with the pointer form (0.294 vs 0.320 ms).
  TMA needs 16-byte aligned bases, so `call()` passes an aligned copy of an operand that
  is not (`_align16`), and a scratch allocator for the descriptors (`_tma_ready`).
  Over symbolic sizes the descriptors take runtime shapes (M = B*S rows); the form is kept
  only where the strides it checks for alignment are concrete (`gemm_form._tma_operand`),
  and its epilogue offsets are int64 where the symbols' ranges ask for it.
  An operand whose rows are not 16-byte aligned (K = 4095) is read from a per-call copy with
  padded rows (`{kernel}_pad{i}` in the kernel's source, applied in call() through
  `Buf.wrap`), when the GEMM reuses it enough (`gemm_form.PAD_MIN_REUSE`); the descriptor's
  shape stops at the real length, so the padding is never read. A config may launch more
  than one persistent program per SM (`SM_SHARE`, `gemm_form.programs_per_sm`).
  The persistent kernel's epilogue has two forms (`Target.gemm_epilogue`, $MINICOMP_GEMM_EPILOGUE):
  "plain", after each tile's K loop, so the tensor cores wait while it loads and stores;
  "overlap", the tile loop written `tl.range(..., flatten=True)`, so Triton's software
  pipeliner flattens it with the K loop and issues the next tile's first loads before this
  tile's epilogue, which finds its tile from a counter of its own (`tile_c`), not from the
  coordinates the next tile's loads use. "auto" takes "overlap" unless the epilogue loads a
  tile of the output's size (`gemm_form.reads_tile`). On the H100 (results/2026-12-06/
  session19-epilogue-forms-*) "overlap" took GPT-2's lm_head from 360 to 336 us a call and the
  bias-GELU GEMMs of GPT-2 and BERT from 169 to 152 and 360 to 338, and made the
  tile-loading epilogues slower (SwiGLU's 364 -> 489, Llama's o_proj with its residual 130 ->
  169). Two more forms measured then and removed: the epilogue over half tiles (`tl.split` of
  the accumulator; o_proj 130 -> 323) and `tl.range(..., warp_specialize=True)` (within 1% of
  "plain" everywhere).

Unsupported (the group falls back to PyTorch): see `gemm_form.py`.
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, KernelCtx, Launch, few_configs, kernel_name
from minicomp.codegen.epilogue import TileLowering, cast_operand, dot_precision, split_offset
from minicomp.codegen.gemm_form import (CPU_PROGRAMS, GROUP_M, GemmForm, TmaOperand, analyse, big_from, configs, needs_int64,
                                        odd_store, pad_functions, pad_text, programs_per_sm, reads_tile,
                                        tma_form)
from minicomp.codegen.sizes import bucket, jit_line, size_args, size_params, tune_tail
from minicomp.codegen.tlexpr import Val
from minicomp.ir import dims

LOCALS = ("a", "b", "b0", "b1", "acc", "acc0", "acc1", "am", "ak", "bk", "bn", "rm", "rn",
          "offs_m", "offs_n", "offs_k", "offs_am", "offs_bn", "offs_kk", "mask_m", "mask_n", "k0",
          "a_rows", "a_ptrs", "num_pid_m", "num_pid_n", "pid_m", "pid_n", "pid_batch", "first_pid_m",
          "group_size_m", "M", "N", "K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "min", "range", "float",
          "a_desc", "b_desc", "b0_desc", "b1_desc", "tile", "num_tiles", "tile_c")


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
    _write_tile_coords(body, "pid", w)
    body.writeline(f"offs_k = tl.arange(0, BLOCK_K){w}")


def _write_tile_coords(body: CodeBuilder, tile: str, w: str = "") -> None:
    """pid_m, pid_n and the output tile's offs_m, offs_n of output tile number `tile`."""
    body.writeline("# bands of GROUP_M row blocks: a band reuses each column block of B from L2")
    body.writeline(f"first_pid_m = ({tile} // (GROUP_M * num_pid_n)) * GROUP_M")
    body.writeline("group_size_m = min(num_pid_m - first_pid_m, GROUP_M)")
    body.writeline(f"pid_m = first_pid_m + ({tile} % (GROUP_M * num_pid_n)) % group_size_m")
    body.writeline(f"pid_n = ({tile} % (GROUP_M * num_pid_n)) // group_size_m")
    body.writeline(f"offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){w}")
    body.writeline(f"offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){w}")


def _operand_names(spec: GemmForm) -> tuple[list[str], list[str]]:
    """The B tiles' and accumulators' names: `b`, `acc`, or numbered for a dual GEMM."""
    dual = len(spec.bs) > 1
    return ([f"b{i}" if dual else "b" for i in range(len(spec.bs))],
            [f"acc{i}" if dual else "acc" for i in range(len(spec.bs))])


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
    tiles, accs = _operand_names(spec)
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
    tiles, accs = _operand_names(spec)
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
    _write_dots(ctx, spec, body, tiles, accs)


def _write_loads(body: CodeBuilder, tiles: list[str], masked: bool) -> None:
    if masked:
        body.writeline("a = tl.load(a_ptrs, mask=ak < K, other=0.0)")
        for tile in tiles:
            body.writeline(f"{tile} = tl.load({tile}_ptrs, mask=bk < K, other=0.0)")
    else:
        body.writeline("a = tl.load(a_ptrs)")
        for tile in tiles:
            body.writeline(f"{tile} = tl.load({tile}_ptrs)")


def _write_dots(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, tiles: list[str], accs: list[str]) -> None:
    """The loaded tiles' casts, then one `tl.dot` per matmul into its accumulator."""
    for var, op in [("a", spec.a)] + list(zip(tiles, spec.bs)):
        text = cast_operand(var, op, ctx.device_type)
        if text:
            body.writeline(f"{var} = {text}")
    precision = dot_precision(spec.a.dtype if ctx.device_type == "cuda" else torch.float32,
                              ctx.target.matmul_precision)
    for acc, tile in zip(accs, tiles):
        body.writeline(f"{acc} = tl.dot(a, {tile}, {acc}{precision})")


def _write_body(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering, wide: bool,
                k_tail: bool) -> None:
    _write_program_ids(body, spec, ".to(tl.int64)" if wide else "")
    accs = _write_main_loop(ctx, spec, body, low, k_tail)
    _write_epilogue(ctx, spec, body, low, accs)


def _write_descriptor(body: CodeBuilder, name: str, ptr: str, op: TmaOperand, dims: tuple[str, str]) -> None:
    """`{name}_desc` over an operand read as a [dims[0], dims[1]] matrix (stored [dims[1], dims[0]]
    when `op.transposed`, as nn.Linear's weight is for B)."""
    rows, cols = dims[::-1] if op.transposed else dims
    note = f"  # [{rows}, {cols}]: read transposed" if op.transposed else ""
    body.writeline(f"{name}_desc = tl.make_tensor_descriptor({ptr}, shape=[{rows}, {cols}], "
                   f"strides=[{op.ld}, 1], block_shape=[BLOCK_{rows}, BLOCK_{cols}]){note}")


def _descriptor_load(name: str, op: TmaOperand, row0: str, col0: str) -> str:
    """The load of one [row, col] tile through `{name}_desc` (starting at row0, col0 of the matrix read)."""
    return f"{name}_desc.load([{col0}, {row0}]).T" if op.transposed else f"{name}_desc.load([{row0}, {col0}])"


def _write_tma_body(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering,
                    a_tma: TmaOperand, b_tmas: list[TmaOperand], wide: bool = False) -> None:
    """The persistent kernel with TMA descriptor loads (the module docstring's second form)."""
    tiles, accs = _operand_names(spec)
    body.writeline("# TMA descriptors: operand tiles are copied to shared memory by the tensor memory")
    body.writeline("# accelerator; rows and columns past the edge read as zeros, so no operand masks")
    _write_descriptor(body, "a", low.pointer(spec.a.leaf), a_tma, ("M", "K"))
    for tile, b, bt in zip(tiles, spec.bs, b_tmas):
        _write_descriptor(body, tile, low.pointer(b.leaf), bt, ("K", "N"))
    body.writeline("num_pid_m = tl.cdiv(M, BLOCK_M)")
    body.writeline("num_pid_n = tl.cdiv(N, BLOCK_N)")
    body.writeline("num_tiles = num_pid_m * num_pid_n")
    body.writeline("# persistent: the grid holds at most one program per SM, each walking output tiles")
    w = ".to(tl.int64)" if wide else ""
    mode = ctx.target.gemm_epilogue
    if mode == "auto":
        mode = "plain" if reads_tile(ctx, spec) else "overlap"
    if mode == "plain":
        loop = "for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):"
    else:
        body.writeline("# the tile loop and the K loop are flattened into one software-pipelined loop, so the next")
        body.writeline("# tile's first loads are in flight while this tile's epilogue runs; the epilogue finds its")
        body.writeline("# tile from a counter of its own (tile_c) instead of waiting on the next tile's coordinates")
        body.writeline("tile_c = tl.program_id(0) - tl.num_programs(0)")
        loop = "for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):"
    with body.block(loop):
        _write_tile_coords(body, "tile", w)
        for acc in accs:
            body.writeline(f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        with body.block("for k0 in range(0, K, BLOCK_K):"):
            body.writeline(f"a = {_descriptor_load('a', a_tma, 'pid_m * BLOCK_M', 'k0')}")
            for tile, bt in zip(tiles, b_tmas):
                body.writeline(f"{tile} = {_descriptor_load(tile, bt, 'k0', 'pid_n * BLOCK_N')}")
            _write_dots(ctx, spec, body, tiles, accs)
        if mode == "overlap":
            body.writeline("tile_c += tl.num_programs(0)")
            _write_tile_coords(body, "tile_c", w)
        _write_epilogue(ctx, spec, body, low, accs)


def _write_epilogue(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering, accs: list[str]) -> None:
    body.writeline("# epilogue on the fp32 accumulator(s), then one masked store per output")
    body.writeline("rm = offs_m[:, None]")
    body.writeline("rn = offs_n[None, :]")
    body.writeline("mask_m = offs_m < M")
    body.writeline("mask_n = offs_n < N")
    for mm, acc in zip(spec.mms, accs):
        low.leaves[mm] = (spec.out_idx, Val(acc, ctx.graph.node(mm).dtype, frozenset({"rm", "rn"})))
    for out in ctx.group.outputs:
        low.store(out, _output_index(ctx, spec.out_idx, out), ("rm", "rn"), "mask_m[:, None] & mask_n[None, :]")


def _output_index(ctx: KernelCtx, out_idx: ix.Index, nid: int) -> ix.Index:
    """Where the tile's element lands in output `nid`: the matmul's index, the same element of
    a reshape that regroups the rows, or the index in a reshape or permute of an epilogue value
    (stored at the view's own index, plan/rules.py)."""
    node = ctx.graph.node(nid)
    shape = tuple(node.shape)
    if node.op in ("permute", "reshape") and node.args[0] in ctx.group.nodes:
        return ix.stored_through(_output_index(ctx, out_idx, node.args[0]), node.op, node.attrs, shape)
    return out_idx if shape == tuple(out_idx.shape) else ix.reshape(out_idx, shape)


def write_configs(src: CodeBuilder, name: str, cfgs: list, share=None) -> None:
    """`{name}_configs`, the autotuner's table of (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps) GEMM
    configs; `share(cfg)`, where given, is each config's SM_SHARE (persistent programs per SM)."""
    with src.block(f"{name}_configs = ["):
        for cfg in cfgs:
            bm, bn, bk, stages, warps = cfg
            more = f", \"SM_SHARE\": {share(cfg)}" if share else ""
            src.writeline(f"triton.Config({{\"BLOCK_M\": {bm}, \"BLOCK_N\": {bn}, \"BLOCK_K\": {bk}, "
                          f"\"GROUP_M\": {GROUP_M}{more}}}, num_stages={stages}, num_warps={warps}),")
    src.writelines(["]", "", ""])


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
        _write_tma_body(ctx, spec, body, low, *tma, wide=needs_int64(ctx))
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


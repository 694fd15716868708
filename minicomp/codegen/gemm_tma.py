"""The GEMM's persistent TMA form (gemm.py writes the other, pointer loads, and picks between
them with `gemm_form.tma_form`).

On CUDA, when every operand is a plain fp16/bf16 matrix (row- or column-major, leading
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
than one persistent program per SM (`SM_SHARE`, `gemm_configs.programs_per_sm`).
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
"""

from __future__ import annotations

from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.epilogue import TileLowering
from minicomp.codegen.gemm_form import GemmForm, TmaOperand, reads_tile
from minicomp.codegen.gemm_tile import operand_names, write_dots, write_epilogue, write_tile_coords


def write_descriptor(body: CodeBuilder, name: str, ptr: str, op: TmaOperand, dims: tuple[str, str]) -> None:
    """`{name}_desc` over an operand read as a [dims[0], dims[1]] matrix (stored [dims[1], dims[0]]
    when `op.transposed`, as nn.Linear's weight is for B)."""
    rows, cols = dims[::-1] if op.transposed else dims
    note = f"  # [{rows}, {cols}]: read transposed" if op.transposed else ""
    body.writeline(f"{name}_desc = tl.make_tensor_descriptor({ptr}, shape=[{rows}, {cols}], "
                   f"strides=[{op.ld}, 1], block_shape=[BLOCK_{rows}, BLOCK_{cols}]){note}")


def descriptor_load(name: str, op: TmaOperand, row0: str, col0: str) -> str:
    """The load of one [row, col] tile through `{name}_desc` (starting at row0, col0 of the matrix read)."""
    return f"{name}_desc.load([{col0}, {row0}]).T" if op.transposed else f"{name}_desc.load([{row0}, {col0}])"


def write_tma_body(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering,
                    a_tma: TmaOperand, b_tmas: list[TmaOperand], wide: bool = False) -> None:
    """The persistent kernel with TMA descriptor loads (the module docstring's form)."""
    tiles, accs = operand_names(spec)
    body.writeline("# TMA descriptors: operand tiles are copied to shared memory by the tensor memory")
    body.writeline("# accelerator; rows and columns past the edge read as zeros, so no operand masks")
    write_descriptor(body, "a", low.pointer(spec.a.leaf), a_tma, ("M", "K"))
    for tile, b, bt in zip(tiles, spec.bs, b_tmas):
        write_descriptor(body, tile, low.pointer(b.leaf), bt, ("K", "N"))
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
        write_tile_coords(body, "tile", w)
        for acc in accs:
            body.writeline(f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        with body.block("for k0 in range(0, K, BLOCK_K):"):
            body.writeline(f"a = {descriptor_load('a', a_tma, 'pid_m * BLOCK_M', 'k0')}")
            for tile, bt in zip(tiles, b_tmas):
                body.writeline(f"{tile} = {descriptor_load(tile, bt, 'k0', 'pid_n * BLOCK_N')}")
            write_dots(ctx, spec, body, tiles, accs)
        if mode == "overlap":
            body.writeline("tile_c += tl.num_programs(0)")
            write_tile_coords(body, "tile_c", w)
        write_epilogue(ctx, spec, body, low, accs)

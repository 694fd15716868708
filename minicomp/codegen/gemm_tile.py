"""What both forms of the GEMM kernel (gemm.py's pointer loads, gemm_tma.py's persistent TMA
loads) write alike: the output tile's coordinates, the dots, the epilogue and its stores, and
the autotuner's table."""

from __future__ import annotations

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import KernelCtx
from minicomp.codegen.epilogue import TileLowering, cast_operand, dot_precision
from minicomp.codegen.gemm_configs import GROUP_M
from minicomp.codegen.gemm_form import GemmForm
from minicomp.codegen.tlexpr import Val

LOCALS = ("a", "b", "b0", "b1", "acc", "acc0", "acc1", "am", "ak", "bk", "bn", "rm", "rn",
          "offs_m", "offs_n", "offs_k", "offs_am", "offs_bn", "offs_kk", "mask_m", "mask_n", "k0",
          "a_rows", "a_ptrs", "num_pid_m", "num_pid_n", "pid_m", "pid_n", "pid_batch", "first_pid_m",
          "group_size_m", "M", "N", "K", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "min", "range", "float",
          "a_desc", "b_desc", "b0_desc", "b1_desc", "tile", "num_tiles", "tile_c")


def write_tile_coords(body: CodeBuilder, tile: str, w: str = "") -> None:
    """pid_m, pid_n and the output tile's offs_m, offs_n of output tile number `tile`."""
    body.writeline("# bands of GROUP_M row blocks: a band reuses each column block of B from L2")
    body.writeline(f"first_pid_m = ({tile} // (GROUP_M * num_pid_n)) * GROUP_M")
    body.writeline("group_size_m = min(num_pid_m - first_pid_m, GROUP_M)")
    body.writeline(f"pid_m = first_pid_m + ({tile} % (GROUP_M * num_pid_n)) % group_size_m")
    body.writeline(f"pid_n = ({tile} % (GROUP_M * num_pid_n)) // group_size_m")
    body.writeline(f"offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){w}")
    body.writeline(f"offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){w}")


def operand_names(spec: GemmForm) -> tuple[list[str], list[str]]:
    """The B tiles' and accumulators' names: `b`, `acc`, or numbered for a dual GEMM."""
    dual = len(spec.bs) > 1
    return ([f"b{i}" if dual else "b" for i in range(len(spec.bs))],
            [f"acc{i}" if dual else "acc" for i in range(len(spec.bs))])


def write_dots(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, tiles: list[str], accs: list[str]) -> None:
    """The loaded tiles' casts, then one `tl.dot` per matmul into its accumulator."""
    for var, op in [("a", spec.a)] + list(zip(tiles, spec.bs)):
        text = cast_operand(var, op, ctx.device_type)
        if text:
            body.writeline(f"{var} = {text}")
    precision = dot_precision(spec.a.dtype if ctx.device_type == "cuda" else torch.float32,
                              ctx.target.matmul_precision)
    for acc, tile in zip(accs, tiles):
        body.writeline(f"{acc} = tl.dot(a, {tile}, {acc}{precision})")


def write_epilogue(ctx: KernelCtx, spec: GemmForm, body: CodeBuilder, low: TileLowering, accs: list[str]) -> None:
    body.writeline("# epilogue on the fp32 accumulator(s), then one masked store per output")
    body.writeline("rm = offs_m[:, None]")
    body.writeline("rn = offs_n[None, :]")
    body.writeline("mask_m = offs_m < M")
    body.writeline("mask_n = offs_n < N")
    for mm, acc in zip(spec.mms, accs):
        low.leaves[mm] = (spec.out_idx, Val(acc, ctx.graph.node(mm).dtype, frozenset({"rm", "rn"})))
    for out in ctx.group.outputs:
        low.store(out, output_index(ctx, spec.out_idx, out), ("rm", "rn"), "mask_m[:, None] & mask_n[None, :]")


def output_index(ctx: KernelCtx, out_idx: ix.Index, nid: int) -> ix.Index:
    """Where the tile's element lands in output `nid`: the matmul's index, the same element of
    a reshape that regroups the rows, or the index in a reshape or permute of an epilogue value
    (stored at the view's own index, plan/rules.py)."""
    node = ctx.graph.node(nid)
    shape = tuple(node.shape)
    if node.op in ("permute", "reshape") and node.args[0] in ctx.group.nodes:
        return ix.stored_through(output_index(ctx, out_idx, node.args[0]), node.op, node.attrs, shape)
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

"""Which tiles a GEMM kernel's autotuner tries. `configs` picks the table by form (pointer
loads, TMA descriptors, a dual GEMM's two accumulators, few rows), dtype and fp32 precision (FMA
candidates for "ieee", tensor-core ones for TF32), cuts it to the tiles that fit the problem
(`gemm_form.GemmForm`) and to the largest few for a big problem (`BIG_TILES`), and adds
`ODD_STORE_CONFIG` where a big TMA GEMM's output rows are misaligned. A config is (BLOCK_M,
BLOCK_N, BLOCK_K, num_stages, num_warps); `gemm_tile.write_configs` writes it as a
`triton.Config`, and `common.few_configs` may cut the list again for a launch-bound group.
"""

from __future__ import annotations

import torch

from minicomp.codegen.common import next_pow2
from minicomp.codegen.gemm_form import GemmForm
from minicomp.ir import dims

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): Hopper-sized tiles first, then smaller
# ones for small problems; `configs` drops those larger than the problem.
HALF_CONFIGS = [
    (128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4),
    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (32, 64, 64, 4, 4),
]
FP32_CONFIGS = [   # TF32: tensor cores, 32 fp32 (128 bytes) along K
    (128, 128, 32, 3, 8), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (32, 32, 32, 4, 4),
]
# full-precision fp32 (`input_precision="ieee"`: FMA, no tensor cores): each thread's share of a
# larger output tile reuses each operand element it reads from shared memory more often, and a
# shorter K block leaves registers and shared memory for it. Candidates, not measured yet:
# 2048^3 ran at 0.89x cuBLAS with FP32_CONFIGS (ceilings.md); the autotuner picks. One entry more
# than FP32_CONFIGS: each is a compile on the first call
IEEE_CONFIGS = [
    (128, 128, 32, 3, 8), (128, 256, 16, 3, 8), (128, 128, 16, 4, 8), (64, 128, 32, 4, 4),
    (64, 64, 32, 4, 4), (32, 32, 32, 4, 4),
]
DUAL_CONFIGS = [  # two accumulators: smaller tiles per warp
    (128, 128, 64, 3, 8), (128, 64, 64, 4, 4), (64, 128, 64, 3, 4), (64, 64, 64, 4, 4), (32, 64, 64, 4, 4),
]
# the TMA form (persistent): the ablation's best three, then smaller tiles for small problems
TMA_CONFIGS = [
    (128, 256, 64, 3, 8), (128, 128, 64, 5, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4),
]
# Few rows (a static M of at most SKINNY_ROWS after folding: decode, batch 1 x 16): the GEMM
# streams B and reads A once, so its time is B's bytes over the bandwidth the programs keep in
# flight. Tiles of 16 rows waste no MMA rows on padding, narrow column blocks give N / BLOCK_N
# programs to spread B's read over the SMs, and long K blocks with several stages keep each
# SM's loads in flight. A candidate table, beside the smallest of the general one; the
# autotuner picks (not measured on a GPU when written: compare MINICOMP_LIBRARY_GEMM=0 at
# batch 1 x 16, where every GEMM is ours, against the default's cuBLAS calls)
SKINNY_ROWS = 64
SKINNY_MIN_KN = 256
SKINNY_CONFIGS = [
    (16, 32, 256, 4, 4), (16, 16, 256, 4, 4), (16, 64, 256, 3, 4), (16, 64, 128, 4, 4),
    (32, 32, 256, 4, 4), (64, 32, 128, 4, 4), (32, 64, 64, 4, 4),
]
SKINNY_DUAL_CONFIGS = [   # two B tiles a K step
    (16, 32, 256, 3, 4), (16, 16, 256, 4, 4), (16, 64, 128, 3, 4), (32, 32, 128, 4, 4), (32, 64, 64, 4, 4),
]
# 128x256 output tiles at least this many (two waves on 132 SMs): only the largest configs are tried
BIG_TILES = 264
CPU_PROGRAMS = 3        # the TMA form's persistent grid under the interpreter (a program walks several tiles)
GROUP_M = 8


def _cap(size, least: int) -> float:
    """The largest block worth trying along a dimension: its size rounded up to a power of two
    (at least `least`); a symbolic size caps nothing (the autotuner picks per size bucket)."""
    return float("inf") if dims.is_symbolic(size) else max(least, next_pow2(size))


# A big TMA GEMM with a long epilogue: output rows not 16-byte aligned (N = 50257: an lm_head),
# stored element by element, or a tile of the output's size read from memory (the residual of
# o_proj/down_proj, the gate cuBLAS wrote for SwiGLU's up projection, `library_plan.split_pairs`).
# A tile-loading epilogue runs after the K loop (flattening the loops made it slower: gemm.py's
# "auto" form), not overlapping the next tile's loads, and a 128x256 tile's fp32 accumulator (128
# registers a thread at 8 warps) leaves little room for a loaded tile beside it: on the H100
# our GEMM with SiLU(gate) * up in its epilogue took 89.6 us where cuBLAS's plain GEMM of the
# shape took 59 (results/2026-12-06/session18-*). This config's
# 96 KiB of shared memory lets two programs share an SM, and it launches two per SM
# (`programs_per_sm`), so one runs its epilogue while the other computes. A candidate beside
# the 128x256 one, which keeps one program per SM; the autotuner picks
ODD_STORE_CONFIG = (128, 128, 64, 3, 8)


def programs_per_sm(spec: "GemmForm", tma: bool, cfg: tuple) -> int:
    """How many persistent programs of config `cfg` the TMA form launches per SM."""
    return 2 if tma and len(spec.mms) == 1 and cfg == ODD_STORE_CONFIG else 1


def configs(spec: GemmForm, device_type: str, tma: bool = False, precision: str = "ieee",
            long_epilogue: bool = False) -> list[tuple[int, int, int, int, int]]:
    if device_type != "cuda":
        # interpreter: few, large programs; a symbolic size gets the largest block
        clamp = lambda v: min(_cap(v, 16), 64)  # noqa: E731
        return [(clamp(spec.m), clamp(spec.n), clamp(spec.k), 1, 4)]
    table = DUAL_CONFIGS if len(spec.mms) > 1 else (
        TMA_CONFIGS if tma else HALF_CONFIGS if spec.a.dtype != torch.float32 else
        IEEE_CONFIGS if precision == "ieee" else FP32_CONFIGS)
    if skinny(spec):
        table = SKINNY_DUAL_CONFIGS if len(spec.mms) > 1 else SKINNY_CONFIGS
    fit = [c for c in table if c[0] <= _cap(spec.m, 32) and c[1] <= _cap(spec.n, 32) and c[2] <= _cap(spec.k, 32)]
    if dims.any_symbolic((spec.m, spec.n, spec.k)):
        # every size: the table's first three (what a big problem keeps, `big_from` times only
        # those) and its two smallest for small buckets; each config is a compile on the first call
        small = [c for c in fit[3:] if c[0] * c[1] <= 64 * 128][-2:]
        return (fit[:3] + small) or [min(table, key=lambda c: c[0] * c[1])]
    if -(-spec.m // 128) * -(-spec.n // 256) >= BIG_TILES:
        # a big problem: small tiles never win, and each config autotuned costs a compile of
        # seconds on the first call (a block's first call took 26-34 s, mostly that). The TMA
        # form's 128x256 config won all four cases of the ablation (two shapes x two weight
        # layouts, by 5-10%), so it alone is compiled; two or three configs otherwise
        fit = fit[:1] if tma and len(spec.mms) == 1 else fit[:2] if len(spec.mms) > 1 else fit[:3]
    if tma and len(spec.mms) == 1 and long_epilogue and fit and ODD_STORE_CONFIG[0] <= _cap(spec.m, 32) \
            and ODD_STORE_CONFIG[1] <= _cap(spec.n, 32):
        fit = fit + [ODD_STORE_CONFIG]
    return fit or [min(table, key=lambda c: c[0] * c[1])]


def skinny(spec: GemmForm) -> bool:
    """A GEMM of few rows (a static M of at most SKINNY_ROWS) over fp16/bf16 operands whose B
    is worth streaming (static K and N of at least SKINNY_MIN_KN): it takes SKINNY_CONFIGS."""
    sizes = (spec.m, spec.k, spec.n)
    return (not dims.any_symbolic(sizes) and spec.m <= SKINNY_ROWS and min(spec.k, spec.n) >= SKINNY_MIN_KN
            and spec.a.dtype in (torch.float16, torch.bfloat16))


def big_from(spec: GemmForm) -> tuple[int, dict[str, int]] | None:
    """Over a symbolic M with N concrete: from which M bucket on the problem is big (128x256
    tiles at least BIG_TILES), so a sweep times only the table's first three configs as a
    static kernel's does; None otherwise (`sizes.tune_tail`'s `top`)."""
    if not dims.is_symbolic(spec.m) or dims.any_symbolic((spec.n, spec.k)):
        return None
    rows = -(-BIG_TILES // -(-spec.n // 256))
    return 3, {"m_bucket": next_pow2(rows * 128)}

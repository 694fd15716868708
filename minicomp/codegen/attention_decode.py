"""Decode attention: few queries against a long KV cache, split over the keys (flash-decoding).

The prefill kernel (attention.py) runs one program per (query block, batch x head): with one
query per head its 64-row tile holds one real row, and each query head of a grouped-KV model
reads its KV head's cache again. Here, one program per (KV chunk, batch x KV head) holds every
query of every query head of its group as the rows of one tile (R = G x Sq rows, G query heads
per KV head, row r = head r // Sq, query r % Sq; padded to 16 for `tl.dot`), so K and V are
read from memory once per group, and the key axis is split into NCH chunks so that enough
programs stream the cache at once. Two launches:

1. `<name>`: each program streams its chunk's keys in BLOCK_N blocks with the online softmax of
   attention_body.py (same score units: base 2 without a mask tensor, natural units with one,
   for the reason its docstring gives) and writes the chunk's partial (row max m, row sum l,
   unnormalised accumulator acc) to fp32 scratch;
2. `<name>_combine`: one program per batch x KV head rescales the chunks' partials to their
   common max (M = max_c m_c; out = sum_c 2^(m_c - M) acc_c / sum_c 2^(m_c - M) l_c), applies
   the fused epilogue and stores.

With one chunk (NCH = 1: the batch x KV heads fill the GPU alone, or the cache is short) the
first launch is the only one: it finishes the softmax, applies the epilogue and stores, with
no scratch.

Invariants and decisions:
- the chunk count NCH is fixed when the kernel is written (the grid and the scratch sizes are
  numbers, `chunks`): on CUDA one wave of at most two programs per SM (`PROGRAMS`), each over
  one long chunk, never chunks shorter than `MIN_CHUNK` keys of a concrete length; over a
  symbolic key length (the growing cache of a decode loop) the kernel computes each chunk's
  bounds from SK at run time, so a short cache leaves some chunks empty (m = -inf, l = 0:
  they weigh 0 in the combine);
- one scratch buffer holds every partial (the accumulators, then the (max, sum) pairs): one
  allocation per call;
- a chunk with no visible key for a row keeps m = -inf (`m_safe` keeps 2^(-inf - -inf) out);
  rows with no visible key at all give 0 or NaN as `empty_rows` says, as the prefill kernel;
- causal masking is PyTorch's `is_causal` (top-left: key j visible to query i iff j <= i, even
  when Sq < Sk), so with causal only the keys below Sq are visited;
- the mask tensor (bool keeps True, float added) is loaded per block through its strides,
  broadcast over batch, heads and queries, indexed by each row's (head, query);
- soft-capping (Gemma2) is applied before the mask, as in the prefill kernel;
- taken (`why_not` is None) for a concrete Sq <= `MAX_QUERIES`, at most `MAX_ROWS` rows per
  group, and a key length >= `MIN_KEYS` or symbolic; anything else (a sliding window, symbolic
  batch or head dims) is the prefill kernel's.

Index symbols: `qg`/`qi` (each row's query head in the group and its query, [R, 1]), `qd`
(query tile columns), `kd`/`kn` (K tile, transposed), `vn`/`vd` (V tile), `rn` (score tile
columns), `od` (output columns), `z0`, ... (leading batch dims) and `zk` (the KV head).
"""

from __future__ import annotations

import math

import torch

from minicomp.codegen.attention_decode_body import PartialWriter, combine_body
from minicomp.codegen.builder import CodeBuilder
from minicomp.codegen.common import Buf, Grid, Kernel, KernelCtx, Launch, Scratch, kernel_name
from minicomp.codegen.gemm_form import needs_int64
from minicomp.codegen.sizes import bucket, jit_line, size_args, size_params, tune_tail
from minicomp.ir import dims

MAX_QUERIES = 16      # query lengths that count as decoding (a prefill of 17+ rows has rows to fill a tile)
MAX_ROWS = 128        # G x Sq rows in one tile
MIN_KEYS = 128        # shorter caches: the prefill kernel's one launch beats two
SMS = 132             # the H200's SMs
PROGRAMS = 2 * SMS    # one wave of programs: two per SM (every config fits two: `configs`)
MIN_CHUNK = 256       # keys per chunk at least (a concrete length): each program amortises its setup
ALIGN = 128           # chunks are a multiple of this many keys: of every config's BLOCK_N
# under the interpreter: at most a few chunks (the combine is exercised, no more work), one where
# more than CPU_PROGRAMS / 2 batch x KV heads would share them (the one-launch form is exercised)
CPU_PROGRAMS, CPU_CHUNKS, CPU_ALIGN = 24, 3, 32


def why_not(spec) -> str | None:
    """None when the decode kernel computes this attention; else why the prefill kernel does."""
    if dims.any_symbolic((spec.sq, spec.d, spec.dv)) or dims.any_symbolic(tuple(spec.batch)):
        return "symbolic query length, head dim or batch"
    if spec.sq > MAX_QUERIES:
        return f"{spec.sq} queries (decode: at most {MAX_QUERIES})"
    if not spec.batch:
        return "no head axis"
    if not dims.is_symbolic(spec.sk) and spec.sk < max(MIN_KEYS, spec.sq + 1):
        return f"{spec.sk} keys (decode: at least {MIN_KEYS})"
    if spec.window:
        return "a sliding window"
    if spec.groups * spec.sq > MAX_ROWS:
        return f"{spec.groups} x {spec.sq} rows per KV head (at most {MAX_ROWS})"
    if math.prod(spec.batch) // spec.groups > 65535:
        return "more than 65535 batch x KV heads"
    return None


def chunks(spec, kv_programs: int, cuda: bool) -> tuple[int, int | None, int]:
    """(NCH, the chunk length or None, the alignment): how the key axis is split.

    One wave: NCH x `kv_programs` programs, at most PROGRAMS (two per SM), each streaming one
    long chunk. The kernel is memory-bound and two programs per SM keep enough loads in flight
    (each has BLOCK_N x (D + Dv) x 2 bytes per stage ahead), so more, shorter chunks only add
    what every program pays once (the query load, the pipeline's fill, the partials' stores)
    and a last, partly filled wave. Where the batch x KV heads alone fill the wave (or the
    cache is shorter than two MIN_CHUNKs) NCH is 1: one launch, no partials, no combine.
    A concrete length gets chunks of one length (a multiple of the alignment, the last one
    ragged), as many as cover it; a symbolic one the count, whose length the kernel computes
    from SK (`None`)."""
    align = ALIGN if cuda else CPU_ALIGN
    programs, most = (PROGRAMS, PROGRAMS) if cuda else (CPU_PROGRAMS, CPU_CHUNKS)
    want = max(1, min(most, programs // kv_programs))
    if dims.is_symbolic(spec.sk):
        return want, None, align
    if cuda:
        want = max(1, min(want, spec.sk // MIN_CHUNK))
    chunk = -(-(-(-spec.sk // want)) // align) * align
    return -(-spec.sk // chunk), chunk, align


def configs(spec, cuda: bool) -> list[tuple[int, int, int]]:
    """(BLOCK_N, num_stages, num_warps) to try. The kernel is memory-bound: K and V blocks in
    flight (num_stages - 1 of each, through 16-byte cp.async into shared memory), in at most
    113 KiB of shared memory, so that two programs fit an SM (`PROGRAMS`). For sm_90 at head
    dim 128 in bf16 the three take 70, 72 and 102 KiB (Triton 3.9's compile); (128, 3, 4),
    136 KiB, would leave one program per SM."""
    if not cuda:
        return [(32, 1, 4)]
    if max(spec.d, spec.dv) > 128:
        return [(32, 3, 4), (64, 2, 4)]
    return [(64, 3, 4), (128, 2, 4), (64, 4, 4)]


def emit(ctx: KernelCtx, spec) -> Kernel:
    name = kernel_name(ctx, "attn_decode")
    g = ctx.graph
    cuda = ctx.device_type == "cuda"
    kv_batch = tuple(spec.batch[:-1]) + (spec.batch[-1] // spec.groups,)
    nkv = math.prod(kv_batch)
    rows = spec.groups * spec.sq
    nch, chunk, align = chunks(spec, nkv, cuda)
    cfgs = configs(spec, cuda)
    assert all(align % bn == 0 for bn, _, _ in cfgs)
    wide = needs_int64(ctx)

    part_body = CodeBuilder()
    part = PartialWriter(ctx, spec, kv_batch, (nch, chunk, align), part_body)
    part.write(wide)
    if not part.direct:
        comb_body = CodeBuilder()
        comb_low = combine_body(ctx, spec, part, comb_body, wide)
        scratch = Scratch(f"{name}_part", nkv * nch * rows * (spec.dv + 2), torch.float32)   # part.ml_offset

    touched = list(ctx.group.nodes) + list(ctx.group.inputs)
    sk_sym = dims.is_symbolic(spec.sk)
    sk_param = "SK" if sk_sym else "SK: tl.constexpr"
    tuned = cuda and len(cfgs) > 1
    buckets = (("sk_bucket", bucket(spec.sk)),) if tuned and sk_sym else ()

    src = CodeBuilder()
    what = ("causal " if spec.causal else "") + ("masked " if spec.mask is not None else "")
    head = (f"# {what}decode attention: softmax(q @ k^T * {spec.scale:.6g}) @ v, {nkv} batch x KV head(s) of "
            f"{spec.groups} query head(s) x {spec.sq} quer{'y' if spec.sq == 1 else 'ies'} each, Sk={spec.sk}, "
            f"D={spec.d}, Dv={spec.dv}, {nch} KV chunk(s)")
    if tuned:
        with src.block(f"{name}_configs = ["):
            for bn, stages, warps in cfgs:
                src.writeline(f"triton.Config({{\"BLOCK_N\": {bn}}}, num_stages={stages}, num_warps={warps}),")
        src.writeline("]")
        src.writeline("")
        src.writeline("")
        # over a symbolic length a sweep is cut by the call's bucket, as a concrete length's table is
        fit = {"BLOCK_N": ("sk_bucket", 64)} if sk_sym else None
        src.writeline(f"@triton.autotune(configs={name}_configs, key=[\"{'sk_bucket' if sk_sym else 'SK'}\"], "
                      f"{tune_tail(fit)})")
    p_ptrs = list(part.low.pointers.values())
    sizes = size_params(g, touched)
    acc = [] if part.direct else ["ACC"]
    params = ([p.name for p in p_ptrs] + acc + sizes + [sk_param] + [b for b, _ in buckets]
              + ["BLOCK_N: tl.constexpr"])
    # SK bounds the chunks and masks keys across rows, never a contiguous run: not specialised
    src.writeline(jit_line(g, touched, params, free=("SK",)))
    with src.block(f"def {name}({', '.join(params)}):"):
        src.writeline(head)
        if part.direct:
            src.writeline("# one launch: each program covers its batch x KV head's keys and stores the result")
        else:
            src.writeline("# pass 1 of 2: each program writes its chunk's (max, sum, accumulator) to scratch")
        src.splice(part_body.getvalue())
    if not part.direct:
        src.writeline("")
        src.writeline("")
        c_ptrs = list(comb_low.pointers.values())
        c_params = [p.name for p in c_ptrs] + ["ACC"] + sizes
        src.writeline(jit_line(g, touched, c_params))
        with src.block(f"def {name}_combine({', '.join(c_params)}):"):
            src.writeline(f"# pass 2 of 2: merge the {nch} chunk(s) of each row (log-sum-exp rescale), epilogue, store")
            src.splice(comb_body.getvalue())

    sz_args = size_args(g, touched)
    sk_arg = (("SK", spec.sk),)
    first_kwargs = sk_arg + buckets
    if not tuned:
        bn, stages, warps = cfgs[0]
        first_kwargs += (("BLOCK_N", bn),) + ((("num_stages", stages), ("num_warps", warps)) if cuda else ())
    first = Launch(Grid.of(nch, nkv), tuple(Buf(p.nid) for p in p_ptrs) + (() if part.direct else (scratch,)) + sz_args,
                   first_kwargs)
    if part.direct:
        return Kernel(name, src.getvalue(), [first])
    second = Launch(Grid.of(nkv), tuple(Buf(p.nid) for p in c_ptrs) + (scratch,) + sz_args,
                    (("num_warps", 4),) if cuda else (), fn=f"{name}_combine")
    return Kernel(name, src.getvalue(), [first, second])

"""What every ablation sweep shares: timing, checking, recording, and the anchors' tensors.

`attempt` checks a variant against eager PyTorch, then times it with `bench` (do_bench
medians, L2 flushed) and appends a row to `Results`, which rewrites ablations.json after
every row; a variant that fails is recorded with its error and the sweep goes on.
`bench_host_hidden` times a call with the host's time hidden behind a GPU sleep, and
`host_ms_per_call` measures the host's time alone. The sweeps are in memory.py
and matmul.py; run.py runs them.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402
from benchmarks.ablations.handwritten import pointwise_2d  # noqa: E402

DEADLINE = [float("inf")]                         # --budget-s: no variant starts after it
ATTN_VARIANTS: list[set[str] | None] = [None]     # --attn-variants
ATTN_CONFIGS: list[list[tuple[int, ...]] | None] = [None]  # --attn-configs: (BLOCK_M, BLOCK_N, stages, warps)


@functools.cache
def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def bench(fn) -> float:
    measure.settle(fn)             # a generated module's kernels compiled, not eager's stand-ins
    return _timed(fn)


def _timed(fn) -> float:
    """do_bench's median of an `fn` already settled."""
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def check(got, ref, name):
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")


class Results:
    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def add(self, group: str, variant: str, ms: float | None, nbytes: int | None = None,
            error: str | None = None, **extra):
        gbps = nbytes / (ms * 1e6) if ms and nbytes else None
        row = {"group": group, "variant": variant, "ms": ms, "gbps": gbps, "error": error, **extra}
        self.rows.append(row)
        shown = f"{ms:.4f} ms" if ms else "-"
        rate = f" {gbps:7.0f} GB/s" if gbps else ""
        print(f"{group:10s} {variant:58s} {shown}{rate}{'  ERROR ' + error if error else ''}", flush=True)
        (self.out / "ablations.json").write_text(json.dumps(self.rows, indent=1))


def attempt(res: Results, group: str, variant: str, nbytes, run, ref=None, flops=None):
    """Check `run()` against `ref`, then time it; `flops` (if given) adds the achieved TFLOP/s."""
    if time.perf_counter() > DEADLINE[0]:
        return
    try:
        got = measure.settle(run)      # checked and timed: minicomp's kernels, compiled and autotuned
        if ref is not None:
            check(got, ref, variant)
        ms = _timed(run)
        res.add(group, variant, ms, nbytes, **({"tflops": flops / (ms * 1e9)} if flops else {}))
    except Exception as e:       # record and go on: one bad variant must not stop the sweep
        res.add(group, variant, None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        traceback.print_exc(limit=2)


def with_one_config(source: str, config: str, key: str, constants=()):
    """A generated module whose autotuning list is just `config` (a `triton.Config(...)` text), imported."""
    import re
    from minicomp.runtime.loader import import_source
    src = re.sub(r"(_configs = \[\n)(.*?)(\n\])", lambda m: m.group(1) + "    " + config + m.group(3), source,
                 count=1, flags=re.S)
    mod = import_source(src, key, interpret=False)
    mod.CONSTANTS[:] = list(constants)
    return mod


def attempt_module(res: Results, group: str, variant: str, make, args, ref, flops):
    """`attempt` on `make()`'s module called with `args`, recording a module that fails to build."""
    try:
        mod = make()
    except Exception as e:
        res.add(group, variant, None, error=f"{type(e).__name__}: {str(e)[:200]}")
        return
    attempt(res, group, variant, None, lambda: mod.call(*args)[0], ref, flops)


def pointwise_anchor():
    """The pointwise anchor's tensors: x 8192x8192, w and b 8192 (bf16), eager's answer, an output
    buffer and the ledger's bytes."""
    R = C = 8192
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(x * w + b, approximate="tanh")
    return x, w, b, ref, torch.empty_like(x), 2 * x.nbytes + w.nbytes + b.nbytes


def hand_pointwise(x, w, b, y, br: int, bc: int, warps: int):
    """The hand-written 2-D pointwise anchor kernel (tile br x bc, `warps` warps) as a call."""
    R, C = x.shape

    def run():
        pointwise_2d[(triton.cdiv(C, bc), triton.cdiv(R, br))](x, w, b, y, R, C=C, BR=br, BC=bc, FORM=0,
                                                                num_warps=warps)
        return y
    return run


def grid_for(n_blocks: int, persistent: int) -> tuple:
    return (min(n_blocks, sm_count() * persistent),) if persistent else (n_blocks,)


def host_ms_per_call(fn, calls: int = 200) -> float:
    """Host-side milliseconds per call of `fn`: `calls` calls with no GPU wait between them."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return host


def bench_host_hidden(fn, reps: int = 100) -> float:
    """Median time of `fn()` as do_bench takes it (L2 flushed by zeroing 256 MB before each run),
    but with a ~0.5 ms GPU sleep enqueued before the flush, so the host has enqueued all of
    `fn`'s work before the GPU reaches it: the GPU time of `fn` alone, host time hidden."""
    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        torch.cuda._sleep(1_000_000)
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

"""How generated autotuners time, prune and remember their configs.

A generated module binds these as `_tune_bench`, `_tune_options` and `_rt.fit_buckets(...)`
in its `@triton.autotune(...)` lines (codegen/pointwise.py, gemm.py, attention.py):

- `tune_bench` times one config, shorter than Triton's default (see its docstring);
- `tune_options()` adds `cache_results=True` where this Triton's autotune takes it: Triton then
  keeps each sweep's timings in its cache directory, keyed by the kernel's source, its
  configs, the tuning key (sizes or their buckets, dtypes), the device and Triton's own
  version, and a later process reads the winner instead of timing again;
- `fit_buckets` prunes a sweep over symbolic sizes by the call's power-of-two buckets, the
  cut a static kernel's config table gets from its concrete sizes (gemm_configs.configs).

Invariant: none of these changes what a kernel computes; they only choose among configs
that each compute the same result.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

TUNE_CACHE_ENV = "MINICOMP_TUNE_CACHE"     # "0": every process times its sweeps again


def tune_bench(kernel_call: Callable, quantiles: Any):
    """How generated autotuners time one config. Triton's default times each for 25 ms of
    warm-up and 100 ms of repetitions: 37 configs made 6.4 of llama_block's 6.7 s first call.
    1 + 6 ms still gives tens of runs of a memory-bound kernel here (each run also clears the
    L2 cache, ~0.1 ms) and a few of the slowest (SwiGLU at batch 4 x 512, 1.6 ms); configs
    that win differ by more than the medians' spread, and a module over symbolic sizes times
    its sweeps once per size bucket (ten lengths through a Llama layer: 0.8 s a bucket at
    2 + 10 ms, BENCHMARKS.md session 10)."""
    import triton
    return triton.testing.do_bench(kernel_call, warmup=1, rep=6, quantiles=quantiles)


def tune_options(environ: dict | None = None) -> dict:
    """Extra keyword arguments of generated `@triton.autotune` lines: `cache_results=True`
    where this Triton's autotune takes it and $MINICOMP_TUNE_CACHE is not "0"; else none."""
    env = os.environ if environ is None else environ
    if env.get(TUNE_CACHE_ENV) == "0":
        return {}
    return {"cache_results": True} if _autotune_keeps_results() else {}


@functools.cache
def _autotune_keeps_results() -> bool:
    """Whether this Triton's `autotune` takes `cache_results` (read once: every module asks)."""
    try:
        import triton
        return "cache_results" in inspect.signature(triton.autotune).parameters
    except (ImportError, TypeError, ValueError):
        return False


def fit_buckets(blocks: dict[str, tuple[str, int]], top: tuple[int, dict[str, int]] | None = None) -> dict:
    """`prune_configs_by` for an autotuner over symbolic sizes: `blocks` maps a config's block
    size (`BLOCK_M`) to the bucket argument it tiles and the smallest cap (`("m_bucket", 32)`).
    A sweep keeps the configs whose every such block is at most max(cap, bucket); when none
    does, the config with the smallest blocks. `top` = (k, {bucket: at least}): where every
    named bucket is that large, a big problem, only the table's first k configs are timed
    (what a static kernel's table keeps for a big problem, gemm_configs.configs)."""
    def prune(configs: list, named_args: dict, **kwargs: Any) -> list:
        args = {**named_args, **kwargs}
        if top is not None and all(int(args.get(b, 0)) >= least for b, least in top[1].items()):
            configs = configs[:top[0]]

        def fits(config) -> bool:
            return all(config.kwargs.get(block, 0) <= max(least, int(args.get(bucket, least)))
                       for block, (bucket, least) in blocks.items())
        kept = [c for c in configs if fits(c)]
        if kept:
            return kept
        return [min(configs, key=lambda c: [c.kwargs.get(block, 0) for block in blocks])]
    return {"early_config_prune": prune}

"""Filling Triton's once-per-process state while minicomp captures and plans (CUDA only).

Before its first kernel compiles, a process builds state that every later compile and
launch reuses:

- Triton's CUDA driver object (`driver.active`), whose first use builds a small C
  extension (`cuda_utils`) with the host's C compiler when Triton's cache is empty;
- `triton_key()`, a SHA-256 of Triton's compiler sources and of libtriton.so (415 MB in
  Triton 3.6), part of every compile's cache key;
- `ptxas --version` (a subprocess) and the hash of libdevice, part of the backend's and the
  options' hashes.

Triton computes each once and keeps it (`functools.lru_cache`), but the first compile pays
for all of it. Under the generated module's warm-up (`launcher.CompilingAtOnce`,
codegen/launch.py) that was the main thread, before it submitted its first compile:
`benchmarks/ablations/warm_up_timeline.py` on the H200's host showed the first submit 1.18 s after
the warm-up began, and 0.01 s with this priming, the warm-up 5.89 -> 4.85 s (llama_block).
(Racing threads would each compute a missing lru_cache entry again: 16 threads calling
`triton_key()` at once took 2.96 s against 0.38 s for one, on this 2-core development
machine; priming once avoids that too.)

`prime_triton(device, enabled)` starts one daemon thread per process and device capability
(a `functools.cache` of at most one entry per kind of GPU present), at the start of the first
CUDA compile, that builds all of it while capture and the passes run: the hashing, the
subprocess and the C compiler release the GIL, and capture mostly runs Python. The
modules it uses are imported on the calling thread first. Nothing here changes a result:
the thread only fills caches that Triton fills anyway, and a failure leaves them for Triton
to fill as before. What it may cost: minicomp's own compile in a fresh process
(`compile_seconds`) read 0.31-0.48 s for llama_block with it against 0.30 s at the commit
before it, on that noisy host (not measured apart). `MINICOMP_PRIME_TRITON=0` turns it off
(read into the Target at the boundary, which passes `enabled`).
"""

from __future__ import annotations

import functools
import threading

import torch

_lock = threading.Lock()     # one starter at a time: racing callers would each start a thread


def prime_triton(device: torch.device, enabled: bool = True) -> threading.Thread | None:
    """The priming thread for a CUDA `device` (started at the first call for its capability,
    the same thread after); None on the CPU, when not `enabled`, or when Triton has no such
    pieces."""
    if device.type != "cuda" or not enabled:
        return None
    capability = tuple(torch.cuda.get_device_capability(device))
    with _lock:
        return _start(capability)


@functools.cache
def _start(capability: tuple[int, int]) -> threading.Thread | None:
    try:
        from triton.backends.compiler import GPUTarget   # imports on the caller's thread
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import triton_key
        from triton.runtime.driver import driver
    except Exception:  # a Triton laid out otherwise: it fills its caches itself
        return None
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

    def backend_hashes() -> None:
        backend = make_backend(target)
        backend.hash()                           # ptxas --version
        backend.parse_options({}).hash()         # libdevice's hash

    def prime() -> None:
        for step in (triton_key, lambda: driver.active, backend_hashes):   # driver: cuda_utils' C build
            try:
                step()
            except Exception:                    # left for Triton to do, as without priming
                pass

    thread = threading.Thread(target=prime, name="minicomp-prime-triton", daemon=True)
    thread.start()
    return thread

"""Filling Triton's once-per-process state while minicomp captures and plans (CUDA only).

Before its first kernel compiles, a process builds state that every later compile and
launch reuses:

- Triton's CUDA driver object (`driver.active`), whose first use builds a small C
  extension (`cuda_utils`) with the host's C compiler when Triton's cache is empty;
- `triton_key()`, a SHA-256 of Triton's compiler sources and of libtriton.so (415 MB in
  Triton 3.6), part of every compile's cache key;
- `ptxas --version` (a subprocess) and the hash of libdevice, part of the backend's and the
  options' hashes.

The last two sit behind `functools.lru_cache`, which does not hold back concurrent callers
of a missing key. The generated module's warm-up (`_warm_up`, codegen/launch.py) starts
~40 compiles at once on a pool of threads, so each of the first ones computed them again:
16 threads calling `triton_key()` at once took 2.96 s against 0.38 s for one call (this
2-core development machine, Triton 3.6). And the driver object's C build ran on the main
thread before the first compile was submitted.

`prime_triton(device)` starts one daemon thread per process, at the start of the first
CUDA compile, that builds all of it while capture and the passes run: the hashing, the
subprocess and the C compiler release the GIL, and capture mostly runs Python. The
imports happen on the calling thread first, so the two threads never import the same
module at once. Nothing here changes a result: the thread only fills caches that Triton
fills anyway, and a failure leaves them for Triton to fill as before.
`MINICOMP_PRIME_TRITON=0` turns it off (for measuring).
"""

from __future__ import annotations

import os
import threading

import torch

_lock = threading.Lock()
_thread: threading.Thread | None = None


def prime_triton(device: torch.device) -> threading.Thread | None:
    """Start the priming thread for a CUDA `device` (once per process); returns it, or None
    when there is nothing to start."""
    global _thread
    if device.type != "cuda" or os.environ.get("MINICOMP_PRIME_TRITON") == "0":
        return None
    with _lock:
        if _thread is not None:
            return None
        try:
            from triton.backends.compiler import GPUTarget   # imports on the caller's thread
            from triton.compiler.compiler import make_backend
            from triton.runtime.cache import triton_key
            from triton.runtime.driver import driver
        except Exception:  # a Triton laid out otherwise: it fills its caches itself
            _thread = threading.current_thread()   # do not try again
            return None
        major, minor = torch.cuda.get_device_capability(device)
        target = GPUTarget("cuda", major * 10 + minor, 32)

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

        _thread = threading.Thread(target=prime, name="minicomp-prime-triton", daemon=True)
        _thread.start()
        return _thread

"""The suite's backends: how each is made from a workload, compiled, first-called and checked.

Invariants:
- A backend's first call is checked against eager before it is timed, and one call after
  timing is checked again (`check_after_timing`): the timed calls take other paths.
- An extra backend runs only when its base backend is in the run's --backends
  (`EXTRA_BASE`): the reduce-overhead modes, the Dynamo backend and `minicomp_cublas`
  (`minicomp.compile(fn, library="all")`: cuBLAS for every GEMM) are variants of their base.
- `minicomp_ro` is feature-detected: where `minicomp.compile(fn, mode="reduce-overhead")`
  itself refuses the option (ValueError, TypeError, or minicomp's usage error for an unknown
  option), the backend raises `NotApplicable` and the run reports it as "n/a", not as an
  error. A failure after the option was accepted (compile, capture, run) is an error.
- torch and minicomp are imported inside functions: the caller sets TRITON_INTERPRET first.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from benchmarks.measure import compare, ledger, poison_allocator, sync, time_fn
from benchmarks.workloads_models import minicomp_backend

# extra backend -> the --backends entry it needs
EXTRA_BASE = {"minicomp_dynamo": "minicomp", "inductor_ro": "inductor", "minicomp_ro": "minicomp",
              "minicomp_cublas": "minicomp"}
REDUCE_OVERHEAD = "reduce-overhead"


class NotApplicable(Exception):
    """This backend does not apply here (an API that does not take the mode yet)."""


def backend_names(w, built, backends: list[str]) -> list[str]:
    """The backends of one workload, in the order they are compiled and checked."""
    names = [b for b in backends if b in ("eager", "inductor", "minicomp")]
    names += [b for b in w.extra_backends if EXTRA_BASE.get(b) in backends and b not in names]
    names += [name for name, _ in built.baselines()]
    return names


def minicomp_reduce_overhead(fn: Callable) -> Callable:
    import minicomp
    from minicomp.errors import UsageError
    try:
        return minicomp.compile(fn, mode=REDUCE_OVERHEAD)
    except (ValueError, TypeError, UsageError) as e:
        raise NotApplicable(f"minicomp.compile(fn, mode={REDUCE_OVERHEAD!r}) refused: {e}") from e
    except Exception as e:
        # minicomp's unknown-option error is a MinicompError; any other class is a real failure.
        if "unknown option" in str(e) and "mode" in str(e):
            raise NotApplicable(f"minicomp.compile(fn, mode={REDUCE_OVERHEAD!r}) refused: {e}") from e
        raise


def make_backend(name: str, built) -> Callable:
    import torch
    if name == "eager":
        return built.fn
    if name == "inductor":
        return torch.compile(built.fn)
    if name == "inductor_ro":              # CUDA graphs around Inductor's kernels
        return torch.compile(built.fn, mode=REDUCE_OVERHEAD)
    if name == "minicomp":
        import minicomp
        return minicomp.compile(built.fn)
    if name == "minicomp_ro":
        return minicomp_reduce_overhead(built.fn)
    if name == "minicomp_cublas":          # every GEMM through cuBLAS, what follows fused forward (an experiment)
        import minicomp
        return minicomp.compile(built.fn, library="all")
    if name == "minicomp_dynamo":          # the torch.compile backend (entry point "minicomp")
        return torch.compile(built.fn, backend=minicomp_backend())
    for ref_name, ref_fn in built.baselines():
        if name == ref_name:
            return ref_fn
    raise ValueError(f"unknown backend {name!r}")


def run_backend(name: str, built, ref, args, tol) -> dict:
    """Compile (minicomp: with its plan), first call, check against eager, time, check again."""
    rec, fn = prepare_backend(name, built, ref, args, tol)
    rec.update(time_fn(lambda: fn(*built.inputs), args))
    check_after_timing(rec, fn, built, ref, tol)
    return rec


def prepare_backend(name: str, built, ref, args, tol) -> tuple[dict, Callable]:
    """Compile (minicomp: with its plan), first call and check against eager; returns the record
    and the compiled callable, for timing."""
    rec: dict[str, Any] = {}
    fn = make_backend(name, built)
    if name == "minicomp":
        t0 = time.perf_counter()
        compiled = fn.compile_for(*built.inputs)
        rec["compile_for_s"] = time.perf_counter() - t0          # capture included, no Triton JIT
        rec["compile_seconds"] = compiled.compile_seconds         # minicomp's own figure
        rec["ledger"] = ledger(compiled.plan, compiled.generated.fallbacks, getattr(compiled.generated, "library", {}))
        rec["kernels"] = list(getattr(compiled.generated, "kernel_names", []))
    if ref is not None:
        poison_allocator(ref)
    sync(args.device)
    t0 = time.perf_counter()
    out = fn(*built.inputs)
    sync(args.device)
    rec["first_call_s"] = time.perf_counter() - t0               # in this (warm) process, after compile_for
    rec["check"] = compare(out, ref, tol, built.wide_out) if ref is not None \
        else {"ok": True, "reference": True}
    if name == "minicomp":       # eager answered while kernels compiled: until a call runs them all
        import minicomp
        minicomp.wait_compiled()
        fn(*built.inputs)                                        # the call that autotunes them
        sync(args.device)
        rec["settled_s"] = time.perf_counter() - t0
    return rec, fn


def check_after_timing(rec: dict, fn: Callable, built, ref, tol) -> None:
    """The timed calls take other paths than the first (minicomp: the compiled kernels' own
    launchers; torch.compile: its guards' fast path; reduce-overhead: graph replays): check
    one of them too."""
    if ref is None:
        return
    poison_allocator(ref)
    after = compare(fn(*built.inputs), ref, tol, built.wide_out)
    rec["check_after_timing"] = after
    if not after["ok"] and rec["check"]["ok"]:
        rec["check"] = {**after, "error": "after timing: " + after.get("error", "mismatch")}

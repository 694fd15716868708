"""The GPU-true check: every kernel of a generated module, compiled for a real GPU target.

Triton's CPU interpreter executes a kernel's Python and skips the checks of Triton's frontend
and code generator, so a kernel can pass every CPU test and still be rejected on the GPU
(`other` given without `mask`, `.to` on a Python int). `check_kernels(generated, arch)`
compiles each (kernel, autotuning config) of a module generated for `cuda` through Triton's
own compiler for `sm_<arch>`, on a machine with or without a GPU, and returns one
`KernelVerdict` per kernel. `verify(graph, plan, target, generated)` is what `generate` runs
when the target asks for the check (`Target.verify_arch`): it generates the module again for
a CUDA device of that capability (a CPU module's kernels differ) and raises CompileError
naming the first kernel Triton rejects, its plan group, the user's lines and Triton's message.

The compiles run in a worker process (`target_worker.py`) started once per process and kept:
it runs without the interpreter, which this process may have on. $MINICOMP_VERIFY_TRITON names
a directory holding another Triton (`pip install --target DIR triton==3.6.0`: the device
machine's, where this machine has a newer one), which the worker imports instead: Triton 3.6
rejected a kernel that 3.9 compiled (session 24, BENCHMARKS.md). Verdicts are memoised by
the module's text, and Triton's disk cache serves kernels the worker compiled before, so a
test suite that generates the same kernel many times compiles it once.

A kernel fails when any config fails for a reason other than a resource limit (a bug in the
text), or when every config exceeds the device's resources (an autotuner skips configs
that do, so one fitting config is enough).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from minicomp.errors import CompileError
from minicomp.ir.graph import Graph
from minicomp.target import VERIFY_TRITON_ENV

WORKER = Path(__file__).with_name("target_worker.py")
_MEMO_SIZE = 2048


@dataclass(frozen=True)
class KernelVerdict:
    kernel: str
    configs: int                 # how many (kernel, config) pairs were compiled
    error: str | None            # None: it compiles for the target
    config: str = ""             # the config that failed (when one did)


def worker_env(environ) -> dict:
    """The worker's environment: no interpreter, this minicomp found first (generated modules
    import its runtime), and before it the Triton of $MINICOMP_VERIFY_TRITON where set."""
    env = dict(environ)
    env["TRITON_INTERPRET"] = "0"
    package_root = str(Path(__file__).resolve().parents[2])
    other = env.get(VERIFY_TRITON_ENV, "").strip()
    env["PYTHONPATH"] = os.pathsep.join([p for p in [other, package_root, env.get("PYTHONPATH")] if p])
    env.pop("PYTHONSTARTUP", None)
    return env


class _Worker:
    """One long-lived worker process, used by one caller at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.memo: OrderedDict[str, list[dict]] = OrderedDict()
        self.compiled = 0            # (kernel, config) pairs sent to Triton's compiler
        self.cubins = 0              # of which compiled all the way to a cubin
        self.kernels: set[str] = set()  # distinct kernel texts among them (name-independent hash)
        self.seconds = 0.0           # spent waiting for the worker
        self.stage_seconds: dict[str, float] = {}   # the worker's compile time by stage ("cubin", "ttgir")

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=worker_env(os.environ), bufsize=1)

    def results(self, source: str, arch: int, depth: str = "full") -> list[dict]:
        key = hashlib.sha256(f"{arch}\0{depth}\0{source}".encode()).hexdigest()
        with self.lock:
            if key in self.memo:
                self.memo.move_to_end(key)
                return self.memo[key]
            for attempt in (0, 1):   # a worker that died (killed, out of memory) is started again once
                started = time.perf_counter()
                if self.proc is None or self.proc.poll() is not None:
                    self.proc = self._start()
                try:
                    self.proc.stdin.write(json.dumps({"source": source, "arch": arch, "depth": depth}) + "\n")
                    self.proc.stdin.flush()
                    line = self.proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                self.seconds += time.perf_counter() - started
                if line:
                    break
                self.proc = None
            if not line:
                raise CompileError(f"the GPU-true check's worker ({WORKER.name}) stopped without an answer")
            reply = json.loads(line)
            if "failure" in reply:
                raise CompileError("the generated module could not be loaded for the GPU-true check "
                                   f"(a minicomp bug):\n{reply['failure']}")
            results = reply["results"]
            for stage, spent in reply.get("seconds", {}).items():
                self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + spent
            self.compiled += len(results)
            self.cubins += sum(e.get("stage") == "cubin" for e in results)
            self.kernels.update(e["digest"] for e in results)
            self.memo[key] = results
            if len(self.memo) > _MEMO_SIZE:
                self.memo.popitem(last=False)
            return results


    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc = None


_worker = _Worker()
atexit.register(_worker.close)


def stats() -> dict:
    """What this process has had compiled for a target so far: (kernel, config) pairs, how many
    of them down to a cubin, distinct kernel texts, seconds spent waiting for the worker, and
    the worker's compile seconds by stage (`stages`: "cubin", "ttgir")."""
    return {"configs": _worker.compiled, "cubins": _worker.cubins, "kernels": len(_worker.kernels),
            "seconds": _worker.seconds, "stages": dict(_worker.stage_seconds)}


def check_kernels(source: str, kernel_names: list[str], arch: int, depth: str = "full") -> list[KernelVerdict]:
    """One verdict per kernel of a CUDA module's `source` (module text with its `_WARM` list).
    `depth` "sampled" compiles one config per kernel to a cubin and a sample of the others
    through the TritonGPU passes only (target_worker.py says which and why); a verdict then
    rests on the configs compiled."""
    by_kernel: dict[str, list[dict]] = {name: [] for name in kernel_names}
    for entry in _worker.results(source, arch, depth):
        by_kernel.setdefault(entry["kernel"], []).append(entry)
    return [verdict_of(name, by_kernel[name]) for name in kernel_names]


def verdict_of(kernel: str, entries: list[dict]) -> KernelVerdict:
    """The verdict on one kernel from the worker's entries for its configs: it fails when a
    config fails for a reason other than a resource limit, or when every config does."""
    if not entries:
        return KernelVerdict(kernel, 0, "no launch of it could be compiled ahead (not in _WARM or _LATER)")
    bad = next((e for e in entries if e["error"] and not e["resources"]), None)
    if bad is None and all(e["error"] for e in entries):
        bad = entries[0]
    return KernelVerdict(kernel, len(entries), bad["error"] if bad else None, bad["config"] if bad else "")


def group_sources(graph: Graph, group) -> str:
    """The user's lines a plan group computes ("model.py:12, model.py:14"), or ""."""
    seen = dict.fromkeys(graph.node(n).origin for n in group.nodes if graph.node(n).origin)
    return ", ".join(seen)


def verify(graph: Graph, plan, arch: int, generated, depth: str = "full") -> None:
    """Raise CompileError unless every kernel of `generated` (a module for `cuda:<arch>`)
    compiles for that target."""
    if not generated.kernel_names:
        return
    groups = {g.id: g for g in plan.groups}
    for verdict in check_kernels(generated.source, generated.kernel_names, arch, depth):
        if verdict.error is None:
            continue
        group = groups[generated.kernel_groups[verdict.kernel]]
        what = f"group {group.id}, {group.kind}" + (f" {group.name}" if group.name else "")
        where = group_sources(graph, group)
        config = f" (config {verdict.config})" if verdict.config else ""
        raise CompileError(f"{graph.name}: kernel {verdict.kernel} ({what}"
                           + (f"; computes {where}" if where else "") + ") is rejected by Triton's compiler "
                           f"for cuda:{arch}{config}:\n{verdict.error}")

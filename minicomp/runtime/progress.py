"""Progress lines for Triton autotuning sweeps that take longer than about a second.

On CUDA the GEMM, pointwise and row kernels carry `@triton.autotune`: their first launch
for a new key benchmarks every config, which can take seconds with nothing on screen.
`watch_autotuning(module, groups)` wraps each `Autotuner` object in a loaded generated
module (the kernels are module globals; `groups` maps kernel names to plan groups) so that a sweep still running after
`THRESHOLD_S` shows one line on stderr: on a terminal it is updated in place as configs finish,

    minicomp: autotuning mc_gemm_bias_gelu_3 (group 3): config 5/12, 1.4 s

and elsewhere (a log, CI) one summary line is written when the sweep ends:

    minicomp: autotuned mc_gemm_bias_gelu_3 (group 3): 12 configs in 3.2 s

It hooks two methods the autotuner calls on itself in every Triton 3.x: `prune_configs`
(the sweep starts: how many configs) and `_bench` (one config timed). An autotuner
without them is left alone. Under Triton's interpreter there is no sweep (CPU kernels
have one config), so nothing prints there.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any, Callable, TextIO

THRESHOLD_S = 1.0


class SweepProgress:
    """Counts the configs of one autotuner's sweeps; a sweep that runs past the threshold shows
    one line: updated in place on a terminal, written once when the sweep ends otherwise (a log
    never gets a line per config)."""

    def __init__(self, label: str, out: TextIO | None = None, threshold_s: float = THRESHOLD_S,
                 clock: Callable[[], float] = time.perf_counter, tty: bool | None = None):
        self.label = label
        self.out = out
        self.threshold_s = threshold_s
        self.clock = clock
        self.tty = tty
        self.total = self.done = 0
        self.start = 0.0
        self.shown = False

    def begin(self, total: int) -> None:
        self.total, self.done, self.start, self.shown = total, 0, self.clock(), False

    def config_done(self) -> None:
        self.done += 1
        elapsed = self.clock() - self.start
        if elapsed < self.threshold_s or self.total < 2:
            return
        out = self.out or sys.stderr
        tty = self.tty if self.tty is not None else bool(getattr(out, "isatty", lambda: False)())
        last = self.done >= self.total
        if tty:
            end = "\n" if last else ""
            print(f"\rminicomp: autotuning {self.label}: config {self.done}/{self.total}, {elapsed:.1f} s\x1b[K",
                  end=end, file=out, flush=True)
        elif last:
            print(f"minicomp: autotuned {self.label}: {self.total} configs in {elapsed:.1f} s", file=out, flush=True)


def watch(tuner: Any, progress: SweepProgress) -> bool:
    """Hook `tuner`'s sweep into `progress`; False (tuner untouched) if it lacks the two methods."""
    prune, bench = getattr(tuner, "prune_configs", None), getattr(tuner, "_bench", None)
    if not callable(prune) or not callable(bench):
        return False

    def prune_configs(*args: Any, **kwargs: Any):
        configs = prune(*args, **kwargs)
        progress.begin(len(configs))
        return configs

    def timed_bench(*args: Any, **kwargs: Any):
        try:
            return bench(*args, **kwargs)
        finally:
            progress.config_done()

    tuner.prune_configs = prune_configs   # instance attributes: the autotuner calls self.<name>(...)
    tuner._bench = timed_bench
    return True


def watch_autotuning(module: types.ModuleType, groups: dict[str, int] | None = None,
                     out: TextIO | None = None) -> list[str]:
    """Watch every autotuned kernel of a loaded generated module; returns the kernel names watched.
    `groups` (kernel name -> plan group id, `GeneratedModule.kernel_groups`) labels the lines."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:   # a Triton without the autotuner module: nothing to watch
        return []
    groups = groups or {}
    watched = []
    for name, obj in list(vars(module).items()):
        if isinstance(obj, Autotuner):
            label = f"{name} (group {groups[name]})" if name in groups else name
            if watch(obj, SweepProgress(label, out)):
                watched.append(name)
    return watched

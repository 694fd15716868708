"""Why minicomp's kernels are shaped as they are: ablations (hand-written variants of the
generated kernels, one knob at a time: `run.py`, with `harness.py`, `handwritten.py`, `matmul.py`
and `memory.py`) and diagnostics of one question each (first call, warm-up timeline, idle
clocks, own compile time, the two attention kernels side by side, a profiler run).
Scripts, run on the GPU machine; the suite (`benchmarks/run.py`) imports nothing here."""

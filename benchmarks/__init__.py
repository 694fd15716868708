"""The benchmark suite (`run.py`: workloads, measurement, compile time and the report), which
uses minicomp's public API only; `ablations/` and `prototypes/` hold the measurements of why
and the kernels compared against."""

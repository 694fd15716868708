"""The GPU benchmark suite (run.py): workloads, measurement and the report."""

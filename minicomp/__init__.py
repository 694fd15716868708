"""minicomp: a small graph-to-Triton-kernel compiler."""

__version__ = "0.1.0"

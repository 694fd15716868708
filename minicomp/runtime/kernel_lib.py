"""Triton functions that generated kernels call: imported by every generated module.

They are `@triton.jit` functions of this module, so Triton decides at its first import whether
they run under the CPU interpreter; generated modules are loaded with the interpreter on for
CPU devices (runtime/loader.py), and a process runs either CPU or GPU kernels, never both
(`loader.check_interpreter`).
"""

import triton
import triton.language as tl


@triton.jit
def _round_bf16(x):
    # fp32 -> nearest-even bf16 value, kept in fp32. Triton's interpreter truncates fp32 -> bf16
    # (the GPU rounds to nearest even), so CPU kernels round through this.
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


# tl.max / tl.min combine with maxnum/minnum, which drop NaN; torch.amax/amin propagate it.
# Row kernels reduce floats through these instead.
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)

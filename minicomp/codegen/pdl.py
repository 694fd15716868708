"""Programmatic dependent launch (PDL, sm_90 and newer): a kernel launched before the one ahead
of it on the stream has finished.

Between two kernels on one stream the GPU idles while the second launches: about 1.5 us a
boundary in minicomp's Qwen2 call on the H100 (80 us over 54 kernels, session 25). With PDL the
second kernel is launched with `launch_pdl=True` and may be scheduled while the first is still
ending; its programs then wait at `tl.extra.cuda.gdc_wait()` (PTX `griddepcontrol.wait`) until
the first kernel has completed and its writes are visible.

`dependent(kernel)` puts that wait first in every launched `@triton.jit` function of a kernel,
before any load, any store and any TMA descriptor written to scratch, so no instruction of the
kernel can see the previous kernel's memory half-written or overwrite what it still reads (a
reused buffer). No kernel calls `gdc_launch_dependents()`: the next kernel is released only as
this one's programs exit, so its waiting programs never take an SM from a program of this one
that is not yet scheduled. Kernels of another language (the Gluon attention kernel) are left as
they are and launch without PDL.

On by default on a GPU of capability 9.0 or newer (`Target.pdl`; $MINICOMP_PDL=0 turns it off),
under CUDA graphs too (mode="reduce-overhead"): a stream capture records a PDL launch as a
programmatic edge from the kernel before it, and each replay keeps that overlap. On the H100
(session 26, benchmarks/ablations/library_choice.py --variants default,nopdl) Qwen2's 4 x 512 call
took 1.791 ms against 1.836 without it, Llama's 1.852 against 1.869; under CUDA graphs (session 29,
benchmarks/ablations/host_share.py --no-tc --rounds 2, with few-rows GEMMs then on cuBLAS) Llama
1 x 16 replayed in 0.358 ms against 0.362, Qwen2 in 0.361 against 0.364. The profiler's
per-kernel times grow under PDL (a kernel starts early and its wait counts as its own time), so
they are no measure of it: wall time is.
"""

from __future__ import annotations

import re
from dataclasses import replace

from minicomp.codegen.common import Kernel

WAIT = "tl.extra.cuda.gdc_wait()  # PDL: wait here until the kernel before this one has completed (codegen/pdl.py)"
_DEF = re.compile(r"def (\w+)\(")


def dependent(kernel: Kernel) -> Kernel:
    """`kernel` with `WAIT` as the first statement of each `@triton.jit` function it launches,
    and those launches made with `launch_pdl=True`."""
    launched = {launch.fn or kernel.name for launch in kernel.launches}
    lines, waits = kernel.source.split("\n"), set()
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = _DEF.match(line)
        if m and m.group(1) in launched and i > 0 and lines[i - 1].startswith("@triton.jit"):
            if not line.rstrip().endswith(":"):
                return kernel           # a signature over several lines: not a form this knows; no PDL
            out.append("    " + WAIT)
            waits.add(m.group(1))
    launches = [replace(launch, kwargs=launch.kwargs + (("launch_pdl", True),))
                if (launch.fn or kernel.name) in waits else launch for launch in kernel.launches]
    return replace(kernel, source="\n".join(out), launches=launches)

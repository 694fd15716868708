"""Our skinny GEMM (a few rows, `codegen/gemm_configs.py` SKINNY_CONFIGS) against cuBLAS, kernel by
kernel, as a CUDA graph replays them.

    python3 benchmarks/ablations/skinny_gemm.py [--rows 16,32,64] [--sweep-rows 64] [--copies 8]

Why: under CUDA graphs a 4-layer Llama at 4 x 16 (64 rows) replayed in 0.394-0.401 ms with our
fused GEMMs against 0.368-0.372 with cuBLAS at few rows (MINICOMP_GRAPH_FEW_ROWS=1), where at
1 x 16 ours won (0.336 against 0.358; session 29) and at 1 x 1 they tied (session 30, H100,
`host_share.py --no-tc --rounds 2`). This asks which GEMMs lose and whether a config of ours
would win.

The Llama benchmark model's shapes (width 2048, 8 KV heads of 128, hidden 5632; bf16, weights in
nn.Linear's [N, K] layout):
- `o_proj + r`: x @ W^T + r, K 2048, N 2048 (the residual add in the epilogue);
- `down + r`: K 5632, N 2048;
- `gate/up`: silu(x @ Wg^T) * (x @ Wu^T), K 2048, N 5632 (our dual GEMM).

Each form is checked against eager (bf16 tolerance), then captured in one CUDA graph that calls it
`--copies` times, each time on its own copy of the weights (more bytes than L2 holds, as the
layers of a model are), and the graph is timed by do_bench (L2 flushed); a figure is the
graph's median over the copies, in microseconds a call. Beside it, each form's CUDA kernel time
per call outside a graph (the profiler's, `measure.kernel_us`), kernel by kernel: a replay
slower than its kernels is the graph's launches. The forms:
- `cuBLAS`: F.linear alone (under the few-rows rule the epilogue fuses into the next kernel, so
  this is that rule's GEMM; for gate/up, two F.linear calls);
- `cuBLAS + eager epilogue`: F.linear then the add (or silu and the product) as PyTorch ops;
- `ours`: minicomp's module as generated (its autotuner picks among its configs);
- at `--sweep-rows`, `ours BM.. BN.. BK.. s. w.`: the same kernel with one config each;
- at `--variant-rows`, three variants of ours: `no PDL` (no `gdc_wait`, plain launches),
  `epilogue loads first` (the residual's tile load and the epilogue's index lines moved above
  the K loop) and `pointer form` (the GEMM compiled without TMA descriptors: one program a
  tile, pointer loads, not persistent).

Session 31 (H200) read a fixed cost of about 7 us a GEMM of ours against 6 for cuBLAS and its
epilogue kernel, every config alike. Session 32's kernel names (H100) showed why: "ours" was
never our kernel. The module answers its first calls with eager's lines while its kernel
compiles in the background (codegen/first_calls.py), and this script timed it at once: cuBLAS,
PyTorch's epilogue kernel and a copy into the kernel's buffer (1.0-1.3 us), in every variant and
config. Each form is now settled first (`measure.settle`: wait for the compiles, then the
autotuning call), so "ours" is minicomp's kernel.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402

SINGLE_SWEEP = [
    (16, 32, 256, 4, 4), (16, 16, 256, 4, 4), (16, 64, 256, 3, 4), (16, 32, 512, 3, 4), (16, 32, 128, 5, 4),
    (16, 128, 128, 3, 4), (32, 16, 256, 4, 4), (32, 32, 256, 4, 4), (32, 32, 128, 4, 4), (32, 64, 128, 4, 4),
    (32, 128, 64, 4, 4), (64, 16, 256, 4, 4), (64, 32, 128, 4, 4), (64, 32, 256, 3, 4), (64, 64, 128, 3, 4),
    (64, 64, 64, 4, 4), (64, 128, 64, 3, 4), (64, 32, 128, 4, 8),
]
DUAL_SWEEP = [
    (16, 32, 256, 3, 4), (16, 16, 256, 4, 4), (16, 64, 128, 3, 4), (32, 16, 256, 3, 4), (32, 32, 128, 4, 4),
    (32, 64, 64, 4, 4), (64, 16, 256, 3, 4), (64, 32, 128, 3, 4), (64, 64, 64, 3, 4), (64, 32, 128, 4, 8),
]


def residual(x, w, r):
    return F.linear(x, w) + r


def swiglu(x, wg, wu):
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


def graph_us(calls) -> float:
    """Microseconds a call of `calls` (one callable per weight copy) replayed as one CUDA graph."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    torch.cuda.synchronize()
    return 1000 * do_bench(graph.replay, warmup=25, rep=150, return_mode="median") / len(calls)


def one_config(source: str, cfg) -> str:
    bm, bn, bk, st, wp = cfg
    line = (f'    triton.Config({{"BLOCK_M": {bm}, "BLOCK_N": {bn}, "BLOCK_K": {bk}, "GROUP_M": 8}}, '
            f'num_stages={st}, num_warps={wp}),')
    out, n = re.subn(r"(_configs = \[\n)(.*?)(\n\])", lambda m: m.group(1) + line + m.group(3), source, count=1,
                     flags=re.S)
    assert n == 1, "no autotuning list in the generated source"
    return out


def no_pdl(source: str) -> str:
    """The module without programmatic dependent launch: no `gdc_wait()` line, plain launches."""
    out = "\n".join(line for line in source.split("\n") if "tl.extra.cuda.gdc_wait()" not in line)
    assert out != source and "launch_pdl=True" in out, "no PDL in the generated source"
    return out.replace("launch_pdl=True", "launch_pdl=False")


def loads_first(source: str) -> str:
    """The kernel with its epilogue's index lines and tile loads (the residual) moved above the
    K loop, so that their DRAM round trip overlaps the operand stream instead of following it."""
    lines = source.split("\n")
    start = next(i for i, line in enumerate(lines) if "# epilogue on the fp32 accumulator" in line)
    end = start + 1
    while end < len(lines) and "acc" not in lines[end] and "tl.store" not in lines[end]:
        end += 1
    zeros = max(i for i in range(start) if lines[i].lstrip().startswith("acc") and "tl.zeros" in lines[i])
    moved = lines[start:end]
    assert zeros < start and moved, "no epilogue to move"
    return "\n".join(lines[:zeros] + moved + lines[zeros:start] + lines[end:])


def pointer_form(fn, args):
    """minicomp's module for `fn` with the GEMM's pointer form (no TMA descriptors, one program a
    tile, not persistent): `gemm.tma_form` answers None while it compiles."""
    import minicomp
    from minicomp.codegen import gemm
    saved = gemm.tma_form
    gemm.tma_form = lambda ctx, spec: None
    try:
        compiled = minicomp.compile(fn)       # a new compiled function: its own capture and codegen
        compiled.compile_for(*args)
        return compiled.source
    finally:
        gemm.tma_form = saved


VARIANTS = {"no PDL": no_pdl, "epilogue loads first": loads_first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,16,32,64")
    ap.add_argument("--sweep-rows", type=int, default=64, help="0: no sweep")
    ap.add_argument("--variant-rows", default="1,16,64",
                    help="rows at which the module's variants run: no PDL, epilogue loads first, pointer form")
    ap.add_argument("--copies", type=int, default=8)
    args = ap.parse_args()
    variant_rows = {int(r) for r in args.variant_rows.split(",") if r}

    import minicomp
    from minicomp.runtime.loader import import_source

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    cases = [("o_proj + r", residual, 2048, 2048, SINGLE_SWEEP), ("down + r", residual, 5632, 2048, SINGLE_SWEEP),
             ("gate/up", swiglu, 2048, 5632, DUAL_SWEEP)]
    print(torch.cuda.get_device_name(), flush=True)
    for rows in [int(r) for r in args.rows.split(",")]:
        for name, fn, k, n, sweep in cases:
            x = torch.randn(rows, k, device=dev, dtype=dt)
            weights = [[torch.randn(n, k, device=dev, dtype=dt) / math.sqrt(k) for _ in range(2 if fn is swiglu else 1)]
                       for _ in range(args.copies)]
            r = torch.randn(rows, n, device=dev, dtype=dt)
            third = (lambda ws: (x, ws[0], ws[1])) if fn is swiglu else (lambda ws: (x, ws[0], r))
            ref = fn(*third(weights[0]))
            ref32 = fn(*[t.float() for t in third(weights[0])])
            tag = f"M={rows:<3d} {name:11s} K={k} N={n}"

            def report(form, calls_of, want=(ref, ref32)):
                try:
                    got = measure.settle(calls_of(weights[0]))   # our kernels compiled, not eager's stand-ins
                    # bf16 tolerance, or no further from the fp32 answer than eager is
                    err, eager_err = (got.float() - want[1]).abs().max().item(), (want[0].float() - want[1]).abs().max().item()
                    if err > max(2 * eager_err, 2e-2 * want[1].abs().max().item()):
                        raise AssertionError(f"max error {err:.3g} against eager's {eager_err:.3g}")
                    us = graph_us([calls_of(ws) for ws in weights])
                    kernels: dict = {}
                    kernel = measure.kernel_us(calls_of(weights[1 % len(weights)]), by_kernel=kernels)
                    print(f"{tag}  {form:34s} {us:8.2f} us; kernels {kernel:6.2f} us ("
                          + ", ".join(f"{k[:28]} {v:.2f}" for k, v in kernels.items()) + ")", flush=True)
                    return us
                except Exception as e:   # one bad form must not stop the rest
                    print(f"{tag}  {form:34s} ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
                          flush=True)
                    return None

            # cuBLAS alone is checked against the matmul alone (the last one of gate/up)
            alone = weights[0][-1]
            want = (F.linear(x, alone), F.linear(x.float(), alone.float()))
            if fn is swiglu:
                report("cuBLAS", lambda ws: (lambda: (F.linear(x, ws[0]), F.linear(x, ws[1]))[1]), want)
            else:
                report("cuBLAS", lambda ws: (lambda: F.linear(x, ws[0])), want)
            report("cuBLAS + eager epilogue", lambda ws: (lambda: fn(*third(ws))))
            compiled = minicomp.compile(fn)
            compiled.compile_for(*third(weights[0]))
            source = compiled.source
            shipped = import_source(source, f"skinny_{rows}_{k}_{n}", interpret=False)
            report("ours", lambda ws: (lambda: shipped.call(*third(ws))[0]))
            if rows in variant_rows:
                forms = {name: (lambda edit=edit: edit(source)) for name, edit in VARIANTS.items()}
                forms["pointer form"] = lambda: pointer_form(fn, third(weights[0]))
                for name, make in forms.items():
                    try:
                        mod = import_source(make(), f"skinny_{rows}_{k}_{n}_{name.replace(' ', '_')}", interpret=False)
                    except Exception as e:
                        print(f"{tag}  ours, {name}: ERROR {type(e).__name__}: {str(e)[:160]}", flush=True)
                        continue
                    report(f"ours, {name}", lambda ws, mod=mod: (lambda: mod.call(*third(ws))[0]))
            if rows != args.sweep_rows:
                continue
            for cfg in sweep:
                try:
                    mod = import_source(one_config(source, cfg), f"skinny_{rows}_{k}_{n}_{cfg}", interpret=False)
                except Exception as e:
                    print(f"{tag}  {cfg} ERROR {type(e).__name__}: {e}", flush=True)
                    continue
                report("ours BM%d BN%d BK%d s%d w%d" % cfg, lambda ws, mod=mod: (lambda: mod.call(*third(ws))[0]))


if __name__ == "__main__":
    main()

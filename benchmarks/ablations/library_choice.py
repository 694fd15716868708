"""Which GEMMs should call cuBLAS: whole models under each choice minicomp can make, in one run.

`codegen/library.py` decides per matmul whether cuBLAS computes it (its epilogue then fuses
with what follows) or our GEMM kernel does, epilogue included. The choice rests on measured
times, not on a rule of thumb; this script measures them. For each model of the suite
(`workloads_models.PREFILL`, bf16 on CUDA) it compiles one module per variant below, checks it
against eager (the benchmark's tolerance against the fp32 model), and times every variant and
torch.compile in interleaved rounds (`measure.time_interleaved`: do_bench medians, L2 flushed):

- `fused`: SwiGLU's gate and up projections as one dual GEMM of ours (MINICOMP_DUAL_GEMM=fused);
- `default`: the defaults (session 19's plan: cuBLAS for both matmuls of the pair and for every
  GEMM of many rows whose result meets a tile, `library_plan.tile_joins`);
- `split`: cuBLAS for one of the pair, our GEMM with the join for the other (MINICOMP_LIBRARY_JOINS=0);
- `joins`: every GEMM whose result meets a tile through cuBLAS, whatever its size
  (MINICOMP_LIBRARY_JOINS=all);
- `session18`: session 18's default plan (`split`, every GEMM epilogue after its K loop);
- `all`: every GEMM through cuBLAS (MINICOMP_LIBRARY_GEMM=all);
- `backend`: `torch.compile(fn, backend=minicomp.backend())` with the defaults;
- `nocombo`, `combo`: sibling GEMMs sharing A (q, k, v) each a launch of its own
  (MINICOMP_GEMM_COMBO=0), or one launch at any size (=all; the default: where launch-bound);
- `noreuse`: every kernel output a new allocation (MINICOMP_REUSE_BUFFERS=0; codegen/buffers.py);
- `nopdl`: no programmatic dependent launch (MINICOMP_PDL=0; the default launches every Triton
  kernel with it on sm_90, codegen/pdl.py), so that the gaps between kernels can be compared;
- `auto`, `plain`, `overlap`: the default plan with the persistent GEMM's epilogue in each
  form (MINICOMP_GEMM_EPILOGUE, `target.gemm_epilogue_mode`).

Each variant's callable sets its switches around every call: minicomp's compile cache keys on
them, and a call under the defaults would compile the default plan again and time that (what
session 18's first run of this script did: every variant was the default plan). Wall times of
whole models move by more than plan changes of a few percent (host time sets the pace of
torch.compile's calls); the CUDA kernel time per call, host excluded, is the steadier figure.

A model may also be a workload of `benchmarks/run.py --list` (swiglu, llama_block) at its full
size, checked against eager in the run's tolerance.

    python3 benchmarks/ablations/library_choice.py [--models llama,qwen2,gpt2,bert]
        [--variants default,session18,all,backend] [--rounds 3] [--kernels 8] [--out DIR]
Prints one table (ms and speed over torch.compile per variant) and writes it to DIR/library-choice.md,
with each variant's `--kernels` costliest kernels (us per call) under it.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import measure, workloads_models  # noqa: E402

import minicomp  # noqa: E402

ENV = ("MINICOMP_DUAL_GEMM", "MINICOMP_LIBRARY_GEMM", "MINICOMP_GEMM_EPILOGUE", "MINICOMP_LIBRARY_JOINS",
       "MINICOMP_GEMM_COMBO", "MINICOMP_REUSE_BUFFERS", "MINICOMP_PDL")
EPILOGUES = ("auto", "plain", "overlap")


def variant_env(name: str) -> dict[str, str]:
    """The environment switches of one variant (module docstring)."""
    if name == "fused":
        return {"MINICOMP_DUAL_GEMM": "fused"}
    if name == "default":
        return {}
    if name == "split":
        return {"MINICOMP_LIBRARY_JOINS": "0"}
    if name == "joins":
        return {"MINICOMP_LIBRARY_JOINS": "all"}
    if name == "session18":
        return {"MINICOMP_LIBRARY_JOINS": "0", "MINICOMP_GEMM_EPILOGUE": "plain"}
    if name == "all":
        return {"MINICOMP_LIBRARY_GEMM": "all"}
    if name == "backend":
        return {}
    if name in EPILOGUES:
        return {"MINICOMP_GEMM_EPILOGUE": name}
    if name in ("nocombo", "combo"):
        return {"MINICOMP_GEMM_COMBO": "0" if name == "nocombo" else "all"}
    if name == "noreuse":
        return {"MINICOMP_REUSE_BUFFERS": "0"}
    if name == "nopdl":
        return {"MINICOMP_PDL": "0"}
    raise SystemExit(f"unknown variant {name!r}: default, fused, split, joins, session18, all, backend, nocombo, combo, "
                     "noreuse, nopdl, "
                     f"{', '.join(EPILOGUES)}")


@contextmanager
def switches(name: str):
    """The process's environment with the variant's switches, and only those, set."""
    saved = {k: os.environ.pop(k, None) for k in ENV}
    os.environ.update(variant_env(name))
    try:
        yield
    finally:
        for k in ENV:
            os.environ.pop(k, None)
            if saved[k] is not None:
                os.environ[k] = saved[k]


def compile_variant(fn, inputs, name: str):
    """`minicomp.compile(fn)` compiled under the variant's switches, as a callable that sets them
    again around every call: minicomp's compile cache keys on them (api._modes), so a call under
    other switches would compile the other plan and time that instead."""
    with switches(name):
        f = torch.compile(fn, backend=minicomp.backend()) if name == "backend" else minicomp.compile(fn)
        with torch.no_grad():
            f(*inputs)
        measure.sync(inputs[0].device.type)
    compiles = getattr(f, "compiles", None)

    def call(*args):
        with switches(name):
            return f(*args)
    call.compiles = lambda: (getattr(f, "compiles", None), compiles)     # (now, after the first call)
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama,qwen2,gpt2,bert")
    p.add_argument("--variants", default="default,session18,all,backend")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kernels", type=int, default=8, help="costliest kernels listed per variant")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run of the script at tiny sizes in fp32 (the switches do nothing there)")
    args = p.parse_args()
    cpu = args.device == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    variants = args.variants.split(",")
    for v in variants:
        variant_env(v)
    device = "CPU" if cpu else f"GPU {torch.cuda.get_device_name()}"
    lines = [f"{device}, PyTorch {torch.__version__}, {dtype}; do_bench medians, "
             f"{args.rounds} interleaved rounds; speed = torch.compile ms / variant ms; "
             "each cell: wall ms (speed) / CUDA kernel us per call (host excluded, profiler)",
             "", "| model | torch.compile | " + " | ".join(variants) + " |",
             "|---|---|" + "---|" * len(variants)]
    notes = []
    for family in args.models.split(","):
        _, built = workloads_models.build_named(family, args.device, dtype, tiny=cpu)
        fn, inputs = built.fn, built.inputs
        wide = None if cpu or built.wide is None else built.wide()
        with torch.no_grad():
            want = fn(*inputs)
            fns = {"torch.compile": torch.compile(fn)}
            fns["torch.compile"](*inputs)
            measure.sync(args.device)
            for v in variants:
                try:
                    fns[v] = compile_variant(fn, inputs, v)
                except Exception as e:         # one variant failing still leaves the others' figures
                    print(f"{family} {v}: {measure.error_text(e)}", flush=True)
            for name, f in fns.items():
                check = measure.compare(f(*inputs), want, measure.TOLERANCES[str(dtype).removeprefix("torch.")], wide=wide)
                if not check.get("ok", False):
                    print(f"{family} {name}: does not match eager: {check}", flush=True)
            timing = SimpleNamespace(device=args.device, warmup_ms=25.0, rep_ms=100.0, reps=10)
            times = measure.time_interleaved({k: (lambda f=f: f(*inputs)) for k, f in fns.items()}, timing, args.rounds)
            per_kernel = {k: {} for k in fns}
            kernels = {k: (None if cpu else measure.kernel_us(lambda f=f: f(*inputs), by_kernel=per_kernel[k]))
                       for k, f in fns.items()}
        for v in variants:           # a variant compiled again under other switches would time another plan
            counts = fns[v].compiles() if v in fns else (None, None)
            if counts[0] != counts[1]:
                print(f"{family} {v}: compiled {counts[1]} then {counts[0]} times: not one plan", flush=True)
        ms = {k: t.get("ms") for k, t in times.items()}
        tc = ms["torch.compile"]

        def cell(k: str) -> str:
            if not ms.get(k):
                return "—"
            speed = "" if k == "torch.compile" else f" ({tc / ms[k]:.3f}x)"
            return f"{ms[k]:.3f}{speed}" + (f" / {kernels[k]:.0f}" if kernels.get(k) else "")
        lines.append(f"| {family} | {cell('torch.compile')} | " + " | ".join(cell(v) for v in variants) + " |")
        print(lines[-1], flush=True)
        for k, table in per_kernel.items():
            top = sorted(table.items(), key=lambda kv: -kv[1])[:args.kernels]
            if top:
                notes.append(f"- {family} {k}: " + "; ".join(f"{n[:48]} {us:.1f}" for n, us in top))
        del fns, built, wide
        if not cpu:
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n" + ("\nCostliest kernels, us per call:\n\n" + "\n".join(notes) + "\n" if notes else "")
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "library-choice.md").write_text(text)


if __name__ == "__main__":
    main()

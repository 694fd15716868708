"""Ablations for the memory-bound and attention kernels: what each code-shape choice costs.

`benchmarks/run.py` says how fast minicomp is; this script says *why*, by timing hand-written
variants of the kernels minicomp generates, one knob at a time, on the anchor shapes of
`shared/ceilings.md`. Its findings are what the emitters' choices rest on (see the comments in
`minicomp/codegen/reduction.py`, `pointwise.py` and `attention.py`, and BENCHMARKS.md).

Knobs:
- row reductions (softmax, layernorm over 16384x4096 bf16): masked vs mask-free columns,
  divide vs multiply by a per-row reciprocal, one program per row block vs a persistent grid
  (weights loaded once per program), BLOCK_R and num_warps;
- pointwise (`gelu_tanh(x*w+b)` over 8192x8192): block size and warps, the tanh form vs the
  sigmoid form of gelu with an IEEE or an approximate division, 1-D vs 2-D tiles;
- attention (B4 H32 S4096 d128, causal): the autotuning space of minicomp's own kernel;
- a plain Triton copy of each shape: what any kernel of that shape can reach;
- later sweeps: nn.Linear configs and hand-written TMA GEMMs (`linear`, `gemm_tma`), attention
  kernel variants (`attn_var`: TMA K/V, warp specialisation, lazy rescaling), text edits of
  the generated pointwise kernel (`pw_var`, `pw_kernel`), row reductions with the weights
  loaded first (`norm_var`), per-call host time (`overhead`) and timings with the host's time
  hidden (`hidden`).

Every variant is checked against eager PyTorch before it is timed (harness.py);
the sweeps are in memory.py and matmul.py. CUDA only:
    python3 benchmarks/ablations/run.py --out DIR [--only softmax,layernorm,pointwise,attention]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ablations import matmul as MM  # noqa: E402
from benchmarks.ablations import memory as MEM  # noqa: E402
from benchmarks.ablations.harness import ATTN_CONFIGS, ATTN_VARIANTS, DEADLINE, Results, sm_count  # noqa: E402

SWEEPS = {"copy": MEM.sweep_copy, "softmax": MEM.sweep_softmax, "layernorm": MEM.sweep_layernorm,
          "pointwise": MEM.sweep_pointwise, "attention": MM.sweep_attention,
          "linear": MM.sweep_linear, "attn_var": MM.sweep_attention_variants, "gemm_tma": MM.sweep_gemm_tma,
          "pw_var": MEM.sweep_pointwise_variants,
          "overhead": MEM.sweep_overhead, "hidden": MEM.sweep_host_hidden,
          "pw_kernel": MEM.sweep_pointwise_kernel, "norm_var": MEM.sweep_norm_variants}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--only", default="softmax,layernorm,pointwise,attention,linear,overhead,copy")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no variant after this many seconds")
    p.add_argument("--attn-variants", help="comma-separated attention variants for attn_var (default: all)")
    p.add_argument("--attn-configs", help="attention configs for attn_var, 'BLOCK_M,BLOCK_N,stages,warps' joined "
                   "by ';' (default: five of the autotuner's)")
    args = p.parse_args()
    if args.attn_configs:
        ATTN_CONFIGS[0] = [tuple(int(x) for x in c.split(",")) for c in args.attn_configs.split(";")]
    ATTN_VARIANTS[0] = set(args.attn_variants.split(",")) if args.attn_variants else None
    DEADLINE[0] = time.perf_counter() + args.budget_s
    if not torch.cuda.is_available():
        print("ablations need a CUDA device")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    res = Results(args.out)
    res.add("env", f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__} "
            f"SMs {sm_count()}", None)
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            SWEEPS[name](res)
        except Exception:
            traceback.print_exc()
        print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

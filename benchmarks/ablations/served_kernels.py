"""Which kernels serve a workload once its background compiles are over, with eager answering the
first calls (the default) and without (MINICOMP_EAGER_FIRST=0), and how fast each is.

    python benchmarks/ablations/served_kernels.py [--variants default,off] NAME [NAME ...]

For each workload and variant a fresh child process builds the workload (benchmarks/workloads.py,
bf16 on CUDA), calls `minicomp.compile(fn)` once, waits for `minicomp.wait_compiled()`, calls
again and checks that answer against eager (the benchmarks' tolerance) before anything is
timed. It then prints the state of every background compile (runtime/background.py: "done"
means call() launches the kernel; anything else means eager still answers), the CUDA kernels
one profiled call launches, and `triton.testing.do_bench` of the compiled call and of eager.

Session 27 (H100, the suite's attention, B4 H32 S4096 d128 causal): the Gluon kernel is "done"
and the only kernel launched in both variants. With eager first and without: 0.941 and 0.986 ms
on one machine, 1.009 and 0.981 on another, SDPA 1.018-1.049 beside them. The same kernel moves
by ~7% between processes, about the gap between run.py's runs of it (0.929 ms at 149b5cb, 1.035
and 1.038 in session 27), and eager first is not what moves it.
Needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = {"default": {}, "off": {"MINICOMP_EAGER_FIRST": "0"}}


def child(name: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    import minicomp
    from benchmarks.workloads import WORKLOADS
    from minicomp.runtime import background

    built = WORKLOADS[name].build("cuda", torch.bfloat16, False)
    f = minicomp.compile(built.fn)
    f(*built.inputs)
    print("wait_compiled:", minicomp.wait_compiled(600))
    got, want = f(*built.inputs), built.fn(*built.inputs)
    for g, w in zip(*(o if isinstance(o, (list, tuple)) else [o] for o in (got, want))):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)
    print("check: ok")
    print("background:", {background._kernel_name(k): s for k, s in background._BACKGROUND.items()})
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        f(*built.inputs)
        torch.cuda.synchronize()
    print("kernels:", sorted({e.name[:72] for e in p.events() if e.device_type.name == "CUDA"}))
    ours = do_bench(lambda: f(*built.inputs), warmup=25, rep=100)
    eager = do_bench(lambda: built.fn(*built.inputs), warmup=25, rep=100)
    print(f"minicomp {ours:.4f} ms, eager {eager:.4f} ms, minicomp/eager {ours / eager:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--variants", default="default,off")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    for name in args.names:
        for variant in args.variants.split(","):
            env = {**os.environ, **VARIANTS[variant]}
            print(f"== {name}, {variant}", flush=True)
            subprocess.run([sys.executable, __file__, "--child", name], env=env, check=False, timeout=300)


if __name__ == "__main__":
    main()

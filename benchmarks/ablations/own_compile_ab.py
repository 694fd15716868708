"""minicomp's own compile time (capture to loaded module, warm process) of the two block samples
with the Hopper attention kernel on and off, three times each, and where it goes.

    python3 benchmarks/ablations/own_compile_ab.py
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    import minicomp
    from minicomp import api
    from minicomp.codegen import generate
    from minicomp.frontend.fx import call_inputs, capture
    from minicomp.plan import assign_layout, plan_graph
    from minicomp.runtime import load
    minicomp.compile(lambda x: x * 2.0 + 1.0).compile_for(torch.ones(4, 8, device="cuda"))
    for name in ("gpt_block", "llama_block"):
        m = importlib.import_module(f"samples.{name}")
        model, inputs = m.build(device="cuda", dtype=torch.bfloat16, **m.BENCH_SIZES)
        for env in ("", "0", "", "0", "", "0"):
            os.environ["MINICOMP_HOPPER_ATTENTION"] = env
            t0 = time.perf_counter()
            g = capture(model, inputs)
            api.set_input_layouts(g, call_inputs(g, inputs))   # arguments, then the weights
            t1 = time.perf_counter()
            g2, _ = api.optimise(g, api.Options())
            plan = plan_graph(g2, api.Options().machine, baseline=g)
            g2 = assign_layout(g2, plan)
            t2 = time.perf_counter()
            gen = generate(g2, plan, "cuda")
            t3 = time.perf_counter()
            load(gen, inputs[0].device)
            t4 = time.perf_counter()
            t5 = time.perf_counter()
            minicomp.compile(model).compile_for(*inputs)
            t6 = time.perf_counter()
            print(f"{name:12s} hopper={'off' if env == '0' else 'on ':3s} capture {t1 - t0:.3f} passes+plan "
                  f"{t2 - t1:.3f} generate {t3 - t2:.3f} load {t4 - t3:.3f} | compile_for {t6 - t5:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

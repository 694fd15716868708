"""The Gluon attention prototypes (benchmarks/prototypes/) compile for sm_90 without a GPU and
keep their MMAs in flight."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


_COMPILE_GLUON_FOR_SM90 = """
import importlib
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
module, kernel, out = sys.argv[1:4]
fn = getattr(importlib.import_module(module), kernel)
consts = {"ROWS": 2 * 4 * 1024, "S": 1024, "D": 128, "BM": 64, "BN": 64, "STAGES": 3}
if kernel == "attn_fwd_ws":
    consts.update(LOADER_REGS=24, CONSUMER_REGS=240)
if kernel == "attn_fwd_pp":   # 64-row consumers and 128-key blocks are fixed there
    consts = {"ROWS": 2 * 4 * 1024, "S": 1024, "D": 128, "STAGES": 2}
sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "qk_scale": "fp32",
       **{name: "constexpr" for name in consts}}
src = GluonASTSource(fn, sig, attrs={(i,): [["tt.divisibility", 16]] for i in range(4)}, constexprs=consts)
with open(out, "w") as f:
    f.write(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
print(get_ptxas(90).path)
"""


@pytest.mark.parametrize("module,kernel", [("benchmarks.prototypes.gluon_attention", "attn_fwd"),
                                           ("benchmarks.prototypes.gluon_attention_ws", "attn_fwd_ws"),
                                           ("benchmarks.prototypes.gluon_attention_pp", "attn_fwd_pp")])
def test_gluon_attention_prototype_keeps_its_mmas_in_flight_on_sm90(tmp_path, module, kernel):
    """The Gluon attention prototypes compiled for sm_90 without a GPU (in a process without
    Triton's interpreter): two wgmma groups stay in flight around the softmax
    (`wgmma.wait_group 1`), and ptxas keeps the wgmma pipeline. ptxas serialises every wgmma
    of a kernel (warnings C7511-C7514) when a loop carries an accumulator it must copy, which
    made the first version of this kernel 50% slower on the H200."""
    import re

    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this Triton has no Gluon for Hopper")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    ptx_path = tmp_path / "attn.ptx"
    made = subprocess.run([sys.executable, "-c", _COMPILE_GLUON_FOR_SM90, module, kernel, str(ptx_path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    ptx = ptx_path.read_text()
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    ptxas = made.stdout.strip().splitlines()[-1]
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx_path), "-o", str(tmp_path / "attn.cubin")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not re.search(r"C751\d", out.stderr), out.stderr

"""The benchmark suite's own tests: it runs end to end on the CPU (Triton interpreter, tiny
shapes) and writes the records the GPU run is read from; its report logic (checks, ratios,
targets) is right. (minicomp's tests, in tests/, import nothing of benchmarks/.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.measure import TOLERANCES, compare  # noqa: E402
from benchmarks.workloads import WORKLOADS, match_sizes  # noqa: E402


def test_cpu_quick_run_writes_records(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1",
               MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--device", "cpu", "--quick",
           "--only", "pointwise,add_rmsnorm", "--reps", "2", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    rec = json.loads((tmp_path / "bench.json").read_text())
    env_rec = rec["environment"]
    for key in ("date", "torch", "triton", "cuda", "gpu", "device", "dtype", "timing", "tolerance"):
        assert key in env_rec, key
    assert env_rec["timing"]["min_reps"] == 2 and env_rec["tolerance"]["atol"] == 2e-2
    assert rec["ceilings"]["copy"]["gbps"] > 0 and rec["ceilings"]["matmul"]["tflops"] > 0
    assert [w["name"] for w in rec["workloads"]] == ["pointwise", "add_rmsnorm"]
    for w in rec["workloads"]:
        assert not w["errors"], w["errors"]
        mc = w["backends"]["minicomp"]
        assert mc["check"]["ok"], mc["check"]
        assert mc["ms"] > 0 and w["backends"]["eager"]["ms"] > 0
        assert mc["ledger"]["bytes"] > 0 and mc["compile_for_s"] > 0
        assert w["derived"]["source"] == "minicomp ledger"
        assert w["derived"]["minicomp_over_eager"] > 0
        assert w["compile_time"]["minicomp"]["first_call_s"] > 0, w["compile_time"]
    assert "geomean_speedup_vs_compile" in rec["summary"]
    md = (tmp_path / "bench.md").read_text()
    assert "| pointwise |" in md and "| add_rmsnorm |" in md and "## Compile time" in md


def test_compare_reports_wrong_values_and_dtypes():
    ref = torch.randn(7, 33, dtype=torch.bfloat16)
    tol = TOLERANCES["bfloat16"]
    assert compare((ref.clone(), ref), (ref, ref), tol)["ok"]
    wrong = ref.clone()
    wrong[3, 5] += 4
    rec = compare(wrong, ref, tol)
    assert not rec["ok"] and rec["max_abs"] >= 3.9 and 0 < rec["mismatch_frac"] < 0.01
    assert not compare(ref.float(), ref, tol)["ok"]            # dtype differs from eager's
    assert not compare((ref,), (ref, ref), tol)["ok"]          # an output missing


def _workload(name, kind, ms, ok=True, ledger=None):
    backends = {b: {"ms": t, "check": {"ok": ok if b == "minicomp" else True}} for b, t in ms.items()}
    if ledger:
        backends["minicomp"]["ledger"] = ledger
    return {"name": name, "kind": kind, "backends": backends, "errors": {}, "io_bytes": 4_000_000,
            "analytic_flops": 0}


def test_summary_ratios_targets_and_geomean():
    ceilings = {"copy": {"gbps": 4000.0}, "matmul": {"tflops": 700.0}}
    mem = _workload("m", "memory", {"eager": 4.0, "inductor": 1.0, "minicomp": 0.5},
                    ledger={"bytes": 1_900_000_000, "flops": 0})
    gemm = _workload("g", "gemm", {"eager": 2.0, "inductor": 1.0, "minicomp": 2.0},
                     ledger={"bytes": 10**8, "flops": 10**12})
    wrong = _workload("w", "memory", {"eager": 1.0, "inductor": 1.0, "minicomp": 0.01}, ok=False)
    rec = {"ceilings": ceilings, "workloads": [mem, gemm, wrong]}
    s = report.summarize(rec)
    # 1.9 GB in 0.5 ms = 3800 GB/s = 95% of copy: memory target met; GEMM at half speed is not.
    assert mem["derived"]["per_backend"]["minicomp"]["pct_of_ceiling"] == pytest.approx(0.95)
    assert s["targets_met"] == {"m": True, "g": False, "w": False}
    assert gemm["derived"]["bound"] == "compute"
    # The wrong result's 100x speed-up is not counted: geomean of 2.0 and 0.5.
    assert s["geomean_over"] == 2 and s["geomean_speedup_vs_compile"] == pytest.approx(1.0)
    assert "FAIL" in report.markdown(rec)


def test_sample_sizes_are_matched_by_alias():
    def build(device="cpu", dtype=torch.float32, batch=1, seq_len=8, dim=16, n_heads=2):
        pass
    kwargs, missing = match_sizes(build, dict(batch=8, seq=1024, width=2048, heads=16, kv_heads=4))
    assert kwargs == dict(batch=8, seq_len=1024, dim=2048, n_heads=16) and missing == ["kv_heads"]


def test_workloads_build_tiny_and_run_eagerly():
    for name in ("pointwise", "softmax", "add_rmsnorm", "layernorm", "gemm_bias_gelu", "swiglu", "attention"):
        built = WORKLOADS[name].build("cpu", torch.bfloat16, tiny=True)
        outs = built.fn(*built.inputs)
        for t in (outs if isinstance(outs, tuple) else (outs,)):
            assert t.dtype == torch.bfloat16 and torch.isfinite(t).all(), name
    built = WORKLOADS["attention"].build("cpu", torch.float32, tiny=True)
    torch.testing.assert_close(built.fn(*built.inputs), built.reference[1](*built.inputs))


def test_a_wrong_answer_after_timing_fails_the_check(monkeypatch):
    """The first call is checked before timing; a backend whose later calls go wrong (another
    launch path) is caught by the check made after timing."""
    import argparse

    from benchmarks import backends
    from benchmarks.workloads import Built

    x = torch.randn(8, 16)
    calls = []

    def flaky(t):
        calls.append(1)
        return t * 2 if len(calls) == 1 else t * 2 + 1   # right once, wrong after

    monkeypatch.setattr(backends, "make_backend", lambda name, built: flaky)
    built = Built(fn=lambda t: t * 2, inputs=[x], shapes="8x16", sizes={})
    args = argparse.Namespace(device="cpu", reps=2, warmup_ms=1.0, rep_ms=1.0)
    rec = backends.run_backend("eager", built, x * 2, args, TOLERANCES["float32"])
    assert not rec["check"]["ok"] and rec["check"]["error"].startswith("after timing:")
    assert rec["check_after_timing"]["ok"] is False and len(calls) > 2


def test_backends_are_timed_in_rounds_that_take_turns():
    """time_interleaved times every function in every round, starting with a different one each
    round, and pools the rounds' runs: a clock drift during the run falls on all backends."""
    import argparse

    from benchmarks.measure import time_interleaved

    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    args = argparse.Namespace(device="cpu", reps=6, warmup_ms=1.0, rep_ms=1.0)
    out = time_interleaved(fns, args, rounds=3)
    assert order[:3] == ["a", "b", "c"]                       # the untimed first calls
    timed = order[3:]
    per_round = len(timed) // 3
    assert per_round == 3 * 2                                 # 6 runs each, 2 per round
    starts = [timed[i * per_round] for i in range(3)]
    assert starts == ["a", "b", "c"]                          # each round starts with the next one
    for name in fns:
        rec = out[name]
        assert rec["n"] == 6 and rec["rounds"] == 3 and len(rec["rounds_ms"]) == 3
        assert rec["p20_ms"] <= rec["ms"] <= rec["p80_ms"]
        assert "3 rounds taking turns" in rec["method"]


def test_model_workloads_build_tiny_and_run_eagerly():
    for name in ("llama_model", "qwen2_model", "gpt2_model", "bert_model"):
        w = WORKLOADS[name]
        assert w.full["batch"] == 4 and w.full["seq"] == 512 and "minicomp_dynamo" in w.extra_backends
        built = w.build("cpu", torch.bfloat16, tiny=True)
        out = built.fn(*built.inputs)
        assert out.dtype == torch.bfloat16 and out.shape[:2] == (1, 8) and torch.isfinite(out).all(), name
        assert not any(p.requires_grad for p in built.fn.parameters()), name


def test_a_model_workload_is_timed_through_both_minicomp_entry_points(tmp_path):
    """GPT-2 (tiny) through eager, minicomp.compile (also with library="all") and
    torch.compile(backend="minicomp"), each checked against eager before timing."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1",
               MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--device", "cpu", "--only", "gpt2_model",
           "--reps", "1", "--compile-time", "none", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((tmp_path / "bench.json").read_text())
    (w,) = rec["workloads"]
    assert not w["errors"], w["errors"]
    for backend in ("eager", "minicomp", "minicomp_dynamo", "minicomp_cublas"):
        assert w["backends"][backend]["check"]["ok"], (backend, w["backends"][backend]["check"])
        assert w["backends"][backend]["ms"] > 0
    assert 'torch.compile(backend="minicomp")' in (tmp_path / "bench.md").read_text()
    assert 'minicomp.compile(fn, library="all")' in (tmp_path / "bench.md").read_text()


def test_kernel_times_go_into_the_records_and_one_note(monkeypatch):
    """On CUDA a block or GEMM workload's backends also get their CUDA kernel time per call (host
    excluded): recorded per backend and compared in a note; a backend whose profile fails gets
    a note, not an error; a GEMM workload's note lists each kernel too. (The profiler itself
    needs CUDA: stood in for here.)"""
    from benchmarks import run
    times = {"inductor": 1876.0, "minicomp": 1778.0}

    def fake(call, by_kernel=None):
        us = call()
        if by_kernel is not None:
            by_kernel.update({"nvjet_gemm": us - 60.0, "pointwise": 60.0})
        return us
    monkeypatch.setattr(run, "kernel_us", fake)

    def broken():
        raise RuntimeError("no CUPTI")
    rec = {"backends": {"inductor": {}, "minicomp": {}, "eager": {}}, "notes": []}
    calls = {"inductor": lambda: times["inductor"], "minicomp": lambda: times["minicomp"], "eager": broken,
             "gone": lambda: 1.0}
    run._kernel_times(rec, calls, lambda: 5.0)
    assert rec["backends"]["inductor"]["kernel_us"] == 1876.0 and rec["backends"]["minicomp"]["kernel_us"] == 1778.0
    assert "kernel_us" not in rec["backends"]["eager"] and "gone" not in rec["backends"]
    assert rec["notes"][0].startswith("kernel time of eager not measured: RuntimeError: no CUPTI")
    assert rec["notes"][1] == ("CUDA kernel time per call, host excluded (us): inductor 1876, minicomp 1778; "
                               "torch.compile / minicomp 1.055")
    # a GEMM workload's records also list each backend's kernels, costliest first
    rec = {"backends": {"inductor": {}, "minicomp": {}}, "notes": []}
    run._kernel_times(rec, {k: calls[k] for k in ("inductor", "minicomp")}, lambda: 5.0, by_kernel=True)
    assert rec["notes"] == ["inductor's kernels (us per call): nvjet_gemm 1816.0; pointwise 60.0",
                            "minicomp's kernels (us per call): nvjet_gemm 1718.0; pointwise 60.0",
                            "CUDA kernel time per call, host excluded (us): inductor 1876, minicomp 1778; "
                            "torch.compile / minicomp 1.055"]


def test_a_workload_the_budget_left_out_reads_skipped_not_error():
    skipped = {"name": "s", "kind": "block", "backends": {}, "notes": [],
               "errors": {"build": {"error": "skipped: over the run's budget of 50 s"}}}
    broken = {"name": "b", "kind": "block", "backends": {}, "notes": [],
              "errors": {"build": {"error": "RuntimeError: no such model"}}}
    assert report._check_cell(skipped) == "skipped"
    assert report._check_cell(broken) == "build error"

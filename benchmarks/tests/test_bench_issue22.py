"""Issue 22's workloads in the suite: each builds, is checked against eager and reported at tiny
sizes on the CPU; `--only` takes groups and comma lists; the TF32 switch is set for every
backend and restored; the reduce-overhead mode is feature-detected; the report's targets pick
the right baseline and keep these workloads out of the suite's geometric mean."""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import minicomp  # noqa: F401  (first: on the CPU it turns Triton's interpreter on before transformers imports triton)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import backends, report, run  # noqa: E402
from benchmarks.measure import TOLERANCES  # noqa: E402
from benchmarks.workloads import GROUPS, WORKLOADS, Built  # noqa: E402

ISSUE22 = [n for n, w in WORKLOADS.items() if w.group]
# The end-to-end run takes one workload of each group, each chosen for what the test asserts of
# it (fp32 with TF32 off; an SDPA-best target and the reduce-overhead mode; the sweep's
# report row; a transformers model at batch 1): the whole of --only issue22 (21 workloads,
# several minutes under the interpreter) with MINICOMP_BENCH_TESTS=all.
ONE_PER_GROUP = {"weak": "gemm_fp32_2048_ieee", "decode": "decode_attn_gqa_kv4096",
                 "blocks_sweep": "gpt_block_small", "small_batch": "gpt2_b1x16"}
ALL = os.environ.get("MINICOMP_BENCH_TESTS", "") == "all"


@pytest.mark.parametrize("name", ISSUE22 + ["gpt_block", "llama_block"])
def test_every_issue22_workload_builds_at_tiny_size_and_its_baselines_agree_with_it(name):
    """What the end-to-end run below checks of the workloads it leaves out: each builds at its
    tiny size, runs, and every extra baseline (the SDPA backends) computes what it computes."""
    built = WORKLOADS[name].build("cpu", torch.float32, tiny=True)
    out = built.fn(*built.inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    assert outs and all(torch.isfinite(o).all() for o in outs if isinstance(o, torch.Tensor)), name
    dtype = str(outs[0].dtype).removeprefix("torch.")
    for label, fn in built.baselines():
        torch.testing.assert_close(fn(*built.inputs), out, **TOLERANCES[dtype], msg=f"{name}: {label}")


def test_one_issue22_workload_per_group_builds_checks_and_reports_on_the_cpu(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONUNBUFFERED="1", MINICOMP_CACHE_DIR=str(tmp_path / "cache"))
    only = "issue22" if ALL else ",".join(ONE_PER_GROUP.values())
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--device", "cpu", "--reps", "1",
           "--only", only, "--compile-time", "none", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400 if ALL else 200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((tmp_path / "bench.json").read_text())
    got = [w["name"] for w in rec["workloads"]]
    if ALL:
        assert set(ISSUE22) <= set(got) and {"gpt_block", "llama_block"} <= set(got)   # the sweep's third size
    else:
        assert got == list(ONE_PER_GROUP.values())
        assert {WORKLOADS[n].group for n in got} == set(ONE_PER_GROUP) == {WORKLOADS[n].group for n in ISSUE22}
    md = (tmp_path / "bench.md").read_text()
    assert "## Issue 22's workloads" in md
    sweep_row = next(line for line in md.splitlines() if line.startswith("| gpt_block_small |"))
    assert "not in the geometric mean" in sweep_row
    for w in rec["workloads"]:
        assert not w["errors"], (w["name"], w["errors"])
        for name, b in w["backends"].items():
            assert b["check"]["ok"] and b["ms"] > 0, (w["name"], name, b["check"])
        assert "minicomp" in w["backends"] and "eager" in w["backends"], w["name"]
        if w["name"] not in ISSUE22:
            continue
        assert f"| {w['name']} | {w['group']} |" in md
        assert not w["geomean"]
        d = w["derived"]
        assert d["ceiling"]["ms"] > 0 and d["ceiling"]["bytes"] == w["io_bytes"], w["name"]
        if w["group"] != "blocks_sweep":
            # On the CPU there is no torch.compile column, so only the SDPA targets have a speed.
            assert d["target"]["what"] == w["target"]["what"]
            if w["target"]["baseline"] == "sdpa_best":
                assert {"sdpa_flash", "sdpa_math"} <= set(w["backends"]), w["name"]
                assert d["sdpa_best"]["ms"] == min(w["backends"][b]["ms"] for b in ("sdpa_flash", "sdpa_math"))
                assert d["target"]["speed"] == pytest.approx(d["sdpa_best"]["ms"] / w["backends"]["minicomp"]["ms"])
        if w["group"] in ("decode", "small_batch"):
            # minicomp's reduce-overhead mode: run and checked, or refused by the API ("n/a").
            assert ("minicomp_ro" in w["backends"]) != ("minicomp_ro" in w.get("not_applicable", {})), w["name"]
    assert rec["workloads"][[w["name"] for w in rec["workloads"]].index("gemm_fp32_2048_ieee")]["dtype"] == "float32"
    assert rec["summary"]["geomean_over"] == 0            # none of these counts in the suite's mean


def test_only_takes_group_names_and_comma_lists():
    def names(only):
        return run.select(argparse.Namespace(only=only, quick=False, device="cpu"))
    assert names("weak") == GROUPS["weak"] and len(GROUPS["weak"]) == 7
    assert names("decode") == ["decode_attn_kv4096", "decode_attn_kv32768", "decode_attn_gqa_kv4096",
                               "decode_attn_gqa_kv32768"]
    assert names("small_batch") == ["llama_b1x16", "qwen2_b1x16", "gpt2_b1x16", "bert_b1x16"]
    assert names("blocks_sweep") == ["gpt_block_small", "gpt_block_medium", "gpt_block",
                                     "llama_block_small", "llama_block_medium", "llama_block"]
    assert names("softmax, decode_attn_kv4096,softmax,weak")[:3] == ["softmax", "decode_attn_kv4096", "sum0_65536x4096"]
    assert set(names("issue22")) == set(ISSUE22) | {"gpt_block", "llama_block"} and len(ISSUE22) == 7 + 4 + 4 + 4
    assert "bert_model" in names("models") and "pointwise" in names("suite") and "sum0_65536x4096" not in names("suite")
    with pytest.raises(SystemExit, match="unknown workload.*nope.*groups: "):
        names("weak,nope")


def test_decode_attention_as_transformers_writes_it_is_sdpa_with_gqa():
    """The timed function (repeat_kv by expand + reshape, then SDPA) and the SDPA baselines
    (enable_gqa=True) compute the same thing, so timing one against the other is fair."""
    built = WORKLOADS["decode_attn_kv32768"].build("cpu", torch.float32, tiny=True)
    q, k, v = built.inputs
    assert q.shape[2] == 1 and q.shape[1] == 2 * k.shape[1]
    out = built.fn(*built.inputs)
    gqa = WORKLOADS["decode_attn_gqa_kv32768"].build("cpu", torch.float32, tiny=True)
    assert all(torch.equal(a, b) for a, b in zip(gqa.inputs, built.inputs))
    torch.testing.assert_close(gqa.fn(*gqa.inputs), out, **TOLERANCES["float32"])
    for name, fn in built.baselines():
        torch.testing.assert_close(fn(*built.inputs), out, **TOLERANCES["float32"], msg=name)
    # An independent computation: each query head against its KV group, by hand.
    kk = k.repeat_interleave(2, dim=1)
    vv = v.repeat_interleave(2, dim=1)
    p = torch.softmax(q @ kk.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    torch.testing.assert_close(out, p @ vv, **TOLERANCES["float32"])


def test_weak_shapes_are_the_issues_at_full_size():
    full = {n: WORKLOADS[n].full for n in GROUPS["weak"]}
    assert full["sum0_65536x4096"] == dict(M=65536, N=4096) and full["gemm_k4095"]["K"] == 4095
    assert full["sdpa_causal_d96"]["d"] == 96 and full["sdpa_causal_d96"]["S"] == 1000
    assert full["logsumexp_151936"]["N"] == 151936 and full["lm_head_50257"]["N"] == 50257
    assert full["softmax_50257"]["N"] == 50257 and WORKLOADS["gemm_fp32_2048_ieee"].dtype == "float32"
    for n in GROUPS["small_batch"]:
        assert (WORKLOADS[n].full["batch"], WORKLOADS[n].full["seq"]) == (1, 16)
        assert {"inductor_ro", "minicomp_ro"} <= set(WORKLOADS[n].extra_backends)


def _args(**kw):
    base = dict(device="cpu", reps=1, warmup_ms=1.0, rep_ms=1.0, rounds=1, step_timeout_s=60.0,
                dtype="fp32", backends=["eager", "minicomp"], tiny=True)
    return argparse.Namespace(**{**base, **kw})


def test_tf32_switch_is_off_for_every_backend_and_restored(monkeypatch):
    """Every backend of gemm_fp32_2048_ieee is made (compiled) and called with allow_tf32 off;
    the caller's setting is back afterwards."""
    real, seen = backends.make_backend, []

    def probing(name, built):
        seen.append((name, "make", torch.backends.cuda.matmul.allow_tf32))
        fn = real(name, built)

        def call(*a):
            seen.append((name, "call", torch.backends.cuda.matmul.allow_tf32))
            return fn(*a)
        call.compile_for = getattr(fn, "compile_for", None)
        return call

    monkeypatch.setattr(backends, "make_backend", probing)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        rec = run.run_workload(WORKLOADS["gemm_fp32_2048_ieee"], _args(dtype="bf16"), time.perf_counter() + 120)
        assert torch.backends.cuda.matmul.allow_tf32 is True          # restored
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert not rec["errors"] and rec["dtype"] == "float32" and rec["backends"]["minicomp"]["check"]["ok"]
    assert {(n, what) for n, what, _ in seen} == {(n, w) for n in ("eager", "minicomp") for w in ("make", "call")}
    assert not any(flag for _, _, flag in seen), seen


def test_a_failing_minicomp_path_is_reported_and_the_rest_runs(monkeypatch):
    real = backends.make_backend

    def broken(name, built):
        if name == "minicomp":
            raise RuntimeError("simulated compile failure")
        return real(name, built)

    monkeypatch.setattr(backends, "make_backend", broken)
    rec = run.run_workload(WORKLOADS["softmax_50257"], _args(dtype="bf16"), time.perf_counter() + 120)
    assert rec["errors"]["minicomp"]["error"] == "RuntimeError: simulated compile failure"
    assert rec["backends"]["eager"]["ms"] > 0 and "minicomp" not in rec["backends"]
    record = {"ceilings": {"copy": {"gbps": 10.0}, "matmul": {"tflops": 1.0}}, "workloads": [rec]}
    md = report.markdown({**record, "summary": report.summarize(record)})
    assert "| softmax_50257 | weak |" in md and "simulated compile failure" in md
    assert rec["derived"]["target"]["why"] == "minicomp did not run"


def test_reduce_overhead_mode_is_feature_detected(monkeypatch):
    import minicomp
    from minicomp.errors import UsageError

    def refuse(exc):
        def compile(fn, **options):
            if "mode" in options:
                raise exc
            return fn
        return compile

    for exc in (TypeError("unexpected keyword 'mode'"), ValueError("mode needs CUDA"), UsageError("no mode")):
        monkeypatch.setattr(minicomp, "compile", refuse(exc))
        with pytest.raises(backends.NotApplicable, match="reduce-overhead"):
            backends.make_backend("minicomp_ro", Built(lambda x: x, [], "", {}))
    monkeypatch.setattr(minicomp, "compile", refuse(RuntimeError("capture failed")))
    with pytest.raises(RuntimeError, match="capture failed"):          # a real failure stays an error
        backends.make_backend("minicomp_ro", Built(lambda x: x, [], "", {}))
    monkeypatch.setattr(minicomp, "compile", lambda fn, **options: ("compiled", options))
    assert backends.make_backend("minicomp_ro", Built(lambda x: x, [], "", {}))[1] == {"mode": "reduce-overhead"}


def test_issue22_workloads_get_no_fresh_process_runs(monkeypatch):
    from benchmarks import compile_runs
    started = []
    monkeypatch.setattr(compile_runs, "fresh_process_first_call",
                        lambda name, backend, args, timeout: started.append((name, backend)) or {"first_call_s": 1.0})
    record = {"workloads": [{"name": n, "backends": {"minicomp": {}, "inductor": {}}}
                            for n in ("softmax", "softmax_50257", "llama_b1x16")]}
    args = argparse.Namespace(compile_time="all", compile_jobs=1, budget_s=1000.0)
    compile_runs.compile_time_runs([w["name"] for w in record["workloads"]], args, record, time.perf_counter(),
                                   lambda: None)
    assert sorted(started) == [("softmax", "inductor"), ("softmax", "minicomp")]
    for w in record["workloads"][1:]:
        assert set(w["compile_time"]) == {"minicomp", "inductor"}
        assert all("no fresh-process run" in c["skipped"] for c in w["compile_time"].values())


def _w(name, group, target, ms, ok=None, **extra):
    ok = ok or {}
    return {"name": name, "kind": "attention", "group": group, "geomean": group is None, "target": target,
            "backends": {b: {"ms": t, "check": {"ok": ok.get(b, True)}} for b, t in ms.items()},
            "errors": {}, "not_applicable": {"minicomp_ro": "refused"}, "io_bytes": 4_000_000,
            "analytic_flops": 2 * 10**9, **extra}


def test_report_targets_baselines_ceilings_and_geomean():
    sdpa = {"baseline": "sdpa_best", "min_speed": 1.0, "what": "≤ 1.0× SDPA's time"}
    ro = {"baseline": "inductor_ro", "min_speed": 1.0, "what": "ro"}
    # The faster SDPA backend failed its check: the baseline is the slower one that passed.
    dec = _w("dec", "decode", sdpa, {"eager": 3.0, "minicomp": 1.0, "sdpa_flash": 0.5, "sdpa_cudnn": 1.2},
             ok={"sdpa_flash": False})
    small = _w("sb", "small_batch", ro, {"eager": 2.0, "inductor": 1.0, "inductor_ro": 0.5, "minicomp": 0.8})
    fp32 = _w("f32", "weak", {"baseline": "inductor", "min_speed": 0.95, "what": "tc"},
              {"eager": 1.0, "inductor": 1.0, "minicomp": 1.0}, peak_tflops=50.0)
    suite = _w("suite_one", None, None, {"eager": 2.0, "inductor": 2.0, "minicomp": 1.0})
    suite.pop("target")
    rec = {"ceilings": {"copy": {"gbps": 4000.0}, "matmul": {"tflops": 1000.0}},
           "workloads": [dec, small, fp32, suite]}
    s = report.summarize(rec)
    assert dec["derived"]["sdpa_best"]["backend"] == "sdpa_cudnn"
    assert dec["derived"]["target"]["speed"] == pytest.approx(1.2) and s["targets_met"]["dec"] is True
    assert small["derived"]["target"]["speed"] == pytest.approx(0.625) and s["targets_met"]["sb"] is False
    # 4 MB at 4000 GB/s = 1 us; 2 GFLOP at 1000 TFLOP/s = 2 us (compute); at fp32's 50 TFLOP/s, 40 us.
    assert dec["derived"]["ceiling"]["ms"] == pytest.approx(0.002) and dec["derived"]["ceiling"]["bound"] == "compute"
    assert fp32["derived"]["ceiling"]["ms"] == pytest.approx(0.04)
    assert s["geomean_over"] == 1 and s["geomean_speedup_vs_compile"] == pytest.approx(2.0)
    md = report.markdown(rec)
    row = next(line for line in md.splitlines() if line.startswith("| sb | small_batch |"))
    assert "| 0.500 |" in row and "| n/a |" in row and "**no**" in row
    assert "1.200 (SDPA cuDNN)" in md and "| suite_one |" in md.split("## Issue 22")[0]


def _cuda_args():
    return _args(device="cuda", dtype="bf16", backends=["eager", "inductor", "minicomp"], reps=5,
                 warmup_ms=5.0, rep_ms=10.0, rounds=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_decode_on_cuda_times_cuda_graphs_and_the_sdpa_backends():
    """What only the GPU has: torch.compile's CUDA graphs and SDPA's cuDNN backend, each
    checked against eager; the faster checked SDPA backend is the target's baseline."""
    rec = run.run_workload(WORKLOADS["decode_attn_kv4096"], _cuda_args(), time.perf_counter() + 300)
    for b in ("eager", "inductor", "inductor_ro", "minicomp"):
        assert rec["backends"][b]["check"]["ok"] and rec["backends"][b]["ms"] > 0, (b, rec["errors"].get(b))
    assert ("minicomp_ro" in rec["backends"]) != ("minicomp_ro" in rec["not_applicable"])
    passed = [n for n in ("sdpa_flash", "sdpa_cudnn") if rec["backends"].get(n, {}).get("check", {}).get("ok")]
    assert passed, rec["errors"]
    record = {"ceilings": {"copy": {"gbps": 4000.0}, "matmul": {"tflops": 700.0}}, "workloads": [rec]}
    report.summarize(record)
    assert rec["derived"]["sdpa_best"]["backend"] in passed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_gemm_on_cuda_runs_without_tf32():
    """Inside the workload's context cuBLAS's fp32 GEMM (the eager reference every backend is
    held to) is IEEE fp32: within fp32's tolerance of an fp64 product at the full 2048^3."""
    w = WORKLOADS["gemm_fp32_2048_ieee"]
    a, b = w.build("cuda", torch.bfloat16, tiny=False).inputs
    assert a.dtype == torch.float32 and a.shape == (2048, 2048)
    exact = (a.double() @ b.double()).float()
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with w.context():
            assert torch.backends.cuda.matmul.allow_tf32 is False
            got = a @ b
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.testing.assert_close(got, exact, **TOLERANCES["float32"])

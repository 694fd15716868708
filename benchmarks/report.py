"""Derived figures and the markdown report of a benchmark run.

Invariants:
- Pure functions of the run record (`bench.json`'s content): nothing is measured here, so a
  saved record can be re-rendered (`python -m benchmarks.report bench.json`).
- Bytes and flops are minicomp's own ledger (its plan) where minicomp compiled; otherwise the
  function's input+output bytes and hand-counted matmul flops, and the record says which.
- A workload's speed counts (ratios, targets, geometric mean) only when the backends involved
  passed their correctness check.
- Ratios are time ratios taken in the same run: `minicomp/eager` < 1 means minicomp is faster;
  `speedup` is torch.compile's time over minicomp's.
- Issue 22's workloads (a record with a `group`) carry their own target (a baseline backend and
  the least speed against it), are left out of the geometric mean (which stays the suite's),
  and have their own table, with the reduce-overhead columns, the fastest checked SDPA backend
  and the ceiling: the input+output bytes over the same run's copy bandwidth or the hand-counted
  flops over its cuBLAS bf16 rate (or the workload's own `peak_tflops`), whichever is longer.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

BACKEND_TITLES = {"eager": "eager", "inductor": "torch.compile", "minicomp": "minicomp", "sdpa": "SDPA",
                  "minicomp_dynamo": "minicomp backend", "inductor_ro": "torch.compile reduce-overhead",
                  "minicomp_ro": "minicomp reduce-overhead", "sdpa_flash": "SDPA flash",
                  "minicomp_cublas": "minicomp, cuBLAS for every GEMM",
                  "sdpa_cudnn": "SDPA cuDNN", "sdpa_math": "SDPA math", "sdpa_best": "SDPA (faster backend)"}
TARGETS = {
    "memory": "≥ 90% of copy bandwidth and no slower than torch.compile",
    "gemm": "≥ 0.97× torch.compile's speed",
    "attention": "≤ 1.10× F.scaled_dot_product_attention's time",
    "block": "— (counts in the geometric mean)",
}
OWN_COMPILE_TARGET_S = 0.3
GEOMEAN_TARGET = 1.15


def _variant_line(w: dict, backend: str, title: str, base: str) -> list[str]:
    """The report's line for a variant backend of a workload that ran it: its time, over `base`'s
    and over torch.compile's (each only where both passed their checks); the Dynamo backend's
    also gives its fresh-process first call."""
    if backend not in w.get("backends", {}) and backend not in w.get("errors", {}):
        return []
    ours, ind, other = (_ms(w, b) for b in (backend, "inductor", base))
    ok = _ok(w, backend)
    over = (lambda ref, name: _f(ours / ref if ok and ours and ref and _ok(w, name) else None))
    line = (f"{w['name']}: {title} {_time_cell(w, backend)} ms; over {base} {over(other, base)}, "
            f"over torch.compile {over(ind, 'inductor')}")
    if backend == "minicomp_dynamo":
        line += f"; first call, fresh process: {_ct_cell(w.get('compile_time', {}).get(backend))}"
    return ["", line]


def _ok(w: dict, backend: str) -> bool:
    b = w.get("backends", {}).get(backend)
    return bool(b) and b.get("check", {}).get("ok", False)


def _ms(w: dict, backend: str) -> float | None:
    b = w.get("backends", {}).get(backend)
    return b.get("ms") if b else None


def derive(w: dict, ceilings: dict | None) -> dict:
    """Achieved rates, percent of ceiling, ratios and the target verdict for one workload."""
    ceilings = ceilings or {}
    copy = (ceilings.get("copy") or {}).get("gbps")
    mm = (ceilings.get("matmul") or {}).get("tflops")
    led = (w.get("backends", {}).get("minicomp") or {}).get("ledger")
    if led:
        nbytes, flops, source = led["bytes"], led["flops"], "minicomp ledger"
    else:
        nbytes, flops, source = w.get("io_bytes"), w.get("analytic_flops") or 0, "inputs+outputs, hand-counted flops"
    d: dict[str, Any] = {"bytes": nbytes, "flops": flops, "source": source, "per_backend": {}}
    if not nbytes:
        return d
    balance = (mm * 1e12) / (copy * 1e9) if copy and mm else None
    bound = "compute" if balance and flops / nbytes > balance else "memory"
    d["bound"] = bound
    for name, b in w.get("backends", {}).items():
        sec = b["ms"] / 1e3
        gbps, tflops = nbytes / sec / 1e9, flops / sec / 1e12
        pct = (tflops / mm if mm else None) if bound == "compute" else (gbps / copy if copy else None)
        d["per_backend"][name] = {"gbps": gbps, "tflops": tflops, "pct_of_ceiling": pct, "ok": _ok(w, name)}
    best = best_sdpa(w)
    if best:
        d["sdpa_best"] = {"backend": best, "ms": _ms(w, best)}
    d["ceiling"] = ceiling(w, copy, mm)
    mc, ind, eager, sdpa = (_ms(w, b) for b in ("minicomp", "inductor", "eager", "sdpa"))
    if mc and _ok(w, "minicomp"):
        d["minicomp_over_eager"] = mc / eager if eager else None
        d["minicomp_over_compile"] = mc / ind if ind and _ok(w, "inductor") else None
        d["speedup_vs_compile"] = ind / mc if ind and _ok(w, "inductor") else None
        d["minicomp_over_sdpa"] = mc / sdpa if sdpa and _ok(w, "sdpa") else None
    d["target"] = verdict(w, d)
    return d


def best_sdpa(w: dict) -> str | None:
    """The fastest SDPA baseline (sdpa_flash, sdpa_cudnn, ...) that passed its check."""
    ok = [(b["ms"], name) for name, b in w.get("backends", {}).items()
          if name.startswith("sdpa_") and _ok(w, name) and b.get("ms")]
    return min(ok)[1] if ok else None


def ceiling(w: dict, copy_gbps: float | None, mm_tflops: float | None) -> dict | None:
    """The floor time: input+output bytes at copy bandwidth or the counted flops at the compute
    ceiling (the workload's `peak_tflops`, else the run's cuBLAS bf16 rate), the longer."""
    nbytes = w.get("io_bytes")
    flops = w.get("analytic_flops") or ((w.get("backends", {}).get("minicomp") or {}).get("ledger") or {}).get("flops")
    peak = w.get("peak_tflops") or mm_tflops
    if not nbytes or not copy_gbps:
        return None
    mem_ms = nbytes / (copy_gbps * 1e9) * 1e3
    flop_ms = flops / (peak * 1e12) * 1e3 if flops and peak else 0.0
    return {"ms": max(mem_ms, flop_ms), "bound": "compute" if flop_ms > mem_ms else "memory",
            "bytes": nbytes, "flops": flops or 0, "peak_tflops": peak, "copy_gbps": copy_gbps}


def baseline_ms(w: dict, name: str) -> float | None:
    """The time of a target's baseline, when it passed its check."""
    if name == "sdpa_best":
        name = best_sdpa(w) or ""
    return _ms(w, name) if _ok(w, name) else None


def verdict(w: dict, d: dict) -> dict:
    kind = w.get("kind", "block")
    if w.get("target"):
        return target_verdict(w)
    out = {"what": TARGETS.get(kind, "—"), "met": None}
    if kind == "block":
        return out
    if "minicomp" not in w.get("backends", {}):
        return {**out, "why": "minicomp did not run"}
    if not _ok(w, "minicomp"):
        return {**out, "met": False, "why": "minicomp failed its correctness check"}
    if kind == "memory":
        pct = d["per_backend"]["minicomp"]["pct_of_ceiling"]
        speed = d.get("speedup_vs_compile")
        if pct is None or speed is None:
            return {**out, "why": "missing ceiling or torch.compile time"}
        return {**out, "met": pct >= 0.90 and speed >= 1.0}
    if kind == "gemm":
        speed = d.get("speedup_vs_compile")
        return {**out, "met": None if speed is None else speed >= 0.97}
    if kind == "attention":
        ratio = d.get("minicomp_over_sdpa")
        return {**out, "met": None if ratio is None else ratio <= 1.10}
    return out


def target_verdict(w: dict) -> dict:
    """An issue-22 target: minicomp's speed over the baseline's (baseline ms / minicomp ms)."""
    t = w["target"]
    mine = t.get("compared", "minicomp")
    out = {"what": t["what"], "met": None, "baseline": t["baseline"], "compared": mine}
    if mine not in w.get("backends", {}):
        return {**out, "why": f"{mine} did not run"}
    if not _ok(w, mine):
        return {**out, "met": False, "why": f"{mine} failed its correctness check"}
    base = baseline_ms(w, t["baseline"])
    if base is None:
        return {**out, "why": f"no checked {BACKEND_TITLES.get(t['baseline'], t['baseline'])} time"}
    speed = base / _ms(w, mine)
    return {**out, "speed": speed, "met": speed >= t["min_speed"]}


def summarize(record: dict) -> dict:
    """Derive every workload (stored on it as `derived`) and the suite's figures."""
    speedups = []
    for w in record.get("workloads", []):
        w["derived"] = derive(w, record.get("ceilings"))
        s = w["derived"].get("speedup_vs_compile")
        if s and w.get("geomean", True):
            speedups.append(s)
    geo = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    verdicts = {w["name"]: w["derived"].get("target", {}).get("met") for w in record.get("workloads", [])}
    own = {w["name"]: (w.get("backends", {}).get("minicomp") or {}).get("compile_for_s")
           for w in record.get("workloads", [])}
    cold = {}
    for w in record.get("workloads", []):
        ct = w.get("compile_time", {})
        mc, ind = (ct.get("minicomp") or {}).get("first_call_s"), (ct.get("inductor") or {}).get("first_call_s")
        cold[w["name"]] = None if mc is None or ind is None else mc <= ind
    return {"geomean_speedup_vs_compile": geo, "geomean_over": len(speedups),
            "geomean_target": GEOMEAN_TARGET,
            "geomean_met": None if geo is None else geo >= GEOMEAN_TARGET,
            "targets_met": verdicts,
            "own_compile_s": own, "own_compile_met": {k: (None if v is None else v <= OWN_COMPILE_TARGET_S)
                                                      for k, v in own.items()},
            "cold_first_call_no_slower_than_compile": cold}


def json_safe(x: Any) -> Any:
    """NaN and infinities become null: bench.json stays strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


# ----------------------------------------------------------------------------------------
# Markdown.

def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def _yes(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "—"}[met]


def ceilings_line(c: dict | None) -> str:
    if not c or "error" in c:
        return f"not measured ({(c or {}).get('error', 'no record')})"
    cp, mm = c.get("copy", {}), c.get("matmul", {})
    return (f"copy {_f(cp.get('gbps'), '{:.0f}')} GB/s ({cp.get('what', '')}); "
            f"{mm.get('what', 'matmul')} {_f(mm.get('tflops'), '{:.0f}')} TFLOP/s; "
            f"balance {_f(c.get('balance_flop_per_byte'), '{:.0f}')} FLOP/byte")


def _check_cell(w: dict) -> str:
    bad = []
    for name, b in w.get("backends", {}).items():
        c = b.get("check", {})
        if not c.get("ok", False):
            bad.append(f"{BACKEND_TITLES.get(name, name)} FAIL (max abs {_f(c.get('max_abs'), '{:.3g}')}, "
                       f"{_f(100 * c.get('mismatch_frac', 0), '{:.3g}')}% of elements)")
    # a workload the run's budget left out is skipped, not an error of its build
    errs = ["skipped" if str(v.get("error", "")).startswith("skipped") else BACKEND_TITLES.get(k, k) + " error"
            for k, v in w.get("errors", {}).items()]
    return "; ".join(bad + errs) or "ok"


def _time_cell(w: dict, name: str) -> str:
    if name in w.get("errors", {}):
        return "error"
    if name in w.get("not_applicable", {}):
        return "n/a"
    b = w.get("backends", {}).get(name)
    if not b:
        return "—"
    return _f(b["ms"], "{:.3f}") + ("" if _ok(w, name) else " (wrong)")


def _achieved_cell(w: dict) -> tuple[str, str]:
    d = w.get("derived", {})
    mc = d.get("per_backend", {}).get("minicomp")
    if not mc:
        return "—", "—"
    rate = f"{mc['tflops']:.4g} TFLOP/s" if d.get("bound") == "compute" else f"{mc['gbps']:.4g} GB/s"
    return rate, _f(None if mc["pct_of_ceiling"] is None else 100 * mc["pct_of_ceiling"], "{:.0f}%")


def markdown(record: dict) -> str:
    env, s = record.get("environment", {}), record.get("summary") or summarize(record)
    t = env.get("timing", {})
    tol = env.get("tolerance", {})
    lines = ["# minicomp benchmark run", "",
             f"- device: {env.get('gpu') or env.get('device')} ({env.get('sizes')}); "
             f"PyTorch {env.get('torch')}, Triton {env.get('triton')}, CUDA {env.get('cuda')}, "
             f"driver {env.get('driver')}; date {env.get('date')}; commit {env.get('git_commit')}",
             f"- dtype {env.get('dtype')}; timing: {t.get('method')}, warm-up {t.get('warmup_ms')} ms, "
             f"rep {t.get('rep_ms')} ms (at least {t.get('min_reps')} timed runs)"
             + (f", in {t['rounds']} rounds taking turns between backends" if t.get("rounds", 1) > 1 else ""),
             f"- correctness before timing: {tol.get('check')}, atol {tol.get('atol')}, rtol {tol.get('rtol')}",
             f"- ceilings (this run): {ceilings_line(record.get('ceilings'))}", "",
             "| workload | shapes | check | eager ms | torch.compile ms | minicomp ms | mc/eager | mc/tc "
             "| ledger MB | GFLOP | minicomp achieved | % ceiling | target met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in record.get("workloads", []):
        if w.get("group"):
            continue                      # issue 22's: their own table, below
        d = w.get("derived", {})
        rate, pct = _achieved_cell(w)
        nbytes = d.get("bytes")
        lines.append(" | ".join([
            f"| {w['name']}", w.get("shapes", "—"), _check_cell(w), _time_cell(w, "eager"),
            _time_cell(w, "inductor"), _time_cell(w, "minicomp"),
            _f(d.get("minicomp_over_eager")), _f(d.get("minicomp_over_compile")),
            _f(nbytes / 1e6 if nbytes else None, "{:.4g}"), _f(d.get("flops", 0) / 1e9, "{:.4g}"),
            rate, pct, _yes(d.get("target", {}).get("met"))]) + " |")
    for w in record.get("workloads", []):
        if "sdpa" in w.get("backends", {}):
            d = w.get("derived", {})
            lines += ["", f"{w['name']}: F.scaled_dot_product_attention(is_causal=True) "
                      f"{_time_cell(w, 'sdpa')} ms; minicomp/SDPA {_f(d.get('minicomp_over_sdpa'))} "
                      f"(target ≤ 1.10)"]
    for w in record.get("workloads", []):
        lines += _variant_line(w, "minicomp_dynamo", 'torch.compile(backend="minicomp")', "eager")
        lines += _variant_line(w, "minicomp_cublas", 'minicomp.compile(fn, library="all") (cuBLAS for every GEMM)',
                               "minicomp")
    from benchmarks.report_issue22 import issue22_table
    lines += issue22_table(record)
    lines += ["", f"Geometric mean of speedup over torch.compile: {_f(s.get('geomean_speedup_vs_compile'))} "
              f"over {s.get('geomean_over')} workload(s) (target ≥ {GEOMEAN_TARGET}: "
              f"{_yes(s.get('geomean_met'))}). Ledger bytes/flops: "
              + ", ".join(sorted({w.get('derived', {}).get('source', '—') for w in record.get('workloads', [])}))
              + "."]
    ct_env = env.get("compile_time", {})
    lines += ["", "## Compile time", "",
              f"Fresh processes with empty Inductor, Triton and minicomp caches, "
              f"{ct_env.get('jobs_at_once', 1)} at a time; CUDA context and cuBLAS warmed first. "
              "\"Own\" is minicomp's capture → loaded module without Triton's JIT (target ≤ 0.3 s). "
              "\"Settled\": from minicomp's capture to the end of its first call at the kernels' speed "
              "(eager answers while kernels compile in the background; the call after their compile "
              "autotunes them).", "",
              "| workload | minicomp own s (capture → module, warm process) | own ≤ 0.3 s | "
              "minicomp compile_seconds, fresh process | minicomp first call, fresh process s | "
              "torch.compile first call, fresh process s | first call, warm process: minicomp / torch.compile s | "
              "minicomp settled, warm process s |",
              "|---|---|---|---|---|---|---|---|"]
    for w in record.get("workloads", []):
        mc, ind = w.get("backends", {}).get("minicomp") or {}, w.get("backends", {}).get("inductor") or {}
        ct = w.get("compile_time", {})
        lines.append(" | ".join([
            f"| {w['name']}", _f(mc.get("compile_for_s")), _yes(s.get("own_compile_met", {}).get(w["name"])),
            _f((ct.get("minicomp") or {}).get("compile_seconds")), _ct_cell(ct.get("minicomp")),
            _ct_cell(ct.get("inductor")),
            f"{_f(_sum(mc.get('compile_for_s'), mc.get('first_call_s')), '{:.2f}')} / "
            f"{_f(ind.get('first_call_s'), '{:.2f}')}",
            _f(_sum(mc.get("compile_for_s"), mc.get("settled_s")), "{:.2f}")]) + " |")
    errors = [(w["name"], k, v) for w in record.get("workloads", []) for k, v in w.get("errors", {}).items()]
    notes = [(w["name"], n) for w in record.get("workloads", []) for n in w.get("notes", [])]
    if errors or notes or any(w.get("not_applicable") for w in record.get("workloads", [])):
        lines += ["", "## Errors and notes", ""]
        lines += [f"- {name} / {BACKEND_TITLES.get(k, k)}: `{v.get('error')}`" for name, k, v in errors]
        lines += [f"- {w['name']} / {BACKEND_TITLES.get(k, k)}: n/a ({v})"
                  for w in record.get("workloads", []) for k, v in w.get("not_applicable", {}).items()]
        lines += [f"- {name}: {n}" for name, n in notes]
    lines.append("")
    return "\n".join(lines)


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _ct_cell(c: dict | None) -> str:
    if not c:
        return "—"
    if "skipped" in c:
        return f"skipped ({c['skipped']})"
    if "error" in c:
        return f"error (`{c['error'][:120]}`)"
    return f"{c['first_call_s']:.2f} (process {c.get('process_s', 0):.1f})"


if __name__ == "__main__":
    rec = json.loads(open(sys.argv[1]).read())
    print(markdown({**rec, "summary": summarize(rec)}))

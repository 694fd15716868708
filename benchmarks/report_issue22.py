"""The report's table of issue 22's workloads (those whose record has a `group`).

Invariants (with `report.py`'s): a pure function of the run record, after `report.summarize`
has derived each workload. A backend that does not apply is shown as "n/a", one that failed
as "error", a wrong result as "(wrong)"; the target's speed is shown only when minicomp and the
baseline both passed their checks.
"""

from __future__ import annotations


def issue22_table(record: dict) -> list[str]:
    from benchmarks.report import BACKEND_TITLES, _check_cell, _f, _time_cell, _yes
    rows = [w for w in record.get("workloads", []) if w.get("group")]
    if not rows:
        return []
    lines = ["", "## Issue 22's workloads", "",
             "Times in ms, medians of the same run. \"tc\" is torch.compile, \"r-o\" its "
             "`mode=\"reduce-overhead\"` (CUDA graphs); minicomp r-o is `minicomp.compile(fn, "
             "mode=\"reduce-overhead\")`, \"n/a\" where the API does not take it. SDPA: the faster of "
             "the SDPA backends that passed (flash or cuDNN on CUDA). Ceiling: input+output bytes at "
             "the run's copy bandwidth or counted flops at its compute ceiling, the longer. Speed: the "
             "target's baseline time over minicomp's (≥ 1 is minicomp faster). The blocks sweep's "
             "third size is the suite's own gpt_block and llama_block, in the table above.", "",
             "| workload | group | shapes | check | eager | tc | tc r-o | minicomp | minicomp r-o | SDPA "
             "| ceiling ms | minicomp % of ceiling | target | speed | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in rows:
        d = w.get("derived", {})
        best = d.get("sdpa_best")
        sdpa = "—" if not best else f"{_f(best['ms'])} ({BACKEND_TITLES.get(best['backend'], best['backend'])})"
        if not best and any(n.startswith("sdpa_") for n in {**w.get("backends", {}), **w.get("errors", {})}):
            sdpa = "error"
        c = d.get("ceiling") or {}
        mc = (w.get("backends", {}).get("minicomp") or {}).get("ms")
        pct = 100 * c["ms"] / mc if c.get("ms") and mc and w["backends"]["minicomp"].get("check", {}).get("ok") else None
        t = d.get("target", {})
        lines.append(" | ".join([
            f"| {w['name']}", w.get("group", "—"), w.get("shapes", "—"), _check_cell(w),
            _time_cell(w, "eager"), _time_cell(w, "inductor"), _time_cell(w, "inductor_ro"),
            _time_cell(w, "minicomp"), _time_cell(w, "minicomp_ro"), sdpa,
            f"{_f(c.get('ms'), '{:.4f}')} ({c['bound']})" if c else "—", _f(pct, "{:.0f}%"),
            t.get("what") if w.get("target") else "— (none; not in the geometric mean)",
            _f(t.get("speed")), _yes(t.get("met"))]) + " |")
    return lines

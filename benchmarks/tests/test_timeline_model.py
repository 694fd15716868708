"""scripts/timeline_model.py reads torch.profiler's chrome trace: which kernels belong to which
call (by the launch that queued them, runtime or driver API), and which gaps the host caused.
Its first GPU run counted only runtime-API launches and so missed every Triton and cuBLAS kernel;
these synthetic traces hold it to both."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "timeline_model.py"


def _module():
    spec = importlib.util.spec_from_file_location("timeline_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trace(calls: int, host_late: bool) -> list[dict]:
    """`calls` calls 1000 us apart, each launching three kernels 10 us apart on the GPU: one
    through the runtime API, two through the driver API (as Triton does), and a flush kernel
    launched outside any call. With `host_late` the third kernel's launch returns after the
    second kernel ended."""
    events = []
    for c in range(calls):
        base = c * 1000
        events.append(dict(cat="user_annotation", name="call", ph="X", ts=base, dur=300 if host_late else 100))
        for i, cat in enumerate(("cuda_runtime", "cuda_driver", "cuda_driver")):
            cid = c * 10 + i
            late = host_late and i == 2           # launched at +292, returns at +297: k1 ended at +290
            launched, start = (base + 292, base + 300) if late else (base + 10 * i, base + 200 + 50 * i)
            events.append(dict(cat=cat, name="launch", ph="X", ts=launched, dur=5, args=dict(correlation=cid)))
            events.append(dict(cat="kernel", name=f"k{i}", ph="X", ts=start, dur=40, args=dict(correlation=cid)))
        events.append(dict(cat="kernel", name="flush", ph="X", ts=base + 150, dur=10, args=dict(correlation=-1)))
    return events


def test_kernels_are_assigned_to_calls_by_their_launch_and_gaps_charged(capsys):
    tm = _module()
    calls = tm.per_call(_trace(tm.CALLS, host_late=False))
    assert len(calls) == tm.CALLS - tm.SKIP
    assert all([k["name"] for k in c["kernels"]] == ["k0", "k1", "k2"] for c in calls)
    warm = [dict(c, kernels=[dict(k, dur=30) for k in c["kernels"]]) for c in calls]   # 30 us each unflushed
    tm.report("x", calls, rows=2, wall_ms=0.15, warm=warm)
    out = capsys.readouterr().out
    assert "3 kernels a call; kernel time 120 us, span 140 us" in out
    assert "0 us charged to the host, 20 us to the GPU" in out
    # k0's launch opens the call; the flush kernel ends at +160 and k0 starts at +200
    assert "to its first launch 0 us; the GPU idle before the call's first kernel 40 us" in out
    assert "do_bench (L2 flushed, no profiler) 150 us a call; kernel time without the flush 90 us" in out
    assert "(so the flush costs the kernels 30 us)" in out

    late = tm.per_call(_trace(tm.CALLS, host_late=True))
    tm.report("y", late, rows=1, wall_ms=0.2, warm=late)
    out = capsys.readouterr().out
    assert "10 us charged to the host, 10 us to the GPU" in out
    assert "host  k1  ->  k2" in out

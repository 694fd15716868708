"""The model zoo in low precision: minicomp is no further from a high-precision eager
reference than eager itself is in the low precision.

For every zoo model, attention implementation and the calls "plain" and "left_pad", one model
is built from the zoo's config and copied into a reference dtype and a low dtype. With `ref`
the reference model's output, `eager` the low model's and `ours` the low model's through
`torch.compile(model, backend=minicomp.backend(...))`, on the positions that hold tokens,

    error(ours) <= max(C * error(eager), floor)

for the relative L2 error ||x - ref|| / ||ref|| with C = 2 (floor: FLOOR_EPS x the low dtype's
eps), and for the largest absolute error with C_MAX = 4 (floor: FLOOR_EPS x eps x max|ref|),
which catches a few elements gone wrong that the L2 error averages away. Measured on the
CPU: in bf16 minicomp's L2 errors are 1.15-1.4x eager's for Llama and GPT-2 (it rounds to
bf16 where it stores, eager after every op, so neither is uniformly closer); in fp32 against
fp64 0.9-1.15x over the zoo, Gemma2 aside (below), while the max error, one or two units in
the last place of single elements, reaches 2.0x (GPT-2): too noisy for C. An L2 error twice
eager's is a kernel that lost precision, not a different rounding order.

Known (fp32-cpu): Gemma2's attention soft-capping in minicomp's attention kernel
(`cap * (1 - 2 / (exp(2 s / cap) + 1))`, codegen/attention_body.py) loses relative precision
for small scores: 10x eager's error in fp32 (strict xfail below, so a fix shows); in bf16 it
is below bf16's own rounding. A reference with NaN at compared positions (Gemma2 left-padded
in fp64: its fill value overflows to -inf and NaN spreads through padded values) cannot judge
anything, and the case is skipped saying so.

Where it runs (MINICOMP_ZOO_LOWP):
- unset: bf16 against an fp32 reference (TF32 off) on CUDA. The cases are marked `gpu`:
  skipped without CUDA, so CI spends nothing; scripts/gpu_suite.sh runs them on the H200.
- `bf16-cpu`: the same on the CPU under Triton's interpreter (a few minutes for the zoo).
- `fp32-cpu`: fp32 against an fp64 reference on the CPU: proves the harness where bf16 is slow.
`test_the_rule_can_fail` runs in CI: the check itself rejects a result three times as far off.
The per-case errors are printed at the end (and written as markdown to
$MINICOMP_ZOO_LOWP_REPORT when that is set).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import pytest
import torch

import minicomp
from zoo_models import zoo

pytest.importorskip("transformers")

C = 2.0
C_MAX = 4.0
FLOOR_EPS = 0.25

_MODES = {None: ("cuda", torch.bfloat16, torch.float32),
          "bf16-cpu": ("cpu", torch.bfloat16, torch.float32),
          "fp32-cpu": ("cpu", torch.float32, torch.float64)}
MODE = os.environ.get("MINICOMP_ZOO_LOWP") or None
if MODE not in _MODES:
    raise ValueError(f"MINICOMP_ZOO_LOWP={MODE!r}; known: bf16-cpu, fp32-cpu (unset: bf16 on CUDA)")
DEVICE, LOW, REF = _MODES[MODE]


@dataclass(frozen=True)
class Verdict:
    """The two errors of ours and of eager's against the reference, and whether the rule holds."""
    rel_ours: float
    rel_eager: float
    max_ours: float
    max_eager: float
    ok: bool

    def __str__(self) -> str:
        return (f"relative L2 error {self.rel_ours:.3e} (eager {self.rel_eager:.3e}, x{self._r(self.rel_ours, self.rel_eager)}), "
                f"max error {self.max_ours:.3e} (eager {self.max_eager:.3e}, x{self._r(self.max_ours, self.max_eager)})")

    @staticmethod
    def _r(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "inf"


def judge(ref: torch.Tensor, eager: torch.Tensor, ours: torch.Tensor, low: torch.dtype,
          c: float = C, c_max: float = C_MAX, floor_eps: float = FLOOR_EPS) -> Verdict:
    """The rule on both errors, computed in fp64. NaN anywhere in ours where the reference has
    none fails (a NaN compares false, so it is tested on its own)."""
    ref, eager, ours = ref.double(), eager.double(), ours.double()
    eps = torch.finfo(low).eps
    scale = ref.norm().item()
    rel = lambda x: (x - ref).norm().item() / scale if scale else (x - ref).norm().item()   # noqa: E731
    biggest = lambda x: (x - ref).abs().max().item()                                         # noqa: E731
    v = dict(rel_ours=rel(ours), rel_eager=rel(eager), max_ours=biggest(ours), max_eager=biggest(eager))
    floor_max = floor_eps * eps * ref.abs().max().item()
    ok = (not bool((torch.isnan(ours) & ~torch.isnan(ref)).any())
          and v["rel_ours"] <= max(c * v["rel_eager"], floor_eps * eps)
          and v["max_ours"] <= max(c_max * v["max_eager"], floor_max))
    return Verdict(**v, ok=ok)


def test_the_rule_can_fail():
    """The check rejects a result three times as far from the reference as eager's, one element
    far off, and NaN; it accepts eager's own result and one just under C times as far."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4, 8, 16, generator=g)
    eager = ref.to(torch.bfloat16).float()
    err = eager - ref
    assert judge(ref, eager, eager, torch.bfloat16).ok
    assert judge(ref, eager, ref + 0.95 * C * err, torch.bfloat16).ok
    assert not judge(ref, eager, ref + 3 * err, torch.bfloat16).ok
    worse_at_one = eager.clone()
    worse_at_one[1, 2, 3] += 0.1                 # one element off: the max error catches it
    assert not judge(ref, eager, worse_at_one, torch.bfloat16).ok
    nan = eager.clone()
    nan[0, 0, 0] = float("nan")
    assert not judge(ref, eager, nan, torch.bfloat16).ok
    assert judge(ref, ref, ref + 1e-9, torch.bfloat16).ok   # eager exact: the floor, not zero, binds


_ROWS: list[tuple[str, str, str, Verdict]] = []
_LIVE: dict = {}


def _models(name: str, attn: str):
    """(reference model, low model, low model through minicomp's backend), one (name, attn) kept."""
    key = (name, attn)
    if key not in _LIVE:
        _LIVE.clear()
        torch._dynamo.reset()
        base = zoo()[name].model(attn)
        ref = copy.deepcopy(base).to(device=DEVICE, dtype=REF)
        low = base.to(device=DEVICE, dtype=LOW)
        _LIVE[key] = (ref, low, torch.compile(low, backend=minicomp.backend(verify_target="off")))
    return _LIVE[key]


# (mode, model, attn, call) -> why minicomp is expected to break the rule; strict, so a fix shows
XFAIL = {("fp32-cpu", "gemma2", "eager", "plain"): "the attention kernel's soft-capping loses precision for small "
                                                    "scores (1 - 2 / (exp(2y) + 1)): 10x eager's error in fp32"}


def _cases():
    for name, zm in zoo().items():
        for attn in zm.attns:
            for call in ("plain", "left_pad"):
                if call in zm.calls:
                    marks = [pytest.mark.gpu] if DEVICE == "cuda" else []
                    reason = XFAIL.get((MODE, name, attn, call))
                    marks += [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                    yield pytest.param(name, attn, call, id=f"{name}-{attn}-{call}", marks=marks)


@pytest.fixture
def true_fp32():
    """The reference in true fp32 on CUDA: TF32 off for matmuls and convolutions (ViT's patches)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name,attn,call", list(_cases()))
def test_zoo_in_low_precision_is_no_further_from_the_reference_than_eager(name, attn, call, true_fp32):
    zm = zoo()[name]
    ref_model, low_model, ours_model = _models(name, attn)
    kwargs, valid = zm.inputs(call, ref_model)

    def on(dtype: torch.dtype) -> dict:
        return {k: v.to(DEVICE, dtype) if v.is_floating_point() else v.to(DEVICE) for k, v in kwargs.items()}

    with torch.no_grad():
        ref = getattr(ref_model(**on(REF)), zm.output)
        eager = getattr(low_model(**on(LOW)), zm.output)
        ours = getattr(ours_model(**on(LOW)), zm.output)
    assert ours.dtype == eager.dtype == LOW and ours.shape == ref.shape
    if valid is not None and valid.shape == ref.shape[:2]:
        valid = valid.to(DEVICE)
        ref, eager, ours = ref[valid], eager[valid], ours[valid]     # positions that hold tokens
    if torch.isnan(ref).any() and not torch.isnan(eager).any():
        pytest.skip(f"the {REF} reference has NaN at compared positions where {LOW} eager has none")
    verdict = judge(ref, eager, ours, LOW)
    _ROWS.append((name, attn, call, verdict))
    assert verdict.ok, f"{name}/{attn}/{call} in {LOW}: {verdict}"


@pytest.fixture(scope="module", autouse=True)
def _print_table(request):
    yield
    _LIVE.clear()
    torch._dynamo.reset()
    if not _ROWS:
        return
    lines = [f"zoo in {str(LOW).removeprefix('torch.')} on {DEVICE} against {str(REF).removeprefix('torch.')} "
             f"eager (rule: minicomp's error <= max({C} x eager's, floor))",
             "| model | attn | call | rel. L2 minicomp | rel. L2 eager | ratio | max minicomp | max eager | ratio | ok |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, attn, call, v in _ROWS:
        lines.append(f"| {name} | {attn} | {call} | {v.rel_ours:.2e} | {v.rel_eager:.2e} | {v._r(v.rel_ours, v.rel_eager)} "
                     f"| {v.max_ours:.2e} | {v.max_eager:.2e} | {v._r(v.max_ours, v.max_eager)} | {'yes' if v.ok else 'NO'} |")
    text = "\n".join(lines)
    path = os.environ.get("MINICOMP_ZOO_LOWP_REPORT")
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + text)

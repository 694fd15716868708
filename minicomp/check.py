"""`minicomp compile --check`: compare the compiled outputs with the reference, and say how.

    compare(got, want) -> list[OutputCheck]     one record per output
    tolerance(dtype) -> Tolerance               the bound an output of that dtype must meet
    report(checks, ...) -> list[str]            what the CLI prints

An output passes when its shape and dtype equal the reference's and every element meets
`|got - want| <= atol + rtol * |want|` for its dtype (the rule of `torch.isclose` and
`torch.testing.assert_close`), with NaN equal to NaN and equal infinities equal. Integer and
bool outputs must be equal. The tolerances are the test suite's (`tests/conftest.py`).

The comparison uses `torch.isclose` rather than `torch.testing.assert_close`: the latter's
first call imports `torch.distributed.tensor` (0.4 s measured with `python -X importtime`,
1.1 s of wall time on a busy 2-core machine) to report what `OutputCheck` reports anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    @property
    def exact(self) -> bool:
        return self.atol == 0 and self.rtol == 0


_TOLERANCES = {
    torch.float32: Tolerance(1e-4, 1e-4),
    torch.float16: Tolerance(2e-3, 2e-3),
    torch.bfloat16: Tolerance(2e-2, 2e-2),
    torch.float64: Tolerance(1e-12, 1e-12),     # rounding still differs in the last bits
    torch.complex64: Tolerance(1e-4, 1e-4),
    torch.complex128: Tolerance(1e-12, 1e-12),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The bound for outputs of `dtype`; integers and bools must be equal."""
    return _TOLERANCES.get(dtype, Tolerance(0.0, 0.0))


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def type_str(t: torch.Tensor) -> str:
    return f"{dtype_str(t.dtype)}{list(t.shape)}"


def _num(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-")           # 1e-4, not 1e-04 or 0.0001


def tolerance_words(dtype: torch.dtype) -> str:
    """`atol 1e-4 + rtol 1e-4 x |expected| for float32`, or `exact equality required for int64`."""
    tol = tolerance(dtype)
    if tol.exact:
        return f"exact equality required for {dtype_str(dtype)}"
    return f"atol {_num(tol.atol)} + rtol {_num(tol.rtol)} x |expected| for {dtype_str(dtype)}"


@dataclass
class OutputCheck:
    index: int
    got: str                          # dtype[shape] of the compiled output
    want: str                         # dtype[shape] of the reference output
    dtype: torch.dtype                # the reference's
    ok: bool
    numel: int = 0
    bad: int = 0                      # elements outside the tolerance
    max_abs: float = 0.0              # over all elements (NaN = NaN and equal infinities count 0)
    worst: tuple[int, ...] = ()       # index of the largest error, when some element is outside
    worst_got: complex | float = 0.0
    worst_want: complex | float = 0.0

    def line(self) -> str:
        head = f"  output {self.index}  {self.want}  {'ok  ' if self.ok else 'FAIL'}  "
        if self.got != self.want:
            return head + f"the compiled kernels give {self.got}, the reference {self.want}"
        if self.numel == 0:
            return head + "empty: nothing to compare"
        exact = tolerance(self.dtype).exact
        if self.ok:
            if exact:
                return head + f"equal ({tolerance_words(self.dtype)})"
            return head + f"max abs error {self.max_abs:.2g} within {tolerance_words(self.dtype)}"
        where = f"differ ({tolerance_words(self.dtype)})" if exact else f"outside {tolerance_words(self.dtype)}"
        return (head + f"{self.bad} of {self.numel} element(s) {where}; worst at {list(self.worst)}: "
                f"got {self.worst_got:.6g}, expected {self.worst_want:.6g} (max abs error {self.max_abs:.2g})")


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.complex128 if t.is_complex() else torch.float64)


def compare_one(index: int, got: torch.Tensor, want: torch.Tensor) -> OutputCheck:
    got, want = got.detach().cpu(), want.detach().cpu()
    record = OutputCheck(index, type_str(got), type_str(want), want.dtype, ok=False, numel=want.numel())
    if record.got != record.want or want.numel() == 0:
        record.ok = record.got == record.want
        return record
    tol = tolerance(want.dtype)
    a, b = _wide(got), _wide(want)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))          # covers equal infinities too
    close = same if tol.exact else torch.isclose(a, b, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
    diff = torch.where(same, torch.zeros((), dtype=torch.float64), (a - b).abs().double().nan_to_num(nan=torch.inf))
    record.max_abs = float(diff.max())
    record.bad = int((~close).sum())
    record.ok = record.bad == 0
    if not record.ok:
        flat = int(torch.where(close, torch.full_like(diff, -1.0), diff).argmax())
        record.worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), want.shape))
        record.worst_got, record.worst_want = got.reshape(-1)[flat].item(), want.reshape(-1)[flat].item()
    return record


def compare(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> list[OutputCheck]:
    """One record per output pair (a count mismatch is the caller's to report)."""
    return [compare_one(k, a, b) for k, (a, b) in enumerate(zip(got, want))]


def report(checks: list[OutputCheck], n_got: int, n_want: int, reference: str, device: str,
           inputs: str) -> tuple[bool, list[str]]:
    """(all agree, the lines `--check` prints)."""
    lines = [f"check: {n_want} output(s) of the compiled kernels against {reference}, on {device}",
             f"  inputs: {inputs}"]
    ok = n_got == n_want and all(c.ok for c in checks)
    if n_got != n_want:
        lines.append(f"  the compiled kernels return {n_got} output(s), the reference {n_want}")
    lines += [c.line() for c in checks]
    lines.append("check: " + ("compiled kernels agree with eager" if ok else "MISMATCH with eager"))
    return ok, lines


def describe_inputs(inputs: Sequence[torch.Tensor], names: Sequence[str] | None = None) -> str:
    """`x float32[2, 3], w float32[3]` (names when known)."""
    parts = []
    for k, t in enumerate(inputs):
        name = f"{names[k]} " if names and k < len(names) else ""
        parts.append(name + type_str(t) + ("" if t.is_contiguous() else f" strides {list(t.stride())}"))
    return ", ".join(parts) or "none"

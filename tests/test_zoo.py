"""The model zoo through `torch.compile(model, backend="minicomp")`: every model of
`zoo_models.py`, with attention implementations "eager" and "sdpa", called the plain way,
with a right-padding and with a left-padding 2-D mask, against eager PyTorch (fp32, CPU,
Triton's interpreter; the GPU-true check compiles every kernel for sm_90 as well).

Outputs are compared at the positions that hold tokens: a padded position computes on
padding, and what eager leaves there depends on how the mask fills a fully masked row, which
no caller reads. Each case also checks that the backend compiled every graph (no graph fell
back to eager) into at least one kernel, and records the kernels and the ops that ran
through PyTorch; the table is printed at the end of the run (and written as markdown to
$MINICOMP_ZOO_REPORT when that is set).

The GPU-true check (every kernel also compiled for sm_90) runs on the graphs of `VERIFIED`
(a decoder, whose kernels are every kind the zoo makes: GEMMs, masked attention, row
reductions, pointwise; and ViT, whose patch graph differs) and on all of them with
MINICOMP_ZOO_VERIFY=all. Over the whole zoo it compiles ~1900 distinct kernels (~4100 kernel
configs, 716 s waiting for Triton's compiler on a shared 2-core machine), which CI cannot
spend: kernels that compute the same thing at the same shapes differ in their text (node
numbers name their buffers and values), so neither the check's memo nor Triton's cache joins
them. BERT was verified too until it alone cost ~70 s of the zoo's time.

MINICOMP_ZOO=all adds `zoo_models.ZOO_EXTRA`.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field

import pytest
import torch

import minicomp
from conftest import tol
from zoo_models import zoo

pytest.importorskip("transformers")


VERIFIED = {"llama", "vit"}

# (model, attn, call) -> why it is expected to fail; strict, so the fix shows as a pass.
XFAIL: dict[tuple[str, str, str], str] = {}


@dataclass
class _Row:
    name: str
    attn: str
    results: dict[str, str] = field(default_factory=dict)
    graphs: int = 0
    kernels: int = 0
    aten_calls: int = 0
    view_calls: int = 0
    pytorch_calls: int = 0
    pytorch_ops: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


_ROWS: dict[tuple[str, str], _Row] = {}
_LIVE: dict = {}          # the one compiled model kept: (name, attn) -> (model, compiled, backend)


def _verified(name: str) -> bool:
    return os.environ.get("MINICOMP_ZOO_VERIFY") == "all" or name in VERIFIED


def _compiled(name: str, attn: str):
    key = (name, attn)
    if key not in _LIVE:
        _LIVE.clear()
        torch._dynamo.reset()          # each model starts with Dynamo's caches and recompile limits clear
        model = zoo()[name].model(attn)
        backend = minicomp.backend(**({} if _verified(name) else {"verify_target": "off"}))
        _LIVE[key] = (model, torch.compile(model, backend=backend), backend)
    return _LIVE[key]


def _cases():
    for name, zm in zoo().items():
        for attn in zm.attns:
            for call in zm.calls:
                reason = XFAIL.get((name, attn, call))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(name, attn, call, id=f"{name}-{attn}-{call}", marks=marks)


@pytest.mark.parametrize("name,attn,call", list(_cases()))
def test_zoo_model_matches_eager(name, attn, call):
    zm = zoo()[name]
    start = time.perf_counter()
    model, compiled, backend = _compiled(name, attn)
    kwargs, valid = zm.inputs(call, model)
    row = _ROWS.setdefault((name, attn), _Row(name, attn))
    row.results[call] = "fail"
    with torch.no_grad():
        ref = getattr(model(**kwargs), zm.output)
        out = getattr(compiled(**kwargs), zm.output)
    row.seconds += time.perf_counter() - start
    rep = backend.report()
    row.graphs, row.kernels = len(rep.graphs), rep.kernels
    row.aten_calls, row.view_calls = rep.aten_calls, rep.view_calls
    row.pytorch_calls, row.pytorch_ops = rep.pytorch_calls, dict(rep.pytorch_ops)
    assert not rep.failures, rep.table()
    assert rep.graphs and rep.kernels > 0, rep.table()
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if valid is not None and valid.shape == ref.shape[:2]:
        ref, out = ref[valid], out[valid]       # positions that hold tokens
    torch.testing.assert_close(out, ref, **tol(torch.float32))
    row.results[call] = "pass"


@pytest.mark.parametrize("name", [n for n, zm in zoo().items() if "sdpa" not in zm.attns])
def test_models_without_sdpa_are_refused_sdpa_by_transformers(name):
    """Gemma2 and Bloom run with eager attention only because transformers refuses SDPA for them:
    when it stops refusing, this fails, and they join the sdpa cases."""
    with pytest.raises(ValueError, match="does not support an attention implementation"):
        zoo()[name].model("sdpa")


def zoo_table(rows: list[_Row]) -> str:
    """The zoo's markdown table and the fraction of aten calls compiled to kernels."""
    lines = ["| model | attn | " + " | ".join(("plain", "right_pad", "left_pad")) +
             " | graphs | kernels | aten calls | through PyTorch | ops through PyTorch | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        res = [r.results.get(c, "n/a") for c in ("plain", "right_pad", "left_pad")]
        ops = ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in sorted(r.pytorch_ops.items())) or "-"
        lines.append(f"| {r.name} | {r.attn} | " + " | ".join(res) +
                     f" | {r.graphs} | {r.kernels} | {r.aten_calls} | {r.pytorch_calls} | {ops} | {r.seconds:.0f} |")
    calls = sum(r.aten_calls for r in rows)
    computing = calls - sum(r.view_calls for r in rows)
    through = sum(r.pytorch_calls for r in rows)
    if computing:
        lines.append(f"\n{calls - through} of {calls} aten calls ({1 - through / calls:.1%}) compiled; of the "
                     f"{computing} that are not views, {1 - through / computing:.1%} run in minicomp's kernels; "
                     f"{sum(r.kernels for r in rows)} kernels")
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def _print_table(request):
    yield
    _LIVE.clear()
    torch._dynamo.reset()
    if not _ROWS:
        return
    text = zoo_table(list(_ROWS.values()))
    path = os.environ.get("MINICOMP_ZOO_REPORT")
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\nminicomp backend model zoo:\n" + text)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_generation_with_a_static_cache_gives_eagers_tokens(name):
    """transformers' recipe for torch.compile: a static KV cache (fixed shapes, written in place
    at `cache_position`, which the backend gets functionalised) and a compiled `model.forward`."""
    zm = zoo()[name]
    model = zm.model("sdpa")
    ids = torch.randint(4, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    settings = dict(max_new_tokens=16, do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, **settings)
        torch._dynamo.reset()
        backend = minicomp.backend(**({} if _verified(name) else {"verify_target": "off"}))
        model.forward = torch.compile(model.forward, backend=backend)
        out = model.generate(ids, **settings)
    torch._dynamo.reset()
    assert ref.shape == (2, 6 + 16)
    assert torch.equal(out, ref), (out, ref)
    rep = backend.report()
    assert not rep.failures and rep.kernels > 0, rep.table()
    # prefill and one decoding step: the cache keeps every decoding step's shapes the same
    assert len(rep.graphs) == 2 and not any(g.symbolic for g in rep.graphs), rep.table()


@pytest.mark.parametrize("name,padded", [("llama", False), ("gpt2", False), ("llama", True)],
                         ids=["llama", "gpt2", "llama-left_pad"])
def test_greedy_generation_through_minicomp_compile_gives_eagers_tokens(name, padded):
    """The same recipe with `minicomp.compile(model.forward)`: generate calls forward with keywords
    and a StaticCache, which the own capture refuses before running anything; the function goes
    through Dynamo (one warning) and the cache's in-place writes are the caller's, as in eager.
    Left-padded: a batched prompt whose second row starts with two pad tokens."""
    zm = zoo()[name]
    model = zm.model("sdpa")
    ids = torch.randint(4, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    settings = dict(max_new_tokens=16, do_sample=False, cache_implementation="static", pad_token_id=0)
    if padded:
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[1, :2] = 0
        ids = ids.masked_fill(mask == 0, 0)
        settings["attention_mask"] = mask
    with torch.no_grad():
        ref = model.generate(ids, **settings)
        torch._dynamo.reset()
        model.forward = minicomp.compile(model.forward, **({} if _verified(name) else {"verify_target": "off"}))
        with pytest.warns(UserWarning, match="a StaticCache; minicomp's own capture takes tensors") as caught:
            out = model.generate(ids, **settings)
    torch._dynamo.reset()
    assert sum("minicomp" in str(w.message) for w in caught) == 1       # said once, not per step
    assert ref.shape == (2, 6 + 16)
    assert torch.equal(out, ref), (out, ref)
    assert "StaticCache" in model.forward.explain()
    rep = model.forward.backend_report()
    assert not rep.failures and rep.kernels > 0, rep.table()
    assert len(rep.graphs) == 2 and not any(g.symbolic for g in rep.graphs), rep.table()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_a_model_called_with_keywords_through_minicomp_compile_gives_eagers_answer(name):
    """`minicomp.compile(model)(input_ids=..., attention_mask=...)`: keywords are taken; Llama
    returns its DynamicCache and BERT's mask code reads the mask's values, so both go through
    Dynamo, once, and every call after it (plain, right- and left-padded) matches eager."""
    zm = zoo()[name]
    model = zm.model("sdpa")
    torch._dynamo.reset()
    f = minicomp.compile(model, **({} if _verified(name) else {"verify_target": "off"}))
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for call in zm.calls:
            kwargs, valid = zm.inputs(call, model)
            ref, out = getattr(model(**kwargs), zm.output), getattr(f(**kwargs), zm.output)
            assert out.shape == ref.shape
            torch.testing.assert_close(out[valid], ref[valid], **tol(torch.float32))
    torch._dynamo.reset()
    assert sum("own capture cannot take it whole" in str(w.message) for w in caught) == 1
    assert f.refused is not None and f.backend_report().kernels > 0


def test_docs_zoo_table_has_a_row_per_model_and_attention():
    """docs/zoo.md (written by scripts/zoo_coverage.py --write docs/zoo.md) records each zoo model's
    kernels and ops through PyTorch; a model added to the zoo without running it again fails here."""
    from pathlib import Path

    from zoo_models import ZOO
    doc = (Path(__file__).resolve().parent.parent / "docs" / "zoo.md").read_text()
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]) for line in doc.splitlines() if line.startswith("| ")}
    missing = [(n, a) for n, zm in ZOO.items() for a in zm.attns if (n, a) not in rows]
    assert not missing, f"docs/zoo.md lacks {missing}: run python scripts/zoo_coverage.py --write docs/zoo.md"

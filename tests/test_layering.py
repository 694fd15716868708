"""The house rules that CI enforces on the source itself: the layering of minicomp's
packages (the contracts in `.importlinter`, checked by import-linter over the real import
graph, lazy imports included) and the line cap of every source file (minicomp/ and benchmarks/)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / ".importlinter"
LINE_CAP = 400

lint = pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra").lint_imports


def run_lint(config: Path, capsys) -> tuple[int, str]:
    code = lint(config_filename=str(config), no_cache=True)
    return code, capsys.readouterr().out


def test_stages_import_only_down_the_pipeline_and_siblings_have_no_cycles(capsys):
    code, report = run_lint(CONTRACTS, capsys)
    assert code == 0, report
    assert "2 kept, 0 broken" in report, report


def test_the_contract_breaks_when_a_lower_stage_would_sit_above(tmp_path, capsys):
    # The same contracts with codegen and plan swapped: codegen imports the Plan, so the
    # layers contract must break (and name that import): the check reads the real graph.
    text = CONTRACTS.read_text()
    assert "    explain | codegen | runtime\n    plan\n" in text
    swapped = text.replace("    explain | codegen | runtime\n    plan\n", "    plan\n    explain | codegen | runtime\n")
    config = tmp_path / "swapped.ini"
    config.write_text(swapped)
    code, report = run_lint(config, capsys)
    assert code != 0, report
    assert "minicomp.codegen" in report and "minicomp.plan" in report and "BROKEN" in report


def test_no_source_file_exceeds_the_line_cap():
    sources = sorted((ROOT / "minicomp").rglob("*.py"))
    assert len(sources) > 50                       # the tree was found
    sources += sorted((ROOT / "benchmarks").rglob("*.py"))   # the suite, ablations and prototypes too
    over = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > LINE_CAP}
    assert not over, f"split these by concern (cap {LINE_CAP} lines): {over}"


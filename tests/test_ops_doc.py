"""docs/ops.md is generated from the op table: the committed page must be what it generates."""

from minicomp.frontend import fx_ops, ops_doc


def test_docs_ops_md_is_current():
    assert ops_doc.DOC.read_text() == ops_doc.render(), (
        "docs/ops.md is stale: run .venv/bin/python -m minicomp.frontend.ops_doc")
    assert ops_doc.main(["--check"]) == 0


def test_every_lowered_overload_has_a_row_naming_its_test():
    text = ops_doc.render()
    for target in fx_ops.LOWERINGS:
        assert f"| `{target}` |" in text and f"`{ops_doc.TEST}[{target}]`" in text, target


def test_a_stale_page_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "ops.md"
    stale.write_text(ops_doc.render().replace("aten.add.Tensor", "aten.add.Renamed"))
    monkeypatch.setattr(ops_doc, "DOC", stale)
    assert ops_doc.main(["--check"]) == 1
    assert "is stale" in capsys.readouterr().err

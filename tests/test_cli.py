"""The `minicomp compile` command: the main job, its dumps, exit codes and error paragraphs."""

import subprocess
import sys
from pathlib import Path

import pytest

from minicomp.cli import main

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "minicomp.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("sample", ["gpt_block.py", "llama_block.py"])
def test_blocks_dump_ir_without_opaque_nodes_and_check_against_eager(sample, capsys):
    code = main(["compile", str(SAMPLES / sample), "--dump-ir", "--dump-plan", "--check", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "opaque" not in out.out
    assert "graph " in out.out and "return %" in out.out
    assert "check: compiled kernels agree with eager" in out.out
    assert "FAIL" not in out.out


def test_print_after_all_and_dump_dir_show_each_pass(tmp_path, capsys):
    code = main(["compile", str(SAMPLES / "gpt_block.py"), "--print-after-all", "--dump-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert any("constant_fold" in d for d in dumps) and any("cse" in d for d in dumps)
    assert "nodes" in out.out + out.err


def test_missing_file_is_a_user_error_without_traceback():
    r = run_cli("compile", "no/such/model.py", "--dump-ir")
    assert r.returncode == 1
    assert "no/such/model.py: no such file" in r.stderr
    assert "Traceback" not in r.stderr


def test_wrong_suffix_is_a_user_error(tmp_path, capsys):
    f = tmp_path / "model.txt"
    f.write_text("x")
    assert main(["compile", str(f)]) == 1
    assert "expected a .py model file or a .mc program" in capsys.readouterr().err


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compile", str(SAMPLES / "rmsnorm.mc"), "--dim", "M4"])
    assert e.value.code == 2
    assert "--dim expects NAME=INT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_unknown_pass_lists_the_known_ones(capsys):
    code = main(["compile", str(SAMPLES / "softmax.py"), "--passes", "cse,frobnicate"])
    err = capsys.readouterr().err
    assert code == 1
    assert "frobnicate" in err and "constant_fold" in err

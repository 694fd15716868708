"""docs/dsl.md is current and right: its generated tables match the frontend, its programs
compile, its error examples give exactly the messages shown, and its Python example runs.

Program blocks (```mc) may start with `# dims: A=1, B=2` (the symbols to bind) and
`# entry: name` comment lines. Error blocks (```mc-error) are each followed by a ```text
block holding the whole message, caret included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from conftest import tol
from minicomp.errors import SourceError
from minicomp.frontend import dsl_doc
from minicomp.frontend.dsl import load_dsl
from minicomp.frontend.dsl_builtins import BUILTINS
from minicomp.frontend.dsl_limits import MAX_NESTING, MAX_PROGRAM_BYTES
from minicomp.ir.interpret import random_inputs, run
from minicomp.ir.verify import verify

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "dsl.md"
TEXT = DOC.read_text(encoding="utf-8")
PROGRAMS = re.findall(r"```mc\n(.*?)```", TEXT, re.S)
ERRORS = re.findall(r"```mc-error\n(.*?)```\n\n```text\n(.*?)```", TEXT, re.S)


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINICOMP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def _header(program: str) -> tuple[dict[str, int], str | None]:
    dims = re.search(r"^# dims: (.*)$", program, re.M)
    entry = re.search(r"^# entry: (\w+)$", program, re.M)
    bound = {k.strip(): int(v) for k, v in (kv.split("=") for kv in dims.group(1).split(","))} if dims else {}
    return bound, entry.group(1) if entry else None


def test_generated_sections_are_current():
    assert dsl_doc.render(TEXT) == TEXT, "docs/dsl.md is stale: run python -m minicomp.frontend.dsl_doc"
    assert dsl_doc.main(["--check"]) == 0


def test_every_builtin_has_one_row_with_its_signature():
    section = TEXT.split("<!-- generated:builtins -->")[1].split("<!-- end:builtins -->")[0]
    rows = re.findall(r"^\| `(\w+)\((.*?)\)` \|", section, re.M)
    names = [name for name, _ in rows]
    assert sorted(names) == sorted(BUILTINS), set(names) ^ set(BUILTINS)
    for name, params in rows:
        assert f"{name}({params})" == BUILTINS[name].signature()


def test_a_stale_page_is_detected():
    stale = TEXT.replace("| `exp(x)` |", "| `exp(x, base=e)` |")
    assert dsl_doc.render(stale) == TEXT
    with pytest.raises(ValueError, match="generated:builtins"):
        dsl_doc.render(TEXT.replace("<!-- end:builtins -->", ""))


def test_the_page_states_the_limits_the_frontend_enforces():
    assert f"nesting: {MAX_NESTING} levels" in TEXT
    assert f"at most {MAX_PROGRAM_BYTES // (1024 * 1024)} MiB" in TEXT


def test_the_page_has_examples_of_each_kind():
    assert len(PROGRAMS) >= 5 and len(ERRORS) >= 6


@pytest.mark.parametrize("program", PROGRAMS, ids=[re.search(r"func (\w+)", p).group(1) for p in PROGRAMS])
def test_every_program_compiles_and_runs_in_the_reference(program):
    dims, entry = _header(program)
    graph = load_dsl(program, "example.mc", entry=entry, dims=dims)
    verify(graph)
    outs = run(graph, random_inputs(graph, seed=0))
    assert outs and all(torch.isfinite(o.float()).all() for o in outs)


@pytest.mark.parametrize("program,message", ERRORS, ids=[re.search(r"func (\w+)", p).group(1) for p, _ in ERRORS])
def test_every_error_example_gives_the_message_shown(program, message):
    with pytest.raises(SourceError) as info:
        load_dsl(program, "example.mc")
    assert str(info.value) + "\n" == message


def _program(name: str) -> str:
    return next(p for p in PROGRAMS if re.search(rf"func {name}\(", p))


def test_layernorm_example_end_to_end_against_eager():
    f = minicomp.compile_dsl(_program("layernorm"), entry="layernorm")
    x, w, b = torch.randn(2, 3, 5), torch.randn(5), torch.randn(5)
    torch.testing.assert_close(f(x, w, b), F.layer_norm(x, (5,), w, b, eps=1e-5), **tol(torch.float32))


def test_causal_attention_example_end_to_end_against_eager():
    f = minicomp.compile_dsl(_program("causal_attention"))
    q, k, v = (torch.randn(1, 2, 7, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(f(q, k, v), want, **tol(torch.float32))


def test_rmsnorm_example_end_to_end_in_bf16_against_eager():
    f = minicomp.compile_dsl(_program("rmsnorm"))
    x, w = torch.randn(4, 33).to(torch.bfloat16), torch.randn(33).to(torch.bfloat16)
    xf = x.float()
    want = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
    torch.testing.assert_close(f(x, w), want, **tol(torch.bfloat16))


def test_the_python_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", TEXT, re.S).group(1)
    check = code + ("\nx = torch.randn(37, 67)\nassert torch.allclose(softmax(x), torch.softmax(x, -1), atol=1e-5)\n"
                    "assert torch.equal(double(torch.ones(5)), torch.full((5,), 2.0))\nprint('ran')\n")
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ran"), done.stderr[-2000:]

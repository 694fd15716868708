"""The `minicomp compile` command: the main job, its dumps, exit codes and error paragraphs."""

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minicomp import check, explain
from minicomp.cli import main
from minicomp.errors import UsageError
from minicomp.frontend import dsl_ast as ast
from minicomp.frontend.dsl_entry import called_functions
from minicomp.frontend.dsl_parse import parse_module
from minicomp.runtime.cache import cache_root

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def run_cli(*args, module="minicomp.cli"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("sample", ["gpt_block.py", "llama_block.py"])
def test_blocks_dump_ir_without_opaque_nodes_and_check_against_eager(sample, capsys):
    code = main(["compile", str(SAMPLES / sample), "--dump-ir", "--dump-plan", "--check", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "opaque" not in out.out
    assert "graph " in out.out and "return %" in out.out
    assert "check: compiled kernels agree with eager" in out.out
    assert re.search(r"inputs: x float32\[2, 13, 64\] \(from the file's example_inputs\(\)\), and the model's "
                     r"\d+ weight tensor\(s\)", out.out), out.out          # weights are inputs, named apart
    assert "FAIL" not in out.out


def test_print_after_all_and_dump_dir_show_each_pass(tmp_path, capsys):
    code = main(["compile", str(SAMPLES / "gpt_block.py"), "--print-after-all", "--dump-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert any("constant_fold" in d for d in dumps) and any("cse" in d for d in dumps)
    assert "nodes" in out.out + out.err


# ----------------------------------------------------------------------------- exit codes

def test_missing_file_is_a_user_error_without_traceback():
    r = run_cli("compile", "no/such/model.py", "--dump-ir")
    assert r.returncode == 1
    assert "no/such/model.py: no such file" in r.stderr
    assert "Traceback" not in r.stderr


def test_wrong_suffix_is_a_user_error(tmp_path, capsys):
    assert main(["compile", write(tmp_path, "model.txt", "x")]) == 1
    assert "expected a .py model file or a .mc program" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--dim", "M4"], "--dim expects NAME=INT, got 'M4'"),
    (["--dim", "M=four"], "--dim M: 'four' is not an integer"),
    (["--dim", "M=-3"], "--dim M=-3: a dimension is a non-negative integer"),
    (["--machine", "h900"], "unknown machine 'h900'; known machines: h200, h100, a100"),
    (["--passes", "cse,frobnicate"], "unknown pass 'frobnicate'"),
], ids=["dim-form", "dim-value", "dim-negative", "machine", "passes"])
def test_bad_option_values_are_usage_errors_exit_2(flags, words, capsys):
    # each used to exit 1 (as an input error), or raise SystemExit from deep inside
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "N=7", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minicomp: usage error: ") and words in err


def test_unknown_pass_lists_the_known_ones(capsys):
    assert main(["compile", str(SAMPLES / "softmax.py"), "--passes", "cse,frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "frobnicate" in err and "constant_fold" in err


def test_dim_for_a_python_model_is_a_usage_error(capsys):
    assert main(["compile", str(SAMPLES / "softmax.py"), "--dim", "M=4"]) == 2
    assert "--dim binds the symbols of a .mc program" in capsys.readouterr().err


def test_unknown_option_and_command_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    r = run_cli("compile", str(SAMPLES / "softmax.mc"), "--frobnicate")
    assert r.returncode == 2 and "unrecognized arguments: --frobnicate" in r.stderr


def test_cuda_asked_for_without_a_gpu_is_an_input_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=3", "--dim", "N=5", "--device", "cuda"]) == 1
    assert "--device cuda: no CUDA device is available here" in capsys.readouterr().err


def test_failed_check_exits_1_and_names_the_worst_element(monkeypatch, capsys):
    from minicomp.ir import interpret
    real = interpret.run
    monkeypatch.setattr(interpret, "run", lambda g, ins: [t + 0.5 for t in real(g, ins)])   # a wrong reference
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=3", "--dim", "N=5", "--check"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  15 of 15 element(s) outside atol 1e-4 + rtol 1e-4 x |expected| for float32" in out
    assert re.search(r"worst at \[\d, \d\]: got \S+, expected \S+ \(max abs error 0\.5\)", out), out
    assert "check: MISMATCH with eager" in out


def test_check_compares_what_the_kernels_compute_not_the_eager_first_call(monkeypatch, capsys):
    """On a GPU the first call's answer may be eager's own (kernels still compiling in the
    background: codegen/first_calls.py); `--check` then waits for them and checks a second call."""
    from minicomp import api
    from minicomp.runtime import background
    calls, pending = [], [True]
    real = api.run_compiled

    def counted(compiled, inputs):
        calls.append(len(calls))
        return real(compiled, inputs)
    monkeypatch.setattr(api, "run_compiled", counted)
    monkeypatch.setattr(background, "any_pending", lambda: pending[0])
    monkeypatch.setattr(background, "wait_compiled", lambda timeout=None: pending.__setitem__(0, False) or True)
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=3", "--dim", "N=5", "--check"]) == 0
    assert calls == [0, 1] and not pending[0]
    assert "check: " in capsys.readouterr().out


# ----------------------------------------------------------------------------- the entry of a .mc file

TWO = "func a(x: f32[N]) -> f32[N] {\n  return x\n}\nfunc b(x: f32[N]) -> f32[N] {\n  return exp(x)\n}\n"


def test_mc_file_with_several_entries_exits_2_listing_them(tmp_path, capsys):
    # it used to compile the last function silently
    path = write(tmp_path, "two.mc", TWO)
    assert main(["compile", path, "--dim", "N=4", "--dump-ir"]) == 2
    err = capsys.readouterr().err
    assert "several functions could be the entry (a, b): pass --entry NAME" in err
    assert main(["compile", path, "--dim", "N=4", "--dump-ir", "--entry", "a"]) == 0
    assert "graph a(" in capsys.readouterr().out
    assert main(["compile", path, "--dim", "N=4", "--entry", "c"]) == 2
    assert "no function named 'c'; it defines a, b" in capsys.readouterr().err


@pytest.mark.parametrize("source, entry", [
    # the entry first and its helper last: the old rule (the last function) compiled the helper
    ("func top(x: f32[N]) -> f32[N] {\n  return helper(x) * 2\n}\n"
     "func helper(x: f32[N]) -> f32[N] {\n  return exp(x)\n}\n", "top"),
    (TWO + "func main(x: f32[N]) -> f32[N] {\n  return a(x) + 1\n}\n", "main"),
    (TWO.replace("func a", "func _a"), "b"),                          # a private name is no entry
    ("func g(x: f32[N]) -> f32[N] {\n  return f(x)\n}\n"
     "func f(x: f32[N]) -> f32[N] {\n  return h(x)\n}\n"
     "func h(x: f32[N]) -> f32[N] {\n  return x\n}\n", "g"),           # a chain: only its head
], ids=["entry-first", "main", "private", "chain"])
def test_mc_entry_is_main_or_the_only_function_nothing_calls(source, entry, tmp_path, capsys):
    assert main(["compile", write(tmp_path, "p.mc", source), "--dim", "N=4", "--dump-ir"]) == 0
    assert f"graph {entry}(" in capsys.readouterr().out


def test_mc_file_whose_functions_are_all_called_or_private_names_them(tmp_path, capsys):
    source = TWO.replace("func a", "func _a").replace("func b", "func _b")
    assert main(["compile", write(tmp_path, "p.mc", source), "--dim", "N=4"]) == 2
    err = capsys.readouterr().err
    assert "no function is an entry" in err and "it defines _a, _b" in err


def test_entry_rule_walks_deep_bodies_without_recursion():
    expr = ast.Call("helper", [ast.Name("x", ast.Pos(1, 1))], [], ast.Pos(1, 1))
    for _ in range(20000):                                    # far past Python's recursion limit
        expr = ast.Neg(expr, ast.Pos(1, 1))
    f = ast.FuncDef("top", [], None, [ast.Return([expr], ast.Pos(1, 1))], ast.Pos(1, 1))
    assert called_functions(f, {"top", "helper"}) == {"helper"}


def test_load_dsl_refuses_an_ambiguous_entry_with_a_usage_error():
    from minicomp.frontend.dsl import load_dsl
    with pytest.raises(UsageError, match=r"several functions could be the entry \(a, b\)"):
        load_dsl(TWO, "two.mc", dims={"N": 4})
    assert list(parse_module(TWO, "two.mc").funcs) == ["a", "b"]


def test_python_model_with_several_candidates_exits_2_listing_them(tmp_path, capsys):
    path = write(tmp_path, "m.py", "import torch\n\ndef f(x):\n    return x\n\ndef g(x):\n    return x * 2\n\n"
                                   "def example_inputs():\n    return [torch.randn(3)]\n")
    assert main(["compile", path]) == 2
    assert "several possible models (f, g); name one `model` or pass --entry NAME" in capsys.readouterr().err
    assert main(["compile", path, "--entry", "h"]) == 2
    assert "no entry named 'h' (candidates: f, g)" in capsys.readouterr().err
    assert main(["compile", path, "--entry", "g", "--dump-ir"]) == 0


# ----------------------------------------------------------------------------- carets in Python files

def _diagnostic(err: str) -> tuple[int, int, str, str]:
    lines = err.splitlines()
    k = next(i for i, line in enumerate(lines) if re.search(r":\d+:\d+: error: ", line))
    line, col = map(int, re.search(r":(\d+):(\d+): error: ", lines[k]).groups())
    return line, col, lines[k + 1], lines[k + 2]


@pytest.mark.parametrize("source, line, culprit", [
    # example_inputs() fails (frontend/loader.py), eight spaces deep
    ("import torch\n\ndef f(x):\n    return x\n\ndef example_inputs():\n    if True:\n        if True:\n"
     "            return [torch.randn(3, 4) @ torch.randn(5, 6)]\n", 9, "torch.randn(3, 4) @"),
    # capture fails (frontend/fx_trace.py), on a line indented with tabs
    ("import torch\n\ndef f(x):\n\tif True:\n\t\ty = torch.exp(x) + torch.ones(5)\n\treturn y\n\n"
     "def example_inputs():\n\treturn [torch.randn(3, 4)]\n", 5, "torch.exp(x) + torch.ones(5)"),
    # a syntax error, indented
    ("import torch\n\ndef f(x):\n    if True:\n        return x +* 2\n", 5, "* 2"),
], ids=["example-inputs", "capture-tabs", "syntax"])
def test_python_errors_show_the_line_as_written_with_the_caret_under_the_column(source, line, culprit,
                                                                               tmp_path, capsys):
    # the line used to be shown without its indentation while the caret kept the real column
    assert main(["compile", write(tmp_path, "m.py", source)]) == 1
    got_line, col, echoed, caret = _diagnostic(capsys.readouterr().err)
    written = source.splitlines()[line - 1].replace("\t", " ")     # a tab is one column, shown as a space
    assert got_line == line
    assert echoed == "    " + written
    assert caret == "    " + " " * (col - 1) + "^"
    if sys.version_info >= (3, 11) or culprit == "* 2":            # 3.10's frames carry no column
        assert written[col - 1:].startswith(culprit), (written, col)


# ----------------------------------------------------------------------------- --version, python -m

def test_version_and_python_dash_m_minicomp():
    r = run_cli("--version", module="minicomp")
    assert r.returncode == 0 and re.match(r"minicomp \d+\.\d+\.\d+, torch \S+, triton \S+", r.stdout), r
    r = run_cli("compile", str(SAMPLES / "softmax.mc"), "--dim", "M=3", "--dim", "N=5", "--dump-ir",
                module="minicomp")
    assert r.returncode == 0, r.stderr
    assert "graph softmax_rows(" in r.stdout


# ----------------------------------------------------------------------------- --check's report

def test_check_says_what_it_compared_and_the_tolerance_in_words(capsys):
    assert main(["compile", str(SAMPLES / "rmsnorm.mc"), "--dim", "B=2", "--dim", "S=3", "--dim", "C=8",
                 "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert ("check: 2 output(s) of the compiled kernels against minicomp's reference interpreter "
            "(the program run op by op in PyTorch), on cpu (Triton's interpreter)") in out
    assert "inputs: x float32[2, 3, 8], residual float32[2, 3, 8], weight float32[8] (random, seed 0" in out
    for k in (0, 1):
        assert re.search(rf"output {k}  float32\[2, 3, 8\]  ok    max abs error \S+ within atol 1e-4 \+ rtol 1e-4 "
                         r"x \|expected\| for float32", out), out
    assert main(["compile", str(SAMPLES / "softmax.py"), "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "against eager PyTorch (the model file's callable on the same inputs)" in out
    assert "(from the file's example_inputs())" in out


def test_compare_records_for_each_dtype_and_failure():
    x = torch.randn(4, 5)
    words = {c.dtype: c.line() for c in check.compare(
        [x.half(), x.bfloat16(), x.double(), torch.arange(6)], [x.half(), x.bfloat16(), x.double(), torch.arange(6)])}
    assert "within atol 2e-3 + rtol 2e-3 x |expected| for float16" in words[torch.float16]
    assert "within atol 2e-2 + rtol 2e-2 x |expected| for bfloat16" in words[torch.bfloat16]
    assert "within atol 1e-12 + rtol 1e-12 x |expected| for float64" in words[torch.float64]
    assert "equal (exact equality required for int64)" in words[torch.int64]
    c = check.compare_one(0, torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]))
    assert "1 of 3 element(s) differ (exact equality required for int64); worst at [2]: got 4, expected 3" in c.line()
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert check.compare_one(0, special.clone(), special).ok                 # NaN = NaN, equal infinities
    wrong = x.clone()
    wrong[2, 3] += 1.0
    c = check.compare_one(0, wrong, x)
    assert not c.ok and c.bad == 1 and c.worst == (2, 3) and c.max_abs == pytest.approx(1.0)
    c = check.compare_one(0, x, x.reshape(5, 4))
    assert not c.ok and "the compiled kernels give float32[4, 5], the reference float32[5, 4]" in c.line()
    ok, lines = check.report(check.compare([x], [x, x]), 1, 2, "ref", "cpu", "none")
    assert not ok and "the compiled kernels return 1 output(s), the reference 2" in "\n".join(lines)


def test_first_check_does_not_import_torch_testing_machinery(tmp_path):
    # torch.testing.assert_close's first call imported torch.distributed.tensor: 0.4-1.5 s
    code = ("import sys\nfrom minicomp.cli import main\nbefore = 'torch.distributed.tensor' in sys.modules\n"
            f"code = main(['compile', {str(SAMPLES / 'softmax.mc')!r}, '--dim', 'M=3', '--dim', 'N=5', '--check'])\n"
            "print(code, before, 'torch.distributed.tensor' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    code, before, after = r.stdout.split()[-3:]
    assert code == "0"
    if before == "False":
        assert after == "False"


# ----------------------------------------------------------------------------- bounds and devices

def test_bounds_are_labelled_as_the_machine_models_and_the_device_is_named(capsys):
    args = ["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=64", "--dim", "N=100", "--device", "cpu"]
    assert main([*args, "--dump-plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan for softmax_rows; bounds on the H200 model (4265 GB/s, bf16 685 TFLOP/s)")
    assert re.search(r"lower bound on the H200 model [\d.]+ µs", out)
    assert "would run on cpu (Triton's interpreter); --check runs it" in out
    assert re.search(r"^bound on the H200 model: [\d.]+ µs \(a roofline of the plan's bytes and flops\); "
                     r"not a time for cpu, where the kernels run under Triton's interpreter$", out, re.M), out
    assert main([*args, "--machine", "a100", "--check"]) == 0
    out = capsys.readouterr().out
    assert "bound on the A100 model: " in out and "runs on cpu (Triton's interpreter)" in out


def test_bound_line_on_a_gpu_names_it_and_the_model_that_fits(monkeypatch):
    import types
    plan = types.SimpleNamespace(machine="H200", lower_bound_us=12.3456)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    line = explain.bound_line(plan, "cuda")
    assert line.startswith("bound on the H200 model: 12.346 µs")
    assert line.endswith("this device is NVIDIA A100-SXM4-80GB, not the H200; --machine a100 models it")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert explain.bound_line(plan, "cuda").endswith("; this device is NVIDIA H200")


def test_plan_counts_fallback_groups_apart_from_triton_kernels(tmp_path, capsys):
    model = write(tmp_path, "intmm.py", "import torch\n\ndef f(x, w):\n    return (x @ w) + 1\n\n"
                                        "def example_inputs():\n    return [torch.randint(-5, 5, (4, 5)), "
                                        "torch.randint(-5, 5, (5, 2))]\n")
    assert main(["compile", model, "--dump-plan"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"compiled f: (\d+) groups? \((\d+) Triton kernels?, 1 through PyTorch\)", out), out


# ----------------------------------------------------------------------------- --dump-graph

def test_dump_graph_without_graphviz_says_why_there_is_no_svg(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(explain.shutil, "which", lambda name: None)
    out_dot = tmp_path / "g.dot"
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=5", "--dim", "N=7",
                 "--dump-graph", str(out_dot)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {out_dot}\nno g.svg: Graphviz's `dot` is not installed" in out
    assert out_dot.exists() and not (tmp_path / "g.svg").exists()


def test_dump_graph_when_dot_fails_shows_its_first_error_line(tmp_path, monkeypatch, capsys):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "dot"
    fake.write_text('#!/bin/sh\necho "Error: something broke" >&2\necho "more detail" >&2\nexit 3\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert main(["compile", str(SAMPLES / "softmax.mc"), "--dim", "M=5", "--dim", "N=7",
                 "--dump-graph", str(tmp_path / "g.dot")]) == 0
    assert f"no g.svg: {fake} failed: Error: something broke\n" in capsys.readouterr().out


# ----------------------------------------------------------------------------- no inputs unless something runs

HUGE = "func main(x: f32[M, N], w: f32[N]) -> f32[M, N] {\n  return softmax(x * w + 1.0, axis=-1)\n}\n"


def test_dumps_and_emit_of_a_huge_mc_program_build_no_inputs(tmp_path, monkeypatch, capsys):
    # --dump-ir alone used to allocate the random inputs: 40 GB here
    from minicomp.ir import interpret

    def refuse(*a, **k):
        raise AssertionError("random inputs built though nothing runs")
    monkeypatch.setattr(interpret, "random_inputs", refuse)
    start = time.perf_counter()
    assert main(["compile", write(tmp_path, "huge.mc", HUGE), "--dim", "M=100000", "--dim", "N=100000",
                 "--dump-ir", "--dump-plan", "--emit", str(tmp_path / "out"), "--dump-graph",
                 str(tmp_path / "g.dot")]) == 0
    assert time.perf_counter() - start < 60
    out = capsys.readouterr().out
    assert "input x : f32[100000, 100000]" in out and "40.00 GB" in out
    emitted = list((tmp_path / "out").glob("main*.py"))
    assert len(emitted) == 1 and f"wrote {emitted[0]}" in out
    page = tmp_path / "huge.html"                         # `minicomp report` without --bench: none either
    assert main(["report", str(tmp_path / "huge.mc"), "--dim", "M=100000", "--dim", "N=100000", "-o", str(page)]) == 0
    assert page.stat().st_size > 0


def test_compile_graph_without_loading_takes_meta_inputs_and_refuses_to_run():
    from minicomp.api import MinicompError, compile_graph
    from minicomp.frontend.dsl import load_dsl
    g = load_dsl(HUGE, "huge.mc", dims={"M": 100000, "N": 100000})
    metas = [torch.empty(g.node(i).shape, dtype=g.node(i).dtype, device="meta") for i in g.inputs]
    c = compile_graph(g, metas, device="cpu", load=False)
    assert c.generated.device_type == "cpu" and c.plan.groups and "def call(" in c.generated.source
    with pytest.raises(MinicompError, match="load=False"):
        c.call(*metas)


def test_check_builds_inputs_and_refuses_ones_that_cannot_fit(tmp_path, monkeypatch, capsys):
    from minicomp.ir import interpret
    built = []
    real = interpret.random_inputs
    monkeypatch.setattr(interpret, "random_inputs", lambda g, **k: built.append(g.name) or real(g, **k))
    path = write(tmp_path, "huge.mc", HUGE)
    assert main(["compile", path, "--dim", "M=3", "--dim", "N=5", "--check"]) == 0
    assert built == ["main"]
    assert main(["compile", path, "--dim", "M=1000000", "--dim", "N=1000000", "--check"]) == 1
    err = capsys.readouterr().err
    assert "--check needs random inputs for main: 4000.00 GB, more than this machine's" in err
    assert built == ["main"]


# ----------------------------------------------------------------------------- the test suite's own cache

def test_the_suite_writes_into_a_private_temporary_cache():
    root = cache_root()
    assert root == Path(os.environ["MINICOMP_CACHE_DIR"])
    assert Path.home() / ".cache" not in root.parents and root.name.startswith("minicomp-test-cache-")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()

"""The GPU-true check (codegen/target_check.py): every generated kernel is also compiled by
Triton's own compiler for a real GPU, on this machine without one, and a kernel that Triton
rejects on a GPU at run time falls back to PyTorch instead of raising Triton's traceback.

The two bugs at the top were found on the H200 and passed every CPU test before: the
interpreter executes the kernel's Python and skips the checks of Triton's frontend. Each
test here fails through the target compile alone (no GPU needed).
"""

import dataclasses
import os
from pathlib import Path
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

import minicomp
from minicomp.codegen import module as codegen_module
from minicomp.codegen import target_check
from minicomp.errors import CompileError, MinicompError
from minicomp.ir.graph import Graph
from minicomp.plan import plan_graph
from minicomp.target import Target, parse_verify_target


def sdpa_with_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("b,h,s,d,mask_shape", [
    (2, 3, 77, 80, (2, 1, 1, 77)),    # a padding mask broadcast over heads and queries (head dim 80)
    (2, 3, 1, 80, (2, 1, 1, 1)),      # one token: the mask is one value per batch row
    (1, 2, 33, 64, (1, 2, 1, 33)),    # broadcast over queries only
])
def test_attention_with_a_broadcast_additive_mask_compiles_for_sm90(b, h, s, d, mask_shape):
    """The mask's loads had `mask=None, other=0.0` where every index is in range: Triton's
    compiler refuses `other` without `mask`."""
    gen = torch.Generator().manual_seed(s)
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    m = torch.randn(mask_shape, generator=gen)
    f = minicomp.compile(sdpa_with_mask, verify_target="cuda:90")
    torch.testing.assert_close(f(q, k, v, m), sdpa_with_mask(q, k, v, m), **tol(torch.float32))
    assert any(name.startswith("mc_attn") for name in f._last.generated.kernel_names)


def one_position_of_an_arange(x):
    return x + torch.arange(5)[3:4]


def test_an_arange_read_at_one_position_compiles_for_sm90():
    """`arange` indexed at a constant used to be written `(0 + 1 * (3)).to(tl.int64)`: a Python
    int has no `.to` in Triton's compiler (the interpreter evaluates it as numpy)."""
    x = torch.randn(3, 1)
    f = minicomp.compile(one_position_of_an_arange, verify_target="cuda:90")
    torch.testing.assert_close(f(x), one_position_of_an_arange(x))
    assert "(3)).to(" not in f.source


def position_ids_of(ids):
    # what Hugging Face models compute from input_ids: positions after padding, per row
    mask = ids.ne(0)
    positions = torch.arange(ids.shape[1]).unsqueeze(0) - 1
    return torch.cat([positions, positions], 1) * mask.repeat(1, 2)


@pytest.mark.parametrize("length", [1, 7])
def test_position_ids_compile_for_sm90(length):
    ids = torch.randint(0, 3, (2, length), generator=torch.Generator().manual_seed(length))
    f = minicomp.compile(position_ids_of, verify_target="cuda:90")
    torch.testing.assert_close(f(ids), position_ids_of(ids))


def _breaking_cuda_pointwise(real):
    """A pointwise emitter that writes a call Triton has no such op for, in CUDA modules only:
    the interpreter never sees it, Triton's compiler rejects it."""
    def emit(ctx):
        kernel = real(ctx)
        if ctx.device_type == "cuda":
            kernel = dataclasses.replace(kernel, source=kernel.source.replace("tl.store(", "tl.store_no_such_op(", 1))
        return kernel
    return emit


def gelu_of_sum(x, y):
    return F.gelu(x + y)


def test_a_rejected_kernel_names_the_kernel_its_group_the_users_lines_and_tritons_message(monkeypatch):
    monkeypatch.setitem(codegen_module._EMITTERS, "pointwise",
                        _breaking_cuda_pointwise(codegen_module._EMITTERS["pointwise"]))
    x, y = torch.randn(4, 5), torch.randn(5)
    with pytest.raises(CompileError) as err:
        minicomp.compile(gelu_of_sum, verify_target="cuda:90")(x, y)
    text = str(err.value)
    assert "kernel mc_pw_add_gelu_0 (group 0, pointwise" in text
    assert "test_target_check.py:" in text                       # the user's line it computes
    assert "rejected by Triton's compiler for cuda:90" in text
    assert "store_no_such_op" in text                              # Triton's own message, with its source line
    # the same program without the check: the interpreter runs the (CPU) kernel, which is fine
    torch.testing.assert_close(minicomp.compile(gelu_of_sum, verify_target="off")(x, y), gelu_of_sum(x, y))


def _exp_with_a_broken_cuda_kernel(monkeypatch):
    """exp of an f16 [3, 7], its plan, and a pointwise emitter whose CUDA kernels Triton rejects."""
    monkeypatch.setitem(codegen_module._EMITTERS, "pointwise",
                        _breaking_cuda_pointwise(codegen_module._EMITTERS["pointwise"]))
    g = Graph("g")
    x = g.add_input("x", (3, 7), torch.float16)
    g.set_outputs([g.add("exp", x)])
    return g, plan_graph(g)


def test_the_check_compiles_the_cuda_module_even_for_a_cpu_target(monkeypatch):
    """A CPU module's kernels differ from a GPU's (interpreter forms); the check generates the
    module again for the target and compiles that one."""
    g, plan = _exp_with_a_broken_cuda_kernel(monkeypatch)
    codegen_module.generate(g, plan, Target("cpu"))                 # no check asked: fine
    with pytest.raises(CompileError, match="cuda:80"):
        codegen_module.generate(g, plan, Target("cpu", verify_arch=80))
    assert plan == plan_graph(g)                                      # the check leaves the plan alone


def test_verdicts_tell_text_errors_from_resource_limits():
    ok = {"error": None, "resources": False, "config": "BLOCK=64"}
    big = {"error": "OutOfResources: shared memory", "resources": True, "config": "BLOCK=4096"}
    bug = {"error": "CompilationError: at 3:4", "resources": False, "config": "BLOCK=64"}
    assert target_check.verdict_of("k", [ok, big]).error is None      # an autotuner skips the config that does not fit
    assert "OutOfResources" in target_check.verdict_of("k", [big, big]).error
    assert target_check.verdict_of("k", [ok, bug]).config == "BLOCK=64"
    assert "not in _WARM" in target_check.verdict_of("k", []).error


@pytest.mark.parametrize("text,arch", [("cuda:90", 90), ("sm_80", 80), ("86", 86), ("", None), ("off", None),
                                       (None, None)])
def test_verify_targets_are_read(text, arch):
    assert parse_verify_target(text) == arch


@pytest.mark.parametrize("text", ["cuda:75", "cuda:9.0", "rocm:90", "h200"])
def test_unknown_verify_targets_are_a_clear_error(text):
    with pytest.raises(MinicompError, match="expected cuda:NN with NN one of 80, 86, 89, 90"):
        parse_verify_target(text)
    with pytest.raises(MinicompError, match="verify target"):
        minicomp.compile(torch.exp, verify_target=text)(torch.randn(3))


def test_the_check_counts_what_it_compiled():
    before = target_check.stats()
    f = minicomp.compile(lambda x: torch.sigmoid(x) * 3.0, verify_target="cuda:90")
    f(torch.randn(6, 11))
    after = target_check.stats()
    assert after["configs"] >= before["configs"]     # memoised when this exact module was checked before
    assert after["kernels"] >= 1


def test_both_depths_reject_a_text_bug_in_every_config(monkeypatch):
    """The suite's "sampled" depth takes most configs through Triton's frontend and TritonGPU
    passes only; a kernel whose text Triton rejects fails at either depth."""
    g, plan = _exp_with_a_broken_cuda_kernel(monkeypatch)
    for depth in ("full", "sampled"):
        with pytest.raises(CompileError, match="store_no_such_op"):
            codegen_module.generate(g, plan, Target("cpu", verify_arch=90, verify_depth=depth))


def test_a_sampled_check_compiles_one_config_per_kernel_to_a_cubin_and_never_serves_a_cut_one():
    """At depth "sampled" each kernel has exactly one config compiled to a cubin (its shared
    memory measured), its least demanding; of the others, the most demanding and the table's
    first and last stop after the TritonGPU passes, and the rest are not compiled. The cut
    pipeline is part of Triton's cache key, so a full check of the same module afterwards
    measures every config: no empty binary from the cut compiles is ever handed out."""
    if os.environ.get("MINICOMP_VERIFY_TRITON"):
        pytest.skip("the worker runs another Triton, which may not key the cut (Triton 3.6 does "
                    "not: it compiles every config to a cubin, target_worker.py)")
    g = Graph("g")
    x = g.add_input("x", (33, 70), torch.float32)
    g.set_outputs([g.add("sum", g.add("exp", x), axes=(1,), keepdim=True)])
    check = codegen_module.generate(g, plan_graph(g), Target("cuda", (9, 0)))
    results = target_check._worker.results(check.source, 90, "sampled")
    by_kernel = {}
    for e in results:
        by_kernel.setdefault(e["kernel"], []).append(e)
    assert by_kernel and all(e["error"] is None for e in results)
    for entries in by_kernel.values():
        assert [e["stage"] for e in entries].count("cubin") == 1
        assert all((e["shared"] is None) == (e["stage"] == "ttgir") for e in entries)
    full = target_check._worker.results(check.source, 90, "full")
    assert all(e["stage"] == "cubin" and e["shared"] is not None for e in full)
    # the row kernel's table: (BLOCK_R 8, 1 warp) ... (BLOCK_R 64, 16 warps), least to most demanding
    table = [e["config"] for e in full if e["kernel"] == "mc_red_sum_0"]
    assert len(table) == 8, table
    sampled = by_kernel["mc_red_sum_0"]
    assert [e["config"] for e in sampled] == [table[0], table[-1]]
    assert [e["stage"] for e in sampled] == ["cubin", "ttgir"]
    assert {e["config"] for e in results} <= {e["config"] for e in full}


def test_an_unknown_check_depth_is_a_clear_error():
    with pytest.raises(MinicompError, match="MINICOMP_VERIFY_DEPTH='deep': expected one of full, sampled"):
        Target.for_device("cpu", {"MINICOMP_VERIFY_DEPTH": "deep"})


@pytest.mark.gpu
def test_gpu_a_kernel_rejected_at_run_time_falls_back_to_pytorch_visibly(monkeypatch):
    """On the GPU itself (check off), Triton's rejection at the kernel's first launch becomes a
    warning, the group runs through PyTorch, and the answer is eager's."""
    monkeypatch.setitem(codegen_module._EMITTERS, "pointwise",
                        _breaking_cuda_pointwise(codegen_module._EMITTERS["pointwise"]))
    x, y = torch.randn(64, 33, device="cuda"), torch.randn(33, device="cuda")
    f = minicomp.compile(gelu_of_sum, verify_target="off")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x, y)
    torch.testing.assert_close(out, gelu_of_sum(x, y), **tol(torch.float32))
    assert any("rejected by Triton's compiler" in str(w.message) for w in caught)
    assert "runs through PyTorch: kernel mc_pw_add_gelu_0 was rejected by Triton's compiler" in f.explain()
    torch.testing.assert_close(f(x, y), gelu_of_sum(x, y), **tol(torch.float32))   # the second call: no kernel


def test_the_cli_checks_a_target_and_names_a_bad_one(tmp_path):
    import subprocess
    import sys
    prog = tmp_path / "prog.mc"
    prog.write_text("func main(x: f32[4, 9], w: f32[9]) -> f32[4, 9] {\n  return exp(x) * w\n}\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "minicomp", "compile", str(prog), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    ok = run("--verify-target", "cuda:80", "--dump-plan")
    assert ok.returncode == 0, ok.stderr
    bad = run("--verify-target", "cuda:75")
    assert bad.returncode == 2 and "expected cuda:NN" in bad.stderr and "Traceback" not in bad.stderr


def test_the_worker_can_take_another_triton(tmp_path):
    """$MINICOMP_VERIFY_TRITON puts another Triton's install directory first on the worker's path
    (the device machine ran Triton 3.6 where this machine has a newer one, and 3.6 rejected a
    kernel the newer one compiled); unset, the worker finds this minicomp first and no other."""
    from minicomp.codegen.target_check import worker_env
    root = str(Path(__file__).resolve().parents[1])
    env = worker_env({"PYTHONPATH": "/x", "TRITON_INTERPRET": "1", "PYTHONSTARTUP": "s.py"})
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/x"]
    assert env["TRITON_INTERPRET"] == "0" and "PYTHONSTARTUP" not in env
    env = worker_env({"MINICOMP_VERIFY_TRITON": str(tmp_path)})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), root]

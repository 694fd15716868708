"""Runtime: the module cache (location, atomic entries, corruption), loading, guards, --emit modules."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tol

import minicomp
from minicomp import runtime
from minicomp.codegen import generate
from minicomp.errors import GuardError
from minicomp.ir import composites as C
from minicomp.ir.graph import Graph
from minicomp.plan import Group, Plan
from minicomp.runtime import cache as cache_mod
from minicomp.runtime.cache import ModuleCache, cache_key, cache_root


def rmsnorm_graph(shape=(6, 40), dtype=torch.float32, weight: torch.Tensor | None = None):
    g = Graph("rmsnorm")
    x = g.add_input("x", shape, dtype)
    w = g.constant(weight) if weight is not None else g.add_input("w", shape[-1:], dtype)
    g.set_outputs([C.rms_norm(g, x, 1, w, 1e-6)])
    nodes = [n.id for n in g.nodes() if n.kind not in ("input", "constant")]
    leaves = [n.id for n in g.nodes() if n.kind in ("input", "constant") and g.users(n.id)]
    plan = Plan(g.name, [Group(0, "reduction", nodes=nodes, inputs=leaves, outputs=list(g.outputs), name="rmsnorm")])
    return g, plan.with_specs(g)


def rand(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ----------------------------------------------------------------------------- cache location and key

def test_cache_location_follows_conventions(monkeypatch, tmp_path):
    monkeypatch.delenv("MINICOMP_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == Path.home() / ".cache" / "minicomp"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "minicomp"
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    assert ModuleCache().root == tmp_path / "mine"


def test_cache_key_depends_on_source_and_device():
    cpu = torch.device("cpu")
    assert cache_key("a", cpu) == cache_key("a", cpu)
    assert cache_key("a", cpu) != cache_key("b", cpu)
    assert len(cache_key("a", cpu)) == 64


def test_entry_is_written_once_and_verified(tmp_path):
    c = ModuleCache(tmp_path)
    path = c.store("ab" + "0" * 62, "print('hi')\n")
    assert path.exists() and path.parent.name == "ab"
    assert c.read("ab" + "0" * 62) == "print('hi')\n"
    mtime = path.stat().st_mtime_ns
    assert c.store("ab" + "0" * 62, "print('hi')\n") == path and path.stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]   # no temp file left


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_entry_is_rebuilt_and_still_matches_eager(damage, tmp_path):
    g, plan = rmsnorm_graph()
    gen = generate(g, plan, "cpu")
    c = ModuleCache(tmp_path)
    x, w = rand((6, 40)), rand((40,), seed=1)
    first = runtime.load(gen, "cpu", cache=c)
    torch.testing.assert_close(first(x, w)[0], F.rms_norm(x, (40,), w, 1e-6))
    text = first.path.read_text()
    damaged = {"garbage": "def call(*a):\n    return [torch.zeros(1)]\n\x00\x01 not python",
               "truncated": text[: len(text) // 2], "empty": ""}[damage]
    first.path.write_text(damaged)
    assert c.read(first.key) is None                          # detected, never trusted
    again = runtime.load(gen, "cpu", cache=c)
    assert again.path == first.path and again.path.read_text() == text
    torch.testing.assert_close(again(x, w)[0], F.rms_norm(x, (40,), w, 1e-6))


def test_unwritable_cache_compiles_in_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    c = ModuleCache(blocker / "cache")                          # mkdir fails, even for root
    g, plan = rmsnorm_graph()
    gen = generate(g, plan, "cpu")
    x, w = rand((6, 40)), rand((40,), seed=1)
    cache_mod._warned.discard(str(c.root))
    with pytest.warns(UserWarning, match="not writable"):
        f = runtime.load(gen, "cpu", cache=c)
    assert f.path is None
    torch.testing.assert_close(f(x, w)[0], F.rms_norm(x, (40,), w, 1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # the second load does not warn again
        runtime.load(gen, "cpu", cache=c)


# ----------------------------------------------------------------------------- loading

def test_loads_do_not_share_constants(tmp_path):
    """Same source, different weights: each load gets its own module object and CONSTANTS."""
    c = ModuleCache(tmp_path)
    x = rand((3, 16))
    outs = []
    for seed in (1, 2):
        w = rand((16,), seed=seed)
        g, plan = rmsnorm_graph((3, 16), weight=w)
        gen = generate(g, plan, "cpu")
        outs.append((runtime.load(gen, "cpu", cache=c), w, gen.source))
    assert outs[0][2] == outs[1][2]
    for f, w, _ in outs:
        torch.testing.assert_close(f(x)[0], F.rms_norm(x, (16,), w, 1e-6))


def test_load_checks_device(tmp_path):
    g, plan = rmsnorm_graph()
    gen = generate(g, plan, "cpu")
    with pytest.raises(GuardError, match="generated for cpu"):
        runtime.load(gen, "cuda", cache=ModuleCache(tmp_path))


# ----------------------------------------------------------------------------- guards

def test_signature_of_inputs():
    a = torch.zeros(4, 5)
    s1 = runtime.Signature.of([a, a.t()])
    assert s1 == runtime.Signature.of([torch.ones(4, 5), torch.ones(4, 5).t()])
    assert s1 != runtime.Signature.of([a, a.t().contiguous()])
    assert "input 1 stride" in runtime.Signature.of([a, a.t().contiguous()]).diff(s1)
    assert runtime.Signature.of([a[:, None]]) == runtime.Signature.of([torch.zeros(4, 1, 5)])
    assert runtime.Signature.of([a]).device == torch.device("cpu")
    with pytest.raises(GuardError, match="'y' must be a torch.Tensor"):
        runtime.Signature.of([a, 3.0], names=["x", "y"])


def test_guard_errors_name_the_input(tmp_path):
    g, plan = rmsnorm_graph((2, 8))
    f = runtime.load(generate(g, plan, "cpu"), "cpu", cache=ModuleCache(tmp_path))
    x, w = rand((2, 8)), rand((8,))
    with pytest.raises(GuardError, match=r"takes 2 input\(s\) \(x, w\), got 1"):
        f(x)
    with pytest.raises(GuardError, match=r"input 'w' must be f32\[8\], got f16\[8\]"):
        f(x, w.half())
    with pytest.raises(GuardError, match="'x' must be a torch.Tensor, got list"):
        f([1.0], w)
    assert isinstance(f(x, w), list)


# ----------------------------------------------------------------------------- --emit

def _run_script(path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the module sets it itself
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emitted_module_runs_standalone_and_matches_eager(dtype, tmp_path):
    w = rand((40,), dtype, seed=3)
    g, plan = rmsnorm_graph((6, 40), dtype, weight=w)
    gen = generate(g, plan, "cpu")
    path = gen.write(tmp_path / "emit")
    assert path.name.startswith("rmsnorm_") and path.with_suffix(".constants.pt").exists()
    done = _run_script(path)
    assert done.returncode == 0, done.stderr
    assert f"output 0: (6, 40) {dtype}" in done.stdout
    x = rand((6, 40), dtype, seed=4)
    torch.save([x], tmp_path / "in.pt")
    done = _run_script(path, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"))
    assert done.returncode == 0, done.stderr
    out = torch.load(tmp_path / "out.pt")[0]
    torch.testing.assert_close(out, F.rms_norm(x, (40,), w, 1e-6), **tol(dtype))


def test_two_models_emitted_into_one_directory_each_run_with_their_own_constants(tmp_path):
    """The second model's constants used to overwrite the first's `constants.pt`: the first module
    then ran with the other model's weights and exited 0."""
    x = rand((6, 40), seed=4)
    torch.save([x], tmp_path / "in.pt")
    paths, weights = [], [rand((40,), seed=5), rand((40,), seed=6)]
    for w in weights:
        g, plan = rmsnorm_graph((6, 40), weight=w)
        paths.append(generate(g, plan, "cpu").write(tmp_path / "emit"))
    assert paths[0] != paths[1] and len(list((tmp_path / "emit").glob("*.constants.pt"))) == 2
    for k, (path, w) in enumerate(zip(paths, weights)):
        done = _run_script(path, str(tmp_path / "in.pt"), str(tmp_path / f"out{k}.pt"))
        assert done.returncode == 0, done.stderr
        torch.testing.assert_close(torch.load(tmp_path / f"out{k}.pt")[0], F.rms_norm(x, (40,), w, 1e-6))


def test_an_emitted_module_refuses_constants_not_written_with_it(tmp_path):
    paths = []
    for seed in (5, 6):
        g, plan = rmsnorm_graph((6, 40), weight=rand((40,), seed=seed))
        paths.append(generate(g, plan, "cpu").write(tmp_path / "emit"))
    theirs = paths[1].with_suffix(".constants.pt").read_bytes()
    paths[0].with_suffix(".constants.pt").write_bytes(theirs)       # swapped in by hand
    done = _run_script(paths[0])
    assert done.returncode != 0 and "digest mismatch" in done.stderr


def test_an_emitted_module_with_an_aten_fallback_runs_on_its_own(tmp_path):
    """An op minicomp has no kernel for is written as its aten call (no OPAQUE callable), so
    the emitted module runs standalone; importing it (not only running it) works on a CPU."""
    import minicomp

    def f(x, w):
        return torch.nn.functional.hardshrink(x * w, 0.5).exp()    # hardshrink has no kernel
    x, w = rand((3, 7), seed=1), rand((7,), seed=2)
    c = minicomp.compile(f)
    c(x, w)
    assert "torch.ops.aten.hardshrink.default(" in c.source and "OPAQUE[" not in c.source
    path = c._last.generated.write(tmp_path / "emit")
    torch.save([x, w], tmp_path / "in.pt")
    done = _run_script(path, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"))
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(torch.load(tmp_path / "out.pt")[0], f(x, w))
    script = (f"import sys, torch; sys.path.insert(0, {str(path.parent)!r}); import {path.stem} as m; "
              f"print(m.call(*torch.load({str(tmp_path / 'in.pt')!r}))[0].shape)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "torch.Size([3, 7])" in done.stdout, done.stderr


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_load_cache_and_emit(tmp_path):
    w = rand((4096,), torch.bfloat16, seed=3)
    g, plan = rmsnorm_graph((256, 4096), torch.bfloat16, weight=w)
    gen = generate(g, plan, "cuda")
    c = ModuleCache(tmp_path / "cache")
    f = runtime.load(gen, "cuda", cache=c)
    x = rand((256, 4096), torch.bfloat16, seed=4)
    ref = F.rms_norm(x.cuda(), (4096,), w.cuda(), 1e-6)
    torch.testing.assert_close(f(x.cuda())[0], ref, **tol(torch.bfloat16))
    f.path.write_text("garbage")
    again = runtime.load(gen, "cuda", cache=c)
    torch.testing.assert_close(again(x.cuda())[0], ref, **tol(torch.bfloat16))
    with pytest.raises(GuardError, match="compiled for cuda"):
        again(x)
    path = gen.write(tmp_path / "emit")
    torch.save([x], tmp_path / "in.pt")
    done = _run_script(path, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"))
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(torch.load(tmp_path / "out.pt")[0].cuda(), ref, **tol(torch.bfloat16))


def test_every_registry_op_has_a_pytorch_fallback_form():
    """The fallback path (groups an emitter refuses, opaque nodes) can write any registry op."""
    from minicomp.codegen.fallback import torch_text
    from minicomp.ir import ops
    from minicomp.ir.graph import Node

    sample_attrs = {"approximate": "tanh", "exponent": 2.0, "min": -1.0, "max": 1.0, "dtype": torch.float16,
                    "diagonal": 0, "shape": (2, 3), "value": 1.0, "start": 0, "end": 3, "step": 1,
                    "axes": (1,), "keepdim": True, "correction": 1, "dims": (1, 0), "dim": 1,
                    "scale": 0.5, "is_causal": True, "enable_gqa": False, "fn": abs, "target": "abs",
                    "softcap": 0.0, "window": 0, "mask_fill": float("-inf"), "score_dtype": None,
                    "empty_rows": "zero",
                    "decimals": 1, "nan": None, "posinf": 2.0, "neginf": None, "alpha": 1.0, "input_scale": 1.0,
                    "negative_slope": 0.1, "min_val": -1.0, "max_val": 1.0, "beta": 1.0, "threshold": 20.0,
                    "eps": None, "shifts": (1,), "pad": (1, 1), "mode": "index", "axis": 1}
    for name, d in ops.REGISTRY.items():
        if d.kind in ("input", "constant"):
            continue
        n_args = d.arity if d.arity is not None else 3
        node = Node(7, name, tuple(range(n_args)), {k: sample_attrs[k] for k in d.attrs}, (2, 3), torch.float32)
        text = torch_text(node, [f"buf{i}" for i in range(n_args)], lambda _n: 0)
        assert text and "buf" in text or n_args == 0, (name, text)


def test_a_size_value_line_makes_its_tensor_on_the_device_without_a_host_copy():
    """A symbolic size read as a 0-d value by PyTorch lines (an eager branch or a fallback over
    symbolic sizes): eager's int64 tensor, made by a fill kernel, not copied from the host."""
    from minicomp.codegen.fallback import torch_text
    from minicomp.ir import dims
    from minicomp.ir.graph import Node
    past = dims.sym("s3")
    for value, env, want in ((7, {}, 7), (past + 1, {"s3": 11}, 12), (past * 2, {"s3": 5}, 10)):
        text = torch_text(Node(4, "size_value", (), {"value": value}, (), torch.int64), [], lambda _n: 0)
        assert "torch.tensor(" not in text, text
        got = eval(text, {"torch": torch, "device": torch.device("cpu"), **env})    # noqa: S307 - our own text
        assert (got.shape, got.dtype, got.item()) == ((), torch.int64, want)


def test_a_generated_run_allocates_through_the_devices_allocator():
    """run() takes `_rt.allocator(device)` once and allocates every buffer through it: on the CPU
    torch.empty_strided on that device (the shape, strides and dtype written at codegen)."""
    from minicomp.runtime import checks
    empty = checks.allocator(torch.device("cpu"))
    t = empty((3, 4, 5), (20, 1, 4), torch.bfloat16)
    assert (t.shape, t.stride(), t.dtype, t.device.type) == ((3, 4, 5), (20, 1, 4), torch.bfloat16, "cpu")
    f = minicomp.compile(lambda x, y: (torch.tanh(x) * y).sum(-1))
    x, y = torch.randn(6, 7), torch.randn(7)
    torch.testing.assert_close(f(x, y), (torch.tanh(x) * y).sum(-1), **tol(torch.float32))
    source = f.compile_for(x, y).generated.source
    assert "_empty = _rt.allocator(device)" in source and "torch.empty_strided(" not in source


@pytest.mark.gpu
def test_the_cuda_allocator_is_pytorchs_on_the_current_device():
    from minicomp.runtime import checks
    empty = checks.allocator(torch.device("cuda", torch.cuda.current_device()))
    assert checks.empty_strided_cuda is None or empty is checks.empty_strided_cuda
    t = empty((2, 3, 4), (12, 1, 3), torch.float16)
    assert (t.shape, t.stride(), t.dtype, t.device) == ((2, 3, 4), (12, 1, 3), torch.float16,
                                                        torch.device("cuda", torch.cuda.current_device()))
    from minicomp.runtime import tma
    scratch = tma._tma_scratch(1000, 128, None)        # Triton's TMA scratch, at each GEMM launch
    assert (scratch.shape, scratch.dtype, scratch.device) == ((1000,), torch.int8,
                                                               torch.device("cuda", torch.cuda.current_device()))
    assert scratch.data_ptr() % 128 == 0
    f = minicomp.compile(lambda x: torch.sigmoid(x) * 2 + x.mean(-1, keepdim=True))
    x = torch.randn(33, 65, device="cuda")
    torch.testing.assert_close(f(x), torch.sigmoid(x) * 2 + x.mean(-1, keepdim=True), **tol(torch.float32))

"""Launches in generated CUDA modules: the runtime's `Launcher` and `CompilingAtOnce`
(minicomp/runtime/launcher.py), driven by stand-in kernels, and the `Launch` records codegen
writes as call() lines and `_WARM` entries (codegen/launch.py).

The runtime is meant for CUDA; here it runs against fakes that record which path each launch
took, so its rules (Triton's path first, the compiled launcher after, Triton's path again for
misaligned tensors, another device, or a launcher that refuses the arguments) are checked on a
machine without a GPU. `pytest -m gpu` runs the real thing through every GPU test.
"""

from __future__ import annotations

import types

import pytest

import torch

import minicomp
from minicomp.codegen.common import Blocks, Buf, Grid, Launch
from minicomp.codegen.launch import fixed_grid, grid_text, launch_lines, warm_entry
from minicomp.runtime import launcher


class FakeCompiled:
    def __init__(self, log, refuse=False):
        self.log, self.refuse = log, refuse

    def __getitem__(self, grid):
        def runner(*args):
            if self.refuse:
                raise TypeError("launcher wants other arguments")
            self.log.append(("fast", grid, args))
        return runner


class FakeKernel:
    """An autotuned Triton kernel as `_launch` sees it: `kernel[grid](*args, **kwargs)` returns the
    compiled kernel; `arg_names` and `best_config` say how to complete the arguments."""

    def __init__(self, returns=True, refuse=False, tuned=True):
        self.log = []
        self.arg_names = ["x_ptr", "y_ptr", "n_rows", "BLOCK_R", "BLOCK_C"]
        self.best_config = types.SimpleNamespace(kwargs={"BLOCK_R": 2}) if tuned else None
        self.returns, self.refuse = returns, refuse

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log, self.refuse) if self.returns else None
        return launch


def helper(device=0):
    """A Launcher as a module binds it (`_launch`), its state (`_FAST`), and the current device."""
    current = {"device": device}
    launch = launcher.Launcher({}, current_device=lambda: current["device"])
    return {"_launch": launch, "_FAST": launch.fast}, current


def grid(meta):
    return (-(-meta["n_rows"] // meta["BLOCK_R"]),)


def test_first_launch_through_triton_then_the_compiled_launcher():
    ns, _ = helper()
    k = FakeKernel()
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "fast"]
    # the grid evaluated with the autotuned config, padded to three axes; constexprs appended in order
    assert k.log[1][1] == (4, 1, 1) and k.log[1][2] == (x, y, 8, 2, 4)


def test_a_trusting_launcher_tests_no_tensor_but_those_of_checked_launches(monkeypatch):
    """`Launcher(aligned=True)` (a generated CUDA module's): its launches take the fast launcher
    without testing their tensors' alignment; `checked` launches (a tensor PyTorch made) test
    them, and a misaligned one goes through Triton each time, keeping no fast launcher."""
    current = {"device": 0}
    launch = launcher.Launcher({}, current_device=lambda: current["device"], aligned=True)
    k = FakeKernel()
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    tested = []
    real = launcher._aligned
    monkeypatch.setattr(launcher, "_aligned", lambda args: tested.append(len(args)) or real(args))
    launch(k, grid, x, y, 8, BLOCK_C=4, _site="k#1")           # first: through Triton
    launch(k, grid, x, y, 8, BLOCK_C=4, _site="k#1")
    assert [e[0] for e in k.log] == ["triton", "fast"] and k.log[1][2] == (x, y, 8, 2, 4) and not tested
    launch.checked(k, grid, x, y, 8, BLOCK_C=4, _site="k#1")   # tested, aligned: the fast launcher
    assert k.log[-1][0] == "fast" and tested
    odd = torch.zeros(33)[1:].view(8, 4)                          # 4 bytes past an aligned start
    for _ in range(2):
        launch.checked(k, grid, odd, y, 8, BLOCK_C=4, _site="k#2")
        assert k.log[-1][0] == "triton"
    assert "k#2" not in launch.fast
    current["device"] = 1                                          # another device: Triton's path
    launch(k, grid, x, y, 8, BLOCK_C=4, _site="k#1")
    assert k.log[-1][0] == "triton"


class PendingKernel(FakeKernel):
    """As Triton 3.9 launches inside AsyncCompileMode: the launch returns the FutureKernel."""

    def __getitem__(self, grid):
        launch = super().__getitem__(grid)

        def pending(*args, **kwargs):
            compiled = launch(*args, **kwargs)
            return types.SimpleNamespace(result=lambda: compiled)
        return pending


def test_a_pending_compile_is_waited_for_and_its_kernel_kept():
    """In a module's first call the compiled kernel behind the FutureKernel is what the later
    launches call."""
    ns, _ = helper()
    k = PendingKernel()
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    for _ in range(2):
        ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "fast"]


def test_misaligned_tensors_and_another_device_go_through_triton():
    ns, current = helper()
    k = FakeKernel()
    x, y = torch.zeros(9, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)       # 2 bytes past an aligned start
    current["device"] = 1
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    current["device"] = 0
    ns["_launch"](k, grid, x, y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "triton", "triton", "fast"]


def test_a_misaligned_first_launch_captures_nothing():
    ns, _ = helper()
    k = FakeKernel()
    x, y = torch.zeros(9, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[1:], y, 8, BLOCK_C=4)
    ns["_launch"](k, grid, x[:8], y, 8, BLOCK_C=4)       # aligned at last: captured now
    ns["_launch"](k, grid, x[:8], y, 8, BLOCK_C=4)
    assert [e[0] for e in k.log] == ["triton", "triton", "triton", "fast"]


def test_a_refusing_launcher_or_no_compiled_kernel_keeps_to_triton():
    for kernel in (FakeKernel(refuse=True), FakeKernel(returns=False)):
        ns, _ = helper()
        x, y = torch.zeros(8), torch.zeros(8)
        for _ in range(3):
            ns["_launch"](kernel, grid, x, y, 8, BLOCK_C=4)
        assert [e[0] for e in kernel.log] == ["triton"] * 3
        assert ns["_FAST"][kernel] is False


def test_untuned_kernels_and_literal_grids():
    ns, _ = helper()
    k = FakeKernel(tuned=False)
    x, y = torch.zeros(8), torch.zeros(8)
    for _ in range(2):
        ns["_launch"](k, (3, 2), x, y, 8, BLOCK_R=1, BLOCK_C=4)
    assert k.log[1] == ("fast", (3, 2, 1), (x, y, 8, 1, 4))


class CompilationError(Exception):
    """Named as Triton's frontend error is: what the launcher recognises as a compile failure."""


class RejectedKernel(FakeKernel):
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise CompilationError("at 3:4: `other` cannot be provided without `mask`")
        return launch


def test_a_kernel_triton_rejects_raises_a_kernel_compile_error_naming_it():
    k = RejectedKernel()
    launch = launcher.Launcher({"mc_pw_add_0": k}, current_device=lambda: 0)
    with pytest.raises(launcher.KernelCompileError) as err:
        launch(k, grid, torch.zeros(8), torch.zeros(8), 8, BLOCK_C=4)
    assert err.value.kernel == "mc_pw_add_0" and "without `mask`" in err.value.cause
    # an error of the launch itself (not of Triton's compiler) is left as it is
    broken = FakeKernel()
    broken.__getitem__ = None
    with pytest.raises(TypeError):
        launcher.Launcher({}, current_device=lambda: 0)(object(), grid, torch.zeros(8))


def test_launch_records_are_written_as_call_lines():
    name = {0: "buf0", 5: "buf5"}.get
    tuned = Launch(Grid.of(Blocks(64, "BLOCK_R")), (Buf(0), Buf(5), 64, 4096), (("BLOCK_C", 4096),))
    assert launch_lines("mc_red_x_0", tuned, name, cuda=True) == [
        "_launch(mc_red_x_0, lambda meta: (triton.cdiv(64, meta['BLOCK_R']),), buf0, buf5, 64, 4096, BLOCK_C=4096)"]
    fixed = Launch(Grid.of(3, 6), (Buf(0), 0.5, float("-inf")), (("BLOCK_M", 32),))
    assert launch_lines("mc_attn_a_1", fixed, name, cuda=False) == [
        "mc_attn_a_1[(3, 6)](buf0, 0.5, -float('inf'), BLOCK_M=32)"]
    tma = Launch(Grid.of((Blocks(100, "BLOCK_M"), Blocks(72, "BLOCK_N")), persistent=True),
                 (Buf(0, align16=True), Buf(5)), (("M", 100),), tma=True)
    assert launch_lines("mc_gemm_2", tma, name, cuda=True) == [
        "_tma_ready()",
        "_launch(mc_gemm_2, lambda meta: (min(_sm_count(device), triton.cdiv(100, meta['BLOCK_M']) * "
        "triton.cdiv(72, meta['BLOCK_N'])),), _align16(buf0), buf5, M=100)"]
    # a tensor known aligned (an input run() laid out, a buffer it allocated) is passed as it is;
    # a module installs Triton's allocator once a call instead of before each TMA launch
    assert launch_lines("mc_gemm_2", tma, name, cuda=True, aligned={0, 5}, tma_ready=False) == [
        "_launch(mc_gemm_2, lambda meta: (min(_sm_count(device), triton.cdiv(100, meta['BLOCK_M']) * "
        "triton.cdiv(72, meta['BLOCK_N'])),), buf0, buf5, M=100)"]


def test_a_static_launch_passes_its_site_key_and_equal_signatures_share_it():
    """With the tensors' dtypes known, a launch of literal arguments is written
    `_launch(..., _site=key)`: the key is the kernel's name and a digest of its dtypes and literals,
    equal for launches that share a specialisation, different where a dtype or a size differs;
    a launch with a size known only at run time passes no key (the Launcher builds one)."""
    from minicomp.codegen.common import Runtime
    from minicomp.codegen.launch import site_key

    name = {0: "buf0", 5: "buf5", 7: "buf7"}.get
    bf16 = {0: torch.bfloat16, 5: torch.bfloat16, 7: torch.float32}.get
    one = Launch(Grid.of(Blocks(64, "BLOCK_R")), (Buf(0), 64, 4096), (("BLOCK_C", 4096),))
    (line,) = launch_lines("mc_red_x_0", one, name, cuda=True, dtype_of=bf16)
    key = site_key("mc_red_x_0", one, bf16)
    assert key.startswith("mc_red_x_0#") and line == (
        "_launch(mc_red_x_0, lambda meta: (triton.cdiv(64, meta['BLOCK_R']),), buf0, 64, 4096, "
        f"BLOCK_C=4096, _site={key!r})")
    assert site_key("mc_red_x_0", Launch(one.grid, (Buf(5), 64, 4096), one.kwargs), bf16) == key  # same dtype
    assert site_key("mc_red_x_0", Launch(one.grid, (Buf(7), 64, 4096), one.kwargs), bf16) != key  # fp32
    assert site_key("mc_red_x_0", Launch(one.grid, (Buf(0), 64, 2048), one.kwargs), bf16) != key  # a size
    assert site_key("mc_red_y_1", one, bf16) != key
    dynamic = Launch(one.grid, (Buf(0), Runtime("s0", 64), 4096), one.kwargs)
    (line,) = launch_lines("mc_red_x_0", dynamic, name, cuda=True, dtype_of=bf16)
    assert line.startswith("_launch(mc_red_x_0, ") and ", buf0, s0, 4096, " in line and "_site" not in line
    # a module's Launcher trusts the tensors it knows aligned (run()'s inputs and buffers); a launch
    # with another (one PyTorch made) goes through `checked`, which tests them
    (line,) = launch_lines("mc_red_x_0", one, name, cuda=True, dtype_of=bf16, aligned={0})
    assert line.startswith("_launch(mc_red_x_0, ") and line.endswith(f"_site={key!r})")
    two = Launch(one.grid, (Buf(0), Buf(7), 64, 4096), one.kwargs)
    assert launch_lines("mc_red_x_0", two, name, cuda=True, dtype_of=bf16, aligned={0})[0].startswith(
        "_launch.checked(mc_red_x_0, ")
    assert launch_lines("mc_red_x_0", two, name, cuda=True, dtype_of=bf16, aligned={0, 7})[0].startswith("_launch(")


def test_grids_evaluate_as_their_text_does():
    grid = Grid.of((Blocks(100, "BLOCK_M"), Blocks(72, "BLOCK_N"), 3), 7)
    meta = {"BLOCK_M": 32, "BLOCK_N": 16}
    assert grid.evaluate(meta) == eval(grid_text(grid), {"triton": __import__("triton")})(meta) == (4 * 5 * 3, 7)
    assert grid_text(Grid.of(12)) == "(12,)" and not Grid.of(12).needs_meta()


def test_a_launch_that_passes_its_block_sizes_has_a_grid_of_numbers():
    """A kernel of one config is not autotuned: its launch passes the block sizes, so the grid
    is computed where the module is written; sizes it does not pass stay the autotuner's."""
    grid = Grid.of((Blocks(100, "BLOCK_M"), Blocks(72, "BLOCK_N"), 3), 7)
    fixed = fixed_grid(grid, (("M", 100), ("BLOCK_M", 32), ("BLOCK_N", 16), ("num_warps", 4)))
    assert fixed.dims == ((4 * 5 * 3,), (7,)) and grid_text(fixed) == "(60, 7)"
    assert fixed.evaluate({}) == grid.evaluate({"BLOCK_M": 32, "BLOCK_N": 16})
    half = fixed_grid(grid, (("BLOCK_N", 16),))
    assert grid_text(half) == "lambda meta: (15 * triton.cdiv(100, meta['BLOCK_M']), 7)"
    assert half.evaluate({"BLOCK_M": 32}) == (60, 7)
    persistent = Grid.of(Blocks(100, "BLOCK_M"), persistent=True)
    line = launch_lines("mc_gemm_0", Launch(persistent, (Buf(0),), (("BLOCK_M", 64),)), "buf{}".format, cuda=True)
    assert line == ["_launch(mc_gemm_0, lambda meta: (min(_sm_count(device), 2),), buf0, BLOCK_M=64)"]


def test_a_pointwise_kernel_of_one_config_is_not_autotuned():
    from minicomp.codegen import generate
    from minicomp.ir.graph import Graph
    from minicomp.plan import Group, Plan
    for numel, tuned in ((300, False), (5000, True)):
        g = Graph("pw")
        x = g.add_input("x", (numel,), torch.float32)
        g.set_outputs([g.add("exp", x)])
        plan = Plan("pw", [Group(0, "pointwise", nodes=[1], inputs=[0], outputs=[1])]).with_specs(g)
        gen = generate(g, plan, "cuda")
        (kernel,) = gen.kernels
        assert ("@triton.autotune(" in gen.source) == tuned
        assert dict(kernel.launches[0].kwargs) == ({} if tuned else {"BLOCK": 512, "num_warps": 4})
        compile(gen.source, "<generated>", "exec")


# ----------------------------------------------------------------------------- warm-up: compiling at once

def test_warm_entries_write_tensors_as_dtypes_and_keep_literals():
    dtypes = {0: "torch.bfloat16", 5: "torch.float32"}.get
    launch = Launch(Grid.of(Blocks(64, "BLOCK_R")), (Buf(0), Buf(5, align16=True), 64, -3, 0.5), (("BLOCK_C", 4096),))
    assert warm_entry("mc_red_x_0", launch, dtypes) == \
        "(mc_red_x_0, (torch.bfloat16, torch.float32, 64, -3, 0.5), {'BLOCK_C': 4096}),"
    assert warm_entry("mc_a_1", Launch(Grid.of(1), (Buf(0),)), dtypes) == "(mc_a_1, (torch.bfloat16,), {}),"


class FakeJit:
    def __init__(self, log, fail=False):
        self.log, self.fail = log, fail

    def warmup(self, *args, grid, **kwargs):
        if self.fail:
            raise RuntimeError("cannot compile")
        self.log.append((self, args, kwargs))


class FakeTuned:
    def __init__(self, fn, configs):
        self.fn = fn
        self.configs = [types.SimpleNamespace(all_kwargs=lambda c=c: dict(c)) for c in configs]


def warm_helper(jobs, threads):
    """A module's view of the runtime's warm-up: its `_WARM` list, `_warm_up()` and
    `_compiling_at_once()` (what `call()` opens on its first run), with a private environment."""
    ns = {"os": types.SimpleNamespace(environ={"MINICOMP_COMPILE_THREADS": str(threads)}), "_WARM": list(jobs)}
    ns["_warm_up"] = lambda: launcher.warm_up(ns["_WARM"], environ=ns["os"].environ)
    ns["_compiling_at_once"] = lambda: launcher.CompilingAtOnce(ns["_WARM"], environ=ns["os"].environ)
    return ns


def test_warm_up_compiles_every_config_once_and_swallows_failures():
    log = []
    plain, tuned_fn, broken = FakeJit(log), FakeJit(log), FakeJit(log, fail=True)
    tuned = FakeTuned(tuned_fn, [{"BLOCK": 64, "num_warps": 4}, {"BLOCK": 128, "num_warps": 8}])
    jobs = [(broken, (torch.bfloat16,), {}), (plain, (torch.bfloat16, 7), {"BLOCK_C": 32}),
            (tuned, (torch.float32,), {"N": 5})]
    ns = warm_helper(jobs, threads=4)
    ns["_warm_up"]()
    assert sorted((id(f), a, tuple(sorted(k.items()))) for f, a, k in log) == sorted([
        (id(plain), (torch.bfloat16, 7), (("BLOCK_C", 32),)),
        (id(tuned_fn), (torch.float32,), (("BLOCK", 64), ("N", 5), ("num_warps", 4))),
        (id(tuned_fn), (torch.float32,), (("BLOCK", 128), ("N", 5), ("num_warps", 8)))])
    assert ns["_WARM"] == []
    ns["_warm_up"]()                      # once only
    assert len(log) == 3


def test_warm_up_is_off_with_one_thread():
    log = []
    ns = warm_helper([(FakeJit(log), (torch.bfloat16,), {}), (FakeJit(log), (torch.bfloat16,), {})], threads=1)
    ns["_warm_up"]()
    assert log == [] and ns["_WARM"] == []


class Pending:
    """What Triton's `warmup` returns under AsyncCompileMode: a FutureKernel, with its future."""
    def __init__(self, compiled):
        from concurrent.futures import Future
        self.future = Future()
        self.future.set_result(compiled)


def compiled_with(signature, constants, fail=False):
    src = types.SimpleNamespace(signature=signature, constants=constants)
    return types.SimpleNamespace(src=src, metadata=types.SimpleNamespace(fail=fail))


def test_warm_up_builds_each_launcher_stub_once(monkeypatch):
    """Each compiled kernel's launcher is built once per signature in the warm-up; a build that
    fails is left to the first launch; MINICOMP_WARM_LAUNCHERS=0 builds none."""
    import importlib

    # the module (the attribute `triton.runtime.driver` is its DriverConfig object)
    triton_driver = importlib.import_module("triton.runtime.driver")
    built = []

    class Launcher:
        def __init__(self, src, metadata):
            if metadata.fail:
                raise RuntimeError("no C compiler")
            built.append(src.signature)

    monkeypatch.setattr(triton_driver, "driver", types.SimpleNamespace(active=types.SimpleNamespace(launcher_cls=Launcher)))

    class Returning:
        def __init__(self, compiled):
            self.compiled = compiled

        def warmup(self, *args, grid, **kwargs):
            return Pending(self.compiled)

    a = {"x": "*bf16", "n": "i32"}
    jobs = [(Returning(compiled_with(a, {(2,): 64})), (torch.bfloat16, 7), {}),
            (Returning(compiled_with(dict(a), {(2,): 64})), (torch.bfloat16, 9), {}),   # same signature
            (Returning(compiled_with({"x": "*fp32"}, {})), (torch.float32,), {}),
            (Returning(compiled_with({"y": "*fp16"}, {}, fail=True)), (torch.float16,), {})]
    ns = warm_helper(jobs, threads=4)
    ns["_warm_up"]()
    assert sorted(map(repr, built)) == sorted([repr(a), repr({"x": "*fp32"})])

    built.clear()
    ns = warm_helper(jobs, threads=4)
    ns["os"].environ["MINICOMP_WARM_LAUNCHERS"] = "0"
    ns["_warm_up"]()
    assert built == []


class Submitting:
    """Like Triton's JITFunction under AsyncCompileMode: `warmup` submits a compile keyed by
    its arguments, and a launch with the same key gets the same pending compile."""
    def __init__(self, seconds=0.05, log=None):
        self.seconds, self.log = seconds, log if log is not None else []

    def _pending(self, args, kwargs):
        import time

        from triton.runtime._async_compile import active_mode
        mode = active_mode.get()
        key = (id(self), args, tuple(sorted(kwargs.items())))

        def compile_():
            time.sleep(self.seconds)
            self.log.append(("compiled", key))
            return ("kernel", key)
        if mode is None:
            return None
        import inspect
        hooks = [lambda kernel: None] * (len(inspect.signature(mode.submit).parameters) - 2)  # 3.9 adds a cleanup hook
        return mode.submit(key, compile_, *hooks)

    def warmup(self, *args, grid, **kwargs):
        return self._pending(args, kwargs)

    def launch(self, *args, **kwargs):
        """What a launch inside the mode does: wait for this key's compile, submitted or not."""
        pending = self._pending(args, kwargs)
        return pending.result() if pending is not None else ("compiled now", args)


def test_the_first_call_launches_while_the_other_kernels_compile():
    """Inside `_compiling_at_once()` a launch waits for its own kernel only, and gets the
    warm-up's compile (no second one); leaving it waits for every compile and closes the mode."""
    from triton.runtime._async_compile import active_mode

    log = []
    quick, slow = Submitting(0.01, log), Submitting(1.0, log)
    ns = warm_helper([(slow, (torch.bfloat16,), {}), (quick, (torch.float32, 3), {})], threads=4)
    with ns["_compiling_at_once"]():
        assert active_mode.get() is not None
        assert quick.launch(torch.float32, 3) == ("kernel", (id(quick), (torch.float32, 3), ()))
        assert [k for what, k in log] == [(id(quick), (torch.float32, 3), ())]      # the slow one still compiling
    assert active_mode.get() is None
    assert len(log) == 2 and ns["_WARM"] == []


def test_an_error_in_the_first_call_still_closes_the_compile_mode():
    from triton.runtime._async_compile import active_mode

    ns = warm_helper([(Submitting(), (torch.bfloat16,), {}), (Submitting(), (torch.float16,), {})], threads=2)
    with pytest.raises(ValueError, match="shape mismatch"):
        with ns["_compiling_at_once"]():
            raise ValueError("shape mismatch")
    assert active_mode.get() is None


def test_inside_the_callers_own_compile_mode_kernels_compile_on_first_launch():
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime._async_compile import AsyncCompileMode, active_mode

    log = []
    ns = warm_helper([(FakeJit(log), (torch.bfloat16,), {}), (FakeJit(log), (torch.float16,), {})], threads=2)
    with ThreadPoolExecutor(1) as pool, AsyncCompileMode(pool) as theirs:
        with ns["_compiling_at_once"]():
            assert active_mode.get() is theirs
        assert active_mode.get() is theirs
    assert log == []


def test_generated_cuda_modules_warm_every_launch():
    """Generated for CUDA (text only, no GPU needed): one `_WARM` entry per launch, with the
    launch's literals and each tensor's dtype, and call() warms up before its first group."""
    import ast

    from minicomp.api import Options, optimise, set_input_layouts
    from minicomp.codegen import generate
    from minicomp.frontend.fx import capture
    from minicomp.plan import assign_layout, plan_graph

    def fn(x, w, b, y):
        h = torch.softmax(torch.nn.functional.gelu(x @ w + b), -1)
        return h * y.to(torch.float32)

    inputs = [torch.randn(37, 48, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16),
              torch.randn(40, dtype=torch.float16), torch.randn(37, 40, dtype=torch.bfloat16)]
    graph = capture(fn, inputs)
    set_input_layouts(graph, inputs)
    optimised, _ = optimise(graph, Options())
    plan = plan_graph(optimised, Options().machine, baseline=graph)
    source = generate(assign_layout(optimised, plan), plan, "cuda").source
    tree = ast.parse(source)
    launches = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id == "_launch" and isinstance(n.args[0], ast.Name) and n.args[0].id.startswith("mc_")]
    warm = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_WARM")
    assert len(launches) >= 2 and len(warm.elts) == len(launches)
    for launch, entry in zip(launches, warm.elts):
        kernel, args, kwargs = entry.elts
        assert kernel.id == launch.args[0].id
        assert len(args.elts) == len(launch.args) - 2
        for a, w in zip(launch.args[2:], args.elts):
            if isinstance(a, ast.Constant):
                assert ast.literal_eval(w) == a.value
            else:
                assert ast.unparse(w).startswith("torch.")    # a dtype
        # the launch's keywords are the warm entry's, and its fast launcher's key (`_site`)
        assert {ast.literal_eval(k) for k in kwargs.keys} | {"_site"} == {k.arg for k in launch.keywords}
    # call() checks the inputs, then run() (what the api calls once its own guards passed) launches
    call = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "call")
    assert ast.unparse(call.body[-1]) == "return run(*inputs)" and "_launch(" not in ast.unparse(call)
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    warm_at = next(i for i, st in enumerate(run.body) if isinstance(st, ast.If) and "_WARM" in ast.unparse(st.test))
    first_launch = next(i for i, st in enumerate(run.body) if "_launch(" in ast.unparse(st))
    assert warm_at < first_launch
    # the first call runs itself again with the compiles started, launching as they finish
    assert ast.unparse(run.body[warm_at].body[0]) == "with _rt.CompilingAtOnce(_WARM):\n    return run(*inputs)"


# ----------------------------------------------------------------------------- GPU: the real launchers

@pytest.mark.gpu
@pytest.mark.parametrize("case", ["softmax", "affine_gelu", "linear_tma", "attention"])
def test_gpu_every_call_is_right_after_the_first(case, monkeypatch):
    """The benchmarks check a compiled function's first call (Triton's launch path); this checks
    the calls after it, which go through the compiled kernels' own launchers: new data every
    call, and an input at a misaligned address in between (the module copies it to aligned
    memory, `_as_layout`; the fast check made from the first call's strides admits it, so run()
    checks its alignment alone, `_laid_out`). The reference runs on aligned copies: PyTorch 2.11's own SDPA
    (cuDNN) answers wrongly for a query 2 bytes off alignment, max error 3.0 on the H200."""
    import math

    import torch.nn.functional as F

    import minicomp

    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, device=dev).mul(scale).to(dt)

    if case == "softmax":
        fn, make = (lambda x: torch.softmax(x, -1)), (lambda: [rnd(1000, 3000)])
    elif case == "affine_gelu":
        fn = lambda x, w, b: F.gelu(x * w + b, approximate="tanh")   # noqa: E731
        make = lambda: [rnd(777, 1024), rnd(1024), rnd(1024)]          # noqa: E731
    elif case == "linear_tma":
        monkeypatch.setenv("MINICOMP_LIBRARY_GEMM", "0")   # our TMA kernel's launcher, not cuBLAS
        fn = lambda x, w, b: F.linear(x, w, b)                          # noqa: E731
        make = lambda: [rnd(1000, 512), rnd(768, 512, scale=1 / math.sqrt(512)), rnd(768)]   # noqa: E731
    else:
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)   # noqa: E731
        make = lambda: [rnd(2, 4, 1000, 64) for _ in range(3)]                           # noqa: E731
    compiled = minicomp.compile(fn)
    for step in range(4):
        args = make()
        if step == 2:   # 2 bytes past an aligned start
            first = args[0]
            padded = torch.empty(first.numel() + 1, dtype=dt, device=dev)[1:].view(first.shape)
            padded.copy_(first)
            assert padded.data_ptr() % 16 != 0
            args[0] = padded
        torch.testing.assert_close(compiled(*args), fn(*[a.clone() for a in args]), atol=2e-2, rtol=2e-2)


WARM_SCRIPT = """
import sys, torch, minicomp
from pathlib import Path
fn = lambda x, w, b, y: torch.softmax(torch.nn.functional.gelu(x @ w + b), -1) * y
g = torch.Generator(device="cuda").manual_seed(0)
args = [torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16) for s in ((300, 256), (256, 200), (200,), (300, 200))]
args[1] = args[1] / 16   # logits of order 1: a rounding flip in bf16 moves the softmax by ~1%, not ~25%
compiled = minicomp.compile(fn)
module = compiled.compile_for(*args).call.module
configs = sum(len(getattr(k, "configs", None) or [None]) for k, _, _ in module._WARM)
module._rt.warm_up(module._WARM)
count = lambda pattern: len(list(Path(sys.argv[1]).rglob(pattern)))
cubins, stubs = count("*.cubin"), count("__triton_launcher*.so")
torch.testing.assert_close(compiled(*args), fn(*args), atol=2e-2, rtol=2e-2)
print("WARM", configs, cubins, count("*.cubin"), stubs, count("__triton_launcher*.so"))
"""


@pytest.mark.gpu
def test_gpu_warm_up_compiles_every_config_before_the_first_launch(tmp_path):
    """In a fresh process with an empty Triton cache: `warm_up(_WARM)` leaves one compiled kernel per
    (kernel, config) and the launcher stubs on disk, the first call then compiles nothing new,
    and its answer is right."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("MINICOMP_COMPILE_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", WARM_SCRIPT, str(tmp_path / "triton")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    configs, after_warm_up, after_call, stubs, stubs_after_call = map(int, proc.stdout.split("WARM")[1].split())
    assert configs >= 3 and after_warm_up >= configs and after_call == after_warm_up
    # the launcher stubs were built during the warm-up too: the call builds none
    assert stubs >= 1 and stubs_after_call == stubs


FIRST_CALL_SCRIPT = """
import sys, torch, minicomp
import triton.compiler, triton.compiler.compiler as compiler
compiles = []
original = compiler.compile
def counting(src, *args, **kwargs):
    compiles.append(getattr(src, "name", "?"))
    return original(src, *args, **kwargs)
compiler.compile = triton.compiler.compile = counting
fn = lambda x, w, b, y: torch.softmax(torch.nn.functional.gelu(x @ w + b), -1) * y
g = torch.Generator(device="cuda").manual_seed(0)
args = [torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16) for s in ((300, 256), (256, 200), (200,), (300, 200))]
args[1] = args[1] / 16
compiled = minicomp.compile(fn)
module = compiled.compile_for(*args).call.module
configs = sum(len(getattr(k, "configs", None) or [None]) for k, _, _ in module._WARM)
torch.testing.assert_close(compiled(*args), fn(*args), atol=2e-2, rtol=2e-2)
torch.testing.assert_close(compiled(*args), fn(*args), atol=2e-2, rtol=2e-2)
print("FIRST", configs, len(compiles), len(set(compiles)))
"""


@pytest.mark.gpu
def test_gpu_first_call_compiles_each_config_once_while_launching(tmp_path):
    """The first call itself (no separate warm-up): its launches take the pool's compiles as
    they finish, so every (kernel, config) compiles exactly once, and the answers are right."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), MINICOMP_CACHE_DIR=str(tmp_path / "mc"),
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("MINICOMP_COMPILE_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    configs, compiles, kernels = map(int, proc.stdout.split("FIRST")[1].split())
    assert configs >= 3 and compiles == configs and kernels >= 2


@pytest.mark.gpu
def test_gpu_tma_gemm_on_two_streams_and_in_a_cuda_graph_matches_eager():
    """A persistent TMA GEMM (its descriptors in global scratch, one buffer a stream kept by the
    fast launcher: runtime/direct.py) called on the default stream, on a side stream, again on
    the default one, and replayed from a CUDA graph: every answer is eager's."""
    import torch.nn.functional as F

    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).to("cuda", torch.bfloat16) for s in ((512, 256), (384, 256), (384,)))
    f = minicomp.compile(fn)
    want = fn(x.float(), w.float(), b.float()).to(torch.bfloat16)
    assert "make_tensor_descriptor" in (f(x, w, b), f.source)[1]
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = f(x, w, b)
        torch.cuda.current_stream().wait_stream(stream)
        torch.testing.assert_close(out, want, atol=3e-2, rtol=3e-2)
    graphed = minicomp.compile(fn, mode="reduce-overhead")
    for _ in range(3):
        torch.testing.assert_close(graphed(x, w, b), want, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
def test_gpu_kernels_are_given_aligned_tensors_only():
    """`as_layout` (every input and fallback output of a generated module passes through it)
    copies a CUDA tensor that starts off 16-byte alignment, keeping its strides, and passes an
    aligned one through untouched."""
    ns = {"_as_layout": launcher.as_layout}
    base = torch.arange(3 * 40 + 1, dtype=torch.bfloat16, device="cuda")
    off = base[1:].view(3, 40)
    assert off.data_ptr() % 16 != 0
    fixed = ns["_as_layout"](off, (40, 1))
    assert fixed.data_ptr() % 16 == 0 and fixed.stride() == (40, 1) and torch.equal(fixed, off)
    aligned = base[:120].view(3, 40)
    assert ns["_as_layout"](aligned, (40, 1)) is aligned


def test_call_computes_buckets_with_a_plain_function_equal_to_tritons():
    """Modules over symbolic sizes compute their tuning buckets in call() with
    `_rt.next_pow2`: Triton's `next_power_of_2` is a ConstexprFunction, ~7 us a call."""
    import triton
    assert [launcher.next_pow2(n) for n in range(1, 3000)] == [triton.next_power_of_2(n) for n in range(1, 3000)]


def test_the_direct_launcher_calls_run_as_tritons_runner_does(monkeypatch):
    """`launcher.direct` calls the compiled kernel's `run` with the arguments Triton's own runner
    (`compiled[grid]`) passes when no launch hook is set: the grid, the current stream of the
    Launcher's device, the function, the packed metadata, no launch metadata, no enter hook, the
    exit hook, then the kernel's arguments; with a hook set (a profiler), the runner. Triton's
    hooks are chains that are never None: an empty chain is no hook."""
    import triton

    from minicomp.runtime import launcher

    calls = []

    class Compiled:
        function, packed_metadata = "fn", "packed"

        def _init_handles(self):
            calls.append("init")

        def run(self, *a):
            calls.append(("run",) + a)

        def __getitem__(self, grid):
            return lambda *args: calls.append(("runner", grid) + args)

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: f"stream{device}", raising=False)
    direct = [("run", 4, 2, 1, "stream3", "fn", "packed", None, None, None, "buf0", 7)]
    runner = [("runner", (4, 2, 1), "buf0", 7)]
    launch = launcher.direct(Compiled(), (4, 2, 1), 3)
    assert calls == ["init"]
    chains = [getattr(triton.knobs.runtime, h) for h in ("launch_enter_hook", "launch_exit_hook")]
    for chain in chains:        # Triton's own default: chains with no calls, which is no hook
        assert chain is not None and not getattr(chain, "calls", [None]), chain
    for hooks, want in [((None, None), direct), (chains, direct), ((lambda meta: None, None), runner),
                        ((None, lambda meta: None), runner)]:
        calls.clear()
        monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", hooks[0])
        monkeypatch.setattr(triton.knobs.runtime, "launch_exit_hook", hooks[1])
        launch("buf0", 7)
        assert calls == want, hooks
    chain = type(chains[0])()   # a profiler adds itself to the chain: the runner serves
    chain.add(lambda meta: None)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", chain)
    calls.clear()
    launch("buf0", 7)
    assert calls == runner
    assert launcher.direct(object(), (1, 1, 1), 0) is None        # another layout: Triton's runner serves


def test_the_direct_launcher_calls_triton_36s_c_launch_itself(monkeypatch):
    """Where the compiled kernel's `run` is Triton 3.6's CudaLauncher (its `__call__` takes the
    grid, stream and function, then everything else) and the kernel needs no scratch, `direct`
    calls its C function with the arguments that `__call__` would pass it: the grid, stream and
    function, the cooperative-grid and PDL flags, no scratch, the packed metadata, no launch
    metadata and no hooks, then the kernel's arguments. With another `__call__` (3.8 and 3.9 pass
    other arguments), or profile scratch, `run` itself serves; with a hook set, the runner. Global
    scratch: `test_a_kernel_with_global_scratch_keeps_one_buffer_a_stream`."""
    from minicomp.runtime import launcher

    calls = []

    def make_run(scratch: int, params: str):
        ns: dict = {}
        exec(f"def __call__({params}):\n    calls.append(('call',) + tuple(args))\n", {"calls": calls}, ns)
        call = ns["__call__"]
        call.__module__ = "triton.backends.nvidia.driver"

        class CudaLauncher:
            global_scratch_size, profile_scratch_size, global_scratch_align, num_ctas = 0, scratch, 128, 1
            launch_cooperative_grid, launch_pdl = False, True

            def launch(self, *a):
                calls.append(("c",) + a)
        CudaLauncher.__call__ = call
        return CudaLauncher()

    class Compiled:
        function, packed_metadata = "fn", "packed"

        def __init__(self, run):
            self.run = run

        def _init_handles(self):
            pass

        def __getitem__(self, grid):
            return lambda *args: calls.append(("runner", grid) + args)

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: f"stream{device}", raising=False)
    v36 = "self, gridX, gridY, gridZ, stream, function, *args"
    launch = launcher.direct(Compiled(make_run(0, v36)), (4, 2, 1), 3)
    launch("buf0", 7)
    assert calls == [("c", 4, 2, 1, "stream3", "fn", False, True, None, None, "packed", None, None, None, "buf0", 7)]
    for scratch, params in [(64, v36), (0, "self, gridX, gridY, gridZ, stream, function, kernel_metadata, "
                                          "launch_metadata, launch_enter_hook, launch_exit_hook, *args")]:
        calls.clear()
        launcher.direct(Compiled(make_run(scratch, params)), (4, 2, 1), 3)("buf0", 7)
        assert calls[0][0] == "call" and calls[0][-2:] == ("buf0", 7), (scratch, params)
    import triton
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda meta: None)
    calls.clear()
    launch("buf0", 7)
    assert calls == [("runner", (4, 2, 1), "buf0", 7)]


def test_a_kernel_with_global_scratch_keeps_one_buffer_a_stream(monkeypatch):
    """A kernel that builds TMA descriptors on the device takes global scratch (bytes a program,
    times the grid). The C launch gets it from Triton's allocator at the first launch on a stream
    and the same buffer at every later launch there; another stream gets its own; a launch while
    the stream is captured into a CUDA graph goes through Triton's runner (which allocates)."""
    import triton

    from minicomp.runtime import launcher
    calls, allocated = [], []

    class CudaLauncher:
        global_scratch_size, profile_scratch_size, global_scratch_align, num_ctas = 128, 0, 64, 2
        launch_cooperative_grid, launch_pdl = False, False

        def launch(self, *a):
            calls.append(("c",) + a)
    ns: dict = {}
    exec("def __call__(self, gridX, gridY, gridZ, stream, function, *args):\n    calls.append(('call',) + args)\n",
         {"calls": calls}, ns)
    ns["__call__"].__module__ = "triton.backends.nvidia.driver"
    CudaLauncher.__call__ = ns["__call__"]

    class Compiled:
        function, packed_metadata, run = "fn", "packed", CudaLauncher()

        def _init_handles(self):
            pass

        def __getitem__(self, grid):
            return lambda *args: calls.append(("runner", grid) + args)

    def alloc(size, align, stream):
        allocated.append((size, align, stream))
        return f"scratch{len(allocated)}"
    stream, capturing = ["s1"], [False]
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: stream[0], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing[0], raising=False)
    triton.set_allocator(alloc)
    try:
        launch = launcher.direct(Compiled(), (3, 2, 1), 0)
        for s in ("s1", "s1", "s2", "s1"):
            stream[0] = s
            launch("buf0")
        capturing[0] = True
        launch("buf0")
    finally:
        from triton.runtime import _allocation
        triton.set_allocator(_allocation._NULL_ALLOCATOR)
    assert allocated == [(3 * 2 * 1 * 128 * 2, 64, "s1"), (3 * 2 * 1 * 128 * 2, 64, "s2")]
    scratch = [c[8] for c in calls if c[0] == "c"]
    assert scratch == ["scratch1", "scratch1", "scratch2", "scratch1"]
    assert calls[-1] == ("runner", (3, 2, 1), "buf0")


def test_only_triton_36s_launcher_is_called_through_its_c_function():
    """`c_launcher` knows the argument layout of Triton 3.6's CudaLauncher only: on this
    machine's Triton it recognises the class exactly when its version is 3.6 (the GPU machine's;
    the CPU machine has 3.9, whose launcher takes other arguments)."""
    import inspect

    import triton
    from triton.backends.nvidia.driver import CudaLauncher

    from minicomp.runtime import launcher
    params = tuple(inspect.signature(CudaLauncher.__call__).parameters)
    assert (params == launcher._C_LAUNCH_PARAMS) == triton.__version__.startswith("3.6."), (triton.__version__, params)

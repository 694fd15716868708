"""Eager answers a group's first calls while our kernel for it compiles (codegen/first_calls.py,
`Target.eager_first`, on unless $MINICOMP_EAGER_FIRST=0): cuBLAS or SDPA where the library
computes the group as it is, the group's own PyTorch lines otherwise.

The module is generated for sm_90 without a GPU; its text says which form runs when, and its
eager branches run here on CPU tensors (every kernel marked as still compiling: a launch would
fail on the CPU) against eager, for idiomatic functions and transformers models."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tol
from hypothesis import HealthCheck, given, settings
from library_testing import generate_quietly
from property_programs import make_inputs, programs, python_function

from minicomp.codegen import first_calls
from minicomp.runtime import launcher
from minicomp.target import Target

FIRST = Target("cuda", (9, 0))                      # eager_first is on by default
SM90 = replace(FIRST, eager_first=False)          # MINICOMP_EAGER_FIRST=0

CASES = {      # GEMMs our kernel computes because cuBLAS is slow on them, as eager calls them
    "lm_head": (lambda x, w: F.linear(x, w), [(2, 9, 64), (1003, 64)], "torch.nn.functional.linear("),
    "lm_head_bias": (lambda x, w, b: F.linear(x, w, b), [(9, 64), (1003, 64), (1003,)], "torch.nn.functional.linear("),
    "odd_k": (lambda a, b: a @ b, [(33, 1023), (1023, 64)], "torch.matmul("),
    "odd_k_transposed_a": (lambda a, b: a.t() @ b, [(1023, 40), (1023, 64)], "torch.matmul("),
}


def _randn(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


def _eager_branch(gen, inputs, tmp_path):
    """Run the CUDA module on CPU tensors with each kernel marked as compiling in the background:
    call() takes the library's branch (and would fail on the kernel's launch otherwise). The
    module is imported from a file: a Gluon kernel's decorator reads its source from one."""
    path = tmp_path / "first_calls_module.py"
    path.write_text(gen.source)
    spec = importlib.util.spec_from_file_location("minicomp_first_calls_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ns = module.__dict__
    ns["DEVICE_TYPE"] = "cpu"
    ns["CONSTANTS"][:], ns["OPAQUE"][:] = gen.constants, gen.opaque
    for pool in ("_WARM", "_LATER"):                  # nothing to compile here
        ns.get(pool, [])[:] = []
    kernels = [ns[name] for name in gen.kernel_names]
    for k in kernels:
        launcher._BACKGROUND[k] = "pending"
    try:
        return ns["call"](*inputs)
    finally:
        for k in kernels:
            launcher._BACKGROUND.pop(k, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cublas_answers_until_the_kernel_has_compiled(case, dtype, tmp_path):
    fn, shapes, call = CASES[case]
    inputs = [_randn(*s, dtype=dtype, seed=i) for i, s in enumerate(shapes)]
    gen = generate_quietly(fn, inputs, FIRST).generated
    (kernel,) = gen.kernel_names
    run = gen.source[gen.source.index("\ndef run("):]
    assert f"    if _rt.compiled({kernel}):\n        _launch({kernel}," in run
    assert "    else:  # cuBLAS answers until then\n" in run and call in run.split("else:  # cuBLAS")[1]
    assert "if _WARM or _LATER:" in run
    warm = gen.source[gen.source.index("_WARM = ["):gen.source.index("_LATER = [")]
    later = gen.source[gen.source.index("_LATER = ["):gen.source.index("\n]", gen.source.index("_LATER = ["))]
    assert f"({kernel}," not in warm and f"({kernel}," in later   # compiled in the background, not before the call
    (got,) = _eager_branch(gen, inputs, tmp_path)
    want = fn(*[t.double() for t in inputs]).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    assert got.shape == want.shape and got.stride() == want.contiguous().stride()


def test_on_by_default_off_by_its_switch_and_the_library_only_for_what_it_computes_alone():
    fn, shapes, _ = CASES["lm_head"]
    inputs = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    off = generate_quietly(fn, inputs, SM90).generated.source
    assert "_rt.compiled(" not in off and "_LATER" not in off.split("\ndef run(")[1]
    # an epilogue cuBLAS does not compute: PyTorch's lines answer, into the kernel's buffer
    gelu = generate_quietly(lambda x, w: F.gelu(F.linear(x, w)), inputs, FIRST).generated.source
    assert "_rt.compiled(" in gelu and "cuBLAS answers" not in gelu and "PyTorch answers until then" in gelu
    assert ".copy_(mc_eager" in gelu
    # the CPU target never: its kernels run under the interpreter
    cpu = generate_quietly(fn, inputs, replace(Target("cpu"), eager_first=True)).generated.source
    assert "_rt.compiled(" not in cpu
    assert Target.for_device("cpu", environ={}).eager_first
    assert not Target.for_device("cpu", environ={"MINICOMP_EAGER_FIRST": "0"}).eager_first
    assert first_calls.WHY in generate_quietly(fn, inputs, FIRST).generated.source


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("hopper", ["", "1"], ids=["block_language", "gluon_tiered"])
def test_sdpa_answers_an_attention_until_its_kernel_has_compiled(hopper, tmp_path):
    """A small attention (the block-language kernel: SDPA's dispatch costs more host time) and
    one the Gluon kernel takes (MINICOMP_HOPPER_ATTENTION=1): SDPA answers until the kernel has
    compiled, and the Gluon kernel's block-language stand-in is neither launched nor written."""
    q, k, v = (_randn(2, 4, 128, 64, dtype=torch.bfloat16, seed=i) for i in range(3))
    target = replace(FIRST, hopper_attention=hopper)
    gen = generate_quietly(_sdpa, [q, k, v], target).generated
    (kernel,) = gen.kernel_names
    assert ("hopper" in kernel) == (hopper == "1")
    run = gen.source[gen.source.index("\ndef run("):]
    assert f"    if _rt.compiled({kernel}):\n        _launch({kernel}," in run
    assert "else:  # SDPA answers until then" in run and "scaled_dot_product_attention(" in run.split("else:")[1]
    assert run.count("_launch(") == 1
    if hopper:
        assert "mc_attn_causal" not in gen.source and "gluon.jit(attn_fwd_hopper)" in gen.source
    (got,) = _eager_branch(gen, [q, k, v], tmp_path)
    torch.testing.assert_close(got, _sdpa(q.float(), k.float(), v.float()).bfloat16(), **tol(torch.bfloat16))
    off = generate_quietly(_sdpa, [q, k, v], replace(SM90, hopper_attention=hopper)).generated.source
    assert "SDPA answers" not in off


def test_the_kernels_compiled_later_pass_the_gpu_true_check():
    """The kernels moved to `_LATER` are still compiled for sm_90 by the GPU-true check (a
    kernel Triton rejects would become a visible fallback, not a background failure)."""
    checked = replace(FIRST, verify_arch=90, verify_depth="sampled")
    fn, shapes, _ = CASES["lm_head"]
    gemm = generate_quietly(fn, [_randn(*s, dtype=torch.bfloat16, seed=i) for i, s in enumerate(shapes)], checked)
    assert not gemm.generated.fallbacks and "_LATER = [" in gemm.generated.source
    q, k, v = (_randn(2, 4, 128, 64, dtype=torch.bfloat16, seed=i) for i in range(3))
    attn = generate_quietly(_sdpa, [q, k, v], checked)
    assert not attn.generated.fallbacks and "_LATER = [" in attn.generated.source


def _softmax_scaled(x, t):
    return torch.softmax(x.float() / t, dim=-1).to(x.dtype)


def _norm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) * 0.5


def _bias_residual(x, b, r):
    return (x + b).relu() + r.transpose(0, 1)


def _noop_cast_then_sum(x, y):
    # x.float() of an fp32 tensor is x itself: eager's result views the input, and the kernel's
    # output buffer must still be what later groups reuse, not the caller's tensor
    a = x.float() * 1.0
    return a + y, (a * y).sum(-1)


def _embed_rms(ids, table, w):
    h = F.embedding(ids, table)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w


EAGER_CASES = {     # groups no library computes: their own PyTorch lines answer
    "softmax_odd_columns": (_softmax_scaled, lambda d: [_randn(5, 7, 1003, dtype=d), torch.tensor(0.7)]),
    "layernorm_gelu_noncontiguous": (_norm_gelu, lambda d: [_randn(40, 6, 33, dtype=d).transpose(0, 1),
                                                            _randn(33, dtype=d, seed=1), _randn(33, dtype=d, seed=2)]),
    "broadcast_residual": (_bias_residual, lambda d: [_randn(9, 4, 65, dtype=d), _randn(65, dtype=d, seed=1),
                                                      _randn(4, 9, 65, dtype=d, seed=2)]),
    "noop_cast_two_outputs": (_noop_cast_then_sum, lambda d: [_randn(6, 130), _randn(6, 130, seed=1)]),
    "embedding_rmsnorm": (_embed_rms, lambda d: [torch.randint(0, 50, (3, 17), generator=torch.Generator().manual_seed(3)),
                                                 _randn(50, 48, dtype=d, seed=1), _randn(48, dtype=d, seed=2)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", sorted(EAGER_CASES))
def test_pytorch_lines_answer_for_a_kernel_no_library_computes(case, dtype, tmp_path):
    fn, make = EAGER_CASES[case]
    inputs = make(dtype)
    before = [x.clone() for x in inputs]
    gen = generate_quietly(fn, inputs, FIRST).generated
    assert gen.kernel_names
    run = gen.source[gen.source.index("\ndef run("):]
    for name in gen.kernel_names:             # every kernel here has one launch: each is tiered
        assert f"if _rt.compiled({name}):" in run, name
    assert run.count("else:  # PyTorch answers until then") == len(gen.kernel_names)
    got = _eager_branch(gen, inputs, tmp_path)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tol(dtype))
        assert g.shape == w.shape and g.stride() == w.contiguous().stride()
    for x, b in zip(inputs, before):         # nothing of the caller's was written
        assert torch.equal(x, b)


def _hf(family: str):
    import transformers
    if family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        cls = transformers.LlamaForCausalLM
    elif family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32)
        cls = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=32)
        cls = transformers.BertModel
    torch.manual_seed(0)
    return cls(cfg).eval().requires_grad_(False)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_transformers_model_answers_through_its_eager_branches(family, tmp_path):
    """A whole model as users call it, generated for sm_90: with every kernel still compiling,
    its first call is the eager branches (and cuBLAS lines) alone, and equals the model's."""
    m = _hf(family)
    out = "logits" if family != "bert" else "last_hidden_state"
    fn = lambda ids: getattr(m(input_ids=ids), out)     # noqa: E731
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gen = generate_quietly(fn, [ids], FIRST).generated
        names = gen.source.split("input(s) (", 1)[1].split(")", 1)[0].split(", ")
        params = dict(m.named_parameters()) | dict(m.named_buffers())
        args = [ids if n == "ids" else params[n.removeprefix("m.")] for n in names]
        (got,) = _eager_branch(gen, args, tmp_path)
        want = fn(ids)
    assert gen.source.count("else:  # PyTorch answers until then") >= len(gen.kernel_names) > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # no line copies a host scalar to the GPU (such a copy waits for the GPU and cannot be
    # captured by a CUDA graph): the eager branches bind the kept ones, each in its own
    run = gen.source[gen.source.index("\ndef run("):]
    assert "torch.tensor(" not in run
    assert all(line.startswith(" " * 8) for line in run.split("\n") if "_rt.scalar(" in line)


_COMPILED = r"_rt\.compiled\(\w+\)"
_READY = rf"(?:{_COMPILED}|\(\w+_ready := {_COMPILED}(?: and {_COMPILED})*\)|\w+_ready)"   # a launch's test of the compiles


def _kernel_path(source: str) -> list[str]:
    """run()'s lines as a call runs them once every kernel has compiled: each test of the
    compiles dropped (`if <ready>:` bodies in their place, `if <ready> and <sizes>:` as `if
    <sizes>:`), each eager branch dropped (blank lines and the first call's compile lines aside)."""
    lines, out, i = source[source.index("\ndef run("):].split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        sized = re.fullmatch(rf"(\s*)if {_READY} and (.*):", line)
        if sized:
            out.append(f"{sized.group(1)}if {sized.group(2)}:")
            i += 1
            continue
        eager = re.match(r"\s*(else|if not \w+_ready):  # \w+ answers until then", line)
        if re.fullmatch(rf"\s*if {_READY}:", line) or eager:
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                out += [] if eager else [lines[i][4:]]
                i += 1
            continue
        out.append(line)
        i += 1
    return [line for line in out if line.strip() and "_WARM" not in line]


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_once_compiled_a_call_runs_exactly_the_lines_it_runs_without_eager_first(family):
    """The steady state costs nothing but one `_rt.compiled` test a launch: with the eager
    branches dropped, run() is line for line the module generated with eager first off."""
    m = _hf(family)
    out = "logits" if family != "bert" else "last_hidden_state"
    fn = lambda ids: getattr(m(input_ids=ids), out)     # noqa: E731
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        on = generate_quietly(fn, [ids], FIRST).generated.source
        off = generate_quietly(fn, [ids], SM90).generated.source
    assert "answers until then" in on and "answers until then" not in off
    assert _kernel_path(on) == _kernel_path(off)


def _decode(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


SEVERAL = {    # kernels of two launches: a split reduction, split-KV decode attention
    "sum_over_rows": (lambda x: x.sum(0), lambda: [_randn(65536, 48)]),
    "decode_split_kv": (_decode, lambda: [_randn(2, 8, 1, 64), _randn(2, 2, 4096, 64, seed=1),
                                          _randn(2, 2, 4096, 64, seed=2)]),
}


@pytest.mark.parametrize("case", sorted(SEVERAL))
def test_a_kernel_of_several_launches_tests_all_its_functions_once(case, tmp_path):
    """Its first launch tests every function it calls and keeps the answer; the others read it,
    so a compile that ends between two launches cannot run one without the other; the eager
    lines run under `if not` that answer."""
    fn, make = SEVERAL[case]
    inputs = make()
    gen = generate_quietly(fn, inputs, FIRST).generated
    run = gen.source[gen.source.index("\ndef run("):]
    tests = re.findall(r"if \((\w+_ready) := (_rt\.compiled\(\w+\)(?: and _rt\.compiled\(\w+\))+)\):", run)
    assert tests, run
    var, _ = tests[0]
    assert f"    if {var}:\n" in run and f"    if not {var}:  # PyTorch answers until then" in run
    assert run.count("_launch(") >= 2 and "_rt.compiled(" not in run.replace(tests[0][1], "")
    (got,) = _eager_branch(gen, inputs, tmp_path)
    torch.testing.assert_close(got, fn(*inputs), **tol(torch.float32))


SYMBOLIC = {     # .mc samples over symbolic sizes: kernels with a form for each size range
    "softmax": ({}, lambda: [_randn(37, 67)]),
    "layernorm": ({}, lambda: [_randn(2, 7, 33), _randn(33, seed=1), _randn(33, seed=2)]),
    "rmsnorm": ({}, lambda: [_randn(2, 7, 4100), _randn(2, 7, 4100, seed=1), _randn(4100, seed=2)]),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC))
def test_a_module_over_symbolic_sizes_answers_through_eager_and_keeps_its_forms(name, tmp_path):
    """One module for every size (codegen/sizes.py): its launches keep their size conditions
    after the one test of the compiles, the eager lines run under `if not` that test, and run
    at a size the module was not planned at they equal the sample's Python twin."""
    from minicomp.api import compile_graph
    from minicomp.frontend.dsl import load_dsl
    root = Path(__file__).resolve().parents[1] / "samples"
    dims, make = SYMBOLIC[name]
    g = load_dsl((root / f"{name}.mc").read_text(), f"{name}.mc", dims=dims, symbolic=True)
    assert g.symbolic
    on = compile_graph(g, [None] * len(g.inputs), device="cuda", load=False, target=FIRST).generated
    off = compile_graph(g, [None] * len(g.inputs), device="cuda", load=False, target=SM90).generated
    run = on.source[on.source.index("\ndef run("):]
    assert "PyTorch answers until then" in run or "answers until then" in run
    assert _kernel_path(on.source) == _kernel_path(off.source)
    inputs = make()
    spec = importlib.util.spec_from_file_location(f"_twin_{name}", root / f"{name}.py")
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    got = _eager_branch(on, inputs, tmp_path)
    want = twin.model(*inputs)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
        torch.testing.assert_close(g, w, **tol(torch.float32))


GPU_CASES = {      # through the api as users call it: our kernel computes each, eager answers first
    "lm_head": (lambda x, w: F.linear(x, w), [(4, 33, 256), (50257, 256)]),
    "odd_k": (lambda a, b: a @ b, [(1024, 1023), (1023, 1024)]),
    "attention": (_sdpa, [(2, 4, 128, 64)] * 3),
    "layernorm_gelu": (lambda x, w, b: _norm_gelu(x, w, b), [(64, 33, 768), (768,), (768,)]),
    "sum_over_rows": (lambda x: x.float().sum(0), [(65536, 48)]),         # two launches
    "decode_split_kv": (_decode, [(2, 8, 1, 64), (2, 2, 4096, 64), (2, 2, 4096, 64)]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_eager_answers_first_then_the_kernel(case, monkeypatch):
    """The default: the first call's answer comes from the library or PyTorch's lines, and once
    the background compile has finished the kernel's does; both match eager."""
    import minicomp
    monkeypatch.setenv("MINICOMP_EAGER_FIRST", "1")
    fn, shapes = GPU_CASES[case]
    inputs = [_randn(*s, dtype=torch.bfloat16, seed=i).cuda() for i, s in enumerate(shapes)]
    want = fn(*inputs)
    f = minicomp.compile(fn)
    torch.testing.assert_close(f(*inputs), want, **tol(torch.bfloat16))
    assert "answers until then" in f.source
    assert minicomp.wait_compiled(600)
    c = f._need()
    module = c.call.module
    kernels = [getattr(module, name) for name in c.generated.kernel_names]
    assert kernels and all(module._rt.compiled(k) for k in kernels)
    torch.testing.assert_close(f(*inputs), want, **tol(torch.bfloat16))     # the kernel's answer


# ----------------------------------------------------------------------------- random programs

def _examples() -> int:
    """30 derandomised examples; MINICOMP_PROPERTY_EXAMPLES=N draws N // 4 at random."""
    env = os.environ.get("MINICOMP_PROPERTY_EXAMPLES")
    return max(1, int(env) // 4) if env else 30


@settings(max_examples=_examples(), deadline=None, derandomize="MINICOMP_PROPERTY_EXAMPLES" not in os.environ,
          database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs(("unary", "binary", "select", "cast", "reduce", "softmax", "view", "matmul", "norm"),
                dtypes=(torch.float32, torch.float16, torch.bfloat16), max_steps=5))
def test_random_programs_answer_through_their_eager_branches(p):
    """Random well-typed programs (tests/property_programs.py, the property tests' generator),
    generated for sm_90 with every kernel still compiling: the eager branches alone give
    eager's answer, each output in eager's shape, dtype and strides."""
    from minicomp.api import compile_graph
    from minicomp.frontend.fx import capture
    inputs = make_inputs(p, 0)
    fn = python_function(p, "<first-calls-program>")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # var over one element: eager warns about the NaN
        want = fn(*inputs)
        gen = compile_graph(capture(fn, inputs), inputs, device="cuda", load=False, target=FIRST).generated
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    run = gen.source[gen.source.index("\ndef run("):]
    assert run.count("answers until then") == run.count("if _rt.compiled(") + run.count("_ready := ")
    with tempfile.TemporaryDirectory() as d:
        got = _eager_branch(gen, inputs, Path(d))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), p.describe()
        torch.testing.assert_close(g, w, equal_nan=True, **tol(w.dtype), msg=lambda m: f"{m}\n{p.describe()}")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_gpu_a_transformers_model_answers_eagerly_then_through_its_kernels(family, monkeypatch):
    import minicomp
    monkeypatch.setenv("MINICOMP_EAGER_FIRST", "1")
    m = _hf(family).cuda()
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        want = m(input_ids=ids).logits
        f = minicomp.compile(lambda ids: m(input_ids=ids).logits)
        torch.testing.assert_close(f(ids), want, rtol=1e-4, atol=1e-4)
        assert minicomp.wait_compiled(600)
        for _ in range(2):                # the call that autotunes, then a plain one
            torch.testing.assert_close(f(ids), want, rtol=1e-4, atol=1e-4)
    assert "PyTorch answers until then" in f.source

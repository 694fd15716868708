"""The benchmark workloads: plain PyTorch functions and the inputs to run them on.

Invariants:
- The anchor workloads are exactly those of `shared/ceilings.md`, at the same shapes and in
  bf16 (`full` sizes). `tiny` sizes are for the CPU (Triton interpreter) smoke run only.
- Workload functions are ordinary PyTorch, written the way a user would write them. Sizes a
  tracer should see as constants (the causal mask's length, the attention scale) are baked
  in by a small factory instead of being read off `.shape` inside the function.
- Inputs are random (never zeros: zeros hide unwritten outputs and can run faster than real
  data), drawn from a seeded generator so every backend sees the same tensors. Weights are
  scaled by 1/sqrt(fan-in) so activations stay O(1).
- Nothing here runs at import time.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------
# The workload functions, as a user would write them.

def gelu_tanh_affine(x, w, b):
    return F.gelu(x * w + b, approximate="tanh")


def softmax_by_hand(x):
    m = torch.amax(x, dim=-1, keepdim=True)
    e = torch.exp(x - m)
    return e / torch.sum(e, dim=-1, keepdim=True)


def add_rmsnorm(x, residual, w):
    # Two outputs: the normalised rows and the updated residual stream.
    h = x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return (y * w.float()).to(x.dtype), h


def layernorm_by_hand(x, w, b):
    xf = x.float()
    mu = xf.mean(dim=-1, keepdim=True)
    xc = xf - mu
    var = (xc * xc).mean(dim=-1, keepdim=True)
    y = xc * torch.rsqrt(var + 1e-5)
    return (y * w.float() + b.float()).to(x.dtype)


def gemm_bias_gelu(x, w, b):
    return F.gelu(x @ w + b, approximate="tanh")


def swiglu_mlp(x, w1, w3, w2):
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def make_causal_attention(seq: int, head_dim: int, device: str) -> Callable:
    """Causal attention written out as matmul / scale / mask / softmax / matmul."""
    scale = 1.0 / math.sqrt(head_dim)

    def causal_attention(q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=device))
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    return causal_attention


def warm_up_fn(x, w, q, k, v):
    """A group of each kind (a GEMM with an epilogue, softmax and layer norm reductions,
    attention), for benchmarks/run.py to compile once before any workload."""
    h = F.layer_norm(torch.softmax(x @ w + 1.0, dim=-1), (x.shape[-1],))
    return h, F.scaled_dot_product_attention(q, k, v, is_causal=True)


def warm_up_inputs(device: str) -> tuple[torch.Tensor, ...]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, w = torch.ones(16, 32, device=device, dtype=dtype), torch.ones(32, 32, device=device, dtype=dtype)
    q, k, v = (torch.ones(1, 2, 128, 64, device=device, dtype=dtype) for _ in range(3))
    return x, w, q, k, v


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ----------------------------------------------------------------------------------------
# Workload records.

@dataclass
class Built:
    """One workload, ready to run: the function, its inputs, and what they are."""
    fn: Callable
    inputs: list[torch.Tensor]
    shapes: str                                   # human-readable, for the table
    sizes: dict[str, Any]                         # what was actually used
    reference: tuple[str, Callable] | None = None  # an extra baseline (attention: SDPA)
    references: list[tuple[str, Callable]] = field(default_factory=list)   # more of them (issue 22's SDPA backends)
    wide: Callable | None = None                  # the same computation in fp32 (whole models: see measure.compare)
    wide_out: Any = None                          # its output, filled in by run.py once per workload
    notes: list[str] = field(default_factory=list)

    def baselines(self) -> list[tuple[str, Callable]]:
        """Every extra baseline, `reference` first."""
        return ([self.reference] if self.reference else []) + list(self.references)


@dataclass(frozen=True)
class Target:
    """An issue-22 target: minicomp's speed over `baseline`'s (a backend's name, or "sdpa_best":
    the fastest checked SDPA baseline) must be at least `min_speed`. `compared` is the minicomp
    backend measured: "minicomp_ro" (CUDA graphs) against torch.compile's reduce-overhead mode,
    like for like."""
    baseline: str
    min_speed: float
    what: str
    compared: str = "minicomp"


@dataclass
class Workload:
    name: str
    kind: str                  # "memory", "gemm", "attention" or "block": picks the target
    title: str
    full: dict[str, Any]       # the ceilings.md / issue sizes
    tiny: dict[str, Any]       # CPU interpreter sizes
    make: Callable[[str, torch.dtype, dict[str, Any], torch.Generator], Built]
    # Matmul flops counted by hand (2 per multiply-add; causal attention: half the scores),
    # used only where minicomp's own ledger is missing because minicomp failed.
    flops: Callable[[dict[str, Any]], int] | None = None
    # Timed besides the run's --backends when their base backend runs (run.EXTRA_BASE):
    # "minicomp_dynamo" (models), "inductor_ro" and "minicomp_ro" (reduce-overhead modes).
    extra_backends: tuple[str, ...] = ()
    group: str | None = None                  # issue 22's groups (`--only GROUP`); None: the suite's own
    target: Target | None = None              # issue 22's target; None: the kind's (report.TARGETS)
    dtype: str | None = None                  # a dtype this workload always runs in, whatever --dtype says
    context: Callable[[], Any] | None = None  # a context manager around the whole workload (every backend)
    peak_tflops: float | None = None          # the compute ceiling when it is not cuBLAS bf16's (fp32 IEEE)
    rounds: int | None = None                 # at most this many timing rounds (the run's 10-minute budget)
    rep_ms: float | None = None               # at most this repetition window (ms)

    def build(self, device: str, dtype: torch.dtype, tiny: bool, seed: int = 0) -> Built:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dtype = getattr(torch, self.dtype) if self.dtype else dtype
        return self.make(device, dtype, dict(self.tiny if tiny else self.full), gen)


def _rand(shape, dtype, device, gen, scale: float = 1.0) -> torch.Tensor:
    # Drawn on the CPU from a seeded generator, then moved: identical on every device.
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)


def _pointwise(device, dtype, s, gen) -> Built:
    m, n = s["M"], s["N"]
    ins = [_rand((m, n), dtype, device, gen), _rand((n,), dtype, device, gen),
           _rand((n,), dtype, device, gen)]
    return Built(gelu_tanh_affine, ins, f"x {m}x{n}, w,b {n}", s)


def _softmax(device, dtype, s, gen) -> Built:
    m, n = s["M"], s["N"]
    return Built(softmax_by_hand, [_rand((m, n), dtype, device, gen, 2.0)], f"{m}x{n}", s)


def _rmsnorm(device, dtype, s, gen) -> Built:
    m, n = s["M"], s["N"]
    ins = [_rand((m, n), dtype, device, gen), _rand((m, n), dtype, device, gen),
           _rand((n,), dtype, device, gen)]
    return Built(add_rmsnorm, ins, f"x,res {m}x{n}, w {n}", s)


def _layernorm(device, dtype, s, gen) -> Built:
    m, n = s["M"], s["N"]
    ins = [_rand((m, n), dtype, device, gen), _rand((n,), dtype, device, gen),
           _rand((n,), dtype, device, gen)]
    return Built(layernorm_by_hand, ins, f"x {m}x{n}, w,b {n}", s)


def _gemm(device, dtype, s, gen) -> Built:
    m, n, k = s["M"], s["N"], s["K"]
    ins = [_rand((m, k), dtype, device, gen), _rand((k, n), dtype, device, gen, k ** -0.5),
           _rand((n,), dtype, device, gen)]
    return Built(gemm_bias_gelu, ins, f"{m}x{k} @ {k}x{n} + b", s)


def _swiglu(device, dtype, s, gen) -> Built:
    m, d, h = s["M"], s["D"], s["H"]
    ins = [_rand((m, d), dtype, device, gen), _rand((d, h), dtype, device, gen, d ** -0.5),
           _rand((d, h), dtype, device, gen, d ** -0.5), _rand((h, d), dtype, device, gen, h ** -0.5)]
    return Built(swiglu_mlp, ins, f"x {m}x{d}, hidden {h}", s)


def _attention(device, dtype, s, gen) -> Built:
    b, h, t, d = s["B"], s["H"], s["S"], s["d"]
    ins = [_rand((b, h, t, d), dtype, device, gen) for _ in range(3)]
    fn = make_causal_attention(t, d, device)
    return Built(fn, ins, f"B{b} H{h} S{t} d{d}", s, reference=("sdpa", sdpa_causal))


# ----------------------------------------------------------------------------------------
# Samples (helper "fx" writes them): `build(device, dtype, **sizes) -> (callable, inputs)`.
# Their keyword names are not fixed by a contract, so sizes are matched by alias.

SIZE_ALIASES = {
    "batch": ("batch", "batch_size", "bsz", "B"),
    "seq": ("seq", "seq_len", "seqlen", "T", "S", "n_ctx"),
    "width": ("width", "dim", "d_model", "hidden_size", "n_embd", "C", "D"),
    "heads": ("heads", "n_heads", "n_head", "num_heads", "H"),
    "kv_heads": ("kv_heads", "n_kv_heads", "n_kv_head", "num_kv_heads", "KV"),
    "hidden": ("hidden", "ffn_hidden", "intermediate_size", "ffn_dim"),
}


def load_sample(name: str):
    """Import samples/<name>.py as a module of its own (a plain import: the suite uses only
    minicomp's public API)."""
    import importlib.util
    import sys
    path = ROOT / "samples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_sample_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module      # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


def match_sizes(build: Callable, wanted: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Map canonical size names onto `build`'s keyword names; report the ones it lacks."""
    params = inspect.signature(build).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs, missing = {}, []
    for canon, value in wanted.items():
        alias = next((a for a in SIZE_ALIASES.get(canon, (canon,)) if a in params), None)
        if alias is None and takes_any:
            alias = canon
        if alias is None:
            missing.append(canon)
        else:
            kwargs[alias] = value
    return kwargs, missing


def _sample(name: str):
    def make(device, dtype, s, gen) -> Built:
        module = load_sample(name)
        kwargs, missing = match_sizes(module.build, s)
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        fn, inputs = module.build(device=device, dtype=dtype, **kwargs)
        if isinstance(fn, torch.nn.Module):
            fn = fn.eval()
        shapes = ", ".join(f"{k} {v}" for k, v in s.items()) + "; x " + ", ".join(
            "x".join(map(str, t.shape)) for t in inputs)
        notes = [f"samples/{name}.py build() has no size argument for {m!r}: its default was used"
                 for m in missing]
        return Built(fn, list(inputs), shapes, kwargs, notes=notes)
    return make


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("pointwise", "memory", "gelu_tanh(x*w+b)",
             dict(M=8192, N=8192), dict(M=37, N=130), _pointwise),
    Workload("softmax", "memory", "softmax as amax/exp/sum/div",
             dict(M=16384, N=4096), dict(M=19, N=200), _softmax),
    Workload("add_rmsnorm", "memory", "residual add + RMSNorm (fp32 math), two outputs",
             dict(M=16384, N=4096), dict(M=19, N=200), _rmsnorm),
    Workload("layernorm", "memory", "LayerNorm by hand (fp32 math)",
             dict(M=16384, N=4096), dict(M=19, N=200), _layernorm),
    Workload("gemm_bias_gelu", "gemm", "gelu_tanh(x@W+b)",
             dict(M=4096, N=4096, K=4096), dict(M=33, N=48, K=40), _gemm,
             lambda s: 2 * s["M"] * s["N"] * s["K"]),
    Workload("swiglu", "gemm", "SwiGLU MLP (silu(x@W1)*(x@W3))@W2",
             dict(M=4096, D=4096, H=11008), dict(M=33, D=48, H=80), _swiglu,
             lambda s: 3 * 2 * s["M"] * s["D"] * s["H"]),
    Workload("attention", "attention", "causal attention: matmul/scale/mask/softmax/matmul",
             dict(B=4, H=32, S=4096, d=128), dict(B=1, H=2, S=40, d=16), _attention,
             lambda s: 2 * 2 * s["B"] * s["H"] * s["S"] * s["S"] * s["d"] // 2),
    Workload("gpt_block", "block", "samples/gpt_block.py",
             dict(batch=8, seq=1024, width=2048, heads=16),
             dict(batch=2, seq=16, width=64, heads=4), _sample("gpt_block")),
    Workload("llama_block", "block", "samples/llama_block.py",
             dict(batch=4, seq=2048, width=4096, heads=32, kv_heads=8, hidden=11008),
             dict(batch=1, seq=16, width=64, heads=4, kv_heads=2), _sample("llama_block")),
]}

from benchmarks.workloads_models import PREFILL, model_workloads  # noqa: E402  (needs Workload, defined above)
from benchmarks.workloads_issue22 import issue22_workloads, small_batch_workloads  # noqa: E402

# Run order: the suite's kernels and blocks, issue 22's kernels and sweep (the quick ones
# first), the suite's models, then issue 22's small-batch models: a run cut
# short by its budget loses the slowest (whole-model compiles) first.
WORKLOADS.update({w.name: w for w in issue22_workloads(Workload, Target)})
WORKLOADS.update({w.name: w for w in model_workloads(Workload)})
WORKLOADS.update({w.name: w for w in small_batch_workloads(Workload, Target, PREFILL)})

QUICK = ["pointwise", "softmax", "gemm_bias_gelu", "attention"]
CPU_QUICK = ["pointwise", "add_rmsnorm", "gemm_bias_gelu"]
# `--only GROUP` names: issue 22's groups, plus the suite's own kernels and models.
GROUPS: dict[str, list[str]] = {
    "suite": [n for n, w in WORKLOADS.items() if w.group is None and not n.endswith("_model")],
    "models": [n for n in WORKLOADS if n.endswith("_model")],
}
for _w in WORKLOADS.values():
    if _w.group:
        GROUPS.setdefault(_w.group, []).append(_w.name)
# The sweep's third size is the suite's own block workload.
GROUPS["blocks_sweep"] = ["gpt_block_small", "gpt_block_medium", "gpt_block",
                          "llama_block_small", "llama_block_medium", "llama_block"]
GROUPS["issue22"] = GROUPS["weak"] + GROUPS["decode"] + GROUPS["blocks_sweep"] + GROUPS["small_batch"]

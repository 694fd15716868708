"""Host time of one compiled call, measured on the CPU with no GPU: what a model's call costs in
Python before any kernel runs.

    .venv/bin/python scripts/host_overhead.py [WIDTH]     # default width 1024

Figures for transformers' `LlamaForCausalLM` (4 layers, batch 1 x 16 tokens, tiny vocab), and
for the decoder layer of benchmarks/dynamic_lengths.py compiled static and over symbols:

- **run()**: the module generated for an sm_90 target (cuBLAS lines for the few-rows GEMMs,
  Triton kernels for the rest), executed on CPU tensors with every launch's fast path a no-op
  (`Launcher.fast_launcher` returns one after the first, interpreted, call) and `F.linear` /
  `torch.matmul` returning `torch.empty` of the result's shape. What is left is the Python of
  run() itself, the Launcher's fast path, `empty_strided` and `as_layout`.
- **api**: `minicomp.compile(model)` called the plain way with the specialisation's launch
  replaced by one that returns the outputs of an earlier call: the guards on the model's Python
  state (`Binding.read`), the TensorCheck over arguments and weights, and the call's wrapping.

Each is the best of 7 rounds. The figures are this machine's; a GPU host differs, and real
launches and cuBLAS calls come on top (see BENCHMARKS.md for the device figures).
"""

from __future__ import annotations

import os
import sys
import time
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import minicomp  # noqa: E402
from minicomp.api import compile_graph  # noqa: E402
from minicomp.frontend.fx import capture  # noqa: E402
from minicomp.runtime import launcher  # noqa: E402
from minicomp.target import Target  # noqa: E402


def best_us(f, n: int = 200, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def llama(width: int):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=width, intermediate_size=width * 11 // 4,
                                   num_hidden_layers=4, num_attention_heads=width // 128,
                                   num_key_value_heads=max(1, width // 256), max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval().requires_grad_(False)


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def stubbed(gen):
    """The namespace of generated module `gen` run on CPU tensors, every launch's fast path a
    no-op after the first (interpreted) launch, cuBLAS lines returning `torch.empty`."""
    launcher.tune_bench = lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0]     # autotuners take their first config
    launcher.Launcher.fast_launcher = lambda self, *a: ((lambda *args: None), (), 0)
    fake = types.ModuleType("torch")
    fake.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})
    fake.matmul = lambda a, b: torch.empty(a.shape[:-1] + (b.shape[-1],), dtype=a.dtype)
    fake.addmm = lambda c, a, b: torch.empty(a.shape[:-1] + (b.shape[-1],), dtype=a.dtype)
    functional = {k: v for k, v in vars(torch.nn.functional).items() if not k.startswith("__")}
    functional["linear"] = lambda a, w, b=None: torch.empty(a.shape[:-1] + (w.shape[0],), dtype=a.dtype)
    fake.nn = types.SimpleNamespace(functional=types.SimpleNamespace(**functional))   # the rest as PyTorch has it
    ns: dict = {"__name__": "minicomp_host_overhead"}
    exec(compile(gen.source, "<generated>", "exec"), ns)
    ns.update(DEVICE_TYPE="cpu", torch=fake)
    ns["CONSTANTS"][:], ns["OPAQUE"][:], ns["_WARM"][:] = gen.constants, gen.opaque, []
    ns["_launch"].current_device = lambda: 0
    return ns


def counts(gen) -> str:
    body = gen.source[gen.source.index("def run("):]
    return (f"{body.count('_launch(')} launches, "
            f"{body.count('functional.linear(') + body.count('torch.matmul(') + body.count('torch.addmm(')} "
            f"cuBLAS lines, {body.count('empty_strided')} empty_strided, {body.count('_as_layout(')} as_layout")


def module_run_us(model, ids) -> tuple[float, str]:
    fn = Logits(model)
    g = capture(fn, [ids])
    weights = g.binding.read()
    gen = compile_graph(g, [ids, *weights], device="cuda", load=False, target=Target("cuda", (9, 0))).generated
    ns, inputs = stubbed(gen), [ids, *weights]
    ns["run"](*inputs)               # the first call interprets each kernel once and keeps its fast path
    return best_us(lambda: ns["run"](*inputs)), counts(gen)


def layer_run_us(dynamic: bool) -> tuple[float, str]:
    """run() of benchmarks/dynamic_lengths.py's Llama decoder layer (width 256, batch 2 x 24)
    compiled static or over symbolic sizes, for an sm_90 target."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
    from dynamic_lengths import build

    from minicomp.codegen import generate
    step, make = build(256, "cpu", torch.float32)
    x = make(2, 24)
    f = minicomp.compile(step, dynamic=dynamic)
    c = f.compile_for(*x)
    _, tensors, weights = f._find(x)
    gen = generate(c.graph, c.plan, Target("cuda", (9, 0)))
    ns, inputs = stubbed(gen), [*tensors, *weights]
    ns["run"](*inputs)
    return best_us(lambda: ns["run"](*inputs)), counts(gen)


def api_us(model, ids) -> tuple[float, float, int]:
    f = minicomp.compile(Logits(model))
    with torch.no_grad():
        f(ids)
        f(ids)
        (s,) = [s for entries in f._fast.values() for s in entries]
        outs = s.checked_launch(ids, *s.binding.read())
        s.checked_launch = lambda *inputs: outs
        for check in s.checks:      # each call's checks keep the launch they were made with
            check.launch = lambda *inputs, **kw: outs
        started = time.perf_counter()
        f(ids)
        if time.perf_counter() - started > 0.05:     # an interpreted call takes about a second
            raise SystemExit("api_us: the stubbed launch was not taken (the api's call path changed): "
                             "the timing would run the interpreter 14000 times")
        call, read = best_us(lambda: f(ids), 2000), best_us(s.binding.read, 2000)
    return call, read, len(s.binding.equal) + len(s.binding.same)


def main() -> None:
    width = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    model, ids = llama(width), torch.randint(0, 512, (1, 16))
    call, read, guards = api_us(model, ids)
    print(f"api: a call with its launch stubbed {call:.0f} us, of which Binding.read {read:.0f} us ({guards} guards)")
    run, what = module_run_us(model, ids)
    print(f"run(): {run:.0f} us of host Python for {what} (launches and cuBLAS stubbed)")
    for dynamic in (False, True):
        run, what = layer_run_us(dynamic)
        print(f"decoder layer, {'symbolic' if dynamic else 'static'} sizes: run() {run:.0f} us for {what}")


if __name__ == "__main__":
    main()

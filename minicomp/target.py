"""What a module is generated for: the `Target` record, read once at the boundary.

Codegen writes different kernels for a CUDA device than for Triton's CPU interpreter
(autotuning sweeps, bf16 `tl.dot`, TMA descriptors, the Hopper attention kernel), and the
choice depends on the device's compute capability and a few switches. All of that is one
frozen record, built by `minicomp/api`/`cli.py` (`Target.for_device`, `Target.for_check`) and passed
down; no stage below reads the environment or asks the driver. The record also carries the
switches of the stages before codegen that the environment sets (which tracer captures,
whether Triton is primed while it does) and the row-kernel form knobs tests turn.

`parse_verify_target("cuda:90")` reads the GPU-true check's target (`MINICOMP_VERIFY_TARGET`,
`minicomp.compile(..., verify_target=...)`, `--verify-target`): after generating a module,
every kernel is also compiled by Triton's own compiler for that GPU, with no GPU present.

Invariants: this module imports nothing of minicomp but its errors, so every stage may read it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from minicomp.errors import MinicompError

HOPPER_ATTENTION_ENV = "MINICOMP_HOPPER_ATTENTION"   # "0": never the Gluon kernel; "1": wherever it fits; "": where it pays for its compile
VERIFY_TARGET_ENV = "MINICOMP_VERIFY_TARGET"
VERIFY_DEPTH_ENV = "MINICOMP_VERIFY_DEPTH"          # "full" (default) or "sampled" (the test suite's)
VERIFY_TRITON_ENV = "MINICOMP_VERIFY_TRITON"        # a directory with another Triton for the check's compiles (target_check.py)
VERIFY_DEPTHS = ("full", "sampled")
CAPTURE_ENV = "MINICOMP_CAPTURE"                     # "fake": capture with make_fx only
PRIME_TRITON_ENV = "MINICOMP_PRIME_TRITON"           # "0": no priming thread (runtime/prime.py)
TIERED_ENV = "MINICOMP_TIERED"                       # "0": a slow-to-compile kernel compiles before its first launch
LIBRARY_GEMM_ENV = "MINICOMP_LIBRARY_GEMM"           # "0": our GEMM kernels only; "all": cuBLAS for every GEMM (library_mode)
LIBRARY_ATTENTION_ENV = "MINICOMP_LIBRARY_ATTENTION" # "0": attention never calls SDPA (library_attention_on)
DUAL_GEMM_ENV = "MINICOMP_DUAL_GEMM"                 # "fused": SwiGLU's pair stays one dual GEMM at every size (dual_gemm_fused)
LIBRARY_JOINS_ENV = "MINICOMP_LIBRARY_JOINS"         # "0": a GEMM whose result meets a tile keeps the join in our epilogue; "all": every such GEMM calls cuBLAS
JOIN_MIN_FLOP = 2 ** 35
GEMM_EPILOGUE_ENV = "MINICOMP_GEMM_EPILOGUE"         # how the persistent GEMM runs its epilogue (gemm_epilogue_mode)
GEMM_COMBO_ENV = "MINICOMP_GEMM_COMBO"               # sibling GEMMs sharing A in one launch: "auto", "all" or "0" (gemm_combo_mode)
GEMM_COMBOS = ("auto", "all", "off")
REUSE_BUFFERS_ENV = "MINICOMP_REUSE_BUFFERS"         # "0": every kernel output a new allocation (codegen/buffers.py)
EAGER_FIRST_ENV = "MINICOMP_EAGER_FIRST"             # "0": a first call waits for its kernels' compiles (codegen/first_calls.py)
PDL_ENV = "MINICOMP_PDL"                             # "0": no programmatic dependent launch (codegen/pdl.py)
GRAPH_FEW_ROWS_ENV = "MINICOMP_GRAPH_FEW_ROWS"       # under CUDA graphs, which few-rows GEMMs call cuBLAS (library_plan.planned)
GEMM_EPILOGUES = ("auto", "plain", "overlap")
CAPTURES = ("eager", "fake")
KNOWN_ARCHS = (80, 86, 89, 90)                       # capabilities the check compiles for
MATMUL_PRECISIONS = ("ieee", "tf32")                 # fp32 `tl.dot` input precision


def read_matmul_precision() -> str:
    """What PyTorch's switches say fp32 matmuls may use: "tf32" or "ieee" (full precision).

    The newer per-backend switch (`torch.backends.cuda.matmul.fp32_precision`, then the global
    `torch.backends.fp32_precision`) wins when set; "none" defers to the legacy
    `torch.backends.cuda.matmul.allow_tf32`, which `torch.set_float32_matmul_precision` also sets.
    PyTorch raises on reading the legacy switch once both APIs were used: full precision then,
    the safe answer (it never loses accuracy)."""
    import torch
    for value in (getattr(torch.backends.cuda.matmul, "fp32_precision", "none"),
                  getattr(torch.backends, "fp32_precision", "none")):
        if value in MATMUL_PRECISIONS:
            return value
    try:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    except RuntimeError:
        return "ieee"


LIBRARY_MODES = ("off", "on", "all")


def library_mode(environ: dict | None = None) -> str:
    """Which GEMMs of a CUDA module call cuBLAS (codegen/library.py), as $MINICOMP_LIBRARY_GEMM
    says: "off" for "0"; "all" for "all" (every GEMM, its epilogue fused with what follows: an
    experiment to measure against our kernels); else "on" (those with nothing to fuse, and
    those of few rows)."""
    env = os.environ if environ is None else environ
    value = env.get(LIBRARY_GEMM_ENV, "").strip()
    return "off" if value == "0" else "all" if value == "all" else "on"


def library_attention_on(environ: dict | None = None) -> bool:
    """Whether $MINICOMP_LIBRARY_ATTENTION lets attention groups of a CUDA module call SDPA
    (codegen/library_attention.py): unless it is "0". Library mode "off" turns SDPA off as well
    (`Target.for_device`): one switch gives our kernels only."""
    env = os.environ if environ is None else environ
    return env.get(LIBRARY_ATTENTION_ENV, "").strip() != "0"


def dual_gemm_fused(environ: dict | None = None) -> bool:
    """Whether $MINICOMP_DUAL_GEMM ("fused") keeps a large dual GEMM (SwiGLU's gate and up
    projections) as one kernel of ours on CUDA, instead of cuBLAS for one of the pair and our
    GEMM, with the join in its epilogue, for the other (codegen/library_plan.py `split_pairs`)."""
    env = os.environ if environ is None else environ
    return env.get(DUAL_GEMM_ENV, "").strip() == "fused"


def library_joins_mode(environ: dict | None = None) -> str:
    """Which GEMMs of many rows whose result meets a tile of its own size (a residual add) call
    cuBLAS, the join fusing with the next kernel (codegen/library_plan.py `tile_joins`), by
    $MINICOMP_LIBRARY_JOINS: "0" none ("off"), "all" every one, else those of at least
    `Target.join_min_flop` operations ("on")."""
    env = os.environ if environ is None else environ
    value = env.get(LIBRARY_JOINS_ENV, "").strip()
    return "off" if value == "0" else "all" if value == "all" else "on"


def gemm_epilogue_mode(environ: dict | None = None) -> str:
    """How the persistent TMA GEMM (codegen/gemm.py) runs its epilogue, as $MINICOMP_GEMM_EPILOGUE
    says: "plain" (after each tile's K loop), "overlap" (the tile loop and the K loop are one
    flattened loop, so the next tile's loads are issued while the epilogue runs) or "auto" (the
    default: "overlap" unless the epilogue loads a tile of the output's size, where "plain" ran
    faster). Unknown values are an error that names the choices."""
    env = os.environ if environ is None else environ
    value = env.get(GEMM_EPILOGUE_ENV, "").strip() or Target.gemm_epilogue
    if value not in GEMM_EPILOGUES:
        raise MinicompError(f"{GEMM_EPILOGUE_ENV}={value!r}: expected one of {', '.join(GEMM_EPILOGUES)}")
    return value


def _on_unless_zero(name: str, environ: dict | None) -> bool:
    """Whether the variable `name` of `environ` (default: the process's) leaves its switch on:
    anything but "0"."""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip() != "0"


def reuse_buffers_on(environ: dict | None = None) -> bool:
    """Whether $MINICOMP_REUSE_BUFFERS lets a kernel output take a dead buffer's memory
    (codegen/buffers.py): anything but "0"."""
    return _on_unless_zero(REUSE_BUFFERS_ENV, environ)


def graph_few_rows_mode(environ: dict | None = None) -> str:
    """Which GEMMs of few rows $MINICOMP_GRAPH_FEW_ROWS sends to cuBLAS under CUDA graphs
    (codegen/library_plan.py `graph_library_rows`): "1" every one ("on"), "0" none ("off"), else
    "auto": those of at least `library_plan.GRAPH_LIBRARY_ROWS` rows, where cuBLAS's split over
    the SMs beat our fused GEMMs (Llama 2 x 16 on the H200, session 31; 4 x 16 on the H100,
    session 30), while at 1 and 16 rows ours won (0.281 ms against 0.358 at 1 x 1, H200; 0.336
    against 0.358 at 1 x 16, H100)."""
    env = os.environ if environ is None else environ
    value = env.get(GRAPH_FEW_ROWS_ENV, "").strip()
    return {"1": "on", "0": "off"}.get(value, "auto")


def eager_first_on(environ: dict | None = None) -> bool:
    """Whether $MINICOMP_EAGER_FIRST lets eager (cuBLAS, SDPA or the group's own PyTorch ops)
    answer a group's first calls while our kernel for it compiles in the background
    (codegen/first_calls.py): anything but "0". On the H100 it took a 4-layer Llama's first call
    in a warm process from 5.15 s to 2.30 (torch.compile: 4.50 and 10.31 in two runs) and
    lm_head_50257's from 0.82 to 0.04 (BENCHMARKS.md, session 26)."""
    return _on_unless_zero(EAGER_FIRST_ENV, environ)


def pdl_on(environ: dict | None = None) -> bool:
    """Whether $MINICOMP_PDL asks for programmatic dependent launch (codegen/pdl.py): anything
    but "0"; the target takes it only on a GPU of capability 9.0 or newer, in the default mode and
    under CUDA graphs alike (a stream capture records a PDL launch as a programmatic edge, which
    the graph's replay keeps). On the H100 it took Qwen2's 4 x 512 call from 1.836 ms to 1.791 and
    Llama's from 1.869 to 1.852 (BENCHMARKS.md, session 26)."""
    return _on_unless_zero(PDL_ENV, environ)


def gemm_combo_mode(environ: dict | None = None) -> str:
    """When sibling GEMMs sharing operand A launch as one kernel (codegen/gemm_combo.py), as
    $MINICOMP_GEMM_COMBO says: "auto" (the default: where together they are launch-bound), "all"
    (any size) or "0" ("off"). Unknown values are an error that names the choices."""
    env = os.environ if environ is None else environ
    value = env.get(GEMM_COMBO_ENV, "").strip() or "auto"
    value = "off" if value == "0" else value
    if value not in GEMM_COMBOS:
        raise MinicompError(f"{GEMM_COMBO_ENV}={value!r}: expected one of auto, all, 0")
    return value


CODEGEN_ENVS = (LIBRARY_GEMM_ENV, LIBRARY_ATTENTION_ENV, DUAL_GEMM_ENV, GEMM_EPILOGUE_ENV, LIBRARY_JOINS_ENV,
                GEMM_COMBO_ENV, REUSE_BUFFERS_ENV, PDL_ENV, EAGER_FIRST_ENV, GRAPH_FEW_ROWS_ENV)
_seen_codegen_env: tuple = (object(), None)     # (the raw values, codegen_switches() of them)
try:        # the variables' names as os.environ keeps them (bytes on POSIX)
    _CODEGEN_KEYS: tuple | None = tuple(map(os.environ.encodekey, CODEGEN_ENVS))   # type: ignore[attr-defined]
except AttributeError:
    _CODEGEN_KEYS = None


def codegen_switches() -> tuple:
    """(library_mode(), library_attention_on(), dual_gemm_fused(), gemm_epilogue_mode(),
    library_joins_mode(), gemm_combo_mode(), buffer reuse on, pdl_on(), eager_first_on(),
    graph_few_rows_mode()) of
    this process's environment, read again only when one of their variables changed: every
    compiled call keys its cache on them, and the parsed reads (five then) took ~4 us a call on
    the 2-core CPU machine. `os.environ` keeps its encoded values in
    `_data` (what `os.environ[...] = ...` writes); where this Python has no such dict, every
    call reads them."""
    global _seen_codegen_env
    data = getattr(os.environ, "_data", None)
    raw = tuple(map(data.get, _CODEGEN_KEYS)) if isinstance(data, dict) and _CODEGEN_KEYS is not None else None
    seen, value = _seen_codegen_env
    if raw is None or raw != seen:
        value = (library_mode(), library_attention_on(), dual_gemm_fused(), gemm_epilogue_mode(), library_joins_mode(),
                 gemm_combo_mode(), reuse_buffers_on(), pdl_on(), eager_first_on(), graph_few_rows_mode())
        if raw is not None:
            _seen_codegen_env = (raw, value)
    return value


@dataclass(frozen=True)
class RowForm:
    """How codegen shapes row kernels (reductions, scans). Tests force the looped form with
    `RowForm(single_pass_max=0, cpu_loop_block=16)` so short rows span several column blocks,
    and the split form with `RowForm(split_fill=8, split_min_chunk=16)`."""
    single_pass_max: int = 8192      # longest row (elements) held in one tile; longer rows loop
    cpu_loop_block: int = 1024       # interpreter: column block of the looped form (CUDA autotunes it)
    # split (two-stage) reductions, codegen/split_reduce.py: a reduction whose row blocks are fewer
    # than `split_fill` programs shares each row between programs. None: on CUDA, two per SM of
    # the machine model (plan/cost.py) when the idle SMs cost more than a second launch; under the
    # interpreter never (its shapes are small); 0: never; N: whenever fewer than N (tests).
    split_fill: int | None = None
    split_min_chunk: int = 2048      # fewest elements of a row one program of a split reduces

    def __post_init__(self) -> None:
        if self.single_pass_max < 0 or self.cpu_loop_block < 1 or self.cpu_loop_block & (self.cpu_loop_block - 1):
            raise MinicompError(f"{self}: single_pass_max must be >= 0 and cpu_loop_block a power of two")
        if (self.split_fill is not None and self.split_fill < 0) or self.split_min_chunk < 1:
            raise MinicompError(f"{self}: split_fill must be None or >= 0 and split_min_chunk >= 1")


@dataclass(frozen=True)
class Target:
    device_type: str                               # "cuda" or "cpu" (Triton's interpreter)
    capability: tuple[int, int] | None = None      # CUDA compute capability codegen writes for
    hopper_attention: str = ""                     # MINICOMP_HOPPER_ATTENTION: "", "0" or "1"
    tma_on_cpu: bool = False                       # tests: write the TMA GEMM form for the interpreter too
    verify_arch: int | None = None                 # the GPU-true check: also compile every kernel for sm_<this>
    verify_depth: str = "full"                     # "full": every config to a cubin; "sampled": see target_worker.py
    row_form: RowForm = RowForm()                  # row-kernel form knobs (tests force the looped form)
    capture: str = "eager"                         # MINICOMP_CAPTURE: "eager" tracer first, or "fake" (make_fx only)
    prime_triton: bool = True                      # MINICOMP_PRIME_TRITON != "0": prime Triton while capture runs
    tiered: bool = True                            # MINICOMP_TIERED != "0": the Gluon attention kernel compiles in
                                                   # the background while a block-language one serves the first calls
    # fp32 GEMM `tl.dot(..., input_precision=...)`: PyTorch's switches when the record is made
    # (`read_matmul_precision`); the compile cache keys on them too (api._modes), so a flip recompiles
    matmul_precision: str = field(default_factory=read_matmul_precision)
    # CUDA: a GEMM group with nothing to fuse calls cuBLAS (codegen/library.py); the CPU target
    # never does, so the interpreter keeps testing our GEMM kernels. MINICOMP_LIBRARY_GEMM=0 turns
    # it off; the compile cache keys on it (api._modes)
    library_gemm: bool = True
    library_all: bool = False      # every GEMM calls cuBLAS (library mode "all"; needs library_gemm)
    # CUDA: an attention group the Gluon kernel does not take and with nothing to fuse calls SDPA
    # (codegen/library_attention.py); off with MINICOMP_LIBRARY_ATTENTION=0 or library mode "off"
    library_attention: bool = True
    # the module is replayed as CUDA graphs (mode="reduce-overhead"; codegen/library_plan.py)
    graphs: bool = False
    # ... where a GEMM of few rows may call cuBLAS, its epilogue fused forward (library_plan
    # `graph_library_rows`): "auto" from GRAPH_LIBRARY_ROWS rows on, "on" every one, "off" none
    # (graph_few_rows_mode says what was measured)
    graph_few_rows: str = "auto"
    # CUDA: a dual GEMM of many rows (SwiGLU at prefill) is split: cuBLAS computes one matmul of
    # the pair and our GEMM the other, with the join in its epilogue (codegen/library_plan.py
    # `split_pairs`); MINICOMP_DUAL_GEMM=fused keeps it one kernel of ours
    split_dual: bool = True
    # CUDA: a GEMM of many rows whose result meets a tile of its own size calls cuBLAS and the
    # join fuses forward (codegen/library_plan.py `tile_joins`); MINICOMP_LIBRARY_JOINS=0 keeps our GEMM
    library_joins: bool = True
    join_min_flop: int = JOIN_MIN_FLOP   # ... of at least this many operations (library_plan.JOIN says why; "all": 0)
    # CUDA: the persistent TMA GEMM's epilogue (gemm_epilogue_mode, codegen/gemm.py)
    gemm_epilogue: str = "auto"
    # sibling GEMMs sharing operand A in one launch (gemm_combo_mode, codegen/gemm_combo.py)
    gemm_combo: str = "auto"
    # a kernel output takes the memory of a buffer nothing reads any more (codegen/buffers.py)
    reuse_buffers: bool = True
    # CUDA, capability 9.0 and newer: each Triton kernel launches with programmatic dependent
    # launch and waits for the kernel before it first thing (codegen/pdl.py); `for_device` turns
    # it on there unless MINICOMP_PDL=0 (it depends on the capability, so it is off here)
    pdl: bool = False
    # CUDA: eager (cuBLAS, SDPA or the group's own PyTorch ops) answers a group until its kernel
    # has compiled in the background (codegen/first_calls.py); MINICOMP_EAGER_FIRST=0 turns it off
    eager_first: bool = True

    def __post_init__(self) -> None:
        if self.device_type not in ("cuda", "cpu"):
            raise MinicompError(f"unknown device type {self.device_type!r} (expected 'cuda' or 'cpu')")
        if self.capture not in CAPTURES:
            raise MinicompError(f"capture {self.capture!r}: expected one of {', '.join(CAPTURES)}")
        if not isinstance(self.row_form, RowForm):
            raise MinicompError(f"row_form={self.row_form!r}: expected a minicomp.target.RowForm")
        if self.verify_depth not in VERIFY_DEPTHS:
            raise MinicompError(f"{VERIFY_DEPTH_ENV}={self.verify_depth!r}: expected one of {', '.join(VERIFY_DEPTHS)}")
        if self.gemm_epilogue not in GEMM_EPILOGUES:
            raise MinicompError(f"gemm_epilogue={self.gemm_epilogue!r}: expected one of {', '.join(GEMM_EPILOGUES)}")
        if self.gemm_combo not in GEMM_COMBOS:
            raise MinicompError(f"gemm_combo={self.gemm_combo!r}: expected one of {', '.join(GEMM_COMBOS)}")
        if self.pdl and (self.device_type != "cuda" or self.capability is None or self.capability < (9, 0)):
            raise MinicompError(f"pdl needs a CUDA target of capability 9.0 or newer, not {self.describe()}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise MinicompError(f"matmul_precision={self.matmul_precision!r}: expected one of "
                                f"{', '.join(MATMUL_PRECISIONS)}")

    @property
    def interpret(self) -> bool:
        """Kernels of this target run under Triton's CPU interpreter."""
        return self.device_type == "cpu"

    @property
    def arch(self) -> int | None:
        """The capability as Triton's GPUTarget number (9.0 -> 90), None on the CPU."""
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def describe(self) -> str:
        return f"cuda:{self.arch}" if self.device_type == "cuda" and self.arch else self.device_type

    @staticmethod
    def for_device(device_type: str, environ: dict | None = None, verify_target: str | None = None,
                   row_form: RowForm | None = None, library: str | None = None, graphs: bool = False) -> "Target":
        """The target of kernels that will run on this machine's `device_type` ("cuda": the
        current device's capability), with the switches of `environ` (default: the process's
        environment). `verify_target` ("cuda:90") overrides $MINICOMP_VERIFY_TARGET; `row_form`
        (default `RowForm()`) shapes the row kernels; `library` (one of LIBRARY_MODES) overrides
        $MINICOMP_LIBRARY_GEMM ("off" turns SDPA off too, whatever $MINICOMP_LIBRARY_ATTENTION says)."""
        env = os.environ if environ is None else environ
        library = library or library_mode(env)
        joins = library_joins_mode(env)
        if library not in LIBRARY_MODES:
            raise MinicompError(f"library={library!r}: expected one of {', '.join(LIBRARY_MODES)}")
        capability = None
        if device_type == "cuda":
            import torch
            if torch.cuda.is_available():
                capability = tuple(torch.cuda.get_device_capability())
        arch = parse_verify_target(verify_target if verify_target is not None else env.get(VERIFY_TARGET_ENV))
        return Target(device_type, capability, hopper_attention=env.get(HOPPER_ATTENTION_ENV, ""),
                      verify_arch=arch, verify_depth=env.get(VERIFY_DEPTH_ENV, "").strip() or "full",
                      row_form=row_form or RowForm(), capture=capture_mode(env),
                      prime_triton=env.get(PRIME_TRITON_ENV) != "0", tiered=env.get(TIERED_ENV) != "0",
                      library_gemm=library != "off", library_all=library == "all",
                      library_attention=library != "off" and library_attention_on(env), graphs=graphs,
                      split_dual=not dual_gemm_fused(env), gemm_epilogue=gemm_epilogue_mode(env),
                      library_joins=joins != "off", join_min_flop=0 if joins == "all" else JOIN_MIN_FLOP,
                      gemm_combo=gemm_combo_mode(env), reuse_buffers=reuse_buffers_on(env),
                      pdl=pdl_on(env) and capability is not None and capability >= (9, 0),
                      eager_first=eager_first_on(env), graph_few_rows=graph_few_rows_mode(env))

    @staticmethod
    def for_options(device_type: str, options: Any) -> "Target":
        """`for_device` with the switches of a compile's `minicomp.api.Options` (`verify_target`,
        `row_form`) and the process's environment, read now: once per compile, before capture,
        whose tracer and priming the record also decides."""
        return Target.for_device(device_type, verify_target=options.verify_target, row_form=options.row_form,
                                 library=getattr(options, "library", None),
                                 graphs=getattr(options, "mode", "default") == "reduce-overhead")

    def for_check(self, arch: int) -> "Target":
        """This target's switches, for a CUDA device of capability `arch` (what the GPU-true
        check generates and compiles; it checks nothing further itself). A CPU module runs our
        GEMM and attention kernels, never cuBLAS or SDPA, so its check compiles those (`library_gemm`,
        `library_attention` off)."""
        cuda = self.device_type == "cuda"
        return replace(self, device_type="cuda", capability=(arch // 10, arch % 10), tma_on_cpu=False,
                       verify_arch=None, library_gemm=self.library_gemm and cuda,
                       library_attention=self.library_attention and cuda, pdl=self.pdl and arch >= 90)


def capture_mode(environ: dict | None = None) -> str:
    """The tracer $MINICOMP_CAPTURE asks for: "fake" (make_fx only), else "eager" (the eager
    tracer first, make_fx where it declines), as the variable has always been read."""
    env = os.environ if environ is None else environ
    return "fake" if env.get(CAPTURE_ENV, "eager") == "fake" else "eager"


def parse_verify_target(text: str | None) -> int | None:
    """`"cuda:90"` -> 90; None or "" -> None (no check). Anything else is a clear error."""
    if text is None or text.strip() in ("", "0", "off", "none"):
        return None
    m = re.fullmatch(r"\s*(?:cuda:)?(?:sm_?)?(\d{2,3})\s*", text)
    if m is None or int(m.group(1)) not in KNOWN_ARCHS:
        raise MinicompError(f"verify target {text!r}: expected cuda:NN with NN one of "
                            f"{', '.join(map(str, KNOWN_ARCHS))} (e.g. cuda:90 for Hopper, cuda:80 for Ampere)")
    return int(m.group(1))

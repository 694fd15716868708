"""`Launch` records written as `call()` lines and as the first call's `_WARM` entries.

An emitter returns its launches as data (`common.Launch`: a `Grid`, the arguments with tensors
as `Buf(nid)`, the keyword arguments). This module writes each one twice:

- as a line of `call()`: on CUDA `_launch(kernel, grid, *args, **kwargs, _site=key)` through
  the module's `Launcher` (minicomp/runtime/launcher.py: Triton's path once, the compiled
  kernel's own launcher after, kept under `key`: the kernel's name and a digest of the launch's
  dtypes and literal arguments, `site_key`; a launch with sizes known only at run time passes
  no key, and the Launcher builds one from its arguments); under the CPU interpreter a plain
  `kernel[grid](*args, **kwargs)`;
- on CUDA, as a `_WARM` entry `(kernel, args, kwargs)` with each tensor written as its dtype,
  which is what `JITFunction.warmup` takes: the first call compiles every (kernel, config) at
  once from this list (`runtime.launcher.CompilingAtOnce`), and the GPU-true check compiles
  the same list for a target (codegen/target_check.py).

A grid that needs autotuned block sizes is written `lambda meta: (...)`, as Triton expects; a
kernel of a single config is not autotuned: its launch passes the config's constexprs and
`num_warps`/`num_stages` itself, and its grid is numbers.
"""

from __future__ import annotations

import hashlib
from typing import Callable

from minicomp.codegen.common import Blocks, Buf, Grid, Kernel, Launch, Ready, Runtime, Scratch, When
from minicomp.codegen.sizes import OWN_NAMES
from minicomp.ir import dims


def _factor_text(f) -> str:
    if isinstance(f, Blocks):
        counts = " + ".join(f"triton.cdiv({n}, meta[{f.block!r}])" for n in (f.n, *f.more))
        return f"({counts})" if f.more else counts
    if dims.is_symbolic(f) and len(f.terms) > 1:
        return f"({f})"         # a sum of sizes, one factor of a product
    return str(f)


def grid_text(grid: Grid) -> str:
    """`(12, 8)`, or `lambda meta: (triton.cdiv(26, meta['BLOCK_R']),)` when block sizes are tuned."""
    dims = [" * ".join(_factor_text(f) for f in d) for d in grid.dims]
    if grid.persistent:
        share = f" * meta[{grid.share!r}]" if grid.share else ""
        dims[0] = f"min(_sm_count(device){share}, {dims[0]})"
    body = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
    return f"lambda meta: {body}" if grid.needs_meta() or grid.persistent else body


def fixed_grid(grid: Grid, kwargs: tuple) -> Grid:
    """`grid` with the block sizes its launch passes itself (a kernel of one config, not
    autotuned) as numbers: `(6,)` rather than `lambda meta: (triton.cdiv(192, meta['BLOCK_N']),)`."""
    known = {k: v for k, v in kwargs if isinstance(v, int) and not isinstance(v, bool)}
    out = []
    for d in grid.dims:
        number, left = 1, []
        for f in d:
            if isinstance(f, Blocks) and f.block in known and not dims.any_symbolic((f.n, *f.more)):
                number *= f.count(known[f.block])
            elif isinstance(f, Blocks):
                left.append(f)
            else:
                number *= f
        out.append(((number,) if number != 1 or not left else ()) + tuple(left))
    return Grid(tuple(out), grid.persistent, grid.share)


def _value_text(v) -> str:
    if isinstance(v, Runtime):
        return v.text
    if isinstance(v, float) and v != v:
        return "float('nan')"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "float('inf')" if v > 0 else "-float('inf')"
    return repr(v)


def args_text(launch: Launch, buf_name: Callable[[int], str], aligned: frozenset | set = frozenset()) -> list[str]:
    """The launch's positional and keyword arguments as text (tensors by their call() names).
    A tensor of `aligned` (the module's inputs, which run() lays out aligned, and the buffers it
    allocates) is passed as it is where a TMA operand would be aligned first (`_align16`)."""
    out = []
    for a in launch.args:
        if isinstance(a, Buf):
            text = f"_align16({buf_name(a.nid)})" if a.align16 and a.nid not in aligned else buf_name(a.nid)
            out.append(f"{a.wrap}({text})" if a.wrap else text)
        elif isinstance(a, Scratch):
            out.append(a.name)
        else:
            out.append(_value_text(a))
    return out + [f"{k}={_value_text(v)}" for k, v in launch.kwargs]


def scratch_lines(launches: list[Launch]) -> list[str]:
    """call()'s lines allocating the `Scratch` buffers these launches share, each once."""
    found = dict.fromkeys(a for launch in launches for a in launch.args if isinstance(a, Scratch))
    return [f"{s.name} = torch.empty(({dims.py(s.numel, OWN_NAMES) if dims.is_symbolic(s.numel) else s.numel},), "
            f"dtype={s.dtype}, device=device)  # scratch" for s in found]


def _literal(launch: Launch) -> bool:
    """Whether every argument but the tensors is a value known at codegen (static sizes)."""
    return not any(isinstance(v, Runtime) for v in tuple(launch.args) + tuple(v for _, v in launch.kwargs))


def site_key(kernel: str, launch: Launch, dtype_of: Callable[[int], object]) -> str:
    """The launch's fast-launcher key (`Launcher`'s `_site`): the kernel's name and a digest of its
    signature (each tensor's dtype, each other argument's value), so launches of one kernel
    with equal signatures share one compiled specialisation and its launcher."""
    parts = [str(dtype_of(a.nid)) if isinstance(a, Buf) else str(a.dtype) if isinstance(a, Scratch)
             else _value_text(a) for a in launch.args]
    signature = "|".join([kernel, *parts, *(f"{k}={_value_text(v)}" for k, v in launch.kwargs)])
    return f"{kernel}#{hashlib.blake2s(signature.encode(), digest_size=8).hexdigest()}"


def launch_lines(kernel: str, launch: Launch, buf_name: Callable[[int], str], cuda: bool,
                 dtype_of: Callable[[int], object] | None = None, aligned: set | None = None,
                 tma_ready: bool = True) -> list[str]:
    """The lines of call() that run `launch` of `kernel`. `aligned`: the tensors a generated
    module's trusting Launcher (`Launcher(aligned=True)`) may take without a test (as `args_text`
    takes it); a launch with another goes through `_launch.checked`. None: no such knowledge (a
    plain Launcher). Without `tma_ready` the caller installs Triton's allocator for TMA
    descriptors itself."""
    kernel = launch.fn or kernel
    lines = ["_tma_ready()"] if launch.tma and tma_ready else []
    args = ", ".join(args_text(launch, buf_name, aligned or frozenset()))
    grid = grid_text(fixed_grid(launch.grid, launch.kwargs))
    # a module's Launcher trusts its tensors aligned; one it cannot vouch for goes through `checked`
    # (every tensor known aligned: an input, a buffer, constants, or made so by `_align16`, a padded copy)
    known = aligned is None or all(a.nid in aligned or a.align16 or a.wrap for a in launch.args if isinstance(a, Buf))
    launcher = "_launch" if known else "_launch.checked"
    if cuda and dtype_of is not None and _literal(launch):
        lines.append(f"{launcher}({kernel}, {grid}, {args}, _site={site_key(kernel, launch, dtype_of)!r})")
    elif cuda:
        lines.append(f"{launcher}({kernel}, {grid}, {args})")
    else:
        lines.append(f"{kernel}[{grid}]({args})")
    if launch.when is not None:
        lines = [f"if {_test(launch.when)}:"] + ["    " + line for line in lines]
    return lines


def _test(w: When | Ready) -> str:
    """A launch condition's test: of the call's sizes (`s1 <= 4096`), of a background compile
    (`_rt.compiled(k)`), or of all of a kernel's compiles at once, kept in `var` by its first
    launch and read by the others, with the launch's own size test after it."""
    if isinstance(w, When):
        return f"{dims.py(w.size, OWN_NAMES)} {'<=' if w.at_most else '>'} {w.limit}"
    if not w.var:
        return f"{'' if w.ready else 'not '}_rt.compiled({w.fn})"
    test = f"({w.var} := {' and '.join(f'_rt.compiled({f})' for f in w.together)})" if w.first else w.var
    return test + (f" and {_test(w.inner)}" if w.inner is not None else "")




def _at_hints(v):
    if isinstance(v, Runtime):
        return v.hint
    return dims.hint(v) if dims.is_symbolic(v) else v


def warm_entries(kernel: Kernel, dtype_of: Callable[[int], str]) -> tuple[list[str], list[str]]:
    """The `_WARM` entries of `kernel`'s launches, and apart the `_LATER` ones: a launch made
    once its kernel has compiled (`Ready`) compiles in the background instead."""
    def later(launch: Launch) -> bool:
        return isinstance(launch.when, Ready) and launch.when.ready
    return ([warm_entry(kernel.name, launch, dtype_of) for launch in kernel.launches if not later(launch)],
            [warm_entry(kernel.name, launch, dtype_of) for launch in kernel.launches if later(launch)])


def queue_warm(kernel: Kernel, shared: bool, dtype_of: Callable[[int], str], warm: list, later: list) -> None:
    """Add `kernel`'s `_WARM` and `_LATER` entries (`warm_entries`, sizes at their hints) to a
    module's lists. A kernel `shared` with an earlier group (codegen/dedup.py) adds only entries
    not there yet: it compiles once per distinct entry. A library kernel (Gluon attention) compiles
    longest (4.3 s on the H200's host, a block-language one 2-3 s): it goes first into the warm-up
    pool, not behind the others (benchmarks/ablations/first_call.py)."""
    entries, late = warm_entries(kernel, dtype_of)
    if shared:
        entries = [e for e in entries if e not in warm]
        late = [e for e in late if e not in later]
    later += late
    if kernel.shared and not late:
        warm[:0] = entries
    else:
        warm += entries


def warm_entry(kernel: str, launch: Launch, dtype_of: Callable[[int], str]) -> str:
    """The `_WARM` entry of `launch`: `(kernel, (torch.bfloat16, 64, ...), {'BLOCK_C': 64})`;
    `dtype_of(nid)` is the dtype text of node nid's tensor."""
    # a symbolic size compiles at its hint (Triton specialises on divisibility; a call of another
    # size that differs there compiles its own at launch)
    args = [dtype_of(a.nid) if isinstance(a, Buf) else str(a.dtype) if isinstance(a, Scratch)
            else _value_text(_at_hints(a)) for a in launch.args]
    kwargs = ", ".join(f"{k!r}: {_value_text(_at_hints(v))}" for k, v in launch.kwargs)
    return f"({launch.fn or kernel}, ({', '.join(args)}{',' if len(args) == 1 else ''}), {{{kwargs}}}),"

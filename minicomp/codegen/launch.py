"""Kernel launches in generated CUDA modules: Triton's path once, the compiled launcher after.

A launch through Triton (`kernel[grid](*args)`) binds every argument, computes
specialisation keys, looks the kernel up in its cache and, for autotuned kernels, builds a
tuning key: tens of microseconds of Python per launch, which is longer than a memory-bound
kernel over 128 MiB takes on an H200 (~70 us). Measured with `triton.testing.do_bench`
(which flushes L2 with a ~65 us kernel before each run) the GPU then sits waiting for the
host, and softmax over 16384x4096 timed 0.18 ms for a 0.07 ms kernel.

So a generated CUDA module launches through `_launch(kernel, grid, *args, **kwargs)`
(`LAUNCH_HELPER`, written into the module so that it still runs on its own). The first
launch of each kernel goes through Triton: autotuning, JIT compilation, caches. It returns
the compiled kernel, whose own launcher (`compiled[grid](*all_args)`) is then kept with
the arguments that never change in this module (sizes, block sizes, the autotuned
config) and the grid evaluated once. Later launches call it directly.

What keeps this exact:
- Every integer argument of a generated kernel is a literal of the module, and the
  autotuner's key is made of them, so the config and the compiled specialisation cannot
  change between calls. Pointer alignment can: Triton specialises on 16-byte alignment, so
  a call with a tensor that is not 16-byte aligned (a view at an odd offset) goes through
  Triton again, every time.
- The launch is on the current CUDA device, as Triton's own is; a call made with another
  current device goes through Triton.
- A Triton whose compiled-kernel launcher does not take the arguments this way raises
  TypeError before launching; the module then keeps to Triton's path for that kernel.
"""

from __future__ import annotations

import ast

LAUNCH_HELPER = '''\
_FAST = {}  # kernel -> (launcher, arguments after the positional ones, device), or False: Triton's path


def _aligned(args):
    return all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))


def _launch(kernel, grid, *args, **kwargs):
    """Launch `kernel` over `grid`: through Triton the first time, then straight through the
    compiled kernel's own launcher (see minicomp/codegen/launch.py)."""
    fast = _FAST.get(kernel)
    if fast and fast[2] == torch.cuda.current_device() and _aligned(args):
        try:
            fast[0](*args, *fast[1])
            return
        except TypeError:  # this Triton's launcher takes its arguments otherwise: keep to Triton's path
            _FAST[kernel] = False
    compiled = kernel[grid](*args, **kwargs)
    if fast is None and _aligned(args):
        _FAST[kernel] = _fast_launcher(kernel, compiled, grid, args, kwargs)


def _fast_launcher(kernel, compiled, grid, args, kwargs):
    """The compiled kernel's launcher for `grid`, with every argument after the positional ones."""
    try:
        named = dict(kwargs)
        config = getattr(kernel, "best_config", None)  # an autotuned kernel's chosen config
        if config is not None:
            named.update(config.kwargs)
        names = list(kernel.arg_names)
        tail = [named[n] for n in names[len(args):]]
        if callable(grid):
            grid = grid({**dict(zip(names, args)), **named})
        grid = tuple(grid) + (1,) * (3 - len(grid))
        return compiled[grid], tail, torch.cuda.current_device()
    except Exception:  # anything unexpected: Triton's path, as before
        return False'''


def via_launch_helper(lines: list[str], kernel_name: str) -> list[str]:
    """Rewrite each `kernel_name[grid](args)` launch line as `_launch(kernel_name, grid, args)`."""
    out = []
    for line in lines:
        stripped = line.strip()
        try:
            tree = ast.parse(stripped, mode="eval").body
        except SyntaxError:
            out.append(line)
            continue
        if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Subscript)
                and isinstance(tree.func.value, ast.Name) and tree.func.value.id == kernel_name):
            grid = ast.get_source_segment(stripped, tree.func.slice)
            rest = [ast.get_source_segment(stripped, a) for a in tree.args]
            rest += [f"{k.arg}={ast.get_source_segment(stripped, k.value)}" for k in tree.keywords]
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}_launch({', '.join([kernel_name, grid] + rest)})")
        else:
            out.append(line)
    return out

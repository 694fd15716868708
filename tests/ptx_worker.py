"""Compile a generated CUDA module's kernels for sm_90 and print each (kernel, config)'s PTX as
one JSON list (tests that read the instructions Triton chose). Run as a script, without
Triton's interpreter, as codegen/target_worker.py is; the module text comes on stdin."""

import json
import linecache
import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "minicomp", "codegen"))

import target_worker  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402


def main() -> None:
    source = sys.stdin.read()
    driver.set_active(target_worker.StubDriver(GPUTarget("cuda", 90, 32)))
    name = "<ptx-worker>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    module = types.ModuleType("ptx_worker_module")
    module.__file__ = name
    exec(compile(source, name, "exec"), module.__dict__)
    texts = []
    for kernel, args, kwargs in getattr(module, "_WARM", []):
        configs = getattr(kernel, "configs", None)
        fn = kernel.fn if configs else kernel
        for config in configs or [None]:
            full = {**kwargs, **(config.all_kwargs() if config else {})}
            texts.append(fn.warmup(*args, grid=(1,), **full).asm["ptx"])
    print(json.dumps(texts))


if __name__ == "__main__":
    main()

"""Codegen: a Plan's groups become one readable Triton module (`generate`).

`generate(graph, plan, device_type)` returns a `GeneratedModule` whose `.source` is the
module text (kernels + `call(*inputs)`), `.constants` and `.opaque` the values the
loader puts in its `CONSTANTS` and `OPAQUE` lists, `.kernel_names` the kernels in it.
"""

from minicomp.codegen.module import GeneratedModule, generate

__all__ = ["GeneratedModule", "generate"]

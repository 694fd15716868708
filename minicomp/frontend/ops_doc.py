"""docs/ops.md, generated from the op table: every aten overload minicomp lowers, and the ops.

    python -m minicomp.frontend.ops_doc          # rewrite docs/ops.md
    python -m minicomp.frontend.ops_doc --check  # exit 1 if docs/ops.md is stale

Rows come from `fx_ops.LOWERINGS` (built from `ops.ATEN`) and the op table itself, so the
page cannot list an overload minicomp does not lower or miss one it does;
`tests/test_ops_doc.py` fails when the committed page differs from `render()`, and
`tests/test_aten_lowerings.py` runs the test each row names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from minicomp.frontend import fx_ops
from minicomp.ir import ops

DOC = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
TEST = "tests/test_aten_lowerings.py::test_lowering"

# an op's kind -> the group its node ends up in (views and constants have no kernel of their own)
_GROUP_OF_KIND = {"pointwise": "pointwise", "reduction": "reduction", "scan": "reduction", "gemm": "gemm",
                  "attention": "attention", "view": "view", "constant": "none", "input": "none", "opaque": "none"}


def group_kind(name: str) -> str:
    """The kind of group the overload `name` lowers to (`pointwise`, ..., `view`, `none`)."""
    owner = ops.ATEN[name]
    if owner in ops.REGISTRY:
        return _GROUP_OF_KIND[ops.REGISTRY[owner].kind]
    return ops.COMPOSITES[owner].kind


# overloads capture sees only in some way, or not at all, for a reason other than decomposition
CAPTURE_NOTES = {
    "lift_fresh_copy.default": "with make_fx: a tensor made inside the function",
    "lift_fresh.default": "no: make_fx records lift_fresh_copy instead",
    "_fused_rms_norm.default": "on CUDA, where rms_norm calls it; decomposed first on CPU",
    "true_divide.Tensor": "in AOTAutograd's graphs (the backend): arithmetic on a float Dynamo passed as a tensor",
    "true_divide.Scalar": "in AOTAutograd's graphs (the backend); decomposed first in capture",
    "prims::convert_element_type.default": "in AOTAutograd's graphs (the backend): a decomposition's cast",
}


def captured(name: str) -> str:
    """Whether capture can see the overload: `yes`, or what it does instead. PyTorch decomposes
    CompositeImplicitAutograd overloads before any dispatch mode or make_fx records them."""
    if name in CAPTURE_NOTES:
        return CAPTURE_NOTES[name]
    target = fx_ops.resolve(name)
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        return "no: decomposed first"
    return "yes"


def _owner_order() -> list[str]:
    return list(ops.REGISTRY) + list(ops.COMPOSITES)


def _aten_rows() -> list[str]:
    lowered = {fx_ops.table_name(t): t for t in fx_ops.LOWERINGS}
    rank = {owner: i for i, owner in enumerate(_owner_order())}
    claims = list(ops.ATEN)
    names = sorted(lowered, key=lambda n: (rank[ops.ATEN[n]], claims.index(n)))
    rows = []
    for name in names:
        owner = ops.ATEN[name]
        what = f"`{owner}`" if owner in ops.REGISTRY else f"{owner} (composite)"
        seen = captured(name)
        target = str(lowered[name])
        kind = group_kind(name)
        if name in ops.RUNS_IN_PYTORCH:
            kind += f"; runs through PyTorch: {ops.RUNS_IN_PYTORCH[name]}"
        rows.append(f"| `{target}` | {what} | {kind} | {seen} | `{TEST}[{target}]` |")
    return rows


def _op_rows() -> list[str]:
    rows = []
    for name, d in ops.REGISTRY.items():
        attrs = ", ".join(d.attrs) or "-"
        written = "its Triton form" if d.emitter == "expr" else ops.EMITTERS[d.emitter]
        flops = "-" if d.kind not in ("pointwise", "reduction", "scan") else f"{d.flops_per_element:g}"
        rows.append(f"| `{name}` | {d.kind} | {d.arity if d.arity is not None else 'any'} | {attrs} | {flops} "
                    f"| {written} | {sum(1 for o in ops.ATEN.values() if o == name)} |")
    return rows


def _composite_rows() -> list[str]:
    return [f"| {c.name} | {c.kind} | {', '.join(f'`{o}`' for o in c.ops) or '-'} | {c.note} |"
            for c in ops.COMPOSITES.values()]


def render() -> str:
    """The text of docs/ops.md."""
    lowered = len(fx_ops.LOWERINGS)
    lines = [
        "# The ops minicomp lowers",
        "",
        "Generated from the op table (`minicomp/ir/ops/`) by `python -m minicomp.frontend.ops_doc`;",
        "`tests/test_ops_doc.py` fails when this page is stale. Do not edit it by hand.",
        "",
        f"## aten overloads ({lowered})",
        "",
        "What the torch.fx frontend turns into minicomp ops; any other aten call stays in the graph",
        "as an opaque node that PyTorch runs. *group kind* is the kernel the op's nodes are planned",
        "into (*view*: no kernel of its own, its readers' loads move through it; *none*: no node",
        "that computes). *captured* says whether capture can see the overload: PyTorch decomposes",
        "CompositeImplicitAutograd overloads before capture records anything, so their lowering",
        "only runs when a graph is built from them directly. Each row's test lowers an example",
        "call, compares the interpreter and the compiled kernels with eager PyTorch, checks the",
        "group kind, and checks what capture does with the overload.",
        "",
        "| aten overload | minicomp op | group kind | captured | test |",
        "|---|---|---|---|---|",
        *_aten_rows(),
        "",
        f"## minicomp ops ({len(ops.REGISTRY)})",
        "",
        "Each is one `OpDef` in a family file of `minicomp/ir/ops/`: its reference, shape rule,",
        "Triton and PyTorch forms and aten overloads are written there once.",
        "",
        "| op | kind | operands | attributes | flops / element | Triton code written by | aten overloads |",
        "|---|---|---|---|---|---|---|",
        *_op_rows(),
        "",
        f"## composites ({len(ops.COMPOSITES)})",
        "",
        "aten overloads that lower to several ops (`minicomp/ir/ops/composite.py`; the reductions'",
        "in `reductions.py`). A multi-output aten op (`max.dim`, `aminmax`, `var_mean`, `cummax`) is",
        "one single-output node per output over the same operand; the planner puts them in one row",
        "kernel, which computes what they share once (a max's value and index, a variance's mean).",
        "",
        "| composite | group kind | ops | note |",
        "|---|---|---|---|",
        *_composite_rows(),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/ops.md is stale; write nothing")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        stale = not DOC.exists() or DOC.read_text() != text
        if stale:
            print(f"{DOC} is stale: run python -m minicomp.frontend.ops_doc", file=sys.stderr)
        return int(stale)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

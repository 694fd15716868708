"""Indirect loads in kernels: `index` and `gather` (minicomp/ir/ops/indexing.py) read their source
at coordinates an index tensor holds.

`value(low, node, idx, cond)` moves the index the kernel asks of the node onto its source, as a
view would, except that the indexed coordinates are `Indirect` atoms (codegen/indexing.py):
the value of the index tensor at the element the output element came from. The source is then
evaluated at that index by the ordinary lowering, so it may be a tensor in memory, a view of
one or a pointwise value the kernel computes (only at the gathered positions). When the
loaded text of an address is rendered, `coordinate_name` loads the index (masked like the
load that uses it, so masked lanes read index 0) and wraps it as the op's mode says.

Which coordinates need which code (`coordinate`):
- an index whose static range (ir/ranges.py) lies in [0, n) and that is affine in the kernel's
  symbols (`arange` and views of it: position ids) is no load at all: `x[arange(s, e)]` is a
  strided read;
- a range in [0, n) otherwise: the loaded value as it is;
- `x[idx]` (mode "index") with negative values possible: `where(i < 0, i + n, i)`;
- take_along_dim (mode "modulo"): Python's `i mod n`;
- every other index is read from memory, and call() has checked it (codegen/index_check.py)
  before the kernel runs, so it lies in the valid range; one the kernel would compute without
  a known range cannot be here (the planner never groups it so: plan/rules.py), and raises
  `Unsupported` if a hand-made plan tries.
Invariant: no address a kernel forms from a loaded index lies outside its source tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen.common import Unsupported
from minicomp.ir.graph import Graph, Node
from minicomp.ir.ops.indexing import MODES
from minicomp.ir.ops.rules import broadcast
from minicomp.ir.ranges import memory_sources, value_range, within
from minicomp.codegen.tlexpr import Val

# `low` below is codegen/lowering.py's `Lowering` and `cond` its `Cond`; lowering.py imports
# this module, so they are not imported here (the codegen package has no import cycles)
Lowering = Any
Cond = Any

OPS = ("index", "gather")
INT32_ELEMENTS = 2**31 - 1


def handles(node: Node) -> bool:
    return node.op in OPS


def value(low: Lowering, node: Node, idx: ix.Index, cond: Cond) -> Val:
    """The node's value at `idx`: its source's value at the gathered index."""
    sidx = source_index(low.graph, low.computed, node, idx, cond)
    return low.value(node.args[0], sidx, cond)


def source_index(g: Graph, computed: set[int], node: Node, idx: ix.Index, cond: Cond = None) -> ix.Index:
    """The index into the node's source (its first operand) of output element `idx`, in a
    kernel that computes `computed` (the lines that load the indices are written later, when
    the address is rendered: `coordinate_name`)."""
    src = g.node(node.args[0])
    out = idx.to_dims()
    if node.op == "gather":
        dim = node.attrs["dim"]
        dims = list(out)
        dims[dim] = coordinate(g, computed, node.args[1], idx, src.shape[dim], node.attrs["mode"], cond)
        return ix.dims_index(src.shape, dims)
    dims, mode, idxs = tuple(node.attrs["dims"]), node.attrs["mode"], node.args[1:]
    bshape = broadcast(*(g.node(i).shape for i in idxs))
    nb = len(bshape)
    if dims == tuple(range(dims[0], dims[0] + len(dims))):       # adjacent: B in their place
        lead = dims[0]
        bcoords, others = out[lead:lead + nb], out[:lead] + out[lead + nb:]
    else:                                                       # apart: B first
        bcoords, others = out[:nb], out[nb:]
    bidx = ix.dims_index(bshape, bcoords)
    rest = iter(others)
    coords = []
    for d, size in enumerate(src.shape):
        if d in dims:
            i = idxs[dims.index(d)]
            coords.append(coordinate(g, computed, i, ix.broadcast(bidx, g.node(i).shape), size, mode, cond))
        else:
            coords.append(next(rest))
    return ix.dims_index(src.shape, coords)


def coordinate(g: Graph, computed: set[int], nid: int, at: ix.Index, size: int, mode: str,
               cond: Cond = None) -> ix.Expr:
    """The coordinate (in [0, size)) that index node `nid` gives at its element `at`."""
    negative = MODES[mode].negative
    r = value_range(g, nid)
    if within(r, (0, size - 1)):
        e = affine(g, computed, nid, at)
        if e is not None:
            return e
        wrap = "none"
    elif negative == "modulo":
        wrap = "modulo"
    elif negative == "wrap" and within(r, MODES[mode].bounds(size)):
        wrap = "wrap"
    elif memory_sources(g, nid, computed) is not None:
        wrap = "wrap" if negative == "wrap" else "none"     # checked by call() before the launch
    else:
        raise Unsupported(f"{g.node(nid).describe()}: an index computed in the kernel with no known range")
    atom = ix.Indirect(nid, tuple(at.shape), at.to_dims(), size, wrap, cond if cond is not None and cond.names else None)
    return ix.Expr(((atom, 1),), 0)


def affine(g: Graph, computed: set[int], nid: int, at: ix.Index) -> ix.Expr | None:
    """Node `nid` at `at` as an expression of the kernel's symbols, when it is one: an arange
    or a scalar constant, through views (position ids); None otherwise."""
    n = g.node(nid)
    if nid not in computed:
        v = n.attrs.get("value") if n.op == "constant" else None
        return ix.as_expr(int(v)) if isinstance(v, (bool, int)) else None
    a = n.attrs
    if n.op == "arange" and isinstance(a["start"], int) and isinstance(a["step"], int):
        return at.to_dims()[0] * a["step"] + a["start"]
    if n.op == "full" and not n.dtype.is_floating_point:
        return ix.as_expr(int(a["value"]))
    if n.op == "cast" and not g.node(n.args[0]).dtype.is_floating_point:
        return affine(g, computed, n.args[0], at)
    src = g.node(n.args[0]) if n.args else None
    if n.op == "reshape":
        return affine(g, computed, src.id, ix.reshape(at, src.shape))
    if n.op == "permute":
        return affine(g, computed, src.id, ix.permute(at, a["dims"], src.shape))
    if n.op == "expand":
        return affine(g, computed, src.id, ix.broadcast(at, src.shape))
    if n.op == "slice":
        dim = a["dim"] % len(src.shape)
        start, _, step = ix.slice_range(src.shape[dim], a["start"], a["end"], a["step"])
        return affine(g, computed, src.id, ix.slice_(at, src.shape, dim, start, step))
    return None


def coordinate_name(low: Lowering, atom: ix.Indirect, cond: Cond) -> tuple[str, frozenset]:
    """Write the lines that load (or compute) an indirect coordinate (under `cond`, the atom's
    condition); its variable and symbols."""
    g = low.graph
    node = g.node(atom.nid)
    v = low.value(atom.nid, ix.Index(atom.shape, dims=atom.dims), cond)
    s = ix.indirect_syms(atom)
    code = str(int(v.value)) if v.literal else v.code
    # an int32 index times a stride may pass 2**31 in a big source: compute addresses in int64
    if node.dtype != torch.int64 and _largest_read(low) > INT32_ELEMENTS:
        code = f"({code}).to(tl.int64)"
    missing = sorted(s - v.syms)
    if missing:
        # the index tensor is read at fewer places than the element (an expanded, stride-0 index):
        # a block of the element's shape all the same, so the loads through it are blocks too
        code = f"{code} + 0 * ({' + '.join(missing)})"
    if atom.wrap == "none" and code.isidentifier():
        return code, s
    name = low.names.fresh(f"i{atom.nid}")
    out = low.builder_for(s)
    if atom.wrap == "wrap":
        out.writeline(f"{name} = tl.where({code} < 0, {code} + {atom.size}, {code})  # negative indices count from the end")
    elif atom.wrap == "modulo":
        out.writeline(f"{name} = {code} % {atom.size}")
        out.writeline(f"{name} = tl.where({name} < 0, {name} + {atom.size}, {name})  # Python's modulo")
    else:
        out.writeline(f"{name} = {code}")
    return name, s


def _largest_read(low: Lowering) -> int:
    """Elements of the largest tensor the kernel reads so far (the source's pointer is named
    before its address is rendered): an offset into it fits int32 when this does."""
    return max([low.graph.node(p).numel for p in low.pointers] + [1])

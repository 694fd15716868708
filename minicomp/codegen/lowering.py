"""Lowering a group's nodes to Triton lines: values computed on demand at an index.

`Lowering.value(nid, index)` returns the `Val` of node `nid` at `index` (an `Index` into
the node's own shape), writing whatever lines it needs first. Views move the index
(no code); pointwise ops evaluate their operands at the broadcast index and write one
line (or a few, for a form that answers `Steps`); group inputs are loaded through their
strides. `flip` and `roll` move the index too (to `n - 1 - i`, `(i - shift) mod n`);
`cat` and `constant_pad` pick by a condition on it: a load under a condition is masked by
it, and the value outside is the other piece's (cat) or the pad value. Values are memoised per
(node, index, condition), so a tensor used twice at the same place is loaded once and
the same node read through a permute is loaded again at the permuted place.

Where a line goes depends on the index symbols it uses (`Lowering.builder_for`): the
reduction emitter hoists row-only lines out of its column loops. Each load is masked
by the mask that matches its symbols (`Lowering.mask_for`), and-ed with any `cat`
condition it sits under.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from minicomp.codegen import indexing as ix
from minicomp.codegen import view_index as vx
from minicomp.codegen import indirect
from minicomp.codegen.builder import CodeBuilder, NameScope
from minicomp.codegen.common import KernelCtx, Unsupported
from minicomp.codegen.names import safe_ident
from minicomp.codegen.sizes import OWN_NAMES, module_names
from minicomp.codegen.tlexpr import (Steps, Val, compute_tl, convert, op_text, py_literal, storage_tl, store_text,
                                     zero_literal)
from minicomp.ir.dims import py as size_text
from minicomp.ir.graph import Node

KERNEL_LOCALS = ("pid", "offs", "mask", "rows", "cols", "row_mask", "col_mask", "c0", "col_blocks",
                 "tl", "triton", "n_elements", "n_rows", "n_cols", "BLOCK", "BLOCK_R", "BLOCK_C")


@dataclass(frozen=True)
class Cond:
    """Extra conditions (names of boolean variables) a value is computed under (cat pieces)."""
    names: tuple[str, ...] = ()
    syms: frozenset = frozenset()

    def add(self, name: str, syms: frozenset) -> "Cond":
        return Cond(self.names + (name,), self.syms | syms)


@dataclass
class Pointer:
    nid: int
    name: str        # kernel parameter: "x_ptr", "buf7_ptr"


def ident(text: str) -> str:
    """A safe identifier from a user's name (codegen/names.py: never a keyword, builtin or one
    of minicomp's own names)."""
    return safe_ident(text)


def user_label(node: Node) -> str | None:
    """The name the user knows a leaf by: an input's name, a weight's label; None otherwise."""
    if node.op == "input":
        return node.attrs["name"]
    if node.op == "constant" and node.attrs.get("label"):
        return node.attrs["label"]
    return None


class Lowering:
    def __init__(self, ctx: KernelCtx, builder_for: Callable[[frozenset], CodeBuilder],
                 mask_for: Callable[[frozenset], str | None]):
        self.ctx = ctx
        self.cpu = ctx.device_type == "cpu"
        self.graph = ctx.graph
        # what the group computes; a node it also lists as an input is read from memory instead
        self.computed = {n for n in ctx.group.nodes
                         if self.graph.node(n).kind not in ("input", "constant") and n not in ctx.group.inputs}
        self.builder_for = builder_for
        self.mask_for = mask_for
        self.names = NameScope()
        for local in KERNEL_LOCALS + tuple(module_names(self.graph)):   # and the size arguments
            self.names.fresh(local)
        self.pointers: dict[int, Pointer] = {}
        self.memo: dict[tuple, Val] = {}
        self.atoms: dict[ix.Atom, tuple[str, frozenset]] = {}
        self.reduction_value: Callable[[Node, ix.Index], Val] | None = None
        self.offsets: list[ix.Expr] = []     # every tensor load's and store's offset, for choosing tile shapes

    # ------------------------------------------------------------------ scoping
    def forget(self, sym: str) -> None:
        """Drop memoised values and index names that use `sym` (a new loop redefines it)."""
        self.memo = {k: v for k, v in self.memo.items() if sym not in v.syms}
        self.atoms = {a: v for a, v in self.atoms.items() if sym not in v[1]}

    # ------------------------------------------------------------------ pointers and indices
    def pointer(self, nid: int) -> str:
        if nid not in self.pointers:
            node = self.graph.node(nid)
            label = user_label(node)
            base = ident(label) if label is not None else f"buf{nid}"
            self.pointers[nid] = Pointer(nid, self.names.fresh(f"{base}_ptr"))
        return self.pointers[nid].name

    def render(self, e: ix.Expr) -> str:
        return ix.render(e, self._atom_name)

    def _atom_name(self, atom) -> str:
        if atom not in self.atoms and isinstance(atom, ix.Indirect):
            self.atoms[atom] = indirect.coordinate_name(self, atom, atom.cond or Cond())   # loads the index
        if atom not in self.atoms:
            text = ix.render_atom(atom, self._atom_name)
            s = ix.syms(atom.arg)
            # index variables say which loop symbols they use: idx (offs), r_idx, c_idx, rc_idx
            prefix = "".join(sorted(n[0] for n in s if n != "offs"))
            name = self.names.fresh(f"{prefix}_idx" if prefix else "idx")
            self.builder_for(s).writeline(f"{name} = {text}")
            self.atoms[atom] = (name, s)
        return self.atoms[atom][0]

    def full_mask(self, syms: frozenset, cond: Cond) -> str | None:
        parts = [m for m in [self.mask_for(syms)] if m] + list(cond.names)
        return " & ".join(parts) if parts else None

    # ------------------------------------------------------------------ values
    def emit(self, base: str, text: str, dtype: torch.dtype, syms: frozenset, exact: bool = False) -> Val:
        name = self.names.fresh(base)
        self.builder_for(syms).writeline(f"{name} = {text}")
        return Val(name, dtype, syms, exact=exact)

    def value(self, nid: int, idx: ix.Index, cond: Cond = Cond()) -> Val:
        key = (nid, idx.key(), cond.names)
        if key not in self.memo:
            node = self.graph.node(nid)
            if nid in self.computed:
                self.memo[key] = self._compute(node, idx, cond)
            else:
                self.memo[key] = self.load(node, idx, cond)
        return self.memo[key]

    def load(self, node: Node, idx: ix.Index, cond: Cond) -> Val:
        if node.op == "constant" and not isinstance(node.attrs["value"], torch.Tensor):
            v = node.attrs["value"]
            return Val(py_literal(v, node.dtype), node.dtype, frozenset(), literal=True, value=v)
        ptr = self.pointer(node.id)
        off = ix.offset(idx, self.ctx.strides(node.id))
        self.offsets.append(off)
        s = ix.syms(off)
        if not s:
            addr = ptr if off.is_const() and off.const == 0 else f"{ptr} + {self.render(off)}"
            # one element for every lane. Triton's interpreter stores a 0-d comparison's result as
            # floats, and `&` of it with a block then fails (`(e > 1.0) & (offs < n)`): under the
            # interpreter the element is loaded as a one-element block instead (the GPU text is 0-d)
            text = f"tl.load({addr} + tl.zeros([1], tl.int32))" if self.cpu else f"tl.load({addr})"
        else:
            addr = f"{ptr} + {self.render(off)}"
            mask = self.full_mask(s, cond)
            # every index in range (no symbol of the offset needs a bound here): an unmasked load,
            # since Triton's compiler refuses `other=` without `mask=` (its interpreter does not)
            text = (f"tl.load({addr}, mask={mask}, other={zero_literal(node.dtype)})" if mask
                    else f"tl.load({addr})")
        if compute_tl(node.dtype) != storage_tl(node.dtype):
            text += f".to({compute_tl(node.dtype)})"
        label = user_label(node)
        base = ident(label) if label is not None else f"ld{node.id}"
        return self.emit(base, text, node.dtype, s | cond.syms, exact=True)

    def _compute(self, node: Node, idx: ix.Index, cond: Cond) -> Val:
        op, a = node.op, node.attrs
        kind = node.kind
        if kind == "view":
            return self._view(node, idx, cond)
        if indirect.handles(node):
            return indirect.value(self, node, idx, cond)
        if kind in ("reduction", "scan"):   # the row kernel computes both (codegen/reduction.py)
            if self.reduction_value is None:
                raise Unsupported(f"reduction {node.describe()} inside a pointwise kernel")
            return self.reduction_value(node, idx)
        if kind != "pointwise":
            raise Unsupported(f"{kind} node {node.describe()} in a {self.ctx.group.kind} kernel")
        if op == "full":
            return Val(py_literal(a["value"], node.dtype), node.dtype, frozenset(), literal=True, value=a["value"])
        if op == "size_value":      # the kernel takes the symbols as arguments (sizes.used_symbols)
            return self.emit(f"size{node.id}", f"tl.full([1], {size_text(a['value'], OWN_NAMES)}, tl.int64)",
                             node.dtype, frozenset())
        if op == "arange":
            i = idx.to_dims()[0]
            s = ix.syms(i)
            if i.is_const():
                # one element (or a broadcast index fixed at one position): a literal, since
                # Triton's compiler has no `.to` on a Python int (the interpreter does not mind)
                value = a["start"] + a["step"] * i.const
                value = float(value) if node.dtype.is_floating_point else int(value)
                return Val(py_literal(value, node.dtype), node.dtype, frozenset(), literal=True, value=value)
            if node.dtype.is_floating_point:
                text = f"{py_literal(a['start'], node.dtype)} + {py_literal(a['step'], node.dtype)} * ({self.render(i)}).to({compute_tl(node.dtype)})"
            else:
                text = f"({a['start']} + {a['step']} * ({self.render(i)})).to({compute_tl(node.dtype)})"
            return self.emit(f"arange{node.id}", text, node.dtype, s)
        if op in ("tril", "triu"):
            dims = idx.to_dims()
            x = self.value(node.args[0], idx, cond)
            r, c = self.render(dims[-2]), self.render(dims[-1])
            keep = f"({c}) - ({r}) {'<=' if op == 'tril' else '>='} {int(a['diagonal'])}"
            s = ix.syms(dims[-2]) | ix.syms(dims[-1]) | x.syms
            text = f"tl.where({keep}, {convert(x, node.dtype)}, {zero_literal(node.dtype)})"
            return self.emit(f"{op}{node.id}", text, node.dtype, s)
        args = [self.value(arg, ix.broadcast(idx, self.graph.node(arg).shape), cond) for arg in node.args]
        s = frozenset().union(*(v.syms for v in args)) if args else frozenset()
        text = op_text(node, args, self.cpu, [len(self.graph.node(a).shape) for a in node.args])
        if isinstance(text, Steps):
            text = self._steps(node, text, s)
        if op == "cast" and text == args[0].code:
            # a widening that changes nothing inside the kernel (bf16 -> f32 is already f32 here)
            return Val(text, node.dtype, s, exact=args[0].exact)
        return self.emit(f"{op}{node.id}", text, node.dtype, s, exact=(op == "cast"))

    def _steps(self, node: Node, steps: Steps, syms: frozenset) -> str:
        """Write a form's steps as lines of their own (fresh names for its `$name`s); its value's text."""
        names: dict[str, str] = {}

        def sub(text: str) -> str:
            return re.sub(r"\$([a-z][a-z0-9_]*)", lambda m: names[m.group(1)], text)

        for name, expr in steps.lines:
            fresh = self.names.fresh(f"{node.op}{node.id}_{name}")
            self.builder_for(syms).writeline(f"{fresh} = {sub(expr)}")
            names[name] = fresh
        return sub(steps.value)

    def _view(self, node: Node, idx: ix.Index, cond: Cond) -> Val:
        op, a = node.op, node.attrs
        src = self.graph.node(node.args[0])
        if op == "reshape":
            return self.value(src.id, ix.reshape(idx, src.shape), cond)
        if op == "permute":
            return self.value(src.id, ix.permute(idx, a["dims"], src.shape), cond)
        if op == "expand":
            return self.value(src.id, ix.broadcast(idx, src.shape), cond)
        if op == "slice":
            dim = a["dim"] % len(src.shape)
            start, _, step = ix.slice_range(src.shape[dim], a["start"], a["end"], a["step"])
            return self.value(src.id, ix.slice_(idx, src.shape, dim, start, step), cond)
        if op == "cat":
            return self._cat(node, idx, cond)
        if op == "flip":
            return self.value(src.id, vx.flip(idx, src.shape, a["dims"]), cond)
        if op == "roll":
            return self.value(src.id, vx.roll(idx, src.shape, a["shifts"], a["dims"]), cond)
        if op == "constant_pad":
            return self._pad(node, idx, cond)
        raise Unsupported(f"view {op!r} ({node.describe()})")

    def _pad(self, node: Node, idx: ix.Index, cond: Cond) -> Val:
        """constant_pad: the operand where the index falls inside it, the pad value elsewhere."""
        src = self.graph.node(node.args[0])
        value = Val(py_literal(node.attrs["value"], node.dtype), node.dtype, frozenset(), literal=True,
                    value=node.attrs["value"])
        sidx, tests = vx.pad_source(idx, src.shape, node.attrs["pad"])
        if sidx is None:                           # this index is padding whatever the kernel's symbols
            return value
        if not tests:                              # negative pads only: a crop, every index inside
            return self.value(src.id, sidx, cond)
        s_in = frozenset().union(*(ix.syms(e) for e, _, _ in tests))
        inside = self.names.fresh(f"in_pad{node.id}")
        text = " & ".join(f"({self.render(e)} {rel} {bound})" for e, rel, bound in tests)
        self.builder_for(s_in).writeline(f"{inside} = {text}")
        v = self.value(src.id, sidx, cond.add(inside, s_in))
        text = f"tl.where({inside}, {convert(v, node.dtype)}, {convert(value, node.dtype)})"
        return self.emit(f"pad{node.id}", text, node.dtype, v.syms | s_in)

    def _cat(self, node: Node, idx: ix.Index, cond: Cond) -> Val:
        shapes = [self.graph.node(x).shape for x in node.args]
        pieces = vx.cat_pieces(idx, shapes, node.attrs["dim"])
        along = idx.to_dims()[node.attrs["dim"] % len(idx.shape)]
        s_along = ix.syms(along)
        pos = self.render(along)
        vals, conds = [], []
        last = len(pieces) - 1
        for k, (pidx, lo, hi) in enumerate(pieces):
            if hi == lo:
                continue
            tests = ([f"({pos} >= {lo})"] if k > 0 else []) + ([f"({pos} < {hi})"] if k < last else [])
            if tests:
                name = self.names.fresh(f"in_cat{node.id}_{k}")
                self.builder_for(s_along).writeline(f"{name} = {' & '.join(tests)}")
                conds.append(name)
                vals.append(self.value(node.args[k], pidx, cond.add(name, s_along)))
            else:
                conds.append(None)
                vals.append(self.value(node.args[k], pidx, cond))
        text = convert(vals[-1], node.dtype)
        for c, v in reversed(list(zip(conds[:-1], vals[:-1]))):
            text = f"tl.where({c}, {convert(v, node.dtype)}, {text})"
        s = frozenset().union(*(v.syms for v in vals)) | s_along
        return self.emit(f"cat{node.id}", text, node.dtype, s)

    # ------------------------------------------------------------------ stores
    def store(self, nid: int, idx: ix.Index, block_shape: str) -> None:
        """Store node `nid`'s value at `idx` into its output buffer (rounded to its dtype)."""
        node = self.graph.node(nid)
        v = self.value(nid, idx)
        ptr = self.pointer(nid)
        off = ix.offset(idx, self.ctx.strides(nid))
        self.offsets.append(off)
        s = ix.syms(off)
        if v.literal:
            text = f"tl.full({block_shape}, {py_literal(v.value, node.dtype)}, {storage_tl(node.dtype)})"
        else:
            text = store_text(convert(v, node.dtype), node.dtype, self.cpu, exact=v.exact and v.dtype == node.dtype)
        addr = f"{ptr} + {self.render(off)}"
        if not s and v.syms:
            # one element (every dimension of size 1) computed as a block, e.g. from a row
            # reduction: a block of one address, so the store's pointer and value agree
            s = v.syms
            addr += f" + tl.zeros({block_shape}, tl.int32)"
        mask = self.mask_for(s)
        self.builder_for(s).writeline(f"tl.store({addr}, {text}" + (f", mask={mask})" if mask else ")"))

"""Buffer reuse in a generated module's run(): a kernel's output takes the memory of a buffer no
later line reads, instead of a new allocation.

Every kernel output was `_empty(shape, strides, dtype)` at its launch: BERT-base allocated 110
buffers a call, about 2.7 us of host time each on the H100 machines (PyTorch's caching allocator
through `_empty_strided_cuda`, session 23's profile), in a call the host bounds; a model's
layers repeat the same shapes, so most of those allocations can reuse a buffer whose last
reader has already been launched.

The module writer tells a `BufferPlan`, in launch order, what each launch (a position: the order
index of its first group) reads, which of its lines allocate an output, and which groups may
return views of what they read (anything but a Triton kernel: a view group, a library call, a
PyTorch fallback). `lines()` then says which allocation lines to rewrite as `bufN = bufM`.

Invariants (what makes a reuse safe):
- a buffer's life ends at the last launch that reads it or any tensor that may alias it
  (a view group's output, a fallback's, a library call's; their own readers, transitively);
  a graph output and everything that may alias it live past the call;
- an allocation at position p reuses only a buffer whose life ended before p, so no launch both
  reads the old value and writes the new one, and the launches of one position (a combo kernel's
  groups) never share memory;
- only memory this module allocated with `_empty` is reused, and only for an allocation of the
  same shape, strides and dtype (as written: symbolic sizes compare as their text);
- launches run in the order written, on one stream, so the next writer of reused memory runs
  after its last reader (as the caching allocator's own reuse of freed blocks assumes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FOREVER = float("inf")


@dataclass
class _Storage:
    name: str          # the variable that holds it (the first buffer allocated there)
    end: float         # the last position at which something reads it


@dataclass
class BufferPlan:
    reads: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    aliases: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    allocs: list[tuple[int, int, str, str, tuple]] = field(default_factory=list)   # (pos, nid, name, line, key)

    def read(self, pos: int, nids) -> None:
        """The launch at `pos` reads tensors `nids` (its groups' inputs)."""
        self.reads.append((pos, tuple(nids)))

    def may_alias(self, pos: int, inputs, outputs) -> None:
        """A group at `pos` that is not a kernel of ours: its outputs may be views of its inputs."""
        self.aliases.append((pos, tuple(inputs), tuple(outputs)))

    def alloc(self, pos: int, nid: int, name: str, line: str, key: tuple) -> None:
        """Line `line` (unique in the module) allocates `name`, node `nid`'s buffer, at `pos`;
        `key` is its (shape, strides, dtype) as written."""
        self.allocs.append((pos, nid, name, line, key))

    def lines(self, kept: set[int]) -> dict[str, str]:
        """Allocation line -> its replacement (both without indentation), for each allocation
        that reuses a dead buffer; `kept` holds the nodes whose tensors outlive the call (the
        graph's outputs)."""
        end: dict[int, float] = {n: FOREVER for n in kept}
        for pos, nids in self.reads:
            for n in nids:
                end[n] = max(end.get(n, pos), pos)
        for pos, inputs, outputs in reversed(self.aliases):    # an alias's readers keep what it views alive
            last = max((end.get(o, pos) for o in outputs), default=pos)
            for i in inputs:
                end[i] = max(end.get(i, pos), last)
        pool: dict[tuple, list[_Storage]] = {}
        out: dict[str, str] = {}
        for pos, nid, name, line, key in self.allocs:
            life = end.get(nid, pos)
            free = next((s for s in pool.get(key, ()) if s.end < pos), None)
            if free is None:
                pool.setdefault(key, []).append(_Storage(name, life))
                continue
            free.end = life
            out[line.strip()] = f"{name} = {free.name}  # reuses {free.name}'s memory: nothing reads it after this (codegen/buffers.py)"
        return out

    def apply(self, text: str, kept: set[int]) -> str:
        """`text` (run()'s body) with the reusing allocations rewritten."""
        swap = self.lines(kept)
        if not swap:
            return text
        out = []
        for line in text.split("\n"):
            new = swap.get(line.strip())
            out.append(line if new is None else line[:len(line) - len(line.lstrip())] + new)
        return "\n".join(out)

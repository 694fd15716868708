"""Output rows that start off 16-byte boundaries: the persistent GEMM's tiles over classes of rows.

An lm_head writes [M, 50257] logits: row r starts r * 50257 elements into the buffer, so in bf16
its first element lies (r mod 8) * 2 bytes past a 16-byte boundary. A tile of consecutive rows
holds eight different misalignments, and Triton stores it one element at a time (128
`st.global.b16` a thread at 128 x 256, against 16 `st.global.v4` when rows are aligned): on the
H100 GPT-2's lm_head took 337-360 us a call where torch.compile's took less (session 19/21 notes).

Rows r and r + P start equally misaligned, where P * N is the first multiple of E (E elements
make 16 bytes of the output's dtype): P = E / gcd(N mod E, E). So this form gives each tile the
rows of one class j: j, j + P, j + 2P... (its A rows through a descriptor of its own, rows P * ld
apart), and moves the tile's columns left by the class's misalignment s_j = (j * N) mod E:

    element (j + P * q, c) lies at  (j * N - s_j) + q * (P * N) + (c + s_j)

The first term is a multiple of E (a scalar the kernel tells Triton so, `tl.multiple_of`), the
second too, and a tile whose columns start at c = pid_n * BLOCK_N - s_j puts c + s_j at multiples
of BLOCK_N: every 16-byte chunk of the tile's row lands on a 16-byte boundary, and the store is
vectorised. A tile inside the row (no column before 0 or past N) stores with the row mask alone,
which is constant along a row, so Triton keeps the vector; the first and last column tiles of a
class keep the full mask and store element by element.

B's tile for columns from pid_n * BLOCK_N - s_j is a descriptor load at that row of nn.Linear's
[N, K] weight (a row coordinate, which TMA takes at any value; rows before 0 read as zeros and
only feed masked columns). So the form needs A row-major and every B stored [N, K], neither
padded, and a store of the output's elements at offset rm * N + rn (other outputs keep the
general store, which is exact under the new tile coordinates too).

A class's rows are tiled on their own, so M rows cost P * cdiv(cdiv(M, P), BLOCK_M) row tiles
instead of cdiv(M, BLOCK_M): each row tile reads all of B again. The form is taken only where
that costs at most `MAX_EXTRA_READS` more reads of B at 128-row tiles (an lm_head at prefill,
M = 2048: none; at decode, M = 16: eight times, so not there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minicomp.codegen import indexing as ix
from minicomp.codegen.builder import CodeBuilder
from minicomp.ir import dims

MAX_EXTRA_READS = 1.25
LOCALS = ("cls", "qb", "shift", "offs_q", "row0", "inner")


@dataclass(frozen=True)
class RowClasses:
    period: int              # P: rows r and r + P start equally far from a 16-byte boundary
    per: int                 # E: elements in 16 bytes of the stored outputs
    n: int
    outs: frozenset[int]     # outputs stored through the aligned vector form

    def write_descriptors(self, body: CodeBuilder, ptr: str, ld: int) -> None:
        """`a_desc{j}` for each class j: A's rows j, j + P... as a matrix of its own."""
        p = self.period
        body.writeline(f"# A's rows by class of misalignment of the output's rows (period {p}): class j")
        body.writeline(f"# reads rows j, j + {p}, j + {2 * p}...")
        for j in range(p):
            base = f"{ptr} + {j * ld}" if j else ptr
            count = f"(M + {p - 1 - j}) // {p}" if j < p - 1 else f"M // {p}"    # rows j + p * q < M
            body.writeline(f"a_desc{j} = tl.make_tensor_descriptor({base}, shape=[{count}, K], "
                           f"strides=[{p * ld}, 1], block_shape=[BLOCK_M, BLOCK_K])")

    def tile_counts(self) -> list[str]:
        """num_pid_m and num_pid_n: each class's row tiles; columns from -s_j (s_j < E)."""
        p = self.period
        return [f"num_pid_m = {p} * tl.cdiv(tl.cdiv(M, {p}), BLOCK_M)",
                f"num_pid_n = tl.cdiv(N + {self.per - 1}, BLOCK_N)"]

    def write_coords(self, body: CodeBuilder, w: str) -> None:
        """offs_m, offs_n (and the class's cls, qb, shift, offs_q) of row tile pid_m, column tile pid_n."""
        p = self.period
        body.writeline(f"qb = pid_m % tl.cdiv(tl.cdiv(M, {p}), BLOCK_M)")
        body.writeline(f"cls = pid_m // tl.cdiv(tl.cdiv(M, {p}), BLOCK_M)")
        body.writeline(f"shift = (cls * N) % {self.per}  # how far the class's rows start past 16 bytes")
        body.writeline(f"offs_q = (qb * BLOCK_M + tl.arange(0, BLOCK_M)){w}")
        body.writeline(f"offs_m = cls + {p} * offs_q")
        body.writeline(f"offs_n = (pid_n * BLOCK_N - shift + tl.arange(0, BLOCK_N)){w}")

    def write_select(self, body: CodeBuilder) -> None:
        body.writeline("a_desc = a_desc0")
        for j in range(1, self.period):
            with body.block(f"if cls == {j}:"):
                body.writeline(f"a_desc = a_desc{j}")

    def write_store(self, body: CodeBuilder, ptr: str, value: str) -> None:
        """The output's tile at aligned addresses: vector stores inside the row, masked at its ends."""
        p, n = self.period, self.n
        body.writeline(f"row0 = tl.multiple_of(cls * {n} - shift, {self.per})  # 16-byte aligned")
        body.writeline(f"inner = (pid_n * BLOCK_N >= shift) & (pid_n * BLOCK_N - shift + BLOCK_N <= {n})")
        ptrs = f"{ptr} + row0 + offs_q[:, None] * {p * n} + (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]"
        with body.block("if inner:"):
            body.writeline(f"tl.store({ptrs}, {value}, mask=mask_m[:, None])")
        with body.block("else:"):
            body.writeline(f"tl.store({ptrs}, {value}, mask=mask_m[:, None] & mask_n[None, :])")


def row_classes(graph, spec, tma, offsets: dict[int, ix.Expr]) -> RowClasses | None:
    """The form for a TMA GEMM (`tma`: its operands' descriptors) whose outputs' rows are not
    16-byte aligned, or None where it does not apply (module docstring). `offsets`: each
    output's element offset in the epilogue's index (symbols rm, rn)."""
    if tma is None or spec.batch or dims.any_symbolic((spec.m, spec.n, spec.k)):
        return None
    a, bs = tma
    if a.transposed or a.pad or not all(b.transposed and not b.pad for b in bs):
        return None
    aligned = {}
    for out, off in offsets.items():
        size = graph.node(out).dtype.itemsize
        if (spec.n * size) % 16 and 16 % size == 0 and _plain(off, spec.n):
            aligned.setdefault(16 // size, set()).add(out)
    if not aligned:
        return None
    per, outs = max(aligned.items(), key=lambda kv: len(kv[1]))
    period = per // math.gcd(spec.n % per, per)
    reads = period * -(-(-(-spec.m // period)) // 128)
    if reads > MAX_EXTRA_READS * -(-spec.m // 128):
        return None
    return RowClasses(period, per, spec.n, frozenset(outs))


def _plain(off: ix.Expr, n: int) -> bool:
    """The offset is rm * n + rn: row-major rows of n elements."""
    terms = {(a.name, k) for a, k in off.terms if isinstance(a, ix.Sym)}
    return off.const == 0 and len(off.terms) == 2 and terms == {("rm", n), ("rn", 1)}

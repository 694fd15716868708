"""Each kernel's Triton source beside the user's source lines that it computes.

`kernel_sources(generated)` is the one place that finds a kernel's text in a generated
module; `user_lines(graph, group)` reads, with `linecache`, the lines named by the
`origin` ("file:line" or "file:line:col") of the group's nodes, in file order, each with
the nodes it produced. A file that cannot be read (moved, or a DSL text given as a string)
gives an explicit "source not available" row, never a guess.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field

from minicomp.ir.graph import Graph
from minicomp.plan.records import Group


def kernel_sources(generated) -> dict[str, str]:
    """Kernel name -> its Triton source, from the module's per-kernel records."""
    return {k.name: k.source.rstrip("\n") for k in generated.kernels}


@dataclass
class SourceLine:
    file: str
    line: int
    text: str | None                         # None: the file could not be read
    nodes: list[str] = field(default_factory=list)   # "%7 mul" for each node from this line


def parse_origin(origin: str | None) -> tuple[str, int] | None:
    """"model.py:12" or "prog.mc:3:7" -> (file, line); None when it names no line."""
    if not origin:
        return None
    parts = origin.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1])
    head, _, tail = origin.rpartition(":")
    if head and tail.isdigit():
        return head, int(tail)
    return None


def user_lines(graph: Graph, group: Group) -> list[SourceLine]:
    """The user's lines that group `group` computes, in file order (files in order of first use)."""
    by_line: dict[tuple[str, int], SourceLine] = {}
    files: list[str] = []
    for nid in group.nodes:
        n = graph.node(nid)
        where = parse_origin(n.origin)
        if where is None:
            continue
        if where[0] not in files:
            files.append(where[0])
        if where not in by_line:
            text = linecache.getline(*where)
            by_line[where] = SourceLine(where[0], where[1], text.rstrip("\n") if text else None)
        by_line[where].nodes.append(f"%{nid} {n.op}")
    return sorted(by_line.values(), key=lambda s: (files.index(s.file), s.line))


def unplaced_nodes(graph: Graph, group: Group) -> list[str]:
    """Nodes of `group` whose origin names no line (made by a pass, or a frontend without one)."""
    return [f"%{nid} {graph.node(nid).op}" for nid in group.nodes if parse_origin(graph.node(nid).origin) is None]

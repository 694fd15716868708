"""The IR: a typed operator graph on networkx, its op registry, verifier, dumps and interpreter."""

from minicomp.ir.graph import Graph, Node, infer
from minicomp.ir.interpret import run
from minicomp.ir.ops import REGISTRY, OpDef
from minicomp.ir.printer import dump, to_dot
from minicomp.ir.verify import verify

__all__ = ["Graph", "Node", "OpDef", "REGISTRY", "dump", "infer", "run", "to_dot", "verify"]

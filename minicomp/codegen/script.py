"""The script entry of a generated module: `python mod.py [inputs.pt [outputs.pt]]`.

It reads the module's constants from `<module>.constants.pt` beside it, after checking
that the file is the one written with this very module (the module's name ends in the
first DIGEST_CHARS hex digits of sha256(module source + constants)), runs `call()` on the
given inputs or on seeded random ones, and prints the output shapes.
"""

from __future__ import annotations

import torch

from minicomp.codegen.builder import CodeBuilder
from minicomp.ir import dims
from minicomp.ir.graph import Graph, Node

DIGEST_CHARS = 16


def script_block(g: Graph, constants: bool, opaque: int) -> str:
    """The module's `if __name__ == "__main__":` block (see the module docstring): `constants`
    says whether the module has any, `opaque` how many callables it cannot write as text."""
    b = CodeBuilder()
    with b.block('if __name__ == "__main__":'):
        b.writeline('_device = torch.device("cuda" if DEVICE_TYPE == "cuda" else "cpu")')
        if constants:
            with b.block("with open(__file__, 'rb') as _f, open(__file__[:-3] + '.constants.pt', 'rb') as _c:"):
                b.writeline("_source, _blob = _f.read(), _c.read()")
            b.writeline("import hashlib, io")
            with b.block("if hashlib.sha256(_source + _blob).hexdigest()[:%d] != os.path.basename(__file__)[-%d:-3]:"
                         % (DIGEST_CHARS, DIGEST_CHARS + 3)):
                b.writeline('sys.exit("these constants were not written with this module (digest mismatch)")')
            b.writeline("CONSTANTS[:] = [t.to(_device) for t in torch.load(io.BytesIO(_blob), weights_only=True)]")
        if opaque:
            b.writeline(f'sys.exit("this module calls {opaque} PyTorch function(s) that have no text form; '
                        'run it through minicomp")')
        with b.block("if len(sys.argv) > 1:"):
            b.writeline("_inputs = [t.to(_device) for t in torch.load(sys.argv[1])]")
        with b.block("else:"):
            b.writeline("_gen = torch.Generator().manual_seed(0)")
            b.writeline("_inputs = [")
            with b.indent():
                for nid in g.inputs:
                    b.writeline(f"{_random_text(g.node(nid))}.to(_device),")
            b.writeline("]")
        b.writeline("_outputs = call(*_inputs)")
        with b.block("for _i, _t in enumerate(_outputs):"):
            b.writeline('print(f"output {_i}: {tuple(_t.shape)} {_t.dtype}")')
        with b.block("if len(sys.argv) > 2:"):
            b.writeline("torch.save([t.cpu() for t in _outputs], sys.argv[2])")
    return b.getvalue()


def _random_text(n: Node) -> str:
    # a module over symbolic sizes runs its script with each symbol small (at most 16, in range)
    env = {s.name: max(s.lo, min(s.hint, 16)) for s in dims.symbols(*n.shape)}
    shape = tuple(dims.evaluate(d, env) for d in n.shape)
    if n.dtype.is_floating_point:
        return f"torch.randn({shape!r}, generator=_gen).to({n.dtype})"
    if n.dtype == torch.bool:
        return f"(torch.rand({shape!r}, generator=_gen) > 0.5)"
    return f"torch.randint(-8, 8, {shape!r}, generator=_gen).to({n.dtype})"

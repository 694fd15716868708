"""The generated module as data: its text, its constants and callables, and what codegen
decided for each group (which kernel computes it, which run through PyTorch and why).

`GeneratedModule.write` puts it on disk under a digest of its text and constants, so a module
run as a script checks that the constants it loads are the ones written with it."""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from minicomp.codegen.common import Kernel
from minicomp.codegen.lowering import ident
from minicomp.codegen.script import DIGEST_CHARS
from minicomp.target import Target


@dataclass
class GeneratedModule:
    source: str                                  # the whole module text
    constants: list[torch.Tensor]                # CONSTANTS, in order (kernel layout; on the device they were captured on, no host round trip)
    opaque: list[Callable]                       # OPAQUE, in order
    kernel_names: list[str]
    graph_name: str = "main"
    device_type: str = "cpu"
    fallbacks: dict[int, str] = field(default_factory=dict)   # group id -> why it runs through PyTorch
    library: dict[int, str] = field(default_factory=dict)     # group id -> why it calls cuBLAS (codegen/library.py)
    kernel_groups: dict[str, int] = field(default_factory=dict)  # kernel name -> the first plan group it computes
    kernel_users: dict[str, list[int]] = field(default_factory=dict)  # kernel name -> every group launching it (codegen/dedup.py)
    kernels: list[Kernel] = field(default_factory=list)          # each kernel's record: name, source, launches
    target: Target | None = None                 # what the kernels were written for
    input_specs: list[tuple[str, tuple[int, ...], torch.dtype]] = field(default_factory=list)  # name, shape, dtype

    def write(self, directory: str | os.PathLike, name: str | None = None) -> Path:
        """Write the module as `<name>_<digest>.py` (and its tensor constants beside it as
        `<name>_<digest>.constants.pt`); returns the module's path. The digest is the sha256 of
        the module's text and its constants' bytes, so two modules emitted into one directory
        never share a file, and the module, run as a script, checks that the constants it loads
        are the ones written with it."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        blob = b""
        if self.constants:
            buffer = io.BytesIO()
            torch.save([c.detach().cpu() for c in self.constants], buffer)
            blob = buffer.getvalue()
        digest = hashlib.sha256(self.source.encode() + blob).hexdigest()[:DIGEST_CHARS]
        stem = f"{ident(name or self.graph_name)}_{digest}"
        path = d / f"{stem}.py"
        if blob:
            (d / f"{stem}.constants.pt").write_bytes(blob)
        path.write_text(self.source)
        return path

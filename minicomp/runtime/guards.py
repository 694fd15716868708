"""Guards: the signature a compiled call is specialised on, and clear errors for bad arguments.

A `Signature` is the (shape, dtype, strides, device) of each input. The api keeps one
compiled call per signature and compiles again when a call brings a new one
(`Signature.of(inputs)`, `Signature.diff` says what changed). Strides of size-1
dimensions carry no information and are normalised, so `x[:, None]` and a fresh tensor
of the same shape share a signature.

`check_call` raises `GuardError` for a wrong number of arguments, a non-tensor, or a
tensor of another shape, dtype or device type than the module was generated for.
`signature_of` is the api's: the signature of a compiled function's tensors, after the
device checks; `weights_fit` whether the weights read now fit a specialisation's signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minicomp.errors import GuardError
from minicomp.ir.dtypes import type_str
from minicomp.ir.graph import Graph, contiguous_strides
from minicomp.runtime.boundary import resolved


@dataclass(frozen=True)
class TensorSig:
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    device: str

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSig":
        shape = tuple(t.shape)
        plain = contiguous_strides(shape)
        stride = tuple(p if n == 1 else s for n, s, p in zip(shape, t.stride(), plain))
        return cls(shape, t.dtype, stride, str(t.device))

    def describe(self) -> str:
        return f"{type_str(self.shape, self.dtype)} strides {list(self.stride)} on {self.device}"


@dataclass(frozen=True)
class Signature:
    tensors: tuple[TensorSig, ...]

    @classmethod
    def of(cls, inputs: Sequence, names: Sequence[str] | None = None) -> "Signature":
        sigs = []
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                what = repr(names[i]) if names and i < len(names) else str(i)
                raise GuardError(f"argument {what} must be a torch.Tensor, got {type(t).__name__}")
            sigs.append(TensorSig.of(t))
        return cls(tuple(sigs))

    @property
    def device(self) -> torch.device:
        return torch.device(self.tensors[0].device) if self.tensors else torch.device("cpu")

    def describe(self) -> str:
        return "; ".join(f"{i}: {t.describe()}" for i, t in enumerate(self.tensors)) or "no inputs"

    def diff(self, other: "Signature") -> str:
        """What changed from `other` to `self`, for a recompilation message."""
        if len(self.tensors) != len(other.tensors):
            return f"{len(other.tensors)} -> {len(self.tensors)} inputs"
        out = []
        for i, (a, b) in enumerate(zip(other.tensors, self.tensors)):
            for field in ("shape", "dtype", "stride", "device"):
                if getattr(a, field) != getattr(b, field):
                    out.append(f"input {i} {field} {getattr(a, field)} -> {getattr(b, field)}")
        return ", ".join(out) or "no change"


def with_input_layouts(graph: Graph, sig: Signature) -> Graph:
    """A copy of `graph` whose input nodes carry the signature's strides, so kernels read them in place."""
    g = graph.copy()
    for nid, t in zip(g.inputs, sig.tensors):
        g.node(nid).layout = t.stride
    return g


def symbolic_shape(shape) -> bool:
    return any(not isinstance(d, int) for d in shape)


def check_call(graph_name: str, specs: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
               device_type: str, inputs: Sequence) -> None:
    """Raise GuardError unless `inputs` match `specs` (name, shape, dtype) on `device_type`."""
    if len(inputs) != len(specs):
        names = ", ".join(s[0] for s in specs)
        raise GuardError(f"{graph_name} takes {len(specs)} input(s) ({names}), got {len(inputs)}")
    on_device = (lambda t: t.is_cuda) if device_type == "cuda" else (lambda t: t.is_cpu) if device_type == "cpu" \
        else (lambda t: t.device.type == device_type)
    for (name, shape, dtype), t in zip(specs, inputs):
        # the common case first, in the reads that cost least (`t.device.type` builds a device object)
        if isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype and on_device(t):
            continue
        if not isinstance(t, torch.Tensor):
            raise GuardError(f"{graph_name}: input {name!r} must be a torch.Tensor, got {type(t).__name__}")
        if symbolic_shape(shape):          # a module over symbolic sizes checks them itself (codegen/sizes.py)
            ok = t.dim() == len(shape) and all(d == e for d, e in zip(t.shape, shape) if isinstance(e, int))
        else:
            ok = tuple(t.shape) == tuple(shape)
        if not ok or t.dtype != dtype:
            raise GuardError(f"{graph_name}: input {name!r} must be {type_str(tuple(shape), dtype)}, "
                             f"got {type_str(tuple(t.shape), t.dtype)} (compile again for a new signature)")
        if t.device.type != device_type:
            raise GuardError(f"{graph_name}: input {name!r} is on {t.device}, but this call was compiled "
                             f"for {device_type}")


def signature_of(tensors: Sequence[torch.Tensor]) -> Signature:
    """The runtime's `Signature` (shape, dtype, strides bar size-1 dims, device), after device checks."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise GuardError(f"inputs are on several devices ({', '.join(sorted(map(str, devices)))}); "
                         "move them to one device")
    for k, t in enumerate(tensors):
        if t.device.type not in ("cpu", "cuda"):
            raise GuardError(f"tensor argument {k} is on device {t.device}; minicomp runs kernels on cuda "
                             "(or on cpu under Triton's interpreter)")
    return Signature.of(tensors)


def weights_fit(weights: list, sig: Signature) -> bool:
    """Are the weights read now tensors of the signature a specialisation was compiled for?"""
    try:
        return Signature.of([resolved(w) for w in weights]) == sig
    except (GuardError, AttributeError):        # a weight is now None, or not a tensor
        return False

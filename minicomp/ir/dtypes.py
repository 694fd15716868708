"""Short dtype names used by the text dump and the DSL (`f32`, `bf16`, `i64`, `b8`...)."""

from __future__ import annotations

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
}
NAME_TO_DTYPE: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}
NAME_TO_DTYPE["bool"] = torch.bool

HALF_DTYPES = (torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def parse_dtype(name: str) -> torch.dtype | None:
    """`f32` -> torch.float32; None for an unknown name."""
    return NAME_TO_DTYPE.get(name)


def type_str(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """`bf16[4096, 4096]`, the type as the dump prints it."""
    return f"{dtype_name(dtype)}[{', '.join(str(d) for d in shape)}]"


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()

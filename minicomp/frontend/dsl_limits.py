"""The DSL frontend's limits, and reading a program from disk.

Every input to the frontend ends in a graph or a `MinicompError` (a `SourceError` where a
position is known). The checks that keep that promise for inputs far outside what real
programs hold live here, each with the limit it enforces:

- `read_program(path)`: a regular file of at most `MAX_PROGRAM_BYTES`, UTF-8 (a leading
  byte-order mark is dropped); a directory, a missing file, a FIFO or a device, or bytes
  that are not UTF-8 are reported, never raised as OSError or UnicodeDecodeError;
- `MAX_NESTING`: how deeply expressions, and the functions inlined into each other, may
  nest. The lowering recurses once per level (the parser and the tree builder do not
  recurse at all), so this bound keeps it far from Python's recursion limit: ~5 frames a
  level, 500 at the limit. Chains of one operator (`a + b + c + ...`) and runs of unary
  minus are walked in a loop and cost one level, however long;
- integers are 64-bit: literals, `--dim` values and compile-time arithmetic outside
  [-2**63, 2**63 - 1] are refused rather than wrapped or left to overflow inside PyTorch;
  `fold` evaluates integer ops exactly; a tensor may take at most 2**63 - 1 bytes; a
  number stored into a tensor must fit its dtype, as `torch.full` decides;
- what PyTorch's CPU kernels refuse (`kernel_refuses`: relu of bool, bitwise ops of
  floats...) is refused when the graph is built, although the meta tensors of shape
  inference accept it, and so is an integer division by a zero known then
  (`division_by_zero`);
- `printable(text)`: what error messages echo from the program is shown with control and
  format characters replaced, so a message never carries a terminal escape, a line
  break or a lone surrogate into the user's terminal.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any

import torch

from minicomp.errors import MinicompError, SourceError
from minicomp.ir import ops
from minicomp.ir.dims import Expr
from minicomp.ir.dtypes import dtype_name

MAX_PROGRAM_BYTES = 16 * 1024 * 1024
MAX_NESTING = 100
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1

# Unicode categories a terminal does not show as one plain character: controls, format
# characters (zero-width, bidi overrides), surrogates, line and paragraph separators.
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def printable(text: str, escape: bool = False) -> str:
    """`text` safe to print: unprintable characters become `?` (escape=False keeps every
    character one column wide, so a caret under the line stays aligned) or `\\x1b`-style
    escapes (escape=True, for messages)."""
    out = []
    for ch in text:
        if ch == "\t" or unicodedata.category(ch) not in _UNPRINTABLE:
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1] if escape else "?")
    return "".join(out)


def fits_int64(v: int) -> bool:
    return INT64_MIN <= v <= INT64_MAX


def shown_int(v: int) -> str:
    """An integer for a message: long ones are cut (a 400-digit literal is not echoed whole)."""
    text = str(v)
    return text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(text)} digits)"


def fits_dtype(value: bool | int | float, dtype: torch.dtype) -> bool:
    """Whether a Python number can be stored in a tensor of `dtype`, as `torch.full` decides:
    a float type takes inf, nan and finite values up to its largest (1e39 is refused for
    f32, 1e5 for f16); an integer type takes integers in its range."""
    if dtype == torch.bool or dtype.is_complex:
        return True
    if dtype.is_floating_point:
        v = float(value)
        return v != v or v in (float("inf"), float("-inf")) or abs(v) <= torch.finfo(dtype).max
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")  # NaN and inf have no integer
    info = torch.iinfo(dtype)
    return info.min <= int(value) <= info.max


def size_error(shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why a tensor of `shape` and `dtype` cannot exist, or None: PyTorch (and so every
    stage after the frontend) counts elements and bytes in 64 bits. A symbolic shape is
    checked where it becomes concrete: the call's tensors exist, so they fit."""
    if any(isinstance(d, Expr) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes > INT64_MAX:
        return (f"a tensor of shape {list(shape)} would take {shown_int(nbytes)} bytes, more than 2**63 - 1 "
                "(sizes are 64-bit)")
    try:  # PyTorch's own layout arithmetic, which overflows for [7, 2**63 - 1, 0] though it holds nothing
        torch.empty(shape, dtype=dtype, device="meta")
    except RuntimeError as err:
        return f"PyTorch cannot make a tensor of shape {list(shape)}: {str(err).splitlines()[0]}"
    return None


# Integer ops folded with Python's exact integers (then checked against the 64-bit range).
_EXACT_INT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
              "neg": lambda a: -a, "abs": abs}


def exact_int_fold(op: str, values: list, attrs: dict[str, Any]) -> int | None:
    """`op` of Python ints, exactly (None: not all ints, or not an op folded this way);
    ValueError past 64 bits."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    n = attrs.get("exponent")
    if op == "pow" and isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        base = values[0]
        if abs(base) > 1 and n > 64:  # past 2**64 for any base of 2 or more: refused without computing it
            raise ValueError(f"integer overflow: pow({base}, {n}) does not fit in 64 bits")
        out = base ** n
    elif op in _EXACT_INT:
        out = _EXACT_INT[op](*values)
    else:
        return None
    if not fits_int64(out):
        raise ValueError(f"integer overflow: {op} of {', '.join(map(shown_int, values))} does not fit in 64 bits")
    return out


def fold(op: str, values: list, attrs: dict[str, Any]) -> bool | int | float:
    """A pointwise op on Python numbers, evaluated at compile time: integers exactly (and
    refused past 64 bits, where int64 would wrap), floats in double precision; ValueError
    with PyTorch's reason where it refuses (relu(true))."""
    exact = exact_int_fold(op, values, attrs)
    if exact is not None:
        return exact

    def as_tensor(v):
        dt = torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.float64
        return torch.tensor(v, dtype=dt)

    try:
        out = ops.get(op).ref(*[as_tensor(v) for v in values], **attrs)
    except (RuntimeError, TypeError, OverflowError) as err:  # reported like a graph op's error
        raise ValueError(str(err).split("\n")[0]) from None
    return out.item()


def kernel_refuses(op: str, dtypes: list[torch.dtype], attrs: dict[str, Any]) -> str | None:
    """Why PyTorch's CPU kernel refuses `op` on operands of these dtypes, or None. Shape
    inference runs on meta tensors, which accept some ops the kernels refuse (relu or abs
    of bool, neg of bool, bitwise_and of floats); eager refuses them, so the DSL does too,
    rather than build a graph that cannot run. The call is tried on 0-d ones: what is
    checked is the dtypes (and attributes: PyTorch converts `pow`'s exponent and `clamp`'s
    bounds to the tensor's dtype, and refuses one that overflows it: pow(x, 1e10) of an f16
    x), not values. Ones, not zeros: an integer division by an element that is zero is a
    matter of the data (kernels divide by 1 there), not of the types; a zero known when the
    graph is built is `division_by_zero`'s."""
    if op in ("neg", "sub") and torch.bool in dtypes:  # PyTorch's own advice names Python operators
        return "'-' of b8 is not supported: invert a mask with logical_not(x), compare two with ne(a, b)"
    if op == "lerp" and not dtypes[0].is_floating_point:  # as the fx frontend: a 0-d f32 weight would pass below
        return f"lerp of a {dtype_name(dtypes[0])} start is not supported (eager raises NotImplementedError)"
    try:
        ops.get(op).ref(*[torch.ones((), dtype=dt) for dt in dtypes], **attrs)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        types = " and ".join(dtype_name(dt) for dt in dtypes)
        return f"{op} of {types} is not supported (PyTorch: {str(err).splitlines()[0]})"
    return None


# Registry ops that divide their first operand by their second.
INTEGER_DIVISIONS = ("floor_divide", "div_trunc", "remainder", "fmod")


def division_by_zero(op: str, divisor: Any, out: torch.dtype) -> str | None:
    """Why an integer division by a divisor known to be zero is refused, or None: eager
    raises ZeroDivisionError, the fx frontend refuses it at capture, and the DSL does too.
    `divisor` is the Python number given, or the attributes of the constant or `full` node
    holding it (anything else is data, which kernels divide by 1 where it is zero)."""
    if op not in INTEGER_DIVISIONS or out.is_floating_point or out == torch.bool:
        return None
    value = divisor.get("value") if isinstance(divisor, dict) else divisor
    if isinstance(value, torch.Tensor):
        zero = bool((value == 0).any())
    else:
        zero = isinstance(value, (bool, int, float)) and value == 0
    return f"{op}: integer division by zero (eager raises RuntimeError: ZeroDivisionError)" if zero else None


# ------------------------------------------------------------------ reading a program


def read_program(path: str | os.PathLike) -> str:
    """The text of a DSL program file; MinicompError (SourceError for bad bytes) if it cannot be one.

    Opened without blocking and checked on the open descriptor, so a FIFO, a device or a
    directory put in place of the file is refused, never waited on or read without end.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(shown, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MinicompError(f"{shown}: {_os_reason(e)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise MinicompError(f"{shown}: is a directory, not a DSL program")
        if not stat.S_ISREG(info.st_mode):
            raise MinicompError(f"{shown}: is not a regular file (a DSL program is read from a file)")
        if info.st_size > MAX_PROGRAM_BYTES:
            raise MinicompError(f"{shown}: is {info.st_size} bytes; a DSL program may hold at most "
                                f"{MAX_PROGRAM_BYTES} bytes")
        chunks, total = [], 0
        while True:  # read to the end, but never past the limit (the file may grow while read)
            chunk = os.read(fd, min(1 << 20, MAX_PROGRAM_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_PROGRAM_BYTES:
                raise MinicompError(f"{shown}: holds more than {MAX_PROGRAM_BYTES} bytes, the limit for a DSL program")
    except OSError as e:
        raise MinicompError(f"{shown}: {_os_reason(e)}") from None
    finally:
        os.close(fd)
    return decode_program(b"".join(chunks), shown)


def decode_program(data: bytes, filename: str) -> str:
    """UTF-8 bytes -> text (a leading BOM dropped); SourceError at the first byte that is not UTF-8."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line_end = data.find(b"\n", e.start)
        line_bytes = data[line_start: line_end if line_end >= 0 else len(data)]
        line = line_bytes.decode("utf-8", "replace").rstrip("\r")
        col = len(data[line_start:e.start].decode("utf-8", "replace")) + 1
        lineno = data.count(b"\n", 0, e.start) + 1
        raise SourceError(f"the file is not UTF-8 text: byte 0x{data[e.start]:02x} cannot be decoded "
                          "(save the program as UTF-8)", filename, lineno, col, printable(line)) from None


def _os_reason(e: OSError) -> str:
    reasons = {errno.ENOENT: "no such file", errno.EISDIR: "is a directory, not a DSL program",
               errno.EACCES: "cannot be read (permission denied)", errno.ENOTDIR: "no such file (a part of the "
               "path is not a directory)", errno.ELOOP: "too many levels of symbolic links",
               errno.ENAMETOOLONG: "the file name is too long"}
    return reasons.get(e.errno, f"cannot be read ({e.strerror or type(e).__name__})")


def is_program_path(text_or_path: str | os.PathLike) -> bool:
    """Whether `compile_dsl`'s first argument names a file: a path object always; a string
    when it is one line that names an existing file or ends in `.mc` (program text always
    holds a `{`, which such a string may too, but then it is a file that exists)."""
    if isinstance(text_or_path, os.PathLike):
        return True
    if "\n" in text_or_path:
        return False
    if text_or_path.endswith(".mc"):
        return True
    try:
        return Path(text_or_path).is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a file, so text
        return False

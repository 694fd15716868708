"""How text the user chose (names, labels, file paths, reasons naming them) enters generated source.

Never as code. A user's name becomes an identifier only through `safe_ident`: ASCII letters,
digits and `_`, and a `v_` prefix whenever the result could mean something else in a generated
module — a keyword, a builtin, a name starting with `_` (minicomp's own helpers), `mc_` (kernel
names) or `buf` and digits (call()'s buffers), or any name the caller reserves. Anything else a
user wrote reaches the module only inside a comment, through `comment_text` (one line: line
breaks, other control characters and Unicode line separators are written as escapes), or
inside a string literal written with `repr`. `CodeBuilder.writeline` refuses a line that holds
a line break, so a path that forgot either still cannot add a line of code.

Invariant: for every string s, `comment_text(s)` holds no character `str.splitlines` splits on
(Python's tokenizer, linecache and inspect then agree on the lines), and `safe_ident(s)` is a
valid identifier that is not a keyword, soft keyword or builtin.
"""

from __future__ import annotations

import builtins
import keyword
import re

# what str.splitlines splits on, plus the other C0/C1 controls and DEL
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_BUFFER = re.compile(r"buf\d+")
_TAKEN = frozenset(keyword.kwlist) | frozenset(getattr(keyword, "softkwlist", ())) | frozenset(dir(builtins))


def comment_text(text: object) -> str:
    """`text` as one line of comment: unsafe characters written as `\\xNN` / `\\uNNNN` escapes."""
    def escape(m: re.Match) -> str:
        code = ord(m.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return _UNSAFE.sub(escape, str(text))


def safe_ident(text: object, reserved: frozenset[str] | set[str] = frozenset()) -> str:
    """A readable identifier from a user's name (`ln_1.weight` -> `ln_1_weight`), prefixed with
    `v_` when it could collide with a keyword, builtin, minicomp's own names or `reserved`."""
    out = "".join(ch if (ch.isascii() and (ch.isalnum() or ch == "_")) else "_" for ch in str(text))
    out = out.strip("_") if out.strip("_") else out
    if not out or out[0].isdigit() or out.startswith("_") or out.startswith("mc_") or _BUFFER.fullmatch(out) \
            or out in _TAKEN or out in reserved or out.startswith("v_"):
        out = f"v_{out}" if out else "v"
    return out


def line_order(origin: str) -> tuple:
    """`file:line` origins in file order, then line order."""
    path, _, line = origin.rpartition(":")
    return (path, int(line)) if line.isdigit() else (origin, 0)

"""The on-disk module cache: generated sources stored under a hash of what they depend on.

Key: sha256 of (source, Triton version, PyTorch version, device name, entry format).
Location: `$MINICOMP_CACHE_DIR`, else `$XDG_CACHE_HOME/minicomp`, else `~/.cache/minicomp`.
An entry is one file `<root>/<key[:2]>/mc_<key>.py` whose first line records the sha256
and length of the rest, so Python can import it directly (Triton needs a real file to
read kernel source from) and a corrupt or truncated entry is detected.

Invariants:
- writes are atomic (a temporary file in the same directory, then `os.replace`), so a
  reader sees a whole entry or none;
- an entry whose checksum does not match is never trusted: it is rewritten from the
  source in hand;
- a cache directory that cannot be written is not an error: `store` returns None (the
  loader then compiles in memory) and warns once per directory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

import torch
import triton

ENV_VAR = "MINICOMP_CACHE_DIR"
FORMAT = "minicomp-cache-v1"
_HEADER = "# minicomp-cache sha256={digest} length={length}\n"
_warned: set[str] = set()


def cache_root() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "minicomp"
    return Path.home() / ".cache" / "minicomp"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}-interpreter"


def cache_key(source: str, device: torch.device) -> str:
    parts = [FORMAT, source, triton.__version__, torch.__version__, device_name(device)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


class ModuleCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_root()

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"mc_{key}.py"

    def read(self, key: str) -> str | None:
        """The stored source for `key`, or None when absent or failing its checksum."""
        try:
            text = self.path_for(key).read_text()
        except (OSError, UnicodeDecodeError):
            return None
        head, sep, body = text.partition("\n")
        if not sep or head + "\n" != _HEADER.format(digest=_digest(body), length=len(body)):
            return None
        return body

    def store(self, key: str, source: str) -> Path | None:
        """Path of a verified entry holding `source` (written now if missing or corrupt); None if unwritable."""
        path = self.path_for(key)
        if self.read(key) == source:
            return path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(_HEADER.format(digest=_digest(source), length=len(source)))
                    f.write(source)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except OSError as e:
            if str(self.root) not in _warned:
                _warned.add(str(self.root))
                warnings.warn(f"minicomp: cache directory {self.root} is not writable ({e.strerror or e}); "
                              f"compiling in memory (set ${ENV_VAR} to a writable directory)", stacklevel=3)
            return None
        return path

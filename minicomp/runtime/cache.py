"""The on-disk module cache: generated sources stored under a hash of what they depend on.

Key: sha256 of (source, Triton version, PyTorch version, device name, entry format).
Location: `$MINICOMP_CACHE_DIR`, else `$XDG_CACHE_HOME/minicomp`, else `~/.cache/minicomp`.
An entry is one file `<root>/<key[:2]>/mc_<key>.py` whose first line records the sha256
and length of the rest, so a corrupt or truncated entry is detected. The file is never
imported: `fetch` reads it once and hands back the verified text, which the loader
compiles and runs from memory. What runs is therefore the text that was checked: no
`__pycache__` is read or written, and a file changed after its check (by a racing
writer, say) changes nothing.

Cache directories are shared, so they are trusted as ssh and pip trust theirs: the root
and each entry directory must be a real directory owned by the current user and not
writable by group or others. Otherwise minicomp neither reads nor writes there: it warns
once per directory and compiles in memory. Every check and every use goes through one
file descriptor (`dir_fd=` on Linux), so a directory swapped after its check is never
the one used.

Invariants:
- an entry is read through one `open(O_NOFOLLOW | O_NONBLOCK)`, and only when `fstat`
  shows a regular file of ours that others cannot write, no bigger than the entry
  expected: a FIFO, a symlink (to /dev/zero, say), a directory or a huge file is never
  read, only replaced (or, where it cannot be, the cache is bypassed for it);
- writes are atomic (a temporary file in the same directory, then `os.replace`), so a
  reader sees a whole entry or none;
- directories minicomp creates are 0700 and files 0600, whatever the umask;
- an entry whose checksum, or whose text, does not match is never trusted: it is
  rewritten from the source in hand;
- a cache that cannot be written is not an error: `fetch` returns None (the loader then
  compiles in memory) and warns once per directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import triton

ENV_VAR = "MINICOMP_CACHE_DIR"
FORMAT = "minicomp-cache-v1"
MAX_ENTRY_BYTES = 64 << 20    # `read` without the source in hand reads no more than this
_HEADER = "# minicomp-cache sha256={digest} length={length}\n"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # a FIFO opens at once
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
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


@dataclass(frozen=True)
class Entry:
    """A verified cache entry: where it lives, and the text that was checked (the only text to run)."""
    path: Path
    text: str


class _Untrusted(Exception):
    """A cache directory minicomp must not use: `reason` completes "it ..."."""

    def __init__(self, directory: Path, reason: str):
        super().__init__(directory, reason)
        self.directory, self.reason = directory, reason


def _encode(source: str) -> bytes:
    body = source.encode()
    return _HEADER.format(digest=hashlib.sha256(body).hexdigest(), length=len(source)).encode() + body


def _verified_text(data: bytes) -> str | None:
    """The body of entry bytes `data` when its header matches it, else None."""
    head, sep, body = data.partition(b"\n")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    want = _HEADER.format(digest=hashlib.sha256(body).hexdigest(), length=len(text)).encode()
    return text if sep and head + sep == want else None


def _distrust(st: os.stat_result) -> str | None:
    """Why a directory with stat `st` must not hold cache entries, or None when it may."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & _OTHERS_WRITE:
        who = {stat.S_IWGRP: "group", stat.S_IWOTH: "others"}.get(st.st_mode & _OTHERS_WRITE, "group and others")
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _checked(fd: int, path: Path) -> int:
    """`fd` when the directory it holds is trusted; else close it and raise _Untrusted."""
    reason = _distrust(os.fstat(fd))
    if reason is not None:
        os.close(fd)
        raise _Untrusted(path, reason)
    return fd


def _make_dirs(path: Path) -> None:
    """Create `path` and its missing parents, each 0700 (XDG asks this of cache homes)."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):      # another process was quicker
            os.mkdir(d, 0o700)


def _open_subdir(root_fd: int, name: str, path: Path, create: bool) -> int:
    """A checked fd of directory `name` in `root_fd`; never through a symlink."""
    flags = _DIR_FLAGS | os.O_NOFOLLOW
    try:
        try:
            fd = os.open(name, flags, dir_fd=root_fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=root_fd)
            fd = os.open(name, flags, dir_fd=root_fd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):     # a symlink or a file where the directory goes
            raise _Untrusted(path, "is not a directory (a symlink or a file)") from e
        raise
    return _checked(fd, path)


def _read_entry(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of entry `name`; None unless it is a regular file of ours, that others cannot write,
    of at most `limit` bytes."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None                                 # not even opened: a device could act on open
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)                               # what was opened, not what the name holds now
        if (not stat.S_ISREG(st.st_mode) or st.st_size > limit or st.st_uid != os.geteuid()
                or st.st_mode & _OTHERS_WRITE):
            return None
        chunks, n = [], 0
        while n <= limit:                               # bounded even if the file grows meanwhile
            chunk = os.read(fd, limit + 1 - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks) if n <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _write_entry(dir_fd: int, name: str, data: bytes) -> None:
    tmp = f".tmp-{secrets.token_hex(8)}.py"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _warn_once(directory: Path, message: str) -> None:
    if str(directory) not in _warned:
        _warned.add(str(directory))
        warnings.warn(message, stacklevel=4)


class ModuleCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_root()

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"mc_{key}.py"

    @contextlib.contextmanager
    def _entry_dir(self, key: str, create: bool) -> Iterator[int]:
        """An fd of the checked entry directory for `key` (made 0700 when missing and `create`)."""
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)     # the root may be a symlink: its target is checked
        except FileNotFoundError:
            if not create:
                raise
            _make_dirs(self.root)
            root_fd = os.open(self.root, _DIR_FLAGS)
        _checked(root_fd, self.root)
        try:
            sub_fd = _open_subdir(root_fd, key[:2], self.root / key[:2], create)
            try:
                yield sub_fd
            finally:
                os.close(sub_fd)
        finally:
            os.close(root_fd)

    def read(self, key: str) -> str | None:
        """The stored source for `key`; None when absent, failing its checksum, or not trustworthy."""
        try:
            with self._entry_dir(key, create=False) as dir_fd:
                data = _read_entry(dir_fd, self.path_for(key).name, MAX_ENTRY_BYTES)
        except (OSError, _Untrusted):
            return None
        return _verified_text(data) if data is not None else None

    def fetch(self, key: str, source: str) -> Entry | None:
        """The verified entry holding `source` (written now if missing or corrupt); None (and one
        warning per directory) when the cache cannot be written or is not to be trusted."""
        path = self.path_for(key)
        want = _encode(source)
        try:
            with self._entry_dir(key, create=True) as dir_fd:
                data = _read_entry(dir_fd, path.name, len(want))
                text = _verified_text(data) if data is not None else None
                if text != source:
                    try:
                        _write_entry(dir_fd, path.name, want)
                    except OSError as e:                # say which file: a directory may sit there
                        raise OSError(e.errno, f"writing {path}: {e.strerror}") from e
                    text = source
        except _Untrusted as u:
            _warn_once(u.directory, f"minicomp: not using cache directory {u.directory}: it {u.reason}, so "
                                    f"someone else could plant code there; compiling in memory (if it is yours, "
                                    f"`chmod -R go-w {self.root}`; else set ${ENV_VAR} to a directory of your own)")
            return None
        except OSError as e:
            _warn_once(self.root, f"minicomp: cache directory {self.root} is not writable ({e.strerror or e}); "
                                  f"compiling in memory (set ${ENV_VAR} to a writable directory)")
            return None
        return Entry(path, text)

    def store(self, key: str, source: str) -> Path | None:
        """Path of a verified entry holding `source` (written now if missing or corrupt); None if unusable."""
        entry = self.fetch(key, source)
        return entry.path if entry is not None else None

"""Cache trust: the module cache only ever runs the bytes minicomp verified.

Users share cache directories, so another local user (or a file that is not what it looks
like) must neither get code run nor hang a compile. Each test plays one attack; the suite
runs as root, so "another user" is uid 65534 and "writable by others" is mode 0o777.

- A planted `__pycache__/*.pyc` beside a valid entry, a writer swapping the entry in a
  tight loop while it is loaded, and an entry rewritten between load and first call
  (Triton's interpreter reads kernel source again then): the attacker's code never runs.
- A cache root or entry directory that others can write, or that someone else owns:
  refused with one warning, compiled in memory, nothing written there.
- A FIFO, a link to /dev/zero, a directory or a huge file where an entry should be: no
  hang and no memory blow-up (checked in a child process under a time limit and an
  address-space limit); the entry is rewritten, or the cache bypassed for it.
- Directories are created 0700 and files 0600, also under umask 0.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp import runtime
from minicomp.runtime import cache as cache_mod
from minicomp.runtime.cache import ModuleCache

ROOT = Path(__file__).resolve().parent.parent
OTHER_UID = 65534                       # "nobody": stands in for another local user


def block(x, w):
    return torch.softmax(x * w, -1) - 0.5


INPUTS = (torch.randn(5, 9, generator=torch.Generator().manual_seed(0)),
          torch.randn(9, generator=torch.Generator().manual_seed(1)))


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    """The GeneratedModule of `block` for cpu."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINICOMP_CACHE_DIR", str(tmp_path_factory.mktemp("gen-cache")))
        f = minicomp.compile(block)
        f(*INPUTS)
        return f.compile_for(*INPUTS).call.generated


def _load_and_check(gen, cache: ModuleCache):
    call = runtime.load(gen, "cpu", cache=cache)
    torch.testing.assert_close(call(*INPUTS)[0], block(*INPUTS))
    return call


def _evil(source: str, marker: Path) -> str:
    """`source` that also leaves `marker` behind when its module body runs: a working module
    an attacker would plant, so nothing but the marker tells it apart."""
    return source + f"\nopen({str(marker)!r}, 'a').write('attacker code ran\\n')\n"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*"))


# ----------------------------------------------------------------------------- never run other bytes

def test_loading_writes_no_pycache(tmp_path, gen, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)    # as for most users (CI sets it)
    cache = ModuleCache(tmp_path / "c")
    call = _load_and_check(gen, cache)
    _load_and_check(gen, cache)
    assert call.path is not None and call.path.is_file()
    assert not list((tmp_path / "c").rglob("__pycache__")), _files(tmp_path / "c")


def _pyc(code, flags: int, entry: Path) -> bytes:
    st = entry.stat()
    if flags == 0:      # timestamp pyc: valid while the source's mtime and size match
        meta = int(st.st_mtime).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    else:               # unchecked hash pyc: used without looking at the source at all
        meta = b"\0" * 8
    return importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + meta + marshal.dumps(code)


@pytest.mark.parametrize("kind", ["timestamp", "unchecked-hash"])
def test_planted_pycache_beside_a_valid_entry_never_runs(tmp_path, gen, kind):
    cache, marker = ModuleCache(tmp_path / "c"), tmp_path / "marker"
    entry = _load_and_check(gen, cache).path
    code = compile(_evil(gen.source, marker), str(entry), "exec")
    pyc = Path(importlib.util.cache_from_source(str(entry)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(_pyc(code, {"timestamp": 0, "unchecked-hash": 1}[kind], entry))
    calls = [runtime.load(gen, "cpu", cache=cache) for _ in range(2)]
    assert not marker.exists(), "the planted .pyc ran"
    for call in calls:
        assert call.path == entry
        torch.testing.assert_close(call(*INPUTS)[0], block(*INPUTS))


ATTACKER = textwrap.dedent("""
    import os, sys
    entry, good, evil, progress, stop = sys.argv[1:6]
    blobs = [open(evil, "rb").read(), open(good, "rb").read()]
    n = 0
    while not os.path.exists(stop):
        for i, data in enumerate(blobs):       # evil in place, then a valid entry again
            tmp = os.path.join(os.path.dirname(entry), f".swap-{i}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, entry)
        n += 1
        if n % 20 == 1:                        # how far it got, for the loader to wait on
            with open(progress + ".tmp", "w") as f:
                f.write(str(n))
            os.replace(progress + ".tmp", progress)
    print(n)
""")


def _progress(path: Path) -> int:
    return int(path.read_text()) if path.exists() else 0


LOADS, SWAPS = 100, 200


def test_entry_swapped_in_a_tight_loop_while_loading_never_runs_attacker_code(tmp_path, gen):
    # another process swaps the entry between a valid one and a self-consistent attacker entry
    # (its header matches its own body) as fast as it can; each load must run only the source
    # minicomp verified. The old loader checked the file, then opened it again to import it.
    cache, marker = ModuleCache(tmp_path / "c"), tmp_path / "marker"
    entry = _load_and_check(gen, cache).path
    good, evil = tmp_path / "good", tmp_path / "evil"
    good.write_bytes(entry.read_bytes())
    evil_entry = ModuleCache(tmp_path / "evil-cache").store("ee" + "0" * 62, _evil(gen.source, marker))
    evil.write_bytes(evil_entry.read_bytes())
    progress, stop = tmp_path / "progress", tmp_path / "stop"
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, *map(str, (entry, good, evil, progress, stop))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    calls, deadline = [], time.monotonic() + 120
    try:
        while _progress(progress) == 0 and attacker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        # load at least LOADS times, and on until the attacker has swapped SWAPS times meanwhile
        while (len(calls) < LOADS or _progress(progress) < SWAPS) and time.monotonic() < deadline:
            calls.append(runtime.load(gen, "cpu", cache=cache))
    finally:
        stop.write_text("stop")
        out, err = attacker.communicate(timeout=60)
    assert attacker.returncode == 0, err
    assert int(out) >= SWAPS, f"the attacker swapped only {out.strip()} times: the race was not on"
    ran = len(marker.read_text().splitlines()) if marker.exists() else 0
    assert ran == 0, f"attacker code ran in {ran} of {len(calls)} loads"
    torch.testing.assert_close(calls[-1](*INPUTS)[0], block(*INPUTS))


def _with_kernel_line(source: str, line: str) -> str:
    """`source` with `line` as the first statement of its first generated kernel."""
    lines = source.splitlines(keepends=True)
    at = next(i for i, text in enumerate(lines) if text.startswith("def mc_"))
    while not lines[at].rstrip().endswith(":"):
        at += 1
    return "".join(lines[: at + 1] + ["    " + line + "\n"] + lines[at + 1:])


def test_entry_rewritten_after_load_does_not_change_the_kernel_that_runs(tmp_path, gen):
    # Triton's interpreter reads a kernel's source again at its first launch; it must get the
    # verified text, not whatever the entry file holds by then
    cache, marker = ModuleCache(tmp_path / "c"), tmp_path / "marker"
    call = runtime.load(gen, "cpu", cache=cache)
    call.path.write_text(_with_kernel_line(gen.source, f"open({str(marker)!r}, 'a').write('kernel')"))
    torch.testing.assert_close(call(*INPUTS)[0], block(*INPUTS))
    assert not marker.exists(), "the rewritten kernel ran"


# ----------------------------------------------------------------------------- untrusted directories

def _caught_minicomp(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "minicomp" in str(w.message)]


def _give_away(p: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    os.chown(p, OTHER_UID, OTHER_UID)


def _make_untrusted(d: Path, how: str) -> None:
    d.mkdir(mode=0o700, exist_ok=True)
    if how == "world-writable":
        d.chmod(0o777)
    elif how == "group-writable":
        d.chmod(0o770)
    else:
        _give_away(d)


@pytest.mark.parametrize("where", ["root", "entry-dir"])
@pytest.mark.parametrize("how", ["world-writable", "group-writable", "other-owner"])
def test_untrusted_cache_directory_is_refused_with_one_warning(tmp_path, gen, where, how):
    # the directory even holds a valid entry: it is not used, since whoever can write there
    # could have swapped in anything (and could next time)
    root = tmp_path / "shared"
    cache = ModuleCache(root)
    entry = _load_and_check(gen, cache).path
    bad = root if where == "root" else entry.parent
    _make_untrusted(bad, how)
    before = {p: p.read_bytes() if p.is_file() else None for p in _files(root)}
    calls = []
    msgs = _caught_minicomp(lambda: calls.extend(_load_and_check(gen, cache) for _ in range(3)))
    assert len(msgs) == 1, msgs
    assert str(bad) in msgs[0] and ("owned by" in msgs[0] if how == "other-owner" else "writable by" in msgs[0])
    assert all(c.path is None for c in calls)                 # compiled in memory, the entry not used
    assert {p: p.read_bytes() if p.is_file() else None for p in _files(root)} == before   # nothing written


def test_entry_dir_that_is_a_symlink_is_refused(tmp_path, gen):
    root = tmp_path / "c"
    cache = ModuleCache(root)
    key_dir = cache.path_for(cache_mod.cache_key(gen.source, torch.device("cpu"))).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.mkdir(mode=0o700)
    key_dir.symlink_to(elsewhere)
    calls = []
    msgs = _caught_minicomp(lambda: calls.extend(_load_and_check(gen, cache) for _ in range(2)))
    assert len(msgs) == 1 and str(key_dir) in msgs[0], msgs
    assert all(c.path is None for c in calls) and not list(elsewhere.iterdir())


@pytest.mark.parametrize("how", ["world-writable", "other-owner"])
def test_entry_file_others_could_change_is_replaced_by_ours(tmp_path, gen, how):
    cache = ModuleCache(tmp_path / "c")
    entry = _load_and_check(gen, cache).path
    if how == "world-writable":
        entry.chmod(0o666)
    else:
        _give_away(entry)
    assert _load_and_check(gen, cache).path == entry
    st = entry.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600


def test_cache_creates_private_directories_and_files_under_umask_0(tmp_path, gen):
    root = tmp_path / "new" / "cache"
    old = os.umask(0)
    try:
        entry = _load_and_check(gen, ModuleCache(root)).path
        entry.write_text("corrupt")                          # a rewrite is private too
        assert _load_and_check(gen, ModuleCache(root)).path == entry
    finally:
        os.umask(old)
    made = (root.parent, root, entry.parent)                  # a missing parent is made 0700 too (XDG)
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (*made, entry)}
    assert modes == {**{d: 0o700 for d in made}, entry: 0o600}, modes


# ----------------------------------------------------------------------------- entries that are not files

WORKER = textwrap.dedent("""
    import resource, warnings
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))   # reading /dev/zero ends in MemoryError
    import torch
    import minicomp

    def block(x, w):
        return torch.softmax(x * w, -1) - 0.5

    x, w = torch.randn(5, 9), torch.randn(9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):                            # the second compile must not warn again
            f = minicomp.compile(block)
            torch.testing.assert_close(f(x, w), block(x, w))
    print("ENTRY", f.compile_for(x, w).call.path)
    print("WARNINGS", sum("minicomp" in str(m.message) for m in caught))
""")


def _run_worker(cache_dir: Path, timeout: float = 120) -> tuple[str, int]:
    """(entry path or 'None', minicomp warnings) of a fresh process compiling into `cache_dir`."""
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(cache_dir), TRITON_INTERPRET="1")
    p = subprocess.Popen([sys.executable, "-c", WORKER], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"compiling hung for {timeout} s")
    assert p.returncode == 0, err[-3000:]
    fields = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("ENTRY ", "WARNINGS ")))
    return fields["ENTRY"], int(fields["WARNINGS"])


@pytest.fixture(scope="module")
def entry_name(tmp_path_factory) -> Path:
    """The worker's entry path relative to its cache root."""
    root = tmp_path_factory.mktemp("worker") / "cache"
    entry, _ = _run_worker(root)
    return Path(entry).relative_to(root)


@pytest.mark.parametrize("thing", ["fifo", "dev-zero-link", "huge-file", "directory"])
def test_entry_that_is_not_a_small_regular_file_never_hangs(tmp_path, entry_name, thing):
    root = tmp_path / "c"
    entry = root / entry_name
    root.mkdir(mode=0o700)
    entry.parent.mkdir(mode=0o700)
    if thing == "fifo":
        os.mkfifo(entry, 0o600)                     # an open() for reading waits for a writer
    elif thing == "dev-zero-link":
        entry.symlink_to("/dev/zero")               # endless bytes
    elif thing == "huge-file":
        with open(entry, "wb") as f:
            f.truncate(64 << 30)                    # 64 GiB, sparse
    else:
        entry.mkdir(mode=0o700)
    used, warned = _run_worker(root)
    if thing == "directory":                        # cannot be replaced: bypassed, one warning
        assert used == "None" and warned == 1 and entry.is_dir()
    else:                                           # replaced by a valid entry of ours
        assert used == str(entry) and warned == 0
        st = os.lstat(entry)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert ModuleCache(root).read(entry.stem.removeprefix("mc_")) is not None

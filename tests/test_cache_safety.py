"""Cache safety, end to end through `minicomp.compile` and `$MINICOMP_CACHE_DIR`.

- Two processes compiling the same graph at the same moment leave one valid entry (and no
  temporary files), and both compute the right answer.
- A damaged entry (truncated, or a body that no longer matches its checksum) is detected
  by a fresh process, rebuilt, and never run.
- A cache directory that cannot be written makes minicomp compile in memory, with exactly
  one warning however many graphs compile, and the results stay right. Root ignores
  permission bits, so the chmod case is skipped (with a reason) when root can write anyway;
  a cache path under a regular file fails for everyone and always runs.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp.runtime import cache as cache_mod
from minicomp.runtime.cache import ModuleCache

ROOT = Path(__file__).resolve().parent.parent

# A worker: waits for the go file (so both start compiling together), compiles, checks, and
# prints the cache entry it used. Inputs are seeded: both workers compile one source.
WORKER = textwrap.dedent("""
    import os, sys, time
    import torch
    import minicomp

    go = sys.argv[1]
    while not os.path.exists(go):
        time.sleep(0.002)

    def block(x, w, b):
        h = torch.softmax(x @ w + b, -1)
        return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(9, 12, generator=g), torch.randn(12, 10, generator=g), torch.randn(10, generator=g)
    f = minicomp.compile(block)
    torch.testing.assert_close(f(x, w, b), block(x, w, b), atol=1e-4, rtol=1e-4)
    print("ENTRY", f.compile_for(x, w, b).call.path)
""")


def _spawn(cache_dir: Path, go: Path) -> subprocess.Popen:
    env = dict(os.environ, MINICOMP_CACHE_DIR=str(cache_dir), TRITON_INTERPRET="1", PYTHONWARNINGS="default")
    return subprocess.Popen([sys.executable, "-c", WORKER, str(go)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(p: subprocess.Popen) -> tuple[str, str]:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return out, err


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _entry_of(out: str) -> Path:
    line = next(line for line in out.splitlines() if line.startswith("ENTRY "))
    return Path(line.split(" ", 1)[1])


def _valid(path: Path) -> bool:
    key = path.stem.removeprefix("mc_")
    return ModuleCache(path.parent.parent).read(key) is not None


# ----------------------------------------------------------------------------- two processes at once

def test_two_processes_compiling_at_once_leave_one_valid_entry(tmp_path):
    cache_dir, go = tmp_path / "shared-cache", tmp_path / "go"
    procs = [_spawn(cache_dir, go) for _ in range(2)]
    go.write_text("go")                       # both are waiting on this: they compile together
    outs = [_finish(p)[0] for p in procs]
    paths = {_entry_of(o) for o in outs}
    assert len(paths) == 1, paths             # one key, one entry, both used it
    entries = _entries(cache_dir)
    assert entries == sorted(paths), entries  # nothing else: no leftover temporary files
    assert _valid(entries[0])


def test_concurrent_stores_of_one_entry_never_show_a_partial_file(tmp_path):
    # two processes store and read the same (large) entry in a loop: a reader sees the whole
    # entry or none, never half of one, because writes go to a temp file and os.replace
    script = textwrap.dedent("""
        import sys
        from minicomp.runtime.cache import ModuleCache
        c = ModuleCache(sys.argv[1])
        source = "x = 1\\n" + "# padding to widen the write window\\n" * 40000
        key = "cd" + "1" * 62
        for _ in range(60):
            assert c.store(key, source) is not None
            got = c.read(key)
            assert got == source, "partial or foreign entry read"
        print("ok")
    """)
    root = tmp_path / "c"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "ok" in out, err[-2000:]
    assert [p.name for p in _entries(root)] == ["mc_cd" + "1" * 62 + ".py"]


# ----------------------------------------------------------------------------- damaged entries

@pytest.fixture(scope="module")
def good_entry(tmp_path_factory) -> tuple[Path, str]:
    """A cache holding the worker's entry, written by a worker process; (entry path, its text)."""
    tmp = tmp_path_factory.mktemp("good")
    go = tmp / "go"
    go.write_text("go")
    entry = _entry_of(_finish(_spawn(tmp / "cache", go))[0])
    return entry, entry.read_text()


# empty and garbage entries are covered in-process by test_runtime.py
@pytest.mark.parametrize("damage", ["truncated", "body-edited"])
def test_damaged_entry_is_rebuilt_by_a_fresh_process(tmp_path, good_entry, damage):
    src_entry, good = good_entry
    cache_dir, go = tmp_path / "cache", tmp_path / "go"
    go.write_text("go")
    entry = cache_dir / src_entry.parent.name / src_entry.name
    entry.parent.mkdir(parents=True)
    head, body = good.split("\n", 1)
    entry.write_text({
        "truncated": good[: len(good) // 2],              # a writer killed half way (without os.replace)
        # a plausible module under the old header: must fail the checksum, never run
        "body-edited": head + "\n" + body.replace("def call(", "def call_unused(") +
                       "\ndef call(*inputs):\n    raise SystemExit('stale entry ran')\n",
    }[damage])
    assert not _valid(entry)
    out, _ = _finish(_spawn(cache_dir, go))              # recompiles, rewrites, and is right
    assert _entry_of(out) == entry
    assert entry.read_text() == good and _valid(entry)
    assert _entries(cache_dir) == [entry]


# ----------------------------------------------------------------------------- unwritable cache

def _compile_two_graphs() -> list[warnings.WarningMessage]:
    x = torch.randn(5, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fn in (lambda t: torch.softmax(t, -1) * 3, lambda t: torch.relu(t).sum(0)):
            f = minicomp.compile(fn)
            torch.testing.assert_close(f(x), fn(x))
            assert f.compile_for(x).call.path is None                    # compiled in memory
    return [w for w in caught if "minicomp" in str(w.message)]


def test_cache_path_under_a_file_compiles_in_memory_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    root = blocker / "cache"                                  # mkdir fails, even for root
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(root))
    cache_mod._warned.discard(str(root))
    caught = _compile_two_graphs()
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "is not writable" in str(caught[0].message) and str(root) in str(caught[0].message)


def _root_ignores_permissions(directory: Path) -> bool:
    probe = directory / "probe"
    try:
        probe.write_text("x")
    except OSError:
        return False
    probe.unlink()
    return True


def test_read_only_cache_directory_compiles_in_memory_with_one_warning(tmp_path, monkeypatch):
    root = tmp_path / "ro-cache"
    root.mkdir()
    root.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if _root_ignores_permissions(root):
            pytest.skip("running as root: a read-only mode bit does not stop writes here "
                        "(test_cache_path_under_a_file_compiles_in_memory_with_one_warning covers it)")
        monkeypatch.setenv("MINICOMP_CACHE_DIR", str(root))
        cache_mod._warned.discard(str(root))
        caught = _compile_two_graphs()
        assert len(caught) == 1 and "is not writable" in str(caught[0].message)
        assert not list(root.iterdir())
    finally:
        root.chmod(stat.S_IRWXU)


def test_unwritable_cache_still_uses_a_valid_entry_without_warning(tmp_path, monkeypatch):
    # an entry written earlier is read from a cache that can no longer be written
    root = tmp_path / "cache"
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(root))
    x = torch.randn(4, 6)
    fn = lambda t: torch.exp(t) - 1   # noqa: E731
    first = minicomp.compile(fn)
    first(x)
    path = first.compile_for(x).call.path
    assert path is not None and path.exists()
    def no_mkdir(self, *args, **kwargs):        # any write would need the directory first
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "mkdir", no_mkdir)
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: no_mkdir(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = minicomp.compile(fn)
        torch.testing.assert_close(again(x), fn(x))
    assert again.compile_for(x).call.path == path

"""atomic's publishing primitives (publish_file, copy_atomic, publish_dir): the old file or folder stays whole
until the new one is complete, an error leaves nothing behind, and a run killed with SIGKILL leaves only an
owned temporary that the next run's clean_stale removes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit.base import atomic
from toolkit.base.atomic import clean_stale, copy_atomic, publish_dir, publish_file


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_publish_file_replaces_only_when_the_body_finishes(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(ValueError):
        with publish_file(target) as staged:
            staged.write_bytes(b"half")
            assert target.read_bytes() == b"old"
            raise ValueError("a hash check failed")
    assert target.read_bytes() == b"old" and names(tmp_path) == ["out.bin"]
    with publish_file(target, 0o640) as staged:
        staged.write_bytes(b"new")
    assert target.read_bytes() == b"new" and names(tmp_path) == ["out.bin"]
    assert target.stat().st_mode & 0o777 == 0o640


def test_publish_file_makes_the_folder(tmp_path):
    with publish_file(tmp_path / "a" / "b" / "f.txt") as staged:
        staged.write_text("x")
    assert (tmp_path / "a" / "b" / "f.txt").read_text() == "x"


def test_copy_atomic_keeps_data_and_mode(tmp_path):
    source = tmp_path / "src" / "tool.sh"
    source.parent.mkdir()
    source.write_bytes(os.urandom(3 * 2 ** 20))
    source.chmod(0o755)
    dest = tmp_path / "dest" / "tool.sh"
    copy_atomic(source, dest)
    assert dest.read_bytes() == source.read_bytes() and dest.stat().st_mode & 0o777 == 0o755
    assert names(dest.parent) == ["tool.sh"]


def test_a_killed_copy_leaves_the_old_file_and_a_temporary_the_next_run_removes(tmp_path):
    """A real SIGKILL in the middle of a copy (the process kills itself after half the bytes)."""
    dest = tmp_path / "wheel.whl"
    dest.write_bytes(b"old wheel")
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from toolkit.base.atomic import publish_file
        with publish_file(Path({str(dest)!r})) as staged:
            with open(staged, "wb") as out:
                out.write(b"x" * 2 ** 20)
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(atomic.__file__).parents[1])
    assert done.returncode == -9
    assert dest.read_bytes() == b"old wheel"
    left = [n for n in names(tmp_path) if n != "wheel.whl"]
    assert len(left) == 2 and all(n.startswith(atomic.temp_name("wheel.whl")) for n in left)
    removed = clean_stale(tmp_path)
    assert len(removed) == 1 and names(tmp_path) == ["wheel.whl"]


@pytest.mark.parametrize("exchange_works", [True, False])
def test_publish_dir_swaps_the_whole_tree(tmp_path, monkeypatch, exchange_works):
    if not exchange_works:  # a filesystem without renameat2 RENAME_EXCHANGE (NFS): the two-rename path
        monkeypatch.setattr(atomic, "exchange", lambda new, old: False)
    target = tmp_path / "simple"
    with publish_dir(target) as staged:  # first publish: nothing to replace
        (staged / "old.html").write_text("old")
    with publish_dir(target) as staged:
        (staged / "index.html").write_text("new")
        assert names(target) == ["old.html"]
    assert names(target) == ["index.html"] and names(tmp_path) == ["simple"]


def test_publish_dir_keeps_the_old_tree_on_error(tmp_path):
    target = tmp_path / "part1"
    target.mkdir()
    (target / "kept").write_text("k")
    with pytest.raises(KeyboardInterrupt):
        with publish_dir(target) as staged:
            (staged / "new").write_text("n")
            raise KeyboardInterrupt
    assert names(target) == ["kept"] and names(tmp_path) == ["part1"]


def test_another_runs_cleanup_at_the_moment_a_temporary_is_made_leaves_it_owned(tmp_path, monkeypatch):
    """clean_stale of another run, called just before owned_temp locks its owner file (here: from the flock
    call itself), finds no unlocked owner of this live run to delete: the temporary stays owned, and a later
    cleanup keeps it while the run lives."""
    real_flock, raced = atomic.fcntl.flock, []

    def cleanup_first(handle, operation):
        monkeypatch.setattr(atomic.fcntl, "flock", real_flock)  # once: clean_stale's own flock calls are real
        raced.append(clean_stale(tmp_path))
        return real_flock(handle, operation)

    monkeypatch.setattr(atomic.fcntl, "flock", cleanup_first)
    with atomic.owned_dir(tmp_path, "race") as folder:
        owner = folder.with_name(folder.name + atomic.OWNER_SUFFIX)
        assert raced == [[]] and owner.is_file()
        assert clean_stale(tmp_path) == [] and folder.is_dir() and owner.is_file()
    assert names(tmp_path) == []

"""Hostile lock files (toolkit/base/fslock.py): whatever lies at `<entry>.lock` is a user's folder's neighbour.

A FIFO there hung `install` and `fa4 cache-install` in open(); a dangling symlink made them create the file
it points to, outside; a refused attempt left its `<dest>.lock` behind. Each case runs under a SIGALRM
limit, so a hang fails the test instead of the suite. `install` is tested end to end in
test_hostile_lock_install.py; here the lock itself and `fa4 cache-install`'s unpack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_fa4_jit_cache_install import FP, KEY, A, artifact, entry
from test_hostile_spec import bounded

from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import held_if_free, lock_file_for, locked
from toolkit.fa4 import jit as fa4_jit


def make(kind: str, lock: Path, outside: Path) -> None:
    """Put a `kind` at `lock`; `outside` is where a followed symlink would lead."""
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()
    else:
        outside.parent.mkdir(exist_ok=True)
        if kind == "symlink to a file":
            outside.write_text("precious")
        lock.symlink_to(outside)


KINDS = ["fifo", "dangling symlink", "symlink to a file", "folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    entry_path, outside = tmp_path / "cache" / "entry", tmp_path / "elsewhere" / "target"
    entry_path.parent.mkdir()
    make(kind, tmp_path / "cache" / "entry.lock", outside)
    with bounded(), pytest.raises(ToolkitError) as caught:
        with locked(entry_path):
            pytest.fail("the body ran")
    message = str(caught.value)
    assert "\n" not in message and "entry.lock: is a" in message and "not a lock file" in message
    assert not outside.exists() or outside.read_text() == "precious"


def test_a_failed_attempt_removes_only_the_lock_file_it_created(tmp_path):
    entry_path = tmp_path / "entry"
    with pytest.raises(ToolkitError), locked(entry_path):
        raise ToolkitError("refused")
    assert not (tmp_path / "entry.lock").exists()
    with locked(entry_path):  # a success keeps it, as before: the next job locks the same file
        pass
    assert (tmp_path / "entry.lock").is_file()
    with pytest.raises(ToolkitError), locked(entry_path):
        raise ToolkitError("refused")
    assert (tmp_path / "entry.lock").is_file()  # not this attempt's to remove


def test_a_waiter_on_a_removed_lock_file_locks_the_one_named_now(tmp_path, monkeypatch):
    """A waiter blocked on the file a failed attempt then removes must not go on holding a lock on a file
    no name leads to (a third job would lock a new one beside it): it locks the file named now."""
    import toolkit.base.fslock as fslock

    entry_path, lock = tmp_path / "entry", tmp_path / "entry.lock"
    blocking, real_flock = threading.Event(), fslock.fcntl.flock
    holds_the_named_file: list[bool] = []

    def flock(fd: int, operation: int) -> None:
        if operation == fslock.fcntl.LOCK_EX:  # the waiting call
            blocking.set()
        real_flock(fd, operation)

    def wait_then_hold() -> None:
        with locked(entry_path):
            holds_the_named_file.append(lock.is_file())

    monkeypatch.setattr(fslock.fcntl, "flock", flock)
    waiter = threading.Thread(target=wait_then_hold)
    with pytest.raises(ToolkitError), locked(entry_path):
        waiter.start()
        assert blocking.wait(timeout=10)
        time.sleep(0.2)  # into the flock call
        raise ToolkitError("refused")
    waiter.join(timeout=10)
    assert holds_the_named_file == [True]


@pytest.mark.parametrize("kind", KINDS)
def test_cache_install_refuses_a_dest_lock_that_is_not_a_regular_file(tmp_path, kind):
    dest, outside = tmp_path / "dest", tmp_path / "elsewhere" / "target"
    make(kind, tmp_path / "dest.lock", outside)
    record = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o")])
    with bounded(), pytest.raises(ToolkitError) as caught:
        fa4_jit.unpack(record, KEY, dest)
    assert "dest.lock: is a" in str(caught.value) and "\n" not in str(caught.value)
    assert not dest.exists() and (not outside.exists() or outside.read_text() == "precious")


def test_a_refused_cache_install_leaves_no_dest_lock(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    record = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o")])
    with pytest.raises(ToolkitError, match="holds files no cache-install wrote"):
        fa4_jit.unpack(record, KEY, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "wh"]


SHARED_HOLDER = """
import sys, time
from pathlib import Path
from toolkit.base.fslock import locked
with locked(Path(sys.argv[1]), shared=True):
    print("held", flush=True)
    time.sleep(60)
"""


def test_shared_holders_hold_together_and_keep_out_an_exclusive_one(tmp_path, capsys):
    """locked(shared=True): a second shared holder takes it at once (no wait said), an exclusive one finds it
    taken; a shared holder whose body fails leaves the lock file (another may hold it)."""
    entry = tmp_path / "in-use"
    holder = subprocess.Popen([sys.executable, "-c", SHARED_HOLDER, str(entry)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        assert holder.stdout.readline() == "held\n"
        with locked(entry, shared=True):
            with held_if_free(entry) as free:
                assert free is False
        assert "waiting" not in capsys.readouterr().err
        with pytest.raises(RuntimeError), locked(tmp_path / "other", shared=True):
            raise RuntimeError("the body failed")
        assert lock_file_for(tmp_path / "other").exists()
    finally:
        holder.kill()
        holder.communicate()
    with held_if_free(entry) as free:
        assert free is True

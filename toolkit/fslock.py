"""File locks for shared caches: two jobs (on one node or on many) never write one cache entry at once.

`with locked(entry):` holds an exclusive flock(2) on `<entry>.lock`, a file next to the entry (the
entry itself may be a directory that does not exist yet). flock is what util-linux `flock(1)` uses,
so a batch script's `flock FILE cmd` and this lock exclude each other. On a shared filesystem the
lock needs one that supports flock (NFSv4, Lustre with `flock` mounted, GPFS, BeeGFS do).
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.paths import display_path


def lock_file_for(entry: Path) -> Path:
    """The lock file that guards `entry`: `<entry>.lock` beside it."""
    entry = Path(entry)
    return entry.with_name(entry.name + ".lock")


@contextmanager
def locked(entry: Path) -> Iterator[Path]:
    """Hold the exclusive lock on `entry` for the body; waits (saying so once) while another holder has it."""
    lock_file = lock_file_for(entry)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_file, "a")
    except OSError as exc:
        raise ToolkitError(f"{display_path(lock_file)}: cannot create the lock file ({exc.strerror}; "
                           "make the cache directory writable)") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {display_path(lock_file)} (another job is writing {display_path(Path(entry))})",
                  file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield lock_file
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

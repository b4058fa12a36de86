"""File locks for shared caches: two jobs (on one node or on many) never write one cache entry at once.

`with locked(entry):` holds an exclusive flock(2) on `<entry>.lock`, a file next to the entry (the
entry itself may be a directory that does not exist yet). flock is what util-linux `flock(1)` uses,
so a batch script's `flock FILE cmd` and this lock exclude each other. On a shared filesystem the
lock needs one that supports flock (NFSv4, Lustre with `flock` mounted, GPFS, BeeGFS do).

The lock file's name comes from a user's folder argument, so whatever lies there is not trusted: it is
opened with O_NOFOLLOW | O_NONBLOCK (a symlink, dangling or not, is never followed to create a file
elsewhere; a FIFO never blocks the open) and used only if it is a regular file. An attempt whose body
fails removes the lock file if it created it, so a refused run leaves nothing beside the user's folder;
a holder therefore checks, once it has the lock, that the name still leads to the file it locked (a
shell's `flock FILE` does not: one that opened the file just before such a removal holds a lock no later
toolkit job sees, a race only with a refused attempt that found no lock file there).
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path

OPEN_FLAGS = (
    os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)  # RDWR: NFS emulates flock with write locks


def lock_file_for(entry: Path) -> Path:
    """The lock file that guards `entry`: `<entry>.lock` beside it."""
    entry = Path(entry)
    return entry.with_name(entry.name + ".lock")


@contextmanager
def locked(entry: Path, shared: bool = False) -> Iterator[Path]:
    """Hold the exclusive lock on `entry` for the body (`shared`: a shared one, which excludes only an exclusive
    holder); waits (saying so once) while another holder has it."""
    lock_file = lock_file_for(entry)
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    said = False
    while True:
        fd, created = _open(lock_file)
        try:
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said:
                    print(
                        f"waiting for {display_path(lock_file)} (another job is "
                        f"{'removing' if shared else 'writing'} {display_path(Path(entry))})",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                fcntl.flock(fd, operation)
            if _still_named(fd, lock_file):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a failed attempt removed the file this one waited on: lock the one there now
    try:
        yield lock_file
    except BaseException:
        if created and not shared:  # a shared lock's file: another holder may hold it too
            lock_file.unlink(
                missing_ok=True
            )  # before the unlock: a waiter then finds the name gone
        raise
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def held_if_free(entry: Path) -> Iterator[bool]:
    """The lock on `entry` for the body if nobody holds it now (True), without waiting; False while another
    holder has it. For removing what a live job may be using: only what nobody holds."""
    lock_file = lock_file_for(entry)
    fd, _ = _open(lock_file)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield _still_named(fd, lock_file)
    finally:
        os.close(fd)


def _open(lock_file: Path) -> tuple[int, bool]:
    """An open descriptor of the lock file, creating it if absent; (fd, whether this call created it)."""
    where = display_path(lock_file)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolkitError(
            f"{where}: cannot create the lock file ({exc.strerror}; "
            "make the cache directory writable)"
        ) from None
    while True:
        try:
            return os.open(lock_file, OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o666), True
        except FileExistsError:
            pass  # O_EXCL: also what a symlink there, dangling or not, gives
        except OSError as exc:
            raise ToolkitError(
                f"{where}: cannot create the lock file ({exc.strerror}; "
                "make the cache directory writable)"
            ) from None
        try:
            _refuse_unless_regular(os.lstat(lock_file).st_mode, where)  # a device is never opened
            fd = os.open(lock_file, OPEN_FLAGS)
        except FileNotFoundError:
            continue  # removed since: create it
        except OSError as exc:
            raise ToolkitError(
                f"{where}: cannot open the lock file ({exc.strerror}; make it writable, "
                "or remove it if no job is running)"
            ) from None
        try:
            _refuse_unless_regular(
                os.fstat(fd).st_mode, where
            )  # replaced between the lstat and the open
        except ToolkitError:
            os.close(fd)
            raise
        return fd, False


def _refuse_unless_regular(mode: int, where: str) -> None:
    """A symlink, FIFO, device or folder where a lock file belongs was not made by the toolkit: refuse."""
    if stat.S_ISREG(mode):
        return
    kind = (
        "a symlink"
        if stat.S_ISLNK(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a folder"
        if stat.S_ISDIR(mode)
        else "a device or socket"
    )
    raise ToolkitError(
        f"{where}: is {kind}, not a lock file; nothing was changed (remove it, or choose "
        f"another folder)"
    )


def _still_named(fd: int, lock_file: Path) -> bool:
    """Whether `lock_file` still names the file open at fd."""
    try:
        named = os.stat(lock_file, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

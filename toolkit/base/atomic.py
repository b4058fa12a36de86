"""Whole-or-nothing file writes: every artifact the toolkit leaves is complete or absent.

Readers (a `module avail`, sbatch, pip reading an index, a person opening a report) see the old file
or the new one, never half of one, and an interrupted write leaves no partial file behind.

Temporaries (staging environments, partial downloads, draft locks, worker folders) are named
`.fa-envkit-tmp-<tag>-<pid>-<random>` and each has an owner file beside it, `<name>.owner`, on which
the creating process holds an flock(2) while it lives. A later run removes a temporary only when its
owner file is there and unlocked (its process is gone, even if killed with SIGKILL), so it never
deletes what a live run is writing, nor anything it did not name itself.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from toolkit.base.errors import ToolkitError

TEMP_PREFIX = ".fa-envkit-tmp-"
OWNER_SUFFIX = ".owner"


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write through an owned temporary file in the same folder, then rename it over `path`."""
    with publish_file(path, mode) as temporary:
        with open(temporary, "xb") as out:
            out.write(data.encode() if isinstance(data, str) else data)


@contextmanager
def publish_file(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside `path` for the body to create the file at (write, copy, download, tar); when
    the body ends without error it is renamed over `path` (with `mode`, if given), else removed.

    The body may check what it made (a hash) and raise to keep the old `path`; readers see the old file or
    the new one, and a killed run leaves only an owned temporary that clean_stale removes."""
    path = Path(path)
    with owned_temp(path.parent, path.name) as temporary:
        yield temporary
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)


def copy_atomic(source: Path, dest: Path) -> None:
    """Copy a file (data, mode, times) to `dest` through publish_file: on another filesystem a rename cannot
    move it, and a plain copy would show a half-copied file to readers and after an interruption."""
    with publish_file(dest) as temporary:
        shutil.copy2(source, temporary)


@contextmanager
def publish_dir(path: Path) -> Iterator[Path]:
    """A fresh owned folder beside `path` for the body to fill; when the body ends without error it
    replaces `path` in one step where the filesystem can (exchange), else by two renames, and the old tree
    is removed. On an error or interruption `path` is left as it was."""
    path = Path(path)
    with owned_dir(path.parent, path.name) as staged:
        yield staged
        if path.exists() and exchange(staged, path):  # the old tree leaves with `staged`
            return
        with owned_temp(path.parent, f"{path.name}-old") as old:
            if path.exists():
                os.replace(path, old)
            os.replace(staged, path)


# ---------------------------------------------------------------- owned temporaries


@contextmanager
def owned_temp(parent: Path, tag: str) -> Iterator[Path]:
    """A fresh temporary path in `parent` (not created: make it a file or a folder), removed on exit.

    The owner file is created and locked before the path can exist and removed after it is gone, so
    every temporary on disk has a locked owner while its run lives."""
    parent = Path(parent)
    path = parent / f"{temp_name(tag)}{os.getpid()}-{os.urandom(4).hex()}"  # secrets.token_hex(4)'s
    owner = path.with_name(path.name + OWNER_SUFFIX)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        handle = _locked_owner(owner)
    except OSError as exc:
        raise ToolkitError(
            f"{parent}: cannot write a temporary file here ({exc.strerror}; make it writable "
            f"or point the toolkit elsewhere)"
        ) from None
    try:
        try:
            yield path
        finally:
            remove_path(path)
            owner.unlink(missing_ok=True)
    finally:
        handle.close()


def _locked_owner(owner: Path) -> IO[str]:
    """The owner file, locked before it has its name: made as `<owner>.new`, a name clean_stale never looks at,
    locked, then renamed. Made under its own name, it would be unlocked for a moment, and another run's
    clean_stale could take that moment for a dead run's and delete a live run's owner file."""
    pending = owner.with_name(owner.name + ".new")
    handle = open(pending, "x")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (
            OSError
        ):  # a filesystem without flock: the run works; a rerun then never removes this one
            pass
        os.rename(pending, owner)
    except BaseException:
        handle.close()
        pending.unlink(missing_ok=True)
        raise
    return handle


@contextmanager
def owned_dir(parent: Path, tag: str) -> Iterator[Path]:
    """owned_temp, created as a folder with the umask's mode (tempfile.mkdtemp would make it 0700)."""
    with owned_temp(parent, tag) as path:
        path.mkdir()
        yield path


@contextmanager
def run_temporaries(tag: str) -> Iterator[Path]:
    """One owned folder in the temporary directory for everything a verb's run and its children make
    there (tempfile and $TMPDIR point into it, so libraries' and pip's temporaries too): removed when
    the run ends, and by a later run (clean_stale) if it was killed."""
    real = Path(tempfile.gettempdir())
    clean_stale(real)
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    with owned_dir(real, tag) as folder:
        os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
        try:
            yield folder
        finally:
            tempfile.tempdir = saved_tempdir
            if saved_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_env


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def temp_name(tag: str) -> str:
    """The name prefix of `tag`'s temporaries (before -<pid>-<random>)."""
    return TEMP_PREFIX + "".join(c if c.isalnum() or c in "._-" else "_" for c in tag)[:60] + "-"


def clean_stale(parent: Path, recover: Callable[[Path], bool] | None = None) -> list[Path]:
    """Remove the temporaries in `parent` whose owner process is gone; returns what was removed.

    `recover(entry)`, if given, runs first on each (with the owner lock held) to move back what a
    killed run had set aside (install's retired environment); it returns whether to remove the entry."""
    removed: list[Path] = []
    parent = Path(parent)
    if not parent.is_dir():
        return removed
    for owner in parent.glob(f"{TEMP_PREFIX}*{OWNER_SUFFIX}"):
        try:
            handle = open(owner)
        except OSError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its run is alive
            entry = owner.with_name(owner.name[: -len(OWNER_SUFFIX)])
            if recover is not None and not recover(entry):
                continue
            remove_path(entry)
            owner.unlink(missing_ok=True)
            removed.append(entry)
    return removed


# ---------------------------------------------------------------- swapping a folder into place

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def exchange(new: Path, old: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE): a reader of `old` sees the old
    tree or the new one, never nothing, even if the process is killed. False where unsupported."""
    import ctypes  # here: only a swap needs it

    # libc, linked in (as base/children's prctl): find_library runs ldconfig
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(new), AT_FDCWD, os.fsencode(old), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (
        errno.EINVAL,
        errno.ENOSYS,
        errno.EOPNOTSUPP,
    ):  # filesystem (e.g. NFS) or kernel lacks it
        return False
    raise OSError(code, os.strerror(code), str(old))


# ---------------------------------------------------------------- interruptions


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same cleanup runs (exit 143 instead of 130)."""


@contextmanager
def terminate_like_interrupt(
    announce: Callable[[KeyboardInterrupt], None] | None = None,
) -> Iterator[None]:
    """For the body, SIGTERM (Slurm's scancel, `kill`) unwinds the stack like Ctrl-C instead of killing
    mid-write. A second SIGTERM during the cleanup is ignored so the cleanup finishes.

    `announce(exc)`, if given, runs in the signal handler, before the unwinding (and Ctrl-C gets the same
    handler): removing what the run made can take as long as deleting a 6 GB environment does, and the user
    who pressed Ctrl-C is answered at once, not after it."""

    def handler(signum: int, frame: object) -> None:
        exc = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        if signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if announce is not None:
            announce(exc)
        raise exc

    if (
        threading.current_thread() is not threading.main_thread()
    ):  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    # Ctrl-C only where Python's own handler is set (not where it was ignored, as for a background job)
    previous_int = (
        signal.signal(signal.SIGINT, handler)
        if announce is not None and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        else None
    )
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


PAUSE_AT = "FA_ENVKIT_PAUSE_AT"
PAUSE_FILE = "FA_ENVKIT_PAUSE_FILE"


def checkpoint(phase: str) -> None:
    """Test hook: with FA_ENVKIT_PAUSE_AT=<phase>, create FA_ENVKIT_PAUSE_FILE and wait here, so the
    hostile-input suite can send a real signal at a known phase (install:download, lock:write, ...)."""
    if os.environ.get(PAUSE_AT) != phase:
        return
    Path(os.environ[PAUSE_FILE]).write_text(f"{os.getpid()}\n")
    time.sleep(60)

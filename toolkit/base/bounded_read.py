"""Reading a file a user names without letting it block or flood memory: one owner for the spec loader's
YAML and jsonfile's JSON. A FIFO or a device named x.yaml / x.json must never block or be read, and
/dev/zero or a sparse 8 GiB file must be refused after `limit` + 1 bytes."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Literal

FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class Unreadable(Exception):
    """Why a file was not read; each reader words it in its own one-line error. `detail`: the OS's reason
    for "error", the file's kind for "special"."""

    def __init__(self, why: Literal["missing", "error", "special", "large"], detail: str = ""):
        super().__init__(why, detail)
        self.why, self.detail = why, detail

    def reason(self, limit: int) -> str:
        """Why, in the words every reader's one-line error uses (`limit`: the size it was read with)."""
        return {
            "missing": "file not found",
            "error": self.detail,
            "special": f"{self.detail}, not a regular file",
            "large": f"larger than {limit:,} bytes",
        }[self.why]


def open_regular(path: Path, follow_symlinks: bool = True) -> int:
    """A descriptor of a regular file, opened with O_NONBLOCK (a FIFO never blocks) and checked with fstat
    before any read; with follow_symlinks=False a symlink is refused itself ("special", "a symlink"), so what
    is read is the file that was named."""
    flags = (
        os.O_RDONLY
        | os.O_NONBLOCK
        | os.O_NOCTTY
        | os.O_CLOEXEC
        | (0 if follow_symlinks else os.O_NOFOLLOW)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Unreadable("missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise Unreadable("special", "a symlink") from None
        raise Unreadable("error", os.strerror(exc.errno or 0)) from None
    try:
        mode = os.fstat(
            fd
        ).st_mode  # before open(): Python's file object refuses a directory itself
        if not stat.S_ISREG(mode):
            raise Unreadable("special", FILE_KINDS.get(stat.S_IFMT(mode), "not a file"))
    except BaseException:
        os.close(fd)
        raise
    return fd


def regular_file_bytes(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file (open_regular); a larger file is refused after limit + 1 bytes."""
    fd = open_regular(path)
    try:
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise Unreadable("error", os.strerror(exc.errno or 0)) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unreadable("large")
    return data

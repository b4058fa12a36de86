"""How the toolkit names paths to its users: one helper every stage prints paths through."""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.base.errors import ToolkitError


def printable(text: str) -> str:
    """Text with every unprintable character escaped, so that it cannot end or colour a one-line message. (Checked
    whole first: most text has none, and a warm install names each of its archives, for messages it may need.)"""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def display_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it, as the user named it (symlinks not
    followed: a symlink loop must not raise), with unprintable characters in file names escaped."""
    absolute = Path(os.path.abspath(path))
    try:
        return printable(str(absolute.relative_to(os.getcwd())))
    except ValueError:
        return printable(str(path))


def plain_path(value: str) -> bool:
    """An absolute path with no control character and no os.pathsep: one PYTHONPATH entry, one line."""
    return (
        value.startswith("/") and os.pathsep not in value and all(ch.isprintable() for ch in value)
    )


def folder_argument(path: Path, option: str) -> Path:
    """`path` as an absolute folder to fill: a folder, or nothing yet; never a file or a symlink. Its absolute
    form must be a plain path: the folder ends up in PYTHONPATH and NAME=VALUE lines, where a `:` would add an
    entry (another folder's code) and a newline a line."""
    absolute = path.absolute()
    if not plain_path(str(absolute)):
        raise ToolkitError(
            f"{option} {str(absolute)!r}: holds {os.pathsep!r} or a control character "
            f"(pass a plain folder path)"
        )
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ToolkitError(
            f"{option} {display_path(path)}: not a folder (pass a folder, or a path that does not "
            f"exist yet)"
        )
    return absolute


def tree_bytes(folder: Path) -> int:
    """The bytes of the files below `folder` (their sizes, symbolic links not followed, a file that goes while it
    is walked skipped; 0 for no folder): what removing it frees, hard links to files elsewhere aside."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total

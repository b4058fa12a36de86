"""How the toolkit names paths to its users: one helper every stage prints paths through."""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.errors import ToolkitError


def printable(text: str) -> str:
    """Text with every unprintable character escaped, so that it cannot end or colour a one-line message."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def display_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it, as the user named it (symlinks not
    followed: a symlink loop must not raise), with unprintable characters in file names escaped."""
    absolute = Path(os.path.abspath(path))
    try:
        return printable(str(absolute.relative_to(os.getcwd())))
    except ValueError:
        return printable(str(path))


def folder_argument(path: Path, option: str) -> Path:
    """`path` as an absolute folder to fill: a folder, or nothing yet; never a file or a symlink."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ToolkitError(f"{option} {display_path(path)}: not a folder (pass a folder, or a path that does not "
                           f"exist yet)")
    return path.absolute()

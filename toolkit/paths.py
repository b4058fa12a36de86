"""How the toolkit names paths to its users: one helper every stage prints paths through."""

from __future__ import annotations

import os
from pathlib import Path


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

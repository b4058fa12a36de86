"""How the toolkit names paths to its users: one helper every stage prints paths through."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # not below cwd; unresolvable (a symlink loop)
        return str(path)

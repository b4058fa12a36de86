"""What runs below a test's process, read while it changes: a child listed by psutil may end before its name is
read (psutil's NoSuchProcess), which is the build going on, not a failure of the test."""

from __future__ import annotations

import psutil


def names(processes: list[psutil.Process]) -> set[str]:
    """The names of those still running when asked."""
    found = set()
    for process in processes:
        try:
            found.add(process.name())
        except psutil.NoSuchProcess:
            pass
    return found


def names_below(pid: int) -> set[str]:
    """The names of every process below pid (none once pid itself has ended)."""
    try:
        return names(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return set()

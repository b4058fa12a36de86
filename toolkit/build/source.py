"""What one `toolkit build` compiles, behind one interface (WheelSource), so every implementation's wheel goes
through the same sizing, progress, schedule, checks, record, cache and wheelhouse (builder.build). Each
implementation is one module beside this one, named in builder.WHEEL_SOURCES.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace
from toolkit.env.lockfile import LockedSdist
from toolkit.knowledge.object_costs import CostKey


@dataclass(frozen=True)
class SourceTree:
    """A source unpacked in the build folder: where pip builds it and what its wheel must hold."""

    project_dir: Path  # where `pip wheel` runs (the source's root, or the folder of its setup.py)
    epoch: int  # SOURCE_DATE_EPOCH: the newest file time
    pin: LockedSdist  # the archive the record names and an earlier build's times are matched by
    wheel_archs: tuple[str, ...]  # archs the wheel's .so files must hold
    files: dict[str, str]  # the files it came from, as display paths, for the record
    source_root: Path  # the unpacked source's top: object costs' paths start here
    costs_key: CostKey  # what the knowledge's object costs of this source are looked up by (a first build's order)
    environment: dict[str, str] = field(
        default_factory=dict
    )  # variables on top of builder.build_environment
    imports: tuple[
        str, ...
    ] = ()  # modules imported after the install, besides the top-level extensions
    patches: list[dict[str, Any]] = field(default_factory=list)
    record_section: dict[str, Any] = field(
        default_factory=dict
    )  # the record's section of this implementation
    after_install: Callable[[str, Path], None] | None = (
        None  # (python, log): a step after the wheel's install
    )
    check_wheel: Callable[[Path], None] | None = (
        None  # a refusal of the built wheel beyond the shared checks
    )


class WheelSource(Protocol):
    """One kind of wheel `toolkit build` makes; the steps in the order builder.build takes them."""

    label: str  # what is built, in messages

    def line_dir(self, workspace: Workspace) -> Path: ...

    def key_inputs(self) -> dict[str, Any]:
        """What keys the wheel cache besides the line and the machine: read before anything is fetched."""
        ...

    def threads_per_object(self, archs: tuple[str, ...]) -> int:
        """The -gencode targets of one object, which nvcc can compile side by side."""
        ...

    def fetch(self, cache: Path) -> None:
        """Have every pinned file in the cache, checked (after the preflight passed)."""
        ...

    def unpack(self, build_dir: Path, archs: tuple[str, ...]) -> SourceTree: ...


class UnreadableArchive(ToolkitError):
    """The archive itself is at fault (no tar, cut short, more than one top folder, a member the data filter
    refuses), not the folder it is unpacked into: a cache may remove it."""


def extract_sdist(
    sdist: Path, dest: Path, kind: str = "an sdist", fix: str = "re-lock"
) -> tuple[Path, int]:
    """Unpack into dest; returns the source tree and its newest file time (the SOURCE_DATE_EPOCH). An archive
    that is no tar or is cut short is one UnreadableArchive line ending in `fix`."""
    where = display_path(sdist)
    try:
        with tarfile.open(sdist) as tar:
            members = tar.getmembers()
            tops = {m.name.split("/")[0] for m in members}
            if len(tops) != 1:
                raise UnreadableArchive(
                    f"{where}: not {kind} (expected one top directory, found {len(tops)}; {fix})"
                )
            try:
                tar.extractall(dest, filter="data")
            except (
                OSError
            ) as exc:  # writing dest (a read error of the archive is a TarError or EOFError)
                raise ToolkitError(
                    f"{display_path(dest)}: cannot unpack {where} here ({exc.strerror or exc}; "
                    f"free space there or make it writable)"
                ) from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UnreadableArchive(
            f"{where}: cannot unpack {kind} ({_unreadable(exc)}; {fix})"
        ) from None
    return dest / tops.pop(), int(max(m.mtime for m in members))


def _unreadable(exc: BaseException) -> str:
    """Why an archive cannot be unpacked, in one line: tarfile's "could not be opened" puts each compression it
    tried on a line of its own, and gzip's EOFError (a file cut short) says nothing of the file."""
    if isinstance(exc, EOFError):
        return "it ends early: a truncated download or copy"
    if isinstance(exc, tarfile.ReadError) and "\n" in str(exc):
        return "not a tar archive, neither plain nor gzip, bzip2 or xz compressed"
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def settle_times(tree: Path, epoch: int) -> None:
    """Give every file changed after unpacking (a patch) the archive's newest time, as the unchanged ones have
    theirs: a source unpacked again is then never newer than the objects built from it (build_dirs.py)."""
    for root, _, files in os.walk(tree):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path) and os.stat(path).st_mtime > epoch:
                os.utime(path, (epoch, epoch))

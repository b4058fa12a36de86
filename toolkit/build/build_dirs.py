"""The build folders of `toolkit build`: <cache>/build/<inputs key>/, kept when a build stops, so that the next
build of the same inputs continues from its finished objects.

The folder is named by the build's inputs key (wheelhouse.inputs_key), so a build of other inputs never looks
into it. A build holds `<key>.lock` (toolkit/base/fslock.py) while it uses the folder: a second build of the same
inputs waits, and nothing removes a folder a live build holds. A successful build removes its folder (with
--keep-build-dir it stays); one that was interrupted (Ctrl-C, SIGTERM, SIGKILL, a node lost) or failed leaves it.
At the start of every build, folders unused for MAX_AGE_DAYS go, then the least recently used beyond
DISK_BUDGET_GB in all; only folders named by a key, never anything else in the cache.

Resuming: the source is unpacked afresh every time (its files get the archive's times, older than every
object) and the interrupted build's setup.py build tree (<project>/build: ninja's objects, .ninja_log and
.ninja_deps) is moved back into it at the same path, so ninja finds the finished objects up to date and
compiles only the rest, with the same commands (the folder's path is in them): the objects and so the wheel
are the bytes an uninterrupted build makes. nvcc's thread count is part of every compile command, so a resumed
build keeps the interrupted one's (BuildState).

The compile slot: a build that compiles through the compile cache moves its folder, for as long as it uses it, to
one fixed path, <cache>/build/compiling (`compile_slot`), and back after. nvcc hands cicc and cudafe++ the
source's absolute path (`--orig_src_path_name`, absolute even for a relative source), and sccache 0.16 hashes
those arguments (its SCCACHE_BASEDIRS strips only preprocessed text): in the keyed folders, two lines that differ
only in their python would miss every PTX; at one path their kernels' compiles are the same commands. It is a
rename, not a symlink: setup.py writes build.ninja from its resolved working directory. One build holds the slot
at a time (`<slot>.lock`); one that finds it taken compiles in place. A marker inside names the keyed folder, so
that the folder of a build killed in the slot is put back by the next build (`put_back_slot`), before anything
else looks at the build folders. The wheel's bytes do not depend on the path (-ffile-prefix-map, the ninja shim).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.base.atomic import remove_path, write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import held_if_free, lock_file_for, locked
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import tree_bytes
from toolkit.build.source import SourceTree, WheelSource

KEY = re.compile(r"[0-9a-f]{64}")
MAX_AGE_DAYS = 14.0
DISK_BUDGET_GB = 20.0
STATE = "state.json"  # what the next build of these inputs needs to continue (BuildState)
KEPT = "kept-build"  # the setup.py build tree, set aside while the source is unpacked again
SCHEDULE = "schedule"  # the ninja shim's folder (builder.build): its object list serves the resumed estimate
SETUP_BUILD = (
    "build"  # setup.py's build base inside the project folder (build_temp: ninja's folder)
)
SLOT = "compiling"  # the one path every build compiling through the compile cache compiles at
SLOT_MARKER = "slot-of"  # inside a folder in the slot: the name of its keyed folder


@dataclass(frozen=True)
class BuildState:
    """Written once the source is unpacked: where its build tree lies and the compile commands' threads."""

    project_dir: str  # relative to the build folder
    nvcc_threads: int


@dataclass(frozen=True)
class BuildFolder:
    path: Path  # where the build uses it now: its keyed folder, or the compile slot
    previous: (
        BuildState | None
    )  # what an interrupted build of these inputs left (None: a fresh folder)
    home: Path | None = None  # its keyed folder, where it stays after the build (None: path)

    @property
    def kept_at(self) -> Path:
        """Where the folder lies once the build has ended (messages name it)."""
        return self.home or self.path

    def unpacked(
        self, source: WheelSource, archs: tuple[str, ...], nvcc_threads: int
    ) -> SourceTree:
        """The source unpacked afresh, with the interrupted build's setup.py build tree moved back into it."""
        kept = self.path / KEPT
        if self.previous is not None and not kept.exists():
            build = self.path / self.previous.project_dir / SETUP_BUILD
            if build.is_dir() and not build.is_symlink():
                os.replace(build, kept)
        for entry in self.path.iterdir():
            if entry.name not in (KEPT, SCHEDULE, SLOT_MARKER):
                remove_path(entry)
        tree = source.unpack(self.path, archs)
        project = tree.project_dir.relative_to(self.path).as_posix()
        if kept.is_dir():
            target = tree.project_dir / SETUP_BUILD
            remove_path(target)
            os.replace(kept, target)
        write_atomic(self.path / STATE, json.dumps(asdict(BuildState(project, nvcc_threads))))
        return tree


def read_state(folder: Path) -> BuildState | None:
    """The folder's BuildState; None for a folder without one (killed before it was written) or with one
    that is not the toolkit's (the folder then starts over)."""
    if not (folder / STATE).is_file():
        return None
    try:
        data = read_json(folder / STATE, "build folder state", "the build starts over")
        state = BuildState(str(data["project_dir"]), int(data["nvcc_threads"]))
    except (ToolkitError, KeyError, TypeError, ValueError):
        return None
    parts = Path(state.project_dir).parts
    if (
        not parts
        or Path(state.project_dir).is_absolute()
        or ".." in parts
        or state.nvcc_threads < 1
    ):
        return None
    return state


@contextmanager
def keyed_build_folder(parent: Path, key: str, fresh: bool, keep: bool) -> Iterator[BuildFolder]:
    """The build folder of these inputs, held for the body: what an interrupted build left in it (unless
    `fresh`), removed when the body ends without error unless `keep`, left for the next build otherwise."""
    if not KEY.fullmatch(key):
        raise ValueError(f"not an inputs key: {key!r}")
    folder = Path(parent) / key
    with locked(folder):
        if fresh:
            remove_path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # its last use, for prune()
        state = read_state(folder)
        yield BuildFolder(folder.absolute(), state)
        if not keep:
            remove_path(folder)
            lock_file_for(folder).unlink(
                missing_ok=True
            )  # a build waiting on it locks a new one (fslock)


def put_back_slot(parent: Path) -> Path | None:
    """The folder a killed build left in the compile slot, moved back to its keyed folder, unless a live build
    holds the slot; the folder put back (None: nothing to put back)."""
    slot = Path(parent) / SLOT
    with held_if_free(slot) as free:
        return _put_back(slot) if free else None


def _put_back(slot: Path) -> Path | None:
    """With the slot's lock held: what lies there back in the keyed folder its marker names, or removed where
    it is not the toolkit's or a build of its inputs has started over meanwhile."""
    if not slot.exists() and not slot.is_symlink():
        return None
    try:
        key = regular_file_bytes(slot / SLOT_MARKER, 100).decode().strip()
    except (Unreadable, UnicodeDecodeError, NotADirectoryError):
        key = ""
    home = slot.parent / key
    if KEY.fullmatch(key) and slot.is_dir() and not slot.is_symlink():
        with held_if_free(home) as home_free:
            if home_free and not home.exists():
                os.replace(slot, home)
                return home
    remove_path(slot)
    return None


@contextmanager
def compile_slot(parent: Path, folder: BuildFolder) -> Iterator[BuildFolder]:
    """`folder` moved to the compile slot for the body and back to its keyed folder after, however the body
    ends; `folder` where it is when another build holds the slot."""
    slot = Path(parent) / SLOT
    with held_if_free(slot) as free:
        if not free:
            yield folder
            return
        _put_back(slot)  # what a build killed in the slot since this build's start left there
        write_atomic(folder.path / SLOT_MARKER, folder.path.name)
        os.replace(folder.path, slot)
        try:
            yield BuildFolder(slot.absolute(), folder.previous, folder.path)
        finally:
            os.replace(slot, folder.path)


def discard(folder: Path) -> bool:
    """Remove a kept build folder and its lock file unless a live build holds it; whether it is gone."""
    with held_if_free(folder) as free:
        if free:
            remove_path(folder)
            lock_file_for(folder).unlink(missing_ok=True)
        return free


def prune(
    parent: Path, in_use: str, max_age_days: float = MAX_AGE_DAYS, budget_gb: float = DISK_BUDGET_GB
) -> list[Path]:
    """Remove the kept build folders unused for max_age_days, then the least recently used while all of them
    (in_use's too, which stays) take more than budget_gb; never one a live build holds. Returns the removed."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    folders = [
        p for p in parent.iterdir() if KEY.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    ]
    used = {p: p.stat().st_mtime for p in folders}
    sizes = {p: tree_bytes(p) for p in folders}
    total = sum(sizes.values())
    removed = []
    for folder in sorted((p for p in folders if p.name != in_use), key=used.__getitem__):
        too_old = time.time() - used[folder] > max_age_days * 86400
        if (too_old or total > budget_gb * 1e9) and discard(folder):
            total -= sizes[folder]
            removed.append(folder)
    return removed

"""FA4's wheels on their way to a machine without an index: fetched (exact pins, sha256-checked), the one too
large to carry cut into parts with a manifest, joined again there (never over a file, never past the
manifest's size).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from toolkit.base import children
from toolkit.base.atomic import (
    clean_stale,
    owned_dir,
    publish_dir,
    publish_file,
    remove_path,
    write_atomic,
)
from toolkit.base.bounded_read import Unreadable, open_regular
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.knowledge.fa4_pins import KNOWLEDGE_FILE, Release, WheelPin

# The pinned wheels are built for one interpreter; pip download asks PyPI for exactly these tags.
DOWNLOAD_TAGS = (
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--abi",
    "abi3",
    "--abi",
    "none",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_24_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "any",
)


# Chunks of a wheel too large to carry (nvidia-cutlass-dsl-libs-cu13, ~88 MiB: 5 chunks): two fit one
# carry under CARRY_LIMIT, and the first beside the small wheels.
PART_BYTES = 20 * 2**20


def check_wheel(path: Path, pin: WheelPin) -> None:
    """The file is the pinned one (size, then sha256), or a one-line error naming it."""
    if not path.is_file():
        raise ToolkitError(
            f"{path}: missing (run scripts/fetch_fa4_wheels.sh, or carry the folder)"
        )
    if path.stat().st_size != pin.size or sha256_file(path) != pin.sha256:
        raise ToolkitError(
            f"{path}: does not match the pin in {KNOWLEDGE_FILE.name} (size {pin.size}, "
            f"sha256 {pin.sha256[:12]}...): delete it and fetch again"
        )


def fetch(
    rel: Release,
    cuda_major: str,
    dest: Path,
    pip: list[str] | None = None,
    leave_out: set[str] | frozenset[str] = frozenset(),
) -> list[Path]:
    """Download each pinned wheel from PyPI (exact version, --no-deps, binary only) and check its hash; a file
    named in `leave_out` is skipped (another release's carried folders hold it)."""
    pip = pip or [sys.executable, "-m", "pip"]
    dest.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)  # what a killed fetch left
    paths = []
    for pin in (p for p in rel.wheels_for(cuda_major) if p.file not in leave_out):
        path = dest / pin.file
        if not (
            path.is_file() and path.stat().st_size == pin.size and sha256_file(path) == pin.sha256
        ):
            with owned_dir(dest, "download") as scratch, publish_file(path) as staged:
                done = children.run_tied(
                    [
                        *pip,
                        "download",
                        "--quiet",
                        "--no-deps",
                        "--only-binary",
                        ":all:",
                        *DOWNLOAD_TAGS,
                        "--dest",
                        scratch,
                        f"{pin.name}=={pin.version}",
                    ],
                    capture_output=True,
                    text=True,
                )
                got = scratch / pin.file
                if done.returncode != 0 or not got.is_file():
                    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    raise ToolkitError(
                        f"pip download {pin.name}=={pin.version}: {tail} (is PyPI reachable?)"
                    )
                check_wheel(got, pin)
                got.rename(staged)
        paths.append(path)
    return paths


def split_file(path: Path, dest: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Cut a file too large to carry into numbered parts beside a manifest holding the whole file's hash."""
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(path, "rb") as handle:
        for index, block in enumerate(iter(lambda: handle.read(part_bytes), b"")):
            part = dest / f"{path.name}.part{index:03d}"
            write_atomic(part, block)
            parts.append(part)
    manifest = {
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": sha256_file(path),
        "parts": [p.name for p in parts],
    }
    write_atomic(dest / f"{path.name}.parts.json", json.dumps(manifest, indent=2) + "\n")
    return parts


@dataclass(frozen=True)
class Joined:
    """One file `fa4 join` writes into --dest: a carried wheel copied as it is, or a file put together from
    the parts its manifest lists. Every source was a regular file of the recorded size when planned."""

    name: str
    sources: tuple[Path, ...]
    size: int
    sha256: str | None  # the manifest's whole-file hash; None for a wheel copied as it is
    origin: Path  # the wheel or the manifest, for messages


def join_parts(manifest_path: Path, search: list[Path], dest: Path) -> Path:
    """Reassemble a split file from parts found in any of `search`; the whole file's sha256 must match."""
    item = parts_of(manifest_path, search)
    check_join([item], dest)
    return write_joined(item, dest)


def parts_of(manifest_path: Path, search: list[Path]) -> Joined:
    """What a parts manifest puts together, checked before anything is written: plain names, each part a
    regular file (no symlink, device or FIFO) found once in `search` and listed once (no two names of one
    file), and the parts' sizes adding up to the manifest's `size`."""
    fix = "split again with scripts/fetch_fa4_wheels.sh"
    manifest = read_json(manifest_path, "parts manifest", fix)
    where = display_path(manifest_path)
    try:
        names = [manifest["file"], *manifest["parts"]]
        if not (isinstance(manifest["sha256"], str) and len(manifest["sha256"]) == 64):
            raise ValueError("sha256")
        if (
            not isinstance(manifest["size"], int)
            or isinstance(manifest["size"], bool)
            or manifest["size"] < 0
        ):
            raise ValueError("size")
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolkitError(
            f"{where}: not a readable parts manifest ({type(exc).__name__}) ({fix})"
        ) from None
    if not all(isinstance(n, str) and _plain_name(n) for n in names):
        raise ToolkitError(f"{where}: file and part names must be plain file names (split again)")
    parts: list[tuple[Path, int]] = []
    seen: dict[tuple[int, int], str] = {}
    for name in manifest["parts"]:
        found = next((d / name for d in search if os.path.lexists(d / name)), None)
        if found is None:
            raise ToolkitError(
                f"{where}: part {name} is in none of {', '.join(map(display_path, search))} "
                f"(carry the other part folder too)"
            )
        info = _regular(found)
        if (info.st_dev, info.st_ino) in seen:
            raise ToolkitError(
                f"{where}: part {name} is the same file as part {seen[(info.st_dev, info.st_ino)]} "
                f"(listed twice, or a hard link; {fix})"
            )
        seen[(info.st_dev, info.st_ino)] = name
        parts.append((found, info.st_size))
    total = sum(size for _, size in parts)
    if total != manifest["size"]:
        raise ToolkitError(
            f"{where}: its parts hold {total:,} bytes, the manifest's size is {manifest['size']:,} "
            f"({fix})"
        )
    return Joined(
        manifest["file"], tuple(p for p, _ in parts), total, manifest["sha256"], manifest_path
    )


def carried_wheel(wheel: Path) -> Joined:
    """A wheel in a parts folder, copied as it is: a regular file under a plain name (a symlink is refused,
    not followed: it may name a private file or /dev/zero)."""
    if not _plain_name(wheel.name):
        raise ToolkitError(
            f"{display_path(wheel)}: a file name with a control character (rename it or fetch again)"
        )
    return Joined(wheel.name, (wheel,), _regular(wheel).st_size, None, wheel)


def _plain_name(name: str) -> bool:
    return name == Path(name).name and name not in ("", ".", "..") and name.isprintable()


def _open_regular(path: Path) -> int:
    """A descriptor of the regular file at `path`, the name itself not followed; a one-line error for a
    symlink, a device, a FIFO or a folder."""
    try:
        return open_regular(path, follow_symlinks=False)
    except Unreadable as exc:
        reason = exc.detail if exc.why != "missing" else "file not found"
        raise ToolkitError(
            f"{display_path(path)}: {reason}, not a regular file (carry the file itself: fetch "
            f"and split again)"
        ) from None


def _regular(path: Path) -> os.stat_result:
    fd = _open_regular(path)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def check_join(items: list[Joined], dest: Path) -> None:
    """Refuse, before anything is written, a join that would replace a file in `dest` by another content
    (an identical file is left as it is), write one name twice, or not fit on dest's filesystem."""
    names: dict[str, Path] = {}
    for item in items:
        if item.name in names:
            raise ToolkitError(
                f"{display_path(item.origin)}: {item.name} also comes from "
                f"{display_path(names[item.name])} (pass each part folder once)"
            )
        names[item.name] = item.origin
        there = dest / item.name
        if os.path.lexists(there) and not _already_there(item, there):
            raise ToolkitError(
                f"{display_path(there)}: already there and not {item.name} of "
                f"{display_path(item.origin)}; nothing was written (move it away or pass another "
                f"--dest)"
            )
    needed = sum(item.size for item in items if not os.path.lexists(dest / item.name))
    existing = next(folder for folder in (dest, *dest.parents) if folder.is_dir())
    free = shutil.disk_usage(existing).free
    if needed >= free:
        raise ToolkitError(
            f"{display_path(dest)}: the join needs {needed / 2**20:.1f} MiB and "
            f"{free / 2**20:.1f} MiB are free; nothing was written (free space or pass another "
            f"--dest)"
        )


def _already_there(item: Joined, there: Path) -> bool:
    """Is the file at `there` a regular file with the content `item` would write (a rerun of the join)?"""
    if there.is_symlink() or not there.is_file() or there.stat().st_size != item.size:
        return False
    want = item.sha256 or sha256_file(item.sources[0])
    return sha256_file(there) == want


def write_joined(item: Joined, dest: Path) -> Path:
    """Write `item` into `dest` through a temporary beside it, at most its checked size (a source swapped or
    grown since is refused); a manifest's file must match its sha256."""
    out = dest / item.name
    if os.path.lexists(out):  # check_join found it identical
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with publish_file(out) as staged:
        with open(staged, "xb") as joined:
            left = item.size
            for source in item.sources:
                left -= _append(source, joined, left)
        if left:
            raise ToolkitError(
                f"{display_path(item.origin)}: a source changed while joining (join again)"
            )
        if item.sha256 and sha256_file(staged) != item.sha256:
            raise ToolkitError(
                f"{display_path(item.origin)}: the joined file's sha256 differs from the manifest "
                f"(a part is damaged: fetch and split again)"
            )
    return out


def _append(source: Path, out: BinaryIO, limit: int) -> int:
    """Copy the regular file `source` (the name not followed) to `out`, refused if it now holds more than
    `limit` bytes; the bytes copied."""
    with open(_open_regular(source), "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise ToolkitError(f"{display_path(source)}: grew while joining (join again)")
        copied = 0
        while block := handle.read(min(2**20, size - copied)):
            out.write(block)
            copied += len(block)
        return copied


# One carry is at most 64 MiB INCLUDING the working tree laid beside it (tracked + untracked files, ~11 MiB in
# 2026-12; docs gpu-machine.md in the shared docs): a carried folder keeps 20 MiB for the tree.
CARRY_LIMIT = 44 * 2**20


def carry_check(
    paths: list[Path],
    folder: Path,
    limit: int = CARRY_LIMIT,
    fix: str = "fetch it with --split-into instead",
) -> None:
    """One folder's files fit one carry, or one line saying by how much they do not."""
    size = sum(path.stat().st_size for path in paths)
    if size >= limit:
        raise ToolkitError(
            f"{folder}: {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB of one "
            f"carry ({fix})"
        )
    print(f"{folder}: {size / 2**20:.1f} MiB")


def carry_split(
    paths: list[Path], dest: Path, limit: int = CARRY_LIMIT, part_bytes: int = PART_BYTES
) -> list[Path]:
    """As many folders dest/part1, part2, ... as the wheels need, each under `limit` bytes (one carry each):
    the small wheels, then the chunks of each large one, packed in that order; a chunk's folder also holds
    its manifest. Nothing is replaced if a folder would be over; a partN an earlier split with more folders
    left is removed (a join of every dest/part* folder would take its stale chunks)."""
    clean_stale(dest)  # what a killed split left
    with owned_dir(dest, "split") as scratch:
        pieces: list[list[Path]] = []  # what must go into one folder together
        for path in (p for p in paths if p.stat().st_size <= part_bytes):
            pieces.append([path])
        for path in (p for p in paths if p.stat().st_size > part_bytes):
            manifest = scratch / f"{path.name}.parts.json"
            pieces += [[chunk, manifest] for chunk in split_file(path, scratch, part_bytes)]
        packed = _pack(pieces, limit)
        folders = [dest / f"part{index}" for index in range(1, len(packed) + 1)]
        with ExitStack() as stack:  # every folder kept as it was if one is over
            for folder, files in zip(folders, packed):
                staged = stack.enter_context(publish_dir(folder))
                for file in files:
                    shutil.copy2(file, staged / file.name)
                carry_check(list(staged.iterdir()), folder, limit, fix="lower PART_BYTES")
    for stale in dest.iterdir():
        if re.fullmatch(r"part[0-9]+", stale.name) and stale not in folders:
            remove_path(stale)
            print(f"{stale}: removed (left by an earlier split)")
    return folders


def _pack(pieces: list[list[Path]], limit: int) -> list[list[Path]]:
    """The pieces in order, a new folder begun where the next piece would take this one to `limit` (a file
    two pieces share, a manifest, counted once); a piece over `limit` alone gets a folder that carry_check
    refuses."""
    packed: list[list[Path]] = [[]]
    for piece in pieces:
        grown = packed[-1] + [f for f in piece if f not in packed[-1]]
        if packed[-1] and sum(f.stat().st_size for f in grown) >= limit:
            packed.append(list(piece))
        else:
            packed[-1] = grown
    return packed

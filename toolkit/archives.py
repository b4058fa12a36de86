"""What a conda archive will write, checked before any installer sees it.

A sha256 in the lock proves the archive is the one locked, not that it is harmless: whoever can edit the
lock can pin an archive of their own. py-rattler refuses a `../` path only when it links, after
extracting into the package cache, and ABORTS THE PROCESS (a Rust panic, no Python exception) on an
absolute one (seen with py-rattler 0.28.0, 2026-12-01). So the toolkit reads the archive's own file list
(info/paths.json, or info/files in old archives) and its members, and refuses any path that is
absolute, climbs out with `..` (a link target too), or carries a NUL or a line break, before installing.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

import zstandard

from toolkit.errors import ToolkitError
from toolkit.paths import display_path

MAX_INFO_BYTES = 64 << 20  # paths.json of the largest CUDA packages is a few MB


def check_conda_archive(archive: Path) -> None:
    """Raise a one-line ToolkitError when the archive would write outside its prefix."""
    where = display_path(archive)
    try:
        members, listed = _read(archive)
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, zstandard.ZstdError,
            json.JSONDecodeError, UnicodeDecodeError, KeyError, ValueError, RecursionError) as exc:
        raise ToolkitError(f"{where}: not a readable conda archive ({exc.__class__.__name__}: {exc}; "
                           f"re-lock from a trusted channel)") from None
    for path in (*members, *listed):
        problem = unsafe_reason(path)
        if problem:
            raise ToolkitError(f"{where}: refuses to install a package that writes {path!r} ({problem}; "
                               f"the lock pins an archive no channel should serve: re-lock from a trusted channel)")


def unsafe_reason(path: str) -> str | None:
    """Why a path inside a package may not be installed, or None."""
    if any(ch in path for ch in "\0\n\r"):
        return "a NUL or line break in a file name"
    if path.startswith("/") or PurePosixPath(path).is_absolute():
        return "an absolute path"
    depth = 0
    for part in PurePosixPath(path).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return "a path that climbs out of the prefix"
    return None


def _read(archive: Path) -> tuple[list[str], list[str]]:
    """(tar member names, paths the metadata lists) of a .conda (a zip) or .tar.bz2 archive, told by content:
    a download in progress has neither suffix."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as outer:
            members: list[str] = []
            listed: list[str] = []
            for inner in outer.namelist():
                if inner.endswith(".tar.zst"):
                    with outer.open(inner) as raw, _zstd_tar(raw) as tar:
                        found, paths = _scan(tar)
                        members += found
                        listed += paths
            return members, listed
    with tarfile.open(archive, "r:bz2") as tar:
        return _scan(tar)


def _zstd_tar(raw: IO[bytes]) -> tarfile.TarFile:
    stream = zstandard.ZstdDecompressor().stream_reader(raw)
    return tarfile.open(fileobj=stream, mode="r|")


def _scan(tar: tarfile.TarFile) -> tuple[list[str], list[str]]:
    members, listed = [], []
    for member in tar:
        members.append(member.name)
        if member.issym() or member.islnk():  # a link may point only inside the prefix, like its own path
            members.append(str(PurePosixPath(member.name).parent / member.linkname)
                           if member.issym() and not member.linkname.startswith("/") else member.linkname)
        if member.name in ("info/paths.json", "info/files") and member.isfile():
            if member.size > MAX_INFO_BYTES:
                raise ValueError(f"{member.name} of {member.size} bytes")
            data = tar.extractfile(member)
            listed += list(_listed_paths(member.name, data.read() if data else b""))
    return members, listed


def _listed_paths(name: str, data: bytes) -> Iterator[str]:
    if name == "info/files":
        yield from (line for line in data.decode().splitlines() if line)
        return
    for entry in json.loads(data).get("paths", []):
        yield str(entry["_path"])

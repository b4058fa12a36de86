"""What a conda archive will write, and which package it is, checked before any installer sees it.

A sha256 in the lock proves the archive is the one locked, not that it is harmless: whoever can edit the
lock can pin an archive of their own. py-rattler refuses a `../` path only when it links, after
extracting into the package cache, and ABORTS THE PROCESS (a Rust panic, no Python exception) on an
absolute one (seen with py-rattler 0.28.0, 2026-12-01). So the toolkit reads the archive's own file list
(info/paths.json, or info/files in old archives) and its members, and refuses any path that is
absolute, climbs out with `..` (a link target too), or carries a NUL or a line break, before installing.

Nor does the sha256 prove that the lock entry's name and version are the archive's: py-rattler (and so
conda-meta) takes them from the archive's own info/index.json. `archive_identity` reads that file so
the install can refuse an entry whose version was edited over an unchanged url and sha256.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import zstandard

from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import parse_json
from toolkit.base.paths import display_path

MAX_INFO_BYTES = 64 << 20  # paths.json of the largest CUDA packages is a few MB
# What reading a damaged or hostile .conda / .tar.bz2 raises (its members, its zstd stream, its JSON).
BROKEN_ARCHIVE = (
    OSError,
    EOFError,
    tarfile.TarError,
    zipfile.BadZipFile,
    zstandard.ZstdError,
    ValueError,
)


def check_conda_archive(archive: Path) -> None:
    """Raise a one-line ToolkitError when the archive would write outside its prefix."""
    where = display_path(archive)
    try:
        members, listed = _read(archive)
    except (
        *BROKEN_ARCHIVE,
        KeyError,
        RecursionError,
    ) as exc:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise ToolkitError(
            f"{where}: not a readable conda archive ({exc.__class__.__name__}: {exc}; "
            f"re-lock from a trusted channel)"
        ) from None
    for path in (*members, *listed):
        problem = unsafe_reason(path)
        if problem:
            raise ToolkitError(
                f"{where}: refuses to install a package that writes {path!r} ({problem}; "
                f"the lock pins an archive no channel should serve: re-lock from a trusted channel)"
            )


@dataclass(frozen=True)
class PackageIdentity:
    """What an archive's info/index.json says it is: conda-meta's name, version and build; the file itself, from
    which py-rattler makes the package's record without reading the archive again."""

    name: str
    version: str
    build: str
    index_json: bytes = b""


def archive_identity(archive: Path, data: bytes | None = None) -> PackageIdentity:
    """The package an archive is by its own info/index.json (`data`: that file as read before from this archive,
    download.kept_with_stamp); a one-line ToolkitError when unreadable."""
    where = display_path(archive)
    data = archive_index_json(archive) if data is None else data
    index = parse_json(
        data, f"{where}: info/index.json", "package index", "re-lock from a trusted channel"
    )
    fields = [
        index.get(key) if isinstance(index, dict) else None for key in ("name", "version", "build")
    ]
    texts = [value for value in fields if isinstance(value, str)]
    if len(texts) != len(fields):
        raise ToolkitError(
            f"{where}: info/index.json lacks a name, version or build (not a conda package; "
            f"re-lock from a trusted channel)"
        )
    name, version, build = texts
    return PackageIdentity(name, version, build, data)


def archive_index_json(archive: Path) -> bytes:
    """The archive's info/index.json as it holds it; a one-line ToolkitError when unreadable."""
    try:
        return _index_json(archive)
    except BROKEN_ARCHIVE as exc:
        raise ToolkitError(
            f"{display_path(archive)}: not a readable conda archive ({exc.__class__.__name__}: {exc}; "
            f"re-lock from a trusted channel)"
        ) from None


def _index_json(archive: Path) -> bytes:
    """info/index.json's bytes: in a .conda, from its small info-*.tar.zst only."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as outer:
            for inner in outer.namelist():
                if inner.startswith("info-") and inner.endswith(".tar.zst"):
                    with outer.open(inner) as raw, _zstd_tar(raw) as tar:
                        return _member(tar, "info/index.json")
        raise ValueError("no info-*.tar.zst inside")
    with tarfile.open(archive, "r:bz2") as tar:
        return _member(tar, "info/index.json")


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    for member in tar:
        if member.name == name and member.isfile():
            if member.size > MAX_INFO_BYTES:
                raise ValueError(f"{name} of {member.size} bytes")
            data = tar.extractfile(member)
            return data.read() if data else b""
    raise ValueError(f"no {name}")


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
        if (
            member.issym() or member.islnk()
        ):  # a link may point only inside the prefix, like its own path
            members.append(
                str(PurePosixPath(member.name).parent / member.linkname)
                if member.issym() and not member.linkname.startswith("/")
                else member.linkname
            )
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

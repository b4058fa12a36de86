"""Which published build an installed attention package is, if any: `toolkit doctor` names it.

The installed distribution's RECORD lists its files; each is hashed here, on disk, and compared with the RECORD
inside a published wheel of the same name and version (downloaded through the hash-verified download cache,
vouched for by the index's table entry, cache/index.py). A build is the published one only when every file the
wheel's RECORD lists is installed with the same sha256; anything else (another build of the same version, a
file changed after install) is an unknown build, with the first file that differs. The installed RECORD's own
hashes are never trusted: they are what an installer wrote, the bytes on disk are what runs.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import zipfile
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from toolkit.base.bounded_read import Unreadable, open_regular, regular_file_bytes
from toolkit.base.errors import ToolkitError
from toolkit.cache.config import CacheSite
from toolkit.cache.index import PublishedBuild, project_links, vouched
from toolkit.cache.substitute import Pinned
from toolkit.env.download import fetch_verified
from toolkit.env.standin import record_hash

MAX_DIST_INFO_BYTES = 64 << 20  # METADATA and RECORD of an installed distribution
THEN = "its build is not named"
RECORD_MEMBER = re.compile(r"[^/]+\.dist-info/RECORD")


@dataclass(frozen=True)
class InstalledBuild:
    """What doctor says of one installed distribution: the published build it is, or why it is not one."""

    distribution: str  # the PyPI distribution's name
    version: str
    published: bool
    wheel: str = ""  # the published wheel's URL
    line: str = ""  # the line its build record names
    inputs_key: str = ""
    report: str = ""  # its verification report's URL, where one was published
    detail: str = ""  # why it is an unknown build (or why it could not be told)


def identify(dist_info: Path, caches: list[CacheSite], downloads: Path) -> InstalledBuild:
    """The installed distribution at `dist_info` against every configured cache, first match wins."""
    metadata = _bounded(dist_info / "METADATA")
    headers = BytesHeaderParser().parsebytes(metadata)
    name, version = canonicalize_name(headers.get("Name") or ""), headers.get("Version") or ""
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise ToolkitError(
            f"{dist_info / 'METADATA'}: version {version!r} is not a version (reinstall it)"
        ) from None
    listed = {row[0] for row in _rows(_bounded(dist_info / "RECORD"), f"{dist_info / 'RECORD'}")}
    metadata_sha = hashlib.sha256(metadata).hexdigest()
    unknown = InstalledBuild(
        name,
        version,
        False,
        detail=f"no build of {name} {version} is published at "
        f"{', '.join(site.url for site in caches)}",
    )
    for site in caches:
        for link in project_links(site, name, THEN):
            if link.version != wanted:
                continue
            if link.metadata_sha256 and link.metadata_sha256 != metadata_sha:
                unknown = InstalledBuild(
                    name, version, False, detail=f"its METADATA is not that of {link.url}"
                )
                continue
            build = vouched(site, link, THEN)
            wheel = fetch_verified(
                Pinned(link.url, link.filename, link.sha256),
                downloads,
                link.filename,
                pinned_by=f"the index page and table entry of {link.filename}",
            )
            differs = _first_difference(_wheel_record(wheel), dist_info.parent, listed)
            if not differs:
                return _published(name, version, build)
            unknown = InstalledBuild(
                name, version, False, detail=f"{differs} (compared with {link.url})"
            )
    return unknown


def _published(name: str, version: str, build: PublishedBuild) -> InstalledBuild:
    report = build.report_url if build.report_exists() else ""
    return InstalledBuild(
        name,
        version,
        True,
        build.link.url,
        str(build.record.inputs.get("line") or ""),
        build.entry.inputs_key,
        report,
    )


def _first_difference(published: dict[str, str], site_packages: Path, listed: set[str]) -> str:
    """'' when every file the wheel's RECORD lists is installed with its hash; else the first that is not."""
    for path, wanted in sorted(published.items()):
        if path not in listed:
            return f"{path} of the published wheel is not in the installed RECORD"
        actual = disk_hash(site_packages, path)
        if actual is None:
            return f"{path} is not installed as a regular file"
        if actual != wanted:
            return f"{path} differs from the published wheel's (sha256 {wanted} published)"
    return ""


def _wheel_record(wheel: Path) -> dict[str, str]:
    """path -> hash (RECORD's form) of each file the wheel's RECORD lists with a sha256; not the RECORD itself,
    which every installer rewrites, nor `.data/` files, which installing moves elsewhere."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [i for i in archive.infolist() if RECORD_MEMBER.fullmatch(i.filename)]
            if len(members) != 1 or members[0].file_size > MAX_DIST_INFO_BYTES:
                raise ToolkitError(
                    f"{wheel}: a published wheel without one RECORD (tell the cache's publisher)"
                )
            text = archive.read(members[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise ToolkitError(
            f"{wheel}: not a readable wheel ({exc}; tell the cache's publisher)"
        ) from None
    hashed = {}
    for row in _rows(text, f"{wheel.name}'s RECORD"):
        if len(row) > 1 and row[1].startswith("sha256=") and ".data/" not in row[0]:
            hashed[row[0]] = row[1].removeprefix("sha256=")
    return hashed


def disk_hash(site_packages: Path, relative: str) -> str | None:
    """The file's sha256 in RECORD's form, read as a regular file inside site-packages (a FIFO never blocks, a
    link out of it is not followed); None where there is none."""
    path = site_packages / relative
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(Path(os.path.realpath(site_packages))):
        return None
    try:
        fd = open_regular(real, follow_symlinks=False)
    except Unreadable:
        return None
    digest = hashlib.sha256()
    try:
        with open(fd, "rb", closefd=False) as reader:
            while chunk := reader.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return record_hash(digest.digest())


def _rows(data: bytes, where: str) -> list[list[str]]:
    try:
        return [row for row in csv.reader(io.StringIO(data.decode())) if row]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ToolkitError(
            f"{where}: unreadable RECORD ({exc.__class__.__name__}; reinstall it)"
        ) from None


def _bounded(path: Path) -> bytes:
    try:
        return regular_file_bytes(path, MAX_DIST_INFO_BYTES)
    except Unreadable as exc:
        reason = exc.reason(MAX_DIST_INFO_BYTES)
        raise ToolkitError(f"{path}: unreadable ({reason}; reinstall the distribution)") from None

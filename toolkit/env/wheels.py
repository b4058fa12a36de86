"""What a locked wheel is, read from the wheel itself before pip sees it: its METADATA's name, version and
Requires-Dist.

A sha256 in the lock proves the wheel is the one locked, not that it is the package and version the entry
names: pip installs a direct URL whatever its version, so an entry edited over an unchanged url and sha256
would install another release than the one every check of the lock read. And a pip layer installed with
--no-deps installs only what the lock lists: a dependency deleted from a re-signed lock would leave torch
without cudnn, silently. So the install reads each wheel's METADATA (lockfile.check_wheel_identity) and, for a
pypi line, checks that the lock holds every dependency its wheels declare for the target (`closure_problem`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.env.lockfile import LockedPackage, brief, parsed_version

MAX_METADATA_BYTES = 4 << 20  # torch's METADATA is about 30 kB


@dataclass(frozen=True)
class WheelMetadata:
    """A wheel's .dist-info/METADATA: what pip records it as, and what it needs beside it."""

    name: str
    version: str
    requires: tuple[str, ...]  # its Requires-Dist lines


@dataclass(frozen=True)
class Closure:
    """What a pypi line's wheels may depend on: the lock's pip packages (those copied by --torch-from too),
    on the target whose markers the dependencies are evaluated for."""

    names: frozenset[str]  # canonical names
    platform: str
    python: str


def wheel_metadata(source: Path | IO[bytes], where: str | None = None) -> WheelMetadata:
    """The wheel's one top-level .dist-info/METADATA, read at most MAX_METADATA_BYTES; one line when unreadable.
    `source`: the wheel's file, or an open one (a wheel on an index read by ranges) that `where` names."""
    import zipfile  # here, as email.parser in _parsed: a lock reads wheels only once uv has resolved

    where = where or display_path(Path(str(source)))
    try:
        with zipfile.ZipFile(source) as wheel:
            found = [
                name
                for name in wheel.namelist()
                if len(PurePosixPath(name).parts) == 2 and name.endswith(".dist-info/METADATA")
            ]
            if len(found) != 1:
                raise ToolkitError(
                    f"{where}: not a wheel ({len(found)} .dist-info/METADATA files, not one; "
                    f"re-lock from a trusted index)"
                )
            with wheel.open(found[0]) as stream:
                data = stream.read(MAX_METADATA_BYTES + 1)
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
        NotImplementedError,
        RuntimeError,
        ValueError,
    ) as exc:
        raise ToolkitError(
            f"{where}: not a readable wheel ({exc.__class__.__name__}: {exc}; re-lock from a "
            f"trusted index)"
        ) from None
    if len(data) > MAX_METADATA_BYTES:
        raise ToolkitError(
            f"{where}: {found[0]} is larger than {MAX_METADATA_BYTES >> 20} MB (not a wheel's "
            f"METADATA; re-lock from a trusted index)"
        )
    return _parsed(data, f"{where}: {found[0]}")


def installed_metadata(site: Path, names: list[str]) -> dict[str, WheelMetadata]:
    """The METADATA of what an installer put in `site` for each of `names`, by canonical name: its
    <name>-<version>.dist-info (the wheel's own METADATA, copied as it is), read at most MAX_METADATA_BYTES.
    A name with no such folder is left out; one with several (two versions at once) is refused."""
    from packaging.utils import canonicalize_name

    from toolkit.base.bounded_read import Unreadable, regular_file_bytes

    wanted = {str(canonicalize_name(name)) for name in names}
    folders: dict[str, list[Path]] = {}
    for folder in site.glob("*.dist-info"):
        named = str(canonicalize_name(folder.name.removesuffix(".dist-info").rpartition("-")[0]))
        if named in wanted:
            folders.setdefault(named, []).append(folder)
    found: dict[str, WheelMetadata] = {}
    for name, paths in sorted(folders.items()):
        if len(paths) != 1:
            raise ToolkitError(
                f"{display_path(site)}: {len(paths)} .dist-info folders of {name} "
                f"({', '.join(sorted(p.name for p in paths))}); nothing was installed (report it)"
            )
        metadata = paths[0] / "METADATA"
        try:
            data = regular_file_bytes(metadata, MAX_METADATA_BYTES)
        except Unreadable as exc:
            raise ToolkitError(
                f"{display_path(metadata)}: {exc.reason(MAX_METADATA_BYTES)} (not a wheel's METADATA; "
                f"re-lock from a trusted index)"
            ) from None
        found[name] = _parsed(data, display_path(metadata))
    return found


def _parsed(data: bytes, where: str) -> WheelMetadata:
    """A METADATA file's Name, Version and Requires-Dist; `where` names it in the one-line refusal."""
    import email.parser

    message = email.parser.Parser().parsestr(
        data.decode("utf-8", errors="replace"), headersonly=True
    )
    name, version = message.get("Name"), message.get("Version")
    if not name or not version:
        raise ToolkitError(
            f"{where} lacks a Name or Version (not a wheel's METADATA; re-lock from a trusted index)"
        )
    return WheelMetadata(
        str(name).strip(),
        str(version).strip(),
        tuple(str(line) for line in message.get_all("Requires-Dist") or ()),
    )


MACHINES = {"linux-64": "x86_64", "linux-aarch64": "aarch64"}  # conda platform -> platform_machine


def target_markers(platform: str, python: str) -> dict[str, str]:
    """The PEP 508 marker environment of a line's target: CPython `python` (X.Y or X.Y.Z) on Linux `platform`.
    `extra` is empty: a caller evaluating a requirement of an extra sets it."""
    full = python if python.count(".") == 2 else f"{python}.0"
    return {
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": full,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": MACHINES[platform],
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def closure_problem(
    wheels: list[tuple[LockedPackage, WheelMetadata]], closure: Closure
) -> str | None:
    """The first dependency a wheel declares for the target that the lock lacks, or whose locked version its
    specifier refuses; None when the lock holds them all. A requirement of an extra counts where a wheel asks
    for that extra (torch's cuda-toolkit[cublas,...])."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    environment = target_markers(closure.platform, closure.python)
    versions = {str(canonicalize_name(p.name)): p.version for p, _ in wheels}
    parsed: dict[str, list[Requirement]] = {}
    for package, metadata in wheels:
        try:
            parsed[canonicalize_name(package.name)] = [
                Requirement(line) for line in metadata.requires
            ]
        except InvalidRequirement as exc:
            return f"{package.name} {brief(package.version)}: its METADATA has a Requires-Dist that is none ({exc})"
    extras: dict[str, set[str]] = {name: {""} for name in parsed}
    needed: dict[
        tuple[str, str, str], Requirement
    ] = {}  # (wheel, what it requires, the requirement's text)
    changed = True
    while changed:  # extras asked for add requirements, which may ask for more extras
        changed = False
        for name, requirements in parsed.items():
            for requirement in requirements:
                if requirement.marker is not None and not any(
                    requirement.marker.evaluate({**environment, "extra": extra})
                    for extra in extras[name]
                ):
                    continue
                wanted = str(canonicalize_name(requirement.name))
                needed.setdefault((name, wanted, str(requirement)), requirement)
                more = set(requirement.extras) - extras.get(wanted, set())
                if wanted in extras and more:
                    extras[wanted] |= more
                    changed = True
    for (name, wanted, _), requirement in sorted(
        needed.items()
    ):  # one order: the first problem is always the same
        if wanted not in closure.names:
            return (
                f"{wanted}, which {name} requires ({requirement}), is not among the lock's wheels"
            )
        version = parsed_version(versions[wanted]) if wanted in versions else None
        if version is not None and not requirement.specifier.contains(version, prereleases=True):
            return f"{wanted} {versions[wanted]} is not what {name} requires ({requirement})"
    return None

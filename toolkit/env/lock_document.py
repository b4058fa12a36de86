"""A lock's document as conda-lock writes it (version 1: its LockMeta and LockedDependency entries), made from
plain data without importing conda-lock, whose conversions pull in its vendored conda, requests, asyncio and
pydantic's models: most of a conda lock's CPU. Each conversion here gives conda-lock's result, and
tests/test_lock_document.py holds each to conda-lock's own function on the same input:

- a spec of the environment -> conda-lock's requested dependency (conda_common.conda_spec_to_versioned_dep),
- a repodata record's `depends` -> its locked `dependencies` (vendored MatchSpec, merged per name, as
  conda_solver.solve_conda does), and the packages' category (lockfile.apply_categories),
- a channel -> its lock entry (models.channel.Channel.from_string), a package URL as the lock spells it
  (normalize_url_with_placeholders),
- the spec's content hash (content_hash.compute_content_hashes, with the virtual packages' fake repodata),
- the document itself (Lockfile.to_v1().dict_for_output(): entries sorted, virtual packages left out).

An input outside the forms handled here (a spec naming a channel or a build, a version conda rewrites, a channel
URL with credentials or a variable, a dependency named twice) is converted by conda-lock's function itself,
imported then: the result is conda-lock's either way. The written lock is still checked by conda-lock's own
models before it is published (lockfile.check_with_conda_lock)."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.base.errors import ToolkitError

CATEGORY = "main"  # every spec of a line is in conda-lock's main category
# the forms conda's MatchSpec leaves as written: a lower-case name, and a version that is one release with an
# optional trailing .* ("3.12.*"), any ("*"), or comparisons joined by commas (">=13.0,<13.1", ">=2.17,<3.0.a0";
# not ">=1.2.*", which conda reads as ">=1.2", nor "==1.2", which it writes "1.2" unless a build follows)
SPEC_NAME = re.compile(r"[a-z0-9_][a-z0-9_.-]*")
NUMBERS = r"[0-9][0-9a-z_+]*(?:\.[0-9a-z_+]+)*"
PLAIN_VERSION = re.compile(rf"\*|{NUMBERS}(?:\.\*)?|[<>]=?{NUMBERS}(?:,[<>]=?{NUMBERS})*")
PINNED_WITH_BUILD = re.compile(
    rf"=={NUMBERS}"
)  # "==14.3.0" before a build word: conda keeps the ==
BUILD = re.compile(r"[A-Za-z0-9_*.+]+")
# virtual packages' fake repodata (conda_lock/virtual_package.py: FullVirtualPackage, FakeRepoData)
VIRTUAL_TIME = 1577854800000
VIRTUAL_SUBDIRS = (
    "noarch",
    "linux-aarch64",
    "linux-ppc64le",
    "linux-64",
    "osx-64",
    "osx-arm64",
    "win-64",
)


@dataclass(frozen=True)
class LockEntry:
    """One package of a lock as it is written: conda-lock's v1 LockedDependency (source and build unset)."""

    manager: str  # conda | pip
    name: str
    version: str
    platform: str
    url: str
    dependencies: Mapping[str, str] = field(default_factory=dict)
    md5: str | None = None
    sha256: str | None = None
    category: str = CATEGORY

    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.name, self.platform)

    def document(self) -> dict[str, Any]:
        """As dict_for_output writes it: fields in the model's order, unset hashes left out, dependencies sorted."""
        hashes = {k: v for k, v in (("md5", self.md5), ("sha256", self.sha256)) if v is not None}
        return {
            "name": self.name,
            "version": self.version,
            "manager": self.manager,
            "platform": self.platform,
            "dependencies": dict(sorted(self.dependencies.items())),
            "url": self.url,
            "hash": hashes,
            "category": self.category,
            "optional": self.category != CATEGORY,
        }


@dataclass(frozen=True)
class LockChannel:
    """A channel as a lock names it (conda-lock's Channel): credentials found in the environment spelled as
    the variables holding them."""

    url: str
    used_env_vars: tuple[str, ...] = ()

    def document(self) -> dict[str, Any]:
        return {"url": self.url, "used_env_vars": list(self.used_env_vars)}


@dataclass(frozen=True)
class LockMetadata:
    """A lock's metadata: conda-lock's LockMeta with the fields the toolkit sets."""

    content_hash: Mapping[str, str]
    channels: tuple[LockChannel, ...]
    platforms: tuple[str, ...]
    sources: tuple[str, ...]
    custom: Mapping[str, str]


def lock_document(entries: Iterable[LockEntry], metadata: LockMetadata) -> dict[str, Any]:
    """The lock's document as conda-lock's writer makes it: entries sorted by (manager, name, platform),
    virtual packages left out."""
    kept = sorted(
        (e for e in entries if not (e.manager == "conda" and e.name.startswith("__"))),
        key=LockEntry.key,
    )
    return {
        "version": 1,
        "metadata": {
            "content_hash": dict(metadata.content_hash),
            "channels": [channel.document() for channel in metadata.channels],
            "platforms": list(metadata.platforms),
            "sources": list(metadata.sources),
            "custom_metadata": dict(metadata.custom),
        },
        "package": [entry.document() for entry in kept],
    }


# ---------------------------------------------------------------- the environment's specs


def requested_dependency(spec: str) -> dict[str, Any]:
    """A spec of the environment as conda-lock's VersionedDependency (its model_dump, in the main category)."""
    name, _, version = spec.partition(" ")
    if SPEC_NAME.fullmatch(name) and (not version or PLAIN_VERSION.fullmatch(version)):
        return {
            "name": name,
            "manager": "conda",
            "category": CATEGORY,
            "extras": [],
            "markers": None,
            "version": version,
            "build": None,
            "conda_channel": None,
            "hash": None,
        }
    from toolkit.env.lockfile import conda_common

    return conda_common().conda_spec_to_versioned_dep(spec, CATEGORY).model_dump()


def requested_dependencies(specs: Iterable[str]) -> list[dict[str, Any]]:
    """make_lock_spec's dependencies of an environment file: one per name, the last of a name kept in the place
    of its first."""
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in specs:
        dependency = requested_dependency(spec)
        unique[(dependency["manager"], dependency["name"])] = dependency
    return list(unique.values())


# ---------------------------------------------------------------- channels


def lock_channel(channel: str) -> LockChannel:
    """Channel.from_string: a name as written; a URL as urllib re-assembles it, unless it holds a user, a
    password or an anaconda token (/t/...), whose values conda-lock looks up in the environment."""
    if "://" not in channel:
        return LockChannel(channel)
    parts = urllib.parse.urlparse(channel)
    if parts.username is None and parts.password is None and "/t/" not in parts.path:
        return LockChannel(urllib.parse.urlunparse(parts))
    from toolkit.env.lockfile import conda_lock_modules_only

    conda_lock_modules_only()
    from conda_lock.models.channel import Channel

    found = Channel.from_string(channel)
    return LockChannel(found.url, tuple(found.used_env_vars))


def lock_channels(channels: Iterable[str]) -> tuple[LockChannel, ...]:
    """The channels a lock names: the spec's, `nodefaults` left out (make_lock_spec)."""
    return tuple(lock_channel(c) for c in channels if c != "nodefaults")


def lock_url(url: str, channels: tuple[LockChannel, ...]) -> str:
    """normalize_url_with_placeholders: a package URL with each channel's credentials spelled as its variables.
    A channel with neither a variable nor a token leaves every URL as it is."""
    if all("$" not in c.url and "/t/" not in c.url for c in channels):
        return url
    from toolkit.env.lockfile import conda_lock_modules_only

    conda_lock_modules_only()
    from conda_lock.models.channel import Channel, normalize_url_with_placeholders

    return normalize_url_with_placeholders(
        url, [Channel(url=c.url, used_env_vars=c.used_env_vars) for c in channels]
    )


# ---------------------------------------------------------------- solved records


def locked_dependencies(depends: Iterable[str]) -> dict[str, str]:
    """A record's `depends` as the lock's dependencies (name -> version spec), as conda-lock's solve_conda
    makes them: each string read by conda's MatchSpec, the specs of one name merged, its version's spec_str."""
    parsed: dict[str, str] = {}
    for dep in depends:
        words = dep.split(" ")
        if (
            len(words) > 3
            or not SPEC_NAME.fullmatch(words[0])
            or words[0] in parsed
            or (len(words) == 2 and not PLAIN_VERSION.fullmatch(words[1]))
            or (
                len(words) == 3
                and not (PLAIN_VERSION.fullmatch(words[1]) or PINNED_WITH_BUILD.fullmatch(words[1]))
            )
            or (len(words) == 3 and not BUILD.fullmatch(words[2]))
        ):
            return _matchspec_dependencies(depends)
        parsed[words[0]] = words[1] if len(words) > 1 else ""
    return parsed


def _matchspec_dependencies(depends: Iterable[str]) -> dict[str, str]:
    from toolkit.env.lockfile import conda_lock_modules_only

    conda_lock_modules_only()
    from conda_lock.interfaces.vendored_conda import MatchSpec

    by_name: dict[str, list] = {}
    for dep in depends:
        match = MatchSpec(dep)
        by_name.setdefault(match.name, []).append(match)
    dependencies = {}
    for name, matches in by_name.items():
        merged = matches[0] if len(matches) == 1 else MatchSpec.merge(matches)[0]
        dependencies[name] = merged.version.spec_str if merged.version is not None else ""
    return dependencies


def conda_entries(
    records: list[dict], platform: str, channels: tuple[LockChannel, ...], requested: Iterable[str]
) -> list[LockEntry]:
    """One platform's solved records (repodata records with url, md5, sha256) as lock entries. A record that no
    requested name reaches through the others' dependencies has no category, and conda-lock writes no entry for
    it (apply_categories; to_v1)."""
    planned = {
        record["name"]: LockEntry(
            manager="conda",
            name=record["name"],
            version=record["version"],
            platform=platform,
            url=lock_url(record["url"], channels),
            dependencies=locked_dependencies(record.get("depends") or []),
            md5=record["md5"],
            sha256=record.get("sha256"),
        )
        for record in records
    }
    reached = _reached(planned, requested)
    return [entry for name, entry in planned.items() if name in reached]


def _planned_name(planned: Mapping[str, LockEntry], name: str) -> str:
    """The planned package a name means, as conda-lock looks it up (_seperator_munge_get: - and _ alike)."""
    for candidate in (name, name.replace("-", "_"), name.replace("_", "-")):
        if candidate in planned:
            return candidate
    raise ToolkitError(
        f"the solve holds no package {name!r}, which the spec or a solved package needs: lock again"
    )


def _reached(planned: Mapping[str, LockEntry], requested: Iterable[str]) -> set[str]:
    """Every planned package a requested name reaches through dependencies (virtual ones, __*, not followed)."""
    reached: set[str] = set()
    todo = [_planned_name(planned, name) for name in requested]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [
            _planned_name(planned, dep)
            for dep in planned[name].dependencies
            if not dep.startswith("__")
        ]
    return reached


# ---------------------------------------------------------------- the content hash


def virtual_repodata(packages: Mapping[str, str], subdir: str) -> dict[str, Any]:
    """One subdir of conda-lock's fake repodata of the virtual packages (name -> "version[ build]"), with the
    build number conda-lock 3.0.3 put back into each build string (_reinsert_spurious_build_number)."""
    entries = {}
    for name, value in packages.items():
        version, _, build_string = value.partition(" ")
        build = f"{build_string}_0" if build_string else "0"
        entries[f"{name}-{version}-{build}.tar.bz2"] = {
            "name": name,
            "version": version,
            "build_string": build_string,
            "build_number": 0,
            "noarch": "",
            "depends": [],
            "timestamp": VIRTUAL_TIME,
            "package_type": "virtual_system",
            "build": build,
            "subdir": subdir,
        }
    return {"info": {"subdir": subdir}, "packages": entries}


def content_hashes(
    requested: list[dict[str, Any]],
    channels: tuple[LockChannel, ...],
    platforms: Iterable[str],
    virtual_packages: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """compute_content_hashes of the lock specification (its requested_dependencies and channels) and the
    virtual packages, per platform: the sha256 of the sorted JSON of its channels (as pydantic's JSON), its
    specs sorted by (manager, name) (markers and subdirectory left out where null), and the fake repodata of
    noarch and the platform."""
    specs_done = [
        {k: v for k, v in d.items() if not (k in ("markers", "subdirectory") and v is None)}
        for d in sorted(requested, key=lambda d: (d["manager"], d["name"]))
    ]
    channels_done = [
        json.dumps(c.document(), ensure_ascii=False, separators=(",", ":")) for c in channels
    ]
    hashes = {}
    for platform in platforms:
        content = {
            "channels": channels_done,
            "specs": specs_done,
            "virtual_package_hash": {
                "noarch": virtual_repodata(virtual_packages.get("noarch", {}), "noarch"),
                platform: virtual_repodata(virtual_packages.get(platform, {}), platform),
            },
        }
        hashes[platform] = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return hashes

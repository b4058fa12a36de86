"""What each compile object of a flash-attn build costs (knowledge/object_costs.yaml), typed.

A first build of an sdist has no record of its own to order its objects longest first; these measured
costs stand in until it has one (toolkit/build/timing.py chooses, toolkit/build/ninja_shim.py applies).
Objects are named by their source's path inside the sdist, the same in every build folder and for every arch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Literal, get_args

from toolkit.knowledge import files as knowledge_files

KNOWLEDGE_NAME = "object_costs.yaml"
# Which of an sdist's builds the costs are for: FA2 (setup.py at the root) or FA3 (hopper/setup.py).
Profile = Literal["fa2", "fa3"]
PROFILES: tuple[Profile, ...] = get_args(Profile)
SHA256 = re.compile(r"[0-9a-f]{64}")
ARCH = re.compile(r"\d{2,3}[af]?")


@dataclass(frozen=True)
class ReleaseCosts:
    """The measured CPU seconds of every object of one build of one release's sdist, on one arch."""

    version: str
    profile: Profile
    sdist_sha256: str
    arch: str  # the one arch the measured build compiled
    source: str  # the key of `sources` the figures come from
    cpu_seconds: dict[str, float]  # source path inside the sdist -> CPU seconds for `arch`

    def seconds_for(self, archs: Sequence[str]) -> dict[str, float]:
        """Each object's CPU seconds for a build of these archs: additive over archs, each arch costing what
        the measured one did (the file's `per-arch` source: an assumption, no multi-arch record exists)."""
        return {path: seconds * max(1, len(archs)) for path, seconds in self.cpu_seconds.items()}


@dataclass(frozen=True)
class ObjectCosts:
    releases: tuple[ReleaseCosts, ...]
    sources: dict[str, str]

    def for_sdist(self, sdist_sha256: str, profile: Profile = "fa2") -> ReleaseCosts | None:
        """The costs measured on this very sdist for this profile; None: not measured (FA3: none yet)."""
        return next((r for r in self.releases if r.sdist_sha256 == sdist_sha256 and r.profile == profile), None)


@cache
def load_object_costs(name: str | Path = KNOWLEDGE_NAME) -> ObjectCosts:
    return knowledge_files.typed(name, _object_costs)


def _object_costs(data: dict) -> ObjectCosts:
    sources = {str(key): str(text) for key, text in data["sources"].items()}
    releases = tuple(_release(entry, sources) for entry in data["releases"])
    keys = [(r.sdist_sha256, r.profile) for r in releases]
    if len(set(keys)) != len(keys):
        raise ValueError("two releases entries for the same sdist_sha256 and profile")
    return ObjectCosts(releases, sources)


def _release(entry: dict, sources: dict[str, str]) -> ReleaseCosts:
    version = str(entry["version"])
    profile, sha, arch, source = entry["profile"], str(entry["sdist_sha256"]), str(entry["arch"]), entry["source"]
    if profile not in PROFILES:
        raise ValueError(f"{version}: profile {profile!r} is none of {', '.join(PROFILES)}")
    if not SHA256.fullmatch(sha) or not ARCH.fullmatch(arch):
        raise ValueError(f"{version}: sdist_sha256 must be 64 hex digits and arch an sm number like 90")
    if source not in sources:
        raise ValueError(f"{version}: source {source!r} is not a key of sources")
    costs = entry["cpu_seconds"]
    if not isinstance(costs, dict) or not costs:
        raise ValueError(f"{version}: cpu_seconds must map source paths to seconds")
    return ReleaseCosts(version, profile, sha, arch, source,
                        {_source_path(version, path): _seconds(version, path, s) for path, s in costs.items()})


def _source_path(version: str, path: object) -> str:
    parts = PurePosixPath(str(path)).parts
    if not isinstance(path, str) or not parts or parts[0] == "/" or ".." in parts or "\\" in path:
        raise ValueError(f"{version}: cpu_seconds key {path!r} is not a relative path inside the sdist")
    return path


def _seconds(version: str, path: str, seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"{version}: cpu_seconds of {path}: {seconds!r} is not a positive number of seconds")
    return float(seconds)

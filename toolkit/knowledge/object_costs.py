"""What each compile object of a flash-attn build costs (knowledge/object_costs.yaml), typed.

A first build of an sdist has no record of its own to order its objects longest first; these measured
costs stand in until it has one (toolkit/build/timing.py chooses, toolkit/build/ninja_shim.py applies).
Objects are named by their source's path inside the sdist (FlashAttention-3: inside the flash-attention tree,
hopper/...), the same in every build folder and for every arch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Literal, get_args

from toolkit.knowledge import fa3_pins
from toolkit.knowledge import files as knowledge_files

KNOWLEDGE_NAME = "object_costs.yaml"
# Which of an sdist's builds the costs are for: FA2 (setup.py at the root) or FA3 (hopper/setup.py).
Profile = Literal["fa2", "fa3"]
PROFILES: tuple[Profile, ...] = get_args(Profile)
SHA256 = re.compile(r"[0-9a-f]{64}")
ARCH = re.compile(r"\d{2,3}[af]?")
# The fields that key an entry of each profile; an entry has its own profile's and no other's.
KEY_FIELDS: dict[Profile, tuple[str, ...]] = {
    "fa2": ("sdist_sha256",),
    "fa3": ("commit", "fa3_profile"),
}


@dataclass(frozen=True)
class CostKey:
    """What a build looks its object costs up by. FA2: the published sdist's sha256. FA3: the flash-attention
    commit (an archive's sha256 depends on who made it: GitHub's codeload or `git archive`) and the FA3 profile,
    whose FLASH_ATTENTION_DISABLE_* switches reach every compile as -D flags and so change what it costs."""

    profile: Profile
    pin: str  # fa2: the sdist's sha256; fa3: the commit of knowledge/flash_attn_3.yaml hopper/ is built from
    fa3_profile: str | None = None  # fa3: a profile of knowledge/flash_attn_3.yaml

    def label(self) -> str:
        return (
            self.profile
            if self.fa3_profile is None
            else f"{self.profile} at {self.pin[:12]}, profile {self.fa3_profile}"
        )


@dataclass(frozen=True)
class ReleaseCosts:
    """The measured CPU seconds of every object of one build of one release's source, on one arch."""

    version: str
    key: CostKey
    arch: str  # the one arch the measured build compiled
    source: str  # the key of `sources` the figures come from
    cpu_seconds: dict[
        str, float
    ]  # source path inside the sdist (FA3: the flash-attention tree) -> CPU s for `arch`

    def seconds_for(self, archs: Sequence[str]) -> dict[str, float]:
        """Each object's CPU seconds for a build of these archs: additive over archs, each arch costing what
        the measured one did (the file's `per-arch` source: an assumption, no multi-arch record exists)."""
        return {path: seconds * max(1, len(archs)) for path, seconds in self.cpu_seconds.items()}


@dataclass(frozen=True)
class ObjectCosts:
    releases: tuple[ReleaseCosts, ...]
    sources: dict[str, str]

    def measured(self, key: CostKey) -> ReleaseCosts | None:
        """The costs measured on this very source (and FA3 profile); None: not measured."""
        return next((r for r in self.releases if r.key == key), None)


@cache
def load_object_costs(name: str | Path = KNOWLEDGE_NAME) -> ObjectCosts:
    return knowledge_files.typed(name, _object_costs)


def _object_costs(data: dict) -> ObjectCosts:
    sources = {str(key): str(text) for key, text in data["sources"].items()}
    releases = tuple(_release(entry, sources) for entry in data["releases"])
    keys = [r.key for r in releases]
    if len(set(keys)) != len(keys):
        raise ValueError(
            "two releases entries for the same source (sdist_sha256, or commit and fa3_profile)"
        )
    return ObjectCosts(releases, sources)


def _release(entry: dict, sources: dict[str, str]) -> ReleaseCosts:
    version = str(entry["version"])
    key, arch, source = _key(version, entry), str(entry["arch"]), entry["source"]
    if not ARCH.fullmatch(arch):
        raise ValueError(f"{version}: arch {arch!r} is not an sm number like 90")
    if source not in sources:
        raise ValueError(f"{version}: source {source!r} is not a key of sources")
    costs = entry["cpu_seconds"]
    if not isinstance(costs, dict) or not costs:
        raise ValueError(f"{version}: cpu_seconds must map source paths to seconds")
    return ReleaseCosts(
        version,
        key,
        arch,
        source,
        {_source_path(version, path): _seconds(version, path, s) for path, s in costs.items()},
    )


def _key(version: str, entry: dict) -> CostKey:
    """The entry's key, in its profile's fields: fa2 a 64-hex sdist sha256, fa3 a commit and a profile that
    knowledge/flash_attn_3.yaml pins (a key nothing can build would order no build)."""
    profile = entry["profile"]
    if profile not in PROFILES:
        raise ValueError(f"{version}: profile {profile!r} is none of {', '.join(PROFILES)}")
    stray = [
        name
        for other, names in KEY_FIELDS.items()
        if other != profile
        for name in names
        if name in entry
    ]
    if stray:
        raise ValueError(
            f"{version}: {profile} entries are keyed by {' and '.join(KEY_FIELDS[profile])}, not {stray[0]}"
        )
    if profile == "fa2":
        sha = str(entry["sdist_sha256"])
        if not SHA256.fullmatch(sha):
            raise ValueError(f"{version}: sdist_sha256 {sha!r} is not 64 hex digits")
        return CostKey(profile, sha)
    commit, fa3_profile = str(entry["commit"]), str(entry["fa3_profile"])
    pinned = fa3_pins.knowledge()
    if not fa3_pins.COMMIT.fullmatch(commit) or commit not in pinned["commits"]:
        raise ValueError(
            f"{version}: commit {commit!r} is not a commit (40 hex digits) that flash_attn_3.yaml pins"
        )
    if fa3_profile not in pinned["profiles"]:
        raise ValueError(
            f"{version}: fa3_profile {fa3_profile!r} is not a profile of flash_attn_3.yaml"
        )
    return CostKey(profile, commit, fa3_profile)


def _source_path(version: str, path: object) -> str:
    parts = PurePosixPath(str(path)).parts
    if not isinstance(path, str) or not parts or parts[0] == "/" or ".." in parts or "\\" in path:
        raise ValueError(
            f"{version}: cpu_seconds key {path!r} is not a relative path inside the sdist"
        )
    return path


def _seconds(version: str, path: str, seconds: object) -> float:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ValueError(
            f"{version}: cpu_seconds of {path}: {seconds!r} is not a positive number of seconds"
        )
    return float(seconds)

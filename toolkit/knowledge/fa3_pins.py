"""FlashAttention-3's pins, read from knowledge/flash_attn_3.yaml: which commits of hopper/ the toolkit builds, the
archives that hold each commit's source (pinned by the git ids of the paths the build reads), what each commit
supports, and the profiles (sets of setup.py's FLASH_ATTENTION_DISABLE_* switches) a line picks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.knowledge import files as knowledge_files

KNOWLEDGE_FILE = knowledge_files.KNOWLEDGE_DIR / "flash_attn_3.yaml"
COMMIT = re.compile(r"[0-9a-f]{40}")
# a path inside an archive's top folder: plain names joined by /, none of them . or ..
INNER_PATH = re.compile(r"(?!\.{1,2}(/|$))[A-Za-z0-9_.-]+(/(?!\.{1,2}(/|$))[A-Za-z0-9_.-]+)*")
ARCHIVE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.tar\.gz")


@dataclass(frozen=True)
class Archive:
    """One archive of a commit's source: where it is, and the git id of each path the build reads from it."""

    name: str
    url: str
    filename: str
    commit: str  # the commit the archive is of (its own repository's)
    place: str  # where its pinned paths go in the source tree ("" the root, "csrc/cutlass")
    pins: dict[str, str]  # path inside the archive's top folder -> git id (tree or blob)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    switches: tuple[str, ...]  # FLASH_ATTENTION_DISABLE_*, each set to TRUE for the build
    sm80: bool  # the profile leaves setup.py's sm_80 kernels in

    def environment(self) -> dict[str, str]:
        return {switch: "TRUE" for switch in self.switches}


@dataclass(frozen=True)
class Fa3Commit:
    commit: str
    date: str
    version: str
    cuda: tuple[str, ...]  # specifiers, any of which the line's CUDA must meet
    torch: str
    python: str
    stable_abi_torch: str  # torch from which setup.py builds the one stable-ABI wheel
    wheel_tag: str
    required_arch: str
    optional_archs: tuple[str, ...]
    archives: tuple[Archive, ...]
    objects: dict[str, int]  # profile -> compile steps


@cache
def knowledge(path: Path = KNOWLEDGE_FILE) -> dict:
    return knowledge_files.read(path)


def switches(path: Path = KNOWLEDGE_FILE) -> tuple[str, ...]:
    return tuple(knowledge(path)["switches"])


def profile(name: str, path: Path = KNOWLEDGE_FILE) -> Profile:
    """The named profile, each switch one that setup.py reads (a misspelt one would be ignored by it)."""
    profiles = knowledge(path)["profiles"]
    if name not in profiles:
        raise ToolkitError(
            f"{path.name}: no FlashAttention-3 profile {name!r} (known: {', '.join(profiles)})"
        )
    return knowledge_files.typed(
        path, lambda data: _profile(name, data["profiles"][name], set(data["switches"]))
    )


def _profile(name: str, entry: dict, known: set[str]) -> Profile:
    unknown = [s for s in entry["switches"] if s not in known]
    if unknown:
        raise ValueError(
            f"profile {name}: {', '.join(unknown)} is not a switch of hopper/setup.py (see switches)"
        )
    return Profile(
        name,
        " ".join(str(entry["description"]).split()),
        tuple(entry["switches"]),
        bool(entry["sm80"]),
    )


def commit(sha: str, path: Path = KNOWLEDGE_FILE) -> Fa3Commit:
    commits = knowledge(path)["commits"]
    if sha not in commits:
        raise ToolkitError(
            f"{path.name}: FlashAttention-3 commit {sha} is not pinned (known: {', '.join(commits)}; "
            f"add it with its archives and their git ids)"
        )
    return knowledge_files.typed(path, lambda data: _commit(sha, data["commits"][sha]))


def _commit(sha: str, entry: dict) -> Fa3Commit:
    stable = entry["stable_abi_wheel"]
    return Fa3Commit(
        sha,
        str(entry["date"]),
        str(entry["version"]),
        tuple(entry["cuda"]),
        entry["torch"],
        entry["python"],
        stable["torch"],
        stable["tag"],
        str(entry["archs"]["required"]),
        tuple(str(a) for a in entry["archs"]["optional"]),
        tuple(_archive(a) for a in entry["archives"]),
        {k: int(v) for k, v in entry["objects"].items()},
    )


def _archive(entry: dict) -> Archive:
    """One `archives:` entry, every value in the form the fetch and the unpacking take it."""
    pins = {str(k): str(v) for k, v in entry["pins"].items()}
    checks = [("commit", entry["commit"], COMMIT), ("filename", entry["filename"], ARCHIVE_NAME)]
    checks += [("pins", inner, INNER_PATH) for inner in pins] + [
        ("pins", sha, COMMIT) for sha in pins.values()
    ]
    if entry["place"]:
        checks.append(("place", entry["place"], INNER_PATH))
    for field, value, pattern in checks:
        if not pattern.fullmatch(str(value)):
            raise ValueError(
                f"archive {entry['name']}: {field}: {value!r} is not of the form {pattern.pattern}"
            )
    if not str(entry["url"]).startswith(("https://", "file:///")):
        raise ValueError(
            f"archive {entry['name']}: url: {entry['url']!r} is neither https:// nor file:///"
        )
    return Archive(
        str(entry["name"]),
        str(entry["url"]),
        str(entry["filename"]),
        str(entry["commit"]),
        str(entry["place"]),
        pins,
    )


def fa2_top_level(version: str, path: Path = KNOWLEDGE_FILE) -> tuple[str, ...] | None:
    """The top-level names a flash-attn 2.x wheel installs, where the knowledge has read them."""
    entry = knowledge(path)["beside_flash_attn_2"].get(version)
    return tuple(entry["top_level"]) if entry else None


def installs(path: Path = KNOWLEDGE_FILE) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(top-level names the FA3 wheel installs, modules a build imports to check it)."""
    entry = knowledge(path)["installs"]
    return tuple(entry["top_level"]), tuple(entry["imports"])

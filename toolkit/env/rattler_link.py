"""py-rattler's install of verified archives, in the worker interpreter (toolkit/env/isolated.py).

A module of its own so that the worker imports only py-rattler and what this needs, not the engines' console,
YAML and lock machinery: its start is part of every conda install.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.atomic import checkpoint
from toolkit.base.jsonfile import read_json


@dataclass(frozen=True)
class VerifiedArchive:
    """A conda archive whose bytes hashed to the lock's sha256 and whose info/index.json is the entry's package."""

    local: str  # the verified file in the toolkit's archive cache
    url: str  # the lock's URL, which conda-meta names
    channel: str
    sha256: str
    size: int
    index_json: bytes  # its info/index.json, as archives.archive_identity read it


def rattler_install(
    archives: list[VerifiedArchive],
    prefix: str,
    final_prefix: str,
    platform: str,
    package_cache: str,
    show_progress: bool,
) -> int:
    """Install verified archives with py-rattler (runs inside run_isolated's worker); the number installed.

    Each record is made from the archive's own info/index.json with the sha256 the download cache checked and
    the file's size (PackageRecord.from_index_json), not by py-rattler reading the whole archive again
    (RepoDataRecord.from_package_archive hashes it, seconds for a CUDA layer): what is installed is what was
    hashed. py-rattler's package cache is keyed by that sha256, so a warm install links from it. conda-meta
    then names the lock's URL."""
    import asyncio

    import rattler

    with tempfile.TemporaryDirectory(prefix="fa-envkit-index-") as tmp:
        records = []
        for n, archive in enumerate(archives):
            index = Path(tmp, f"{n}.json")
            index.write_bytes(archive.index_json)
            record = rattler.PackageRecord.from_index_json(
                index, size=archive.size, sha256=archive.sha256
            )
            records.append(
                rattler.RepoDataRecord(
                    record, Path(archive.local).name, Path(archive.local).as_uri(), archive.channel
                )
            )
    asyncio.run(
        rattler.install(
            records,
            target_prefix=prefix,
            cache_dir=Path(package_cache),
            platform=rattler.Subdir(platform),
            alternative_target_prefix=final_prefix,
            show_progress=show_progress and sys.stderr.isatty(),
        )
    )
    checkpoint("install:worker")
    by_file = {Path(a.local).name: (a.url, a.channel) for a in archives}
    for meta in Path(prefix, "conda-meta").glob("*.json"):
        found = read_json(meta, "conda-meta record", "install again")
        if found.get("fn") in by_file:
            found["url"], found["channel"] = by_file[found["fn"]]
            meta.write_text(json.dumps(found, indent=2))
    return len(list(Path(prefix, "conda-meta").glob("*.json")))

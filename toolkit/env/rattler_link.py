"""py-rattler's install of verified archives, in a worker process (toolkit/env/isolated.py).

A module of its own so that the worker imports only py-rattler and what this needs, not the engines' console,
YAML and lock machinery: its start is part of every conda install.
"""

from __future__ import annotations

import json
import os
import sys
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

    @property
    def record(self) -> str:
        """conda-meta's file for it: <name>-<version>-<build>.json by its index.json."""
        index = json.loads(self.index_json)
        return f"{index['name']}-{index['version']}-{index['build']}.json"


def write_index_files(archives: list[VerifiedArchive], directory: Path) -> list[str]:
    """Each archive's info/index.json as a file (<n>.json in `directory`), which is what py-rattler makes a record
    from: written by the toolkit while py-rattler's copy imports (off the link's path)."""
    files = []
    for n, archive in enumerate(archives):
        index = directory / f"{n}.json"
        index.write_bytes(archive.index_json)
        files.append(str(index))
    return files


def rattler_install(
    archives: list[VerifiedArchive],
    index_files: list[str],
    prefix: str,
    final_prefix: str,
    platform: str,
    package_cache: str,
    show_progress: bool,
) -> int:
    """Install verified archives with py-rattler (runs in a forked copy or a worker interpreter); the number installed.

    Each record is made from the archive's own info/index.json (`index_files`, write_index_files) with the sha256
    the download cache checked and the file's size (PackageRecord.from_index_json), not by py-rattler reading the
    whole archive again (RepoDataRecord.from_package_archive hashes it, seconds for a CUDA layer): what is
    installed is what was hashed. py-rattler's package cache is keyed by that sha256, so a warm install links
    from it. conda-meta then names the lock's URL."""
    import asyncio

    import rattler

    records = [
        rattler.RepoDataRecord(
            rattler.PackageRecord.from_index_json(
                Path(index), size=archive.size, sha256=archive.sha256
            ),
            Path(archive.local).name,
            Path(archive.local).as_uri(),
            archive.channel,
        )
        for archive, index in zip(archives, index_files, strict=True)
    ]
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
    name_the_lock_urls(Path(prefix, "conda-meta"), archives)
    return len(list(Path(prefix, "conda-meta").glob("*.json")))


def name_the_lock_urls(conda_meta: Path, archives: list[VerifiedArchive]) -> None:
    """Each record py-rattler wrote names the lock's URL and channel, not the verified copy it linked from (nor
    the channel as py-rattler normalised it: a URL gains a trailing slash).

    py-rattler writes a record pretty-printed, one top-level member a line, as <name>-<version>-<build>.json (the
    name in lower case). Its `url` and `channel` lines are swapped in the bytes, the rest kept as py-rattler wrote
    it: parsing and printing each record again cost 0.03 s for a 71-package layer (json.dumps with an indent is
    pure Python and a record lists every file), a third of py-rattler's link. A record in any other form is
    parsed, found by its `fn` and written whole."""
    by_meta = {a.record.lower(): a for a in archives}
    by_file = {Path(a.local).name: a for a in archives}
    for meta in conda_meta.glob("*.json"):
        data: bytes | None = meta.read_bytes()
        archive = by_meta.get(meta.name.lower())
        if archive is not None:
            for key, value in (("url", archive.url), ("channel", archive.channel)):
                data = _swap_member(data, key, value) if data is not None else None
            if data is not None:
                _overwrite(meta, data)
                continue
        found = read_json(meta, "conda-meta record", "install again")
        archive = by_file.get(found.get("fn"))
        if archive is not None:
            found["url"], found["channel"] = archive.url, archive.channel
            meta.write_text(json.dumps(found, indent=2))


def _overwrite(path: Path, data: bytes) -> None:
    """path's bytes replaced by data in place: written over from the start, then cut to data's length. Not
    write_bytes: a file truncated to nothing and written again is, on ext4 (auto_da_alloc), flushed to the disk
    when closed, the longest part of this pass (0.07-0.1 ms a record in a warm install's copy, 0.2-0.4 ms once
    the records reached the disk). The prefix is a staging one: a write cut short (a full disk) leaves no
    installed environment, as any failure of the install."""
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):  # a write may take fewer bytes than given
            done += os.pwrite(fd, data[done:], done)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _swap_member(data: bytes, key: str, value: str) -> bytes | None:
    """The record with its top-level member `key` (a line `  "key": ...,` as serde_json's pretty printer writes
    it: a JSON value has no raw newline) set to the string `value`; None where there is no such one line."""
    head = f'\n  "{key}": '.encode()
    if data.count(head) != 1:
        return None
    start = data.index(head) + len(head)
    end = data.find(b"\n", start)
    if end < 0 or not data[start:end].endswith(b","):
        return None
    return data[:start] + json.dumps(value, ensure_ascii=False).encode() + b"," + data[end:]

"""Fetching a published build for these inputs from a configured cache, every byte checked before it is used.

The entry `inputs/<key>.json` is fetched (no entry: a miss), checked for form, key and signature; then the
build record and the wheel it names are downloaded through the hash-verified download cache
(env/download.py), each against the entry's sha256. What comes back has passed every check this wing can
make; the build wing then checks the record's own inputs against its build and places the wheel
(build/wheelhouse.place_substitute).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import parse_json
from toolkit.cache.config import CacheSite
from toolkit.cache.index import read_url
from toolkit.cache.table import TableEntry, check_signature, entry_path
from toolkit.env.download import fetch_verified

MAX_ENTRY_BYTES = 1 << 20


@dataclass(frozen=True)
class Pinned:
    """A published file as the download cache fetches it (env/download.Pin)."""

    url: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Substitute:
    """A published build, downloaded and checked against its table entry."""

    source: str  # the entry's URL: what the placed record says it came from
    entry: TableEntry
    wheel: Path  # in the download cache, sha256 checked
    record: Path


def fetch_substitute(site: CacheSite, key: str, downloads: Path) -> Substitute | None:
    """The cache's build for inputs `key`, or None when it has none; a ToolkitError (one line) when it has one
    that fails a check: an entry for other inputs, a bad or missing signature, files whose bytes differ."""
    url = f"{site.url}/{entry_path(key)}"
    data = read_url(url, MAX_ENTRY_BYTES, "table entry", "the build compiles instead")
    if data is None:
        return None
    entry = TableEntry.from_json(
        parse_json(data, url, "substitution table entry", "tell the cache's publisher"), url
    )
    if entry.inputs_key != key:
        raise ToolkitError(
            f"{url}: a table entry for other inputs ({entry.inputs_key}), served under this "
            f"build's key (refused; the build compiles instead)"
        )
    check_signature(entry, site.public_key, url)
    pinned_by = f"the table entry {url}"
    record = fetch_verified(
        Pinned(f"{site.url}/{entry.record}", entry.record.rsplit("/", 1)[-1], entry.record_sha256),
        downloads,
        f"build record of {entry.wheel_name}",
        pinned_by=pinned_by,
    )
    wheel = fetch_verified(
        Pinned(f"{site.url}/{entry.wheel}", entry.wheel_name, entry.wheel_sha256),
        downloads,
        entry.wheel_name,
        pinned_by=pinned_by,
    )
    return Substitute(url, entry, wheel, record)

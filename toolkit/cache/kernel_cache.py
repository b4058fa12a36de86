"""FA4's warmed kernel cache from a configured binary cache: `toolkit fa4 cache-install --cache URL` takes the
published artifact of this install's key instead of compiling, and `toolkit doctor` names an installed one.

`toolkit publish` puts the artifact `toolkit fa4 warm` packed under kernel-caches/, its kernel-cache record
beside it, and the entry kernel-caches/<key>.json (key: the sha256 of the canonical JSON of the record's key,
as a build's inputs key is of its inputs; cache/table.py KernelCacheEntry). An artifact is taken only where
every check passes: the entry's form, key and signature (cache/table.py), the record's and the artifact's bytes
against the entry's sha256 (the hash-verified download cache), the record's key against this install's; then
fa4/jit.unpack installs it all or nothing, as it installs a local artifact. cache-install is the verb that
substitutes, not warm: it is what a machine runs before its first call (no GPU, seconds), while warm exists to
compile and time cold against warm calls, which a substituted cache would make meaningless.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import parse_json
from toolkit.base.workspace import Workspace
from toolkit.cache.config import CacheSite, configured_caches
from toolkit.cache.index import read_url
from toolkit.cache.installed import disk_hash
from toolkit.cache.substitute import MAX_ENTRY_BYTES, Pinned
from toolkit.cache.table import KERNEL_CACHES_DIR, KernelCacheEntry, check_signature, entry_path
from toolkit.env.download import fetch_verified
from toolkit.env.standin import record_hash
from toolkit.fa4.jit import INSTALLED, cache_entries, cache_record, unpack

THEN = "nothing is unpacked; `toolkit fa4 warm` compiles the kernels instead"
MAX_INSTALLED_BYTES = 16 << 20


@dataclass(frozen=True)
class KernelCacheSubstitute:
    """A published kernel cache for this key, downloaded and checked against its entry."""

    source: str  # the entry's URL
    entry: KernelCacheEntry
    record: Path  # in the download cache, sha256 checked
    artifact: Path


def fetch_kernel_cache(site: CacheSite, key: dict, downloads: Path) -> KernelCacheSubstitute | None:
    """The cache's kernel cache for `key` (fa4/jit.cache_key's), or None when it has none; a ToolkitError (one
    line) when it has one that fails a check."""
    digest = sha256_json(key)
    url = f"{site.url}/{entry_path(digest, KERNEL_CACHES_DIR)}"
    data = read_url(url, MAX_ENTRY_BYTES, "kernel-cache table entry", THEN)
    if data is None:
        return None
    entry = KernelCacheEntry.from_json(
        parse_json(data, url, "kernel-cache table entry", "tell the cache's publisher"), url, THEN
    )
    if entry.key != digest:
        raise ToolkitError(
            f"{url}: a table entry for another key ({entry.key}), served under this install's key "
            f"(refused; {THEN})"
        )
    check_signature(entry, site.public_key, url, THEN)
    pinned_by = f"the table entry {url}"
    record = fetch_verified(
        Pinned(f"{site.url}/{entry.record}", entry.record.rsplit("/", 1)[-1], entry.record_sha256),
        downloads,
        "kernel-cache record",
        pinned_by=pinned_by,
    )
    published = cache_record(record)
    if asdict(published.key) != key:
        raise ToolkitError(
            f"{site.url}/{entry.record}: a kernel cache built for {asdict(published.key)}, this install "
            f"is {key} (refused; {THEN})"
        )
    if published.sha256 != entry.artifact_sha256:
        raise ToolkitError(
            f"{site.url}/{entry.record}: the record pins another artifact ({published.sha256}) than "
            f"its table entry ({entry.artifact_sha256}) (refused; {THEN})"
        )
    artifact = fetch_verified(
        Pinned(f"{site.url}/{entry.artifact}", entry.artifact_name, entry.artifact_sha256),
        downloads,
        "kernel-cache artifact",
        pinned_by=pinned_by,
    )
    return KernelCacheSubstitute(url, entry, record, artifact)


def install_kernel_cache_command(args: argparse.Namespace, key: dict, dest: Path) -> int:
    """`toolkit fa4 cache-install --cache URL` (and the caches of .fa-envkit/caches.toml): the first cache with a
    kernel cache for `key` that passes every check is unpacked into dest; a miss or a refusal is one line per
    cache, and exit 1 with nothing unpacked (the script then warms)."""
    caches = configured_caches(args.cache)
    if not caches:
        raise ToolkitError(
            "cache-install: no --cache-record, and no --cache URL or .fa-envkit/caches.toml cache to "
            "take a published kernel cache from (pass one of them)"
        )
    downloads = Workspace().cache / "substitutes"
    for site in caches:
        try:
            found = fetch_kernel_cache(site, key, downloads)
        except ToolkitError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            continue
        if found is None:
            print(
                f"{site.url}: no published FA4 kernel cache for this install's key {sha256_json(key)} ({key}); "
                f"{THEN}",
                file=sys.stderr,
            )
            continue
        env = unpack(found.record, key, dest, found.artifact)
        checked = "sha256, key and signature" if site.public_key else "sha256 and key"
        print(
            f"substituted: {found.entry.artifact_name} from {found.source} into {dest}: "
            f"{len(cache_entries(dest))} entries ({checked} verified; no JIT compile on the first call)"
        )
        for name, value in env.items():
            print(f"{name}={value}")
        return 0
    return 1


# ---------------------------------------------------------------- doctor


@dataclass(frozen=True)
class InstalledKernelCache:
    """What doctor says of the FA4 kernel cache folder in use: the published one it holds, or why not."""

    folder: str
    published: bool
    artifact: str = ""  # the published artifact's URL
    key: str = ""  # its entry's key
    files: int = 0  # the artifact's files, each found in the folder with the same sha256
    detail: str = ""  # why it is an unknown cache (or why it could not be told)


def identify_kernel_cache(
    folder: Path, caches: list[CacheSite], downloads: Path
) -> InstalledKernelCache:
    """The folder against every configured cache: the published artifact for the key cache-install recorded in
    it is downloaded (and checked as cache-install checks it), and each of its files must be in the folder with
    the same sha256 (files FA4 compiled since may lie beside them). The recorded key only picks the artifact to
    compare; the verdict is the bytes on disk."""
    where = str(folder)  # as $FLASH_ATTENTION_CUTE_DSL_CACHE_DIR names it
    key = _installed_key(folder)
    if key is None:
        return InstalledKernelCache(
            where,
            False,
            detail=f"no {INSTALLED} naming its key: not filled by `toolkit fa4 cache-install`",
        )
    unknown = InstalledKernelCache(
        where,
        False,
        detail=f"no kernel cache of its key {key} is published at "
        f"{', '.join(site.url for site in caches)}",
    )
    for site in caches:
        found = fetch_kernel_cache(site, key, downloads)
        if found is None:
            continue
        url = f"{site.url}/{found.entry.artifact}"
        published = _artifact_hashes(found.artifact)
        differs = next(
            (
                f"{name} differs from the published artifact's (compared with {url})"
                for name, wanted in sorted(published.items())
                if disk_hash(folder, name) != wanted
            ),
            "",
        )
        if not differs:
            return InstalledKernelCache(where, True, url, found.entry.key, len(published))
        unknown = InstalledKernelCache(where, False, detail=differs)
    return unknown


def _installed_key(folder: Path) -> dict | None:
    """The key cache-install wrote into the folder's INSTALLED (a dict of strings), or None."""
    try:
        data = json.loads(regular_file_bytes(folder / INSTALLED, MAX_INSTALLED_BYTES))
    except (Unreadable, ValueError):
        return None
    key = data.get("key") if isinstance(data, dict) else None
    if not isinstance(key, dict) or not all(isinstance(v, str) for v in key.values()):
        return None
    return key


def _artifact_hashes(artifact: Path) -> dict[str, str]:
    """Each regular file of the artifact -> its sha256 in RECORD's form (installed.disk_hash's)."""
    try:
        with tarfile.open(artifact) as tar:
            found = {}
            for member in tar.getmembers():
                reader = tar.extractfile(member) if member.isfile() else None
                if reader is not None:
                    digest = hashlib.sha256()
                    while chunk := reader.read(1 << 20):
                        digest.update(chunk)
                    found[member.name] = record_hash(digest.digest())
            return found
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ToolkitError(
            f"{artifact}: not a readable kernel-cache artifact ({type(exc).__name__}; tell the "
            f"cache's publisher)"
        ) from None

"""sha256 of files and of canonical JSON: what pins, locks, caches and records are keyed on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_json(data: object) -> str:
    """Of the canonical JSON (sorted keys, no spaces): equal data, equal digest, whatever the key order."""
    return hashlib.sha256(
        json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def git_object_id(path: Path) -> str:
    """The object id git gives a file (a blob) or a folder (a tree), from the bytes on disk.

    What pins a source that has no stable archive bytes: GitHub's tar.gz of a commit may be compressed
    differently from one download to the next, but the files it unpacks to hash to the commit's tree ids
    (`git rev-parse COMMIT:PATH`). Modes as git records them (100755 when the owner may execute, 120000
    for a symlink, its target as content); empty folders, which git cannot hold, are left out."""
    kind, object_id = _git_entry(Path(path))
    return object_id.hex() if kind else _git_hash(b"tree", b"").hex()


def _git_hash(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body, usedforsecurity=False).digest()


def _git_entry(path: Path) -> tuple[bytes, bytes]:
    """(mode, binary id) of one path; mode b"" for a folder with nothing git would keep."""
    if path.is_symlink():
        return b"120000", _git_hash(b"blob", os.fsencode(os.readlink(path)))
    if path.is_dir():
        entries = []
        for child in path.iterdir():
            mode, object_id = _git_entry(child)
            if mode:
                name = os.fsencode(child.name)
                entries.append(
                    (
                        name + b"/" if mode == b"40000" else name,
                        mode + b" " + name + b"\0" + object_id,
                    )
                )
        return (
            (b"40000", _git_hash(b"tree", b"".join(e for _, e in sorted(entries))))
            if entries
            else (b"", b"")
        )
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return (b"100755" if path.stat().st_mode & 0o100 else b"100644"), digest.digest()

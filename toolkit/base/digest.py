"""sha256 of files and of canonical JSON: what pins, locks, caches and records are keyed on."""

from __future__ import annotations

import hashlib
import json
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
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

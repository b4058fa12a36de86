"""Which caches a build may take wheels from: only those the user configured (a config file, `--cache URL`).

`.fa-envkit/caches.toml` in the working directory (or the file $FA_ENVKIT_CACHES names) lists them:

    [[cache]]
    url = "https://wheels.example.org/fa"     # file://, http:// or https://: the folder `toolkit publish` wrote
    public_key = "base64 of the ed25519 key"   # optional: entries must then be signed by exactly this key

`--cache URL` adds one for this build (its key, if any, from the file). No cache is consulted by default: a
wheel runs code on this machine, so trust is the user's choice, per cache and per key, as in Nix.
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10 reads TOML through tomli (a dependency there)
    import tomli as tomllib

CONFIG_FILE = Path(".fa-envkit") / "caches.toml"
CONFIG_VARIABLE = "FA_ENVKIT_CACHES"
MAX_CONFIG_BYTES = 1 << 20
SCHEMES = ("file", "http", "https")


@dataclass(frozen=True)
class CacheSite:
    url: str  # the index root, without a trailing slash
    public_key: str | None = None  # base64 ed25519 public key; None: unsigned entries are taken
    where: str = "--cache"  # where it was configured, for messages


def checked_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if (
        parts.scheme not in SCHEMES
        or (parts.scheme != "file" and not parts.netloc)
        or parts.query
        or parts.fragment
    ):
        raise ToolkitError(
            f"{where}: {url!r} is not a cache URL (file:///path, http://host/path or "
            f"https://host/path: the folder `toolkit publish --to` wrote)"
        )
    return url.rstrip("/")


def checked_key(key: object, where: str) -> str:
    try:
        if isinstance(key, str) and len(base64.b64decode(key, validate=True)) == 32:
            return key
    except (binascii.Error, ValueError):
        pass
    raise ToolkitError(
        f"{where}: public_key {key!r} is not the base64 of an ed25519 public key (copy the key "
        f"`toolkit publish --sign-key` printed)"
    )


def config_file() -> Path:
    return Path(os.environ[CONFIG_VARIABLE]) if os.environ.get(CONFIG_VARIABLE) else CONFIG_FILE


def read_config(path: Path) -> list[CacheSite]:
    """The caches a config file lists; no file, no caches."""
    where = display_path(path)
    fix = "fix it or remove it; see docs/binary-cache.md"
    try:
        text = regular_file_bytes(path, MAX_CONFIG_BYTES).decode()
    except Unreadable as exc:
        if exc.why == "missing":
            return []
        reason = exc.reason(MAX_CONFIG_BYTES)
        raise ToolkitError(f"{where}: unreadable cache configuration ({reason}; {fix})") from None
    except UnicodeDecodeError:
        raise ToolkitError(f"{where}: cache configuration is not UTF-8 text ({fix})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolkitError(f"{where}: not TOML ({exc}; {fix})") from None
    caches = data.get("cache", [])
    if set(data) - {"cache"} or not isinstance(caches, list):
        raise ToolkitError(f"{where}: expected only [[cache]] tables ({fix})")
    found = []
    for number, table in enumerate(caches, 1):
        at = f"{where}: cache {number}"
        if (
            not isinstance(table, dict)
            or set(table) - {"url", "public_key"}
            or not isinstance(table.get("url"), str)
        ):
            raise ToolkitError(
                f"{at}: a [[cache]] table has `url` and an optional `public_key`, nothing else ({fix})"
            )
        key = table.get("public_key")
        found.append(
            CacheSite(
                checked_url(table["url"], at), None if key is None else checked_key(key, at), at
            )
        )
    return found


def configured_caches(extra_urls: list[str] | None = None) -> list[CacheSite]:
    """The config file's caches, then each `--cache URL` not already among them (a URL the file lists keeps the
    file's key)."""
    caches = read_config(config_file())
    for url in extra_urls or []:
        url = checked_url(url, "--cache")
        if all(site.url != url for site in caches):
            caches.append(CacheSite(url))
    return caches

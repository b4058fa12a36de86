"""The one hash-verified download cache: flash-attn sdists (build) and conda archives (install).

An entry is <cache>/<sha256>/<file name>, made only from a sha256 of strict form and a plain file
name, so no pin can name a path outside the cache. An entry is used only after its bytes hash to
the pin again; a download lands in an owned temporary beside the entry, is hashed (and, for conda
archives, checked for what it would write) and only then renamed into place, under a file lock on
the entry, so jobs sharing a cache (Slurm array tasks, installs of several lines) never write or
remove one entry at once. A cached file that does not hash to its name is removed and reported
rather than silently fetched again: something other than this module wrote into the cache.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rich.progress import Progress

from toolkit.base.atomic import checkpoint, clean_stale, publish_file
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.paths import display_path
from toolkit.env.lockfile import FILE_NAME, SHA256

CHUNK = 1 << 20


class Pin(Protocol):
    """What the cache fetches: a URL and the file's name and sha256 (LockedSdist, LockedPackage)."""

    @property
    def url(self) -> str: ...

    @property
    def filename(self) -> str: ...

    @property
    def sha256(self) -> str: ...


def cache_entry(cache: Path, pin: Pin) -> Path:
    """<cache>/<sha256>/<filename>, refused unless both parts have their strict form."""
    for field, value, pattern, form in (("sha256", pin.sha256, SHA256, "sha256 (64 lowercase hex digits)"),
                                        ("filename", pin.filename, FILE_NAME, "plain file name (no / or ..)")):
        if not pattern.fullmatch(value):
            raise ToolkitError(f"{pin.url}: {field}: {value!r} is not a {form} (re-lock with `toolkit lock`)")
    return Path(cache) / pin.sha256 / pin.filename


def fetch_verified(pin: Pin, cache: Path, what: str, check: Callable[[Path], None] | None = None,
                   progress: Progress | None = None, pinned_by: str = "the lock") -> Path:
    """The pinned file from the cache, downloading it only when absent; `what` names it in messages,
    `check` may refuse a download before it enters the cache, `progress` shows the download, `pinned_by`
    names what pins its sha256 (a lock, a binary cache's table entry)."""
    entry = cache_entry(cache, pin)
    with locked(entry.parent):
        if entry.exists():
            return _cached(entry, pin, pinned_by)
        entry.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(entry.parent)  # partial downloads of killed runs
        with publish_file(entry) as partial:  # renamed into place only once checked
            _download(pin.url, pin.filename, partial, what, entry, progress)
            actual = sha256_file(partial)
            if actual != pin.sha256:
                raise ToolkitError(f"{what}: sha256 mismatch: downloaded file has sha256 {actual}, {pinned_by} pins "
                                   f"{pin.sha256} ({pin.url} served other bytes: it was changed or a mirror "
                                   f"serves another file; nothing was kept or installed)")
            if check:
                check(partial)
    return entry


def fetch_content_pinned(url: str, entry: Path, what: str, check: Callable[[Path], None]) -> Path:
    """A file pinned by what it holds rather than by its bytes (GitHub's archive of a commit, whose compression
    may change): the download enters the cache at `entry` only once `check` passed on it. A cached file is
    returned as it is: the caller checks what it unpacks to before using any of it (and removes a file that
    fails), so a file put there by hand, on a machine without network, is checked the same way."""
    with locked(entry.parent):
        if entry.exists():
            return entry
        entry.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(entry.parent)
        with publish_file(entry) as partial:
            _download(url, entry.name, partial, what, entry, None)
            check(partial)
    return entry


def _cached(entry: Path, pin: Pin, pinned_by: str) -> Path:
    actual = sha256_file(entry)
    if actual != pin.sha256:
        entry.unlink()
        raise ToolkitError(f"{display_path(entry)}: sha256 {actual} is not {pinned_by}'s {pin.sha256} "
                           f"(removed the file; re-run to download it again)")
    return entry


def _download(url: str, filename: str, partial: Path, what: str, entry: Path, progress: Progress | None) -> None:
    progress = progress or Progress(disable=True)
    task = progress.add_task(filename, total=None)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("xb") as out:
            progress.update(task, total=int(response.headers.get("Content-Length") or 0) or None)
            while chunk := response.read(CHUNK):
                out.write(chunk)
                progress.advance(task, len(chunk))
                checkpoint("download")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ToolkitError(f"{what}: cannot fetch {url} ({getattr(exc, 'reason', exc)}; is it reachable? "
                           f"without network, put the file at {display_path(entry)})") from None
    finally:
        progress.remove_task(task)

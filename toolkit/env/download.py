"""The one hash-verified download cache: flash-attn sdists (build) and conda archives (install).

An entry is <cache>/<sha256>/<file name>, made only from a sha256 of strict form and a plain file
name, so no pin can name a path outside the cache. An entry is used only after its bytes hash to
the pin again; a download lands in an owned temporary beside the entry, is hashed (and, for conda
archives, checked for what it would write) and only then renamed into place, under a file lock on
the entry, so jobs sharing a cache (Slurm array tasks, installs of several lines) never write or
remove one entry at once. A cached file that does not hash to its name is removed and reported
rather than silently fetched again: something other than this module wrote into the cache.

A warm install finds every entry by its stamp (a stat, no read): the network and progress-bar modules are
imported only when something is downloaded or hashed.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from toolkit.base.atomic import checkpoint, clean_stale, publish_file, write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.paths import display_path
from toolkit.env.lockfile import FILE_NAME, SHA256

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

CHUNK = 1 << 20
STAMP_BYTES = 512  # a stamp is one line of a sha256 and five numbers
RETRIES = 3  # a transient failure is tried again this many times
RETRY_WAIT_S = 0.5  # before the first retry; doubled before each next one
TRANSIENT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EPIPE,
    socket.EAI_AGAIN,
}  # the last: DNS, try again


class Pin(Protocol):
    """What the cache fetches: a URL and the file's name and sha256 (LockedSdist, LockedPackage)."""

    @property
    def url(self) -> str: ...

    @property
    def filename(self) -> str: ...

    @property
    def sha256(self) -> str: ...


P = TypeVar("P", bound=Pin)


def cache_entry(cache: Path, pin: Pin) -> Path:
    """<cache>/<sha256>/<filename>, refused unless both parts have their strict form."""
    for field, value, pattern, form in (
        ("sha256", pin.sha256, SHA256, "sha256 (64 lowercase hex digits)"),
        ("filename", pin.filename, FILE_NAME, "plain file name (no / or ..)"),
    ):
        if not pattern.fullmatch(value):
            raise ToolkitError(
                f"{pin.url}: {field}: {value!r} is not a {form} (re-lock with `toolkit lock`)"
            )
    return Path(cache) / pin.sha256 / pin.filename


def fetch_verified(
    pin: Pin,
    cache: Path,
    what: str,
    check: Callable[[Path], None] | None = None,
    progress: Progress | None = None,
    pinned_by: str = "the lock",
) -> Path:
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
                raise sha256_mismatch(what, actual, pin, pinned_by)
            if check:
                check(partial)
        _stamp(entry, pin)  # after the rename, which sets the file's ctime
    return entry


def sha256_mismatch(what: str, actual: str, pin: Pin, pinned_by: str) -> ToolkitError:
    """The one line for a download whose bytes are not the pinned ones."""
    return ToolkitError(
        f"{what}: sha256 mismatch: downloaded file has sha256 {actual}, {pinned_by} pins "
        f"{pin.sha256} ({pin.url} served other bytes: it was changed or a mirror "
        f"serves another file; nothing was kept or installed)"
    )


def fetch_all(
    pins: Sequence[P],
    cache: Path,
    describe: Callable[[P], str],
    console: Console,
    label: str,
    check: Callable[[Path], None] | None = None,
) -> list[Path]:
    """fetch_verified of every pin, in order, with a live bar: one for the whole (pins done) and one per download
    (bytes); `describe` names a pin in messages, `label` what they are ("conda archives"). Entries whose stamp
    still holds (a warm cache) are taken as they are, without a bar, a lock or a read: an entry is written only
    where none is, and removed only when it does not hash to its pin, which its stamp says it did."""
    found = [_stamped(cache_entry(cache, pin), pin) for pin in pins]
    if all(found):
        return [entry for entry in found if entry]
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task(f"verifying {len(pins)} {label}", total=len(pins))
        for n, pin in enumerate(pins):
            found[n] = found[n] or fetch_verified(pin, cache, describe(pin), check, progress)
            progress.advance(overall)
    return [entry for entry in found if entry]


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
    """The entry once it hashes to the pin; hashed again only when it changed since it last did (_stamp)."""
    if _stamped(entry, pin):
        return entry
    actual = sha256_file(entry)
    if actual != pin.sha256:
        _stamp_path(entry).unlink(missing_ok=True)
        entry.unlink()
        raise ToolkitError(
            f"{display_path(entry)}: sha256 {actual} is not {pinned_by}'s {pin.sha256} "
            f"(removed the file; re-run to download it again)"
        )
    _stamp(entry, pin)
    return entry


def _stamped(entry: Path, pin: Pin) -> Path | None:
    """The entry if its stamp says it still holds the bytes that hashed to the pin, else None."""
    try:
        found = regular_file_bytes(_stamp_path(entry), STAMP_BYTES)
        return entry if found == _stamp_text(entry, pin).encode() else None
    except (Unreadable, OSError):
        return None


def kept_with_stamp(
    entry: Path, pin: Pin, name: str, read: Callable[[Path], bytes], limit: int
) -> bytes:
    """read(entry) for a verified entry, kept beside it (.<file>.<name>, at most `limit` bytes) after its stamp and
    taken from there while that stamp still holds: what a warm install needs from an archive (its info/index.json)
    is then one small read, not the archive's. Trusted as far as the stamp is (_stamp_text)."""
    kept = entry.with_name(f".{entry.name}.{name}")
    stamp = _stamp_text(entry, pin).encode()
    try:
        found = regular_file_bytes(kept, len(stamp) + limit)
        if found.startswith(stamp):
            return found[len(stamp) :]
    except (Unreadable, OSError):
        pass
    value = read(entry)
    try:
        write_atomic(kept, stamp + value)
    except OSError:
        pass  # a read-only cache: read again next time
    return value


def _stamp_path(entry: Path) -> Path:
    """Beside the entry, named as no entry can be (FILE_NAME never starts with a dot)."""
    return entry.with_name(f".{entry.name}.verified")


def _stamp_text(entry: Path, pin: Pin) -> str:
    """What an entry was when it last hashed to the pin: its size, mtime, ctime, inode and device. Any write or
    rename gives it another ctime, which only the kernel sets (no utime call can), so an entry whose stamp still
    matches holds the bytes that were hashed and is not read again: a warm install of 3 GB of archives need not
    hash them all. (Whoever can write into the cache could also write py-rattler's and uv's unpacked caches
    beside it, which are linked into environments unhashed: the stamp guards against changed files, as those do.)"""
    st = entry.stat()
    return f"{pin.sha256} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}\n"


def _stamp(entry: Path, pin: Pin) -> None:
    try:
        write_atomic(_stamp_path(entry), _stamp_text(entry, pin))
    except OSError:
        pass  # a read-only cache: hashed again next time


def _download(
    url: str, filename: str, partial: Path, what: str, entry: Path, progress: Progress | None
) -> None:
    """The file at `url` into `partial`; a transient failure (a reset connection, a timeout, a cut-off body,
    HTTP 408/429/5xx) is tried again from the start, RETRIES times after waits of RETRY_WAIT_S, 2x, 4x...:
    one reset connection must not fail an install of 71 archives. Anything else fails at once."""
    import http.client
    import urllib.error

    from rich.progress import Progress

    progress = progress or Progress(disable=True)
    task = progress.add_task(filename, total=None)
    try:
        for attempt in range(RETRIES + 1):
            try:
                partial.unlink(missing_ok=True)
                progress.reset(task, total=None)
                _fetch_once(url, partial, progress, task)
                return
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                if attempt == RETRIES or not transient(exc):
                    tried = f" after {attempt + 1} tries" if attempt else ""
                    raise ToolkitError(
                        f"{what}: cannot fetch {url} ({getattr(exc, 'reason', exc)}{tried}; is it "
                        f"reachable? without network, put the file at {display_path(entry)})"
                    ) from None
                time.sleep(RETRY_WAIT_S * 2**attempt)
    finally:
        progress.remove_task(task)


def _fetch_once(url: str, partial: Path, progress: Progress, task: TaskID) -> None:
    import http.client
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as response, partial.open("xb") as out:
        size = int(response.headers.get("Content-Length") or 0)
        progress.update(task, total=size or None)
        written = 0
        while chunk := response.read(CHUNK):
            out.write(chunk)
            written += len(chunk)
            progress.advance(task, len(chunk))
            checkpoint("download")
        if (
            size and written != size
        ):  # the connection closed early: urllib returns a short body without a word
            raise http.client.IncompleteRead(b"", size - written)


def transient(exc: BaseException) -> bool:
    """Whether a failed download may succeed when tried again: the network's or the server's passing state,
    not a missing file, a refused request or a malformed URL."""
    import http.client
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, urllib.error.URLError):
        return (
            isinstance(exc.reason, (TimeoutError, ConnectionError, socket.timeout))
            or isinstance(exc.reason, OSError)
            and exc.reason.errno in TRANSIENT_ERRNOS
        )
    return isinstance(
        exc,
        (TimeoutError, ConnectionError, http.client.IncompleteRead, http.client.RemoteDisconnected),
    )

"""The one hash-verified download cache (toolkit/env/download.py), as both of its callers use it: conda
archives of the test channel (real .conda/.tar.bz2 containers built by tests/conda_channel.py) and a
flash-attn sdist stand-in, fetched over file:// and loopback http."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conda_channel import channel_dir, serve_directory  # noqa: F401
from test_hostile_archives import HOSTILE, dot_conda

from toolkit.base.errors import ToolkitError
from toolkit.build.fa2 import fetch_sdist
from toolkit.env import download
from toolkit.env.archives import check_conda_archive
from toolkit.env.download import cache_entry, fetch_verified
from toolkit.env.lockfile import LockedPackage, LockedSdist

ROOT = Path(__file__).resolve().parent.parent


def sha256_of(path: Path) -> str:
    """hashlib's sha256 of the whole file, for expected values independent of toolkit/base/digest.py."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def package_of(archive: Path, url: str | None = None) -> LockedPackage:
    return LockedPackage("conda", archive.name.split("-")[0], "1", url or archive.as_uri(), sha256_of(archive))


def test_conda_archive_and_sdist_share_one_cache_layout(channel_dir, tmp_path):
    archive = next(channel_dir.rglob("*.conda"))
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    sdist.write_bytes(b"sdist bytes")
    cached_archive = fetch_verified(package_of(archive), tmp_path / "cache", "ninja", check_conda_archive)
    cached_sdist = fetch_sdist(LockedSdist(sdist.as_uri(), sdist.name, sha256_of(sdist)), tmp_path / "cache")
    assert cached_archive == tmp_path / "cache" / sha256_of(archive) / archive.name
    assert cached_sdist == tmp_path / "cache" / "sdist" / sha256_of(sdist) / sdist.name
    assert cached_archive.read_bytes() == archive.read_bytes() and cached_sdist.read_bytes() == b"sdist bytes"


def test_over_http_then_offline_hit(channel_dir, tmp_path):
    archive = next(channel_dir.rglob("*.tar.bz2"))
    with serve_directory(archive.parent) as url:
        pin = package_of(archive, f"{url}/{archive.name}")
        cached = fetch_verified(pin, tmp_path / "cache", "pkg", check_conda_archive)
    assert fetch_verified(pin, tmp_path / "cache", "pkg", check_conda_archive) == cached  # server gone: cache hit


def test_a_corrupted_conda_entry_is_removed_and_reported_then_fetched_again(channel_dir, tmp_path):
    archive = next(channel_dir.rglob("*.conda"))
    pin = package_of(archive)
    cached = fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1")
    cached.write_bytes(b"corrupted")
    with pytest.raises(ToolkitError, match=f"{cached.name}: sha256 .* is not the lock's .*re-run") as caught:
        fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1")
    assert "\n" not in str(caught.value) and not cached.exists()
    assert fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1").read_bytes() == archive.read_bytes()


def test_an_unchanged_entry_is_not_hashed_again_and_a_changed_one_is_refused(channel_dir, tmp_path, monkeypatch):
    """A warm install must not hash every cached archive again (3 GB for a CUDA layer): an entry unchanged since it
    was verified is used as it is. Changed (even to bytes of the same size, its mtime put back), it is hashed
    again, refused and removed: the kernel gives it a new ctime, which no utime call can set back."""
    archive = next(channel_dir.rglob("*.conda"))
    pin = package_of(archive)
    cached = fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1")
    hashed: list[Path] = []
    real = download.sha256_file
    monkeypatch.setattr(download, "sha256_file", lambda path: hashed.append(Path(path)) or real(path))
    assert fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1") == cached and hashed == []
    before = cached.stat()
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 1
    cached.write_bytes(bytes(data))
    os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cached.stat().st_size == before.st_size and cached.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(ToolkitError, match=f"{cached.name}: sha256 {sha256_of(cached)} is not the lock's"):
        fetch_verified(pin, tmp_path / "cache", "ninja 1.12.1")
    assert hashed == [cached] and not cached.exists()


def test_a_warm_fetch_all_reads_no_archive_and_imports_no_network_or_bar(channel_dir, tmp_path):
    """A warm install pays only stat calls for its archives: every entry found by its stamp is taken without
    hashing it, and neither the network modules nor rich's progress bars are imported (a fresh interpreter,
    whose sys.modules says what was imported)."""
    pins = [(a.name.rsplit("-", 2)[0], a.as_uri(), sha256_of(a)) for a in sorted(channel_dir.rglob("*.conda"))[:3]]
    code = f"""
import sys
from pathlib import Path
from rich.console import Console
from toolkit.env import download
from toolkit.env.lockfile import LockedPackage
pins = [LockedPackage("conda", name, "1", url, sha) for name, url, sha in {pins!r}]
hashed = []
download.sha256_file = lambda path, real=download.sha256_file: hashed.append(path) or real(path)
found = download.fetch_all(pins, Path({str(tmp_path / "cache")!r}), str, Console(quiet=True), "archives")
print(len(found), len(hashed), *sorted(m for m in ("rich.progress", "urllib.request", "http.client") if m in sys.modules))
"""
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split()[:2] == ["3", "3"]  # cold: each downloaded (file://) and hashed once
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.split() == ["3", "0"]


def test_a_hostile_archive_with_the_pinned_hash_never_enters_the_cache(tmp_path):
    payload, listed = HOSTILE["dotdot member"]
    archive = dot_conda(tmp_path, payload, listed)
    with pytest.raises(ToolkitError, match="re-lock from a trusted channel"):
        fetch_verified(package_of(archive), tmp_path / "cache", "evil 1.0", check_conda_archive)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


def test_bytes_other_than_the_pin_are_refused_and_nothing_is_kept(tmp_path):
    served = tmp_path / "x-1.0-0.conda"
    served.write_bytes(b"other bytes")
    pin = LockedPackage("conda", "x", "1.0", served.as_uri(), "ab" * 32)
    with pytest.raises(ToolkitError) as caught:
        fetch_verified(pin, tmp_path / "cache", "locks/cu126.conda-lock.yml: x 1.0")
    message = str(caught.value)
    assert "\n" not in message and "x 1.0: sha256 mismatch" in message and "ab" * 32 in message
    assert not cache_entry(tmp_path / "cache", pin).exists()
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


def test_an_unreachable_url_is_one_line_with_the_offline_fix(tmp_path):
    pin = LockedSdist("http://127.0.0.1:9/flash_attn-2.8.3.tar.gz", "flash_attn-2.8.3.tar.gz", "cd" * 32)
    with pytest.raises(ToolkitError) as caught:
        fetch_sdist(pin, tmp_path / "cache")
    entry = cache_entry(tmp_path / "cache" / "sdist", pin)
    assert "\n" not in str(caught.value) and "cannot fetch" in str(caught.value)
    assert f"put the file at {entry}" in str(caught.value)


# ---------------------------------------------------------------- transient failures are tried again


class FlakyServer:
    """Loopback http serving one file, whose first `failures` connections break as `how` says: reset before an
    answer, cut off (reset) halfway through the body, or 404; counts every connection."""

    def __init__(self, data: bytes, how: str, failures: int) -> None:
        self.data, self.how, self.failures, self.connections = data, how, failures, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.connections += 1
                if outer.connections > outer.failures:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(outer.data)))
                    self.end_headers()
                    self.wfile.write(outer.data)
                    return
                if outer.how == "404":
                    self.send_error(404)
                    return
                if outer.how == "cut off":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(outer.data)))
                    self.end_headers()
                    self.wfile.write(outer.data[:len(outer.data) // 2])
                    self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()  # SO_LINGER 0: a TCP reset, as a dropped connection gives

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/x-1.0-0.tar.bz2"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("how", ["reset", "cut off"])
def test_a_transient_failure_is_tried_again_and_the_download_succeeds(tmp_path, how, monkeypatch):
    """One reset connection must not fail an install of 71 archives: the download starts again (from the start,
    a partial body never counts) and the pinned file enters the cache."""
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.01)
    data = os.urandom(3 << 20)
    server = FlakyServer(data, how, failures=1)
    try:
        pin = LockedPackage("conda", "x", "1.0", server.url, hashlib.sha256(data).hexdigest())
        cached = fetch_verified(pin, tmp_path / "cache", "x 1.0")
    finally:
        server.close()
    assert cached.read_bytes() == data and server.connections == 2


def test_retries_are_bounded_and_the_failure_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.01)
    server = FlakyServer(b"never served", "reset", failures=100)
    try:
        pin = LockedPackage("conda", "x", "1.0", server.url, "ab" * 32)
        with pytest.raises(ToolkitError) as caught:
            fetch_verified(pin, tmp_path / "cache", "x 1.0")
    finally:
        server.close()
    assert server.connections == download.RETRIES + 1 == 4
    assert "\n" not in str(caught.value) and f"x 1.0: cannot fetch {server.url} (" in str(caught.value)
    assert "after 4 tries" in str(caught.value) and not cache_entry(tmp_path / "cache", pin).exists()


def test_a_missing_file_is_not_tried_again(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.01)
    server = FlakyServer(b"", "404", failures=100)
    try:
        pin = LockedPackage("conda", "x", "1.0", server.url, "ab" * 32)
        with pytest.raises(ToolkitError, match=r"x 1\.0: cannot fetch .*x-1\.0-0\.tar\.bz2 \(Not Found; is it"):
            fetch_verified(pin, tmp_path / "cache", "x 1.0")
    finally:
        server.close()
    assert server.connections == 1

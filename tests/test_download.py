"""The one hash-verified download cache (toolkit/env/download.py), as both of its callers use it: conda
archives of the test channel (real .conda/.tar.bz2 containers built by tests/conda_channel.py) and a
flash-attn sdist stand-in, fetched over file:// and loopback http."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conda_channel import channel_dir, serve_directory  # noqa: F401
from test_hostile_archives import HOSTILE, dot_conda

from toolkit.base.errors import ToolkitError
from toolkit.build.builder import fetch_sdist
from toolkit.env.archives import check_conda_archive
from toolkit.env.download import cache_entry, fetch_verified
from toolkit.env.lockfile import LockedPackage, LockedSdist


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

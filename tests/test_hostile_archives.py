"""Crafted conda archives and sdists: refused in one line before anything is written outside the toolkit's
directories. The archives are real .tar.bz2 / .conda containers (tarfile, zip + zstd, the formats conda
packages use); only their member paths are hostile. The real packages of the test channel pass."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard
from conda_channel import build_channel, toolchain_packages

from toolkit.base.errors import ToolkitError
from toolkit.build.source import extract_sdist
from toolkit.env.archives import check_conda_archive


def _tar_bytes(members: list[tuple[str, bytes | str]], mode: str = "w") -> bytes:
    """members: (name, data) for files, (name, "->target") for symlinks."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data.removeprefix("->")
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _paths_json(paths: list[str]) -> bytes:
    return json.dumps({"paths_version": 1, "paths": [{"_path": p, "path_type": "hardlink"} for p in paths]}).encode()


def tar_bz2(directory: Path, payload: list[tuple[str, bytes | str]], listed: list[str]) -> Path:
    path = directory / "evil-1.0-0.tar.bz2"
    path.write_bytes(_tar_bytes([("info/index.json", b"{}"), ("info/paths.json", _paths_json(listed)), *payload],
                                mode="w:bz2"))
    return path


def dot_conda(directory: Path, payload: list[tuple[str, bytes | str]], listed: list[str]) -> Path:
    path = directory / "evil-1.0-0.conda"
    compress = zstandard.ZstdCompressor().compress
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", '{"conda_pkg_format_version": 2}')
        archive.writestr("info-evil-1.0-0.tar.zst", compress(_tar_bytes(
            [("info/index.json", b"{}"), ("info/paths.json", _paths_json(listed))])))
        archive.writestr("pkg-evil-1.0-0.tar.zst", compress(_tar_bytes(payload)))
    return path


HOSTILE = {
    "dotdot member": ([("../../escape.txt", b"x")], ["lib/ok.txt"]),
    "absolute member": ([("/tmp/escape.txt", b"x")], ["lib/ok.txt"]),
    "dotdot listed": ([("lib/ok.txt", b"x")], ["lib/../../escape.txt"]),
    "absolute listed": ([("lib/ok.txt", b"x")], ["/etc/cron.d/x"]),
    "newline in name": ([("lib/a\nb", b"x")], ["lib/a\nb"]),
    "symlink out": ([("lib/link", "->../../../etc")], ["lib/link"]),
    "absolute symlink": ([("lib/link", "->/etc/passwd")], ["lib/link"]),
}


@pytest.mark.parametrize("make", [tar_bz2, dot_conda], ids=["tar.bz2", "conda"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused_in_one_line(tmp_path: Path, make, case: str):
    payload, listed = HOSTILE[case]
    archive = make(tmp_path, payload, listed)
    with pytest.raises(ToolkitError) as caught:
        check_conda_archive(archive)
    assert "\n" not in str(caught.value) and "re-lock from a trusted channel" in str(caught.value)


@pytest.mark.parametrize("data", [b"", b"not an archive", b"PK\x03\x04garbage"])
@pytest.mark.parametrize("suffix", [".conda", ".tar.bz2"])
def test_garbage_archive_is_refused_in_one_line(tmp_path: Path, data: bytes, suffix: str):
    archive = tmp_path / f"x-1-0{suffix}"
    archive.write_bytes(data)
    with pytest.raises(ToolkitError) as caught:
        check_conda_archive(archive)
    assert "not a readable conda archive" in str(caught.value) and "\n" not in str(caught.value)


def test_inner_relative_paths_and_links_are_accepted(tmp_path: Path):
    archive = dot_conda(tmp_path, [("lib/a/../b.txt", b"x"), ("lib/libx.so", "->libx.so.1"), ("lib/libx.so.1", b"x")],
                        ["lib/b.txt", "lib/libx.so", "lib/libx.so.1"])
    check_conda_archive(archive)


def test_the_test_channels_real_archives_pass(tmp_path: Path):
    channel = build_channel(tmp_path / "channel", toolchain_packages())
    archives = [p for p in channel.rglob("*") if p.name.endswith((".conda", ".tar.bz2"))]
    assert archives
    for archive in archives:
        check_conda_archive(archive)


@pytest.mark.parametrize("members", [
    [("flash_attn-2.8.3/setup.py", b""), ("../escape.txt", b"x")],
    [("flash_attn-2.8.3/setup.py", b""), ("/tmp/escape.txt", b"x")],
    [("flash_attn-2.8.3/setup.py", b""), ("flash_attn-2.8.3/link", "->/etc/passwd")],
    [("a/setup.py", b""), ("b/setup.py", b"")],
], ids=["dotdot", "absolute", "absolute-symlink", "two-tops"])
def test_crafted_sdist_is_refused_and_writes_nothing_outside(tmp_path: Path, members):
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    sdist.write_bytes(_tar_bytes(members, mode="w:gz"))
    dest = tmp_path / "build" / "unpacked"
    dest.mkdir(parents=True)
    with pytest.raises(ToolkitError) as caught:
        extract_sdist(sdist, dest)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", sdist.name]
    assert not Path("/tmp/escape.txt").exists()


def _sdist_bytes() -> bytes:
    return _tar_bytes([("flash_attn-2.8.3/setup.py", b"x" * 4096),
                       ("flash_attn-2.8.3/csrc/big.cu", bytes(range(256)) * 512)], mode="w:gz")


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]


@pytest.mark.parametrize("damage", [
    lambda whole: whole[:len(whole) // 2],  # gzip's EOFError
    lambda whole: b"<html>404: Not Found</html>\n",  # tarfile's "could not be opened", a line per method
    lambda whole: b"",
    _flipped,  # zlib.error or gzip's CRC check
], ids=["truncated", "html", "empty", "corrupt"])
def test_an_sdist_that_is_cut_short_or_no_tar_is_one_line(tmp_path: Path, damage):
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    sdist.write_bytes(damage(_sdist_bytes()))
    with pytest.raises(ToolkitError) as caught:
        extract_sdist(sdist, tmp_path / "unpacked")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{sdist}: cannot unpack an sdist (") and message.endswith(
        "; re-lock)")

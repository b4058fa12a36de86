"""`fa4 cache-install` with tampered artifacts and records, and a --dest that holds other files (hostile review D3).

The artifacts are made here the way `fa4_jit.pack` makes them (a tar.gz of the cache folder beside a
.kernel-cache.json naming it and its sha256), with the layout of FA4's cache (flash_attn/cute/cache_utils.py of
the pinned flash_attn_4 4.0.0b36 wheel: <fingerprint>/<sha256 of the compile key>.o, a <sha256>.lock
beside each entry that FA4 itself creates when it loads or writes one). The object files' bytes are
NOT real kernels: cache-install never looks inside them. No torch needed: the key is passed directly,
and the CLI test's install is a site folder of dist-info STAND-INS (metadata files only).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

from toolkit.base.atomic import OWNER_SUFFIX, temp_name
from toolkit.base.errors import ToolkitError
from toolkit.cli import main
from toolkit.env.install_record import Fa4Record
from toolkit.fa4 import jit as fa4_jit

KEY = {"flash_attn_4": "4.0.0b36", "cutlass_dsl": "4.8.1", "torch": "2.11.0", "python": "3.12", "arch": "90"}
FP = "0123abcd" * 8  # FA4's source fingerprint folder
A, B, C = ("a" * 64, "b" * 64, "c" * 64)  # entries' names: sha256 of their compile keys


Member = tuple[tarfile.TarInfo, bytes]


def entry(name: str, data: bytes = b"\x7fELF stand-in object") -> Member:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    return member, data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> Member:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, target
    return member, b""


def artifact(folder: Path, members: list[Member], name: str = "cache", **record) -> Path:
    """folder/<name>.tar.gz of `members` and its record folder/<name>.kernel-cache.json (fields overridable)."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data))
    fields = {"kind": "fa4-kernel-cache", "key": KEY, "artifact": archive.name,
              "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(), "entries": len(members), "variants": [],
              "env": sorted(fa4_jit.cache_env(Path("DIR"))), **record}
    path = folder / f"{name}.kernel-cache.json"
    path.write_text(json.dumps(fields))
    return path


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path below folder and its bytes (None for a folder): what a test compares before and after."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


def refused(record: Path, dest: Path, key: dict = KEY) -> str:
    with pytest.raises(ToolkitError) as caught:
        fa4_jit.unpack(record, key, dest)
    text = str(caught.value)
    assert text and "\n" not in text
    return text


def no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(".fa-envkit-tmp-")]


def test_a_member_never_replaces_a_users_file_in_dest(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    record = artifact(tmp_path / "wh", [entry("notes.txt", b"OVERWRITTEN")])
    assert "holds files no cache-install wrote" in refused(record, dest)
    other = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o")], name="other")  # no clash: still not ours to fill
    assert "holds files no cache-install wrote" in refused(other, dest)
    assert tree(dest) == {"notes.txt": b"mine"} and no_temporaries(tmp_path)


HOSTILE = {  # a good member first: the review saw it left behind ("half unpacked")
    "../ escape": entry("../../review-escaped.txt", b"x"),
    "absolute symlink": link(f"{FP}/evil.o", "/etc/passwd"),
    "escaping symlink": link(f"{FP}/evil.o", "../../../etc/passwd"),
    "hard link out": link(f"{FP}/evil.o", "/etc/passwd", tarfile.LNKTYPE),
}


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("dest_exists", [False, True])
def test_a_refused_member_leaves_dest_as_it_was(tmp_path, name, dest_exists):
    dest = tmp_path / "sub" / "dest"
    if dest_exists:
        dest.mkdir(parents=True)
    record = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o"), HOSTILE[name]])
    assert "refused member" in refused(record, dest)
    assert dest.exists() == dest_exists and tree(dest) == {}
    assert not list(tmp_path.rglob("review-escaped.txt")) and no_temporaries(dest.parent)


def _record_fields(folder: Path, **fields) -> Path:
    return artifact(folder, [entry(f"{FP}/{A}.o")], **fields)


def _not_a_tar(folder: Path) -> Path:
    record = _record_fields(folder)
    archive = folder / "cache.tar.gz"
    archive.write_bytes(b"not a tar at all" * 100)
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}))
    return record


def _truncated(folder: Path) -> Path:
    record = artifact(folder, [entry(f"{FP}/{n}.o", os.urandom(50_000)) for n in (A, B, C)])
    archive = folder / "cache.tar.gz"
    archive.write_bytes(archive.read_bytes()[:60_000])
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}))
    return record


def _deep(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "r.kernel-cache.json").write_text("[" * 100_000 + "]" * 100_000)
    return folder / "r.kernel-cache.json"


def _a_list(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "r.kernel-cache.json").write_text("[]")
    return folder / "r.kernel-cache.json"


DAMAGED = {  # record or artifact -> a phrase of its refusal
    "missing artifact": (lambda f: _record_fields(f, artifact="nope.tar.gz"), "nope.tar.gz: not found"),
    "no sha256": (lambda f: _record_fields(f, sha256=None), "sha256: not a sha256"),
    "sha256 not hex": (lambda f: _record_fields(f, sha256="$(id)"), "sha256: not a sha256"),
    "sha256 differs": (lambda f: _record_fields(f, sha256="0" * 64), "sha256 differs"),
    "artifact ..": (lambda f: _record_fields(f, artifact=".."), "artifact: must be a file name"),
    "artifact a list": (lambda f: _record_fields(f, artifact=["x"]), "artifact: must be a file name"),
    "not a tar": (_not_a_tar, "not a readable cache artifact (ReadError"),
    "truncated gzip": (_truncated, "not a readable cache artifact (EOFError"),
    "record a list": (_a_list, "not a cache record"),
    "record deep": (_deep, "nested too deeply"),
    "record missing": (lambda f: f / "none.kernel-cache.json", "file not found"),
    "another key": (lambda f: _record_fields(f, key={**KEY, "arch": "100"}), "built for"),
}


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_record_or_artifact_is_one_line_and_writes_nothing(tmp_path, name):
    make, phrase = DAMAGED[name]
    dest = tmp_path / "dest"
    assert phrase in refused(make(tmp_path / "wh"), dest)
    assert not dest.exists() and no_temporaries(tmp_path)


def test_a_dest_that_is_not_a_folder_is_one_line(tmp_path):
    record = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o")])
    (tmp_path / "file").write_text("mine")
    assert "not a folder" in refused(record, tmp_path / "file")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert "not a folder" in refused(record, tmp_path / "link")
    assert (tmp_path / "file").read_text() == "mine" and (tmp_path / "link").is_symlink()
    assert tree(tmp_path / "real") == {}


def test_a_second_install_replaces_only_what_cache_install_wrote(tmp_path):
    dest = tmp_path / "dest"
    first = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a1"), entry(f"{FP}/{B}.o", b"b1")], name="first")
    env = fa4_jit.unpack(first, KEY, dest)
    assert env[fa4_jit.CACHE_DIR_ENV] == str(dest) and (dest / FP / f"{A}.o").read_bytes() == b"a1"
    dest.chmod(0o750)
    # what FA4 does with the cache: a lock beside each entry it loads (held while loading), a new entry
    (dest / FP / f"{A}.lock").touch()
    (dest / FP / f"{C}.o").write_bytes(b"compiled by FA4")
    (dest / "README").write_text("the user's note")
    lock_inode = (dest / FP / f"{A}.lock").stat().st_ino
    with open(dest / FP / f"{A}.lock") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        second = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a2"), entry(f"{FP}/d.o", b"d2")], name="second")
        fa4_jit.unpack(second, KEY, dest)
    assert tree(dest / FP) == {f"{A}.o": b"a2", f"{B}.o": b"b1", f"{A}.lock": b"", f"{C}.o": b"compiled by FA4",
                               "d.o": b"d2"}
    assert (dest / "README").read_text() == "the user's note" and (dest / FP / f"{A}.lock").stat().st_ino == lock_inode
    assert dest.stat().st_mode & 0o777 == 0o750 and no_temporaries(tmp_path)
    before = tree(dest)
    clash = artifact(tmp_path / "wh", [entry(f"{FP}/d.o", b"d3"), entry(f"{FP}/{C}.o", b"EVIL")], name="clash")
    assert f"{FP}/{C}.o" in refused(clash, dest)
    readme = artifact(tmp_path / "wh", [entry("README/x.o", b"x")], name="readme")
    assert "README" in refused(readme, dest)
    assert tree(dest) == before


def test_an_interrupted_install_leaves_dest_as_it_was(tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    fa4_jit.unpack(artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a1")], name="first"), KEY, dest)
    (dest / FP / f"{C}.o").write_bytes(b"compiled by FA4")
    before = tree(dest)
    extract = tarfile.TarFile.extract

    def interrupted(self, path, *args, filter=None, **kwargs):
        extract(self, self.getmembers()[0], path, filter=filter)  # one member in, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(tarfile.TarFile, "extractall", interrupted)
    second = artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a2"), entry(f"{FP}/{B}.o", b"b2")], name="second")
    with pytest.raises(KeyboardInterrupt):
        fa4_jit.unpack(second, KEY, dest)
    assert tree(dest) == before and no_temporaries(tmp_path)


def key_packages(site: Path) -> Path:
    """dist-info STAND-INS of the three packages the cache key names, in `site`."""
    for name, version in (("flash_attn_4", KEY["flash_attn_4"]), ("nvidia_cutlass_dsl", KEY["cutlass_dsl"]),
                          ("torch", KEY["torch"])):
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    return site


@pytest.fixture
def install(tmp_path) -> Path:
    """A `fa4 install` folder: its record, and dist-info STAND-INS of the three packages the key names."""
    site = key_packages(tmp_path / "site")
    Fa4Record("4.0.0b36", "13", str(site), sys.executable, [], {}, [str(site)]).write(site)
    return site


def test_cache_install_refusals_are_one_line(install, tmp_path, capsys):
    key = fa4_jit.cache_key(sys.executable, Fa4Record.load(install, "").env(), "90")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert key == {**KEY, "python": python}
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    wheelhouse = tmp_path / "wh"
    overwrite = artifact(wheelhouse, [entry("notes.txt", b"OVERWRITTEN")], name="overwrite", key=key)
    dotdot = artifact(wheelhouse, [entry("good.o", b"x"), entry("../../review-escaped.txt", b"x")], name="dotdot",
                      key=key)
    for record, where in ((overwrite, dest), (dotdot, dest), (dotdot, tmp_path / "new")):
        args = ["fa4", "cache-install", "--target", str(install), "--arch", "90", "--cache-record", str(record)]
        assert main([*args, "--dest", str(where)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert tree(dest) == {"notes.txt": b"mine"} and not (tmp_path / "new").exists()
    assert not list(tmp_path.rglob("review-escaped.txt"))


def test_a_full_disk_while_unpacking_is_one_line_and_leaves_dest_as_it_was(tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    fa4_jit.unpack(artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a1")], name="first"), KEY, dest)
    before = tree(dest)

    def full(self, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tarfile.TarFile, "extractall", full)
    second = artifact(tmp_path / "wh", [entry(f"{FP}/{B}.o", b"b2")], name="second")
    assert "cannot install the cache there (No space left on device" in refused(second, dest)
    assert tree(dest) == before and no_temporaries(tmp_path)


def test_what_a_killed_install_left_beside_dest_is_removed_by_the_next(tmp_path):
    """A SIGKILL between publish_dir's swap and its cleanup leaves an owned folder with an unlocked owner."""
    left = tmp_path / f"{temp_name('dest')}4194304-0badc0de"
    (left / FP).mkdir(parents=True)
    (left / FP / f"{A}.o").write_bytes(b"old tree")
    left.with_name(left.name + OWNER_SUFFIX).touch()
    fa4_jit.unpack(artifact(tmp_path / "wh", [entry(f"{FP}/{A}.o", b"a1")]), KEY, tmp_path / "dest")
    assert no_temporaries(tmp_path) and (tmp_path / "dest" / FP / f"{A}.o").read_bytes() == b"a1"

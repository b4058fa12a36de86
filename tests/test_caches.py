"""`toolkit caches`: the user's cache folders shown with their sizes (summed here by GNU find, not by the
toolkit), `prune` removing only what nothing reads (uv's own prune, an earlier version's folder), `clear` all of
them through a temporary a killed run leaves to the next, and a cache folder that is a link left alone."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("uv", "conda-pkgs", "rattler-pkgs", "wheels")


def fill(cache: Path) -> dict[str, bytes]:
    """Each cache folder with a few files of known sizes in sub-folders; returns {relative path: bytes}."""
    written = {}
    for n, name in enumerate(FOLDERS):
        for k in range(3):
            path = cache / "fa-envkit" / name / f"sub{k}" / f"f{k}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = os.urandom(1000 * (n + 1) + k)
            path.write_bytes(data)
            written[str(path.relative_to(cache))] = data
    return written


def find_bytes(folder: Path) -> int:
    """The sizes of the files below `folder`, by GNU find (an independent count)."""
    if not folder.exists():
        return 0
    out = subprocess.run(["find", str(folder), "-type", "f", "-printf", "%s\\n"], capture_output=True, text=True,
                         check=True).stdout
    return sum(int(line) for line in out.split())


def digest(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(str(p.relative_to(folder)).encode() + p.read_bytes() for p in files)).hexdigest()


def shown(capsys) -> dict[str, dict]:
    assert main(["caches", "show", "--json"]) == 0
    return {f["name"]: f for f in json.loads(capsys.readouterr().out)}


def test_show_gives_each_folder_and_its_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fill(tmp_path)
    found = shown(capsys)
    assert sorted(found) == sorted(FOLDERS)
    for name in FOLDERS:
        assert found[name]["size_bytes"] == find_bytes(tmp_path / "fa-envkit" / name)
        assert found[name]["path"] == str(tmp_path / "fa-envkit" / name)
    assert [n for n, f in found.items() if f["former"]] == ["wheels"]
    assert main(["caches"]) == 0  # `show` is the default step
    table = capsys.readouterr().out
    assert str(tmp_path / "fa-envkit" / "rattler-pkgs") in table and "in all" in table


def test_prune_removes_only_what_no_install_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fill(tmp_path)
    kept = {name: digest(tmp_path / "fa-envkit" / name) for name in ("conda-pkgs", "rattler-pkgs")}
    assert main(["caches", "prune"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "fa-envkit" / "wheels").exists() and "wheels" in out and "freed" in out
    assert {name: digest(tmp_path / "fa-envkit" / name) for name in kept} == kept
    assert (tmp_path / "fa-envkit" / "uv").is_dir()  # uv's prune ran on it (its own rules)
    assert [p.name for p in (tmp_path / "fa-envkit").iterdir() if p.name.startswith(".")] == []


def test_clear_removes_every_folder_and_frees_their_bytes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fill(tmp_path)
    before = sum(find_bytes(tmp_path / "fa-envkit" / name) for name in FOLDERS)
    assert main(["caches", "clear"]) == 0
    out = capsys.readouterr().out
    assert sum(find_bytes(tmp_path / "fa-envkit" / name) for name in FOLDERS) == 0
    assert f"{before / 1e6:.1f} MB freed" in out
    assert sorted(p.name for p in (tmp_path / "fa-envkit").iterdir()) == ["in-use.lock", "uv"]  # uv keeps its empty cache


def test_a_cache_folder_that_is_a_link_is_shown_and_left(tmp_path, monkeypatch, capsys):
    """An admin who moved py-rattler's cache to scratch: its files are not the toolkit's to remove."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    scratch = tmp_path / "scratch" / "rattler"
    scratch.mkdir(parents=True)
    (scratch / "keep.bin").write_bytes(b"x" * 100)
    (tmp_path / "home" / "fa-envkit").mkdir(parents=True)
    (tmp_path / "home" / "fa-envkit" / "rattler-pkgs").symlink_to(scratch)
    assert shown(capsys)["rattler-pkgs"]["link_to"] == str(scratch)
    assert main(["caches", "clear"]) == 0
    capsys.readouterr()
    assert (tmp_path / "home" / "fa-envkit" / "rattler-pkgs").is_symlink()
    assert (scratch / "keep.bin").read_bytes() == b"x" * 100


def test_a_killed_clear_leaves_its_folder_to_the_next_run(tmp_path):
    """Killed after the rename: the folder is a temporary of the dead run, no longer a cache, and the next
    `caches` run removes it."""
    fill(tmp_path)
    marker = tmp_path / "paused"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "FA_ENVKIT_PAUSE_AT": "caches:remove",
           "FA_ENVKIT_PAUSE_FILE": str(marker)}
    process = subprocess.Popen([sys.executable, "-m", "toolkit", "caches", "clear"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    left = [p.name for p in (tmp_path / "fa-envkit").iterdir() if p.name.startswith(".")]
    assert any("removing-conda-pkgs" in name for name in left)
    assert not (tmp_path / "fa-envkit" / "conda-pkgs").exists()  # renamed away: never a half-removed cache
    done = subprocess.run([sys.executable, "-m", "toolkit", "caches"], cwd=ROOT, env={**os.environ,
                          "XDG_CACHE_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "fa-envkit").iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("hostile", ["/", "relative/cache", "a\nb"])
def test_a_strange_cache_home_touches_only_the_toolkits_folders(tmp_path, monkeypatch, capsys, hostile):
    """$XDG_CACHE_HOME of any value: only <it>/fa-envkit/<the toolkit's folders> are ever looked at."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", hostile)
    found = shown(capsys)
    assert all(f["path"].startswith(os.path.join(hostile, "fa-envkit") + os.sep) for f in found.values())
    assert main(["caches"]) == 0  # the table: one line a folder and one for what it holds, whatever the path
    assert len(capsys.readouterr().out.splitlines()) == 2 * len(found) + 1


def test_a_cache_home_that_is_a_file_is_one_line_and_nothing_is_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "fa-envkit").write_text("not a folder")
    for step in ("prune", "clear"):
        assert main(["caches", step]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tmp_path / 'fa-envkit'}: not a folder" in err
    assert (tmp_path / "fa-envkit").read_text() == "not a folder"
    assert main(["caches"]) == 0  # shown: every folder none
    capsys.readouterr()


def test_no_cache_yet_is_nothing_to_remove(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "none"))
    assert main(["caches", "clear"]) == 0
    assert capsys.readouterr().out == "0.0 MB freed\n" and not (tmp_path / "none").exists()


HOLDER = """
import sys, time
from pathlib import Path
from toolkit.base.fslock import locked
with locked(Path(sys.argv[1]), shared=True):
    print("held", flush=True)
    time.sleep(60)
"""


def test_nothing_is_removed_while_an_install_holds_the_caches(tmp_path, monkeypatch, capsys):
    """An install holds the caches' lock shared (RattlerEngine.install, install_pip_layer): prune and clear refuse
    in one line, remove nothing, and work once it has ended."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fill(tmp_path)
    before = {name: digest(tmp_path / "fa-envkit" / name) for name in FOLDERS}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "fa-envkit" / "in-use")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for step in ("prune", "clear"):
            assert main(["caches", step]) == 1
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "a running install is using the caches" in err
        assert {name: digest(tmp_path / "fa-envkit" / name) for name in FOLDERS} == before
    finally:
        holder.kill()
        holder.communicate()
    assert main(["caches", "clear"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "fa-envkit" / "conda-pkgs").exists()

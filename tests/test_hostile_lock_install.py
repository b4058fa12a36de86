"""Hostile locks, foreign prefixes, interruptions and concurrent installs (issue 14).

Every install here is a real `python -m toolkit install` (or `install_line`) of a lock made by a real
py-rattler solve of the fixture channel of tests/conda_channel.py (file://) with its pip layer from the
loopback fixture index. Interruptions are real signals sent to a real subprocess stopped at a named
phase by the FA_ENVKIT_PAUSE_AT hook (toolkit/base/atomic.py: checkpoint); afterwards the filesystem is
checked: no staging dirs, no partial files, the old environment intact, nothing in the run's TMPDIR.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from unittest import mock

import psutil
import pytest
import yaml
from conda_channel import channel_dir, file_url, isolated_caches, pip_index, write_project  # noqa: F401

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env.download import cache_entry
from toolkit.env.lock import lock_line
from toolkit.env.lockfile import (
    KEY_DIGEST,
    KEY_SDIST_FILENAME,
    KEY_SDIST_SHA256,
    LockedSdist,
    lock_digest,
    read_lock,
)
from toolkit.spec.rules import checked_spec

TEMP_MARK = ".fa-envkit-tmp"


@pytest.fixture(scope="module")
def project(tmp_path_factory, channel_dir, pip_index):
    """envs/ + locks/ of one locked line (file:// channel), copied per test by `fresh_project`."""
    root = tmp_path_factory.mktemp("hostile-project")
    envs = write_project(root, file_url(channel_dir), pip_index)
    lock_line(checked_spec(envs / "cu126.yaml"), backend="rattler", workspace=Workspace(locks=root / "locks"), pypi=pip_index)
    return root


@pytest.fixture
def fresh(project, tmp_path, isolated_caches):
    """A private copy of the project (its lock's sources are relative, so the copy stays current)."""
    root = tmp_path / "project"
    shutil.copytree(project, root)
    (tmp_path / "tmp").mkdir()
    return root


def lock_file(root: Path) -> Path:
    return root / "locks" / "cu126.conda-lock.yml"


def resign(path: Path, edit) -> None:
    """Edit a lock's data and recompute its digest, as anyone can: the digest guards against accidents only."""
    document = yaml.safe_load(path.read_text())
    edit(document)
    document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def ours_left(*directories: Path) -> list[str]:
    """Anything the toolkit names as its own temporary, or a partial/old/installing leftover of older names."""
    found = []
    for directory in directories:
        if directory.is_dir():
            found += [str(p) for p in directory.rglob("*") if TEMP_MARK in p.name or p.name.endswith(".partial")
                      or ".installing-" in p.name or ".old-" in p.name]
    return found


def one_line_error(err: str) -> str:
    """The one error line (progress lines before it are fine), last, with no traceback anywhere."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


def install_args(root: Path, prefix: Path) -> list[str]:
    return ["install", "cu126", "--locks", str(root / "locks"), "--prefix", str(prefix), "--engine", "rattler"]


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), **extra}


def toolkit(args: list[str], tmp_path: Path, **extra: str) -> subprocess.Popen:
    """A real `python -m toolkit` in its own session (process group), as a terminal runs a command. SIGINT is
    reset to its default there: a test run started in the background (`nohup ... &`) inherits it ignored, and
    a command a terminal runs in the foreground does not."""
    return subprocess.Popen([sys.executable, "-m", "toolkit", *args], cwd=tmp_path, env=child_env(tmp_path, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


OLD_ENV_MARK = Path("conda-meta") / "history"  # an installer's file (not a user's): "old" in it marks the old env


def is_old_env(prefix: Path) -> bool:
    return (prefix / OLD_ENV_MARK).read_text() == "old"


def installed_ok(prefix: Path) -> bool:
    return (prefix / "bin" / "nvcc").exists() and (prefix / "etc" / "fa-envkit" / "lock.json").is_file()


# ---------------------------------------------------------------- data loss: --prefix


def test_install_refuses_a_non_empty_foreign_prefix_and_touches_nothing(fresh, tmp_path, capsys):
    prefix = tmp_path / "thesis"
    prefix.mkdir()
    (prefix / "thesis.txt").write_text("four years")
    (prefix / "notes.txt").write_text("notes")
    assert main(install_args(fresh, prefix)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert str(prefix) in line and "not an environment" in line and "--prefix" in line
    assert sorted(p.name for p in prefix.iterdir()) == ["notes.txt", "thesis.txt"]
    assert (prefix / "thesis.txt").read_text() == "four years"
    assert ours_left(tmp_path) == []


def test_install_refuses_a_file_or_symlink_prefix(fresh, tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert main(install_args(fresh, link)) == 1
    assert "symlink" in one_line_error(capsys.readouterr().err)
    afile = tmp_path / "afile"
    afile.write_text("data")
    assert main(install_args(fresh, afile)) == 1
    one_line_error(capsys.readouterr().err)
    assert afile.read_text() == "data" and (target / "keep").exists() and link.is_symlink()


def test_install_into_an_empty_dir_and_reinstall_over_its_own_env(fresh, tmp_path, capsys):
    prefix = tmp_path / "env"
    prefix.mkdir()
    assert main(install_args(fresh, prefix)) == 0
    record = json.loads((prefix / "etc" / "fa-envkit" / "lock.json").read_text())
    assert record["schema"] == 1 and record["line"] == "cu126" and record["platform"] == "linux-64"
    assert main(install_args(fresh, prefix)) == 0
    assert installed_ok(prefix) and ours_left(tmp_path) == []


def test_installed_environment_honours_the_umask(fresh, tmp_path):
    prefix = tmp_path / "env"
    old = os.umask(0o022)
    try:
        assert main(install_args(fresh, prefix)) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(prefix.stat().st_mode) == 0o755
    assert stat.S_IMODE((prefix / "etc" / "fa-envkit" / "lock.json").stat().st_mode) == 0o644


def test_reinstall_refuses_a_prefix_holding_a_users_files_and_keeps_them(fresh, tmp_path, capsys):
    """A reinstall replaces the whole prefix: what no installer wrote there (conda-meta's lists, pip's
    RECORDs) is a user's, and the install refuses, naming it, rather than delete it."""
    prefix = tmp_path / "env"
    assert main(install_args(fresh, prefix)) == 0
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "torch" / "__pycache__").mkdir(exist_ok=True)  # python's cache of an installed module: not the user's
    (site / "torch" / "__pycache__" / "__init__.cpython-311.opt-1.pyc").write_bytes(b"python made this")
    assert main(install_args(fresh, prefix)) == 0
    (prefix / "analysis.ipynb").write_text("a notebook")
    (prefix / "work" / "runs").mkdir(parents=True)
    (prefix / "work" / "runs" / "loss.csv").write_text("1,0.5")
    (site / "mine.py").write_text("print('mine')")
    (prefix / "conda-meta" / "notes.txt").write_text("mine")  # the installers' records are no hiding place
    assert main(install_args(fresh, prefix)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "analysis.ipynb" in line and "conda-meta/notes.txt" in line and "mine.py" in line and "and 1 more" in line
    assert "nothing was changed" in line and (prefix / "conda-meta" / "notes.txt").read_text() == "mine"
    assert (prefix / "analysis.ipynb").read_text() == "a notebook" and (site / "mine.py").exists()
    assert (prefix / "work" / "runs" / "loss.csv").read_text() == "1,0.5" and installed_ok(prefix)
    assert ours_left(tmp_path) == []


def test_a_copied_install_record_does_not_make_a_folder_replaceable(fresh, tmp_path, capsys):
    """The record names the prefix it was written for: copied into a folder of a user's files (or left
    by an older toolkit that named none), it lets nothing be replaced."""
    env = tmp_path / "env"
    assert main(install_args(fresh, env)) == 0
    assert json.loads((env / "etc" / "fa-envkit" / "lock.json").read_text())["prefix"] == str(env)
    thesis = tmp_path / "thesis"
    (thesis / "etc").mkdir(parents=True)
    shutil.copytree(env / "etc" / "fa-envkit", thesis / "etc" / "fa-envkit")
    shutil.copytree(env / "conda-meta", thesis / "conda-meta")
    (thesis / "chapter1.tex").write_text("four years")
    assert main(install_args(fresh, thesis)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "lock.json was written for" in line and str(env) in line and "not this folder" in line
    record = json.loads((env / "etc" / "fa-envkit" / "lock.json").read_text())
    del record["prefix"]  # as an older toolkit wrote it
    (env / "etc" / "fa-envkit" / "lock.json").write_text(json.dumps(record))
    assert main(install_args(fresh, env)) == 1
    assert "written for a folder it does not name" in one_line_error(capsys.readouterr().err)
    assert (thesis / "chapter1.tex").read_text() == "four years" and installed_ok(env)


@pytest.mark.parametrize("kind", ["fifo", "dangling symlink", "symlink to a file"])
def test_a_prefix_lock_that_is_not_a_regular_file_is_refused(fresh, tmp_path, kind):
    """`<prefix>.lock` is opened without following a link and without blocking on a FIFO (a FIFO hung the
    install; a dangling symlink made it create the file it points to)."""
    prefix = tmp_path / "env"
    lock, outside = tmp_path / "env.lock", tmp_path / "elsewhere" / "created-outside"
    outside.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        if kind == "symlink to a file":
            outside.write_text("precious")
        lock.symlink_to(outside)
    process = toolkit(install_args(fresh, prefix), tmp_path)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"install hung on a {kind} at {lock}")
    assert process.returncode == 1 and "not a lock file" in one_line_error(err) and "env.lock" in err
    assert not prefix.exists() and os.path.lexists(lock)
    assert [p.name for p in outside.parent.iterdir()] == (["created-outside"] if kind == "symlink to a file" else [])
    if kind == "symlink to a file":
        assert outside.read_text() == "precious"


def test_a_refused_install_leaves_no_lock_file_beside_the_prefix(fresh, tmp_path, capsys):
    resign(lock_file(fresh), lambda d: _package(d, "linux-64", "ninja").__setitem__("version", "1.13.0"))
    assert main(install_args(fresh, tmp_path / "env")) == 1
    one_line_error(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "project", "tmp"]


@pytest.mark.parametrize("package, field, value, found", [
    ("ninja", "version", "1.13.0", "ninja 1.12.1 build h0_0"),
    ("cuda-cudart", "name", "cuda-cudart-x", "cuda-cudart 12.6.85"),  # a dependency only: the spec names no such
])
def test_an_entry_edited_over_its_archive_is_refused(fresh, tmp_path, capsys, package, field, value, found):
    """A re-signed lock whose entry names another version (url and sha256 left as they were) installed with
    rc 0, and conda-meta disagreed with the lock: the archive's own info/index.json must match the entry."""
    def edit(document: dict) -> None:
        _package(document, "linux-64", package)[field] = value
        for entry in document["package"]:  # a renamed package: its dependants name it so too
            if field == "name" and entry["platform"] == "linux-64" and package in (entry.get("dependencies") or {}):
                entry["dependencies"][value] = entry["dependencies"].pop(package)

    resign(lock_file(fresh), edit)
    prefix = tmp_path / "env"
    assert main(install_args(fresh, prefix)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert f"its archive is {found}" in line and "info/index.json" in line and "cu126.conda-lock.yml" in line
    assert not prefix.exists() and ours_left(tmp_path) == []


def test_an_entry_whose_url_names_another_build_is_refused(fresh, tmp_path, capsys):
    """The build is the last field of the URL's file name: the same archive under another build's name."""
    url = _package(yaml.safe_load(lock_file(fresh).read_text()), "linux-64", "ninja")["url"]
    ninja_archive = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    renamed = tmp_path / "mirror" / "linux-64" / "ninja-1.12.1-h9_9.conda"
    renamed.parent.mkdir(parents=True)
    shutil.copy(ninja_archive, renamed)
    resign(lock_file(fresh), lambda d: _package(d, "linux-64", "ninja").__setitem__("url", renamed.as_uri()))
    assert main(install_args(fresh, tmp_path / "env")) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "ninja-1.12.1-h9_9.conda" in line and "build h0_0" in line and not (tmp_path / "env").exists()


@pytest.mark.parametrize("by", ["file name", "METADATA"])
def test_a_pip_entry_edited_over_its_wheel_is_refused(fresh, tmp_path, capsys, by):
    """The pip layer's counterpart: torch's entry says 2.9.2 over the 2.9.1 wheel (its url and sha256 kept, or
    the wheel's bytes under 2.9.2's file name): pip installed 2.9.1 with rc 0. The wheel's file name and its
    METADATA must name the entry's version."""
    locked = _package(yaml.safe_load(lock_file(fresh).read_text()), "linux-64", "torch")
    disguised = tmp_path / "mirror" / "torch-2.9.2-py3-none-any.whl"
    disguised.parent.mkdir()
    with urllib.request.urlopen(locked["url"]) as response:  # the fixture index's torch 2.9.1 wheel
        disguised.write_bytes(response.read())
    moved = {"url": disguised.as_uri()} if by == "METADATA" else {}
    resign(lock_file(fresh), lambda d: _package(d, "linux-64", "torch").update(version="2.9.2", **moved))
    prefix = tmp_path / "env"
    assert main(install_args(fresh, prefix)) == 1
    filename = Path(moved.get("url", locked["url"])).name
    assert one_line_error(capsys.readouterr().err).endswith(
        f"cu126.conda-lock.yml: torch 2.9.2 ({filename}): its wheel is torch 2.9.1 by its {by} (the entry was "
        f"edited: re-run `toolkit lock cu126`)")
    assert not prefix.exists() and ours_left(tmp_path) == []


def test_a_lock_with_a_5000_digit_number_is_one_line(fresh, tmp_path, capsys):
    lock = lock_file(fresh)
    lock.write_text(lock.read_text().replace("version: 1.12.1", "version: " + "9" * 5000, 1))
    assert main(install_args(fresh, tmp_path / "env")) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "cu126.conda-lock.yml: unreadable lock (a number of more than" in line and len(line) < 300


# ---------------------------------------------------------------- hostile locks


@pytest.mark.parametrize("key, value, field", [
    (KEY_SDIST_FILENAME, "../../../victim.txt", KEY_SDIST_FILENAME),
    (KEY_SDIST_FILENAME, "/tmp/victim.txt", KEY_SDIST_FILENAME),
    (KEY_SDIST_FILENAME, "..", KEY_SDIST_FILENAME),
    (KEY_SDIST_SHA256, "../../victim", KEY_SDIST_SHA256),
    (KEY_SDIST_SHA256, "AB" * 32, KEY_SDIST_SHA256),
    ("fa-envkit.flash-attn-sdist.url", "ftp://example.org/flash_attn-2.8.3.post2.tar.gz", "url"),
])
def test_sdist_values_that_become_paths_are_checked_before_anything_is_touched(fresh, key, value, field):
    lock = lock_file(fresh)
    resign(lock, lambda d: d["metadata"]["custom_metadata"].__setitem__(key, value))
    with pytest.raises(ToolkitError) as caught:
        read_lock(lock)
    assert "\n" not in str(caught.value) and field in str(caught.value) and lock.name in str(caught.value)


def test_fetch_sdist_never_leaves_its_cache_for_a_hostile_pin(tmp_path):
    from toolkit.build.fa2 import fetch_sdist

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache = tmp_path / "a" / "b" / "cache"
    hostile = LockedSdist(url=victim.as_uri(), filename="../../../../victim.txt", sha256="ab" * 32)
    with pytest.raises(ToolkitError):
        fetch_sdist(hostile, cache)
    assert victim.read_text() == "precious"


def _package(document: dict, platform: str, name: str) -> dict:
    return next(p for p in document["package"] if p["platform"] == platform and p["name"] == name)


@pytest.mark.parametrize("edit, expected", [
    (lambda d: _package(d, "linux-64", "ninja")["hash"].__setitem__("sha256", "../../../../victim"), "sha256"),
    (lambda d: _package(d, "linux-64", "ninja").__setitem__(
        "url", _package(d, "linux-64", "ninja")["url"].rsplit("/", 1)[0] + "/..%2F..%2Fx.conda"), "url"),
    (lambda d: _package(d, "linux-64", "ninja").__setitem__("url", "gopher://x/linux-64/ninja-1.conda"), "url"),
    (lambda d: _package(d, "linux-64", "torch").__setitem__("name", "torch; rm -rf /"), "name"),
    (lambda d: d["package"].append(copy.deepcopy(_package(d, "linux-64", "ninja"))), "more than once"),
    (lambda d: d["package"].remove(_package(d, "linux-64", "ninja")), "ninja"),
    (lambda d: d["package"].remove(_package(d, "linux-64", "libgcc")), "libgcc"),
    (lambda d: d["package"].remove(_package(d, "linux-64", "torch")), "torch"),
    (lambda d: d.__setitem__("package", []), "no conda packages"),
])
def test_install_refuses_a_resigned_lock_whose_packages_are_not_the_environment(fresh, tmp_path, capsys, edit,
                                                                                expected):
    resign(lock_file(fresh), edit)
    prefix = tmp_path / "env"
    assert main(install_args(fresh, prefix)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert expected in line and "cu126.conda-lock.yml" in line
    assert not prefix.exists() and ours_left(tmp_path) == []


def test_install_refuses_a_stale_lock(fresh, tmp_path, capsys):
    spec = fresh / "envs" / "cu126.yaml"
    spec.write_text(spec.read_text().replace('archs: ["80", "90"]', 'archs: ["90"]'))
    assert main(install_args(fresh, tmp_path / "env")) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "changed since this lock was made" in line and "toolkit lock cu126" in line
    assert not (tmp_path / "env").exists()


def test_lock_check_reports_missing_locks(fresh, capsys):
    envs, locks = fresh / "envs", fresh / "locks"
    lock_file(fresh).unlink()
    assert main(["lock", "--check", "--envs", str(envs), "--locks", str(locks)]) == 1
    out = capsys.readouterr().out
    assert "cu126.conda-lock.yml: missing" in out and "toolkit lock cu126" in out and "every lock is current" not in out


# ---------------------------------------------------------------- the user's pip configuration


def test_pip_layer_ignores_the_users_pip_configuration(fresh, tmp_path, monkeypatch):
    for name, value in {"PIP_USER": "1", "PIP_TARGET": str(tmp_path / "t"), "PIP_PREFIX": str(tmp_path / "p"),
                        "PIP_REQUIRE_VIRTUALENV": "1", "PIP_NO_INDEX": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(install_args(fresh, tmp_path / "env")) == 0
    assert (tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "torch-2.9.1.dist-info").is_dir()
    assert not (tmp_path / "t").exists() and not (tmp_path / "p").exists()


# ---------------------------------------------------------------- interruptions, real signals


def pause_and_signal(args: list[str], tmp_path: Path, phase: str, signum: int,
                     group: bool = False) -> tuple[int, str]:
    """Run the verb until it reports `phase`, send `signum` (to its whole process group, as Ctrl-C at a
    terminal does, if `group`), wait; its workers must be gone too."""
    marker = tmp_path / "paused"
    marker.unlink(missing_ok=True)
    process = toolkit(args, tmp_path, FA_ENVKIT_PAUSE_AT=phase, FA_ENVKIT_PAUSE_FILE=str(marker))
    deadline = time.monotonic() + 30
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"never reached {phase} (exit {process.returncode}): {err}")
        time.sleep(0.05)
    workers = psutil.Process(process.pid).children(recursive=True)
    if group:
        os.killpg(process.pid, signum)
    else:
        os.kill(process.pid, signum)
    _, err = process.communicate(timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=5)  # SIGKILL: the worker dies with its parent
    assert alive == [], f"orphaned workers still running: {alive}"
    return process.returncode, err


INSTALL_PHASES = ("download", "install:worker", "install:pip", "install:replace")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"])
@pytest.mark.parametrize("phase", INSTALL_PHASES)
def test_interrupted_reinstall_keeps_the_old_env_and_a_rerun_cleans_up(fresh, tmp_path, phase, signum):
    prefix = tmp_path / "envs" / "cu126"
    assert main(install_args(fresh, prefix)) == 0
    if phase == "download":  # a fresh cache, so the archives are downloaded again
        shutil.rmtree(tmp_path / "cache")
    (prefix / OLD_ENV_MARK).write_text("old")
    rc, err = pause_and_signal(install_args(fresh, prefix), tmp_path, phase, signum)
    assert installed_ok(prefix) and is_old_env(prefix)  # the old env is intact
    if signum == signal.SIGKILL:
        assert rc == -signal.SIGKILL
    else:
        assert rc == (130 if signum == signal.SIGINT else 143)
        assert "interrupted" in one_line_error(err)
        assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []
    rerun = toolkit(install_args(fresh, prefix), tmp_path)
    _, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err
    assert installed_ok(prefix) and not is_old_env(prefix)
    assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"])
@pytest.mark.parametrize("phase", ["lock:solve", "lock:write"])
def test_interrupted_lock_leaves_the_old_lock_and_a_rerun_cleans_up(fresh, tmp_path, pip_index, phase, signum):
    lock = lock_file(fresh)
    before = lock.read_bytes()
    args = ["lock", "cu126", "--force", "--engine", "rattler", "--envs", str(fresh / "envs"), "--locks",
            str(fresh / "locks"), "--pypi", pip_index]
    rc, err = pause_and_signal(args, tmp_path, phase, signum)
    assert lock.read_bytes() == before
    if signum != signal.SIGKILL:
        assert rc == (130 if signum == signal.SIGINT else 143)
        assert "interrupted" in one_line_error(err)
        assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []
    rerun = toolkit(args, tmp_path)
    _, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err
    assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("verb, phase", [("install", "install:worker"), ("lock", "lock:solve")])
def test_ctrl_c_at_a_terminal_prints_no_worker_traceback(fresh, tmp_path, pip_index, verb, phase):
    args = install_args(fresh, tmp_path / "env") if verb == "install" else [
        "lock", "cu126", "--force", "--engine", "rattler", "--envs", str(fresh / "envs"), "--locks",
        str(fresh / "locks"), "--pypi", pip_index]
    rc, err = pause_and_signal(args, tmp_path, phase, signal.SIGINT, group=True)
    assert rc == 130 and "interrupted by Ctrl-C" in one_line_error(err), err
    assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_a_rerun_never_removes_a_live_runs_temporaries_or_unrecognised_files(tmp_path):
    from toolkit.base.atomic import clean_stale, owned_temp

    (tmp_path / ".fa-envkit-tmp-not-ours").mkdir()  # no owner file: not recognised, kept
    (tmp_path / "user.txt").write_text("x")
    with owned_temp(tmp_path, "live") as live:
        live.mkdir()
        clean_stale(tmp_path)
        assert live.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fa-envkit-tmp-not-ours", "user.txt"]


def test_two_installs_into_one_prefix_both_succeed(fresh, tmp_path):
    prefix = tmp_path / "envs" / "cu126"
    first, second = toolkit(install_args(fresh, prefix), tmp_path), toolkit(install_args(fresh, prefix), tmp_path)
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in (first, second)]
    for rc, err in results:
        assert rc == 0 and "Traceback" not in err and "ENOTEMPTY" not in err and "Errno" not in err, err
    assert installed_ok(prefix) and ours_left(tmp_path) == []


def test_a_killed_in_place_install_gets_the_old_env_back_on_the_rerun(fresh, tmp_path):
    """The conda-lock backend builds at the final path with the old env set aside: SIGKILL there leaves no
    prefix (or micromamba's unfinished one); the rerun puts the old env back before anything else.
    (`--conda /bin/false`: the run is stopped before micromamba would run; none exists on this machine.)"""
    prefix = tmp_path / "envs" / "cu126"
    assert main(install_args(fresh, prefix)) == 0
    (prefix / OLD_ENV_MARK).write_text("old")
    in_place = install_args(fresh, prefix)[:-2] + ["--engine", "conda-lock", "--conda", "/bin/false"]
    rc, _ = pause_and_signal(in_place, tmp_path, "install:in-place", signal.SIGKILL)
    assert rc == -signal.SIGKILL and not prefix.exists()
    (prefix / "conda-meta").mkdir(parents=True)  # what an unfinished micromamba create leaves
    (prefix / "conda-meta" / "unfinished-1.0-0.json").write_text("{}")
    rc, err = pause_and_signal(in_place, tmp_path, "install:in-place", signal.SIGTERM)
    assert rc == 143 and "interrupted" in one_line_error(err)
    assert installed_ok(prefix) and is_old_env(prefix)
    assert not (prefix / "conda-meta" / "unfinished-1.0-0.json").exists()
    assert ours_left(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_a_rerun_keeps_another_prefixs_old_env(fresh, tmp_path):
    """A killed in-place install of envs/cu126-2 set its old env aside; installing envs/cu126 leaves it."""
    envs = tmp_path / "envs"
    aside = envs / ".fa-envkit-tmp-retired-cu126-2-999999-0000abcd"  # as owned_dir names it, owner gone
    (aside / "cu126-2" / "etc" / "fa-envkit").mkdir(parents=True)
    (aside / "cu126-2" / "etc" / "fa-envkit" / "lock.json").write_text('{"line": "cu126"}')
    aside.with_name(aside.name + ".owner").write_text("")
    assert main(install_args(fresh, envs / "cu126")) == 0
    assert (aside / "cu126-2" / "etc" / "fa-envkit" / "lock.json").exists()


# ---------------------------------------------------------------- property-based: any re-signed edit of a lock


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.slow

HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["../../../victim.txt", "/etc/passwd", "..", ".", "", "a/b", "a\nb", "x\x00y", "ab" * 32,
                     "AB" * 32, "file:///etc/passwd", "ftp://h/x.conda", "https://h/../../x.conda", "torch; rm -rf /",
                     "linux-64", "osx-arm64", "conda", "pip", "${HOME}", "$(touch x)", "`id`"]),
    st.builds(lambda a, b: f"{a}{b}", st.sampled_from(["https://h/linux-64/", "file:///c/noarch/", "http://h/"]),
              st.text(max_size=20)))
HOSTILE_VALUE = st.one_of(HOSTILE_TEXT, st.none(), st.booleans(), st.integers(), st.lists(HOSTILE_TEXT, max_size=3),
                          st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=2))
CUSTOM_KEYS = ["fa-envkit.line", "fa-envkit.input-hash", "fa-envkit.toolchain-kind", "fa-envkit.flash-attn-sdist.url",
               KEY_SDIST_FILENAME, KEY_SDIST_SHA256]
PACKAGE_FIELDS = ["name", "version", "url", "platform", "manager", "hash", "dependencies", "category"]


@st.composite
def lock_edits(draw):
    """(where, value) edits of a lock: a custom metadata value, a package field, a metadata list, or the
    package list itself (entries removed or repeated)."""
    kind = draw(st.sampled_from(["custom", "package", "metadata", "entries"]))
    if kind == "custom":
        return kind, draw(st.sampled_from(CUSTOM_KEYS)), draw(HOSTILE_VALUE)
    if kind == "package":
        return kind, (draw(st.integers(0, 40)), draw(st.sampled_from(PACKAGE_FIELDS + ["hash.sha256"]))), \
            draw(HOSTILE_VALUE)
    if kind == "metadata":
        return kind, draw(st.sampled_from(["platforms", "sources", "channels"])), draw(HOSTILE_VALUE)
    return kind, draw(st.lists(st.integers(0, 40), max_size=3)), draw(st.lists(st.integers(0, 40), max_size=3))


def apply_edit(document: dict, edit) -> None:
    kind, where, value = edit
    packages = document["package"]
    if kind == "custom":
        document["metadata"]["custom_metadata"][where] = value
    elif kind == "metadata":
        document["metadata"][where] = value
    elif kind == "package":
        index, field = where
        entry = packages[index % len(packages)]
        if field == "hash.sha256":
            entry["hash"]["sha256"] = value
        else:
            entry[field] = value
    else:
        removed, repeated = where, value
        repeats = [copy.deepcopy(packages[i % len(packages)]) for i in repeated]
        for i in sorted({i % len(packages) for i in removed}, reverse=True):
            del packages[i]
        packages.extend(repeats)


def inside(path: Path, root: Path) -> bool:
    return Path(os.path.normpath(path)).is_relative_to(root)


@pytest.fixture(scope="module")
def pristine_lock(project) -> dict:
    return yaml.safe_load(lock_file(project).read_text())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=lock_edits(), with_conda_lock=st.booleans())
def test_any_resigned_edit_of_a_lock_reads_safely_or_is_refused_in_one_line(pristine_lock, tmp_path, edit,
                                                                            with_conda_lock):
    """Also where conda-lock is not installed (offline build nodes): the reader's own checks must hold."""
    path = tmp_path / "cu126.conda-lock.yml"
    document = copy.deepcopy(pristine_lock)
    apply_edit(document, edit)
    try:
        document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    except (TypeError, ValueError):
        pass  # not JSON-able: the digest cannot be recomputed, the reader must still refuse cleanly
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    try:
        with mock.patch.dict(sys.modules, {} if with_conda_lock else {"conda_lock.lockfile": None}):
            locked = read_lock(path)
    except ToolkitError as exc:
        assert "\n" not in str(exc) and path.name in str(exc)
        return
    cache = tmp_path / "cache"  # what was accepted can only name paths inside the caches
    assert inside(cache_entry(cache, locked.sdist), cache)
    for package in locked.packages:
        assert package.manager == "pip" or inside(cache_entry(cache, package), cache)
        assert package.url.split(":", 1)[0] in ("https", "http", "file") and "\n" not in package.url
    assert len({(p.platform, p.manager, p.name) for p in locked.packages}) == len(locked.packages)


def test_a_yaml_alias_bomb_lock_is_refused_quickly(fresh):
    """Ten lines of anchors expand to 9**10 items: a reader that walks them (the digest does) never ends.
    conda-lock's parser refuses the extra keys, so this reads as on a build node without conda-lock."""
    bomb = ["bomb0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"bomb{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = lock_file(fresh)
    path.write_text(path.read_text() + "\n".join(bomb) + "\n")
    started = time.monotonic()
    with pytest.raises(ToolkitError) as caught, mock.patch.dict(sys.modules, {"conda_lock.lockfile": None}):
        read_lock(path)
    message = str(caught.value).split(": ", 1)[1]
    assert time.monotonic() - started < 5 and "alias" in message and "\n" not in message


def test_without_an_atomic_swap_a_reinstall_still_keeps_the_old_env_until_the_new_one_is_there(fresh, tmp_path,
                                                                                            monkeypatch):
    """Where renameat2 cannot swap (NFS), the old env is set aside in a retired folder the rerun restores."""
    import toolkit.env.install as install

    prefix = tmp_path / "envs" / "cu126"
    assert main(install_args(fresh, prefix)) == 0
    monkeypatch.setattr(install, "exchange", lambda new, old: False)
    seen = []
    real_replace = os.replace

    def replace(source, target):  # what lies at the prefix's folder while the new env moves in
        if Path(target) == prefix:
            seen.append(sorted(p.name for p in prefix.parent.iterdir() if "retired" in p.name))
        real_replace(source, target)

    monkeypatch.setattr(install.os, "replace", replace)
    assert main(install_args(fresh, prefix)) == 0
    assert seen and all(names for names in seen) and installed_ok(prefix) and ours_left(tmp_path) == []


def test_a_cache_that_cannot_be_written_is_one_line(fresh, tmp_path, capsys, monkeypatch):
    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    assert main(install_args(fresh, tmp_path / "env")) == 1
    assert "cannot create the lock file" in one_line_error(capsys.readouterr().err)  # the cache entry's lock
    assert not (tmp_path / "env").exists() and ours_left(tmp_path) == []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filename=HOSTILE_TEXT, sha256=HOSTILE_TEXT, tag=HOSTILE_TEXT)
def test_cache_entries_and_temporaries_stay_in_their_folder(tmp_path, filename, sha256, tag):
    from toolkit.base.atomic import owned_temp

    cache = tmp_path / "cache"
    try:
        entry = cache_entry(cache, LockedSdist("https://h/x.tar.gz", filename, sha256))
    except ToolkitError as exc:
        assert "\n" not in str(exc)
    else:
        assert inside(entry, cache) and entry.parent.parent == cache
    with owned_temp(tmp_path / "t", tag) as temporary:
        assert temporary.parent == tmp_path / "t" and "/" not in temporary.name
    assert list((tmp_path / "t").iterdir()) == []


# ---------------------------------------------------------------- crafted archives


def test_install_refuses_a_locked_archive_that_writes_outside_its_prefix(fresh, tmp_path, capsys):
    """A re-signed lock pinning a crafted archive by its true sha256: refused before py-rattler sees it (an
    absolute member path makes py-rattler 0.28 abort the whole process)."""
    from test_hostile_archives import dot_conda

    (tmp_path / "evil" / "linux-64").mkdir(parents=True)
    archive = dot_conda(tmp_path / "evil" / "linux-64", [("/tmp/fa-envkit-escape.txt", b"x")], ["lib/ok.txt"])

    def pin(document: dict) -> None:
        ninja = _package(document, "linux-64", "ninja")
        ninja["url"], ninja["hash"]["sha256"] = archive.as_uri(), hashlib.sha256(archive.read_bytes()).hexdigest()
        ninja["hash"]["md5"] = hashlib.md5(archive.read_bytes()).hexdigest()

    resign(lock_file(fresh), pin)
    prefix = tmp_path / "env"
    assert main(install_args(fresh, prefix)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "an absolute path" in line and archive.name in line
    assert not prefix.exists() and ours_left(tmp_path) == [] and not Path("/tmp/fa-envkit-escape.txt").exists()

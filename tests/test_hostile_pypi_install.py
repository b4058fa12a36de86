"""`toolkit install` of a pypi line against bad input: the wrong python, none on PATH, --python for a conda
line, a user's files in the venv, knowledge symlinks that leave CUDA_HOME. Nothing here downloads: the venv
tests install small wheels made here (file:// URLs, sha256 from hashlib) through the real VenvBuild.make.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.env.install import check_prefix, install_line
from toolkit.env.install_record import PrefixRecord
from toolkit.env.lockfile import LockedPackage, lock_digest
from toolkit.env.pypi_install import VenvBuild, make_symlinks, site_packages
from toolkit.env.standin import StandIn, copy_in
from toolkit.knowledge.facts import load_knowledge

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def fake_python(tmp_path: Path, version: str) -> Path:
    """An 'interpreter' that answers the version probe with `version`."""
    path = tmp_path / "bin" / "python-fake"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_a_python_of_another_version_is_refused_before_anything_is_written(tmp_path):
    prefix = tmp_path / "env"
    with pytest.raises(ToolkitError) as refused:
        install_line("py-cu130", prefix, Workspace(locks=ROOT / "locks"), python=fake_python(tmp_path, "3.9"))
    assert str(refused.value) == (f"{tmp_path}/bin/python-fake: is python 3.9, the line's spec asks for 3.11 "
                                  f"(install python 3.11, or pass --python PATH)")
    assert not prefix.exists() and os.listdir(tmp_path) == ["bin"]


def test_no_python_of_the_specs_version_on_path_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolkitError, match=r"^python3\.11: not on PATH; the line's spec asks for python 3\.11 "
                                           r"\(install python 3\.11, or pass --python PATH\)$"):
        install_line("py-cu130", tmp_path / "env", Workspace(locks=ROOT / "locks"))
    assert not (tmp_path / "env").exists()


def test_python_is_refused_for_a_conda_line(tmp_path):
    """A locked (conda) line's python is the lock's: --python is refused, not ignored."""
    document = yaml.safe_load((ROOT / "locks" / "gpu-machine.conda-lock.yml").read_text())
    document["metadata"]["custom_metadata"]["fa-envkit.toolchain-kind"] = "locked"
    document["metadata"]["custom_metadata"]["fa-envkit.lock-sha256"] = lock_digest(document)
    (tmp_path / "gpu-machine.conda-lock.yml").write_text(yaml.safe_dump(document))
    for option, given in (("python", {"python": Path(sys.executable)}), ("torch-from", {"torch_from": Path(sys.executable)}),
                          ("wheels", {"wheels": tmp_path})):
        with pytest.raises(ToolkitError, match=rf"^--{option}: gpu-machine has a locked toolchain, whose python and "
                                               rf"torch come from .*gpu-machine\.conda-lock\.yml \(drop --{option}; "):
            install_line("gpu-machine", tmp_path / "env", Workspace(locks=tmp_path), **given)
        assert not (tmp_path / "env").exists()


def test_knowledge_symlinks_that_leave_cuda_home_are_refused(tmp_path):
    (tmp_path / "lib").mkdir()
    for link, target in (("../escape", "lib"), ("lib/x.so", "../../../etc/passwd"), ("/abs", "lib")):
        with pytest.raises(ToolkitError, match="is not a path inside CUDA_HOME"):
            make_symlinks(tmp_path, {link: target})
    assert sorted(os.listdir(tmp_path)) == ["lib"]


# ---------------------------------------------------------------- a venv of small wheels


def wheel(directory: Path, name: str, version: str, files: dict[str, bytes]) -> LockedPackage:
    """A real wheel (RECORD with hashes) as a lock entry: file:// URL, sha256 from hashlib."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {**files, f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = "".join(f"{n},sha256={digest(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in {**files, f"{dist}.dist-info/RECORD": record.encode()}.items():
            archive.writestr(n, d)
    return LockedPackage("pip", name, version, path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest(), "linux-64")


@pytest.fixture(scope="module")
def small_venv(tmp_path_factory) -> Path:
    """A pypi line's venv made by VenvBuild.make in a staging folder, its record written, moved into place."""
    tmp = tmp_path_factory.mktemp("venv")
    packages = (wheel(tmp / "wheels", "nvidia-cuda-nvcc", "13.0.88", {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n"}),
                wheel(tmp / "wheels", "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"\0"}))
    pypi = load_knowledge().pypi
    build = VenvBuild(Path(sys.executable), PYTHON, packages, pypi.lines["13.0.3"], pypi.cuda_home)
    prefix, staging = tmp / "env", tmp / "staging" / "env"
    written = build.make(staging, prefix, Console(quiet=True))
    PrefixRecord("py-cu130", "lock", "linux-64", "0" * 64, "0" * 64, str(prefix), written).write(staging)
    staging.rename(prefix)
    return prefix


def test_the_venv_is_the_toolkits_own_and_names_its_final_folder(small_venv):
    check_prefix(small_venv)  # every file is a wheel's (RECORD) or the toolkit's (its record): a reinstall may replace it
    home = site_packages(small_venv, PYTHON) / "nvidia" / "cu13"
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13" and os.readlink(home / "lib64") == "lib"
    staging = str(small_venv.parent / "staging" / "env")
    assert all(staging not in p.read_text(errors="replace") for p in [small_venv / "pyvenv.cfg",
                                                                       *(small_venv / "bin").glob("activate*")])
    assert f'VIRTUAL_ENV="{small_venv}"' in (small_venv / "bin" / "activate").read_text()


@pytest.mark.parametrize("user_file", ["notes.txt", "include/my.h", "lib/python{v}/site-packages/nvidia/cu13/lib/mine.so",
                                       "bin/my-tool"])
def test_a_reinstall_refuses_a_venv_holding_a_users_file(small_venv, user_file):
    path = small_venv / user_file.format(v=PYTHON)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("mine")
    try:
        with pytest.raises(ToolkitError, match=rf"holds files no installer wrote \({user_file.format(v=PYTHON)}\); "
                                               r"reinstalling would delete them"):
            check_prefix(small_venv)
    finally:
        path.unlink()


def test_a_record_copied_from_another_venv_does_not_make_a_folder_the_toolkits(small_venv, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(small_venv, copy, symlinks=True)
    with pytest.raises(ToolkitError, match=rf"its {PrefixRecord.FILE} was written for '{small_venv}', not this folder"):
        check_prefix(copy)


# ---------------------------------------------------------------- --torch-from: the other environment's files


def record_row(name: str, data: bytes, size: int | None = None) -> str:
    """A RECORD row as pip writes it, the hash from hashlib."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data) if size is None else size}"


def other_site(tmp_path: Path, rows: list[str]) -> StandIn:
    """demo 1.0 installed in another site-packages (its module and dist-info, their RECORD rows real), with
    `rows` added to its RECORD."""
    site = tmp_path / "other"
    files = {"demo/__init__.py": b"x = 1\n", "demo-1.0.dist-info/METADATA": b"Name: demo\nVersion: 1.0\n"}
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    lines = [*(record_row(n, d) for n, d in files.items()), *rows, "demo-1.0.dist-info/RECORD,,"]
    (site / "demo-1.0.dist-info" / "RECORD").write_text("\n".join(lines) + "\n")
    return StandIn("demo", "1.0", site / "demo-1.0.dist-info")


def refusal(stand_in: StandIn, site: Path) -> str:
    """copy_in's refusal, waited for in a thread: a FIFO or /dev/zero must neither block it nor run it on."""
    found: list[str] = []

    def copy() -> None:
        try:
            copy_in(stand_in, site)
            found.append("copied")
        except Exception as exc:  # a traceback's exception is reported as such, not lost with the thread
            found.append(str(exc) if isinstance(exc, ToolkitError) else repr(exc))

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(60)
    assert found, "copy_in did not return within 60 s"
    return found[0]


def sparse(path: Path, size: int) -> None:
    """A file of `size` bytes of holes: nothing on disk, endless to a reader that does not stop."""
    with open(path, "wb") as handle:
        handle.truncate(size)


EXTRA = b"import os\n"
FIX = "reinstall demo there, or drop --torch-from"
STAND_IN_CASES = {  # what the other site holds -> the RECORD row naming it, the refusal after the file's path
    "fifo": (lambda site: os.mkfifo(site / "demo/pipe"), record_row("demo/pipe", b""),
             "demo/pipe", f"cannot be copied (a FIFO, not a file; {FIX})"),
    "folder": (None, record_row("demo", b""), "demo", f"cannot be copied (a directory, not a file; {FIX})"),
    "dot": (None, record_row(".", b""), "", f"cannot be copied (a directory, not a file; {FIX})"),
    "dev-zero": (lambda site: (site / "demo/zero").symlink_to("/dev/zero"), record_row("demo/zero", b""),
                 "demo/zero", f"leads out of {{site}} (to /dev/zero; {FIX})"),
    "link-out": (lambda site: (site / "demo/notes").symlink_to(site.parent / "notes.txt"),
                 record_row("demo/notes", b"mine\n"), "demo/notes", f"leads out of {{site}} (to {{tmp}}/notes.txt; {FIX})"),
    "no-hash": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), "demo/extra.py,,", "demo/extra.py",
                f"demo-1.0.dist-info/RECORD lists it without a hash (it cannot be checked; {FIX})"),
    "md5": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), "demo/extra.py,md5=x,10", "demo/extra.py",
            f"demo-1.0.dist-info/RECORD lists it with a 'md5' hash, not a sha256 (it cannot be checked; {FIX})"),
    "no-size": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), record_row("demo/extra.py", EXTRA)[:-2],
                "demo/extra.py", f"demo-1.0.dist-info/RECORD lists it without a size (it cannot be read to its end; {FIX})"),
    "sparse": (lambda site: sparse(site / "demo/big.bin", 64 << 20),
               record_row("demo/big.bin", bytes(10)), "demo/big.bin",
               f"not the file demo-1.0.dist-info/RECORD lists (more than its 10 bytes: changed since it was installed; {FIX})"),
    "size-lie": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), record_row("demo/extra.py", EXTRA, 15),
                 "demo/extra.py", f"not the file demo-1.0.dist-info/RECORD lists (10 bytes, not 15: changed since it was "
                                  f"installed; {FIX})"),
    "same-size-edit": (lambda site: (site / "demo/extra.py").write_bytes(b"import re\n"), record_row("demo/extra.py", EXTRA),
                       "demo/extra.py", f"not the file demo-1.0.dist-info/RECORD lists (another sha256: changed since it "
                                        f"was installed; {FIX})"),
}


@pytest.mark.parametrize("case", sorted(STAND_IN_CASES))
def test_a_stand_in_file_that_is_not_its_records_is_refused_in_one_line(tmp_path, case):
    """`--torch-from`'s copy: a FIFO row hung it, a folder row (`demo`, `.`) was a traceback, a link to
    /dev/zero copied without end, an unhashed or mis-sized row was copied unchecked. Each is one line naming
    the file, and what is read stays within its RECORD size."""
    make, row, name, problem = STAND_IN_CASES[case]
    (tmp_path / "notes.txt").write_text("mine\n")
    stand_in = other_site(tmp_path, [row])
    site = stand_in.dist_info.parent
    if make:
        make(site)
    venv = tmp_path / "venv"
    shown = site / name if name else site
    assert refusal(stand_in, venv) == f"{shown}: {problem.format(site=site, tmp=tmp_path)}"
    assert not (venv / name).is_file() or (venv / name).stat().st_size <= 11


@pytest.mark.parametrize("kind, says", [
    ("fifo", "locks/x.runtime.conda-lock.yml: unreadable (a FIFO"),
    ("alias", "locks/x.runtime.conda-lock.yml: uses a YAML alias"),
    ("build lock", "locks/x.runtime.conda-lock.yml: not a runtime lock of x"),
])
def test_install_runtime_refuses_a_hostile_runtime_lock_in_one_line(tmp_path, monkeypatch, capsys, kind, says):
    """`toolkit install LINE --runtime` reads locks/<line>.runtime.conda-lock.yml before anything else: a FIFO
    there must not hang it, an alias not expand, another lock not pass for it; nothing is made."""
    from test_hostile_spec import bounded

    from toolkit.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "locks" / "x.runtime.conda-lock.yml"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "alias":
        path.write_text("a: &a [1, 2]\nb: [*a, *a]\n")
    else:
        shutil.copy(ROOT / "locks" / "py-cu130.conda-lock.yml", path)
    with bounded():
        assert main(["install", "x", "--runtime"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line, line
    assert not (tmp_path / ".envs").exists()

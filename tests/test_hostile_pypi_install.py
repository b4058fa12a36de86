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

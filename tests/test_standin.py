"""`toolkit install LINE --torch-from PYTHON --wheels DIR`: another environment's torch and CUDA wheels standing in
for the lock's, and the lock's other wheels read from a folder (a machine without internet, like the lent GPU
machine, whose /opt/torch/.venv holds torch 2.11.0+cu130 with the very NVIDIA wheels the lock pins).

The distributions copied here are real ones installed in the test's own environment (packaging, PyYAML), read
through their real RECORD files; expected bytes come from hashlib over the source files. The end-to-end test takes
a real CUDA torch (torch 2.14.1+cu130 with its NVIDIA wheels, installed by tests/conda_forge_replica/
install_cuda_torch.sh into FA_CUDA_TORCH, as .ci/run does) as the stand-in for locks/py-cu130's torch and installs
the rest of that lock from PyPI.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.env.lockfile import read_lock
from toolkit.env.standin import OtherEnvironment, StandIn, copy_in, local_wheels, same_release

ROOT = Path(__file__).resolve().parent.parent
PY_CU130 = ROOT / "locks" / "py-cu130.conda-lock.yml"


def dist_info(name: str) -> Path:
    return Path(importlib.metadata.distribution(name)._path)  # type: ignore[attr-defined]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listed(info: Path) -> list[str]:
    """RECORD's paths inside site-packages, read with plain string handling."""
    rows = [line.split(",")[0] for line in (info / "RECORD").read_text().splitlines() if line]
    return [row for row in rows if not row.startswith("..") and not row.startswith("/")]


def test_a_copied_distribution_is_byte_for_byte_its_record(tmp_path):
    info = dist_info("packaging")
    copied = copy_in(StandIn("packaging", importlib.metadata.version("packaging"), info), tmp_path)
    paths = [row[0] for row in copied_rows(info) if row[0] != f"{info.name}/RECORD"]
    assert paths and all(sha(tmp_path / p) == sha(info.parent / p) for p in paths)
    assert copied == sum((info.parent / p).stat().st_size for p in paths)
    assert record_of(tmp_path / info.name) == copied_rows(info)


def record_of(info: Path) -> list[list[str]]:
    with open(info / "RECORD", newline="") as handle:
        return [row for row in csv.reader(handle) if row]


def copied_rows(info: Path) -> list[list[str]]:
    """The rows a copy keeps: those with a hash inside site-packages, and the RECORD's own; not the bytecode pip
    lists unhashed where it installed the package (uv lists none), nor scripts in ../../bin."""
    return [row for row in record_of(info) if row[0] == f"{info.name}/RECORD"
            or (row[1] and not row[0].startswith(("..", "/")))]


def test_the_copys_record_lists_only_what_was_copied_and_unchecked_bytecode_is_left(tmp_path):
    """pip's RECORD lists the bytecode it compiled without a hash, and scripts in ../../bin: the first is not
    copied (a .pyc runs instead of its checked .py), neither is left in the copy's RECORD, where a reinstall
    would take them for files the toolkit installed."""
    info = dist_info("packaging")
    source = tmp_path / "site"
    shutil.copytree(info.parent / "packaging", source / "packaging")
    shutil.copytree(info, source / info.name)
    pyc = "packaging/__pycache__/version.cpython-311.pyc"
    (source / pyc).parent.mkdir(exist_ok=True)
    (source / pyc).write_bytes(b"not what version.py compiles to")
    rows = record_of(info)
    with open(source / info.name / "RECORD", "w", newline="") as handle:
        csv.writer(handle).writerows([*rows, [pyc, "", ""], ["../../../bin/tool", "sha256=x", "1"]])
    copy_in(StandIn("packaging", "x", source / info.name), tmp_path / "venv")
    assert not (tmp_path / "venv" / pyc).exists()
    assert record_of(tmp_path / "venv" / info.name) == copied_rows(info)


def test_a_file_changed_since_install_is_refused(tmp_path):
    """A copy of the real packaging install with one module edited: its RECORD's sha256 no longer matches."""
    info = dist_info("packaging")
    source = tmp_path / "site"
    for path in listed(info):
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(info.parent / path, source / path)
    (source / "packaging" / "version.py").write_text("print('changed')\n")
    with pytest.raises(ToolkitError) as caught:
        copy_in(StandIn("packaging", "x", source / info.name), tmp_path / "venv")
    assert str(caught.value).startswith(f"{source / 'packaging' / 'version.py'}: not the file {info.name}/RECORD")
    assert "\n" not in str(caught.value)


def test_this_pythons_environment_is_probed_as_importlib_sees_it():
    other = OtherEnvironment.probe(Path(sys.executable))
    assert other.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert other.dists["pyyaml"].version == importlib.metadata.version("PyYAML")
    assert other.dists["pyyaml"].dist_info == dist_info("PyYAML")


def lock_packages():
    return tuple(p for p in read_lock(PY_CU130).packages if p.manager == "pip")


def test_only_the_locks_torch_release_built_for_the_lines_cuda_stands_in():
    """The refusals, on a probed environment whose torch facts are set to each wrong case; the lock's torch
    (2.14.1) and CUDA (13.0) are read from locks/py-cu130.conda-lock.yml."""
    packages = lock_packages()
    torch = next(p for p in packages if p.name == "torch")
    other = OtherEnvironment.probe(Path(sys.executable))
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    right = replace(other, torch_cuda="13.0", dists={**other.dists, "torch": StandIn("torch", f"{torch.version}+cu130",
                                                                                    Path("/x/torch.dist-info"))})
    cases = [
        (replace(right, dists={k: v for k, v in right.dists.items() if k != "torch"}), "has no torch"),
        (replace(right, dists={**right.dists, "torch": StandIn("torch", "2.11.0", Path("/x"))}),
         f"has torch 2.11.0, the lock's is {torch.version}"),
        (replace(right, torch_cuda=None), "its torch 2.14.1\\+cu130 is a CPU-only build, the line is CUDA 13.0"),
        (replace(right, torch_cuda="12.8"), "its torch 2.14.1\\+cu130 is built for CUDA 12.8, the line is CUDA 13.0"),
    ]
    for environment, problem in cases:
        with pytest.raises(ToolkitError, match=problem):
            environment.split(packages, here, "13.0")
    with pytest.raises(ToolkitError, match=f"is python {here}, the line's venv is 3.0"):
        right.split(packages, "3.0", "13.0")
    taken, rest = right.split(packages, here, "13.0")
    assert "torch" in {s.name for s in taken} and "torch" not in {p.name for p in rest}
    assert len(taken) + len(rest) == len(packages)


def test_a_locked_package_of_another_version_is_not_taken():
    """Beside the lock's torch, a package the lock pins is taken only at the lock's version: the same name at
    another version stays with the lock's wheel (the versions are read from locks/py-cu130.conda-lock.yml)."""
    packages = lock_packages()
    torch, runtime, nvrtc = (next(p for p in packages if p.name == name)
                             for name in ("torch", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc"))
    at = Path("/x/site-packages")
    other = OtherEnvironment(Path("/x/bin/python"), "3.11", "13.0", {
        "torch": StandIn("torch", f"{torch.version}+cu130", at / "torch.dist-info"),
        runtime.name: StandIn(runtime.name, f"{runtime.version}.1", at / "r.dist-info"),
        nvrtc.name: StandIn(nvrtc.name, nvrtc.version, at / "n.dist-info")})
    taken, rest = other.split(packages, "3.11", "13.0")
    assert {s.name: s.version for s in taken} == {"torch": f"{torch.version}+cu130", nvrtc.name: nvrtc.version}
    assert runtime in rest and nvrtc not in rest and torch not in rest


def test_same_release_ignores_the_local_label_only():
    assert same_release("2.11.0+cu130", "2.11.0") and not same_release("2.11.1+cu130", "2.11.0")


def test_wheels_come_from_the_folder_by_file_name_or_are_refused(tmp_path):
    packages = lock_packages()[:3]
    with pytest.raises(ToolkitError, match=f"--wheels {tmp_path}: lacks 3 of the lock's wheels \\({packages[0].filename}"):
        local_wheels(packages, tmp_path)
    for package in packages:
        (tmp_path / package.filename).write_bytes(b"")
    local = local_wheels(packages, tmp_path)
    assert [p.url for p in local] == [(tmp_path / p.filename).as_uri() for p in packages]
    assert [p.sha256 for p in local] == [p.sha256 for p in packages]  # pip still checks the lock's hashes


@pytest.mark.network
def test_a_real_cuda_torch_stands_in_for_the_locks(tmp_path):
    """locks/py-cu130 installed with FA_CUDA_TORCH's torch 2.14.1+cu130 and NVIDIA wheels copied, the rest
    (nvcc, crt, nvvm, cccl...) from PyPI: torch's files are the source's bytes, nvcc runs, torch imports."""
    cuda_torch = os.environ.get("FA_CUDA_TORCH")
    if not cuda_torch:
        pytest.skip("FA_CUDA_TORCH is not set (.ci/run installs a CUDA torch there)")
    prefix = tmp_path / "env"
    env = {**os.environ, "PYTHONPATH": f"{cuda_torch}{os.pathsep}{ROOT}", "TOOLKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "toolkit", "install", "py-cu130", "--prefix", str(prefix),
                           "--python", sys.executable, "--torch-from", sys.executable], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads((prefix / "etc" / "fa-envkit" / "lock.json").read_text())
    assert record["stand_ins"]["torch"].startswith("2.14.1") and cuda_torch in record["stand_ins"]["torch"]
    assert "nvidia-cuda-nvcc" not in record["stand_ins"]  # the compiler came from the lock's wheel
    site = prefix / "lib" / "python3.11" / "site-packages"
    assert sha(site / "torch" / "version.py") == sha(Path(cuda_torch) / "torch" / "version.py")
    nvcc = subprocess.run([str(site / "nvidia" / "cu13" / "bin" / "nvcc"), "--version"], capture_output=True, text=True)
    assert "release 13.0" in nvcc.stdout
    imported = subprocess.run([str(prefix / "bin" / "python"), "-c", "import torch; print(torch.__file__)"],
                              capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                                   if k != "PYTHONPATH"})
    assert imported.stdout.strip() == str(site / "torch" / "__init__.py"), imported.stderr

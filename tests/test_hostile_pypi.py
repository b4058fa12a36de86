"""Hostile pypi locks: the real committed lock with one edit (its digest recomputed, as a careful hand edit or a
bad merge would leave it), a pylock that is not the one written with it, and uv's failures reported by uv's reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env import pypi_lock
from toolkit.env.lockfile import KEY_CUDA, KEY_DIGEST, lock_digest, read_lock

ROOT = Path(__file__).resolve().parent.parent


def copied(tmp_path: Path, line: str, edit=None) -> Path:
    """The committed lock and pylock of `line` in tmp_path/locks, the lock's document passed through `edit` and
    its digest recomputed."""
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    shutil.copy(Workspace(locks=ROOT / "locks").pylock_file(line), locks)
    path = locks / f"{line}.conda-lock.yml"
    document = yaml.safe_load((ROOT / "locks" / path.name).read_text())
    if edit:
        edit(document)
        document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def entry(document: dict, name: str) -> dict:
    return next(p for p in document["package"] if p["name"] == name)


def test_a_real_lock_copied_whole_reads(tmp_path):
    assert read_lock(copied(tmp_path, "py-cu132")).cuda == "13.2"


def test_crt_of_another_release_beside_nvcc_is_refused(tmp_path):
    """The trap: nvidia-cuda-nvcc does not pin crt, so a resolver left alone puts crt 13.5.37 beside nvcc 13.2.86."""
    path = copied(tmp_path, "py-cu132", lambda d: entry(d, "nvidia-cuda-crt").update(version="13.5.37"))
    with pytest.raises(ToolkitError) as caught:
        read_lock(path)
    assert str(caught.value) == (
        f"{path}: nvidia-cuda-crt 13.5.37 beside nvidia-cuda-nvcc 13.2.86 is not CUDA 13.2's (cuda-toolkit 13.2.2: "
        f"nvidia-cuda-crt==13.2.86.*, toolkit/knowledge/pypi_cuda.yaml) (a pypi lock is one CUDA release: re-run "
        f"`toolkit lock py-cu132`)")


@pytest.mark.parametrize("edit, problem", [
    (lambda d: entry(d, "nvidia-nvjitlink").update(version="13.5.37"),
     "nvidia-nvjitlink 13.5.37 beside nvidia-cuda-nvcc 13.2.86 is not CUDA 13.2's (cuda-toolkit 13.2.2: "
     "nvidia-nvjitlink==13.2.86.*"),
    (lambda d: entry(d, "cuda-toolkit").update(version="13.5.0"),
     "cuda-toolkit 13.5.0 beside nvidia-cuda-nvcc 13.2.86 is not CUDA 13.2's (cuda-toolkit 13.2.2: "
     "cuda-toolkit==13.2.2"),
    (lambda d: d["package"].remove(entry(d, "nvidia-nvvm")),
     "nvidia-nvvm is missing: CUDA 13.2's cuda-toolkit 13.2.2 installs it"),
    (lambda d: entry(d, "nvidia-cuda-nvcc").update(version="not-a-version"),
     "nvidia-cuda-nvcc not-a-version is not CUDA 13.2's"),
    (lambda d: d["metadata"]["custom_metadata"].update({KEY_CUDA: "12.8"}),
     "CUDA 12.8 is not a pypi line of toolkit/knowledge/pypi_cuda.yaml"),
], ids=["nvjitlink", "meta-wheel", "missing-nvvm", "bad-version", "cuda-12"])
def test_a_lock_that_is_not_one_cuda_release_is_refused(tmp_path, edit, problem):
    with pytest.raises(ToolkitError) as caught:
        read_lock(copied(tmp_path, "py-cu132", edit))
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_pypi_lock_without_its_cuda_is_refused(tmp_path):
    path = copied(tmp_path, "py-cu130", lambda d: d["metadata"]["custom_metadata"].pop(KEY_CUDA))
    with pytest.raises(ToolkitError) as caught:
        read_lock(path)
    assert str(caught.value).startswith(f"{path}: fa-envkit.cuda: None is not a CUDA release like 13.2 (re-run")


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_text(p.read_text().replace("13.0.88", "13.5.37", 1)),
     "locks/pylock.py-cu130.toml: not the pylock written with locks/py-cu130.conda-lock.yml (edited? re-run "
     "`toolkit lock py-cu130`)"),
    (Path.unlink,
     "locks/pylock.py-cu130.toml: missing beside locks/py-cu130.conda-lock.yml (re-run `toolkit lock py-cu130`)"),
], ids=["edited", "missing"])
def test_lock_check_names_a_pylock_that_is_not_the_locks(tmp_path, monkeypatch, capsys, damage, problem):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    copied(tmp_path, "py-cu130")
    damage(Workspace(locks=tmp_path / "locks").pylock_file("py-cu130"))
    assert main(["lock", "--check", "py-cu130"]) == 1
    assert capsys.readouterr().out.splitlines() == [problem]


# ---------------------------------------------------------------- uv's answers


UV_PLAIN = """\
error: No solution found when resolving dependencies
  cause: Because torch>=2.15.0 depends on cuda-toolkit[cublas]==13.2.2 and you require torch==2.15.0, we can \
conclude that your requirements and cuda-toolkit[nvcc]==13.5.0 are incompatible.
         And because you require cuda-toolkit[nvcc]==13.5.0, we can conclude that your requirements are unsatisfiable.
"""
UV_FANCY = """\
  × No solution found when resolving dependencies:
  ╰─▶ Because there is no version of torch==2.99.0 and you require torch==2.99.0, we can conclude that your
      requirements are unsatisfiable.

      hint: Pre-releases are available for `torch` in the requested range
"""


def test_uv_complaint_is_the_reason_not_the_headline():
    assert pypi_lock.uv_complaint(UV_PLAIN) == (
        "No solution found when resolving dependencies: Because torch>=2.15.0 depends on cuda-toolkit[cublas]==13.2.2 "
        "and you require torch==2.15.0, we can conclude that your requirements and cuda-toolkit[nvcc]==13.5.0 are "
        "incompatible. And because you require cuda-toolkit[nvcc]==13.5.0, we can conclude that your requirements "
        "are unsatisfiable.")
    assert pypi_lock.uv_complaint(UV_FANCY) == (
        "No solution found when resolving dependencies:: Because there is no version of torch==2.99.0 and you require "
        "torch==2.99.0, we can conclude that your requirements are unsatisfiable.")


def test_a_package_without_a_wheel_for_the_target_is_refused():
    pylock = ('lock-version = "1.0"\ncreated-by = "uv"\n\n[[packages]]\nname = "only-sdist"\nversion = "1.0"\n'
              'sdist = { url = "https://files.pythonhosted.org/packages/x/only_sdist-1.0.tar.gz", hashes = '
              '{ sha256 = "' + "0" * 64 + '" } }\n'
              'wheels = [{ url = "https://files.pythonhosted.org/packages/x/only_sdist-1.0-cp311-cp311-win_amd64.whl", '
              'hashes = { sha256 = "' + "1" * 64 + '" } }]\n')
    with pytest.raises(ToolkitError) as caught:
        pypi_lock.pylock_entries(pylock, "locks/pylock.x.toml", "linux-64", "3.11", "2.28")
    assert str(caught.value) == ("locks/pylock.x.toml: only-sdist 1.0 has no wheel for linux-64 python 3.11 (the layer "
                                 "installs wheels only: pin a version that has one)")


def test_a_broken_pylock_is_one_line():
    with pytest.raises(ToolkitError) as caught:
        pypi_lock.pylock_entries("[[packages]\n", "locks/pylock.x.toml", "linux-64", "3.11", "2.28")
    assert str(caught.value).startswith("locks/pylock.x.toml: not a pylock.toml uv wrote (")

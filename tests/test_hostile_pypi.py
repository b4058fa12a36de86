"""Hostile pypi locks: the real committed lock with one edit (its digest recomputed, as a careful hand edit or a
bad merge would leave it), a pylock that is not the one written with it, and uv's failures reported by uv's reason."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env import pypi_lock
from toolkit.env.lockfile import KEY_CUDA, KEY_DIGEST, LockedPackage, lock_digest, read_lock

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

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


@pytest.mark.parametrize("text", [
    "[[packages]\n",  # not TOML
    'lock-version = "1.0"\n\n[[packages]]\nname = "Multi"\nversion = "1.0"\n',  # not PEP 751 (packaging.pylock says)
], ids=["toml", "pep751"])
def test_a_broken_pylock_is_one_line(text):
    with pytest.raises(ToolkitError) as caught:
        pypi_lock.pylock_entries(text, "locks/pylock.x.toml", "linux-64", "3.11", "2.28")
    assert str(caught.value).startswith("locks/pylock.x.toml: not a pylock.toml uv wrote (")


# ---------------------------------------------------------------- a lock says what it installs


def pylock_wheel(line: str, name: str) -> tuple[str, str]:
    """(url, sha256) of `name`'s wheel in the committed pylock of `line` (one wheel per package there)."""
    pylock = tomllib.loads(Workspace(locks=ROOT / "locks").pylock_file(line).read_text())
    wheel = next(p for p in pylock["packages"] if p["name"] == name)["wheels"][0]
    return wheel["url"], wheel["hashes"]["sha256"]


def cli_error(capsys) -> str:
    """The one line a refused verb printed (stdout for lock --check, stderr for the rest), no traceback."""
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert "Traceback" not in captured.err and len(lines) == 1, captured
    return lines[0].removeprefix("error: ")


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """The real envs/ in tmp_path, the working directory, for `lock --check` and `install` of a copied lock."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    return tmp_path


@pytest.mark.parametrize("verb", [["lock", "--check", "py-cu130"], ["install", "py-cu130", "--prefix", "env"]])
def test_an_entry_naming_another_releases_wheel_is_refused(project, capsys, verb):
    """nvcc's entry says 13.0.88 (CUDA 13.0's, so the release check passes) while its url and sha256 are the
    13.2.86 wheel: the wheel's own file name says which release it is."""
    url, sha256 = pylock_wheel("py-cu132", "nvidia-cuda-nvcc")
    copied(project, "py-cu130", lambda d: entry(d, "nvidia-cuda-nvcc").update(url=url, hash={"sha256": sha256}))
    assert main(verb) == 1
    assert cli_error(capsys) == (
        f"locks/py-cu130.conda-lock.yml: nvidia-cuda-nvcc 13.0.88 ({url.rsplit('/', 1)[-1]}): its wheel is "
        f"nvidia-cuda-nvcc 13.2.86 by its file name (the entry was edited: re-run `toolkit lock py-cu130`)")
    assert not (project / "env").exists()


@pytest.mark.parametrize("name", ["nvidia-cuda-nvcc", "filelock", "cuda-toolkit"])
@pytest.mark.parametrize("verb", [["lock", "--check", "py-cu130"], ["install", "py-cu130", "--prefix", "env"]])
def test_a_version_of_5000_digits_is_one_line(project, capsys, verb, name):
    """A quoted version with a component of 5000 digits: packaging's int() refuses it with a ValueError."""
    long = "13.0." + "8" * 5000
    copied(project, "py-cu130", lambda d: entry(d, name).update(version=long))
    assert main(verb) == 1
    line = cli_error(capsys)
    assert line.startswith("locks/py-cu130.conda-lock.yml: ") and f"{long[:64]}... (5005 characters)" in line
    assert len(line) < 400 and not (project / "env").exists()


@pytest.mark.parametrize("edit, only_in", [
    (lambda d: d["package"].remove(entry(d, "nvidia-cudnn-cu13")), ("nvidia-cudnn-cu13", "pylock.py-cu130.toml")),
    (lambda d: d["package"].remove(entry(d, "cuda-bindings")), ("cuda-bindings", "pylock.py-cu130.toml")),
    (lambda d: entry(d, "einops").update(hash={"sha256": "0" * 64}), ("einops", "py-cu130.conda-lock.yml")),
], ids=["cudnn-deleted", "cuda-bindings-deleted", "sha256-edited"])
def test_lock_check_compares_the_locks_wheels_with_its_pylocks(project, capsys, edit, only_in):
    """The pylock's sha256 in the lock proves the pylock unchanged; the lock's own entries, edited and re-signed,
    must still be the pylock's wheels for the line's target."""
    copied(project, "py-cu130", edit)
    assert main(["lock", "--check", "py-cu130"]) == 1
    line = cli_error(capsys)
    name, where = only_in
    assert line.startswith("locks/py-cu130.conda-lock.yml: its pip entries are not the wheels of "
                           "locks/pylock.py-cu130.toml: " + name)
    assert f"is only in locks/{where} (an entry was deleted, added or edited after locking: " in line
    assert line.endswith("re-run `toolkit lock py-cu130`)")


# ---------------------------------------------------------------- which wheel of a package the target installs

MULTI = {"1": "py3-none-any", "2": "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
         "3": "cp311-cp311-manylinux_2_34_x86_64", "4": "cp312-cp312-manylinux_2_17_x86_64",
         "5": "cp311-cp311-manylinux_2_17_aarch64", "6": "cp311-abi3-manylinux_2_17_x86_64", "7": "cp311-cp311-win_amd64"}


@pytest.mark.parametrize("platform, python, glibc, chosen", [
    ("linux-64", "3.11", "2.28", "2"),  # manylinux_2_34 needs a newer glibc; cp311-cp311 before abi3 and py3
    ("linux-64", "3.11", "2.34", "3"),  # the newest manylinux the target accepts first
    ("linux-64", "3.12", "2.28", "4"),  # the python's own ABI before cp311's abi3
    ("linux-64", "3.13", "2.28", "6"),  # no cp313 wheel: the stable ABI of an older python before pure python
    ("linux-aarch64", "3.11", "2.28", "5"),
    ("linux-aarch64", "3.12", "2.28", "1"),  # nothing built for it: the pure-python wheel
])
def test_the_wheel_chosen_is_the_most_specific_one_the_target_installs(platform, python, glibc, chosen):
    """One package, seven wheels (pip's tag order: interpreter ABI, then abi3, then py3-none-any; the newest
    manylinux the target's glibc accepts): the entry is the one this target's pip would install."""
    wheels = ", ".join(f'{{ url = "https://files.example/multi-1.0-{tags}.whl", hashes = {{ sha256 = "{n * 64}" }} }}'
                       for n, tags in MULTI.items())
    pylock = f'lock-version = "1.0"\ncreated-by = "uv"\n\n[[packages]]\nname = "multi"\nversion = "1.0"\nwheels = [{wheels}]\n'
    [picked] = pypi_lock.pylock_entries(pylock, "locks/pylock.x.toml", platform, python, glibc)
    assert (picked.name, picked.version, picked.platform) == ("multi", "1.0", platform)
    assert (picked.url, picked.sha256) == (f"https://files.example/multi-1.0-{MULTI[chosen]}.whl", chosen * 64)


# ---------------------------------------------------------------- `toolkit lock`: current, and where it writes

UNREACHABLE = "http://127.0.0.1:9/simple"  # a relock stops at once, at the sdist pin, with one line


@pytest.mark.parametrize("damage", [
    lambda locks: (locks / "pylock.py-cu130.toml").write_text(
        (locks / "pylock.py-cu130.toml").read_text().replace('version = "4.3.1"', 'version = "4.3.2"')),
    lambda locks: (locks / "pylock.py-cu130.toml").write_text(
        (locks / "pylock.py-cu130.toml").read_text() + "# its wheels as they were: only its sha256 says it changed\n"),
    lambda locks: copied(locks.parent, "py-cu130", lambda d: d["package"].remove(entry(d, "nvidia-cudnn-cu13"))),
], ids=["pylock-edited", "pylock-comment-added", "lock-entry-deleted"])
def test_lock_never_calls_a_lock_current_whose_pylock_disagrees(project, capsys, damage):
    """`toolkit lock LINE` keeps a lock it calls current: a pylock edited after locking, or a re-signed lock
    whose entries are not its pylock's, are not current (it locks again, here stopping at the unreachable index)."""
    copied(project, "py-cu130")
    assert main(["lock", "py-cu130", "--pypi", UNREACHABLE]) == 0
    assert capsys.readouterr().out == "locks/py-cu130.conda-lock.yml: up to date (inputs unchanged)\n"
    damage(project / "locks")
    assert main(["lock", "py-cu130", "--pypi", UNREACHABLE]) == 1
    assert cli_error(capsys).startswith(f"{UNREACHABLE}/flash-attn/: cannot read flash-attn's release files")


def test_lock_leaves_no_writer_waiting_when_it_writes_nothing(project):
    """`toolkit lock` forks the lock's writer before it reads the spec (it imports conda-lock meanwhile): a lock
    found current, or a spec refused, ends it. None is left waiting below the process (one would wait until it
    ends: a long-lived caller of `main` would collect them)."""
    copied(project, "py-cu130")
    (project / "envs" / "broken.yaml").write_text("extends: [\n")
    script = (
        "import os\n"
        "from toolkit.cli import main\n"
        f"codes = [main(['lock', 'py-cu130', '--pypi', {UNREACHABLE!r}]), main(['lock', 'broken'])]\n"
        "def parent(pid):\n"
        "    try:\n"
        "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
        "    except OSError:\n"
        "        return None\n"
        "print(codes, [p for p in os.listdir('/proc') if p.isdigit() and parent(p) == str(os.getpid())])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=project, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = done.stdout.splitlines()
    assert said[0] == "locks/py-cu130.conda-lock.yml: up to date (inputs unchanged)", done.stdout + done.stderr
    assert said[-1] == "[0, 1] []", done.stdout + done.stderr  # the two exit codes, no child process left


def write_offline(project: Path, line: str) -> Path:
    """write_lock of `line` from its committed pylock and how its lock says uv resolved it (what lock_pypi_layer
    would hand it), no network."""
    from toolkit.env.engine import CondaLayer
    from toolkit.env.lock import PipLayer, virtual_packages, write_lock
    from toolkit.spec.rules import checked_spec

    spec = checked_spec(project / "envs" / f"{line}.yaml")
    text = Workspace(locks=ROOT / "locks").pylock_file(line).read_text()
    metadata = yaml.safe_load((ROOT / "locks" / f"{line}.conda-lock.yml").read_text())["metadata"]
    platform = spec.platforms[0]
    packages = pypi_lock.pylock_entries(text, "pylock", platform, spec.python,
                                        virtual_packages(spec)[platform]["__glibc"])
    custom = metadata["custom_metadata"]
    layer = PipLayer(platform, custom[f"fa-envkit.pip-resolver.{platform}"], "", packages, text,
                     exclude_newer=custom["fa-envkit.exclude-newer"])
    sdist = read_lock(ROOT / "locks" / f"{line}.conda-lock.yml").sdist
    return write_lock(spec, CondaLayer((), metadata["content_hash"], ()), [layer], sdist,
                      Workspace(locks=project / "locks"))


@pytest.mark.parametrize("folder", ["py-cu130.conda-lock.yml", "pylock.py-cu130.toml"])
def test_a_folder_at_the_lock_or_pylock_path_is_refused_before_either_is_written(project, folder):
    """The pylock was renamed into place before the lock failed on its folder: the two disagreed."""
    locks = project / "locks"
    locks.mkdir()
    (locks / "py-cu130.conda-lock.yml").write_text("old lock")
    (locks / "pylock.py-cu130.toml").write_text("old pylock")
    (locks / folder).unlink()
    (locks / folder / "mine").mkdir(parents=True)
    with pytest.raises(ToolkitError) as refused:
        write_offline(project, "py-cu130")
    assert str(refused.value) == (f"locks/{folder}: is not a file (a folder?), and `toolkit lock` writes there: move "
                                  f"it away and lock again (nothing was written)")
    assert sorted(p.name for p in locks.iterdir()) == ["py-cu130.conda-lock.yml", "pylock.py-cu130.toml"]
    assert (locks / folder / "mine").is_dir()
    assert [p.read_text() for p in locks.iterdir() if p.name != folder] == [
        "old lock" if folder.startswith("pylock") else "old pylock"]


def test_the_lock_written_offline_is_the_committed_one(project):
    """write_offline writes what `toolkit lock` wrote: the refusals above are of the real writer."""
    path = write_offline(project, "py-cu130")
    assert path.read_bytes() == (ROOT / "locks" / "py-cu130.conda-lock.yml").read_bytes()
    assert (project / "locks" / "pylock.py-cu130.toml").read_bytes() == (ROOT / "locks" / "pylock.py-cu130.toml").read_bytes()


def test_a_failed_rename_puts_back_the_files_already_replaced(tmp_path):
    """Should the lock's rename fail (a folder made there after the check), the pylock renamed before it gets
    its old content back, and a requirements file that was not there before is removed."""
    from toolkit.env.lock import publish_together

    staged, dest = tmp_path / "staged", tmp_path / "locks"
    staged.mkdir()
    dest.mkdir()
    for name in ("a", "b", "c"):
        (staged / name).write_text(f"new {name}")
    (dest / "a").write_text("old a")
    (dest / "c" / "mine").mkdir(parents=True)
    with pytest.raises(ToolkitError, match=r"^.*/locks/c: cannot write it \(Is a directory\); the lock's files are "
                                           r"left as they were: lock again$"):
        publish_together([(staged / n, dest / n) for n in ("a", "b", "c")], staged / "kept")
    assert (dest / "a").read_text() == "old a" and not (dest / "b").exists() and (dest / "c" / "mine").is_dir()


# ---------------------------------------------------------------- install: each wheel read before pip installs it

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
LOCK = Path("locks/py-cu130.conda-lock.yml")  # named in the messages


def as_entry(path: Path, name: str, version: str) -> LockedPackage:
    """A wheel as a lock's pip entry: file:// URL, sha256 from hashlib."""
    return LockedPackage("pip", name, version, path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest(), "linux-64")


def toolchain_wheels(folder: Path, cudnn: str = "9.1.0") -> dict[str, LockedPackage]:
    """torch needing cudnn and cuda-toolkit[nvcc] (on Linux), cuda-toolkit needing nvcc for its extra `nvcc` only,
    nvcc and cudart with the files VenvBuild.make links: a pypi line's closure in miniature."""
    from conda_channel import make_wheel

    made = [make_wheel(folder, "torch", "2.9.1", ("nvidia-cudnn-cu13==9.1.0; platform_system == 'Linux'",
                                                  "cuda-toolkit[nvcc]==13.0.3; sys_platform == 'linux'",
                                                  "pywin32; sys_platform == 'win32'")),
            make_wheel(folder, "cuda-toolkit", "13.0.3", ("nvidia-cuda-nvcc==13.0.88.*; extra == 'nvcc'",
                                                          "nvidia-cublas==13.0.*; extra == 'cublas'")),
            make_wheel(folder, "nvidia-cudnn-cu13", cudnn)]
    entries = {name: as_entry(path, name, version) for path, (name, version) in
               zip(made, [("torch", "2.9.1"), ("cuda-toolkit", "13.0.3"), ("nvidia-cudnn-cu13", cudnn)])}
    for name, version, files in (("nvidia-cuda-nvcc", "13.0.88", {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n"}),
                                 ("nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"\0"})):
        entries[name] = small_wheel(folder, name, version, files)
    return entries


def small_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> LockedPackage:
    from test_hostile_pypi_install import wheel

    return wheel(folder, name, version, files)


def venv_of(tmp_path: Path, packages) -> Path:
    """VenvBuild.make of the packages (a pypi line's install, its lock named LOCK) as `toolkit install` runs it:
    staged in an owned work folder beside the prefix tmp_path/venvs/env, swapped into place only once made."""
    from rich.console import Console

    from toolkit.base.atomic import owned_dir
    from toolkit.env.install import replace_prefix
    from toolkit.env.pypi_install import VenvBuild
    from toolkit.knowledge.facts import load_knowledge

    pypi = load_knowledge().pypi
    build = VenvBuild(Path(sys.executable), PYTHON, tuple(packages), pypi.lines["13.0.3"], pypi.cuda_home,
                      lock_file=LOCK)
    prefix = tmp_path / "venvs" / "env"
    with owned_dir(prefix.parent, f"install-{prefix.name}") as work:
        build.make(work / "env", prefix, Console(quiet=True))
        replace_prefix(work / "env", prefix)
    return prefix


def installed(venv: Path) -> list[str]:
    """The distributions in the venv besides those `python -m venv` put there."""
    site = venv / "lib" / f"python{PYTHON}" / "site-packages"
    return sorted(p.name.split("-")[0] for p in site.glob("*.dist-info") if not p.name.startswith(("pip-", "setuptools-")))


def nothing_installed(tmp_path: Path) -> bool:
    """No venv at the prefix and no staged one left beside it: uv installs into the staging folder and the wheels
    are checked there, before the swap, so a refusal must leave tmp_path/venvs as empty as it was."""
    return not any((tmp_path / "venvs").iterdir())


def test_a_pypi_lock_holding_every_dependency_installs(tmp_path):
    """The control of the refusals below: the whole miniature closure installs."""
    venv = venv_of(tmp_path, toolchain_wheels(tmp_path / "wheels").values())
    assert installed(venv) == ["cuda_toolkit", "nvidia_cuda_nvcc", "nvidia_cuda_runtime", "nvidia_cudnn_cu13",
                               "torch"]
    assert [p.name for p in (tmp_path / "venvs").iterdir()] == ["env"]  # what nothing_installed looks at


@pytest.mark.parametrize("deleted, problem", [
    ("nvidia-cudnn-cu13", "nvidia-cudnn-cu13, which torch requires (nvidia-cudnn-cu13==9.1.0; platform_system == "
                          "\"Linux\"), is not among the lock's wheels"),
    ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc, which cuda-toolkit requires (nvidia-cuda-nvcc==13.0.88.*; extra == "
                         "\"nvcc\"), is not among the lock's wheels"),
    ("cuda-toolkit", "cuda-toolkit, which torch requires (cuda-toolkit[nvcc]==13.0.3; sys_platform == \"linux\"), "
                     "is not among the lock's wheels"),
])
def test_a_dependency_deleted_from_a_pypi_lock_is_refused_before_the_swap(tmp_path, deleted, problem):
    """torch without cudnn installed with rc 0 (--no-deps installs what the lock lists): every Requires-Dist the
    wheels declare for the target (an extra's where a wheel asks for it) must be in the lock. uv installs into
    the staging folder, the closure is checked there, and the refused venv never reaches the prefix."""
    packages = toolchain_wheels(tmp_path / "wheels")
    del packages[deleted]
    with pytest.raises(ToolkitError) as refused:
        venv_of(tmp_path, packages.values())
    assert str(refused.value) == (f"{LOCK}: {problem} (an entry was deleted or edited: re-run `toolkit lock py-cu130`; "
                                  f"nothing was installed)")
    assert nothing_installed(tmp_path)


def test_a_locked_version_its_dependant_does_not_accept_is_refused(tmp_path):
    packages = toolchain_wheels(tmp_path / "wheels", cudnn="9.2.0")
    with pytest.raises(ToolkitError, match=r": nvidia-cudnn-cu13 9\.2\.0 is not what torch requires \(nvidia-cudnn-cu13"
                                           r"==9\.1\.0; platform_system == \"Linux\"\) \(an entry was deleted or edited"):
        venv_of(tmp_path, packages.values())
    assert nothing_installed(tmp_path)


@pytest.mark.parametrize("field", ["version", "name"])
def test_a_wheel_whose_metadata_is_not_its_entry_is_refused(tmp_path, field):
    """A wheel of nvcc 13.2.86 served under 13.0.88's file name (a mirror, a --wheels folder): the file name and
    the entry agree, the wheel's own METADATA says what pip would install."""
    from conda_channel import make_wheel

    packages = toolchain_wheels(tmp_path / "wheels")
    real = small_wheel(tmp_path / "other", "nvidia-cuda-nvcc", "13.2.86", {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n"}) \
        if field == "version" else as_entry(make_wheel(tmp_path / "other", "nvidia-cuda-nvvm", "13.0.88"),
                                            "nvidia-cuda-nvvm", "13.0.88")
    disguised = tmp_path / "wheels" / "nvidia_cuda_nvcc-13.0.88-py3-none-any.whl"
    disguised.write_bytes(Path(urllib.request.url2pathname(real.url.removeprefix("file://"))).read_bytes())
    packages["nvidia-cuda-nvcc"] = as_entry(disguised, "nvidia-cuda-nvcc", "13.0.88")
    with pytest.raises(ToolkitError) as refused:
        venv_of(tmp_path, packages.values())
    found = "nvidia-cuda-nvcc 13.2.86" if field == "version" else "nvidia-cuda-nvvm 13.0.88"
    assert str(refused.value) == (f"{LOCK}: nvidia-cuda-nvcc 13.0.88 (nvidia_cuda_nvcc-13.0.88-py3-none-any.whl): its "
                                  f"wheel is {found} by its METADATA (the entry was edited: re-run `toolkit lock "
                                  f"py-cu130`)")
    assert nothing_installed(tmp_path)

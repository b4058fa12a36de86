"""The `pypi` toolchain kind: envs/py-cu130.yaml and py-cu132.yaml (NVIDIA's CUDA wheels and torch from PyPI), the
rules that read toolkit/knowledge/pypi_cuda.yaml, and their locks (uv from metadata; network tests ask PyPI)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from conda_channel import build_simple_index, make_sdist, make_wheel, serve_directory
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env import pypi_lock
from toolkit.env.engine import locking_environment
from toolkit.env.lock import lock_line
from toolkit.env.lockfile import lock_path, read_lock
from toolkit.knowledge.facts import load_knowledge
from toolkit.knowledge.files import KNOWLEDGE_DIR
from toolkit.spec.envspec import load_spec
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org"
KNOWLEDGE = yaml.safe_load((KNOWLEDGE_DIR / "pypi_cuda.yaml").read_text())


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """A copy of the real envs/ (base and the two pypi lines) in a scratch folder, the working directory."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "envs"
    folder.mkdir()
    for name in ("base", "py-cu130", "py-cu132"):
        shutil.copy(ROOT / "envs" / f"{name}.yaml", folder)
    return folder


def edit(envs: Path, line: str, old: str, new: str) -> None:
    path = envs / f"{line}.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))


def check(capsys, *lines: str) -> tuple[int, list[str]]:
    code = main(["check", *lines])
    return code, [line for line in capsys.readouterr().out.splitlines() if ": patch: " not in line]


# ---------------------------------------------------------------- spec and rules


def test_pypi_lines_load_as_kind_pypi_and_pass_check(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(ROOT / "envs" / "py-cu132.yaml")
    assert (spec.toolchain.kind, spec.cuda, spec.torch_version, spec.channels, spec.conda_packages) == \
        ("pypi", "13.2", "2.15.0", (), {})
    assert check(capsys, "py-cu130", "py-cu132") == (0, ["2 specs checked: no problems"])


def test_cuda_12_pypi_line_is_refused_with_the_knowledge_reason(envs, capsys):
    edit(envs, "py-cu130", 'cuda: "13.0"', 'cuda: "12.8"')
    edit(envs, "py-cu130", '"2.14.1"', '"2.10.0"')
    code, out = check(capsys, "py-cu130")
    assert code == 1
    assert out == [f"envs/py-cu130.yaml:6: cuda: CUDA 12.8 has {KNOWLEDGE['cuda_12']} (use kind: locked, or a pypi "
                   f"line of CUDA 13.0-13.5; toolkit/knowledge/pypi_cuda.yaml)"]


def test_pypi_torch_must_be_the_one_pinning_the_release(envs, capsys):
    edit(envs, "py-cu132", '"2.15.0"', '"2.14.1"')
    code, out = check(capsys, "py-cu132")
    assert code == 1
    assert out == ["envs/py-cu132.yaml:15: torch.version: torch 2.14.1 does not pair with CUDA 13.2 from PyPI (torch "
                   "2.14's PyPI wheels are CUDA 13.0; CUDA 13.2's cuda-toolkit 13.2.2 is pinned by torch 2.15.0: use "
                   "torch 2.15.0; toolkit/knowledge/pypi_cuda.yaml)"]


def test_pypi_release_without_a_torch_is_refused(envs, capsys):
    edit(envs, "py-cu132", 'cuda: "13.2"', 'cuda: "13.5"')
    code, out = check(capsys, "py-cu132")
    assert code == 1
    assert out[:-1] == ["envs/py-cu132.yaml:15: torch.version: torch 2.15.0 has no cu135 build (cu135 builds: torch none)"]
    assert out[-1:] == ["envs/py-cu132.yaml:15: torch.version: no torch on PyPI pins cuda-toolkit 13.5.0 (CUDA 13.5), so "
                   "torch 2.15.0 cannot share its environment (torch 2.15's PyPI wheels are CUDA 13.2; use CUDA 13.2; "
                   "toolkit/knowledge/pypi_cuda.yaml)"]


def test_pypi_python_needs_torch_wheels(envs, capsys):
    edit(envs, "py-cu132", 'python: "3.11"', 'python: "3.10"')
    code, out = check(capsys, "py-cu132")
    assert code == 1
    assert out == ["envs/py-cu132.yaml:7: python: torch 2.15 has no wheel for python 3.10 (torch 2.15 wheels: python "
                   "3.11-3.15)"]


@pytest.mark.parametrize("old, new, expected", [
    ("platforms: [linux-64]", "platforms: [linux-64, linux-aarch64]",
     "envs/py-cu130.yaml:9: platforms: linux-aarch64: the pypi lines' wheels were checked for linux-64 only (use "
     "platforms: [linux-64]; toolkit/knowledge/pypi_cuda.yaml)"),
    ("conda_packages: null\n", "",
     "envs/py-cu130.yaml: conda_packages: a pypi toolchain has no conda layer: its python is the machine's and its "
     "CUDA comes from PyPI (set conda_packages: null and channels: null) [set in envs/base.yaml:7]"),
    ("  kind: pypi", "  kind: pypi\n  nvcc: '13.0'",
     "envs/py-cu130.yaml:18: toolchain: nvcc only apply to kind: external (a pypi toolchain comes from the lock; "
     "remove them or set kind: external)"),
], ids=["aarch64", "conda-layer", "external-field"])
def test_pypi_spec_refusals(envs, capsys, old, new, expected):
    edit(envs, "py-cu130", old, new)
    assert check(capsys, "py-cu130") == (1, [expected])


# ---------------------------------------------------------------- the committed locks (offline)


def test_committed_pypi_locks_are_current(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["lock", "--check", "py-cu130", "py-cu132"]) == 0
    assert capsys.readouterr().out.strip() == "2 lines checked: every lock is current"


@pytest.mark.parametrize("line", ["py-cu130", "py-cu132"])
def test_committed_pypi_lock_and_pylock_name_the_same_wheels(line):
    """Each conda-lock pip entry is a wheel of the pylock (same URL and sha256), one per package, every NVIDIA
    component the knowledge's release pins."""
    locked = read_lock(lock_path(line, ROOT / "locks"))
    pylock = tomllib.loads(Workspace(locks=ROOT / "locks").pylock_file(line).read_text())
    wheels = {(p["name"], w["url"], w["hashes"]["sha256"]) for p in pylock["packages"] for w in p.get("wheels", [])}
    assert locked.toolchain_kind == "pypi" and locked.platforms == ("linux-64",)
    assert {(p.name, p.url, p.sha256) for p in locked.packages} <= wheels
    assert len(locked.packages) == len(pylock["packages"])
    versions = {p.name: p.version for p in locked.packages}
    release = next(facts for toolkit, facts in KNOWLEDGE["lines"].items()
                   if Version(toolkit) == Version(versions["cuda-toolkit"]))
    assert release["cuda"] == locked.cuda
    assert {name: versions[name] for name in release["components"]} == release["components"]
    assert versions["torch"] in release["torch"]
    assert versions["torch"] == load_spec(ROOT / "envs" / f"{line}.yaml").torch_version


def test_committed_pypi_locks_record_a_time_after_every_file_they_pin():
    """A pypi lock records the time it was resolved at (uv's --exclude-newer, which keeps files uploaded before
    it): after the newest upload-time of its pylock's files, so a re-lock at that time has every file it pins."""
    for line in ("py-cu130", "py-cu132", "py-cu130-torch211"):
        locked = read_lock(lock_path(line, ROOT / "locks"))
        pylock = tomllib.loads(Workspace(locks=ROOT / "locks").pylock_file(line).read_text())
        uploads = [f["upload-time"] for p in pylock["packages"] for f in [*p.get("wheels", []), p.get("sdist", {})]
                   if "upload-time" in f]
        newest = max(uploads).astimezone(timezone.utc)
        assert datetime.strptime(locked.exclude_newer, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) > newest


# ---------------------------------------------------------------- locking as of a time (offline: a loopback index)

EARLIER = "2026-11-01T00:00:00Z"  # the stand-in index's files but the late ninja


def stand_in_index(root: Path, ninjas: dict[str, str]) -> None:
    """root/simple: tiny stand-ins of what envs/py-cu130.yaml resolves to (torch 2.14.1, cuda-toolkit 13.0.3 and
    the components its release pins, the build's dependencies, flash-attn's sdist), uploaded at EARLIER; ninja
    at each version and upload time of `ninjas`."""
    release = load_knowledge().pypi.release("13.0.3")
    assert release is not None
    dist = root / "dist"
    files = [make_wheel(dist, "torch", "2.14.1"), make_sdist(dist, "flash-attn", "2.8.3.post2"),
             make_wheel(dist, "cuda-toolkit", "13.0.3", tuple(f"{n}=={v}" for n, v in release.components.items())),
             *(make_wheel(dist, name, version) for name, version in release.components.items()),
             *(make_wheel(dist, name, "1.0") for name in ("packaging", "psutil", "einops", "setuptools", "wheel"))]
    times = {f.name: EARLIER for f in files}
    for version, uploaded in ninjas.items():
        files.append(make_wheel(dist, "ninja", version))
        times[files[-1].name] = uploaded
    build_simple_index(root, files, times)


def locked_ninja(envs: Path) -> tuple[str, str]:
    locked = read_lock(lock_path("py-cu130", envs.parent / "locks"))
    return next(p.version for p in locked.packages if p.name == "ninja"), locked.exclude_newer


def test_a_relock_resolves_as_of_the_locks_time_and_newer_releases_are_advisory(envs, tmp_path, capsys):
    """A package released after the lock (ninja 1.1 here) stays out of a re-lock, which resolves as of the time
    the lock records; `lock --newer` names it without writing, `lock --update` takes it and records the new time."""
    stand_in_index(tmp_path / "index", {"1.0": EARLIER})
    with serve_directory(tmp_path / "index") as url:
        edit(envs, "py-cu130", "index: https://pypi.org/simple", f"index: {url}/simple")
        before = datetime.now(timezone.utc).replace(microsecond=0)
        assert main(["lock", "py-cu130", "--pypi", f"{url}/simple"]) == 0
        version, as_of = locked_ninja(envs)
        recorded = datetime.strptime(as_of, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert version == "1.0" and before <= recorded <= datetime.now(timezone.utc)
        late = recorded + timedelta(seconds=1)  # released after the lock
        stand_in_index(tmp_path / "index", {"1.0": EARLIER, "1.1": late.strftime("%Y-%m-%dT%H:%M:%SZ")})
        while datetime.now(timezone.utc) <= late + timedelta(seconds=1):
            time.sleep(0.2)
        edit(envs, "py-cu130", 'archs: ["80", "90", "100", "120"]', 'archs: ["90"]')  # the lock is stale
        assert main(["lock", "py-cu130", "--pypi", f"{url}/simple"]) == 0
        assert locked_ninja(envs) == ("1.0", as_of)
        lock = lock_path("py-cu130", envs.parent / "locks")
        written = lock.read_bytes()
        capsys.readouterr()
        assert main(["lock", "py-cu130", "--newer"]) == 0
        out = capsys.readouterr().out.strip()
        assert out == (f"locks/py-cu130.conda-lock.yml: advisory: since {as_of} the index resolves ninja 1.0 -> 1.1 "
                       f"(`toolkit lock py-cu130 --update` takes them)")
        assert lock.read_bytes() == written
        assert main(["lock", "py-cu130", "--update", "--pypi", f"{url}/simple"]) == 0
        version, updated = locked_ninja(envs)
        assert version == "1.1" and updated > as_of


# ---------------------------------------------------------------- locking (network: PyPI)


def locked_files(locks: Path, line: str) -> tuple[list[tuple[str, str, str, str]], str]:
    locked = read_lock(lock_path(line, locks))
    return (sorted((p.name, p.version, p.url, p.sha256) for p in locked.packages),
            Workspace(locks=locks).pylock_file(line).read_text())


@pytest.mark.network
def test_locking_twice_gives_the_same_packages_and_hashes(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = checked_spec(ROOT / "envs" / "py-cu132.yaml")
    first, second = tmp_path / "first", tmp_path / "second"
    started = time.perf_counter()
    assert lock_line(spec, workspace=Workspace(locks=first)) == (Workspace(locks=first).lock_file("py-cu132"), True)
    assert time.perf_counter() - started < 120  # metadata only: the 540 MB torch wheel is never downloaded
    assert lock_line(spec, workspace=Workspace(locks=first)) == (Workspace(locks=first).lock_file("py-cu132"), False)
    lock_line(spec, workspace=Workspace(locks=second))
    assert locked_files(first, "py-cu132") == locked_files(second, "py-cu132")
    packages, _ = locked_files(first, "py-cu132")
    assert {(name, version) for name, version, _, _ in packages} >= {
        ("torch", "2.15.0"), ("cuda-toolkit", "13.2.2"), ("nvidia-cuda-nvcc", "13.2.86"), ("nvidia-cuda-crt", "13.2.86"),
        ("nvidia-nvvm", "13.2.86"), ("nvidia-nvjitlink", "13.2.86"), ("cuda-bindings", "13.2.0")}


@pytest.mark.network
def test_an_unsatisfiable_pin_names_the_resolvers_reason(tmp_path):
    with pytest.raises(ToolkitError) as caught:
        pypi_lock.compile_pylock(["torch==2.99.0"], [], "3.11", "x86_64-manylinux_2_28", f"{PYPI}/simple", tmp_path,
                                 "pylock.x.toml", "toolkit lock x", locking_environment(), pypi_lock.now_utc())
    message = str(caught.value)
    assert "\n" not in message
    assert "there is no version of torch==2.99.0" in message, message
    assert message.startswith("uv pip compile failed: No solution found when resolving dependencies: Because")


@pytest.mark.network
@pytest.mark.parametrize("line", ["py-cu130", "py-cu132"])
def test_uv_installs_from_the_committed_pylock(tmp_path, line):
    """uv accepts the pylock as an install source (dry run: nothing is downloaded)."""
    pylock = Workspace(locks=ROOT / "locks").pylock_file(line)
    result = subprocess.run([pypi_lock.uv_executable(), "pip", "install", "--dry-run", "--no-config", "--target",
                             str(tmp_path / "t"), "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
                             "--index-url", f"{PYPI}/simple", "-r", str(pylock)],
                            capture_output=True, text=True, env=locking_environment())
    assert result.returncode == 0, result.stderr
    assert f"Would install {len(tomllib.loads(pylock.read_text())['packages'])} packages" in result.stderr


@pytest.mark.network
@pytest.mark.parametrize("name", ["torch", "cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"])
def test_locked_sha256_is_the_index_files(name):
    """The sha256 of a locked wheel is the one PyPI's JSON API gives for that file."""
    with urllib.request.urlopen(f"{PYPI}/pypi/{name}/json", timeout=120) as response:
        releases = json.load(response)["releases"]
    files = {f["filename"]: f["digests"]["sha256"] for release in releases.values() for f in release}
    for line in ("py-cu130", "py-cu132"):
        package = next(p for p in read_lock(lock_path(line, ROOT / "locks")).packages if p.name == name)
        assert files[package.filename] == package.sha256

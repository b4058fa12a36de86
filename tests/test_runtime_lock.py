"""Runtime locks (issue 35 item 3): `toolkit lock LINE --runtime --index URL` and `toolkit install LINE --runtime`.

Offline: the pypi line py-cu130 is locked against a loopback stand-in of its index (tiny real wheels with the real
names: torch 2.14.1 requiring the CUDA runtime components, cuda-toolkit 13.0.3 and the components its release pins,
the build's dependencies), never the multi-GB torch. Its flash-attn is the fixture project compiled by the real nvcc
(tests/fixtures/fa_fixture, named flash-attn, requiring torch and einops like flash-attn's wheel), placed in the
wheelhouse with a build record of py-cu130 and its lock, published with `toolkit publish` and served on 127.0.0.1.
Expected values come from hashlib, the served files, the build lock's pylock and the knowledge YAML.

FA4's pins (a line with a flash_attn_4 section): the FA4 lock is written from PyPI's recorded answers
(tests/fixtures/fa4_pypi); where bytes are installed, they are the real pinned wheels (.whl-fa4/all) served on
127.0.0.1 as a mirror serves them. torch and the CUDA wheels stay the stand-ins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conda_channel import build_simple_index, make_sdist, make_wheel, serve_directory
from test_cache import _key_pair, canonical_key, demo_record, serve, toolchain

from toolkit.build.wheelhouse import place
from toolkit.cli import main
from toolkit.knowledge.facts import load_knowledge
from toolkit.knowledge.files import KNOWLEDGE_DIR

pytestmark = pytest.mark.slow

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LINE = "py-cu130"
EARLIER = "2026-11-01T00:00:00Z"
LOCAL = "cu130torch2.14"
BUILD_ONLY = set(yaml.safe_load((KNOWLEDGE_DIR / "pypi_cuda.yaml").read_text())["runtime"]["build_only"])
ISOLATED = {"UV_CACHE_DIR", "PIP_CACHE_DIR"}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fixture_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/fa_fixture compiled by the real nvcc (sm_90 only, to be quick), named flash-attn."""
    from cuda_toolchain import CUDA_HOME, require_nvcc

    require_nvcc()
    source = tmp_path_factory.mktemp("fa-src") / "fa_fixture"
    shutil.copytree(ROOT / "tests" / "fixtures" / "fa_fixture", source)
    setup = source / "setup.py"
    text = setup.read_text()
    assert 'name="fa-fixture"' in text and 'packages=["fa_fixture"],' in text
    setup.write_text(text.replace('name="fa-fixture"', 'name="flash-attn"').replace(
        'packages=["fa_fixture"],', 'packages=["fa_fixture"], install_requires=["torch", "einops"],'))
    out = tmp_path_factory.mktemp("fa-dist")
    env = {**os.environ, "FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "90", "MAX_JOBS": "2",
           "CUDA_HOME": str(CUDA_HOME), "FLASH_ATTN_LOCAL_VERSION": LOCAL}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                           "--wheel-dir", str(out), str(source)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("flash_attn-*.whl")
    return wheel


def stand_in_index(root: Path, torch_requires: tuple[str, ...] = ()) -> None:
    """root/simple: what envs/py-cu130.yaml resolves to, as tiny wheels uploaded at EARLIER; torch requires the
    CUDA runtime and cuBLAS (as torch's cuda-toolkit[cudart,cublas,...] extras do), never nvcc, and
    `torch_requires` (typing-extensions 4.12.2 is there, as real torch requires typing-extensions)."""
    release = load_knowledge().pypi.release("13.0.3")
    assert release is not None
    dist = root / "dist"
    runtime = ("nvidia-cuda-runtime", "nvidia-cublas")
    files = [make_wheel(dist, "torch", "2.14.1", (*(f"{n}=={release.components[n]}" for n in runtime),
                                                  *torch_requires)),
             make_wheel(dist, "typing-extensions", "4.12.2"),
             make_sdist(dist, "flash-attn", "2.8.3.post2"),
             make_wheel(dist, "cuda-toolkit", "13.0.3", tuple(f"{n}=={v}" for n, v in release.components.items())),
             *(make_wheel(dist, name, version) for name, version in release.components.items()),
             *(make_wheel(dist, name, "1.0") for name in ("packaging", "psutil", "einops", "setuptools", "wheel",
                                                          "ninja"))]
    build_simple_index(root, files, {f.name: EARLIER for f in files})


@dataclass
class Project:
    root: Path
    index: str  # the published folder's URL (served on 127.0.0.1)
    published: Path  # that folder
    wheel: Path  # the fixture wheel as published (files/<line>/<wheel>)
    env: dict[str, str]

    def pylock(self) -> dict:
        return tomllib.loads((self.root / "locks" / f"pylock.{LINE}-runtime.toml").read_text())


def publish_build(root: Path, wheel: Path, dest: Path, lock_sha256: str, line: str = LINE, kind: str = "pypi") -> Path:
    """The wheel placed in root's wheelhouse with a build record of `line` from the lock of `lock_sha256`, and
    published to dest: the published copy."""
    inputs = {"recipe": 2, "line": line, "spec_input_hash": "0" * 64, "lock_sha256": lock_sha256, "archs": ["90"],
              "toolchain": toolchain(kind=kind), "local_version": f"+{LOCAL}"}
    record = demo_record(wheel, inputs)
    version = wheel.name.split("-")[1]
    record = dataclasses.replace(record, inputs_key=canonical_key(inputs),
                                 outputs=dataclasses.replace(record.outputs, version=version))
    place(wheel, root / "wheelhouse" / line, record)
    assert main(["publish", line, "--to", str(dest)]) == 0
    return dest / "files" / line / wheel.name


def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *lines: str) -> Path:
    """tmp_path/checkout with envs/base.yaml and these lines' specs from the repo, the working directory, with its
    own uv, pip, toolkit and XDG caches under tmp_path."""
    root = tmp_path / "checkout"
    (root / "envs").mkdir(parents=True)
    for name in ("base", *lines):
        shutil.copy(ROOT / "envs" / f"{name}.yaml", root / "envs")
    monkeypatch.chdir(root)
    for key, value in {"UV_CACHE_DIR": tmp_path / "uv-cache", "PIP_CACHE_DIR": tmp_path / "pip-cache",
                       "TOOLKIT_CACHE": root / ".cache", "XDG_CACHE_HOME": tmp_path / "xdg"}.items():
        monkeypatch.setenv(key, str(value))
    return root


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture_wheel: Path) -> Iterator[Project]:
    """A checkout with envs/ (base, py-cu130 pointing at the stand-in index), its build lock, and the fixture wheel
    published from the line's wheelhouse; both indexes served while the test runs."""
    root = checkout(tmp_path, monkeypatch, LINE)
    env = {key: os.environ[key] for key in ("UV_CACHE_DIR", "PIP_CACHE_DIR")}  # for the installers the tests run
    stand_in_index(tmp_path / "stand-in")
    with serve_directory(tmp_path / "stand-in") as pypi, serve(tmp_path / "published") as (url, _):
        spec = root / "envs" / f"{LINE}.yaml"
        spec.write_text(spec.read_text().replace("index: https://pypi.org/simple", f"index: {pypi}/simple"))
        assert main(["lock", LINE, "--pypi", f"{pypi}/simple"]) == 0
        lock_sha256 = sha256_of(root / "locks" / f"{LINE}.conda-lock.yml")
        wheel = publish_build(root, fixture_wheel, tmp_path / "published", lock_sha256)
        yield Project(root, url, tmp_path / "published", wheel, env)


def runtime_lock(project: Project) -> int:
    return main(["lock", LINE, "--runtime", "--index", project.index])


def test_the_runtime_lock_is_torch_and_the_published_wheel_from_the_build_lock_without_build_only_packages(
        project, capsys):
    assert runtime_lock(project) == 0
    packages = {p["name"]: p for p in project.pylock()["packages"]}
    (published,) = packages["flash-attn"]["wheels"]
    assert published["url"].rsplit("/", 1)[-1].replace("%2B", "+") == project.wheel.name
    assert published["url"].startswith(f"{project.index}/files/{LINE}/")
    assert published["hashes"]["sha256"] == sha256_of(project.wheel)

    build = {p["name"]: p for p in tomllib.loads((project.root / "locks" / f"pylock.{LINE}.toml").read_text())
             ["packages"]}
    assert set(packages) == {"flash-attn", "torch", "einops", "nvidia-cuda-runtime", "nvidia-cublas"}
    for name, package in packages.items():
        if name != "flash-attn":
            assert package["version"] == build[name]["version"]
            assert package["wheels"][0]["hashes"] == build[name]["wheels"][0]["hashes"]
            assert package["wheels"][0]["url"] == build[name]["wheels"][0]["url"]
    assert not BUILD_ONLY & set(packages) and BUILD_ONLY & set(build) >= {"nvidia-cuda-nvcc", "ninja", "psutil"}

    from conda_lock.lockfile import parse_conda_lock_file

    conda = parse_conda_lock_file(project.root / "locks" / f"{LINE}.runtime.conda-lock.yml")
    assert {(p.name, p.url, p.hash.sha256) for p in conda.package} == {
        (name, p["wheels"][0]["url"], p["wheels"][0]["hashes"]["sha256"]) for name, p in packages.items()}
    custom = conda.metadata.custom_metadata or {}
    assert custom["fa-envkit.build-lock-sha256"] == sha256_of(project.root / "locks" / f"{LINE}.conda-lock.yml")
    assert custom["fa-envkit.pylock-sha256"] == sha256_of(project.root / "locks" / f"pylock.{LINE}-runtime.toml")


def fixture_imports(python: Path) -> str:
    """What the installed flash-attn (the fixture) says: its distribution version and that its CUDA module loads."""
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m, fa_fixture; "
                           "print(m.version('flash-attn'), bool(fa_fixture.kernels))"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_toolkit_install_uv_and_pip_install_the_runtime_pylock(project, tmp_path):
    assert runtime_lock(project) == 0
    version = project.wheel.name.split("-")[1]
    prefix = tmp_path / "runtime-env"
    assert main(["install", LINE, "--runtime", "--prefix", str(prefix)]) == 0
    assert fixture_imports(prefix / "bin" / "python") == f"{version} True"
    installed = subprocess.run([str(prefix / "bin" / "python"), "-c", "import importlib.metadata as m; "
                                "print(sorted(d.metadata['Name'] for d in m.distributions()))"],
                               capture_output=True, text=True, check=True).stdout
    assert "nvidia-cuda-nvcc" not in installed and "torch" in installed
    assert main(["install", LINE, "--runtime", "--prefix", str(prefix)]) == 0  # again: synced in place

    pylock = project.root / "locks" / f"pylock.{LINE}-runtime.toml"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_NO_CONFIG": "1"}
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(tmp_path / "uv-env")], check=True, env=env)
    done = subprocess.run([str(uv), "pip", "sync", "--python", str(tmp_path / "uv-env" / "bin" / "python"),
                           str(pylock)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert fixture_imports(tmp_path / "uv-env" / "bin" / "python") == f"{version} True"

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "pip-env")], check=True)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(tmp_path / "pip-env" / "bin" / "python"),
                           "install", "-r", str(pylock)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert fixture_imports(tmp_path / "pip-env" / "bin" / "python") == f"{version} True"


def test_a_tampered_served_wheel_is_refused_by_its_hash(project, tmp_path, capsys):
    assert runtime_lock(project) == 0
    project.wheel.write_bytes(project.wheel.read_bytes() + b"\0")
    prefix = tmp_path / "runtime-env"
    assert main(["install", LINE, "--runtime", "--prefix", str(prefix)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: uv pip sync failed:") and "hash" in line.lower(), line
    assert not list(prefix.glob("lib/python*/site-packages/fa_fixture"))
    pylock = project.root / "locks" / f"pylock.{LINE}-runtime.toml"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "pip-env")], check=True)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(tmp_path / "pip-env" / "bin" / "python"),
                           "install", "-r", str(pylock)], capture_output=True, text=True,
                          env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert done.returncode != 0 and "hash" in done.stderr.lower(), done.stderr


def test_no_published_build_of_the_current_lock_is_refused_in_one_line(project, capsys):
    lock = project.root / "locks" / f"{LINE}.conda-lock.yml"
    lock.write_text(lock.read_text() + "# another lock: its sha256 differs from the published build's\n")
    assert runtime_lock(project) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: no published build of {LINE} for its current lock at {project.index}: toolkit publish "
                    f"{LINE} --to DIR on the machine that built it")
    assert not (project.root / "locks" / f"pylock.{LINE}-runtime.toml").exists()


def test_an_edited_runtime_pylock_or_a_shell_special_prefix_is_refused_in_one_line(project, tmp_path, capsys):
    assert runtime_lock(project) == 0
    capsys.readouterr()
    assert main(["install", LINE, "--runtime", "--prefix", str(tmp_path / "a;b")]) == 1
    assert "--prefix: " in capsys.readouterr().err and not (tmp_path / "a;b").exists()
    pylock = project.root / "locks" / f"pylock.{LINE}-runtime.toml"
    pylock.write_text(pylock.read_text().replace('name = "einops"', 'name = "einops2"'))
    assert main(["install", LINE, "--runtime", "--prefix", str(tmp_path / "env")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"locks/pylock.{LINE}-runtime.toml: missing or not the pylock written with" in line
    assert not (tmp_path / "env").exists()


@pytest.mark.parametrize("entry", ["missing", "signed by another key"])
def test_a_published_wheel_the_index_does_not_vouch_for_is_refused_in_one_line(project, tmp_path, monkeypatch,
                                                                                capsys, entry):
    """The page and the record beside the wheel are not the publisher's word, the table entry is: a runtime lock
    takes no wheel whose entry is missing, nor one signed by another key than the cache's configured one; signed
    by that key, the same wheel is locked."""
    (key,) = [path.stem for path in (project.published / "inputs").glob("*.json")]
    record = project.published / "files" / LINE / f"{project.wheel.name}.build.json"
    assert canonical_key(json.loads(record.read_text())["inputs"]) == key
    table_entry = project.published / "inputs" / f"{key}.json"
    if entry == "missing":
        table_entry.unlink()
        says = f"{project.index}/inputs/{key}.json: no table entry for {project.wheel.name}'s inputs"
    else:
        trusted = _key_pair(tmp_path / "trusted.pem")
        stranger = _key_pair(tmp_path / "stranger.pem")
        (tmp_path / "caches.toml").write_text(f'[[cache]]\nurl = "{project.index}"\npublic_key = "{trusted}"\n')
        monkeypatch.setenv("FA_ENVKIT_CACHES", str(tmp_path / "caches.toml"))

        def signed_by(pem: Path) -> None:
            """The entry as `toolkit publish --sign-key pem` writes it, copied over the served one."""
            folder = tmp_path / f"signed-{pem.stem}"
            assert main(["publish", LINE, "--to", str(folder), "--sign-key", str(pem)]) == 0
            shutil.copy(folder / "inputs" / f"{key}.json", table_entry)

        signed_by(tmp_path / "stranger.pem")
        says = (f"{project.index}/inputs/{key}.json: signed by key {stranger}, not by this cache's configured key "
                f"{trusted} (refused; no runtime lock was written)")
    capsys.readouterr()
    assert runtime_lock(project) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line, line
    assert not (project.root / "locks" / f"pylock.{LINE}-runtime.toml").exists()
    assert not (project.root / "locks" / f"{LINE}.runtime.conda-lock.yml").exists()
    if entry != "missing":
        signed_by(tmp_path / "trusted.pem")
        assert runtime_lock(project) == 0
        (published,) = {p["name"]: p for p in project.pylock()["packages"]}["flash-attn"]["wheels"]
        assert published["hashes"]["sha256"] == sha256_of(project.wheel)


# ---------------------------------------------------------------- a conda line (toolchain kind locked)

CONDA_LINE = "cu130"
CONDA_SPEC = """extends: base
cuda: "13.0"
python: "3.11"
gcc: 14
platforms: [linux-64]
channels: [{channel}]
torch: {{version: "2.14.1", index: "{index}/simple"}}
archs: ["90"]
"""
CONDA_BUILD_ONLY = yaml.safe_load((KNOWLEDGE_DIR / "conda_forge_nvcc.yaml").read_text())["runtime"]["build_only"]


def conda_build_only(platform: str) -> set[str]:
    return {name.replace("{platform}", platform) for name in CONDA_BUILD_ONLY}


def test_every_conda_build_only_name_is_a_published_conda_forge_record():
    """Each name of conda_forge_nvcc.yaml runtime.build_only is a package conda-forge publishes, on each platform
    (the replica's records: real published ones and the recipe-derived -dev outputs and ninja)."""
    from conda_forge_replica.replica import load_records

    names = {(record["name"], record["subdir"]) for record in load_records()}
    for platform in ("linux-64", "linux-aarch64"):
        for name in conda_build_only(platform):
            assert (name, platform) in names or (name, "noarch") in names, (name, platform)


@pytest.fixture(scope="module")
def replica_records_channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conda-forge's real records of linux-64 and noarch (tests/conda_forge_replica), without payload but python's
    (its wrapper runs $FIXTURE_PYTHON, so the pip layer installs for real)."""
    from conda_channel import build_channel
    from conda_forge_replica.replica import PayloadRoots, channel_folder, packages, wrapper

    chosen = []
    for package in packages(PayloadRoots(), with_payload=False):
        if package.subdir not in ("linux-64", "noarch"):
            continue
        if package.name == "python":
            minor = ".".join(package.version.split(".")[:2])
            package = dataclasses.replace(package, files={"bin/python": wrapper("python"),
                                                          f"bin/python{minor}": wrapper("python")})
        chosen.append(package)
    return build_channel(tmp_path_factory.mktemp("replica") / channel_folder("conda-forge"), chosen)


@dataclass
class CondaProject:
    root: Path
    index: str
    wheel: Path

    def runtime_lock(self) -> Path:
        return self.root / "locks" / f"{CONDA_LINE}.runtime.conda-lock.yml"

    def build_lock(self) -> Path:
        return self.root / "locks" / f"{CONDA_LINE}.conda-lock.yml"


@pytest.fixture
def conda_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture_wheel: Path,
                  replica_records_channel: Path) -> Iterator[CondaProject]:
    """A CUDA 13.0 conda line locked (py-rattler) against conda-forge's records and a loopback stand-in of its
    torch index (torch requiring filelock; base.yaml's build requirements), its fixture wheel published."""
    root = checkout(tmp_path, monkeypatch)
    monkeypatch.setenv("FIXTURE_PYTHON", sys.executable)
    dist = tmp_path / "stand-in" / "dist"
    files = [make_wheel(dist, "torch", "2.14.1", ("filelock",)), make_sdist(dist, "flash-attn", "2.8.3.post2"),
             *(make_wheel(dist, name, "1.0") for name in ("filelock", "packaging", "psutil", "einops", "setuptools",
                                                          "wheel"))]
    build_simple_index(tmp_path / "stand-in", files)
    with serve_directory(tmp_path / "stand-in") as pypi, serve(tmp_path / "published") as (url, _):
        (root / "envs" / f"{CONDA_LINE}.yaml").write_text(CONDA_SPEC.format(channel=replica_records_channel.as_uri(),
                                                                             index=pypi))
        assert main(["lock", CONDA_LINE, "--engine", "rattler", "--pypi", f"{pypi}/simple"]) == 0
        lock_sha256 = sha256_of(root / "locks" / f"{CONDA_LINE}.conda-lock.yml")
        wheel = publish_build(root, fixture_wheel, tmp_path / "published", lock_sha256, CONDA_LINE, "locked")
        yield CondaProject(root, url, wheel)


def test_a_conda_lines_runtime_lock_is_its_build_locks_records_without_build_only_packages(conda_project):
    assert main(["lock", CONDA_LINE, "--runtime", "--index", conda_project.index]) == 0
    build = yaml.safe_load(conda_project.build_lock().read_text())["package"]
    runtime = yaml.safe_load(conda_project.runtime_lock().read_text())["package"]
    build_conda = {p["name"]: p for p in build if p["manager"] == "conda"}
    runtime_conda = {p["name"]: p for p in runtime if p["manager"] == "conda"}
    removed = conda_build_only("linux-64")
    assert {"cuda-nvcc", "cuda-nvcc-impl", "cuda-cudart-dev", "gxx_linux-64", "gcc_impl_linux-64", "ninja",
            "sysroot_linux-64", "libcublas-dev"} <= set(build_conda) & removed
    assert set(runtime_conda) == set(build_conda) - removed
    assert {"python", "cuda-version", "cuda-cudart", "libcublas", "libstdcxx", "pip"} <= set(runtime_conda)
    for name, entry in runtime_conda.items():  # the build lock's record exactly, less dependencies on what left
        locked = build_conda[name]
        assert (entry["url"], entry["hash"], entry["version"]) == (locked["url"], locked["hash"], locked["version"])
        assert entry["dependencies"] == locked["dependencies"]
        assert set(entry["dependencies"]) <= set(runtime_conda) | {d for d in entry["dependencies"] if d[:2] == "__"}
    # A build-only package a kept one depends on stays (no such edge in these records: libgcc and _openmp_mutex are
    # named build-only here, hypothetically, and the real libstdcxx -> libgcc -> _openmp_mutex edges keep them).
    from conda_lock.lockfile import parse_conda_lock_file

    from toolkit.cache.runtime_lock import runtime_conda_names

    assert "libgcc" in build_conda["libstdcxx"]["dependencies"]
    assert "_openmp_mutex" in build_conda["libgcc"]["dependencies"]
    records = [p for p in parse_conda_lock_file(conda_project.build_lock()).package if p.manager == "conda"]
    marked = dict.fromkeys([*removed, "libgcc", "_openmp_mutex"], "build-only")
    assert {"libstdcxx", "libgcc", "_openmp_mutex"} <= runtime_conda_names(records, marked)
    assert runtime_conda_names(records, dict.fromkeys(removed, "build-only")) == set(runtime_conda)

    pip = {p["name"]: p for p in runtime if p["manager"] == "pip"}
    build_pip = {p["name"]: p for p in build if p["manager"] == "pip"}
    assert set(pip) == {"flash-attn", "torch", "filelock", "einops"}  # not psutil, wheel, packaging, setuptools
    assert pip["flash-attn"]["hash"]["sha256"] == sha256_of(conda_project.wheel)
    assert pip["flash-attn"]["url"].endswith(f"/files/{CONDA_LINE}/{conda_project.wheel.name.replace('+', '%2B')}")
    for name in ("torch", "filelock", "einops"):
        assert (pip[name]["url"], pip[name]["hash"]) == (build_pip[name]["url"], build_pip[name]["hash"])

    # conda-lock's own parser and renderer: the explicit file `conda-lock install` hands micromamba
    from conda_lock.conda_lock import render_lockfile_for_platform
    from conda_lock.lockfile import parse_conda_lock_file

    parsed = parse_conda_lock_file(conda_project.runtime_lock())
    explicit = render_lockfile_for_platform(lockfile=parsed, kind="explicit", platform="linux-64",
                                            include_dev_dependencies=False, extras=None,
                                            suppress_warning_for_pip_and_explicit=True)
    urls = {line.split("#")[0] for line in explicit if line.startswith("file:")}
    assert urls == {p["url"] for p in runtime_conda.values()}
    assert sum(line.startswith("# pip ") for line in explicit) == len(pip)


def test_toolkit_install_runtime_installs_a_conda_lines_runtime_lock_and_refuses_an_edited_one(conda_project,
                                                                                                tmp_path, capsys):
    assert main(["lock", CONDA_LINE, "--runtime", "--index", conda_project.index]) == 0
    prefix = tmp_path / "runtime-env"
    assert main(["install", CONDA_LINE, "--runtime", "--engine", "rattler", "--prefix", str(prefix)]) == 0
    runtime = yaml.safe_load(conda_project.runtime_lock().read_text())["package"]
    installed = {json.loads(p.read_text())["name"] for p in (prefix / "conda-meta").glob("*.json")}
    assert installed == {p["name"] for p in runtime if p["manager"] == "conda"}
    assert not installed & conda_build_only("linux-64")
    site = prefix / "lib" / "python3.11" / "site-packages"
    done = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, fa_fixture, einops; "
                           "print(m.version('flash-attn'), bool(fa_fixture.kernels))"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [conda_project.wheel.name.split("-")[1], "True"]

    lock = conda_project.runtime_lock()
    text = lock.read_text()
    (entry,) = [p for p in runtime if p["name"] == "cuda-cudart"]
    lock.write_text(text.replace(entry["hash"]["sha256"], "0" * 64))
    capsys.readouterr()
    assert main(["install", CONDA_LINE, "--runtime", "--engine", "rattler", "--prefix", str(tmp_path / "b")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: locks/{CONDA_LINE}.runtime.conda-lock.yml: edited after locking (contents do not match "
                    f"fa-envkit.lock-sha256; toolkit lock {CONDA_LINE} --runtime --index URL)")
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------- FA4's pins (a pypi line with a flash_attn_4 section)

FA4_LINE = "py-cu130-fa4"
FA4_SPEC = """extends: py-cu130
description: CUDA 13.0 from PyPI wheels, flash-attn-4 instead of flash-attn 2.x
python: "3.12"
archs: ["90"]
flash_attn_4: {version: "4.0.0b40", with_flash_attn_2: false}
"""
FA4_PYPI = ROOT / "tests" / "fixtures" / "fa4_pypi"  # PyPI's PEP 691 answers, recorded (tests/test_fa4.py)
FA4_WHEELS = ROOT / ".whl-fa4" / "all"  # the real pinned wheels (scripts/fetch_fa4_wheels.sh; .ci/run fetches them)
TORCH_TYPING = "typing-extensions==4.12.2"  # the stand-in torch requires it: FA4's if_missing pin gives way


def fa4_pins() -> dict[str, dict]:
    """knowledge/flash_attn_4.yaml's wheels of 4.0.0b40 for CUDA 13, read as YAML (not through the toolkit)."""
    wheels = yaml.safe_load((KNOWLEDGE_DIR / "flash_attn_4.yaml").read_text())["releases"]["4.0.0b40"]["wheels"]
    return {w["name"]: w for w in wheels if str(w.get("cuda", "13")) == "13"}


def recorded_pypi(mirror: str | None = None) -> Callable[[str], list[dict]]:
    """PyPI's recorded answer per project; with `mirror`, as a mirror serving the same files there answers."""
    def files(project: str) -> list[dict]:
        found = json.loads((FA4_PYPI / f"{project}.json").read_text())["files"]
        return [{**f, "url": f"{mirror}/{f['filename']}"} if mirror else f for f in found]
    return files


@dataclass
class Fa4Project:
    root: Path
    fa4_lock: Path
    files: Callable[[str], list[dict]]  # the FA4 lock's index answers

    def pylock(self) -> dict:
        return tomllib.loads((self.root / "locks" / f"pylock.{FA4_LINE}-runtime.toml").read_text())


@contextlib.contextmanager
def fa4_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mirror: str | None) -> Iterator[Fa4Project]:
    """A checkout with py-cu130 and FA4_LINE (CUDA 13.0, python 3.12, FA4 instead of FA2: it builds no wheel) locked
    against the stand-in index, and its FA4 lock written from PyPI's recorded answers (`mirror`: served there)."""
    from toolkit.base.workspace import Workspace
    from toolkit.env.fa4_lock import write_fa4_lock
    from toolkit.spec.envspec import load_spec

    root = checkout(tmp_path, monkeypatch, LINE)
    (root / "envs" / f"{FA4_LINE}.yaml").write_text(FA4_SPEC)
    stand_in_index(tmp_path / "stand-in", (TORCH_TYPING,))
    with serve_directory(tmp_path / "stand-in") as pypi:
        spec = root / "envs" / f"{LINE}.yaml"
        spec.write_text(spec.read_text().replace("index: https://pypi.org/simple", f"index: {pypi}/simple"))
        assert main(["lock", FA4_LINE, "--pypi", f"{pypi}/simple"]) == 0
        files = recorded_pypi(mirror)
        fa4_lock = write_fa4_lock(load_spec(root / "envs" / f"{FA4_LINE}.yaml"), files, Workspace())
        yield Fa4Project(root, root / fa4_lock, files)


def test_a_fa4_lines_runtime_lock_carries_fa4s_pinned_wheels_by_url_and_sha256(tmp_path, monkeypatch, capsys):
    """The line builds no wheel, so no index is named or read: its runtime lock is torch (the build lock's) and
    FA4's pins, each by the URL PyPI answered (recorded) and the knowledge's sha256; the if_missing pins the build
    lock holds (einops, typing-extensions) give way to its files; libs-cu12, which libs-cu13 replaces, is
    nowhere."""
    with fa4_checkout(tmp_path, monkeypatch, None) as project:
        assert main(["lock", FA4_LINE, "--runtime"]) == 0
        packages = {p["name"]: p for p in project.pylock()["packages"]}
        build = {p["name"]: p for p in
                 tomllib.loads((project.root / "locks" / f"pylock.{FA4_LINE}.toml").read_text())["packages"]}
        pins = fa4_pins()
        assert set(packages) == {"torch", "nvidia-cuda-runtime", "nvidia-cublas", *pins}
        assert "nvidia-cutlass-dsl-libs-cu12" not in packages and "flash-attn" not in packages
        given_way = {name for name, pin in pins.items() if pin.get("if_missing") and name in build}
        assert given_way == {"einops", "typing-extensions"}  # base.yaml's build requirement; the stand-in torch's
        for name, pin in pins.items():
            (wheel,) = packages[name]["wheels"]
            if name in given_way:  # the line's environment has it: the build lock's file, not FA4's pin
                assert packages[name]["version"] == build[name]["version"] != str(pin["version"])
                assert (wheel["url"], wheel["hashes"]) == (build[name]["wheels"][0]["url"],
                                                          build[name]["wheels"][0]["hashes"])
                continue
            (answer,) = [f for f in project.files(name) if f["filename"] == pin["file"]]
            assert packages[name]["version"] == str(pin["version"])
            assert (wheel["url"], wheel["hashes"]["sha256"], wheel["size"]) == (answer["url"], pin["sha256"],
                                                                                 pin["size"])
            assert wheel["url"].startswith("https://files.pythonhosted.org/") and wheel["name"] == pin["file"]
        for name in ("torch", "nvidia-cuda-runtime", "nvidia-cublas"):
            assert packages[name]["wheels"][0]["hashes"] == build[name]["wheels"][0]["hashes"]

        from conda_lock.lockfile import parse_conda_lock_file

        runtime = project.root / "locks" / f"{FA4_LINE}.runtime.conda-lock.yml"
        conda = parse_conda_lock_file(runtime)
        assert {(p.name, p.version, p.url, p.hash.sha256) for p in conda.package} == {
            (name, p["version"], p["wheels"][0]["url"], p["wheels"][0]["hashes"]["sha256"])
            for name, p in packages.items()}
        custom = conda.metadata.custom_metadata or {}
        assert custom["fa-envkit.fa4-lock-sha256"] == sha256_of(project.fa4_lock)
        assert not [key for key in custom if key.startswith("fa-envkit.published.")]
        assert f"pip install --no-deps -r pylock.{FA4_LINE}-runtime.toml" in runtime.read_text()
        out = capsys.readouterr().out
        assert f"published: none, the line builds no wheel; flash-attn-4 4.0.0b40 pinned by locks/{FA4_LINE}" in out


def fa4_installed(python: Path) -> dict[str, str]:
    """The distributions a python has (name -> version) and FA4's interface.py as installed."""
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m, json, sys; "
                           "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version "
                           "for d in m.distributions()}))"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_toolkit_install_uv_and_pip_install_fa4s_pins_from_the_runtime_pylock(tmp_path, monkeypatch):
    """The real pinned wheels (scripts/fetch_fa4_wheels.sh) served on 127.0.0.1 as a PyPI mirror serves them (same
    files, same sha256, the mirror's URLs): `toolkit install --runtime`, `uv pip sync` and `pip install --no-deps
    -r` install exactly the lock's versions into a Python 3.12 venv, FA4's files the wheel's bytes. torch and the
    CUDA wheels are the stand-ins, so nothing imports torch here."""
    import zipfile

    from conftest import missing
    from test_fa4 import PY312

    if not FA4_WHEELS.is_dir():
        missing(f"needs {FA4_WHEELS}: run scripts/fetch_fa4_wheels.sh first", "FA_REQUIRE_FA4_WHEELS")
    if PY312 is None:
        missing("FA4's pinned wheels are cp312 and this machine has no Python 3.12", "FA_REQUIRE_PYTHON312")
    with serve_directory(FA4_WHEELS) as mirror, fa4_checkout(tmp_path, monkeypatch, mirror) as project:
        assert main(["lock", FA4_LINE, "--runtime"]) == 0
        expected = {p["name"]: p["version"] for p in project.pylock()["packages"]}
        assert {name: str(pin["version"]) for name, pin in fa4_pins().items() if not pin.get("if_missing")}.items() \
            <= expected.items()
        with zipfile.ZipFile(FA4_WHEELS / fa4_pins()["flash-attn-4"]["file"]) as wheel:
            interface = wheel.read("flash_attn/cute/interface.py")

        def check(python: Path) -> None:
            assert fa4_installed(python) == expected
            site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            assert (Path(site) / "flash_attn" / "cute" / "interface.py").read_bytes() == interface

        prefix = tmp_path / "runtime-env"
        assert main(["install", FA4_LINE, "--runtime", "--python", PY312, "--prefix", str(prefix)]) == 0
        check(prefix / "bin" / "python")

        pylock = project.root / "locks" / f"pylock.{FA4_LINE}-runtime.toml"
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_NO_CONFIG": "1"}
        uv = Path(sys.executable).parent / "uv"
        subprocess.run([str(uv), "venv", "-q", "--python", PY312, str(tmp_path / "uv-env")], check=True, env=env)
        done = subprocess.run([str(uv), "pip", "sync", "--python", str(tmp_path / "uv-env" / "bin" / "python"),
                               str(pylock)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        check(tmp_path / "uv-env" / "bin" / "python")

        subprocess.run([PY312, "-m", "venv", "--without-pip", str(tmp_path / "pip-env")], check=True)
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(tmp_path / "pip-env" / "bin" / "python"),
                               "install", "--no-deps", "-r", str(pylock)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        check(tmp_path / "pip-env" / "bin" / "python")


@pytest.mark.parametrize("fa4_lock", ["missing", "another release", "edited", "a file URL, digest recomputed"])
def test_a_missing_stale_or_edited_fa4_lock_is_refused_in_one_line(tmp_path, monkeypatch, capsys, fa4_lock):
    """Nothing is written; a lock whose digest was recomputed (a checksum, not a signature) over a URL that is no
    http(s) URL of the pinned file is refused too: an installer would fetch what the URL names."""
    with fa4_checkout(tmp_path, monkeypatch, None) as project:
        where = f"locks/{FA4_LINE}.fa4-lock.json"
        if fa4_lock == "missing":
            project.fa4_lock.unlink()
            says = f"error: {where}: unreadable FA4 lock (file not found; run `toolkit fa4 lock LINE`)"
        elif fa4_lock == "another release":
            spec = project.root / "envs" / f"{FA4_LINE}.yaml"
            spec.write_text(spec.read_text().replace('"4.0.0b40"', '"4.0.0b36"'))
            says = (f"error: {where}: pins flash-attn-4 4.0.0b40 of line {FA4_LINE} for CUDA 13, python 3.12; "
                    f"envs/{FA4_LINE}.yaml asks 4.0.0b36 for CUDA 13, python 3.12 (run `toolkit fa4 lock {FA4_LINE}`; "
                    f"no runtime lock was written)")
        elif fa4_lock == "edited":
            project.fa4_lock.write_text(project.fa4_lock.read_text().replace("files.pythonhosted.org",
                                                                              "files.example.org"))
            says = f"error: {where}: edited after it was written (digest mismatch): run `toolkit fa4 lock` again"
        else:
            data = json.loads(project.fa4_lock.read_text())
            file = data["wheels"][0]["file"]
            data["wheels"][0]["url"] = f"file:///tmp/{file}"
            body = {key: value for key, value in data.items() if key != "digest"}
            data["digest"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            project.fa4_lock.write_text(json.dumps(data))
            says = (f"error: {where}: {file}'s URL 'file:///tmp/{file}' is not an http(s) URL of that file (run "
                    f"`toolkit fa4 lock LINE` again)")
        capsys.readouterr()
        assert main(["lock", FA4_LINE, "--runtime"]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == says
        assert not list((project.root / "locks").glob("*runtime*"))


def test_a_conda_fa4_lines_runtime_lock_carries_the_same_fa4_files_as_its_build_lock(
        tmp_path, monkeypatch, replica_records_channel):
    """A conda line (python 3.12 from conda-forge's records, FA4 instead of FA2, so no wheel and no index): its build
    lock's pip layer holds FA4's pins (`toolkit lock`), its runtime lock the conda layer less build-only packages
    and a pip layer of torch's closure, the build lock's einops (an if_missing pin the build lock holds) and the FA4
    lock's pins: each the build lock's own file. PyPI's answers are the recorded ones (no network in tests)."""
    from toolkit.base.workspace import Workspace
    from toolkit.env import fa4_lock
    from toolkit.spec.envspec import load_spec

    monkeypatch.setattr(fa4_lock, "pypi_files", recorded_pypi())
    root = checkout(tmp_path, monkeypatch)
    dist = tmp_path / "stand-in" / "dist"
    files = [make_wheel(dist, "torch", "2.14.1", ("filelock",)), make_sdist(dist, "flash-attn", "2.8.3.post2"),
             *(make_wheel(dist, name, "1.0") for name in ("filelock", "packaging", "psutil", "einops", "setuptools",
                                                          "wheel"))]
    build_simple_index(tmp_path / "stand-in", files)
    line = "cu130-fa4"
    with serve_directory(tmp_path / "stand-in") as pypi:
        spec = root / "envs" / f"{line}.yaml"
        spec.write_text(CONDA_SPEC.format(channel=replica_records_channel.as_uri(), index=pypi)
                        .replace('python: "3.11"', 'python: "3.12"')
                        + 'flash_attn_4: {version: "4.0.0b40", with_flash_attn_2: false}\n')
        assert main(["lock", line, "--engine", "rattler", "--pypi", f"{pypi}/simple"]) == 0
        fa4 = fa4_lock.write_fa4_lock(load_spec(spec), recorded_pypi(), Workspace())
        assert main(["lock", line, "--runtime"]) == 0
    build = yaml.safe_load((root / "locks" / f"{line}.conda-lock.yml").read_text())["package"]
    runtime_lock = root / "locks" / f"{line}.runtime.conda-lock.yml"
    runtime = yaml.safe_load(runtime_lock.read_text())
    build_pip = {p["name"]: p for p in build if p["manager"] == "pip"}
    pip = {p["name"]: p for p in runtime["package"] if p["manager"] == "pip"}
    pins = fa4_pins()
    assert set(pip) == {"torch", "filelock", *pins}  # not psutil, wheel, packaging, setuptools
    assert pip["einops"]["version"] == "1.0" != pins["einops"]["version"]
    for name, entry in pip.items():
        assert (entry["version"], entry["url"], entry["hash"]) == (
            build_pip[name]["version"], build_pip[name]["url"], build_pip[name]["hash"])
    for name, pin in pins.items():
        if name != "einops":
            assert pip[name]["hash"] == {"sha256": pin["sha256"]} and pip[name]["url"].endswith(pin["file"])
    conda = {p["name"] for p in runtime["package"] if p["manager"] == "conda"}
    assert "python" in conda and not conda & conda_build_only("linux-64")
    assert runtime["metadata"]["custom_metadata"]["fa-envkit.fa4-lock-sha256"] == sha256_of(root / fa4)

"""The pypi toolchain kind end to end on real downloads: `toolkit lock` (uv against PyPI), `toolkit install` (a
fresh venv, every wheel of the lock from PyPI, hash-checked), `toolkit build` of the fixture sdist with the
lock's own nvcc (NVIDIA's nvidia-cuda-nvcc 13.0.88 wheel) and the machine's gcc, then its import; and, in the same
venv, flash-attn's real flash_api.cpp and one of its kernels compiled against the locked torch 2.14.1's headers.

The line is envs/py-cu130.yaml (torch 2.14.1, cuda-toolkit 13.0.3), with archs ["90"] to keep the compile short;
the sdist the lock pins is the fixture's (tests/fixtures/fa_fixture), served from a loopback index. About 4 GB
is downloaded and 6 GB installed (torch 2.14.1 and its NVIDIA libraries): `network`, and CI (FA_REQUIRE_PYPI=1)
fails rather than skips when PyPI does not answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conda_channel import build_simple_index, serve_directory
from conftest import pypi_unreachable
from fixtures.fa_fixture_project import pack_fixture_sdist
from packaging.utils import canonicalize_name
from packaging.version import Version

from toolkit.env.install_record import PrefixRecord
from toolkit.env.lockfile import read_lock
from toolkit.knowledge.archs import ArchCoverage, compiled_entries, cubin_archs
from toolkit.machine.line_env import include_environment

ROOT = Path(__file__).resolve().parent.parent
LINE = "py-cu130"
PYTHON = "3.11"  # the spec's
pytestmark = [pytest.mark.network, pytest.mark.slow]


@dataclass
class Installed:
    project: Path
    prefix: Path
    install_s: float
    install_bytes: int
    installed: subprocess.CompletedProcess


def toolkit(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(project / ".cache"), "PYTHONPATH": str(ROOT)})


def require_pypi() -> None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/cuda-toolkit/", timeout=30).close()
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        pypi_unreachable(exc)
    if shutil.which(f"python{PYTHON}") is None:
        pytest.fail(f"python{PYTHON} not on PATH: envs/{LINE}.yaml's python, which `toolkit install` makes the venv with")


def tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """envs/py-cu130.yaml locked again against PyPI beside the committed lock, so as of the time it records (the
    fixture sdist pinned from a loopback index), installed."""
    require_pypi()
    project = tmp_path_factory.mktemp("pypi-line")
    (project / "envs").mkdir()
    (project / "locks").mkdir()
    for name in (f"{LINE}.conda-lock.yml", f"pylock.{LINE}.toml"):
        shutil.copy(ROOT / "locks" / name, project / "locks")
    shutil.copy(ROOT / "envs" / "base.yaml", project / "envs")
    spec = yaml.safe_load((ROOT / "envs" / f"{LINE}.yaml").read_text())
    (project / "envs" / f"{LINE}.yaml").write_text(yaml.safe_dump({**spec, "archs": ["90"]}))
    sdist = pack_fixture_sdist(project / "sdist")
    build_simple_index(project / "index", [sdist])
    with serve_directory(project / "index") as url:
        locked = toolkit(project, "lock", LINE, "--pypi", f"{url}/simple")
        assert locked.returncode == 0 and "written" in locked.stdout, locked.stderr
        started = time.monotonic()
        done = toolkit(project, "install", LINE)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr + done.stdout
        prefix = project / ".envs" / LINE
        yield Installed(project, prefix, seconds, tree_bytes(prefix), done)


def cuda_home(prefix: Path) -> Path:
    return prefix / "lib" / f"python{PYTHON}" / "site-packages" / "nvidia" / "cu13"


def test_the_lock_is_the_committed_ones_wheels(installed):
    """Locked again here from PyPI (its archs edited), the line resolves to the wheels locks/py-cu130.conda-lock.yml
    pins, whatever PyPI released since: the re-lock resolves as of the time the committed lock records."""
    ours = read_lock(installed.project / "locks" / f"{LINE}.conda-lock.yml").packages
    committed = read_lock(ROOT / "locks" / f"{LINE}.conda-lock.yml").packages
    assert {(p.name, p.version, p.sha256) for p in ours} == {(p.name, p.version, p.sha256) for p in committed}


def test_install_makes_a_venv_with_every_locked_wheel_and_the_cuda_links(installed):
    prefix = installed.prefix
    print(f"\ninstall: {installed.install_s:.0f} s, {installed.install_bytes / 1e9:.2f} GB")  # the figures, with -s
    assert (prefix / "pyvenv.cfg").is_file() and f"{LINE}: environment of" in installed.installed.stdout
    lock = read_lock(installed.project / "locks" / f"{LINE}.conda-lock.yml")
    listed = subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    versions = {canonicalize_name(p["name"]): Version(p["version"]) for p in json.loads(listed)}
    assert [p.name for p in lock.packages if versions.get(p.name) != Version(p.version)] == []
    home = cuda_home(prefix)
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13" and os.readlink(home / "lib64") == "lib"
    assert "V13.0.88" in subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    record = PrefixRecord.read(prefix)
    assert record and record.prefix == str(prefix) and "pyvenv.cfg" in record.written
    assert str(prefix) in (prefix / "bin" / "activate").read_text()  # made in a temporary, then moved here
    assert (prefix / "bin" / "ninja").read_bytes()[:4] == b"\x7fELF" or \
        (prefix / "bin" / "ninja").read_text().startswith(f"#!{prefix}/bin/python")
    again = toolkit(installed.project, "install", LINE, "--if-stale")
    assert again.returncode == 0 and "already the environment" in again.stdout, again.stderr


def test_build_of_the_fixture_with_the_locked_nvcc_then_import(installed):
    started = time.monotonic()
    built = toolkit(installed.project, "build", LINE)
    seconds = time.monotonic() - started
    assert built.returncode == 0, built.stderr + built.stdout
    print(f"\nbuild: {seconds:.0f} s")
    record = json.loads(next((installed.project / "wheelhouse" / LINE).glob("*.build.json")).read_text())
    home = cuda_home(installed.prefix)
    assert record["inputs"]["toolchain"]["kind"] == "pypi"
    assert record["environment"]["CUDA_HOME"] == str(home)
    assert record["fingerprint"]["nvcc_path"] == str(home / "bin" / "nvcc")
    assert record["fingerprint"]["nvcc_version"] == "13.0.88"
    gcc = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout.strip()
    assert record["fingerprint"]["gcc_version"] == gcc  # the machine's, checked against this nvcc's header
    assert record["fingerprint"]["host_config_h"] == str(home / "include" / "crt" / "host_config.h")
    assert record["outputs"]["wheel"].startswith("fa_fixture-0.1.0+cu130torch2.14-")
    imported = subprocess.run([str(installed.prefix / "bin" / "python"), "-c",
                               "import fa_fixture_cuda as m; print(m.kernels(), m.cuda_runtime_version())"],
                              capture_output=True, text=True, cwd="/")
    assert imported.returncode == 0 and "scale_kernel" in imported.stdout and "130" in imported.stdout, imported.stderr


# ---------------------------------------------------------------- flash-attn's real sources with the venv's nvcc and torch

FA_NVCC_FLAGS = [  # flash-attn 2.8.3's setup.py nvcc_flags, -std as the cxx20 patch sets it for torch >= 2.13
    "-O3", "-std=c++20", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
    "--expt-extended-lambda", "--use_fast_math"]


@pytest.fixture(scope="module")
def flash_attn_compile(installed, tmp_path_factory):
    """The pinned sdist's sources and the include flags torch's cpp_extension gives them in the venv."""
    from test_replica import _flash_attn_source, _torch_include_flags

    src = _flash_attn_source(tmp_path_factory.mktemp("flash-attn"))
    home = cuda_home(installed.prefix)
    site = home.parent.parent
    include = subprocess.run([str(installed.prefix / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    flags = [*_torch_include_flags(str(site), home), f"-I{src}/csrc/flash_attn", f"-I{src}/csrc/flash_attn/src",
             f"-I{src}/csrc/cutlass/include", f"-I{include}", "-D_GLIBCXX_USE_CXX11_ABI=1"]
    env = {**{k: v for k, v in os.environ.items() if k not in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")},
           **include_environment(home), "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return src, home, flags, env


def test_flash_api_cpp_compiles_against_the_locked_torch_and_cuda_headers(flash_attn_compile):
    """g++ as torch's cpp_extension runs it on flash_api.cpp, with the build's CPATH: torch 2.14.1's headers
    and CUDA's (cuda_runtime.h, cublas_v2.h, cusparse.h) from the locked wheels in one nvidia/cu13 tree."""
    src, _, flags, env = flash_attn_compile
    done = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", *flags, f"{src}/csrc/flash_attn/flash_api.cpp"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


BLACKWELL_LINE_ARCHS = ("80", "100", "120")  # py-cu130's archs but 90 (compiled by the fixture build and on the H200)


def test_a_flash_attn_kernel_compiles_with_the_locked_nvcc(flash_attn_compile, tmp_path):
    """One real kernel of the pinned sdist (the forward pass, head dim 32, fp16) for sm_80 and Blackwell's sm_100
    and sm_120, with flash-attn's nvcc flags as its setup.py gives them (-gencode arch=compute_N,code=sm_N) and
    the cxx20 patch's -std=c++20, the locked nvcc 13.0.88 and the machine's gcc (a few minutes per arch). The
    build's arch check (ArchCoverage) finds exactly those cubins and nothing else in this real object, as
    NVIDIA's cuobjdump lists them where it is on PATH."""
    src, home, flags, env = flash_attn_compile
    kernel = f"{src}/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu"
    gencode = [arg for arch in BLACKWELL_LINE_ARCHS for arg in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
    started = time.monotonic()
    done = subprocess.run([str(home / "bin" / "nvcc"), "-c", *FA_NVCC_FLAGS, *gencode,
                           *flags, kernel, "-o", str(tmp_path / "k.o")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\nflash_fwd_hdim32_fp16_sm80.cu for sm_{', sm_'.join(BLACKWELL_LINE_ARCHS)}: "
          f"{time.monotonic() - started:.0f} s")
    coverage = ArchCoverage.of(BLACKWELL_LINE_ARCHS, compiled_entries(tmp_path / "k.o"))
    assert (coverage.missing, coverage.extra, coverage.ptx) == ([], [], ())
    assert cubin_archs(tmp_path / "k.o") == set(BLACKWELL_LINE_ARCHS)

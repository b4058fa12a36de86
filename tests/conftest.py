"""Fixtures several test modules share."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
# flash-attn 2.8.3.post2, the pinned sdist of every line (its URL and sha256 from PyPI's simple index page)
SDIST_URL = ("https://files.pythonhosted.org/packages/6c/b1/b77625e3d11260d2bd6a4fc249a4be9a3da97ff848e2222e810c4f0e0"
             "211/flash_attn-2.8.3.post2.tar.gz")
SDIST_SHA256 = "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"


def missing(reason: str, switch: str) -> NoReturn:
    """What a test needs is not on this machine: a skip, except where `switch`=1 (.ci/run sets it because it
    installs that component): there a failure, so that CI never passes by skipping what it set up."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{reason} and {switch}=1")
    pytest.skip(reason)


def pypi_unreachable(exc: BaseException) -> NoReturn:
    """No connection to PyPI: a skip, except in CI (FA_REQUIRE_PYPI=1), which reaches PyPI: there a failure."""
    missing(f"PyPI not reachable ({exc})", "FA_REQUIRE_PYPI")


@pytest.fixture(scope="session")
def pinned_sdist(tmp_path_factory) -> Path:
    """The real sdist, sha256-checked: the toolkit's own sdist cache of this checkout when it holds it,
    else downloaded from PyPI once per test session. An answer from PyPI that is not the file (a 404: the
    pin is wrong) fails; no connection at all skips, except in CI (FA_REQUIRE_PYPI=1), which reaches PyPI."""
    sdist = tmp_path_factory.mktemp("sdist") / "flash_attn-2.8.3.post2.tar.gz"
    cached = ROOT / ".cache" / "sdist" / SDIST_SHA256 / sdist.name
    if cached.is_file():
        shutil.copy(cached, sdist)
    else:
        try:
            with urllib.request.urlopen(SDIST_URL, timeout=120) as response:
                sdist.write_bytes(response.read())
        except urllib.error.HTTPError as exc:
            pytest.fail(f"{SDIST_URL}: PyPI answered {exc.code} {exc.reason}: the pinned URL is wrong")
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            pypi_unreachable(exc)
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == SDIST_SHA256
    return sdist


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`nvcc` tests: skipped without the CUDA toolkit of tests/cuda_toolchain.py, failed in CI (FA_REQUIRE_NVCC=1)."""
    if item.get_closest_marker("nvcc"):
        from cuda_toolchain import require_nvcc

        require_nvcc()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """`uv cache prune` of the toolkit's uv cache (Workspace.uv_cache: the user's, kept between runs). The tests'
    installs leave there every wheel they served from a loopback index or a temporary folder, under a new key each
    run since each run's ports and paths are new: 40,144 files, 11.9 GiB a run on this project's CI machine, whose
    disk once filled up and failed CI. uv's prune removes what no key reaches any more and keeps what PyPI's stable
    URLs hit again."""
    from toolkit.base.workspace import Workspace
    from toolkit.env.pypi_lock import uv_executable

    cache = Workspace().uv_cache
    if cache.is_dir():
        try:
            subprocess.run([uv_executable(), "cache", "prune", "--cache-dir", str(cache)], capture_output=True,
                           timeout=300, check=False)
        except subprocess.TimeoutExpired:  # another uv holds the cache: the next session prunes
            pass


@pytest.fixture(scope="session")
def slurm_cluster():
    """The single-node cluster tests/slurm_cluster.sh starts (test_scaleout, test_build's --slurm build);
    skipped with the reason when none answers (CI sets FA_REQUIRE_SLURM=1 so a missing cluster fails there
    instead)."""
    reason = None
    if shutil.which("sinfo") is None:
        reason = "sinfo not on PATH (apt-get install slurm-wlm; bash tests/slurm_cluster.sh start)"
    else:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        if done.returncode != 0 or not done.stdout.strip():
            last = (done.stderr.strip().splitlines() or ["no nodes"])[-1]
            reason = f"no Slurm cluster answers sinfo ({last}; set SLURM_CONF, bash tests/slurm_cluster.sh start)"
    if reason and os.environ.get("FA_REQUIRE_SLURM") == "1":
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)

"""The CUDA toolkit the nvcc tests compile with, in one place.

FA_CUDA_HOME names it (CI: the compiler wheels of locks/py-cu130.conda-lock.yml, which .ci/run installs with
tests/install_pypi_toolchain.py), else /usr/local/cuda. A test that needs it carries `@pytest.mark.nvcc` (or
calls require_nvcc() in a fixture): without an nvcc there it is skipped, except where FA_REQUIRE_NVCC=1 (CI),
where it fails.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import missing

CUDA_HOME = Path(os.environ.get("FA_CUDA_HOME") or "/usr/local/cuda")
NVCC = CUDA_HOME / "bin" / "nvcc"
HOST_CONFIG = CUDA_HOME / "include" / "crt" / "host_config.h"


def require_nvcc() -> None:
    """Skip (fail with FA_REQUIRE_NVCC=1) unless CUDA_HOME holds nvcc."""
    if not NVCC.exists():
        missing(f"needs nvcc at {NVCC} (set FA_CUDA_HOME, or install the CUDA toolkit at /usr/local/cuda)",
                "FA_REQUIRE_NVCC")


def tool_on_path(name: str) -> str:
    """`name` (nvcc, cuobjdump) as PATH finds it, for tests that run what a user's shell would; skipped without
    it, failed where FA_REQUIRE_NVCC=1 (CI puts its nvcc and cuobjdump first on PATH)."""
    found = shutil.which(name)
    if found is None:
        missing(f"needs {name} on PATH", "FA_REQUIRE_NVCC")
    return found

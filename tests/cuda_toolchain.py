"""The CUDA toolkit the nvcc tests compile with, in one place.

FA_CUDA_HOME names it (CI: the compiler wheels of locks/py-cu130.conda-lock.yml, which .ci/run installs with
tests/install_pypi_toolchain.py), else /usr/local/cuda. A test that needs it carries `@pytest.mark.nvcc` (or
calls require_nvcc() in a fixture): without an nvcc there it is skipped, except where FA_REQUIRE_NVCC=1 (CI),
where it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CUDA_HOME = Path(os.environ.get("FA_CUDA_HOME") or "/usr/local/cuda")
NVCC = CUDA_HOME / "bin" / "nvcc"
HOST_CONFIG = CUDA_HOME / "include" / "crt" / "host_config.h"


def require_nvcc() -> None:
    """Skip (fail with FA_REQUIRE_NVCC=1) unless CUDA_HOME holds nvcc."""
    if NVCC.exists():
        return
    reason = f"needs nvcc at {NVCC} (set FA_CUDA_HOME, or install the CUDA toolkit at /usr/local/cuda)"
    if os.environ.get("FA_REQUIRE_NVCC") == "1":
        pytest.fail(f"{reason} and FA_REQUIRE_NVCC=1")
    pytest.skip(reason)

"""Install the CUDA compiler wheels of a pypi line's lock into DIR, so that DIR/nvidia/cu13 is a CUDA_HOME.

    python tests/install_pypi_toolchain.py locks/py-cu130.conda-lock.yml DIR   # then FA_CUDA_HOME=DIR/nvidia/cu13

CI (.ci/run) compiles its nvcc tests with the nvcc of locks/py-cu130.conda-lock.yml this way, not with the
machine's /usr/local/cuda. Installed, by the lock's URL and sha256 (pip --require-hashes --no-deps, no pip
configuration: this machine's caps torch): nvidia-cuda-nvcc, nvidia-cuda-crt, nvidia-nvvm, nvidia-cuda-runtime
and nvidia-cuda-cccl (what nvcc needs to compile and link a kernel, pypi_cuda.yaml's sources), then the
knowledge's symlinks under nvidia/cu13, as `toolkit install` makes them. A DIR already holding this lock's
wheels (DIR/lock-sha256) is kept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolkit.env.lockfile import read_lock
from toolkit.env.pypi_install import make_symlinks
from toolkit.knowledge.facts import load_knowledge

COMPILER_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-cccl")


def main(lock_file: Path, target: Path) -> int:
    locked = read_lock(lock_file)
    marker = target / "lock-sha256"
    if marker.is_file() and marker.read_text().strip() == locked.digest:
        print(f"install_pypi_toolchain: {target} already holds {lock_file}'s compiler wheels")
        return 0
    wheels = [p for p in locked.packages if p.manager == "pip" and p.name in COMPILER_WHEELS]
    assert sorted(p.name for p in wheels) == sorted(COMPILER_WHEELS), f"{lock_file}: not a pypi lock with nvcc"
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write("".join(f"{p.name} @ {p.url} --hash=sha256:{p.sha256}\n" for p in wheels))
        requirements.flush()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--require-hashes", "--no-index", "--target", str(partial), "-r", requirements.name],
                       env=env, check=True)
    pypi = load_knowledge().pypi
    release = pypi.release(next(p.version for p in locked.packages if p.name == "cuda-toolkit"))
    assert release, f"{lock_file}: its cuda-toolkit is not a release of toolkit/knowledge/pypi_cuda.yaml"
    make_symlinks(partial / pypi.cuda_home, release.symlinks)
    (partial / "lock-sha256").write_text(locked.digest + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    print(f"install_pypi_toolchain: {', '.join(f'{p.name} {p.version}' for p in wheels)} in {target}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))

"""Benchmark (not a test): what a resumed `toolkit build` costs against a clean one, as JSON.

The build is tests/fixtures/fa_fixture with more kernels (--kernels extra copies of a small kernel, so that
"half the objects" means something), compiled by the real nvcc (FA_CUDA_HOME, else /usr/local/cuda) with one
job, through the real `toolkit lock` and `toolkit build`. Three builds of the same inputs, each in its own
wheelhouse: a clean one; one stopped with Ctrl-C (SIGINT to its process group, as a terminal sends it) once
half its objects are compiled; and the build that continues from it. CPU time is the kernel's count for each
build's process tree (RUSAGE_CHILDREN); the wheels are compared by sha256.

    python bench/build_resume.py                 # 8 extra kernels: 11 objects
    python bench/build_resume.py --kernels 16 --at 0.5 --out docs/results/2026-12-05-build-resume
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conda_channel import build_simple_index, serve_directory  # noqa: E402
from fixtures.fa_fixture_project import (  # noqa: E402
    FIXTURE_SOURCE,
    make_stub_torch_env,
    pack_fixture_sdist,
    write_external_spec,
)
from timing import children_cpu, machine  # noqa: E402

PROGRESS = re.compile(r"^compiling (\d+)/(\d+) objects")
KERNEL = """// bench/build_resume.py: one more object for the fixture
#include <cuda_runtime.h>

__global__ void extra_{n}_kernel(float *x, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 0; k < 64 && i < n; ++k) x[i] = x[i] * 0.5f + __sinf(x[i] + k);
}}
"""


def project(work: Path, kernels: int) -> Path:
    """The fixture with `kernels` more kernels, as a flash-attn-named sdist, locked from a loopback index."""
    source = work / "fixture-source"
    shutil.copytree(FIXTURE_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__"))
    for n in range(kernels):
        (source / "csrc" / f"extra_{n:02d}_kernel.cu").write_text(KERNEL.format(n=n))
    root = work / "project"
    python = make_stub_torch_env(root / "venv", "2.13.0", "13.0")
    write_external_spec(root / "envs", "fixture", python, "2.13.0")
    sdist = pack_fixture_sdist(root / "sdist", source=source)
    build_simple_index(root / "index", [sdist])
    lock_line(root, "fixture")
    pinned = root / ".cache" / "sdist" / hashlib.sha256(sdist.read_bytes()).hexdigest() / sdist.name
    pinned.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sdist, pinned)
    return root


def lock_line(root: Path, line: str) -> None:
    """`toolkit lock LINE` of a spec in root/envs, from the project's loopback index."""
    with serve_directory(root / "index") as url:
        done = subprocess.run([sys.executable, "-m", "toolkit", "lock", line, "--pypi", f"{url}/simple"],
                              cwd=root, env={**os.environ, "TOOLKIT_CACHE": str(root / ".cache")},
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"toolkit lock {line} failed: {done.stderr}")


def argv(root: Path, wheelhouse: str) -> list[str]:
    # without the compile cache: the clean build would fill it and the resumed build take its objects from it
    return [sys.executable, "-m", "toolkit", "build", "fixture", "--jobs", "1", "--no-install", "--no-compile-cache",
            "--wheelhouse", str(root / wheelhouse)]


def timed_build(root: Path, wheelhouse: str, cache: Path) -> dict:
    cpu0, t0 = children_cpu(), time.monotonic()
    done = subprocess.run(argv(root, wheelhouse), cwd=root, env={**os.environ, "TOOLKIT_CACHE": str(cache)},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"toolkit build failed: {done.stderr}")
    (record_file,) = (root / wheelhouse / "fixture").glob("*.build.json")
    record = json.loads(record_file.read_text())
    (wheel,) = (root / wheelhouse / "fixture").glob("*.whl")
    return {"cpu_s": round(children_cpu() - cpu0, 2), "wall_s": round(time.monotonic() - t0, 2),
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "objects_compiled": record["resumed"].get("objects_compiled", len(record["outputs"]["objects"])),
            "objects_kept": record["resumed"].get("objects_kept", 0)}


def interrupted_build(root: Path, wheelhouse: str, cache: Path, at: float) -> dict:
    """A build stopped with Ctrl-C once `at` of its objects are compiled."""
    cpu0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.Popen(argv(root, wheelhouse), cwd=root, env={**os.environ, "TOOLKIT_CACHE": str(cache)},
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stderr is not None
    done = total = 0
    for line in proc.stderr:
        match = PROGRESS.match(line)
        if match:
            done, total = int(match.group(1)), int(match.group(2))
            if done >= at * total:
                break
    stopped = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate()
    return {"cpu_s": round(children_cpu() - cpu0, 2), "wall_s": round(time.monotonic() - t0, 2),
            "stopped_at_objects": f"{done}/{total}", "ctrl_c_answered_s": round(time.monotonic() - stopped, 2),
            "exit": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=8, help="extra kernels beside the fixture's (default 8)")
    parser.add_argument("--at", type=float, default=0.5, help="the share of objects compiled when stopped")
    parser.add_argument("--out", type=Path, help="folder for build-resume.json and build-resume.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="build-resume-") as scratch:
        root = project(Path(scratch), args.kernels)
        cache = root / ".cache"
        clean = timed_build(root, "clean", cache)
        stopped = interrupted_build(root, "resumed", cache, args.at)
        resumed = timed_build(root, "resumed", cache)
    result = {
        "machine": machine(),
        "objects": clean["objects_compiled"], "clean": clean, "interrupted": stopped, "resumed": resumed,
        "resumed_cpu_vs_clean": round(resumed["cpu_s"] / clean["cpu_s"], 3),
        "interrupted_plus_resumed_cpu_vs_clean": round((stopped["cpu_s"] + resumed["cpu_s"]) / clean["cpu_s"], 3),
        "wheels_identical": resumed["wheel_sha256"] == clean["wheel_sha256"],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "build-resume.json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result, args.out / "build-resume.png")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["clean build", "interrupted build", "resumed build"]
    cpu = [result[k]["cpu_s"] for k in ("clean", "interrupted", "resumed")]
    fig, ax = plt.subplots(figsize=(8, 2.8))
    ax.barh(names, cpu, color=["tab:grey", "tab:orange", "tab:green"])
    ax.axvline(0.6 * cpu[0], color="black", ls="--", lw=1, label="the goal: resumed <= 60 % of clean")
    ax.text(cpu[2], 2, f" {result['resumed_cpu_vs_clean']:.0%} of the clean build's CPU time", va="center")
    ax.set_xlabel(f"CPU time, s ({result['objects']} objects, stopped at {result['interrupted']['stopped_at_objects']})")
    ax.set_xlim(0, max(cpu) * 1.5)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (not a test): the compile cache's hit rates and time saved (issue 33, items 3 and 5), as JSON + a plot.

The build is bench/build_resume.py's fixture with --kernels extra kernels, compiled by the real nvcc through the
real `toolkit build`, each build in its own wheelhouse, all sharing one TOOLKIT_CACHE (so one sccache folder):

  1. the line without the cache (--no-compile-cache): the baseline's wall and CPU time
  2. the same inputs with the cache, cold: the cache's cost on a miss
  3. the same inputs again (its build folder gone): every compile a hit, the same wheel
  4. a second line that differs only in its python (3.12; its own build folder, as its inputs key differs)
  5. a line with one arch more (80, 86, 90 instead of 80, 90)

For each: sccache's hits and misses by stage (from the build record) and the time against the baseline.

    python bench/compile_cache.py --kernels 6 --out docs/results/2026-12-05-compile-cache
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from build_resume import project  # noqa: E402
from fixtures.fa_fixture_project import see_running_packages, write_external_spec  # noqa: E402

DEVICE_STAGES = ("PTX", "CUBIN")  # the device code: most of a kernel's compile time


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build(root: Path, line: str, wheelhouse: str, cache: Path, *extra: str) -> dict:
    cpu0, t0 = children_cpu(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "toolkit", "build", line, "--no-install", "--wheelhouse",
                           str(root / wheelhouse), *extra], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cache)})
    if done.returncode != 0:
        raise SystemExit(f"toolkit build {line} failed: {done.stderr}")
    (record_file,) = (root / wheelhouse / line).glob("*.build.json")
    record = json.loads(record_file.read_text())
    use = record.get("compile_cache") or {}
    hits, misses = use.get("hits", {}), use.get("misses", {})

    def rate(stages: tuple[str, ...] | None) -> float | None:
        h = sum(n for s, n in hits.items() if stages is None or s in stages)
        m = sum(n for s, n in misses.items() if stages is None or s in stages)
        return round(h / (h + m), 3) if h + m else None

    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(children_cpu() - cpu0, 2),
            "wheel_sha256": record["outputs"]["wheel_sha256"], "hits": hits, "misses": misses,
            "hit_rate": rate(None), "device_hit_rate": rate(DEVICE_STAGES)}


def add_line(root: Path, line: str, python: Path | None, archs: tuple[str, ...], minor: str | None) -> None:
    """Another line of the same sdist: its spec and its lock (the fixture's lock, re-made for it)."""
    from cuda_toolchain import CUDA_HOME  # noqa: F401 (write_external_spec's nvcc)

    base = root / "envs" / "fixture.yaml"
    if python is None:
        python = Path(next(ln.split(":", 1)[1].strip() for ln in base.read_text().splitlines()
                           if ln.strip().startswith("python_executable:")))
    write_external_spec(root / "envs", line, python, "2.13.0", archs=archs, python_minor=minor)
    shutil.copyfile(root / "locks" / "fixture.conda-lock.yml", root / "locks" / f"{line}.conda-lock.yml")


def python312_env(root: Path) -> Path | None:
    found = shutil.which("python3.12")
    if not found:
        return None
    subprocess.run([found, "-m", "venv", "--without-pip", str(root / "venv312")], check=True)
    python = root / "venv312" / "bin" / "python"
    see_running_packages(python)
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=6, help="extra kernels beside the fixture's (default 6)")
    parser.add_argument("--out", type=Path, help="folder for compile-cache.json and compile-cache.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as scratch:
        root = project(Path(scratch), args.kernels)
        cache = root / ".cache"
        runs = {"no cache": build(root, "fixture", "plain", cache, "--no-compile-cache"),
                "cold cache": build(root, "fixture", "cold", cache),
                "same inputs again": build(root, "fixture", "again", cache)}
        py312 = python312_env(root)
        if py312 is not None:
            add_line(root, "fixture-py312", py312, ("80", "90"), "3.12")
            runs["other python (3.12)"] = build(root, "fixture-py312", "py312", cache)
        add_line(root, "fixture-arch", None, ("80", "86", "90"), None)
        runs["one arch more (86)"] = build(root, "fixture-arch", "arch", cache)
    base = runs["no cache"]["wall_s"]
    result = {"objects": args.kernels + 3, "runs": runs,
              "wall_vs_no_cache": {name: round(run["wall_s"] / base, 3) for name, run in runs.items()},
              "same_wheel_with_and_without_cache": runs["same inputs again"]["wheel_sha256"]
              == runs["no cache"]["wheel_sha256"] == runs["cold cache"]["wheel_sha256"]}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compile-cache.json").write_text(json.dumps(result, indent=1) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(runs)
        ax.barh(names, [runs[n]["wall_s"] for n in names])
        for y, n in enumerate(names):
            rate = runs[n]["device_hit_rate"]
            ax.text(runs[n]["wall_s"], y, f" {'-' if rate is None else f'{rate:.0%}'} PTX/CUBIN hits", va="center")
        ax.set_xlabel("build wall time, s (fixture with the real nvcc 13.0)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(args.out / "compile-cache.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())

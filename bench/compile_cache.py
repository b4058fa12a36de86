"""Benchmark (not a test): the compile cache's hit rates and time saved (issue 33, items 3 and 5), as JSON + a plot.

The build is bench/build_resume.py's fixture with --kernels extra kernels, compiled by the real nvcc through the
real `toolkit lock` and `toolkit build`, each build in its own wheelhouse, all sharing one TOOLKIT_CACHE (so one
sccache folder and one compile slot, toolkit/build/build_dirs.py):

  1. the line without the cache (--no-compile-cache): the baseline's wall and CPU time
  2. the same inputs with the cache, cold: the cache's cost on a miss
  3. the same inputs again (its build folder gone): every compile a hit, the same wheel
  4. a second line that differs only in its python (another minor version: its own inputs key, build folder)
  5. a line with one arch more (80, 90, 100 instead of 80, 90; flash-attn 2.8.3 compiles only 80, 90, 100, 120)

For each: sccache's hits and misses by stage (from the build record), the hit rate of nvcc's stages (the kernels')
and of all compiles, the wall and CPU time of the whole `toolkit build` against the baseline, and the record's
wall time of its `pip wheel` (the compile and link, without the toolkit's own steps).

    python bench/compile_cache.py --kernels 6 --out docs/results/2026-12-05-compile-cache
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from build_resume import lock_line, project  # noqa: E402
from fixtures.fa_fixture_project import make_stub_torch_env, other_python, write_external_spec  # noqa: E402
from timing import children_cpu, machine  # noqa: E402

NVCC_STAGES = ("CUDA", "CUDA (Device code)", "PTX", "CUBIN")  # sccache's names of nvcc's stages: the kernels'
DEVICE_STAGES = ("PTX", "CUBIN")  # cicc and ptxas: most of a kernel's compile time


def rate(hits: dict[str, int], misses: dict[str, int], stages: tuple[str, ...] | None) -> float | None:
    h = sum(n for s, n in hits.items() if stages is None or s in stages)
    m = sum(n for s, n in misses.items() if stages is None or s in stages)
    return round(h / (h + m), 3) if h + m else None


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
    return {"line": line, "wall_s": round(time.monotonic() - t0, 2),
            "pip_wheel_s": record["outputs"]["wall_s"], "cpu_s": round(children_cpu() - cpu0, 2),
            "wheel": record["outputs"]["wheel"], "wheel_sha256": record["outputs"]["wheel_sha256"],
            "objects": len(record["outputs"]["objects"]), "hits": hits, "misses": misses,
            "not_cached": use.get("not_cached"), "errors": use.get("errors"),
            "slot": "compile slot" in done.stderr,
            "nvcc_hit_rate": rate(hits, misses, NVCC_STAGES), "device_hit_rate": rate(hits, misses, DEVICE_STAGES),
            "hit_rate": rate(hits, misses, None)}


def add_line(root: Path, line: str, python: Path, minor: str | None, archs: tuple[str, ...]) -> None:
    """Another line of the same sdist: its spec and its lock (`toolkit lock`)."""
    write_external_spec(root / "envs", line, python, "2.13.0", archs=archs, python_minor=minor)
    lock_line(root, line)


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
        other = other_python()
        if other is not None:
            minor = subprocess.run([other, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            python = make_stub_torch_env(root / "venv-other", "2.13.0", "13.0", base=other)
            add_line(root, "fixture-other-python", python, minor, ("80", "90"))
            runs[f"other python ({minor})"] = build(root, "fixture-other-python", "other-python", cache)
        add_line(root, "fixture-arch", root / "venv" / "bin" / "python", None, ("80", "90", "100"))
        runs["one arch more (100)"] = build(root, "fixture-arch", "arch", cache)
    base = runs["no cache"]
    result = {
        "objects": args.kernels + 3,
        "kernels": args.kernels + 2,
        "machine": machine(),
        "runs": runs,
        "wall_vs_no_cache": {name: round(run["wall_s"] / base["wall_s"], 3) for name, run in runs.items()},
        "wall_saved_s": {name: round(base["wall_s"] - run["wall_s"], 1) for name, run in runs.items()},
        "cpu_saved_s": {name: round(base["cpu_s"] - run["cpu_s"], 1) for name, run in runs.items()},
        "same_wheel_with_and_without_cache": runs["same inputs again"]["wheel_sha256"]
        == runs["no cache"]["wheel_sha256"] == runs["cold cache"]["wheel_sha256"],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compile-cache.json").write_text(json.dumps(result, indent=1) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 3.5))
        names = list(runs)
        ax.barh(names, [runs[n]["wall_s"] for n in names])
        for y, n in enumerate(names):
            nvcc = runs[n]["nvcc_hit_rate"]
            ax.text(runs[n]["wall_s"], y, f" {'no cache' if nvcc is None else f'{nvcc:.0%} of nvcc stages hit'}",
                    va="center")
        ax.set_xlabel(f"build wall time, s (fixture + {args.kernels} kernels, real nvcc 13.0)")
        ax.set_xlim(0, max(runs[n]["wall_s"] for n in names) * 1.45)
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(args.out / "compile-cache.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (not a test): the toolkit's install against uv's and py-rattler's, side by side in one run.

Rows, each job in a subprocess (wall seconds, and CPU seconds of it and all it started), alternating which side
goes first, repeated --repeat times (median reported):

- pypi cold / warm: a venv of small wheels served on 127.0.0.1 (two CUDA-shaped wheels as the tests build them,
  python's own pip and setuptools, and --fillers wheels of 200 modules each), by the toolkit (find_python's probe,
  then VenvBuild.make: venv, python's own pip, uv from a pylock of the entries, the METADATA checks, the CUDA
  links) against `uv venv` + `uv pip install --require-hashes --no-deps --compile-bytecode -r` of the same wheels
  by URL and sha256. Cold: empty caches on both sides; warm: kept.
- conda warm: the conda layer of the tests' fixture channel (tests/conda_channel.py, 15 packages over file://)
  by the toolkit's py-rattler engine (RattlerEngine.install: archives found by their stamps, py-rattler in a
  fork, its kept package cache) against `rattler.install` of the same archives with a persistent cache, its
  records made as from a lock (index.json, sha256, size).
- conda replica warm (--replica): the same for the conda layer of a CUDA 13.0 line solved from the conda-forge
  replica (tests/conda_forge_replica: real records, payload from the image's CUDA 13.0 in /usr/local/cuda, made
  of NVIDIA's wheels): the 70-odd archives and GBs a real line installs, where the fixture's 15 are mostly fixed
  costs.

Both sides run with compiled bytecode (written once to a folder of the run, as an installed toolkit has it).
--baseline DIR (a `git archive` of an earlier commit) runs that toolkit as a third side of each row, `toolkit
before`, in the same rounds: a change's before and after measured under the same load, which runs an hour apart
are not (the same tree's ratio moved by a tenth between them).

    python bench/install.py --repeat 3 --out docs/results/2026-12-05-install-bench
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conda_channel import build_channel, serve_directory, toolchain_packages  # noqa: E402
from test_hostile_pypi_install import cuda_wheels, wheel  # noqa: E402
from timing import Run, alternating, as_pairs, measured, run_metadata, side_figures  # noqa: E402

from toolkit.env.archives import archive_identity  # noqa: E402
from toolkit.env.pypi_lock import uv_executable  # noqa: E402

# Each toolkit side runs through run_main, as every toolkit program runs (its start and exit), and imports what it
# uses inside it, as a verb's wing is imported once run_main runs (cli.main).
TOOLKIT_PYPI = """
import sys
from toolkit.base.entry import run_main

def install(argv):
    import json
    from pathlib import Path
    from rich.console import Console
    from toolkit.env.lockfile import LockedPackage
    from toolkit.env.pypi_install import VenvBuild, find_python
    from toolkit.knowledge.facts import load_knowledge
    packages = tuple(LockedPackage(**p) for p in json.loads(Path(sys.argv[1]).read_text()))
    pypi = load_knowledge().pypi
    prefix = Path(sys.argv[2])
    version = "%d.%d" % sys.version_info[:2]
    python, bundled = find_python(version, Path(sys.executable).resolve())  # as VenvBuild.of: the python, its pip
    VenvBuild(python, version, packages, pypi.lines["13.0.3"], pypi.cuda_home, bundled=bundled).make(
        prefix.parent / "staging", prefix, Console(quiet=True))
    return 0

sys.exit(run_main(install, []))
"""

TOOLKIT_CONDA = """
import sys
from toolkit.base.entry import run_main

def install(argv):
    import json
    from pathlib import Path
    from rich.console import Console
    from toolkit.env.engine import InstallJob, RattlerEngine
    from toolkit.env.lockfile import LockedPackage
    conda = tuple(LockedPackage(**p) for p in json.loads(Path(sys.argv[1]).read_text()))
    prefix = Path(sys.argv[2])
    prefix.mkdir(parents=True)
    RattlerEngine(Console(quiet=True)).install(InstallJob(Path(sys.argv[1]), "linux-64", conda, (), prefix, prefix))
    return 0

sys.exit(run_main(install, []))
"""

RATTLER_CONDA = """
import asyncio, os, sys, json
from pathlib import Path
import rattler
archives = json.loads(Path(sys.argv[1]).read_text())
records = []
for a in archives:
    record = rattler.PackageRecord.from_index_json(a["index"], size=a["size"], sha256=a["sha256"])
    records.append(rattler.RepoDataRecord(record, a["url"].rsplit("/", 1)[-1], a["url"], a["url"].rsplit("/", 2)[0]))
asyncio.run(rattler.install(records, target_prefix=sys.argv[2], cache_dir=Path(sys.argv[3]),
                            platform=rattler.Subdir("linux-64")))
sys.stdout.flush()
os._exit(0)  # py-rattler crashes at interpreter exit in a few % of runs (docs/conda-offline.md), as the toolkit's worker
"""


def pypi_wheels(index: Path, fillers: int) -> list[dict]:
    """The wheels of the pypi row, as lock entries whose URLs are file names under the served index."""
    packages = list(cuda_wheels(index))
    for n in range(fillers):
        modules = {f"filler{n}/m{i}.py": (f"def f{i}(x):\n    return x + {i}\n" * 40).encode() for i in range(200)}
        packages.append(wheel(index, f"filler{n}", "1.0", modules))
    bundled = Path(sys.executable).resolve().parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for found in sorted((bundled / "ensurepip" / "_bundled").glob("setuptools-*.whl")):
        shutil.copy(found, index / found.name)
        packages.append(wheel.__globals__["LockedPackage"]("pip", "setuptools", found.name.split("-")[1], found.as_uri(),
                                                             hashlib.sha256(found.read_bytes()).hexdigest()))
    return [{"manager": "pip", "name": p.name, "version": p.version, "url": p.url.rsplit("/", 1)[-1], "sha256": p.sha256,
             "platform": "linux-64"} for p in packages]


def conda_jobs(archives: list[Path], tmp: Path, name: str) -> tuple[Path, Path]:
    """The toolkit's install entries of these archives (as a lock gives them) and py-rattler's records of them
    (index.json, sha256, size, read before anything is timed): <name>.json and <name>-rattler.json."""
    conda = [{"manager": "conda", "name": a.name.rsplit("-", 2)[0], "version": a.name.rsplit("-", 2)[1],
              "url": a.as_uri(), "sha256": hashlib.sha256(a.read_bytes()).hexdigest(), "platform": "linux-64"}
             for a in archives]
    (tmp / f"{name}.json").write_text(json.dumps(conda))
    (tmp / f"{name}-records").mkdir()
    for n, (entry, a) in enumerate(zip(conda, archives)):
        (tmp / f"{name}-records" / f"{n}.json").write_bytes(archive_identity(a).index_json)
        entry.update(index=str(tmp / f"{name}-records" / f"{n}.json"), size=a.stat().st_size)
    (tmp / f"{name}-rattler.json").write_text(json.dumps(conda))
    return tmp / f"{name}.json", tmp / f"{name}-rattler.json"


REPLICA_SOLVE = """
import json, os, sys
from pathlib import Path
from toolkit.env.lock import conda_request
from toolkit.env.rattler_solve import rattler_solve
from toolkit.spec.envspec import load_spec
request = conda_request(load_spec(Path(sys.argv[1])))
records = rattler_solve(request.channels, request.specs, "linux-64", request.virtual_packages["linux-64"])
print(json.dumps([str(r.url) for r in records]))
sys.stdout.flush()
os._exit(0)  # py-rattler can crash at interpreter exit (docs/conda-offline.md)
"""


def replica_archives(tmp: Path) -> list[Path]:
    """The archives a CUDA 13.0 line installs from the replica channel with real payload: the channel built from
    tests/conda_forge_replica (as tests/test_replica.py's replica_channel), the line's conda layer solved on it
    by the toolkit's py-rattler solve (envs/base.yaml's packages, the line as tests/test_replica.py writes it)."""
    from conda_forge_replica.replica import CONDA_FORGE, PayloadRoots, packages

    cuda = Path("/usr/local/cuda")
    if not (cuda / "dist-info").is_dir():
        raise SystemExit(f"--replica: needs {cuda} made of NVIDIA's wheels (its dist-info/ gives the payload)")
    site = os.environ.get("FA_CUDA_TORCH")
    channel = build_channel(tmp / "replica", packages(PayloadRoots(cuda.resolve(), Path(site) if site else None),
                                                      channel=CONDA_FORGE))
    envs = tmp / "replica-envs"
    envs.mkdir()
    shutil.copy(ROOT / "envs" / "base.yaml", envs / "base.yaml")
    (envs / "cu130.yaml").write_text(
        f'extends: base\ncuda: "13.0"\npython: "{sys.version_info.major}.{sys.version_info.minor}"\ngcc: 12\n'
        f'channels: [{channel.as_uri()}]\npip_packages: null\ntorch: {{version: "2.13.0", index: '
        f'"http://127.0.0.1:9/simple"}}\narchs: ["90"]\n')
    solved = subprocess.run([sys.executable, "-c", REPLICA_SOLVE, str(envs / "cu130.yaml")], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if solved.returncode != 0:
        raise SystemExit(f"--replica: the solve failed: {solved.stderr[-2000:]}")
    return [Path(url.removeprefix("file://")) for url in json.loads(solved.stdout)]


def run(args: argparse.Namespace) -> dict[str, dict[str, list[Run]]]:
    uv = uv_executable()
    with tempfile.TemporaryDirectory(prefix="install-bench-") as scratch:
        tmp = Path(scratch)
        # Python's bytecode as an installed toolkit has it (pip compiles it): written once, to a folder of the run
        pycache = tmp / "pycache"
        trees = {"toolkit": ROOT, **({"toolkit before": args.baseline.resolve()} if args.baseline else {})}
        for tree in trees.values():  # the toolkit's and py-rattler's bytecode, as installed
            measured([sys.executable, "-c", "import toolkit.env.pypi_install, toolkit.env.rattler_link, rattler"],
                     {"PYTHONPATH": str(tree)}, pycache=pycache)
        wheels = pypi_wheels(tmp / "index", args.fillers)
        channel = build_channel(tmp / "channel", toolchain_packages(("linux-64",)))
        layers = {"conda warm": conda_jobs(sorted([*channel.rglob("*.conda"), *channel.rglob("*.tar.bz2")]), tmp,
                                           "fixture")}
        if args.replica:
            archives = replica_archives(tmp)
            print(f"replica layer: {len(archives)} archives, "
                  f"{sum(a.stat().st_size for a in archives) / 2**20:.0f} MiB", file=sys.stderr)
            layers["conda replica warm"] = conda_jobs(archives, tmp, "replica")
        with serve_directory(tmp / "index") as url:
            lock = [{**w, "url": f"{url}/{w['url']}"} for w in wheels]
            (tmp / "pypi.json").write_text(json.dumps(lock))
            (tmp / "requirements.txt").write_text("".join(f"{w['name']} @ {w['url']} --hash=sha256:{w['sha256']}\n"
                                                          for w in lock))
            counter = iter(range(10**6))

            def toolkit_pypi(tree: Path) -> Callable[[Path], Run]:
                def job(cache: Path) -> Run:
                    prefix = tmp / f"tk-{next(counter)}" / "env"
                    prefix.parent.mkdir()
                    return measured([sys.executable, "-c", TOOLKIT_PYPI, str(tmp / "pypi.json"), str(prefix)],
                                    {"XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(tree)}, pycache=pycache)
                return job

            def uv_pypi(cache: Path) -> Run:
                prefix = tmp / f"uv-{next(counter)}"
                env = {"UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1"}
                a = measured([uv, "venv", "-q", "-p", sys.executable, str(prefix)], env, pycache=pycache)
                b = measured([uv, "pip", "install", "-q", "--python", str(prefix / "bin" / "python"), "--no-deps",
                              "--require-hashes", "--compile-bytecode", "-r", str(tmp / "requirements.txt")], env,
                             pycache=pycache)
                return Run(a.wall_s + b.wall_s, a.cpu_s + b.cpu_s)

            def toolkit_conda(entries: Path, tree: Path) -> Callable[[Path], Run]:
                def job(cache: Path) -> Run:
                    prefix = tmp / f"tkc-{next(counter)}"
                    try:
                        return measured([sys.executable, "-c", TOOLKIT_CONDA, str(entries), str(prefix)],
                                        {"XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(tree)}, pycache=pycache)
                    finally:
                        shutil.rmtree(prefix, ignore_errors=True)  # the replica's prefixes are GBs each
                return job

            def rattler_conda(records: Path) -> Callable[[Path], Run]:
                def job(cache: Path) -> Run:
                    prefix = tmp / f"rc-{next(counter)}"
                    try:
                        return measured([sys.executable, "-c", RATTLER_CONDA, str(records), str(prefix), str(cache)],
                                        pycache=pycache)
                    finally:
                        shutil.rmtree(prefix, ignore_errors=True)
                return job

            def in_cache(name: str, side: str, job: Callable[[Path], Run], cold: bool) -> Callable[[int], Run]:
                """The job of one side of a row in its cache: a new one each round (cold), else the side's kept one,
                filled by an unmeasured run first (warm)."""
                def each(turn: int) -> Run:
                    cache = tmp / f"cache-{side.replace(' ', '-')}-{name.rsplit(' ', 1)[0]}" / (
                        f"cold{turn}" if cold else "kept")
                    if not cold and not cache.exists():
                        job(cache)
                    return job(cache)
                return each

            rows = [("pypi cold", toolkit_pypi, uv_pypi, True), ("pypi warm", toolkit_pypi, uv_pypi, False),
                    *((name, functools.partial(toolkit_conda, entries), rattler_conda(records), False)
                      for name, (entries, records) in layers.items())]
            return alternating({name: {**{side: in_cache(name, side, ours(tree), cold) for side, tree in trees.items()},
                                       "library": in_cache(name, "library", theirs, cold)}
                                for name, ours, theirs, cold in rows}, args.repeat)


def summary(rows: dict[str, dict[str, list[Run]]]) -> dict:
    out = {}
    for name, row in rows.items():
        figures = side_figures(row)
        out[name] = {**figures,
                     "wall_ratio": figures["toolkit_wall_s"] / figures["library_wall_s"],
                     "cpu_ratio": figures["toolkit_cpu_s"] / figures["library_cpu_s"], "runs": as_pairs(row)}
        if "toolkit before" in row:
            out[name]["before"] = {"wall_ratio": figures["toolkit before_wall_s"] / figures["library_wall_s"],
                                   "cpu_ratio": figures["toolkit before_cpu_s"] / figures["library_cpu_s"]}
    return out


# the "done when" of the everyday verbs: toolkit / library
GOALS = {"pypi cold": 1.3, "pypi warm": 1.5, "conda warm": 1.5, "conda replica warm": 1.5}


def plot(results: dict, path: Path, before: dict | None = None) -> None:
    """Wall seconds of each side; with `before` (an earlier run's rows), each row's ratios then and now beside
    the goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 2 if before else 1, figsize=(12 if before else 7, 3.8), squeeze=False)
    ax = axes[0][0]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [results[n]["toolkit_wall_s"] for n in names], 0.4, label="toolkit")
    ax.bar([i + 0.2 for i in x], [results[n]["library_wall_s"] for n in names], 0.4, label="uv / py-rattler")
    for i, n in enumerate(names):
        ax.text(i, max(results[n]["toolkit_wall_s"], results[n]["library_wall_s"]), f"{results[n]['wall_ratio']:.2f}x",
                ha="center", va="bottom")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("wall seconds (median)")
    ax.legend()
    if before:
        ax = axes[0][1]
        bars = [("before, wall", before, "wall_ratio"), ("before, CPU", before, "cpu_ratio"),
                ("after, wall", results, "wall_ratio"), ("after, CPU", results, "cpu_ratio")]
        for k, (label, rows, key) in enumerate(bars):
            ax.bar([i + (k - 1.5) * 0.2 for i in x], [rows[n][key] if n in rows else 0 for n in names], 0.2,
                   label=label)
        for i, n in enumerate(names):
            ax.hlines(GOALS.get(n, 1.5), i - 0.45, i + 0.45, colors="black", linestyles="dashed")
        ax.set_xticks(list(x), names)
        ax.set_ylabel("toolkit / library (dashed: the goal)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fillers", type=int, default=20, help="filler wheels of 200 modules each")
    parser.add_argument("--replica", action="store_true",
                        help="add the row of a CUDA 13.0 line's conda layer from the conda-forge replica")
    parser.add_argument("--out", type=Path, help="folder for results.json and install.png")
    parser.add_argument("--before", type=Path, help="an earlier run's results.json, whose ratios the plot shows beside")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="a checkout of the toolkit before (git archive of a commit), run as the side `toolkit "
                             "before` of each row in the same rounds; the plot shows its ratios beside")
    parser.add_argument("--replot", action="store_true", help="only draw install.png again from --out's results.json")
    args = parser.parse_args()
    before = json.loads(args.before.read_text())["rows"] if args.before else None
    if args.replot:
        plot(json.loads((args.out / "results.json").read_text())["rows"], args.out / "install.png", before)
        return 0
    results = summary(run(args))
    for name, r in results.items():
        print(f"{name:11s} toolkit {r['toolkit_wall_s']:6.2f} s wall {r['toolkit_cpu_s']:6.2f} s CPU | library "
              f"{r['library_wall_s']:6.2f} s wall {r['library_cpu_s']:6.2f} s CPU | ratio {r['wall_ratio']:.2f}x wall "
              f"{r['cpu_ratio']:.2f}x CPU" + (f" | before {r['before']['wall_ratio']:.2f}x wall "
                                              f"{r['before']['cpu_ratio']:.2f}x CPU" if "before" in r else ""))
    before = before or ({name: r["before"] for name, r in results.items()} if args.baseline else None)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = run_metadata("install.py", sys.argv[1:], repeat=args.repeat, fillers=args.fillers)
        (args.out / "results.json").write_text(json.dumps({**meta, "rows": results}, indent=1) + "\n")
        plot(results, args.out / "install.png", before)
    return 0


if __name__ == "__main__":
    sys.exit(main())

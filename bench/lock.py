"""Benchmark (not a test): solve time of one line's conda layer against a conda-forge-sized channel.

conda-forge cannot be reached here, so the channel is synthetic: at least 100,000 repodata records with
conda-forge's shape. The toolchain packages a line asks for (python, cuda-version with its __cuda
constraint, cuda-nvcc, cuda-cudart-dev, gxx, ninja, pip) come in many versions and builds, python
depends on a web of library packages, and filler packages depend on each other with version ranges,
so the solver has real choices to make. Only repodata is written (solving reads nothing else).

    python bench/lock.py                      # 100,000 records, the cu126 line, every backend available
    python bench/lock.py --records 2000 --line cu130
    python bench/lock.py --pypi py-cu132      # a pypi line's pip layer against PyPI: seconds and bytes downloaded
    python bench/lock.py --ratios --repeat 5 --out docs/results/2026-12-05-everyday-lock

--ratios: the everyday lock rows, the toolkit against the libraries doing the same job, each job in its own process
(wall seconds, and CPU seconds of it and all it started), the jobs of a row alternating which goes first, repeated
(medians), with compiled bytecode on every side:
- pypi: `toolkit lock py-cu132 --force` (PyPI; a copy of envs/ and locks/) against `uv pip compile --format
  pylock.toml --generate-hashes` of the same requirements, constraints, index, target and --exclude-newer, one
  uv cache for both (warmed first); uv as typed (it looks for an interpreter on PATH) and with `--python` named.
- conda: `toolkit lock` of a CUDA 13.0 line (linux-64 and linux-aarch64) against tests/conda_forge_replica's
  records over file:// (--engine rattler; torch a test double on a loopback index) against py-rattler's solve of
  the same specs and virtual packages for both platforms and its lock file written (rattler.LockFile), and that
  plus the pip layer's uv resolves (requirements.txt and pylock.toml per platform).
--baseline DIR (a `git archive` of an earlier commit) runs that toolkit as a further job of each row. The locks
every toolkit writes are compared with the committed ones (pypi) or the first run's (conda): the same bytes.

Target: under 3 s for the embedded py-rattler solver, repodata loading included. A pypi line (torch and NVIDIA's
CUDA wheels, several GB of wheels) must lock from metadata: seconds, and a few MB downloaded, never a wheel.
Its bytes are counted on the wire by a local CONNECT proxy that uv (HTTPS_PROXY) sends every request through.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from timing import Run, alternating, as_pairs, measured, median, run_metadata  # noqa: E402

from toolkit.base.workspace import Workspace  # noqa: E402
from toolkit.env.engine import CondaLockEngine, conda_executable  # noqa: E402
from toolkit.env.lock import conda_request  # noqa: E402
from toolkit.env.pypi_lock import tomllib  # noqa: E402 - tomllib, or tomli on python 3.10
from toolkit.env.rattler_solve import rattler_solve  # noqa: E402
from toolkit.spec.envspec import load_spec  # noqa: E402

TARGET_SECONDS = 3.0
PLATFORM = "linux-64"
CUDA_LINES = ["11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0"]
PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14"]
CORE_NAMES = 60  # libraries in the toolchain's dependency web
GCCS = ["10.4.0", "11.4.0", "12.4.0", "13.3.0", "14.2.0", "15.1.0"]


def record(name: str, version: str, build: str, subdir: str, depends: list[str], constrains: list[str] = (),
           noarch: str | None = None) -> tuple[str, dict]:
    filename = f"{name}-{version}-{build}.conda"
    entry = {"name": name, "version": version, "build": build, "build_number": int(build.rsplit("_", 1)[-1]),
             "depends": depends, "constrains": list(constrains), "subdir": subdir, "md5": "0" * 32,
             "sha256": "0" * 64, "size": 1, "timestamp": 1_700_000_000_000, "license": "BSD-3-Clause"}
    if noarch:
        entry["noarch"] = noarch
    return filename, entry


def toolchain_records(libraries: list[str]) -> list[tuple[str, str, dict]]:
    """The packages a line asks for, in conda-forge's shapes, many versions each."""
    out = []
    for cuda in CUDA_LINES:
        major, minor = cuda.split(".")
        pin = f"cuda-version >={cuda},<{major}.{int(minor) + 1}.0a0"
        for build in range(3):
            out.append(("noarch", *record("cuda-version", cuda, f"h{build}_{build}", "noarch", [],
                                          [f"__cuda >={major}", f"cudatoolkit {cuda}|{cuda}.*"], "generic")))
        out += [(PLATFORM, *record(dev, f"{cuda}.0", "h0_0", PLATFORM, [pin]))  # envs/base.yaml asks for them
                for dev in ("libcublas-dev", "libcusparse-dev", "libcusolver-dev")]
        for patch in range(20):
            full = f"{cuda}.{patch * 7}"
            out += [(PLATFORM, *record("cuda-cudart", full, f"h{patch}_0", PLATFORM, [pin, "libgcc >=12"])),
                    (PLATFORM, *record("cuda-cudart-dev", full, f"h{patch}_0", PLATFORM,
                                       [pin, f"cuda-cudart {full} h{patch}_0"])),
                    (PLATFORM, *record("cuda-nvcc", full, f"h{patch}_0", PLATFORM,
                                       [pin, f"cuda-cudart-dev {full}.*", f"gcc_impl_{PLATFORM} >=6"],
                                       [f"gcc_impl_{PLATFORM} <{15 if major == '13' else 14}.0a0"]))]
    for gcc in GCCS:
        for build in range(10):
            b = f"h{build}_{build}"
            out += [(PLATFORM, *record("libgcc", gcc, b, PLATFORM, ["__glibc >=2.17,<3.0.a0"])),
                    (PLATFORM, *record(f"gcc_impl_{PLATFORM}", gcc, b, PLATFORM,
                                       [f"libgcc >={gcc}", f"sysroot_{PLATFORM} >=2.17"])),
                    (PLATFORM, *record(f"gxx_impl_{PLATFORM}", gcc, b, PLATFORM, [f"gcc_impl_{PLATFORM} {gcc} {b}"])),
                    (PLATFORM, *record("gxx", gcc, b, PLATFORM, [f"gxx_impl_{PLATFORM} {gcc}.*"]))]
    for glibc in ("2.17", "2.28", "2.34"):
        out.append(("noarch", *record(f"sysroot_{PLATFORM}", glibc, "h0_0", "noarch", [f"__glibc >={glibc}"],
                                      noarch="generic")))
    for python in PYTHONS:
        for patch in range(15):
            deps = ["__glibc >=2.17,<3.0.a0", "libgcc >=12", *(f"{lib} >=1.0" for lib in libraries)]
            out.append((PLATFORM, *record("python", f"{python}.{patch}", f"h{patch}_cpython_0", PLATFORM, deps)))
    for version in range(60):
        out.append(("noarch", *record("pip", f"{20 + version // 10}.{version % 10}", "pyh0_0", "noarch",
                                      ["python >=3.9"], noarch="python")))
        out.append((PLATFORM, *record("ninja", f"1.{version // 5}.{version % 5}", "h0_0", PLATFORM,
                                      ["libgcc >=12"])))
    return out


def filler_records(count: int, rng: random.Random) -> tuple[list[tuple[str, str, dict]], list[str]]:
    """count records of library packages, 25 versions per name, each depending on up to three other
    names with version ranges. As on conda-forge, most of the channel is unrelated to the toolchain:
    the first CORE_NAMES names form the web python's libraries live in, the rest depend among themselves."""
    versions_per_name = 25
    names = [f"lib-{index:05d}" for index in range(max(count // versions_per_name, CORE_NAMES + 1))]
    out = []
    for position, name in enumerate(names):
        pool = names[:position] if position < CORE_NAMES else names[CORE_NAMES:position]
        for version in range(versions_per_name):
            deps = [f"{other} >=1.{rng.randint(0, versions_per_name // 2)},<2"
                    for other in rng.sample(pool, k=min(len(pool), rng.randint(0, 3)))]
            out.append((PLATFORM, *record(name, f"1.{version}", f"h{version}_0", PLATFORM,
                                          ["libgcc >=12", *deps])))
    python_libraries = rng.sample(names[:CORE_NAMES], k=12)  # like python's bzip2, openssl, libffi, ...
    return out[:count], python_libraries


def write_channel(directory: Path, records: int, seed: int) -> int:
    rng = random.Random(seed)
    filler, libraries = filler_records(records, rng)
    subdirs: dict[str, dict] = {PLATFORM: {}, "noarch": {}}
    for subdir, filename, entry in [*toolchain_records(libraries), *filler]:
        subdirs[subdir][filename] = entry
    for subdir, packages in subdirs.items():
        (directory / subdir).mkdir(parents=True, exist_ok=True)
        (directory / subdir / "repodata.json").write_text(json.dumps(
            {"info": {"subdir": subdir}, "packages": {}, "packages.conda": packages, "repodata_version": 1}))
    return sum(len(p) for p in subdirs.values())


class CountingProxy(socketserver.ThreadingTCPServer):
    """An HTTPS (CONNECT) proxy on 127.0.0.1 that counts the bytes it relays each way."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.down = self.up = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Tunnel(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        request = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if len(request) < 2 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 CONNECT only\r\n\r\n")
            return
        host, port = request[1].rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=60) as upstream:
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                self._relay(self.connection, upstream)
        except OSError:  # either side hung up: the tunnel is over
            return

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        server: CountingProxy = self.server  # type: ignore[assignment]
        while True:
            ready, _, _ = select.select([client, upstream], [], [], 60)
            if not ready:
                return
            for source in ready:
                data = source.recv(1 << 16)
                if not data:
                    return
                (upstream if source is client else client).sendall(data)
                with server.lock:
                    if source is client:
                        server.up += len(data)
                    else:
                        server.down += len(data)


def bench_pypi(line: str) -> None:
    """Lock a pypi line's pip layer twice, with an empty uv cache and then with the one the first run filled."""
    from toolkit.env.lock import lock_pypi_layer
    from toolkit.spec.rules import checked_spec

    spec = checked_spec(Workspace(envs=ROOT / Workspace.envs).spec_file(line))
    proxy = CountingProxy()
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="bench-uv-") as tmp:
        os.environ.update(UV_CACHE_DIR=str(Path(tmp) / "cache"), HTTPS_PROXY=proxy.url, https_proxy=proxy.url)
        print(f"line {line}: torch {spec.torch_version}, CUDA {spec.cuda}, python {spec.python}, index {spec.torch_index}")
        print(f"{'uv cache':<10}{'seconds':>9}{'downloaded':>14}{'sent':>10}{'wheels':>8}{'locked wheel bytes':>20}")
        for cache in ("empty", "warm"):
            proxy.down = proxy.up = 0
            started = time.perf_counter()
            layer, _ = lock_pypi_layer(spec, Workspace(locks=Path(tmp) / "locks"))
            seconds = time.perf_counter() - started
            size = sum(w.get("size", 0) for p in tomllib.loads(layer.pylock)["packages"] for w in p.get("wheels", []))
            print(f"{cache:<10}{seconds:>9.2f}{proxy.down / 1e6:>11.2f} MB{proxy.up / 1e6:>7.2f} MB"
                  f"{len(layer.packages):>8}{size / 1e9:>17.2f} GB")
    proxy.shutdown()


# ---------------------------------------------------------------- --ratios: the lock rows against the libraries

RATTLER_LOCK = """
import asyncio, json, os, sys
import rattler
job = json.loads(open(sys.argv[1]).read())
gateway = rattler.Gateway()
lock = rattler.LockFile([rattler.LockPlatform(p) for p in job["platforms"]])
lock.set_channels("default", [rattler.LockChannel(c) for c in job["channels"]])
for platform in job["platforms"]:
    virtual = []
    for name, value in sorted(job["virtual_packages"][platform].items()):
        version, _, build = value.partition(" ")
        virtual.append(rattler.GenericVirtualPackage(rattler.PackageName(name), rattler.Version(version),
                                                     rattler.BuildString(build or "0")))
    records = asyncio.run(rattler.solve(sources=[rattler.Channel(c) for c in job["channels"]], specs=job["specs"],
                                        gateway=gateway, platforms=[rattler.Subdir(platform), rattler.Subdir("noarch")],
                                        virtual_packages=virtual))
    for record in records:
        lock.add_conda_package("default", rattler.LockPlatform(platform), record)
lock.to_path(sys.argv[2])
print(sum(1 for line in open(sys.argv[2]) if line.startswith("- conda:")))
sys.stdout.flush()
os._exit(0)  # py-rattler can crash at interpreter exit (docs/conda-offline.md), as the toolkit's worker does
"""

RATIOS_PYPI_LINE = "py-cu132"


class Scratch:
    """Where the --ratios jobs run: every job of every side with the run's compiled bytecode (as installed) and one
    uv cache (warmed first)."""

    def __init__(self, tmp: Path) -> None:
        self.pycache = tmp / "pycache"
        self.env = {"UV_CACHE_DIR": str(tmp / "uv-cache")}

    def measured(self, command: list[str], cwd: Path) -> Run:
        return measured(command, self.env, cwd, pycache=self.pycache)


def pypi_row(tmp: Path, line: str, baseline: Path | None) -> tuple[dict, list[Path]]:
    """The pypi row's jobs: the toolkit's re-lock of `line` in a copy of envs/ and locks/ (and the `baseline`
    checkout's, in another copy), uv's compile of the same inputs as typed and with --python; and the files whose
    bytes must stay those committed."""
    from toolkit.env.lockfile import read_lock
    from toolkit.env.pypi_lock import pypi_inputs, uv_executable
    from toolkit.knowledge.facts import load_knowledge

    workspace = tmp / "pypi"
    shutil.copytree(ROOT / "envs", workspace / "envs")
    shutil.copytree(ROOT / "locks", workspace / "locks")
    spec = load_spec(workspace / "envs" / f"{line}.yaml")
    requirements, constraints = pypi_inputs(spec, load_knowledge().pypi)
    exclude_newer = read_lock(workspace / "locks" / f"{line}.conda-lock.yml").exclude_newer
    uv_dir = tmp / "uv-pypi"
    uv_dir.mkdir()
    (uv_dir / "requirements.in").write_text("\n".join(requirements) + "\n")
    (uv_dir / "constraints.txt").write_text("\n".join(constraints) + "\n")
    glibc = "2_28"  # toolkit/knowledge/virtual_packages.yaml's linux-64
    uv = [uv_executable(), "pip", "compile", "--quiet", "--no-config", "--generate-hashes", "--format", "pylock.toml",
          "--python-version", spec.python, "--python-platform", f"x86_64-manylinux_{glibc}", "--index-url",
          spec.torch_index, "--constraints", "constraints.txt", "--exclude-newer", exclude_newer, "--output-file",
          f"pylock.{line}.toml", "requirements.in"]
    jobs = {
        "toolkit": ([sys.executable, "-m", "toolkit", "lock", line, "--force", "--envs", str(workspace / "envs"),
                     "--locks", str(workspace / "locks")], ROOT),
        "uv": (uv, uv_dir),
        "uv --python": ([*uv[:4], "--python", sys.executable, *uv[4:]], uv_dir),
    }
    kept = [workspace / "locks" / f"{line}.conda-lock.yml", workspace / "locks" / f"pylock.{line}.toml"]
    if baseline:  # a workspace of its own: a lock names its spec relative to itself
        before = tmp / "pypi-before"
        shutil.copytree(workspace, before)
        jobs["toolkit before"] = ([sys.executable, "-m", "toolkit", "lock", line, "--force", "--envs",
                                   str(before / "envs"), "--locks", str(before / "locks")], baseline)
        kept += [before / "locks" / path.name for path in kept]
    return jobs, kept


def conda_inputs(tmp: Path) -> tuple[Path, Path]:
    """The conda row's inputs: the replica's records as a channel (no payload: a lock reads repodata), a loopback
    index's files (a torch test double, the flash-attn sdist), a project with the repo's envs/base.yaml."""
    from conda_channel import build_channel, build_simple_index, make_sdist, make_wheel
    from conda_forge_replica.replica import CONDA_FORGE, PayloadRoots, packages

    channel = build_channel(tmp / "replica", packages(PayloadRoots(), with_payload=False, channel=CONDA_FORGE))
    build_simple_index(tmp / "index", [make_wheel(tmp / "dist", "torch", "2.14.1"),
                                       make_sdist(tmp / "dist", "flash-attn", "2.8.3.post2")])
    project = tmp / "conda"
    (project / "envs").mkdir(parents=True)
    shutil.copy(ROOT / "envs" / "base.yaml", project / "envs" / "base.yaml")
    return project, channel


def conda_jobs(tmp: Path, project: Path, channel: Path, index: str, baseline: Path | None) -> tuple[dict, list[Path]]:
    """The conda row's jobs: a CUDA 13.0 line of two platforms on the replica channel, locked by the toolkit and
    solved + written by py-rattler; and the toolkit's files (compared with its first run's)."""
    (project / "envs" / "cu130.yaml").write_text(
        f'extends: base\ncuda: "13.0"\npython: "3.12"\ngcc: 14\nplatforms: [linux-64, linux-aarch64]\n'
        f'channels: [{channel.as_uri()}]\npip_packages: null\ntorch: {{version: "2.14.1", index: "{index}/simple"}}\n'
        f'archs: ["90"]\n')
    from toolkit.env.pypi_lock import uv_executable

    request = conda_request(load_spec(project / "envs" / "cu130.yaml"))
    job = tmp / "rattler-job.json"
    job.write_text(json.dumps({"channels": list(request.channels), "specs": list(request.specs),
                               "platforms": list(request.platforms), "virtual_packages": request.virtual_packages}))
    (tmp / "rattler-lock.py").write_text(RATTLER_LOCK)
    # the same job as the toolkit's: the solve and lock file, then the pip layer's two resolves per platform
    uv_dir = tmp / "uv-conda"
    uv_dir.mkdir()
    (uv_dir / "requirements.in").write_text("torch==2.14.1\n")
    compiles = [f"{uv_executable()} pip compile --quiet --no-config --generate-hashes --python {sys.executable} "
                f"--python-version 3.12 --python-platform {machine}-manylinux_2_28 --index-url {index}/simple "
                f"{form} --output-file {output} requirements.in"
                for machine in ("x86_64", "aarch64")
                for form, output in (("", f"{machine}.txt"), ("--format pylock.toml", f"pylock.{machine}.toml"))]
    rattler = [sys.executable, str(tmp / "rattler-lock.py"), str(job), str(tmp / "rattler.lock")]
    jobs = {
        "toolkit": ([sys.executable, "-m", "toolkit", "lock", "cu130", "--force", "--engine", "rattler", "--pypi",
                     f"{index}/simple", "--envs", str(project / "envs"), "--locks", str(project / "locks")], ROOT),
        "py-rattler": (rattler, tmp),
        "py-rattler + uv": (["sh", "-c", " && ".join([" ".join(rattler), *compiles])], uv_dir),
    }
    names = ["cu130.conda-lock.yml", "cu130.linux-64.requirements.txt", "cu130.linux-aarch64.requirements.txt"]
    files = [project / "locks" / name for name in names]
    if baseline:
        command = jobs["toolkit"][0]
        jobs["toolkit before"] = ([*command[:-1], str(project / "locks-before")], baseline)
        files += [project / "locks-before" / name for name in names]
    return jobs, files


def run_rows(rows: dict[str, dict[str, tuple[list[str], Path]]], repeat: int,
             scratch: Scratch) -> dict[str, dict[str, list[Run]]]:
    """Every job of every row `repeat` times, the row's jobs in turn, the first one rotating each round."""

    def job(row: str, name: str, command: list[str], cwd: Path) -> Callable[[int], Run]:
        def each(_turn: int) -> Run:
            done = scratch.measured(command, cwd)
            print(f"  {row:6s} {name:12s} {done.wall_s:6.2f} s wall {done.cpu_s:6.2f} s CPU", flush=True)
            return done
        return each

    return alternating({row: {name: job(row, name, *jobs[name]) for name in jobs} for row, jobs in rows.items()},
                       repeat)


def seconds(run: Run) -> dict[str, float]:
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s}


def unchanged(paths: list[Path], before: dict[Path, bytes]) -> bool:
    changed = [path for path in paths if path.read_bytes() != before[path]]
    for path in changed:
        print(f"CHANGED: {path}")
    return not changed


def bench_ratios(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from conda_channel import serve_directory

    with tempfile.TemporaryDirectory(prefix="bench-lock-") as folder:
        tmp = Path(folder)
        scratch = Scratch(tmp)
        for checkout in (ROOT, args.baseline or ROOT):  # the bytecode each side runs, as installed
            scratch.measured([sys.executable, "-c",
                              "import toolkit.env.lock, toolkit.cache.runtime_lock, conda_lock, rattler"], checkout)
        pypi, pypi_files = pypi_row(tmp, RATIOS_PYPI_LINE, args.baseline)
        committed = {path: (ROOT / "locks" / path.name).read_bytes() for path in pypi_files}
        project, channel = conda_inputs(tmp)
        with serve_directory(tmp / "index") as index:
            conda, conda_files = conda_jobs(tmp, project, channel, index, args.baseline)
            for jobs in (pypi, conda):  # warm: uv's cache, the toolkit's first conda lock (its bytes kept below)
                for command, cwd in jobs.values():
                    scratch.measured(command, cwd)
            first = {path: conda_files[i % 3].read_bytes() for i, path in enumerate(conda_files)}
            times = run_rows({"pypi": pypi, "conda": conda}, args.repeat, scratch)
        same = {"pypi": unchanged(pypi_files, committed), "conda": unchanged(conda_files, first)}
    medians = {row: {job: seconds(median(runs)) for job, runs in jobs.items()} for row, jobs in times.items()}
    goals = {"pypi": ("uv", 2.0), "conda": ("py-rattler", 3.0)}
    results = {}
    for row, (library, goal) in goals.items():
        toolkit, other = medians[row]["toolkit"], medians[row][library]
        results[row] = {"medians": medians[row], "runs": as_pairs(times[row]), "library": library, "goal_ratio": goal,
                        "wall_ratio": toolkit["wall_s"] / other["wall_s"], "cpu_ratio": toolkit["cpu_s"] / other["cpu_s"],
                        "locks_unchanged": same[row]}
        for job in medians[row]:
            if job not in ("toolkit", library):
                results[row][f"wall_ratio_vs {job}"] = toolkit["wall_s"] / medians[row][job]["wall_s"]
                results[row][f"cpu_ratio_vs {job}"] = toolkit["cpu_s"] / medians[row][job]["cpu_s"]
    for row, result in results.items():
        print(f"{row}: " + " | ".join(f"{job} {m['wall_s']:.2f} s wall {m['cpu_s']:.2f} s CPU"
                                      for job, m in result["medians"].items()))
        verdict = "met" if result["wall_ratio"] <= result["goal_ratio"] else "MISSED"
        print(f"{row}: toolkit / {result['library']}: {result['wall_ratio']:.2f}x wall, {result['cpu_ratio']:.2f}x CPU "
              f"(goal <= {result['goal_ratio']:.0f}x: {verdict}); the toolkit's locks "
              f"{'unchanged' if result['locks_unchanged'] else 'CHANGED'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = run_metadata("lock.py", sys.argv[1:], repeat=args.repeat)
        (args.out / "results.json").write_text(json.dumps({**meta, "rows": results}, indent=1) + "\n")
        plot(results, args.out / "lock.png")
    return 0 if all(same.values()) else 1


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, measure in zip(axes, ("wall_s", "cpu_s")):
        for row_index, result in enumerate(results.values()):
            jobs = list(result["medians"])
            for job_index, job in enumerate(jobs):
                x = row_index + (job_index - (len(jobs) - 1) / 2) * 0.25
                ax.bar(x, result["medians"][job][measure], 0.23, color=f"C{job_index}")
                ax.text(x, result["medians"][job][measure], job, ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks(range(len(results)), [f"{row} ({r['wall_ratio']:.2f}x wall, {r['cpu_ratio']:.2f}x CPU)"
                                            for row, r in results.items()], fontsize=8)
        ax.set_ylabel(f"{'wall' if measure == 'wall_s' else 'CPU'} seconds (median)")
    fig.suptitle("toolkit lock against uv pip compile / py-rattler solve + lock file")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="filler records (default 100000)")
    parser.add_argument("--line", default="cu126", help="the line whose conda layer is solved (default cu126)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pypi", metavar="LINE", help="measure a pypi line's lock against PyPI instead (py-cu132)")
    parser.add_argument("--ratios", action="store_true",
                        help="the lock rows: toolkit lock against uv pip compile and py-rattler (see above)")
    parser.add_argument("--repeat", type=int, default=3, help="with --ratios: rounds (medians reported)")
    parser.add_argument("--out", type=Path, help="with --ratios: folder for results.json and lock.png")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="with --ratios: a checkout of the toolkit before (git archive of a commit), run as the "
                             "job `toolkit before` of each row; its locks must be the same bytes too")
    args = parser.parse_args()
    if args.pypi:
        bench_pypi(args.pypi)
        return
    if args.ratios:
        code = bench_ratios(args)
        sys.stdout.flush()
        os._exit(code)
    spec = load_spec(Workspace(envs=ROOT / Workspace.envs).spec_file(args.line))
    with tempfile.TemporaryDirectory(prefix="bench-channel-") as tmp:
        channel = Path(tmp) / "channel"
        started = time.perf_counter()
        total = write_channel(channel, args.records, args.seed)
        print(f"synthetic channel: {total:,} records written in {time.perf_counter() - started:.1f} s")
        request = conda_request(spec)
        request = type(request)(**{**request.__dict__, "channels": (channel.as_uri(),), "platforms": (PLATFORM,)})
        results = []
        started = time.perf_counter()
        records = rattler_solve(request.channels, request.specs, PLATFORM, request.virtual_packages[PLATFORM])
        results.append(("py-rattler (embedded)", time.perf_counter() - started, len(records)))
        exe = conda_executable()
        if exe:
            started = time.perf_counter()
            layer = CondaLockEngine(exe, Console(stderr=True, highlight=False)).solve(request)
            results.append((f"conda-lock + {Path(exe).name}", time.perf_counter() - started, len(layer.entries)))
        print(f"line {args.line}: {len(request.specs)} specs, platform {PLATFORM}, __cuda={spec.cuda}")
        print(f"{'backend':<28}{'solve (s)':>10}{'packages':>10}")
        for name, seconds, count in results:
            print(f"{name:<28}{seconds:>10.2f}{count:>10}")
        if not exe:
            print("conda-lock + micromamba/mamba/conda: not available on this machine (none on PATH)")
        embedded = results[0][1]
        verdict = "meets" if embedded < TARGET_SECONDS else "MISSES"
        print(f"embedded solver {verdict} the {TARGET_SECONDS:.0f} s target ({embedded:.2f} s for {total:,} records)")
    sys.stdout.flush()
    os._exit(0)  # py-rattler can crash at interpreter exit (docs/conda-offline.md)


if __name__ == "__main__":
    main()

"""Benchmark (not a test): solve time of one line's conda layer against a conda-forge-sized channel.

conda-forge cannot be reached here, so the channel is synthetic: at least 100,000 repodata records with
conda-forge's shape. The toolchain packages a line asks for (python, cuda-version with its __cuda
constraint, cuda-nvcc, cuda-cudart-dev, gxx, ninja, pip) come in many versions and builds, python
depends on a web of library packages, and filler packages depend on each other with version ranges,
so the solver has real choices to make. Only repodata is written (solving reads nothing else).

    python bench/lock.py                      # 100,000 records, the cu126 line, every backend available
    python bench/lock.py --records 2000 --line cu130
    python bench/lock.py --pypi py-cu132      # a pypi line's pip layer against PyPI: seconds and bytes downloaded

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
import socket
import socketserver
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from toolkit.base.workspace import Workspace  # noqa: E402
from toolkit.env.engine import CondaLockEngine, conda_executable, rattler_solve  # noqa: E402
from toolkit.env.lock import conda_request  # noqa: E402
from toolkit.env.pypi_lock import tomllib  # noqa: E402 - tomllib, or tomli on python 3.10
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="filler records (default 100000)")
    parser.add_argument("--line", default="cu126", help="the line whose conda layer is solved (default cu126)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pypi", metavar="LINE", help="measure a pypi line's lock against PyPI instead (py-cu132)")
    args = parser.parse_args()
    if args.pypi:
        bench_pypi(args.pypi)
        return
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
            results.append((f"conda-lock + {Path(exe).name}", time.perf_counter() - started, len(layer.packages)))
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

"""A local conda channel of real archives, for tests that solve, lock and install offline.

conda-forge cannot be reached from the development and CI machines, so tests build a small channel
whose packages carry the real names and dependency shapes of the CUDA toolchain (`cuda-version` with
its `__cuda` constraint, `cuda-nvcc`, `cuda-cudart-dev`, `gxx`, `gxx_linux-64`, `python`, `ninja`, `pip`).
The archives are real `.conda` and `.tar.bz2` files made by conda-package-handling and indexed by
py-rattler, byte-reproducible (fixed mtimes and zip dates) so golden files can hold their hashes.

Reusable by any end-to-end test:
    channel = build_channel(tmp_path / "channel", toolchain_packages())
    with serve_directory(channel) as url: ...   # the same channel over loopback http
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FIXED_MTIME = 1_700_000_000  # 2023-11-14, any fixed value makes archives reproducible
ZIP_DATE = (2023, 11, 14, 0, 0, 0)
PREFIX_PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"  # what conda-build writes into prefix-relocated files
ARCH = {"linux-64": "x86_64", "linux-aarch64": "aarch64"}
COMPRESSION_LEVEL = 1  # zstd level of .conda archives: the replica's payload is ~250 MB of real binaries


@dataclass(frozen=True)
class FixturePackage:
    """One archive: its index.json fields and the files it installs (text; bin/* made executable)."""

    name: str
    version: str
    build: str
    subdir: str  # "noarch" or a platform
    depends: tuple[str, ...] = ()
    constrains: tuple[str, ...] = ()
    noarch: str | None = None  # "generic" or "python" for noarch packages
    files: dict[str, str] = field(default_factory=dict)
    prefix_files: tuple[str, ...] = ()  # files whose PREFIX_PLACEHOLDER the installer replaces
    archive: str = ".conda"  # or ".tar.bz2"
    build_number: int = 0
    disk_files: dict[str, str] = field(default_factory=dict)  # path in the package -> real file on this machine
    links: dict[str, str] = field(default_factory=dict)  # path in the package -> relative symlink target
    about: str = ""  # info/about.json summary (the replica says there where each payload comes from)

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}{self.archive}"


def build_channel(directory: Path, packages: Iterable[FixturePackage]) -> Path:
    """Write every package's archive under directory/<subdir>/ and index the channel; returns directory."""
    from conda_package_handling import api

    directory = Path(directory)
    for subdir in ("noarch", *ARCH):
        (directory / subdir).mkdir(parents=True, exist_ok=True)
    for package in packages:
        staging = directory / ".staging" / package.filename
        relative = _stage(package, staging)
        out = directory / package.subdir / package.filename
        out.unlink(missing_ok=True)
        api.create(str(staging), relative, str(out), compression_level=COMPRESSION_LEVEL)
        if package.archive == ".conda":
            _fix_zip_dates(out)
    _remove_tree(directory / ".staging")
    index_channel(directory)
    return directory


def index_channel(directory: Path) -> None:
    """repodata.json for every subdir, by py-rattler's indexer in its own interpreter.

    A separate process: py-rattler starts a tokio runtime, and a test process that later forks or
    spawns solver workers is safer without one (see shared/docs/conda-offline.md)."""
    code = ("import asyncio, os, sys; from rattler.index import index_fs; "
            "asyncio.run(index_fs(sys.argv[1], write_zst=False, write_shards=False, force=True)); "
            "sys.stdout.flush(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True)


def _stage(package: FixturePackage, staging: Path) -> list[str]:
    """Lay out the package's files and info/ in staging; returns the archive's member list."""
    _remove_tree(staging)
    info = staging / "info"
    info.mkdir(parents=True)
    paths = []
    contents = {**{r: text.encode() for r, text in package.files.items()},
                **{r: Path(source) for r, source in package.disk_files.items()}}
    for relative, data in sorted(contents.items()):
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, Path):
            shutil.copyfile(data, target)
            executable = os.access(data, os.X_OK)
        else:
            target.write_bytes(data)
            executable = relative.startswith(("bin/", "python-scripts/"))
        if executable:
            target.chmod(0o755)
        entry = {"_path": relative, "path_type": "hardlink", "sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
                 "size_in_bytes": target.stat().st_size}
        if relative in package.prefix_files:
            entry.update(file_mode="text", prefix_placeholder=PREFIX_PLACEHOLDER)
        paths.append(entry)
    for relative, link_target in sorted(package.links.items()):
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link_target, staging / relative)
        paths.append({"_path": relative, "path_type": "softlink",
                      "sha256": hashlib.sha256(link_target.encode()).hexdigest(), "size_in_bytes": len(link_target)})
    paths.sort(key=lambda entry: entry["_path"])
    index = {
        "name": package.name, "version": package.version, "build": package.build,
        "build_number": package.build_number, "depends": list(package.depends),
        "constrains": list(package.constrains), "subdir": package.subdir, "license": "BSD-3-Clause",
        "timestamp": FIXED_MTIME * 1000,
        **({"noarch": package.noarch} if package.noarch else
           {"arch": ARCH[package.subdir], "platform": "linux"}),
    }
    (info / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    (info / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}, indent=2, sort_keys=True))
    (info / "about.json").write_text(json.dumps({"summary": package.about or f"test fixture of {package.name}"}))
    if package.prefix_files:
        (info / "has_prefix").write_text("".join(f"{PREFIX_PLACEHOLDER} text {p}\n" for p in package.prefix_files))
    members = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file() or p.is_symlink())
    for path in [*staging.rglob("*"), staging]:
        os.utime(path, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
    return members


def _fix_zip_dates(path: Path) -> None:
    """Rewrite a .conda (a zip) with fixed entry dates: zipfile stamps the current time."""
    with zipfile.ZipFile(path) as source:
        entries = [(info.filename, source.read(info)) for info in source.infolist()]
    temporary = path.with_suffix(".tmp")
    with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_STORED) as target:
        for name, data in entries:
            target.writestr(zipfile.ZipInfo(name, date_time=ZIP_DATE), data)
    temporary.replace(path)


def _remove_tree(path: Path) -> None:
    if path.exists():
        for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        path.rmdir()


def tamper(archive: Path) -> None:
    """Change one byte inside an archive's payload so its sha256 no longer matches the lock."""
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))


# ---------------------------------------------------------------- the toolchain, shaped like conda-forge's


def _per_platform(platforms: Iterable[str], make) -> list[FixturePackage]:
    return [make(platform) for platform in platforms]


def cuda_packages(cuda: str, full: str, max_gcc: int, platforms: Iterable[str]) -> list[FixturePackage]:
    """cuda-version X.Y (constraining __cuda, as conda-forge's does) and the nvcc/cudart of that line;
    nvcc constrains the host gcc to what its host_config.h accepts."""
    major = cuda.split(".")[0]
    upper = f"{major}.{int(cuda.split('.')[1]) + 1}.0a0"
    pin = f"cuda-version >={cuda},<{upper}"
    packages = [FixturePackage(
        "cuda-version", cuda, "h0_3", "noarch", noarch="generic", archive=".tar.bz2",
        constrains=(f"__cuda >={major}", f"cudatoolkit {cuda}|{cuda}.*"))]
    for platform in platforms:
        packages += [
            FixturePackage("cuda-cudart", full, "h0_0", platform, depends=(pin, "libgcc >=12"),
                           files={"lib/libcudart.so.fixture": f"cudart {full}\n"}),
            FixturePackage("cuda-cudart-dev", full, "h0_0", platform, depends=(pin, f"cuda-cudart {full} h0_0"),
                           files={"include/cuda_runtime.h": f"/* CUDA runtime {full} (fixture) */\n"}),
            FixturePackage(
                "cuda-nvcc", full, "h0_0", platform,
                depends=(pin, f"cuda-cudart-dev {full}.*"),
                constrains=(f"gcc_impl_{platform} >=6,<{max_gcc + 1}.0a0",),
                files={"bin/nvcc": f"#!/bin/sh\necho 'Cuda compilation tools, release {cuda}, V{full}'\n",
                       "etc/nvcc.profile": f"TOP = {PREFIX_PLACEHOLDER}\n"},
                prefix_files=("etc/nvcc.profile",)),
            *(FixturePackage(name, full, "h0_0", platform, depends=(pin,),
                             files={f"targets/{ARCH[platform]}-linux/include/{header}": f"/* {name} (fixture) */\n"})
              for name, header in (("libcublas-dev", "cublas_v2.h"), ("libcusparse-dev", "cusparse.h"),
                                   ("libcusolver-dev", "cusolverDn.h"))),
        ]
    return packages


def compiler_packages(gcc: str, platforms: Iterable[str]) -> list[FixturePackage]:
    """gxx -> gxx_impl_<platform> -> gcc_impl_<platform> -> sysroot, and the gxx_<platform> activation package."""
    major = gcc.split(".")[0]
    packages = []
    for platform in platforms:
        packages += [
            FixturePackage("libgcc", gcc, "h0_1", platform, depends=("__glibc >=2.17,<3.0.a0",),
                           files={"lib/libgcc_s.so.fixture": f"libgcc {gcc}\n"}),
            FixturePackage(f"gcc_impl_{platform}", gcc, "h0_1", platform,
                           depends=(f"libgcc >={gcc}", f"sysroot_{platform} >=2.17"),
                           files={f"bin/{ARCH[platform]}-conda-linux-gnu-gcc": f"#!/bin/sh\necho gcc {gcc}\n"}),
            FixturePackage(f"gxx_impl_{platform}", gcc, "h0_1", platform,
                           depends=(f"gcc_impl_{platform} {gcc} h0_1",),
                           files={f"bin/{ARCH[platform]}-conda-linux-gnu-g++": f"#!/bin/sh\necho g++ {gcc}\n"}),
            FixturePackage("gxx", gcc, "h0_1", platform, depends=(f"gxx_impl_{platform} {gcc}.*",),
                           files={"bin/g++": f"#!/bin/sh\necho 'g++ (conda-forge gcc {gcc}) {gcc}'\n"}),
            FixturePackage(f"gxx_{platform}", gcc, "h0_1", platform,
                           depends=(f"gxx_impl_{platform} {major}.*", f"sysroot_{platform}")),
        ]
    return packages


def base_packages(python: str, platforms: Iterable[str]) -> list[FixturePackage]:
    """python, pip (noarch: python) and ninja, plus the sysroot the compilers sit on.

    The fixture's python is a test double (no CPython build fits in a fixture): `bin/python` runs the
    interpreter named by $FIXTURE_PYTHON, so the pip layer can be installed into the prefix for real."""
    minor = ".".join(python.split(".")[:2])
    packages = [FixturePackage("pip", "24.2", "pyh0_0", "noarch", noarch="python", archive=".tar.bz2",
                               depends=("python >=3.8",),
                               files={"site-packages/pip/__init__.py": '__version__ = "24.2"\n'})]
    for platform in platforms:
        packages += [
            FixturePackage(f"sysroot_{platform}", "2.28", "h0_0", "noarch", noarch="generic", archive=".tar.bz2",
                           depends=("__glibc >=2.28",),
                           files={f"{ARCH[platform]}-conda-linux-gnu/sysroot/README": "glibc 2.28\n"}),
            FixturePackage("python", python, "h0_0_cpython", platform,
                           depends=("__glibc >=2.17,<3.0.a0", "libgcc >=12"),
                           files={f"bin/python{minor}": '#!/bin/sh\nexec "${FIXTURE_PYTHON:-python3}" "$@"\n',
                                  "bin/python": '#!/bin/sh\nexec "${FIXTURE_PYTHON:-python3}" "$@"\n',
                                  f"lib/python{minor}/site-packages/README.txt": "site-packages\n"}),
            FixturePackage("ninja", "1.12.1", "h0_0", platform, depends=("libgcc >=12",),
                           files={"bin/ninja": "#!/bin/sh\necho 1.12.1\n"}),
        ]
    return packages


def toolchain_packages(platforms: Iterable[str] = ("linux-64", "linux-aarch64")) -> list[FixturePackage]:
    """A CUDA 12.6 and 13.0 toolchain, gcc 12/13, python 3.11/3.12: enough for a line to choose from."""
    platforms = tuple(platforms)
    packages = (cuda_packages("12.6", "12.6.85", 13, platforms) + cuda_packages("13.0", "13.0.88", 15, platforms)
                + compiler_packages("12.4.0", platforms) + compiler_packages("13.3.0", platforms)
                + base_packages("3.11.10", platforms) + base_packages("3.12.7", platforms))
    unique: dict[tuple[str, str, str, str], FixturePackage] = {}
    for package in packages:
        unique.setdefault((package.subdir, package.name, package.version, package.build), package)
    return list(unique.values())


# ---------------------------------------------------------------- a PyPI-style index


def _write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=ZIP_DATE), data)
    return path


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real (tiny) pure-Python wheel: a module, METADATA, WHEEL and a RECORD pip checks."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{dist_info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                          *(f"Requires-Dist: {r}\n" for r in requires)]).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fa-envkit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={_urlsafe_digest(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    return _write_zip(directory / f"{module}-{version}-py3-none-any.whl", files)


def _urlsafe_digest(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_sdist(directory: Path, name: str, version: str) -> Path:
    """A source archive with PKG-INFO, enough for a hash pin (a stand-in for the real flash-attn sdist)."""
    import io
    import tarfile

    base = f"{name.replace('-', '_')}-{version}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base}.tar.gz"
    data = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size, info.mtime = len(data), FIXED_MTIME
        archive.addfile(info, io.BytesIO(data))
    return path


def build_simple_index(directory: Path, files: Iterable[Path], upload_times: dict[str, str] | None = None) -> Path:
    """A PEP 503 (HTML) + PEP 691 (JSON) simple index of the given files under directory/simple; with
    `upload_times` (file name -> RFC 3339 time), each file's PEP 700 upload-time, which uv's --exclude-newer reads."""
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

    projects: dict[str, list[Path]] = {}
    for path in files:
        name = parse_wheel_filename(path.name)[0] if path.suffix == ".whl" else parse_sdist_filename(path.name)[0]
        projects.setdefault(canonicalize_name(name), []).append(path)
    simple = Path(directory) / "simple"
    for project, paths in projects.items():
        page = simple / project
        page.mkdir(parents=True, exist_ok=True)
        entries = []
        for path in paths:
            (page / path.name).write_bytes(path.read_bytes())
            entries.append({"filename": path.name, "url": path.name,
                            "hashes": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
                            **({"upload-time": upload_times[path.name]} if upload_times else {})})
        links = "".join(f'<a href="{e["url"]}#sha256={e["hashes"]["sha256"]}">{e["filename"]}</a>\n' for e in entries)
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1" if upload_times else "1.0"},
                                                     "name": project,
                                                     "files": entries}))
    return simple


# ---------------------------------------------------------------- loopback http


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files; a directory's index.json for clients asking for PEP 691 JSON."""

    def send_head(self):
        if "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", ""):
            candidate = Path(self.translate_path(self.path)) / "index.json"
            if candidate.is_file():
                data = candidate.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                import io

                return io.BytesIO(data)
        return super().send_head()

    def log_message(self, format: str, *args) -> None:
        pass


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve a channel or index directory on 127.0.0.1 (a free port); yields its http:// URL."""
    handler = functools.partial(_Handler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _RecordingHandler(http.server.SimpleHTTPRequestHandler):
    """Static files; every GET or HEAD's path is appended to the server's `requested`."""

    def send_head(self):  # type: ignore[no-untyped-def]
        self.server.requested.append(self.path)  # type: ignore[attr-defined]
        return super().send_head()

    def log_message(self, format: str, *args) -> None:
        pass


@contextlib.contextmanager
def serve_recording(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """`directory` on 127.0.0.1 (a free port); yields its http:// URL and the paths clients asked for, in order."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_RecordingHandler, directory=str(directory)))
    server.requested = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.requested  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def file_url(directory: Path) -> str:
    return Path(directory).resolve().as_uri()


__all__ = ["FixturePackage", "build_channel", "index_channel", "serve_directory", "serve_recording", "file_url", "tamper",
           "toolchain_packages", "cuda_packages", "compiler_packages", "base_packages", "make_wheel", "make_sdist",
           "build_simple_index", "write_project", "pip_index_files", "channel_dir", "pip_index", "isolated_caches"]


# ---------------------------------------------------------------- a project laid out like the repo, for end-to-end tests

LINE_SPEC = """extends: base
cuda: "{cuda}"
python: "3.11"
gcc: 13
platforms: [linux-64, linux-aarch64]
channels: [{channel}]
pip_packages: null
torch:
  version: "2.9.1"
  index: {index}
archs: ["80", "90"]
{extra}"""


def write_project(root: Path, channel: str, index: str, line: str = "cu126", cuda: str = "12.6",
                  extra: str = "") -> Path:
    """root/envs/{base,<line>}.yaml (base.yaml is the repo's own): a line whose conda layer comes from
    the fixture channel and whose torch (and PyPI) is the fixture index. Returns the envs folder."""
    envs = Path(root) / "envs"
    envs.mkdir(parents=True, exist_ok=True)
    (envs / "base.yaml").write_text((Path(__file__).resolve().parent.parent / "envs" / "base.yaml").read_text())
    (envs / f"{line}.yaml").write_text(LINE_SPEC.format(cuda=cuda, channel=channel, index=index, extra=extra))
    return envs


def pip_index_files(directory: Path) -> list[Path]:
    """A tiny torch wheel (a test double of the 2 GB one) and a flash-attn sdist stand-in."""
    return [make_wheel(directory, "torch", "2.9.1"), make_sdist(directory, "flash-attn", "2.8.3.post2")]


@pytest.fixture(scope="session")
def channel_dir(tmp_path_factory) -> Path:
    return build_channel(tmp_path_factory.mktemp("conda") / "channel", toolchain_packages())


@pytest.fixture(scope="session")
def pip_index(tmp_path_factory) -> Iterator[str]:
    """The fixture index over loopback http; yields its simple-index URL."""
    root = tmp_path_factory.mktemp("pypi")
    build_simple_index(root, pip_index_files(root / "dist"))
    with serve_directory(root) as url:
        yield f"{url}/simple"


@pytest.fixture
def isolated_caches(tmp_path, monkeypatch) -> Path:
    """Fresh download cache; the fixture python delegates to this interpreter (see base_packages)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FIXTURE_PYTHON", sys.executable)
    return tmp_path / "cache"

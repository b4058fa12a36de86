"""The pip layer of a `pypi` line: torch and NVIDIA's CUDA wheels resolved by uv into PEP 751 pylock.toml.

uv resolves from metadata alone (PEP 658 files, else HTTP range reads of the wheel's zip), so locking torch and
the CUDA toolchain downloads a few MB, never the wheels. What it is asked comes from
toolkit/knowledge/pypi_cuda.yaml: torch==<the line's torch>, cuda-toolkit[<extras>]==<release>, and as
constraints the components the extras leave floating (nvjitlink, cuda-bindings), so the lock is one CUDA
release. The pylock is committed as written; the conda-lock file's pip entries are read from it (one wheel per
package, the one the target installs), so both name the same files and hashes.
"""

from __future__ import annotations

import functools
import hashlib
import io
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import unquote

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10 reads TOML through tomli (a dependency there)
    import tomli as tomllib

from toolkit.base.children import kill_group, popen_tied, run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.env.lock_document import LockEntry
from toolkit.env.lockfile import conda_lock_modules_only
from toolkit.env.wheels import MACHINES, target_markers
from toolkit.knowledge.facts import PypiCuda
from toolkit.spec.envspec import EnvSpec

if TYPE_CHECKING:
    from packaging.pylock import Pylock

    from toolkit.env.wheels import WheelMetadata

METADATA_WORKERS = (
    16  # wheels whose METADATA is read side by side: a few requests each, latency is their cost
)
RANGE_BYTES = 256 << 10  # read from a remote wheel per request
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # a lock's exclude-newer time


def import_readers() -> None:
    """What reads uv's resolution (packaging's pylock and requirements, the wheels' zip directories: 0.02-0.03 s),
    imported while uv resolves, when this process has nothing else to do, rather than after, where the lock
    waits for it (or while a conda line solves, where the sdist pin and rich's import already keep it busy)."""
    import zipfile  # noqa: F401

    import packaging.pylock
    import packaging.requirements  # noqa: F401


def uv_executable() -> str:
    """The uv that resolves pip layers: the `uv` package's binary (a declared dependency), else uv on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise ToolkitError(
                "uv: not installed (it resolves pip layers for other platforms and pythons: "
                "pip install uv)"
            ) from None
        return found


@functools.cache
def uv_version(uv: str) -> str:
    return run_tied([uv, "--version"], leaf=True, capture_output=True, text=True).stdout.split()[1]


def uv_complaint(output: str) -> str:
    """uv's reason in one line: the `cause:` (or `╰─▶`) text after "No solution found", joined, rather than
    the first line naming an error, which only says that resolving failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith(("cause:", "╰─▶")):
            cause = [line.removeprefix("cause:").removeprefix("╰─▶").strip()]
            cause += [
                rest.lstrip("│ ").strip()
                for rest in lines[index + 1 :]
                if not rest.startswith(("hint:", "help:"))
            ]
            head = next((e for e in lines[:index] if "error" in e.lower() or e.startswith("×")), "")
            head = head.removeprefix("error:").lstrip("× ").strip()
            return f"{head}: {' '.join(cause)}" if head else " ".join(cause)
    return next(
        (line.removeprefix("error:").strip() for line in lines if "error" in line.lower()),
        lines[-1] if lines else "no output",
    )


class UvFailed(ToolkitError):
    """uv could not resolve (its reason in one line), as opposed to a check made while it ran."""


@dataclass(frozen=True)
class Compile:
    """One `uv pip compile requirements.in` in `workdir`, for CPython `python` on `python_platform`, into
    `output` (`options`: the indexes, constraints and format that lock takes)."""

    workdir: Path
    python: str
    python_platform: str
    options: tuple[str, ...]
    output: str


def uv_compile(
    uv: str,
    python: str,
    python_platform: str,
    options: list[str],
    output: str,
    command: str,
    workdir: Path,
    what: str,
    env: dict[str, str],
) -> None:
    """`uv pip compile requirements.in` in workdir for one target python and platform (uv_compile_all)."""
    uv_compile_all(
        uv, [Compile(workdir, python, python_platform, tuple(options), output)], command, what, env
    )


def uv_compile_all(
    uv: str,
    compiles: list[Compile],
    command: str,
    what: str,
    env: dict[str, str],
    meanwhile: Callable[[], object] = lambda: None,
) -> None:
    """Each `uv pip compile`, hash-pinned, reading no uv config and downloading no python: the one way each lock
    the toolkit writes asks uv (`command`: what the file says to run again). They run side by side (all started,
    then each awaited: one's waits on the index overlap another's); the first that fails, in order, is raised.
    `meanwhile` runs while they do (a check of what they read): should it raise, they are stopped.

    `--python` names the toolkit's own interpreter: the target is --python-version/--python-platform whatever
    runs uv, and without it uv searches PATH for one, running every pyenv shim there (2-4 s of a 0.05 s
    resolve on a machine with pyenv); the files written are the same."""
    import subprocess
    from contextlib import ExitStack

    running: list[subprocess.Popen] = []
    # each process's pipes are closed however this ends (Popen's __exit__, which waits: it has ended by then)
    with ExitStack() as started:
        try:
            for job in compiles:
                argv = [
                    uv,
                    "pip",
                    "compile",
                    "--quiet",
                    "--no-config",
                    "--no-python-downloads",
                    "--generate-hashes",
                    *(["--python", sys.executable] if sys.executable else []),
                    "--python-version",
                    job.python,
                    "--python-platform",
                    job.python_platform,
                    *job.options,
                    "--custom-compile-command",
                    command,
                    "--output-file",
                    job.output,
                    "requirements.in",
                ]
                running.append(
                    started.enter_context(
                        popen_tied(
                            argv,
                            leaf=True,
                            cwd=job.workdir,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                            env=env,
                        )
                    )
                )
            meanwhile()
            outputs = [process.communicate() for process in running]
        except (
            BaseException
        ):  # an interruption, a uv that cannot start, `meanwhile`'s error: none is left running
            for process in running:
                kill_group(process)
            raise
    for process, (stdout, stderr) in zip(running, outputs):
        if process.returncode != 0:
            raise UvFailed(f"{what} failed: {uv_complaint(stderr + stdout)}")


def run_uv(command: list[str], workdir: Path, what: str, env: dict[str, str]) -> None:
    result = run_tied(command, cwd=workdir, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise ToolkitError(f"{what} failed: {uv_complaint(result.stderr + result.stdout)}")


def pypi_inputs(spec: EnvSpec, pypi: PypiCuda) -> tuple[list[str], list[str]]:
    """(requirements, constraints) of a pypi line: torch, the toolkit meta wheel with the build's extras and the
    spec's build dependencies; the line's pins as constraints (they bound, never add, a package)."""
    line = pypi.line(spec.cuda, spec.torch_version)
    if line is None:  # `toolkit check` refuses such a spec first (rules.pypi_torch_pairs_with_cuda)
        raise ToolkitError(
            f"{display_path(spec.path)}: torch {spec.torch_version} pins no cuda-toolkit of CUDA "
            f"{spec.cuda} (`toolkit check {spec.line}` says which torch does)"
        )
    requirements = [
        f"torch=={spec.torch_version}",
        f"cuda-toolkit[{','.join(pypi.extras)}]=={line.cuda_toolkit}",
        *spec.pip_requirements()[1:],
    ]
    return requirements, [f"{name}{pin}" for name, pin in line.pins.items()]


def now_utc() -> str:
    """This moment as the lock records it and uv's --exclude-newer takes it: RFC 3339, UTC, whole seconds."""
    return datetime.now(timezone.utc).strftime(TIME_FORMAT)


def compile_pylock(
    requirements: list[str],
    constraints: list[str],
    python: str,
    python_platform: str,
    index: str,
    workdir: Path,
    output_name: str,
    compile_command: str,
    env: dict[str, str],
    exclude_newer: str,
    meanwhile: Callable[[], object] = lambda: None,
) -> tuple[str, str]:
    """Resolve with `uv pip compile --format pylock.toml --generate-hashes`; returns (the pylock text, how it
    was resolved). `output_name` is the pylock's own file name (uv requires pylock.<name>.toml).

    `exclude_newer` (uv's --exclude-newer, a time like 2026-11-23T21:44:12Z) leaves out every file uploaded
    after it: a re-lock at the lock's own time gives the lock's wheels, whatever the index released since.
    `meanwhile`: uv_compile_all's."""
    uv = uv_executable()
    (workdir / "requirements.in").write_text("\n".join(requirements) + "\n")
    (workdir / "constraints.txt").write_text("\n".join(constraints) + "\n")
    options = (
        "--format",
        "pylock.toml",
        "--index-url",
        index,
        "--constraints",
        "constraints.txt",
        "--exclude-newer",
        exclude_newer,
    )
    uv_compile_all(
        uv,
        [Compile(workdir, python, python_platform, options, output_name)],
        compile_command,
        "uv pip compile",
        env,
        meanwhile,
    )
    resolver = (
        f"uv {uv_version(uv)} (uv pip compile --format pylock.toml --python-platform {python_platform} "
        f"--python-version {python}; constraints: {', '.join(constraints) or 'none'})"
    )
    return (workdir / output_name).read_text(), resolver


def _supported_tags(python: str, platform: str, glibc: str) -> list[Any]:
    """The wheel tags a CPython `python` on manylinux `glibc` accepts, most specific first (pip's order)."""
    from packaging import tags

    machine = MACHINES[platform]
    major, minor = (int(part) for part in glibc.split(".")[:2])
    platforms = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms += [f"{legacy[m]}_{machine}" for m in legacy if m <= minor]
    platforms.append(
        f"linux_{machine}"
    )  # last, as pip ranks it: a wheel built here (a published flash-attn)
    version = tuple(int(part) for part in python.split(".")[:2])
    return [
        *tags.cpython_tags(version, platforms=platforms),
        *tags.compatible_tags(version, platforms=platforms),
    ]


@dataclass(frozen=True)
class PipEntry:
    """A pip entry as `toolkit lock` writes it: one wheel, by URL and sha256, and the locked packages it depends
    on (name -> specifier). Here, not beside the lock's reader (lockfile.py), whose every dataclass each install
    and build pays to create."""

    name: str
    version: str
    platform: str
    url: str
    sha256: str
    dependencies: Mapping[str, str] = field(default_factory=dict)

    def entry(self) -> LockEntry:
        """Its entry in the lock (manager pip, category main)."""
        return LockEntry(
            manager="pip",
            name=self.name,
            version=self.version,
            platform=self.platform,
            url=self.url,
            dependencies=dict(self.dependencies),
            sha256=self.sha256,
        )

    def model(self) -> Any:
        """conda-lock's LockedDependency of it (manager pip, category main): a runtime lock's entry, written by
        conda-lock's own writer (cache/runtime_lock.py)."""
        conda_lock_modules_only()
        from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency

        return LockedDependency(
            name=self.name,
            version=self.version,
            manager="pip",
            platform=self.platform,
            dependencies=dict(self.dependencies),
            url=self.url,
            hash=HashModel(sha256=self.sha256),
            categories={"main"},
        )


@dataclass(frozen=True)
class PylockWheel:
    """The wheel of one pylock package that a target installs: what the lock's pip entry of it must say."""

    name: str  # canonical
    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return unquote(self.url.rsplit("/", 1)[-1])  # %2B: a local +


def read_pylock(text: str, where: str) -> Pylock:
    """A pylock as packaging.pylock validates it (PEP 751: its keys, normalised names, wheel file names that
    match their package); TOML or PEP 751 it is not, one line naming `where`."""
    from packaging.pylock import Pylock, PylockValidationError

    try:
        return Pylock.from_dict(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, PylockValidationError) as exc:
        raise ToolkitError(f"{where}: not a pylock.toml uv wrote ({exc}; lock again)") from None


def pylock_wheels(
    text: str, where: str, platform: str, python: str, glibc: str
) -> list[PylockWheel]:
    """Per package of a pylock that applies to the target, the wheel it installs (the most specific tag the
    target accepts). A package without such a wheel is refused: the layer installs wheels only."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    supported = {tag: rank for rank, tag in enumerate(_supported_tags(python, platform, glibc))}
    markers = target_markers(platform, python)
    chosen = []
    for package in read_pylock(text, where).packages:
        if package.marker is not None and not package.marker.evaluate(markers):
            continue
        if package.version is None:
            raise ToolkitError(
                f"{where}: {package.name} has no version (the layer installs pinned wheels only: "
                f"lock again)"
            )
        ranked = []
        for wheel in package.wheels or []:
            url = wheel.url or ""  # the file the layer downloads, whatever the entry's `name` says
            try:
                file_tags = parse_wheel_filename(unquote(url.rsplit("/", 1)[-1]))[
                    3
                ]  # %2B: a local +
            except InvalidWheelFilename:
                continue
            rank = min((supported[t] for t in file_tags if t in supported), default=None)
            if rank is not None:
                ranked.append((rank, url, wheel.hashes.get("sha256")))
        if not ranked:
            raise ToolkitError(
                f"{where}: {package.name} {package.version} has no wheel for {platform} python "
                f"{python} (the layer installs wheels only: pin a version that has one)"
            )
        _, url, sha256 = min(ranked, key=lambda item: item[0])
        if sha256 is None:
            raise ToolkitError(
                f"{where}: {package.name} {package.version}: {url} has no sha256 (the layer checks "
                f"each wheel's sha256: lock again)"
            )
        chosen.append(PylockWheel(package.name, str(package.version), url, sha256))
    return chosen


def pylock_entries(text: str, where: str, platform: str, python: str, glibc: str) -> list[PipEntry]:
    """The pip entries of a pylock: per package, the wheel this target installs (pylock_wheels), pinned (no
    dependencies: each is installed as one file by URL and sha256)."""
    return [
        PipEntry(wheel.name, wheel.version, platform, wheel.url, wheel.sha256)
        for wheel in pylock_wheels(text, where, platform, python, glibc)
    ]


def wheel_metadata_of(wheels: list[PylockWheel], downloads: Path) -> list[WheelMetadata]:
    """Each wheel's METADATA, in order, read as uv reads it from an index: the wheel's zip directory and METADATA
    member by HTTP range requests (a few hundred kB of a GB wheel), several wheels side by side. From an index
    that serves no ranges (a plain file server, file://), a wheel no larger than one range is the first answer
    itself, any other is downloaded into `downloads`; either is checked against its pinned sha256, as pip did
    (_remote_wheel). Each must name its wheel's package and version."""
    from toolkit.base.worker_pool import WorkerPool

    with WorkerPool(METADATA_WORKERS) as pool:
        return list(pool.map(lambda wheel: _wheel_metadata(wheel, downloads), wheels))


def _wheel_metadata(wheel: PylockWheel, downloads: Path) -> WheelMetadata:
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from toolkit.env.download import fetch_verified
    from toolkit.env.wheels import wheel_metadata

    what = f"{wheel.name} {wheel.version} ({wheel.filename}, for its metadata)"
    remote = _remote_wheel(wheel, what)
    if remote is not None:
        found = wheel_metadata(remote, wheel.url)
    else:
        found = wheel_metadata(fetch_verified(wheel, downloads, what, pinned_by="the index"))
    try:
        same = canonicalize_name(found.name) == wheel.name and Version(found.version) == Version(
            wheel.version
        )
    except InvalidVersion:
        same = False
    if not same:
        raise ToolkitError(
            f"{wheel.url}: its METADATA names {found.name} {found.version}, not {wheel.name} "
            f"{wheel.version} (the index serves another release under that name: lock against a "
            f"trusted index)"
        )
    return found


def _remote_wheel(wheel: PylockWheel, what: str) -> BinaryIO | None:
    """The wheel on its index as a seekable file: read by HTTP range requests (_RemoteFile) where the index serves
    them; where it answers the first with the whole file instead and that is no larger than one range, the file
    itself, checked against its pin (one request, rather than a second download into the cache); None for the
    others (file://, a larger wheel from an index that serves no ranges), which the download cache reads."""
    from toolkit.env.download import sha256_mismatch

    if not wheel.url.startswith(("http://", "https://")):
        return None
    with _get(wheel.url, f"bytes=-{RANGE_BYTES}", what) as response:
        total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
        if response.status == 206 and total.isdigit():
            tail = response.read(RANGE_BYTES)
            return io.BufferedReader(_RemoteFile(wheel.url, what, int(total), tail), RANGE_BYTES)
        length = response.headers.get("Content-Length") or ""
        if response.status != 200 or not length.isdigit() or int(length) > RANGE_BYTES:
            return None
        body = response.read(RANGE_BYTES + 1)
    actual = hashlib.sha256(body).hexdigest()
    if actual != wheel.sha256:
        raise sha256_mismatch(what, actual, wheel, "the index")
    return io.BytesIO(body)


class _RemoteFile(io.RawIOBase):
    """A wheel on an index as a seekable file whose reads are HTTP range requests, its last RANGE_BYTES read at
    once (the zip directory, all of a small wheel): what zipfile needs for one member costs one to three."""

    def __init__(self, url: str, what: str, size: int, tail: bytes) -> None:
        self.url, self.what, self.size, self.tail, self.position = url, what, size, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        tail_start = self.size - len(self.tail)
        if self.position >= tail_start:
            data = self.tail[self.position - tail_start : end - tail_start]
        else:
            with _get(self.url, f"bytes={self.position}-{end - 1}", self.what) as response:
                if response.status != 206:
                    raise ToolkitError(
                        f"{self.url}: answered a range request with HTTP {response.status} after "
                        f"serving ranges (reading {self.what}; lock again)"
                    )
                data = response.read(end - self.position)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def _get(url: str, byte_range: str, what: str) -> Any:
    """The response to a GET of `url` with a Range header; one line naming the URL when there is none."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Range": byte_range})
    try:
        return urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        raise ToolkitError(
            f"{url}: the index answered HTTP {exc.code} (reading {what}; lock again)"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ToolkitError(
            f"{url}: cannot read it ({getattr(exc, 'reason', exc)}; reading {what}; lock again)"
        ) from None

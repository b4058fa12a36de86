"""The conda engines behind one interface: `CondaEngine.solve` (lock) and `CondaEngine.install`.

- `conda-lock`: the conda-lock CLI driving a real micromamba/mamba/conda, where one is on PATH.
- `rattler`: embedded py-rattler (pip-installable, no binary), everywhere else.

Both write the same lock file (conda-lock's unified format, through conda-lock's own models) and both
install all of a lock (conda layer, then pip layer by URL and hash). `choose_engine` turns `--engine`
into an engine once; lock.py and install.py call its methods and never compare engine names. The one
way they differ for the caller is `relocates`: py-rattler builds in a staging folder patched for the
final prefix (install then swaps it in), micromamba/conda write the prefix into files and must build
at the final path.

py-rattler runs in a worker process (toolkit/env/isolated.py). py-rattler and conda-lock are imported
inside functions, so importing this module (reading a lock) needs neither; nor does it import what only one
step uses (the download cache, the archive checks, rich's progress bars, the wheel checks, the YAML writer of
conda-lock's inputs): every install pays for its imports.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from toolkit.base.atomic import checkpoint, owned_dir
from toolkit.base.children import kill_group, popen_tied, run_tied
from toolkit.base.entry import add_option_alias
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace
from toolkit.env.lockfile import (
    CONDA_SUFFIXES,
    LockedEnv,
    LockedPackage,
    brief,
    check_wheel_identity,
    relock_hint,
)
from toolkit.env.rattler_solve import (  # the worker's module (CondaRequest: the engines' input)
    CondaRequest,
    Solved,
    forked_solver,
    rattler_fetch_actions,
    rattler_imports,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from toolkit.env.archives import PackageIdentity
    from toolkit.env.isolated import Prefork
    from toolkit.env.lock_document import LockChannel, LockEntry
    from toolkit.env.rattler_link import VerifiedArchive
    from toolkit.env.wheels import Closure

CONDA_EXECUTABLES = ("micromamba", "mamba", "conda")
ENGINES = (
    "auto",
    "conda-lock",
    "rattler",
)  # --engine of lock and install (--backend before issue 31)


@dataclass(frozen=True)
class CondaLayer:
    """Solved conda packages of every platform as the lock writes them, with conda-lock's content hash."""

    entries: tuple[LockEntry, ...]
    content_hash: dict[str, str]
    channels: tuple[LockChannel, ...]


@dataclass(frozen=True)
class SolvedConda:
    """A conda layer as py-rattler solved it: each platform's FETCH actions, plain data, made into the lock's
    entries (conda_layer) where the lock is written."""

    request: CondaRequest
    actions: dict[str, list[dict]]


def conda_layer(solved: CondaLayer | SolvedConda) -> CondaLayer:
    """The lock's entries of a solved layer (one the conda-lock CLI solved is already made of them)."""
    if isinstance(solved, CondaLayer):
        return solved
    return layer_from_actions(solved.request, solved.actions)


@dataclass(frozen=True)
class PendingSolve:
    """A solve under way (CondaEngine.start_solve): `pythons` waits for it and gives each platform's python
    version (what the pip layer is resolved for, while the layer is made), `layer` gives the layer; `said`
    says what was solved (once; `layer` says it first where the caller did not: the lock says it while uv
    resolves, which then waits for no line); `cancel` ends it (after those, or when the caller stops first: an
    error elsewhere, Ctrl-C)."""

    layer: Callable[[], CondaLayer | SolvedConda]
    pythons: Callable[[], dict[str, str]]
    cancel: Callable[[], None] = lambda: None
    said: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class InstallJob:
    """One lock's environment for one platform: written at `staging`, to be used at `prefix`
    (the same path for an engine that does not relocate)."""

    lock_file: Path
    platform: str
    conda: tuple[LockedPackage, ...]
    pip: tuple[LockedPackage, ...]
    staging: Path
    prefix: Path

    @classmethod
    def of(cls, locked_env: LockedEnv, platform: str, staging: Path, prefix: Path) -> InstallJob:
        """The lock's packages for `platform`, to write at `staging` for use at `prefix`."""
        return cls(
            lock_file=locked_env.path,
            platform=platform,
            staging=staging,
            prefix=prefix,
            conda=tuple(locked_env.packages_for(platform, "conda")),
            pip=tuple(locked_env.packages_for(platform, "pip")),
        )


class CondaEngine(ABC):
    """A conda solver and installer; `relocates`: it can build for `prefix` at another path."""

    relocates: ClassVar[bool]

    def __init__(self, console: Console) -> None:
        self.console = console

    @abstractmethod
    def solve(self, request: CondaRequest) -> CondaLayer:
        """The conda layer of every platform of the request."""

    def solver(self) -> Prefork | None:
        """What solves, started ahead of the request (its imports meanwhile): None where the engine has nothing
        to start. Given back to `start_solve`, or cancelled."""
        return None

    def start_solve(self, request: CondaRequest, solver: Prefork | None = None) -> PendingSolve:
        """The solve of `request` started now, where the engine can run it beside the caller's other work (in
        `solver`, this engine's, started ahead); else it runs when its result is first asked for."""
        layer = functools.cache(lambda: self.solve(request))
        return PendingSolve(
            layer,
            lambda: {p.platform: p.version for p in layer().entries if p.name == "python"},
        )

    def linker(self) -> Prefork | None:
        """What links the conda layer, started ahead of the job (its imports meanwhile): None where the engine
        has nothing to start. Given back to `install`, or cancelled (cancelling after install does nothing)."""
        return None

    @abstractmethod
    def install(self, job: InstallJob, linker: Prefork | None = None) -> None:
        """Both layers of the job into job.staging; one-line ToolkitError when anything is refused. `linker`:
        this engine's, started ahead (else the engine starts what it needs)."""


def conda_executable() -> str | None:
    found = (shutil.which(name) for name in CONDA_EXECUTABLES)
    return next((path for path in found if path), None)


def choose_engine(name: str, conda_exe: str | None, console: Console) -> CondaEngine:
    """auto: the conda-lock CLI where a conda executable exists (given or on PATH), else py-rattler."""
    conda_exe = conda_exe or conda_executable()
    if name == "conda-lock" and not conda_exe:
        raise ToolkitError(
            f"--engine conda-lock: no {'/'.join(CONDA_EXECUTABLES)} on PATH "
            f"(install micromamba, pass --conda EXE, or use --engine rattler)"
        )
    if name in ("auto", "conda-lock") and conda_exe:
        return CondaLockEngine(conda_exe, console)
    return RattlerEngine(console)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """--engine and --conda, declared once for every verb that solves or installs a conda layer. --engine was
    --backend, which now names an attention implementation (`toolkit verify --impl`): the old spelling still works."""
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        metavar="ENGINE",
        help=f"conda engine: {', '.join(ENGINES)} (default auto: conda-lock if micromamba/mamba/conda "
        f"is on PATH, else rattler)",
    )
    add_option_alias(parser, "--backend", "--engine")
    parser.add_argument(
        "--conda", metavar="EXE", help="micromamba/mamba/conda for the conda-lock engine"
    )


def locking_environment() -> dict[str, str]:
    """The environment pip and uv run in: no user or site index configuration, so a lock
    names only PyPI and the line's own index (certificates and proxies still apply)."""
    keep = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "UV_CACHE_DIR"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) or k in keep}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1")
    return env


# ---------------------------------------------------------------- what conda-lock reads


def write_conda_lock_inputs(request: CondaRequest, directory: Path) -> tuple[Path, Path]:
    """The environment file and virtual-package spec conda-lock reads (both engines hash the same)."""
    import yaml  # here: an install from a lock already read writes no YAML

    environment = directory / f"{request.line}.environment.yml"
    environment.write_text(
        yaml.safe_dump(
            {
                "name": request.line,
                "channels": list(request.channels),
                "platforms": list(request.platforms),
                "dependencies": list(request.specs),
            },
            sort_keys=False,
        )
    )
    virtual = directory / f"{request.line}.virtual-packages.yml"
    virtual.write_text(
        yaml.safe_dump(
            {"subdirs": {p: {"packages": v} for p, v in request.virtual_packages.items()}}
        )
    )
    return environment, virtual


def layer_from_actions(request: CondaRequest, actions: dict[str, list[dict]]) -> CondaLayer:
    """Solved FETCH actions of every platform -> the lock's entries, with conda-lock's content hash (as
    conda-lock's solve_conda and make_lock_spec make them: lock_document, imported here: an install needs none
    of it)."""
    from toolkit.env import lock_document

    requested = lock_document.requested_dependencies(request.specs)
    channels = lock_document.lock_channels(request.channels)
    names = [d["name"] for d in requested if d["manager"] == "conda"]
    entries = [
        entry
        for platform in request.platforms
        for entry in lock_document.conda_entries(actions[platform], platform, channels, names)
    ]
    return CondaLayer(
        entries=tuple(entries),
        content_hash=lock_document.content_hashes(
            requested, channels, request.platforms, request.virtual_packages
        ),
        channels=channels,
    )


def _last_line(stderr: str) -> str:
    return next(
        (line for line in reversed(stderr.splitlines()) if line.strip()), "no output"
    ).strip()


# ---------------------------------------------------------------- the conda-lock CLI


class CondaLockEngine(CondaEngine):
    """`conda-lock lock` / `conda-lock install` with a real micromamba/mamba/conda."""

    relocates = False

    def __init__(self, conda_exe: str, console: Console) -> None:
        super().__init__(console)
        self.conda_exe = conda_exe

    def solve(self, request: CondaRequest) -> CondaLayer:
        """The CLI with the line's virtual packages; an external toolchain's empty layer needs no solver."""
        from conda_lock.lockfile import parse_conda_lock_file

        if not request.specs:
            return layer_from_actions(request, {platform: [] for platform in request.platforms})
        with owned_dir(Path(tempfile.gettempdir()), "lock-inputs") as tmp:
            environment, virtual = write_conda_lock_inputs(request, tmp)
            output = tmp / f"{request.line}.conda-lock.yml"
            command = [
                sys.executable,
                "-m",
                "conda_lock",
                "lock",
                "--conda",
                self.conda_exe,
                "-f",
                str(environment),
                "--virtual-package-spec",
                str(virtual),
                "--lockfile",
                str(output),
                "--log-level",
                "WARNING",
            ]
            started = time.perf_counter()
            with self.console.status(
                f"{request.line}: solving the conda layer for {', '.join(request.platforms)} "
                f"(conda-lock with {Path(self.conda_exe).name})"
            ):
                result = run_tied(command, capture_output=True, text=True)
            if result.returncode != 0:
                sys.stderr.write(result.stderr)
                raise ToolkitError(
                    f"{request.spec_file}: conda-lock lock failed ({_last_line(result.stderr)}; "
                    f"its output is above)"
                )
            lockfile = parse_conda_lock_file(output)
        self.console.print(
            f"{request.line}: {len(lockfile.package)} conda packages solved by conda-lock "
            f"in {time.perf_counter() - started:.2f} s"
        )
        from toolkit.env.lock_document import LockChannel, LockEntry

        return CondaLayer(
            entries=tuple(
                LockEntry(
                    manager=p.manager,
                    name=p.name,
                    version=p.version,
                    platform=p.platform,
                    url=p.url,
                    dependencies=dict(p.dependencies),
                    md5=p.hash.md5,
                    sha256=p.hash.sha256,
                    category=category,
                )
                for p in lockfile.package
                for category in sorted(p.categories)  # one entry per category, as to_v1 writes them
            ),
            content_hash=dict(lockfile.metadata.content_hash),
            channels=tuple(
                LockChannel(c.url, tuple(c.used_env_vars)) for c in lockfile.metadata.channels
            ),
        )

    def install(self, job: InstallJob, linker: Prefork | None = None) -> None:
        """`conda-lock install` installs both layers itself (it cannot relocate: staging is the prefix)."""
        with self.console.status(f"conda-lock install with {Path(self.conda_exe).name}"):
            result = run_tied(
                [
                    sys.executable,
                    "-m",
                    "conda_lock",
                    "install",
                    "--conda",
                    self.conda_exe,
                    "--prefix",
                    str(job.staging),
                    str(job.lock_file),
                ],
                capture_output=True,
                text=True,
            )
        if result.returncode != 0:
            sys.stderr.write(result.stderr)
            raise ToolkitError(
                f"{display_path(job.lock_file)}: conda-lock install failed "
                f"({_last_line(result.stderr)}; output above)"
            )


# ---------------------------------------------------------------- embedded py-rattler


class RattlerEngine(CondaEngine):
    """py-rattler in a worker process (a fork, else a worker interpreter); archives verified by the download
    cache before it sees them (py-rattler does not check sha256 for file:// channels), pip layer by uv with
    hashes."""

    relocates = True

    def solve(self, request: CondaRequest) -> CondaLayer:
        """py-rattler solves in a worker interpreter; conda-lock's own code turns the result into its models."""
        from toolkit.env.isolated import run_isolated

        return conda_layer(
            self.pending(request, lambda: run_isolated(rattler_fetch_actions, request)).layer()
        )

    def solver(self) -> Prefork:
        """py-rattler's solve in a fork of this process, forked before the spec is read: it imports py-rattler
        while this process reads and checks the spec, then is given the request."""
        return forked_solver()

    def start_solve(self, request: CondaRequest, solver: Prefork | None = None) -> PendingSolve:
        """py-rattler solves in a fork of this process, which goes on meanwhile (no interpreter start, no
        imports again): `solver`'s, else one forked now; where a fork is not safe (threads), `solve` runs when
        the result is asked for."""
        from toolkit.env.isolated import start_forked

        if not request.specs:
            return super().start_solve(request)
        forked = solver.start(request) if solver else None
        forked = forked or start_forked(rattler_fetch_actions, request)
        if forked is None:
            return super().start_solve(request)
        return self.pending(request, forked.result, forked.cancel, forked.ready)

    def pending(
        self,
        request: CondaRequest,
        result: Callable[[], Solved],
        cancel: Callable[[], None] = lambda: None,
        ready: Callable[[], bool] = lambda: False,
    ) -> PendingSolve:
        """A solve whose worker's `result` is waited for once (a spinner while it is not `ready`) and said."""

        @functools.cache
        def solved() -> Solved | None:  # None: nothing to solve
            if not request.specs:
                return None
            if ready():  # no spinner, and rich's import where the first line is said
                return result()
            with self.console.status(f"{request.line}: solving the conda layer (py-rattler)"):
                return result()

        def actions() -> dict[str, list[dict]]:
            done = solved()
            return {p: [] for p in request.platforms} if done is None else done.actions

        @functools.cache
        def said() -> None:
            done = solved()
            if done is None:
                return
            for platform in request.platforms:
                self.console.print(
                    f"{request.line}: {platform}: {len(done.actions[platform])} conda packages solved "
                    f"by py-rattler in {done.seconds[platform]:.2f} s"
                )

        def layer() -> SolvedConda:
            said()
            return SolvedConda(request, actions())

        return PendingSolve(
            layer,
            lambda: {
                platform: action["version"]
                for platform, actions in actions().items()
                for action in actions
                if action["name"] == "python"
            },
            cancel,
            said,
        )

    def linker(self) -> Prefork:
        """py-rattler's link in a fork of this process (isolated.prefork), which neither starts an interpreter
        nor imports the toolkit again: it imports py-rattler while this process reads and checks what to
        install (the verb forks it once the lock is read) and verifies the archives, then is given them."""
        from toolkit.env.isolated import prefork
        from toolkit.env.rattler_link import rattler_install

        return prefork(rattler_install, rattler_imports)

    def install(self, job: InstallJob, linker: Prefork | None = None) -> None:
        """Verified archives into job.staging (patched for job.prefix), then the pip layer. py-rattler links from its
        package cache, kept between installs (Workspace.rattler_cache), where each archive was unpacked once; its
        own bar shows the link at a terminal, a line says it elsewhere; in `linker`'s copy (forked here if not
        given)."""
        from toolkit.env.rattler_link import write_index_files

        with (
            locked(Workspace().caches_in_use, shared=True),  # no `toolkit caches clear` meanwhile
            owned_dir(Path(tempfile.gettempdir()), "index") as indexes,
        ):
            linker = linker or self.linker()
            try:
                archives = self.verified(job)
                index_files = write_index_files(archives, indexes)
            except BaseException:  # a refused archive, Ctrl-C: the waiting copy ends with it
                linker.cancel()
                raise
            started = time.perf_counter()
            if not self.console.is_terminal:
                self.console.print(f"linking {len(archives)} conda packages (py-rattler)")
            count = linker.run(
                archives,
                index_files,
                str(job.staging),
                str(job.prefix),
                job.platform,
                str(Workspace().rattler_cache),
                self.console.is_terminal,
            )
        self.console.print(
            f"{count} conda packages installed in {time.perf_counter() - started:.1f} s"
        )
        checkpoint("install:pip")
        install_pip_layer(list(job.pip), job.staging, job.prefix, self.console, job.lock_file)

    def verified(self, job: InstallJob) -> list[VerifiedArchive]:
        """A verified local copy of every conda archive (toolkit/env/download.py); only archives that write
        inside their prefix enter the cache (archives.check_conda_archive), and each must be the package its
        entry names (its info/index.json, kept for py-rattler's record, and beside the verified archive: a warm
        install reads no archive)."""
        from toolkit.env.archives import (
            MAX_INFO_BYTES,
            archive_identity,
            archive_index_json,
            check_conda_archive,
        )
        from toolkit.env.download import fetch_all, kept_with_stamp
        from toolkit.env.rattler_link import VerifiedArchive

        where = display_path(job.lock_file)
        archives = fetch_all(
            job.conda,
            Workspace().conda_package_cache,
            lambda p: f"{where}: {p.name} {p.version}",
            self.console,
            "conda archives",
            check_conda_archive,
        )
        verified = []
        for package, archive in zip(job.conda, archives):
            index_json = kept_with_stamp(
                archive, package, "index.json", archive_index_json, MAX_INFO_BYTES
            )
            identity = archive_identity(archive, index_json)
            check_identity(package, identity, job.lock_file)
            verified.append(
                VerifiedArchive(
                    str(archive),
                    package.url,
                    package.channel,
                    package.sha256,
                    archive.stat().st_size,
                    identity.index_json,
                )
            )
        return verified


def check_identity(package: LockedPackage, found: PackageIdentity, lock_file: Path) -> None:
    """The archive must be the package its lock entry names: name and version, and the build its URL's
    file name carries (<name>-<version>-<build>.conda), or conda-meta would disagree with the lock."""
    named = f"{found.name}-{found.version}-{found.build}"
    if (found.name, found.version) != (package.name, package.version) or package.filename not in (
        named + suffix for suffix in CONDA_SUFFIXES
    ):
        raise ToolkitError(
            f"{display_path(lock_file)}: {package.name} {package.version} ({package.filename}): its "
            f"archive is {found.name} {found.version} build {found.build} by its info/index.json (the "
            f"entry was edited: {relock_hint(lock_file)}; nothing was installed)"
        )


# ---------------------------------------------------------------- pip layer: uv


def install_pip_layer(
    packages: list[LockedPackage],
    staging: Path,
    prefix: Path,
    console: Console,
    lock_file: Path,
    closure: Closure | None = None,
    seed: tuple[LockedPackage, ...] = (),
) -> None:
    """The lock's wheels into staging with uv, for staging's python: no resolution (--no-deps), bytecode compiled
    as pip did. uv downloads each wheel from the lock's URL (a --wheels file where it lies) in parallel, retrying
    a transient failure, into its cache (Workspace.uv_cache), and installs it only if its bytes hash to the lock's
    sha256 (--require-hashes): hashed once, by uv, as it streams. A reinstall of an unchanged lock downloads
    nothing and links from that cache. The toolkit then reads what was installed (each wheel's METADATA as its
    .dist-info holds it) before anything is swapped in: the entry's package and version, and with a `closure`, a
    pypi line's, every dependency they declare in the lock. `seed` (python's own pip for a venv) is installed first
    and left to compile its bytecode when it first runs, as `uv venv --seed` leaves it."""
    if not packages and not seed:
        return
    python = staging / "bin" / "python"
    if not python.exists():
        raise ToolkitError(
            f"{staging}: the conda layer has no bin/python for the pip layer (lock python)"
        )
    started = time.perf_counter()
    with locked(
        Workspace().caches_in_use, shared=True
    ):  # uv's cache: no `toolkit caches clear` meanwhile
        if seed:
            run_uv_install(list(seed), staging, console, lock_file, compile_bytecode=False)
        if packages:
            run_uv_install(packages, staging, console, lock_file, compile_bytecode=True)
    checked_metadata([*seed, *packages], staging, lock_file, closure)
    console.print(
        f"{len(packages) + len(seed)} pip packages installed with uv in "
        f"{time.perf_counter() - started:.1f} s"
    )
    relocate_scripts(staging, prefix)


def run_uv_install(
    packages: list[LockedPackage],
    staging: Path,
    console: Console,
    lock_file: Path,
    compile_bytecode: bool,
) -> None:
    """`uv pip install` of the entries by URL and sha256 into staging, its progress shown (UvProgress); a
    refusal is one line naming the wheel. uv reads them from a pylock.toml rather than a requirements file:
    from a lock uv installs what each entry names without resolving, so it reads no wheel's METADATA before
    the wheel is downloaded and hashed (one request per wheel)."""
    from toolkit.env.pypi_lock import uv_executable

    lock = staging.parent / "pylock.toml"
    lock.write_text(pylock_text(packages))
    # --prefix: uv writes under staging whatever sys.prefix its python reports (as pip's --prefix did)
    command = [
        uv_executable(),
        "pip",
        "install",
        "--python",
        str(staging / "bin" / "python"),
        "--prefix",
        str(staging),
        "--no-deps",
        "--require-hashes",
        "--no-config",
        "--no-python-downloads",
        *(["--compile-bytecode"] if compile_bytecode else []),
        "--cache-dir",
        str(Workspace().uv_cache),
        "--preview-features",
        "pylock",
        "--requirement",
        str(lock),
    ]
    returncode, output = UvProgress(console, len(packages)).run(command)
    if returncode != 0:
        _uv_identity(packages, output, lock_file)
        raise ToolkitError(
            f"{display_path(lock_file)}: {_uv_problem(packages, output)}; nothing was installed"
        )


def pylock_text(packages: list[LockedPackage]) -> str:
    """A pylock.toml (PEP 751) of exactly these wheels: each its URL (a file:// one as its path) and sha256. A lock's
    values are printable ASCII (lockfile.URL, SHA256), which JSON's string quoting writes as TOML's basic strings."""
    from urllib.parse import unquote, urlsplit

    lines = ['lock-version = "1.0"', 'created-by = "fa-envkit"']
    for p in packages:
        where = (
            f"path = {json.dumps(unquote(urlsplit(p.url).path))}"
            if p.url.startswith("file:")
            else f"url = {json.dumps(p.url)}"
        )
        lines += [
            "",
            "[[packages]]",
            f"name = {json.dumps(p.name)}",
            f"version = {json.dumps(p.version)}",
            f"wheels = [{{ {where}, hashes = {{ sha256 = {json.dumps(p.sha256)} }} }}]",
        ]
    return "\n".join(lines) + "\n"


class UvProgress:
    """uv's progress as the toolkit shows a long step: at a terminal a live bar per wheel being downloaded (its
    size) under one for the step (downloading, linking, compiling bytecode); a plain line per finished
    download and per step either way. Read from the lines uv writes when its output is not a terminal."""

    DOWNLOADING = re.compile(r"Downloading (\S+) \(([0-9.]+)([KMG]?i?B)\)")
    DOWNLOADED = re.compile(r"Downloaded (\S+)")
    STEP = re.compile(r"(Resolved|Prepared|Installed|Bytecode compiled) ")
    NEXT = {
        "Prepared": "linking",
        "Installed": "compiling bytecode",
    }  # from a pylock uv resolves nothing
    UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

    def __init__(self, console: Console, count: int) -> None:
        self.console, self.count = console, count
        self.sizes: dict[str, tuple[int, str]] = {}

    def run(self, command: list[str]) -> tuple[int, str]:
        """(uv's exit status, all it wrote), its progress shown as it goes."""
        import subprocess

        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        output = []
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
        with (
            Progress(*columns, console=self.console, transient=True) as progress,
            popen_tied(
                command,
                env=locking_environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            ) as proc,
        ):
            step = progress.add_task(f"uv: {self.count} pip packages: downloading", total=None)
            tasks: dict[str, TaskID] = {}
            try:
                assert proc.stdout is not None  # stdout=PIPE
                for line in proc.stdout:
                    output.append(line)
                    self.feed(line.strip(), progress, step, tasks)
                return proc.wait(), "".join(output)
            except BaseException:
                kill_group(proc)
                raise

    def feed(self, line: str, progress: Progress, step: TaskID, tasks: dict[str, TaskID]) -> None:
        if found := self.DOWNLOADING.fullmatch(line):
            name, size = found[1], int(float(found[2]) * self.UNITS.get(found[3], 1))
            self.sizes[name] = (size, f"{found[2]} {found[3]}")
            tasks[name] = progress.add_task(f"  {name}", total=size)
        elif (found := self.DOWNLOADED.fullmatch(line)) and found[1] in tasks:
            progress.remove_task(tasks.pop(found[1]))
            self.console.print(f"  downloaded {found[1]} ({self.sizes[found[1]][1]})")
        elif found := self.STEP.match(line):
            self.console.print(f"uv: {line}")
            if found[1] in self.NEXT:
                progress.update(
                    step, description=f"uv: {self.count} pip packages: {self.NEXT[found[1]]}"
                )


def checked_metadata(
    packages: list[LockedPackage], staging: Path, lock_file: Path, closure: Closure | None
) -> None:
    """One-line ToolkitError naming the lock and the entry unless what was installed for each entry (its .dist-info's
    METADATA) names the entry's package and version and, with a closure, the lock holds every dependency the wheels
    declare: before the environment is swapped in."""
    from packaging.utils import canonicalize_name

    from toolkit.env.wheels import closure_problem, installed_metadata

    [site, *_] = sorted(staging.glob("lib/python*/site-packages")) or [staging]
    installed = installed_metadata(site, [p.name for p in packages])
    found = []
    for package in packages:
        metadata = installed.get(canonicalize_name(package.name))
        if metadata is None:
            raise ToolkitError(
                f"{display_path(lock_file)}: {package.name} {brief(package.version)} "
                f"({brief(package.filename, 160)}): its wheel installed no {package.name} (the entry was "
                f"edited: {relock_hint(lock_file)}; nothing was installed)"
            )
        check_wheel_identity(package, metadata.name, metadata.version, "METADATA", lock_file)
        found.append((package, metadata))
    problem = closure and closure_problem(found, closure)
    if problem:
        raise ToolkitError(
            f"{display_path(lock_file)}: {problem} (an entry was deleted or edited: "
            f"{relock_hint(lock_file)}; nothing was installed)"
        )


UV_MISMATCH = re.compile(
    r"Wheel (version|package name) does not match filename \(([^ ]+) != ([^ )]+)\)"
)


def _uv_identity(packages: list[LockedPackage], output: str, lock_file: Path) -> None:
    """uv refuses a wheel whose METADATA is another version or package than its file name (which the lock's check
    held to the entry: lockfile.check_wheel_name): the same edited entry the toolkit's METADATA check refuses, so
    the same one line (check_wheel_identity), naming the entry."""
    found = UV_MISMATCH.search(output)
    if not found:
        return
    field, values = found[1], (found[2], found[3])
    for package in packages:
        if package.filename not in output:
            continue
        ours = package.version if field == "version" else package.name
        other = next((v for v in values if v != ours), values[0])
        name, version = (package.name, other) if field == "version" else (other, package.version)
        check_wheel_identity(package, name, version, "METADATA", lock_file)


def _uv_problem(packages: list[LockedPackage], output: str) -> str:
    """uv's refusal on one line: a wheel whose bytes are not the locked ones (uv says so by its hash, with the
    sha256 it computed, or by a bad CRC when it unzips while downloading, before the hash is complete) or that
    failed otherwise, by name and version; else uv's error and its last cause."""
    lines = [" ".join(line.split()) for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    causes = [line.removeprefix("cause:").strip() for line in lines if line.startswith("cause:")]
    reason = causes[-1] if causes else errors[0] if errors else lines[-1] if lines else "no output"
    computed = re.search(r"Computed:\s+sha256:([0-9a-f]{64})", output)
    for package in packages:
        named = (f"`{package.name}=={package.version}`", f"`{package.name} @ {package.url}`")
        if not any(form in output for form in named):
            continue
        if computed or "Bad CRC" in output:
            seen = f"has sha256 {computed[1]}" if computed else f"is not the file locked ({reason})"
            return (
                f"{package.name} {package.version}: sha256 mismatch: {package.url} {seen}, the lock pins "
                f"{package.sha256} (the wheel was changed or the index serves another file)"
            )
        return f"{package.name} {package.version}: cannot install {package.url} ({reason})"
    found = [*errors[:1], *causes[-1:]]
    return "pip layer: " + (": ".join(found) if found else (lines[-1] if lines else "no output"))


def relocate_scripts(staging: Path, prefix: Path) -> None:
    """pip and uv write their interpreter's path into each script's header: rewrite the header for the final prefix
    in the form pip gives that path (a plain #! line, or /bin/sh + exec where a #! line cannot hold it: a
    space, or too long), rather than replace the path in place (a #! line with a space runs nowhere)."""
    old, new = str(staging).encode(), str(prefix).encode()
    for script in sorted((staging / "bin").iterdir()):
        if not script.is_file() or script.is_symlink():
            continue
        with script.open("rb") as stream:
            head = stream.read(2)
        if head == b"#!":
            found = script_interpreter(script.read_bytes(), old)
            if found:
                rest, args, body = found
                script.write_bytes(script_header(new + rest, args) + body)


SH_EXEC = (
    b"#!/bin/sh\n'''exec' "  # pip's (distlib's) header for an interpreter a #! line cannot name
)
SH_ARGS, SH_CLOSE = b' "$0" "$@"', b"' '''"


def script_header(python: bytes, args: bytes = b"") -> bytes:
    """The header pip writes for a script run by `python` (distlib's rule: a plain #! line unless the path
    has a space or the line would pass the kernel's 127 bytes)."""
    if b" " not in python and len(python) + len(args) + 3 <= 127:
        return b"#!" + python + args + b"\n"
    quoted = b'"' + python + b'"' if b" " in python else python
    return SH_EXEC + quoted + args + SH_ARGS + b"\n" + SH_CLOSE + b"\n"


def script_interpreter(data: bytes, old: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(the interpreter's path after `old`, its arguments, the script after the header) of a script whose
    header, in either of pip's forms or uv's (its /bin/sh form quotes the path in single quotes), runs an
    interpreter under `old`; None for any other file."""
    sh = data.startswith(SH_EXEC)
    line, _, body = data[len(SH_EXEC) if sh else 2 :].partition(b"\n")
    quote = line[:1] if sh and line[:1] in (b'"', b"'") else b""
    if sh:
        closing, _, body = body.partition(b"\n")
        if closing != SH_CLOSE or not line.endswith(SH_ARGS):
            return None
        line = line[len(quote) :].removesuffix(SH_ARGS)
    if not line.startswith(old + b"/"):
        return None
    rest, end, args = line[len(old) :].partition(quote or b" ")
    return rest, (b"" if quote else end) + args, body

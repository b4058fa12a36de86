"""Install stage: locks/<line>.conda-lock.yml -> a conda prefix (the conda layer, then the pip layer), or for
a `pypi` line a venv of the machine's python holding every locked wheel (toolkit/env/pypi_install.py).

Engines (toolkit/env/engine.py, chosen once): `conda-lock install` where micromamba/mamba/conda is on PATH,
else the embedded py-rattler installer. The embedded one checks every archive's sha256 itself before
py-rattler sees it (py-rattler does not for file:// channels) and installs only from those verified copies.
This module owns where the environment goes: the prefix checks, the swap, the install record.

The embedded path builds the environment in an owned temporary folder beside the target (files patched
for the final path) and swaps it into place at the end, so an interrupted install never leaves something
that looks complete, and the old environment stays usable until the new one is there. micromamba/conda
cannot relocate, so `conda-lock install` builds at the final path and the environment counts as finished
only once etc/fa-envkit/lock.json, written last, is there.

That install record, which names the prefix it was written for, is also what makes a prefix the
toolkit's own: a non-empty folder without one written for it is never replaced or deleted, nor is an
environment holding files no installer wrote (a user's notebook or work/ folder): the reinstall refuses,
naming them, rather than carry them into the new one (where one may clash with a package's path, and an
interruption would leave them split between the two). Before anything is written the lock must be current (as `lock --check` sees
it) and its packages must be its spec's environment. SIGTERM and Ctrl-C remove this run's temporaries;
a rerun removes those of a killed run (toolkit/base/atomic.py).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from toolkit.base.arguments import add_line, add_prefix, add_python
from toolkit.base.atomic import (
    TEMP_PREFIX,
    checkpoint,
    clean_stale,
    exchange,
    owned_dir,
    remove_path,
    run_temporaries,
    temp_name,
)
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options
from toolkit.env.engine import CondaEngine, InstallJob, add_engine_options, choose_engine
from toolkit.env.install_record import PrefixRecord, record_rows
from toolkit.env.lockfile import LockedEnv, environment_problem, read_lock, stale_reason
from toolkit.env.pypi_install import VenvBuild, check_venv_prefix
from toolkit.spec.envspec import EnvSpec, load_spec, resolve_spec_arg

console = Console(stderr=True, highlight=False)


def running_platform() -> str:
    import platform

    machine = platform.machine()
    platforms = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}
    if sys.platform != "linux" or machine not in platforms:
        raise ToolkitError(
            f"this machine ({sys.platform} {machine}) is not a platform the locks cover "
            f"(linux-64, linux-aarch64)"
        )
    return platforms[machine]


# ---------------------------------------------------------------- the whole install


def install_line(
    line: str,
    prefix: Path | None = None,
    workspace: Workspace = DEFAULT,
    backend: str = "auto",
    conda_exe: str | None = None,
    platform: str | None = None,
    if_stale: bool = False,
    python: Path | None = None,
    torch_from: Path | None = None,
    wheels: Path | None = None,
) -> Path | None:
    """Create the environment of a lock at prefix (default .envs/<line>); returns the prefix, or None when
    `if_stale` and the prefix already holds this lock's environment (its record names this lock's digest).
    A pypi line's is a venv made with `python` (default: the spec's pythonX.Y on PATH).

    Everything that can refuse (the lock, its spec, the prefix, the python) is checked before anything is
    written. Installs into one prefix take turns (a file lock beside it)."""
    lock_file = workspace.lock_file(line)
    locked_env = read_lock(lock_file)
    if locked_env.toolchain_kind == "external":
        raise ToolkitError(
            f"{display_path(lock_file)}: {line} has an external toolchain: there is no environment "
            f"to install (the machine provides it; `toolkit build {line}` checks it)"
        )
    for option, given in (("--python", python), ("--torch-from", torch_from), ("--wheels", wheels)):
        if given and locked_env.toolchain_kind != "pypi":
            raise ToolkitError(
                f"{option}: {line} has a {locked_env.toolchain_kind} toolchain, whose python and torch "
                f"come from {display_path(lock_file)} (drop {option}; it is for pypi lines' venvs)"
            )
    platform = platform or running_platform()
    if platform not in locked_env.platforms:
        raise ToolkitError(
            f"{display_path(lock_file)}: not locked for {platform} (locked: "
            f"{', '.join(locked_env.platforms)}; add it to platforms in the spec and re-lock)"
        )
    engine = (
        None if locked_env.toolchain_kind == "pypi" else choose_engine(backend, conda_exe, console)
    )
    # py-rattler's link forked now, once the lock says there is a conda layer: it imports py-rattler while the
    # spec, the prefix and the archives are checked (cancelled by the stack should anything refuse first)
    linker = engine.linker() if engine else None
    with ExitStack() as stack:
        if linker is not None:
            stack.callback(linker.cancel)
        spec = check_current(locked_env, platform)
        prefix = Path(prefix or workspace.prefix(line)).absolute()
        if locked_env.toolchain_kind == "pypi":
            check_venv_prefix(prefix)
        check_prefix(prefix, recovering=any(prefix.parent.glob(f"{retired_tag(prefix)}*")))
        record = PrefixRecord(
            line=line,
            lock=str(lock_file.resolve()),
            platform=platform,
            input_hash=locked_env.input_hash,
            lock_sha256=locked_env.digest,
            prefix=str(prefix),
        )
        venv = (
            VenvBuild.of(
                spec,
                locked_env.packages_for(platform, "pip"),
                python,
                torch_from,
                wheels,
                lock_file,
            )
            if locked_env.toolchain_kind == "pypi"
            else None
        )
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with locked(prefix):
            clean_stale(
                prefix.parent, lambda entry: restore_retired(entry, prefix)
            )  # what killed installs left
            check_prefix(prefix)  # again: another install may have finished while this one waited
            if if_stale and holds(prefix, record):
                return None
            if engine and not engine.relocates:
                install_in_place(
                    engine, InstallJob.of(locked_env, platform, prefix, prefix), record
                )
                return prefix
            with owned_dir(prefix.parent, f"install-{prefix.name}") as work:
                staging = work / "env"
                if venv:  # what the toolkit wrote besides the wheels goes into the record
                    record = replace(
                        record,
                        written=venv.make(staging, prefix, console),
                        stand_ins={s.name: s.describe() for s in venv.stand_ins},
                    )
                elif engine:
                    staging.mkdir()
                    engine.install(InstallJob.of(locked_env, platform, staging, prefix), linker)
                record.write(staging)  # last: an environment without it is not a finished one
                replace_prefix(staging, prefix)
        return prefix


def holds(prefix: Path, record: PrefixRecord) -> bool:
    """Whether prefix is already the environment `record` describes (same lock digest, platform, folder)."""
    installed = PrefixRecord.read(prefix) if prefix.is_dir() else None
    return installed is not None and (
        installed.lock_sha256,
        installed.platform,
        installed.prefix,
    ) == (record.lock_sha256, record.platform, record.prefix)


def check_current(locked_env: LockedEnv, platform: str) -> EnvSpec:
    """The lock's spec; refuse a lock that `lock --check` calls stale, or whose packages are not its spec's
    environment."""
    where = display_path(locked_env.path)
    spec_file = locked_env.spec_file
    if spec_file is None or not spec_file.is_file():
        raise ToolkitError(
            f"{where}: its spec {display_path(spec_file) if spec_file else '(none named)'} is "
            f"missing: install checks that the lock is current (install from the project's checkout)"
        )
    spec = load_spec(spec_file)
    problem = stale_reason(spec, locked_env) or environment_problem(spec, locked_env, platform)
    if problem:
        raise ToolkitError(f"{where}: {problem}")
    return spec


def check_prefix(prefix: Path, recovering: bool = False) -> None:
    """The prefix must be absent, an empty folder, or an environment with the toolkit's install record
    written for this folder and holding nothing but what installers wrote: never delete or replace what
    the toolkit did not make. `recovering`: a killed in-place install set the old environment aside
    beside it, so a prefix without record may be that install's unfinished one (restore_retired decides,
    under the prefix lock)."""
    where = display_path(prefix)
    fix = "choose a new or empty --prefix, or move it away yourself"
    if prefix.is_symlink():
        raise ToolkitError(
            f"{where}: is a symlink; the toolkit does not replace it or what it points to ({fix})"
        )
    if not prefix.exists():
        return
    if not prefix.is_dir():
        raise ToolkitError(f"{where}: exists and is not a folder; nothing was changed ({fix})")
    if next(prefix.iterdir(), None) is None:
        return
    record = PrefixRecord.read(prefix)
    if record is None:
        if recovering:
            return
        raise ToolkitError(
            f"{where}: not empty and not an environment fa-envkit installed (no {PrefixRecord.FILE}); "
            f"nothing was changed ({fix})"
        )
    if record.prefix is None or Path(record.prefix).resolve() != prefix.resolve():
        written_for = "a folder it does not name" if record.prefix is None else repr(record.prefix)
        raise ToolkitError(
            f"{where}: its {PrefixRecord.FILE} was written for {written_for}, not this folder "
            f"(copied or moved here); nothing was changed ({fix})"
        )
    foreign = foreign_entries(prefix)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ToolkitError(
            f"{where}: holds files no installer wrote ({', '.join(foreign[:3])}{more}); reinstalling "
            f"would delete them: nothing was changed (move them out of the environment, or choose "
            f"another --prefix)"
        )


# What installers write besides their packages: py-rattler's cache directory tag, conda's and rattler's
# history, uv's lock of the environment (an empty file it takes a file lock on), the toolkit's own install record.
INSTALLER_FILES = ("CACHEDIR.TAG", "conda-meta/history", ".lock", str(PrefixRecord.FILE))


def installed_paths(prefix: Path) -> set[str]:
    """The paths (relative, POSIX, inside the prefix) that installers recorded there: every conda package's
    record (conda-meta/<name>-<version>-<build>.json) and the files it lists, every pip distribution's
    files as its RECORD lists them (recorded_files), and what the install record says the toolkit wrote
    itself (a venv's own files, the CUDA symlinks of a pypi line)."""
    fix = "move your own files out and remove the environment yourself, then install again"
    record = PrefixRecord.read(prefix)
    paths: set[str] = set(record.written if record else ())
    for meta in (prefix / "conda-meta").glob("*.json"):
        package = read_json(meta, "conda-meta record", fix)
        if meta.name != conda_record_name(package):
            continue  # not a package's record: a user's file like any other
        files = package.get("files")
        paths.update(
            [str(meta.relative_to(prefix)), *(f for f in files or () if isinstance(f, str))]
        )
    for record_file in prefix.glob("lib/python*/site-packages/*.dist-info/RECORD"):
        paths.update(recorded_files(prefix, record_file, fix))
    return {path for path in paths if inside(path)} | set(INSTALLER_FILES)


def conda_record_name(package: object) -> str | None:
    """The name conda gives a package's record in conda-meta/ (<name>-<version>-<build>.json); None for
    what is not one."""
    parts = (
        [package.get(key) for key in ("name", "version", "build")]
        if isinstance(package, dict)
        else [None]
    )
    return (
        "-".join(str(part) for part in parts) + ".json"
        if all(isinstance(p, str) for p in parts)
        else None
    )


def inside(path: str) -> bool:
    """A relative path that names a place inside the prefix as it is written (no .., not absolute)."""
    return (
        path == os.path.normpath(path)
        and not os.path.isabs(path)
        and path != ".."
        and not path.startswith("../")
    )


def recorded_files(prefix: Path, record_file: Path, fix: str) -> set[str]:
    """The files a RECORD makes an installer's: a row with a hash whose file is the size it records (the
    scripts of bin/ excepted: relocation rewrote their headers), and the RECORD itself. pip keeps rows of
    the wheel's RECORD that name no file of the wheel (../../notes.txt), so a row alone owns nothing;
    pip's hashless rows of its .pyc files are owned as caches (python_cache)."""
    site = record_file.parent.parent.relative_to(prefix)
    owned = {str(record_file.relative_to(prefix))}
    for row in record_rows(record_file, fix):
        path = os.path.normpath(site / row[0])
        if len(row) < 3 or not row[1] or not inside(path):
            continue
        if path.startswith("bin/") or row[2] == str(size_of(prefix / path)):
            owned.add(path)
    return owned


def size_of(path: Path) -> int | None:
    """A regular file's size, not following a symlink; None for anything else."""
    try:
        found = path.lstat()
    except OSError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


def python_cache(path: Path, installed: set[str]) -> bool:
    """A compiled module of __pycache__/ whose source is installed beside it (NAME.TAG[.opt-N].pyc of
    NAME.py): python's, made again on import; anything else there is a user's."""
    if path.parent.name != "__pycache__" or path.suffix != ".pyc":
        return False
    return str(path.parent.parent / (path.name.partition(".")[0] + ".py")) in installed


def foreign_entries(prefix: Path) -> list[str]:
    """What in a prefix no installer recorded (a notebook, a work/ folder, a file in conda-meta/): files,
    symlinks, and folders that hold nothing installed (named once, with a trailing /)."""
    installed = installed_paths(prefix)
    holding = {str(parent) for path in installed for parent in Path(path).parents}
    foreign = []
    for root, dirs, files in os.walk(prefix):
        here = Path(root).relative_to(prefix)
        descend = []
        for name in dirs:
            rel = str(here / name)
            if (
                prefix / rel
            ).is_symlink():  # os.walk lists a link to a folder among the folders, never follows it
                if rel not in installed:
                    foreign.append(rel)
            elif (
                rel in holding or rel in installed or name == "__pycache__"
            ):  # a folder an installer made
                descend.append(
                    name
                )  # (a venv's include/), or python's cache: each file in it is judged
            else:
                foreign.append(rel + "/")
        dirs[:] = descend
        foreign += [
            str(here / name)
            for name in files
            if str(here / name) not in installed and not python_cache(here / name, installed)
        ]
    return sorted(foreign)


def retired_tag(prefix: Path) -> str:
    return temp_name(f"retired-{prefix.name}")


def restore_retired(entry: Path, prefix: Path) -> bool:
    """A killed in-place install left the old environment at <entry>/<name>: put it back at the prefix,
    in place of the unfinished one that install was making there (it has no install record).
    Returns whether the stale `entry` may now be removed: another prefix's old environment stays for
    that prefix's own rerun."""
    if not entry.name.startswith(TEMP_PREFIX + "retired-"):
        return True
    old = entry / prefix.name
    if not entry.name.startswith(retired_tag(prefix)) or not old.is_dir():
        return entry.is_dir() and next(entry.iterdir(), None) is None
    if PrefixRecord.read(old) is not None and PrefixRecord.read(prefix) is None:
        remove_path(prefix)
        os.replace(old, prefix)
    return True


@contextmanager
def old_env_aside(prefix: Path) -> Iterator[None]:
    """For the body, an existing prefix lies in an owned retired-<name> folder beside it: put back if the
    body fails, removed after it succeeds, and put back by the next install's restore_retired if the
    process is killed in between."""
    with owned_dir(prefix.parent, f"retired-{prefix.name}") as retired:
        kept = prefix.exists()
        if kept:
            os.replace(prefix, retired / prefix.name)
        try:
            yield
        except BaseException:
            remove_path(prefix)
            if kept:
                os.replace(retired / prefix.name, prefix)
            raise


def install_in_place(engine: CondaEngine, job: InstallJob, record: PrefixRecord) -> None:
    """An engine that cannot relocate (micromamba/conda write the prefix into files) builds at the final
    path with an older environment set aside, and the fa-envkit record (what marks it finished) last."""
    with old_env_aside(job.prefix):
        checkpoint("install:in-place")
        engine.install(job)
        record.write(job.prefix)


def replace_prefix(staging: Path, prefix: Path) -> None:
    """Move the finished environment into place. An older one is swapped out in one step (renameat2),
    so an interruption at any moment leaves the old or the new environment at `prefix`; the old one
    then lies at `staging`, inside the owned work folder that is removed afterwards. Where the
    filesystem cannot swap (NFS), the old one is set aside first (old_env_aside)."""
    checkpoint("install:replace")
    if prefix.exists() and exchange(staging, prefix):
        return
    with old_env_aside(prefix):
        os.replace(staging, prefix)


# ---------------------------------------------------------------- the `install` verb


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "install",
        description="Create the environment of locks/<line>.conda-lock.yml: `conda-lock install` where "
        "micromamba/mamba/conda is on PATH, else py-rattler after checking every archive's sha256, "
        "then the pip layer with --require-hashes --no-deps; for a pypi line, a venv of the "
        "machine's python with every locked wheel (--require-hashes --no-deps). Built in a "
        "temporary prefix and renamed into place.",
    )
    add_line(parser)
    add_prefix(parser, "where the environment goes (default: .envs/LINE)")
    parser.add_argument(
        "--if-stale",
        action="store_true",
        help="leave an environment that already holds this lock as it is (default: reinstall it)",
    )
    add_python(
        parser,
        "a pypi line's interpreter, from which the venv is made (default: pythonX.Y on PATH, X.Y the "
        "spec's python)",
    )
    parser.add_argument(
        "--torch-from",
        type=Path,
        metavar="PYTHON",
        help="a pypi line: copy torch, and every locked package this interpreter's environment has at "
        "the locked version, from there (checked against its RECORD) instead of downloading "
        "them; its torch must be the lock's release, built for the line's CUDA",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        metavar="DIR",
        help="a pypi line: read the lock's wheels from DIR by file name (still hash-checked) "
        "instead of their URLs, for a machine without internet",
    )
    parser.add_argument(
        "--runtime",
        action="store_true",
        help="install the line's runtime lock (`toolkit lock LINE --runtime`): a pypi line's into a "
        "venv with uv pip sync, a conda line's with the conda engine (default prefix: "
        ".envs/LINE-runtime)",
    )
    add_engine_options(parser)
    add_workspace_options(parser)
    parser.set_defaults(func=install_command)


def install_command(args: argparse.Namespace) -> int:
    workspace = Workspace.from_args(args)
    # LINE or its spec file, as the sibling verbs take it (a spec file is the line of its name)
    line = (
        load_spec(resolve_spec_arg(args.line, workspace)).line
        if Path(args.line).suffix in (".yaml", ".yml")
        else args.line
    )
    if (
        args.runtime
    ):  # cache/runtime_lock.py's, set by toolkit/cli.py: runtime locks are the cache wing's
        return args.runtime_command(line, args, workspace)
    if not workspace.lock_file(
        line
    ).exists():  # a typo (cu26) is named as one, then what locking it needs
        # here: the lock verb's module (its resolvers, urllib's HTTP client) for this one line
        from toolkit.env.lock import missing_lock

        raise ToolkitError(missing_lock(load_spec(resolve_spec_arg(line, workspace)), workspace))
    with run_temporaries("install"):
        prefix = install_line(
            line,
            args.prefix,
            workspace,
            args.engine,
            args.conda,
            if_stale=args.if_stale,
            python=args.python,
            torch_from=args.torch_from,
            wheels=args.wheels,
        )
    lock = display_path(workspace.lock_file(line))
    print(
        f"{display_path(prefix)}: environment of {lock} installed"
        if prefix
        else f"{display_path(args.prefix or workspace.prefix(line))}: already the environment of {lock}; left as it is"
    )
    return 0

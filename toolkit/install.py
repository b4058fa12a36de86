"""Install stage: locks/<line>.conda-lock.yml -> a conda prefix (the conda layer, then the pip layer).

Backends: `conda-lock install` where micromamba/mamba/conda is on PATH, else the embedded py-rattler
installer. The embedded path checks every archive's sha256 itself before py-rattler sees it (py-rattler
does not for file:// channels) and installs only from those verified copies.

The embedded path builds the environment in a temporary prefix beside the target (files patched for the
final path) and renames it into place at the end, so an interrupted install never leaves something that
looks complete. micromamba/conda cannot relocate, so `conda-lock install` builds at the final path and
the environment counts as finished only once etc/fa-envkit/lock.json, written last, is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from toolkit.digest import sha256_file
from toolkit.errors import ToolkitError
from toolkit.lock import (LOCKS_DIR, choose_backend, conda_executable, console, load_lock_document, lock_path,
                          read_lock, run_isolated)
from toolkit.spec import display_path

ENVS_PREFIX_DIR = Path(".envs")
RECORD_FILE = Path("etc") / "fa-envkit" / "lock.json"  # inside the prefix: which lock made it
CHUNK = 1 << 20


@dataclass(frozen=True)
class LockedPackage:
    """One entry of the lock for the platform being installed."""

    manager: str  # conda | pip
    name: str
    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1].split("#", 1)[0]

    @property
    def channel(self) -> str:
        """A conda archive's channel: its URL without the subdir and file name."""
        return self.url.rsplit("/", 2)[0]


def running_platform() -> str:
    import platform

    machine = platform.machine()
    platforms = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}
    if sys.platform != "linux" or machine not in platforms:
        raise ToolkitError(f"this machine ({sys.platform} {machine}) is not a platform the locks cover "
                           f"(linux-64, linux-aarch64)")
    return platforms[machine]


def cache_dir() -> Path:
    """Verified archives are kept here, named by their sha256, and re-checked on every use."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fa-envkit" / "conda-pkgs"


def locked_packages(document: dict, platform: str) -> list[LockedPackage]:
    packages = []
    for entry in document.get("package") or []:
        if entry["platform"] != platform:
            continue
        sha256 = (entry.get("hash") or {}).get("sha256")
        if not sha256:
            raise ToolkitError(f"{entry['name']} {entry['version']}: the lock has no sha256 for it "
                               f"(re-lock with `toolkit lock`)")
        packages.append(LockedPackage(entry["manager"], entry["name"], entry["version"], entry["url"], sha256))
    return packages


# ---------------------------------------------------------------- verified downloads


def verified_archive(package: LockedPackage, lock_file: Path, progress: Progress) -> Path:
    """A local copy of the package's archive whose sha256 is the lock's; one-line error naming it if not."""
    target = cache_dir() / package.sha256 / package.filename
    if target.exists() and sha256_file(target) == package.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    task = progress.add_task(package.filename, total=None)
    try:
        with urllib.request.urlopen(package.url, timeout=60) as response, partial.open("wb") as out:
            progress.update(task, total=int(response.headers.get("Content-Length") or 0) or None)
            while chunk := response.read(CHUNK):
                out.write(chunk)
                progress.advance(task, len(chunk))
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ToolkitError(f"{display_path(lock_file)}: {package.name} {package.version}: cannot fetch "
                           f"{package.url} ({getattr(exc, 'reason', exc)}; is the channel reachable?)") from None
    finally:
        progress.remove_task(task)
    actual = sha256_file(partial)
    if actual != package.sha256:
        partial.unlink()
        raise ToolkitError(f"{display_path(lock_file)}: {package.name} {package.version}: sha256 mismatch for "
                           f"{package.url} (lock {package.sha256[:12]}..., archive {actual[:12]}...): the archive "
                           f"was changed or the channel serves another file; nothing was installed")
    os.replace(partial, target)
    return target


def verify_all(packages: list[LockedPackage], lock_file: Path) -> list[tuple[LockedPackage, Path]]:
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task(f"verifying {len(packages)} conda archives", total=len(packages))
        verified = []
        for package in packages:
            verified.append((package, verified_archive(package, lock_file, progress)))
            progress.advance(overall)
    return verified


# ---------------------------------------------------------------- conda layer


def rattler_install(archives: list[tuple[str, str, str]], prefix: str, final_prefix: str, platform: str,
                    package_cache: str) -> int:
    """Install verified archives with py-rattler (runs inside run_isolated's worker).

    archives: (local verified file, the lock's URL, its channel). Records are built from the verified
    files themselves, so what is installed is what was hashed; conda-meta then names the lock's URL."""
    import asyncio

    import rattler

    async def install() -> None:
        records = []
        for local, url, channel in archives:
            record = await rattler.RepoDataRecord.from_package_archive(local)
            records.append(rattler.RepoDataRecord(record, record.file_name, Path(local).as_uri(), channel))
        await rattler.install(records, target_prefix=prefix, cache_dir=package_cache,
                              platform=rattler.Platform(platform), alternative_target_prefix=final_prefix,
                              show_progress=sys.stderr.isatty())

    asyncio.run(install())
    by_file = {Path(local).name: (url, channel) for local, url, channel in archives}
    for meta in Path(prefix, "conda-meta").glob("*.json"):
        record = json.loads(meta.read_text())
        if record.get("fn") in by_file:
            record["url"], record["channel"] = by_file[record["fn"]]
            meta.write_text(json.dumps(record, indent=2))
    return len(records_installed(Path(prefix)))


def records_installed(prefix: Path) -> list[Path]:
    return sorted((prefix / "conda-meta").glob("*.json"))


def install_conda_with_rattler(packages: list[LockedPackage], lock_file: Path, staging: Path, prefix: Path,
                               platform: str) -> None:
    verified = verify_all(packages, lock_file)
    archives = [(str(path), package.url, package.channel) for package, path in verified]
    with console.status(f"installing {len(archives)} conda packages (py-rattler)"):
        count = run_isolated(rattler_install, archives, str(staging), str(prefix), platform,
                             str(staging.parent / f"{staging.name}.pkgs"))
    console.print(f"{count} conda packages installed")


def install_with_conda_lock(lock_file: Path, staging: Path, conda_exe: str) -> None:
    """`conda-lock install` (conda and pip layers) with a real micromamba/mamba/conda."""
    with console.status(f"conda-lock install with {Path(conda_exe).name}"):
        result = subprocess.run([sys.executable, "-m", "conda_lock", "install", "--conda", conda_exe,
                                 "--prefix", str(staging), str(lock_file)], capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "no output")
        raise ToolkitError(f"{display_path(lock_file)}: conda-lock install failed ({last.strip()}; output above)")


# ---------------------------------------------------------------- pip layer


def install_pip_layer(packages: list[LockedPackage], staging: Path, prefix: Path) -> None:
    """The lock's wheels by URL, hash-checked by pip (--require-hashes), no resolution (--no-deps)."""
    if not packages:
        return
    python = staging / "bin" / "python"
    if not python.exists():
        raise ToolkitError(f"{staging}: the conda layer has no bin/python for the pip layer (lock python)")
    requirements = staging.parent / f"{staging.name}.pip.txt"
    requirements.write_text("".join(f"{p.name} @ {p.url} --hash=sha256:{p.sha256}\n" for p in packages))
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PIP_FIND_LINKS", None)
    console.print(f"installing {len(packages)} pip packages (pip --require-hashes --no-deps)")
    result = subprocess.run([str(python), "-m", "pip", "install", "--prefix", str(staging), "--no-deps",
                             "--require-hashes", "--no-index", "--ignore-installed", "--no-warn-script-location",
                             "--quiet", "--requirement", str(requirements)], env=env, capture_output=True, text=True)
    requirements.unlink()
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        mismatched = [p for p in packages if "DO NOT MATCH THE HASHES" in result.stderr
                      and any(line.replace(" ", "").startswith(f"{p.name}@") for line in lines)]
        problem = (f"{mismatched[0].name} {mismatched[0].version}: hash mismatch for {mismatched[0].url} (the wheel "
                   f"was changed or the index serves another file)") if mismatched \
            else (lines[-1] if lines else "no output")
        raise ToolkitError(f"pip layer: {problem}; nothing was installed")
    relocate_scripts(staging, prefix)


def relocate_scripts(staging: Path, prefix: Path) -> None:
    """pip writes its interpreter's path into script shebangs: point them at the final prefix."""
    old, new = str(staging).encode(), str(prefix).encode()
    for script in (staging / "bin").iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        with script.open("rb") as stream:
            head = stream.read(2)
        if head == b"#!":
            data = script.read_bytes()
            first, _, rest = data.partition(b"\n")
            if old in first:
                script.write_bytes(first.replace(old, new) + b"\n" + rest)


# ---------------------------------------------------------------- the whole install


def install_line(line: str, prefix: Path | None = None, locks_dir: Path = LOCKS_DIR, backend: str = "auto",
                 conda_exe: str | None = None, platform: str | None = None) -> Path:
    """Create the environment of a lock at prefix (default .envs/<line>); returns the prefix."""
    lock_file = lock_path(line, locks_dir)
    locked = read_lock(lock_file)
    if locked.toolchain_kind == "external":
        raise ToolkitError(f"{display_path(lock_file)}: {line} has an external toolchain: there is no environment "
                           f"to install (the machine provides it; `toolkit build {line}` checks it)")
    platform = platform or running_platform()
    if platform not in locked.platforms:
        raise ToolkitError(f"{display_path(lock_file)}: not locked for {platform} (locked: "
                           f"{', '.join(locked.platforms)}; add it to platforms in the spec and re-lock)")
    document = load_lock_document(lock_file)
    packages = locked_packages(document, platform)
    prefix = Path(prefix or ENVS_PREFIX_DIR / line).absolute()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    conda_exe = conda_exe or conda_executable()
    record = {"line": line, "lock": str(lock_file.resolve()), "platform": platform, "input_hash": locked.input_hash,
              "lock_sha256": document["metadata"]["custom_metadata"]["fa-envkit.lock-sha256"]}
    if choose_backend(backend, conda_exe) == "conda-lock":
        install_in_place_with_conda_lock(lock_file, prefix, conda_exe, record)
        return prefix
    staging = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.installing-", dir=prefix.parent))
    try:
        install_conda_with_rattler([p for p in packages if p.manager == "conda"], lock_file, staging, prefix, platform)
        install_pip_layer([p for p in packages if p.manager == "pip"], staging, prefix)
        write_record(staging, record)
        replace_prefix(staging, prefix)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging.parent / f"{staging.name}.pkgs", ignore_errors=True)
    return prefix


def write_record(prefix: Path, record: dict) -> None:
    """Written last: an environment without it is not a finished one."""
    path = prefix / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def install_in_place_with_conda_lock(lock_file: Path, prefix: Path, conda_exe: str, record: dict) -> None:
    """micromamba/conda write the prefix into files and cannot relocate an environment, so this backend
    builds at the final path: an older environment there is set aside and restored if the install fails,
    and the fa-envkit record (what marks it finished) is written last."""
    retired = None
    if prefix.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.old-", dir=prefix.parent))
        os.replace(prefix, retired / prefix.name)
    try:
        install_with_conda_lock(lock_file, prefix, conda_exe)
        write_record(prefix, record)
    except BaseException:
        shutil.rmtree(prefix, ignore_errors=True)
        if retired:
            os.replace(retired / prefix.name, prefix)
        raise
    finally:
        if retired:
            shutil.rmtree(retired, ignore_errors=True)


def replace_prefix(staging: Path, prefix: Path) -> None:
    """Move the finished environment into place; an older one there is removed only afterwards."""
    retired = None
    if prefix.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.old-", dir=prefix.parent))
        os.replace(prefix, retired / prefix.name)
    os.replace(staging, prefix)
    if retired:
        shutil.rmtree(retired, ignore_errors=True)


# ---------------------------------------------------------------- the `install` verb


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "install", help="create a line's environment from its lock",
        description="Create the environment of locks/<line>.conda-lock.yml: `conda-lock install` where "
                    "micromamba/mamba/conda is on PATH, else py-rattler after checking every archive's sha256, "
                    "then the pip layer with --require-hashes --no-deps. Built in a temporary prefix and "
                    "renamed into place.")
    parser.add_argument("line", metavar="LINE", help="line name (cu126)")
    parser.add_argument("--prefix", type=Path, help="where the environment goes (default: .envs/LINE)")
    parser.add_argument("--backend", choices=("auto", "conda-lock", "rattler"), default="auto",
                        help="installer (auto: conda-lock if micromamba/mamba/conda is on PATH, else rattler)")
    parser.add_argument("--conda", metavar="EXE", help="micromamba/mamba/conda for the conda-lock backend")
    parser.add_argument("--locks", type=Path, default=LOCKS_DIR, help="lock directory (default: locks)")
    parser.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    prefix = install_line(args.line, args.prefix, args.locks, args.backend, args.conda)
    print(f"{display_path(prefix)}: environment of {display_path(lock_path(args.line, args.locks))} installed")
    return 0

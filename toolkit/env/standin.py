"""Another environment's packages standing in for a lock's wheels (`toolkit install LINE --torch-from PYTHON`).

A machine image or cluster module often ships torch with its CUDA wheels already (the lent H200's
/opt/torch/.venv), and a CUDA torch with its libraries is several GB that a machine without internet cannot
fetch. With --torch-from, every locked package that PYTHON's environment holds at the locked version is copied
from there into the new venv, file by file as its RECORD lists them, each a regular file of that site-packages
read no further than the RECORD's size and checked against its sha256 while it is copied. torch is taken only
when its release is the lock's and it was built for the line's CUDA. The install record names what was taken so:
those bytes are the other environment's, checked against its own RECORD, not against the lock's wheel hashes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from toolkit.base.bounded_read import Unreadable, open_regular
from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.env.install_record import record_rows
from toolkit.env.lockfile import LockedPackage

# What the other interpreter has: each distribution's version and dist-info folder, torch's CUDA, its X.Y.
PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "dists = {}\n"
    "for d in m.distributions():\n"
    "    name, path = d.metadata['Name'], getattr(d, '_path', None)\n"
    "    if name and path is not None:\n"
    "        dists.setdefault(name, {'version': d.version, 'dist_info': str(path)})\n"
    "try:\n"
    "    import torch\n"
    "    cuda = torch.version.cuda\n"
    "except Exception:\n"
    "    cuda = None\n"
    "print(json.dumps({'dists': dists, 'torch_cuda': cuda, 'python': '%d.%d' % sys.version_info[:2]}))\n"
)
FIX = "point --torch-from at an interpreter whose torch is the lock's, or drop it"


@dataclass(frozen=True)
class StandIn:
    """One locked package taken from the other environment."""

    name: str  # canonical
    version: str  # the other environment's (torch may carry a local label: 2.11.0+cu130)
    dist_info: Path  # its .dist-info folder there

    def describe(self) -> str:
        return f"{self.version} from {self.dist_info.parent}"


@dataclass(frozen=True)
class OtherEnvironment:
    """What `--torch-from PYTHON` has to offer."""

    python: Path
    version: str  # X.Y
    torch_cuda: str | None
    dists: dict[str, StandIn]  # canonical name -> what is installed there

    @classmethod
    def probe(cls, python: Path) -> OtherEnvironment:
        try:
            done = run_tied([str(python), "-c", PROBE], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolkitError(
                f"--torch-from {python}: does not run ({exc.__class__.__name__}; {FIX})"
            ) from None
        try:
            data = json.loads(done.stdout)
            dists = {
                str(canonicalize_name(name)): StandIn(
                    canonicalize_name(name), str(d["version"]), Path(d["dist_info"])
                )
                for name, d in data["dists"].items()
            }
            return cls(python, str(data["python"]), data["torch_cuda"], dists)
        except (ValueError, KeyError, TypeError, AttributeError):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(
                f"--torch-from {python}: did not answer as a Python interpreter does ({last}; "
                f"{FIX})"
            ) from None

    def split(
        self, packages: tuple[LockedPackage, ...], python: str, cuda: str
    ) -> tuple[tuple[StandIn, ...], tuple[LockedPackage, ...]]:
        """(what is taken from here, what is still installed from the lock's wheels); refused unless torch
        is the lock's release, built for `cuda`, under the same python X.Y."""
        locked = next((p for p in packages if p.name == "torch"), None)
        torch = self.dists.get("torch")
        where = f"--torch-from {self.python}"
        if locked is None:
            raise ToolkitError(
                f"{where}: the lock has no torch to stand in for (drop --torch-from)"
            )
        if self.version != python:
            raise ToolkitError(
                f"{where}: is python {self.version}, the line's venv is {python} ({FIX})"
            )
        if torch is None:
            raise ToolkitError(f"{where}: has no torch (the lock's is {locked.version}; {FIX})")
        if not same_release(torch.version, locked.version):
            raise ToolkitError(
                f"{where}: has torch {torch.version}, the lock's is {locked.version} ({FIX})"
            )
        if self.torch_cuda != cuda:
            built = f"built for CUDA {self.torch_cuda}" if self.torch_cuda else "a CPU-only build"
            raise ToolkitError(
                f"{where}: its torch {torch.version} is {built}, the line is CUDA {cuda} ({FIX})"
            )
        taken = tuple(
            self.dists[p.name]
            for p in packages
            if p.name in self.dists
            and (p.name == "torch" or same_version(self.dists[p.name].version, p.version))
        )
        names = {s.name for s in taken}
        return taken, tuple(p for p in packages if p.name not in names)


def same_version(installed: str, locked: str) -> bool:
    try:
        return Version(installed) == Version(locked)
    except InvalidVersion:
        return False


def same_release(installed: str, locked: str) -> bool:
    """torch 2.11.0+cu130 (a CUDA index's build) is release 2.11.0, PyPI's."""
    try:
        return Version(installed).public == Version(locked).public
    except InvalidVersion:
        return False


def copy_in(stand_in: StandIn, site: Path) -> int:
    """Copy one distribution's files (as its RECORD lists them, inside its site-packages) into `site`, each a
    regular file there read no further than its RECORD size and checked against its RECORD sha256; returns
    the bytes copied. The other environment is input: a FIFO, a folder, a link to /dev/zero or out of its
    site-packages, a row without a hash is refused in one line naming the file, never copied unchecked.
    Scripts the RECORD places outside site-packages (../../bin) belong to the other interpreter and are left
    there; the bytecode pip compiled is skipped (see `unhashed`). The copy's RECORD lists what was copied."""
    source = stand_in.dist_info.parent.resolve()
    own = PurePosixPath(stand_in.dist_info.name, "RECORD")
    fix = f"reinstall {stand_in.name} there, or drop --torch-from"
    kept: list[list[str]] = []
    copied = 0
    for row in record_rows(stand_in.dist_info / "RECORD", fix):
        relative = PurePosixPath(row[0])
        if relative.is_absolute() or ".." in relative.parts or unhashed(row, relative):
            continue
        if relative != own:
            copied += copy_checked(
                source, relative, row, site / relative, f"{stand_in.dist_info.name}/RECORD", fix
            )
        kept.append(row[:3] if relative != own else [row[0], "", ""])
    record = site / own
    record.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    with open(record, "x", newline="") as writer:
        csv.writer(writer, lineterminator="\n").writerows(
            kept if str(own) in (r[0] for r in kept) else [*kept, [str(own), "", ""]]
        )
    return copied


def unhashed(row: list[str], relative: PurePosixPath) -> bool:
    """A row pip writes without a hash for the bytecode it compiled at install (pip's RECORD lists
    `__pycache__/*.pyc,,`): nothing checks those bytes, and a .pyc runs instead of its checked .py, so it is
    not copied; the new venv's python compiles its own. The RECORD's own row is the only other unhashed one."""
    return (
        len(row) > 1
        and not row[1]
        and relative.suffix == ".pyc"
        and relative.parent.name == "__pycache__"
    )


def copy_checked(
    source: Path, relative: PurePosixPath, row: list[str], target: Path, record: str, fix: str
) -> int:
    """One RECORD row's file from `source` (a resolved site-packages) to `target`: refused unless it is a
    regular file inside `source`, of the RECORD's size and sha256; returns its size."""
    path = source / relative
    wanted, size = (row + ["", ""])[1:3]
    if not wanted:
        raise ToolkitError(
            f"{path}: {record} lists it without a hash (it cannot be checked; {fix})"
        )
    if not wanted.startswith("sha256="):
        raise ToolkitError(
            f"{path}: {record} lists it with a {wanted.partition('=')[0]!r} hash, not a sha256 (it "
            f"cannot be checked; {fix})"
        )
    if not re.fullmatch(r"[0-9]{1,15}", size):
        raise ToolkitError(
            f"{path}: {record} lists it without a size (it cannot be read to its end; {fix})"
        )
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(source):
        raise ToolkitError(f"{path}: leads out of {source} (to {real}; {fix})")
    try:
        fd = open_regular(real, follow_symlinks=False)
    except Unreadable as exc:
        detail = {
            "missing": "missing",
            "error": exc.detail,
            "special": f"{exc.detail}, not a file",
        }[exc.why]
        raise ToolkitError(f"{path}: cannot be copied ({detail}; {fix})") from None
    digest, length, limit = hashlib.sha256(), 0, int(size)
    try:
        executable = os.fstat(fd).st_mode & 0o111
        target.parent.mkdir(parents=True, exist_ok=True)
        if (
            target.is_symlink() or target.exists()
        ):  # the venv's own pip/setuptools: replaced, as pip would
            target.unlink()
        with open(fd, "rb", closefd=False) as reader, open(target, "xb") as writer:
            while length <= limit and (chunk := reader.read(min(1 << 20, limit + 1 - length))):
                digest.update(chunk)
                writer.write(chunk)
                length += len(chunk)
    except OSError as exc:
        raise ToolkitError(
            f"{path}: cannot be copied ({exc.strerror or exc.__class__.__name__}; {fix})"
        ) from None
    finally:
        os.close(fd)
    differs = (
        f"more than its {limit} bytes"
        if length > limit
        else f"{length} bytes, not {limit}"
        if length < limit
        else "another sha256"
        if record_hash(digest.digest()) != wanted.removeprefix("sha256=")
        else ""
    )
    if differs:
        raise ToolkitError(
            f"{path}: not the file {record} lists ({differs}: changed since it was installed; {fix})"
        )
    if executable:
        target.chmod(0o755)
    return length


def record_hash(digest: bytes) -> str:
    """A RECORD's hash form: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def local_wheels(packages: tuple[LockedPackage, ...], folder: Path) -> tuple[LockedPackage, ...]:
    """The lock's wheels read from `folder` (`--wheels`, for a machine without internet): each by its file
    name, still hash-checked by pip. Refused unless every one is there."""
    from dataclasses import replace

    missing = [p.filename for p in packages if not (folder / p.filename).is_file()]
    if missing:
        raise ToolkitError(
            f"--wheels {folder}: lacks {len(missing)} of the lock's wheels ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}; copy them there from the lock's URLs)"
        )
    return tuple(replace(p, url=(folder / p.filename).resolve().as_uri()) for p in packages)

"""Another environment's packages standing in for a lock's wheels (`toolkit install LINE --torch-from PYTHON`).

A machine image or cluster module often ships torch with its CUDA wheels already (the lent H200's
/opt/torch/.venv), and a CUDA torch with its libraries is several GB that a machine without internet cannot
fetch. With --torch-from, every locked package that PYTHON's environment holds at the locked version is copied
from there into the new venv, file by file as its RECORD lists them, each file checked against that RECORD's
sha256 while it is copied. torch is taken only when its release is the lock's and it was built for the line's
CUDA. The install record names what was taken so: those bytes are the other environment's, checked against its
own RECORD, not against the lock's wheel hashes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.env.install_record import record_rows
from toolkit.env.lockfile import LockedPackage

# What the other interpreter has: each distribution's version and dist-info folder, torch's CUDA, its X.Y.
PROBE = ("import importlib.metadata as m, json, sys\n"
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
         "print(json.dumps({'dists': dists, 'torch_cuda': cuda, 'python': '%d.%d' % sys.version_info[:2]}))\n")
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
            raise ToolkitError(f"--torch-from {python}: does not run ({exc.__class__.__name__}; {FIX})") from None
        try:
            data = json.loads(done.stdout)
            dists = {str(canonicalize_name(name)): StandIn(canonicalize_name(name), str(d["version"]), Path(d["dist_info"]))
                     for name, d in data["dists"].items()}
            return cls(python, str(data["python"]), data["torch_cuda"], dists)
        except (ValueError, KeyError, TypeError, AttributeError):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(f"--torch-from {python}: did not answer as a Python interpreter does ({last}; "
                               f"{FIX})") from None

    def split(self, packages: tuple[LockedPackage, ...], python: str, cuda: str) -> tuple[
            tuple[StandIn, ...], tuple[LockedPackage, ...]]:
        """(what is taken from here, what is still installed from the lock's wheels); refused unless torch
        is the lock's release, built for `cuda`, under the same python X.Y."""
        locked = next((p for p in packages if p.name == "torch"), None)
        torch = self.dists.get("torch")
        where = f"--torch-from {self.python}"
        if locked is None:
            raise ToolkitError(f"{where}: the lock has no torch to stand in for (drop --torch-from)")
        if self.version != python:
            raise ToolkitError(f"{where}: is python {self.version}, the line's venv is {python} ({FIX})")
        if torch is None:
            raise ToolkitError(f"{where}: has no torch (the lock's is {locked.version}; {FIX})")
        if not same_release(torch.version, locked.version):
            raise ToolkitError(f"{where}: has torch {torch.version}, the lock's is {locked.version} ({FIX})")
        if self.torch_cuda != cuda:
            built = f"built for CUDA {self.torch_cuda}" if self.torch_cuda else "a CPU-only build"
            raise ToolkitError(f"{where}: its torch {torch.version} is {built}, the line is CUDA {cuda} ({FIX})")
        taken = tuple(self.dists[p.name] for p in packages if p.name in self.dists
                      and (p.name == "torch" or same_version(self.dists[p.name].version, p.version)))
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
    """Copy one distribution's files (as its RECORD lists them, inside its site-packages) into `site`, each
    checked against the RECORD's sha256 as it is read; returns the bytes copied. Scripts the RECORD places
    outside site-packages (../../bin) belong to the other interpreter and are left there."""
    source = stand_in.dist_info.parent
    fix = f"reinstall {stand_in.name} there, or drop --torch-from"
    copied = 0
    for row in record_rows(stand_in.dist_info / "RECORD", fix):
        relative = PurePosixPath(row[0])
        if relative.is_absolute() or ".." in relative.parts:
            continue
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():  # the venv's own pip/setuptools: replaced, as pip would
            target.unlink()
        digest = hashlib.sha256()
        try:
            with open(source / relative, "rb") as reader, open(target, "xb") as writer:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    writer.write(chunk)
                    copied += len(chunk)
        except OSError as exc:
            raise ToolkitError(f"{source / relative}: cannot be copied ({exc.strerror or exc.__class__.__name__}; "
                               f"{fix})") from None
        wanted = row[1] if len(row) > 1 else ""
        if wanted.startswith("sha256=") and record_hash(digest.digest()) != wanted.removeprefix("sha256="):
            raise ToolkitError(f"{source / relative}: not the file {stand_in.dist_info.name}/RECORD lists (changed "
                               f"since it was installed; {fix})")
        if (source / relative).stat().st_mode & 0o111:
            target.chmod(0o755)
    return copied


def record_hash(digest: bytes) -> str:
    """A RECORD's hash form: urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def local_wheels(packages: tuple[LockedPackage, ...], folder: Path) -> tuple[LockedPackage, ...]:
    """The lock's wheels read from `folder` (`--wheels`, for a machine without internet): each by its file
    name, still hash-checked by pip. Refused unless every one is there."""
    from dataclasses import replace

    missing = [p.filename for p in packages if not (folder / p.filename).is_file()]
    if missing:
        raise ToolkitError(f"--wheels {folder}: lacks {len(missing)} of the lock's wheels ({', '.join(missing[:3])}"
                           f"{', ...' if len(missing) > 3 else ''}; copy them there from the lock's URLs)")
    return tuple(replace(p, url=(folder / p.filename).resolve().as_uri()) for p in packages)

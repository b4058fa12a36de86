"""The environment of a `pypi` line: a venv of the machine's python holding every locked wheel, CUDA inside it.

NVIDIA's CUDA 13 wheels install one CUDA-like tree, site-packages/nvidia/cu13, which is the line's CUDA_HOME
(toolkit/knowledge/pypi_cuda.yaml). No wheel ships what a build links against by its plain name, so the
knowledge's symlinks are made there (lib/libcudart.so; lib64 where nvcc.profile still links from it).

install.py owns where the environment goes (the prefix checks, the swap, the record): this module only
fills its staging folder. The venv is made there, so every file that names its own folder (bin/activate*,
pyvenv.cfg, the scripts' headers) is rewritten for the final prefix before the swap, each in its own form:
a script's header as pip would write it for that path (/bin/sh + exec where it has a space), activate's
quoting kept. A prefix whose path activate would run as shell code is refused first. What the toolkit
itself wrote (the venv's own files, the symlinks), which no wheel's RECORD lists, is returned for the
install record, so a later reinstall can tell them from a user's files.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from rich.console import Console

from toolkit.base.children import run_tied
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.env.engine import install_pip_layer, relocate_scripts
from toolkit.env.lockfile import LockedPackage
from toolkit.env.wheels import Closure
from toolkit.knowledge.facts import PypiLine, load_knowledge

if (
    TYPE_CHECKING
):  # --torch-from and --wheels only: an install without them does not import the stand-ins' reader
    from toolkit.env.standin import StandIn
    from toolkit.spec.envspec import EnvSpec

# The interpreter's X.Y (venv and ensurepip must import), then the pip wheels it keeps for ensurepip: its own
# _bundled folder, or (Debian's) WHEEL_PKG_DIR. One probe for both: each python started costs a tenth of a second.
PROBE_CODE = (
    "import ensurepip, glob, os, sys, sysconfig, venv\n"
    "print('%d.%d' % sys.version_info[:2])\n"
    "folders = [sysconfig.get_config_var('WHEEL_PKG_DIR'), "
    "os.path.join(os.path.dirname(ensurepip.__file__), '_bundled')]\n"
    "print('\\n'.join(w for f in folders if f for w in glob.glob(os.path.join(f, 'pip-*.whl'))))\n"
)


def site_packages(root: Path, python: str) -> Path:
    """The venv's purelib (posix_prefix scheme): where pip puts the wheels, and nvidia/cu13 with them."""
    return root / "lib" / f"python{python}" / "site-packages"


def cuda_home(root: Path, python: str) -> Path:
    """The line's CUDA_HOME inside the venv at `root` (pypi_cuda.yaml's cuda_home, relative to site-packages)."""
    return site_packages(root, python) / load_knowledge().pypi.cuda_home


def find_python(version: str, given: Path | None) -> tuple[Path, tuple[LockedPackage, ...]]:
    """The interpreter the venv is made with: `given` (--python), else pythonX.Y on PATH; refused unless it
    runs, is that version and has venv and ensurepip (Debian splits them into python3.X-venv). With it, the
    pip wheel it bundles for ensurepip as a lock entry (bundled_pip), found by the same probe."""
    fix = f"install python {version}, or pass --python PATH"
    found = str(given) if given else shutil.which(f"python{version}")
    if not found:
        raise ToolkitError(
            f"python{version}: not on PATH; the line's spec asks for python {version} ({fix})"
        )
    try:
        done = run_tied([found, "-I", "-c", PROBE_CODE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolkitError(f"{found}: does not run ({exc.__class__.__name__}; {fix})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"{found}: cannot make a venv ({last}; {fix})")
    found_version, *wheels = done.stdout.splitlines() or [""]
    if found_version.strip() != version:
        raise ToolkitError(
            f"{found}: is python {found_version.strip()}, the line's spec asks for {version} ({fix})"
        )
    return Path(found), pip_entry(wheels)


@dataclass(frozen=True)
class VenvBuild:
    """Everything a pypi install needs, found (and refused) before anything is written."""

    python: Path  # the machine's interpreter the venv is made with
    version: str  # its X.Y, the spec's
    packages: tuple[LockedPackage, ...]  # installed from their wheels
    line: PypiLine
    cuda_home: str  # relative to site-packages
    stand_ins: tuple[StandIn, ...] = ()  # copied from another environment (--torch-from) instead
    lock_file: Path = Path("lock")  # the lock the packages are from, named in messages
    bundled: tuple[LockedPackage, ...] | None = (
        None  # python's own pip (find_python); None: asked of it in make
    )

    @classmethod
    def of(
        cls,
        spec: EnvSpec,
        packages: list[LockedPackage],
        given: Path | None,
        torch_from: Path | None = None,
        wheels: Path | None = None,
        lock_file: Path = Path("lock"),
    ) -> VenvBuild:
        """Refused here, before anything is written: no such line, no such python, a --torch-from whose torch
        is not the lock's, a --wheels folder that lacks a wheel still to install."""
        pypi = load_knowledge().pypi
        line = pypi.line(spec.cuda, spec.torch_version)
        if line is None:
            raise ToolkitError(
                f"{display_path(spec.path)}: CUDA {spec.cuda} with torch {spec.torch_version} is not a "
                f"pypi line of toolkit/knowledge/pypi_cuda.yaml (`toolkit check {spec.line}` says why)"
            )
        python, bundled = find_python(spec.python, given)
        from toolkit.env.standin import OtherEnvironment, local_wheels

        stand_ins: tuple[StandIn, ...] = ()
        rest = tuple(packages)
        if torch_from:
            stand_ins, rest = OtherEnvironment.probe(torch_from).split(rest, spec.python, spec.cuda)
        if wheels:
            rest = local_wheels(rest, wheels)
        return cls(python, spec.python, rest, line, pypi.cuda_home, stand_ins, lock_file, bundled)

    def make(self, staging: Path, prefix: Path, console: Console) -> list[str]:
        """The venv at staging, for use at prefix; returns what the toolkit wrote outside the wheels' RECORDs.

        python's own venv module makes it (its activate scripts, whose quoting relocate keeps), without pip:
        ensurepip takes seconds, so pip is installed by uv before the wheels, from the wheel the python itself
        bundles for ensurepip (hashed here), unless the lock pins one."""
        check_venv_prefix(prefix)
        bundled = bundled_pip(self.python) if self.bundled is None else self.bundled
        seed = () if any(p.name == "pip" for p in self.packages) else bundled
        without = ["--without-pip"] if seed else []
        done = run_tied(
            [str(self.python), "-I", "-m", "venv", *without, "--prompt", prefix.name, str(staging)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(f"{self.python} -m venv: failed ({last}); nothing was installed")
        site = site_packages(staging, self.version)
        written = venv_files(staging, site)
        if self.stand_ins:
            from toolkit.env.standin import copy_in

            copied = sum(copy_in(stand_in, site) for stand_in in self.stand_ins)
            console.print(
                f"{len(self.stand_ins)} packages copied from --torch-from ({copied / 1e9:.1f} GB, every file "
                f"checked against its RECORD): {', '.join(f'{s.name} {s.version}' for s in self.stand_ins)}"
            )
        install_pip_layer(
            list(self.packages), staging, prefix, console, self.lock_file, self.closure(), seed
        )
        home = site_packages(staging, self.version) / self.cuda_home
        if not (home / "bin" / "nvcc").is_file():
            raise ToolkitError(
                f"{self.cuda_home}/bin/nvcc: not installed by the lock's wheels (the lock lacks "
                f"nvidia-cuda-nvcc; re-run `toolkit lock`)"
            )
        written += [
            str(link.relative_to(staging)) for link in make_symlinks(home, self.line.symlinks)
        ]
        relocate(staging, prefix)
        return sorted(written)

    def closure(self) -> Closure | None:
        """What the wheels may depend on: the lock's packages, those copied from --torch-from too."""
        if not self.packages:
            return None
        names = frozenset(
            canonicalize_name(name)
            for name in [*(p.name for p in self.packages), *(s.name for s in self.stand_ins)]
        )
        return Closure(names, self.packages[0].platform, self.version)


def bundled_pip(python: Path) -> tuple[LockedPackage, ...]:
    """The pip wheel `python` bundles for ensurepip, as a lock entry (sha256 of the file as it is there): the
    pip `python -m venv` would install. None found (a python without one): () and the venv installs its own."""
    done = run_tied(
        [str(python), "-I", "-c", PROBE_CODE], capture_output=True, text=True, timeout=60
    )
    return pip_entry(done.stdout.splitlines()[1:] if done.returncode == 0 else [])


def pip_entry(wheels: list[str]) -> tuple[LockedPackage, ...]:
    """The newest of the pip wheels the probe listed, as a lock entry; () for none."""
    found = []
    for line in wheels:
        try:
            _, version, *_ = parse_wheel_filename(Path(line).name)
        except InvalidWheelFilename:
            continue
        found.append((version, Path(line)))
    if not found:
        return ()
    version, wheel = max(found)
    return (
        LockedPackage("pip", "pip", str(version), wheel.resolve().as_uri(), sha256_file(wheel)),
    )


def venv_files(root: Path, site: Path) -> list[str]:
    """Every path `python -m venv` made (folders too), relative; not what lies in site-packages (pip's own
    files, which its RECORD lists)."""
    made = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if here == site:
            dirs[:] = []
            continue
        made += [str((here / name).relative_to(root)) for name in [*dirs, *files]]
    return made


def make_symlinks(home: Path, symlinks: dict[str, str]) -> list[Path]:
    """The knowledge's links under CUDA_HOME (link -> target, relative to the link's folder); a link whose
    path a wheel already fills is left alone. Returns the links made."""
    made = []
    for link, target in symlinks.items():
        for name in (link, target):
            parts = PurePosixPath(name).parts
            if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
                raise ToolkitError(
                    f"toolkit/knowledge/pypi_cuda.yaml: symlinks: {name!r} is not a path inside "
                    f"CUDA_HOME (restore the file from the toolkit's repository)"
                )
        path = home / link
        if path.exists() or path.is_symlink():
            continue
        if not (path.parent / target).exists():
            raise ToolkitError(
                f"{link} -> {target}: the target is not among the installed wheels' files "
                f"(toolkit/knowledge/pypi_cuda.yaml names a file this lock does not install)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        made.append(path)
    return made


def relocate(staging: Path, prefix: Path) -> None:
    """Point what names the staging folder at the final prefix: the scripts' headers (pip's and the venv's
    own pip), pyvenv.cfg and the activate scripts, each in its own quoting. Binaries are left as they are
    (their lengths would change)."""
    relocate_scripts(staging, prefix)
    old, new = str(staging), str(prefix)
    config = staging / "pyvenv.cfg"
    config.write_bytes(config.read_bytes().replace(old.encode(), new.encode()))
    for script in sorted((staging / "bin").glob("[Aa]ctivate*")):
        # python's venv writes the path in double quotes, or since the fix of CVE-2024-9287 shlex-quoted
        # (bare where nothing in it needs quoting); check_venv_prefix keeps the prefix safe in double quotes.
        data = script.read_bytes()
        for was, now in ((f'"{old}"', f'"{new}"'), (shlex.quote(old), shlex.quote(new))):
            data = data.replace(was.encode(), now.encode())
        if old.encode() in data:
            raise ToolkitError(
                f"bin/{script.name}: names the venv's folder in a form the toolkit cannot relocate; "
                f"nothing was installed (report it with your python's version)"
            )
        script.write_bytes(data)


# What a venv's path may hold: its activate scripts write it (and its name, the prompt) into shell code,
# inside double quotes where python's venv predates the fix of CVE-2024-9287. None of these is code there
# (no $, backtick, quote, backslash, newline or !) or splits PATH (:).
VENV_PATH_CHARACTER = re.compile(r"[\w .+@%=,/-]")


def check_venv_prefix(prefix: Path) -> None:
    """Refuse a venv's folder whose path the shell would run when bin/activate is sourced."""
    path = str(prefix.absolute())
    odd = "".join(sorted({c for c in path if not VENV_PATH_CHARACTER.fullmatch(c)}))
    if odd:
        raise ToolkitError(
            f"{path!r}: a pypi line's venv cannot go here: its path holds {odd!r}, which its "
            f"bin/activate would hand to the shell; nothing was written (choose a --prefix of "
            f"letters, digits, spaces and ._+@%=,/- only)"
        )

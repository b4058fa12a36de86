"""The project's folders: one owner for every path the stages share, and the options that move them.

A verb never spells `envs/`, `locks/`, `.envs/`, `wheelhouse/`, `reports/`, `runs/` or the cache itself:
it builds a `Workspace` from its arguments (`--envs`, `--locks`, `--wheelhouse`, declared here once with
one help text) and asks it where a line's spec, lock, prefix, wheels or reports are.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.errors import ToolkitError

LOCK_SUFFIX = ".conda-lock.yml"  # locks/<line>.conda-lock.yml
# Records that may lie side by side in wheelhouse/<line>/: a built wheel's and a warmed kernel cache's.
BUILD_RECORD_SUFFIX = ".build.json"  # <wheel>.build.json (toolkit/build/record.py)
KERNEL_CACHE_RECORD_SUFFIX = ".kernel-cache.json"  # <name>.kernel-cache.json (toolkit/fa4/jit.py)
PROJECT_CACHE = Path(".cache")  # the project's own cache folder, in the working directory

# A line's name becomes a file name in four folders: a plain name, never a path.
LINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def checked_line(line: str, where: str | None = None) -> str:
    """The line name, or a one-line error when it could be read as a path, an option or shell."""
    if not LINE_NAME.fullmatch(line) or ".." in line:
        raise ToolkitError(
            f"{where or ascii(line)}: {ascii(line)} is not a line name (letters, digits, '.', '_', "
            f"'-', starting with a letter or digit, like cu126; a line is named by its "
            f"envs/<line>.yaml: rename the file)"
        )
    return line


# Where each implementation's wheels of a line lie: FA2's in the line's own folder, each other one's beside it in
# `<line><suffix>` (`+` is in no line name, so no line's own folder is ever one of these, and FA2's readers, which
# take every record in the line's folder as FA2's, never see another's). A published cache keeps the same folders.
WHEEL_FOLDER_SUFFIXES = {"flash-attn-2": "", "flash-attn-3": "+fa3"}


def wheel_folders(line: str) -> dict[str, str]:
    """Implementation -> the name of the line's folder of its wheels."""
    return {
        implementation: checked_line(line) + suffix
        for implementation, suffix in WHEEL_FOLDER_SUFFIXES.items()
    }


def folder_line(folder: str) -> tuple[str, str]:
    """A wheel folder's name -> (line, implementation): what wheel_folders names, read back."""
    for implementation, suffix in WHEEL_FOLDER_SUFFIXES.items():
        if suffix and folder.endswith(suffix):
            return folder.removesuffix(suffix), implementation
    return folder, "flash-attn-2"


@dataclass(frozen=True)
class Workspace:
    """Where each stage reads and writes, relative to the working directory unless given absolute."""

    envs: Path = Path("envs")  # env specs (envs/<line>.yaml)
    locks: Path = Path("locks")  # locks/<line>.conda-lock.yml
    wheelhouse: Path = Path(
        "wheelhouse"
    )  # wheelhouse/<line>/<wheel> + record, wheelhouse/simple/ (PEP 503)
    environments: Path = Path(".envs")  # .envs/<line>: the conda prefix `toolkit install` makes
    reports: Path = Path("reports")  # reports/<line>/: verify and bench output
    runs: Path = Path("runs")  # runs/<run id>/: matrix runs (plans, batch scripts, logs)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Workspace:
        given = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
        return cls(**given)

    def spec_file(self, line: str) -> Path:
        return self.envs / f"{checked_line(line)}.yaml"

    def lock_file(self, line: str) -> Path:
        return self.locks / f"{checked_line(line)}{LOCK_SUFFIX}"

    def fa4_lock_file(self, line: str) -> Path:
        """`toolkit fa4 lock`'s file: the line's exact FlashAttention-4 wheels and their URLs."""
        return self.locks / f"{checked_line(line)}.fa4-lock.json"

    def requirements_file(self, line: str, platform: str) -> Path:
        """The hash-pinned requirements file (uv's) rendered beside the lock, for pip-sync users."""
        return self.locks / f"{checked_line(line)}.{platform}.requirements.txt"

    def pylock_file(self, line: str) -> Path:
        """A pypi line's pip layer as PEP 751 locks/pylock.<line>.toml, the name `uv pip install -r` requires."""
        return self.locks / f"pylock.{checked_line(line)}.toml"

    def prefix(self, line: str) -> Path:
        return self.environments / checked_line(line)

    def wheel_dir(self, line: str, implementation: str = "flash-attn-2") -> Path:
        """The folder of the line's wheels of one implementation (wheel_folders)."""
        return self.wheelhouse / wheel_folders(line)[implementation]

    def report_dir(self, line: str) -> Path:
        return self.reports / checked_line(line)

    def backend_report_dir(self, line: str, implementation: str) -> Path:
        """Where an implementation's verification of the line goes by default (`toolkit verify` writes
        flash-attn-2's in the line's folder, as it always has, each other one's in a folder of its name, e.g.
        reports/LINE/flash-attn-4/), and where `toolkit recommend LINE` looks for it."""
        return (
            self.report_dir(line)
            if implementation == "flash-attn-2"
            else self.report_dir(line) / implementation
        )

    def recommendation_file(self, line: str) -> Path:
        """`toolkit recommend LINE`'s output, which doctor and the modulefile help read back."""
        return self.report_dir(line) / "recommendation.json"

    @property
    def cache(self) -> Path:
        """sdists and build directories: $TOOLKIT_CACHE, else .cache in the working directory."""
        return Path(os.environ.get("TOOLKIT_CACHE", PROJECT_CACHE))

    @property
    def line_locks(self) -> Path:
        """<line>.lock files, one matrix job per line at a time: in the project's .cache whatever $TOOLKIT_CACHE
        says, since the jobs of one run share the project directory but may each have their own cache."""
        return PROJECT_CACHE / "lines"

    @property
    def user_cache(self) -> Path:
        """The toolkit's caches shared by every project of the user: $XDG_CACHE_HOME/fa-envkit."""
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fa-envkit"

    @property
    def conda_package_cache(self) -> Path:
        """Verified conda archives, shared by every project of the user (named by sha256, re-checked on use)."""
        return self.user_cache / "conda-pkgs"

    @property
    def rattler_cache(self) -> Path:
        """py-rattler's package cache (the verified archives unpacked once, hardlinked into each environment)."""
        return self.user_cache / "rattler-pkgs"

    @property
    def uv_cache(self) -> Path:
        """uv's cache for the pip layers (each verified wheel unpacked once, linked into each environment)."""
        return self.user_cache / "uv"

    @property
    def caches_in_use(self) -> Path:
        """The entry whose lock every install holds, shared, while it reads or fills the caches above, and `toolkit
        caches prune/clear` exclusively while it removes them (base/fslock.py: `in-use.lock`)."""
        return self.user_cache / "in-use"

    def options(self) -> list[str]:
        """The --envs/--locks/--wheelhouse words that ask a verb for this workspace (none for the default)."""
        return [
            f"--{name}={getattr(self, name)}"
            for name in OPTIONS
            if getattr(self, name) != getattr(DEFAULT, name)
        ]


OPTIONS = ("envs", "locks", "wheelhouse")  # the folders a verb's command line can move
DEFAULT = Workspace()  # every folder where the verbs put it without options


def add_workspace_options(parser: argparse.ArgumentParser) -> None:
    """--envs, --locks and --wheelhouse, the same for every verb."""
    defaults = DEFAULT
    parser.add_argument(
        "--envs",
        type=Path,
        default=defaults.envs,
        metavar="DIR",
        help=f"env spec directory (default: {defaults.envs})",
    )
    parser.add_argument(
        "--locks",
        type=Path,
        default=defaults.locks,
        metavar="DIR",
        help=f"lock directory (default: {defaults.locks})",
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        default=defaults.wheelhouse,
        metavar="DIR",
        help=f"built wheels, their records and the PEP 503 index (default: {defaults.wheelhouse})",
    )

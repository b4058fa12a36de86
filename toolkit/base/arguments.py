"""The options several verbs share, declared once by name (as Spack's cmd/common/arguments.py and pip-tools'
options.py do): each verb calls the function instead of spelling the option, so `LINE`, `--python`,
`--prefix`, `--report-dir`, `--json` and `--arch` keep one dest, one metavar and one meaning everywhere.

A verb passes its own `help` where the option means something narrower there (doctor's LINE is optional and
only adds a comparison). The folders' options (--envs, --locks, --wheelhouse) are declared with the folders
they move, in toolkit/base/workspace.py. Only the standard library: the verify and bench children parse
their arguments under a line's python that may lack the toolkit's dependencies.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

LINE_HELP = "line name (cu126) or its spec file (envs/cu126.yaml)"


def add_line(
    parser: argparse.ArgumentParser,
    help: str = LINE_HELP,
    *,
    optional: bool = False,
    default: str | None = None,
) -> None:
    """The one line a verb works on, as the positional LINE (`args.line`); `optional`: LINE may be left out."""
    parser.add_argument(
        "line", metavar="LINE", nargs="?" if optional else None, default=default, help=help
    )


def add_lines(
    parser: argparse.ArgumentParser, help: str = "line names (cu126) or spec files"
) -> None:
    """Any number of lines, as positional LINEs (`args.lines`, a list; empty when none is given)."""
    parser.add_argument("lines", metavar="LINE", nargs="*", help=help)


def add_python(
    parser: argparse.ArgumentParser,
    help: str,
    *,
    type: Callable[[str], Any] = Path,
    default: str | None = None,
) -> None:
    """--python PYTHON: the interpreter of the environment a verb looks at. `type=str` where the value is looked up
    on PATH as a shell would (a Path would drop the `./` of `./python`)."""
    parser.add_argument("--python", type=type, default=default, metavar="PYTHON", help=help)


def add_prefix(
    parser: argparse.ArgumentParser, help: str = "the line's environment (default: .envs/LINE)"
) -> None:
    """--prefix DIR: one environment's folder (a conda prefix or a venv), never a list of folders to search."""
    parser.add_argument("--prefix", type=Path, metavar="DIR", help=help)


def add_report_dir(
    parser: argparse.ArgumentParser,
    help: str = "where reports go (default: reports/LINE)",
    *,
    required: bool = False,
) -> None:
    """--report-dir DIR: the folder a measurement writes its reports into."""
    parser.add_argument("--report-dir", type=Path, required=required, metavar="DIR", help=help)


def add_json(parser: argparse.ArgumentParser, help: str = "print JSON instead of a table") -> None:
    """--json: the verb's answer as JSON on stdout (its notices stay on stderr)."""
    parser.add_argument("--json", action="store_true", help=help)


def add_arch(
    parser: argparse.ArgumentParser,
    help: str,
    *,
    type: Callable[[str], Any] = str,
    required: bool = False,
) -> None:
    """--arch ARCH: the GPU architecture (sm) a verb builds for or keys by; `type=int` where one sm is measured."""
    parser.add_argument("--arch", type=type, required=required, metavar="ARCH", help=help)

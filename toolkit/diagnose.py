"""`toolkit explain LOG`: match a build or import log against the catalog of known failures.

The catalog is data (toolkit/knowledge/build_failures.yaml: pattern, cause, fix, source) so a new
failure users report is one entry, not code. A failed `toolkit build` runs the same matcher on its log.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from toolkit.errors import ToolkitError
from toolkit.knowledge import KNOWLEDGE_DIR
from toolkit.spec import display_path

CATALOG = KNOWLEDGE_DIR / "build_failures.yaml"


@dataclass(frozen=True)
class KnownFailure:
    id: str
    pattern: re.Pattern
    cause: str
    fix: str
    source: str


@dataclass(frozen=True)
class Diagnosis:
    failure: KnownFailure
    line_number: int  # 1-based, in the log
    line: str
    cause: str  # with the pattern's groups filled in
    fix: str

    def one_line(self) -> str:
        return f"{self.cause} ({self.fix}) [{self.failure.id}, log line {self.line_number}]"


@cache
def load_catalog(path: Path = CATALOG) -> tuple[KnownFailure, ...]:
    data = yaml.safe_load(path.read_text())
    sources = data["sources"]
    return tuple(
        KnownFailure(id=entry["id"], pattern=re.compile(entry["pattern"]), cause=entry["cause"], fix=entry["fix"],
                     source=sources[entry["source"]].strip())
        for entry in data["failures"]
    )


def _fill(template: str, match: re.Match) -> str:
    """'{1}' -> the pattern's first group (cause/fix texts name what the log said)."""
    return re.sub(r"\{(\d)\}", lambda m: match.group(int(m.group(1))) or "", template)


def diagnose(text: str, catalog: tuple[KnownFailure, ...] | None = None) -> Diagnosis | None:
    """The first catalog entry (in catalog order) that matches some line of the log."""
    lines = text.splitlines()
    for failure in catalog or load_catalog():
        for number, line in enumerate(lines, start=1):
            match = failure.pattern.search(line)
            if match:
                return Diagnosis(failure, number, line.strip(), _fill(failure.cause, match), _fill(failure.fix, match))
    return None


# pip's own wrapping around a failed build: never the cause itself.
PIP_BOILERPLATE = re.compile(r"subprocess-exited-with-error|Failed (building wheel|to build)|finished with status "
                             r"'error'|This error originates from a subprocess|^\s*error: metadata-generation-failed")
ERROR_LINE = re.compile(r"\berror\b|\w+Error: |\bfatal\b", re.IGNORECASE)


def first_error_line(text: str) -> str | None:
    """The first line that looks like an error and is not pip's wrapping: usually the root cause."""
    return next((line.strip() for line in text.splitlines()
                 if ERROR_LINE.search(line) and not PIP_BOILERPLATE.search(line)), None)


def explain_log(path: Path) -> str:
    """One line: the diagnosis of a log file, or its last error line when the failure is not catalogued."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise ToolkitError(f"{display_path(Path(path))}: cannot read ({exc.strerror}; pass a build log file)") from None
    found = diagnose(text)
    if found:
        return f"{display_path(Path(path))}: {found.one_line()}"
    first = first_error_line(text)
    hint = f"; first error line: {first[:300]}" if first else ""
    raise ToolkitError(f"{display_path(Path(path))}: no known failure matched "
                       f"(add it to toolkit/knowledge/build_failures.yaml{hint})")


def cmd_explain(args: argparse.Namespace) -> int:
    print(explain_log(args.log))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain", help="diagnose a build or import log against the catalog of known failures",
        description="Match a log (a failed `toolkit build`, pip or import output) against "
                    "toolkit/knowledge/build_failures.yaml and print the cause and the fix in one line.")
    parser.add_argument("log", type=Path, help="the log file")
    parser.set_defaults(func=cmd_explain)

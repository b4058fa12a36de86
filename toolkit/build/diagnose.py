"""`toolkit explain LOG`: match a build or import log against the catalog of known failures.

The catalog is data (toolkit/knowledge/build_failures.yaml: pattern, cause, fix, source) so a new
failure users report is one entry, not code. Where the right fix depends on facts (which CUDA lines
compile an arch, whether a "missing" header sits under the prefix's targets/ directory), the entry
names an `advice` function here that looks them up in the knowledge files or on disk and fills them in.
A failed `toolkit build` runs the same matcher on its log.

Logs can be anything (gigabytes, one endless line, binary): only the last TAIL_BYTES are read, and
every line is matched in pieces of at most PIECE characters, so the work is linear in what is read
and bounded per match; newlines before the tail are counted (up to COUNTED_BYTES) for line numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import BinaryIO

from packaging.version import Version

from toolkit.base.entry import add_renamed_option
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import arch_number, load_knowledge
from toolkit.knowledge.files import KNOWLEDGE_DIR

CATALOG = KNOWLEDGE_DIR / "build_failures.yaml"
TAIL_BYTES = 8 * 2**20  # a longer log is explained from its end, where a failed build stops
COUNTED_BYTES = 2**30  # up to this much before the tail is read only to count its lines
CHUNK_BYTES = 2**20
PIECE = 2048  # characters matched at once: a longer line is matched in overlapping pieces
OVERLAP = 256  # longer than any message the catalog matches, so none is cut in two
GROUP_CHARS = 200  # of a log's text quoted into a cause or fix
MAX_PREFIXES = 50  # environment prefixes taken from one log's -I/-isystem paths
UNPRINTABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class KnownFailure:
    id: str
    pattern: re.Pattern
    cause: str
    fix: str
    source: str
    advice: str | None = (
        None  # a name in ADVICE: facts filled into cause/fix, or None when the entry does not apply
    )


@dataclass(frozen=True)
class LogPiece:
    number: int  # 1-based line of the log (of the tail, when the head was too long to count)
    text: str  # at most PIECE characters of that line


@dataclass(frozen=True)
class LogTail:
    """What is explained of a log: its last TAIL_BYTES, as bounded pieces of lines."""

    pieces: tuple[LogPiece, ...]
    skipped: int = 0  # bytes before the tail, not matched
    numbered: bool = True  # line numbers count from the log's first line (False: from the tail's)

    def where(self, number: int) -> str:
        return (
            f"log line {number}"
            if self.numbered
            else f"line {number} of the log's last {TAIL_BYTES >> 20} MB"
        )


@dataclass(frozen=True)
class Diagnosis:
    failure: KnownFailure
    line_number: int  # 1-based, in the log
    line: str
    cause: str  # with the pattern's groups and the advice's facts filled in
    fix: str
    location: str  # "log line 12"

    def one_line(self) -> str:
        return f"{self.cause} ({self.fix}) [{self.failure.id}, {self.location}]"


@dataclass
class Context:
    """What advice may consult beyond the matched line: the rest of the log and the environment prefixes."""

    tail: LogTail
    given: tuple[Path, ...] = ()  # prefixes the caller knows (the build's, --search-prefix)
    _targets: dict[str, Path | None] = field(default_factory=dict)

    @cached_property
    def include_dirs(self) -> tuple[Path, ...]:
        """targets/<triple>/include of the given prefixes, then of those the log's compile commands name: where
        conda-forge puts CUDA headers. A conda env's compile names its prefix by more than <prefix>/include:
        its compiler (<prefix>/bin/x86_64-conda-linux-gnu-c++, nvcc), its python's headers
        (<prefix>/include/python3.12) and torch's (<prefix>/lib/python3.12/site-packages/torch/include)."""
        prefixes = dict.fromkeys(self.given)
        for piece in self.tail.pieces:
            if len(prefixes) >= MAX_PREFIXES:
                break
            for pattern in (INCLUDE_FLAG, COMPILER_PATH):
                for match in pattern.finditer(piece.text):
                    prefixes.setdefault(Path(match.group(1)))
        return tuple(
            d
            for prefix in list(prefixes)[:MAX_PREFIXES]
            for d in sorted((prefix / "targets").glob("*/include"))
        )

    def targets_with(self, header: str) -> Path | None:
        if header not in self._targets:
            self._targets[header] = next(
                (d for d in self.include_dirs if (d / header).is_file()), None
            )
        return self._targets[header]


INCLUDE_FLAG = re.compile(
    r"(?:-I|-isystem[ =]?)(/[^\s'\"]+?)(?:/lib/python3\.\d+/site-packages/torch)?"
    r"/include(?:/python3\.\d+)?/?(?=[\s'\"]|$)"
)
COMPILER_PATH = re.compile(
    r"(?:^|[\s'\"])(/[^\s'\"]+)/bin/(?:nvcc|[\w.+-]*(?:gcc|g\+\+|c\+\+))(?=[\s'\"]|$)"
)


# ---------------------------------------------------------------- advice: facts from knowledge and disk


def cuda_span(versions: list[str], lines: list[str]) -> str:
    """'11.8 to 12.9' for a run of consecutive lines, else the versions listed."""
    start = lines.index(versions[0])
    if versions == lines[start : start + len(versions)]:
        return versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"
    return ", ".join(versions)


def arch_lines(match: re.Match, context: Context) -> dict[str, str]:
    """Which CUDA lines compile the refused arch (toolkit/knowledge/cuda_lines.yaml), hence which way to go."""
    arch = match.group("arch")
    kb = load_knowledge()
    lines = sorted(kb.cuda_lines, key=Version)
    having = [v for v in lines if arch in kb.cuda_lines[v].archs]
    if not having:
        top = max(kb.cuda_lines[lines[-1]].archs, key=arch_number)
        newer = arch_number(arch) > arch_number(top)
        return {
            "known": f"no CUDA line the toolkit knows compiles sm_{arch} (the newest, {lines[-1]}, goes up to "
            f"sm_{top})",
            "remedy": "use a newer CUDA line once toolkit/knowledge/cuda_lines.yaml has one that compiles it"
            if newer
            else "no known nvcc compiles it",
        }
    span = cuda_span(having, lines)
    if having[0] != lines[0] and having[-1] == lines[-1]:
        remedy = f"use a newer CUDA line (>= {having[0]})"
    elif having[0] == lines[0] and having[-1] != lines[-1]:
        remedy = f"use an older CUDA line (<= {having[-1]}): later nvcc no longer compile it"
    elif having[0] == lines[0]:
        remedy = "every CUDA line compiles it, so this nvcc is none of them: build with the line's own (toolkit build LINE)"
    else:
        remedy = f"use a line with CUDA {span}"
    return {"known": f"CUDA {span} compile sm_{arch}", "remedy": remedy}


def header_under_targets(match: re.Match, context: Context) -> dict[str, str] | None:
    """The prefix's targets/<triple>/include holding the header the compiler did not find, if one does."""
    found = context.targets_with(match.group("header"))
    return {"targets": str(found)} if found else None


ADVICE: dict[str, Callable[[re.Match, Context], dict[str, str] | None]] = {
    "arch_lines": arch_lines,
    "header_under_targets": header_under_targets,
}


# ---------------------------------------------------------------- reading a log, bounded


def printable(text: str) -> str:
    """Log text fit for one line of output: control characters (terminal escapes too) written as escapes."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def pieces_of(text: str, first_number: int) -> tuple[LogPiece, ...]:
    """Lines (split at \\n only, as they were counted) cut into overlapping pieces of at most PIECE characters."""
    pieces = []
    for number, line in enumerate(text.split("\n"), start=first_number):
        for start in range(0, max(len(line) - OVERLAP, 1), PIECE - OVERLAP):
            pieces.append(LogPiece(number, line[start : start + PIECE]))
    return tuple(pieces)


def tail_of_text(text: str) -> LogTail:
    """The tail of output already in memory (a subprocess's stdout and stderr)."""
    skipped = max(len(text) - TAIL_BYTES, 0)
    return LogTail(pieces_of(text[skipped:], text.count("\n", 0, skipped) + 1), skipped)


def count_newlines(f: BinaryIO, size: int) -> int:
    count = 0
    while size > 0:
        chunk = f.read(min(CHUNK_BYTES, size))
        if not chunk:
            break
        count, size = count + chunk.count(b"\n"), size - len(chunk)
    return count


def read_tail(path: Path) -> LogTail:
    """The end of a regular file (never a FIFO or a device, which could block or never end)."""
    where = printable(display_path(Path(path)))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO must not wait for a writer
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ToolkitError(f"{where}: not a regular file (pass a build log file)")
            skipped = max(info.st_size - TAIL_BYTES, 0)
            newlines = count_newlines(f, skipped) if skipped <= COUNTED_BYTES else None
            f.seek(skipped)
            data = f.read(TAIL_BYTES)
    except OSError as exc:
        raise ToolkitError(
            f"{where}: cannot read ({exc.strerror}; pass a build log file)"
        ) from None
    text = data.decode("utf-8", errors="replace")
    return LogTail(pieces_of(text, (newlines or 0) + 1), skipped, numbered=newlines is not None)


# ---------------------------------------------------------------- matching


@cache
def load_catalog(path: Path | str = CATALOG.name) -> tuple[KnownFailure, ...]:
    """The catalog of known failures (a name in toolkit/knowledge/, or a path)."""
    return knowledge_files.typed(path, _catalog)


def _catalog(data: dict) -> tuple[KnownFailure, ...]:
    sources = data["sources"]
    return tuple(
        KnownFailure(
            id=entry["id"],
            pattern=re.compile(entry["pattern"]),
            cause=entry["cause"],
            fix=entry["fix"],
            source=sources[entry["source"]].strip(),
            advice=entry.get("advice"),
        )
        for entry in data["failures"]
    )


def _fill(template: str, match: re.Match, facts: dict[str, str]) -> str:
    """'{1}' -> the pattern's first group, '{header}' -> a named group or an advice fact (printable, bounded)."""

    def value(m: re.Match) -> str:
        key = m.group(1)
        text = facts[key] if key in facts else match.group(int(key) if key.isdigit() else key) or ""
        return printable(text[:GROUP_CHARS])

    return re.sub(r"\{(\w+)\}", value, template)


def diagnose_tail(
    tail: LogTail, catalog: tuple[KnownFailure, ...] | None = None, prefixes: tuple[Path, ...] = ()
) -> Diagnosis | None:
    """The first catalog entry (in catalog order) that matches some line of the log and applies."""
    context = Context(tail, tuple(Path(p) for p in prefixes))
    for failure in catalog or load_catalog():
        for piece in tail.pieces:
            match = failure.pattern.search(piece.text)
            facts = ADVICE[failure.advice](match, context) if match and failure.advice else {}
            if match and facts is not None:
                return Diagnosis(
                    failure,
                    piece.number,
                    printable(piece.text.strip()),
                    _fill(failure.cause, match, facts),
                    _fill(failure.fix, match, facts),
                    tail.where(piece.number),
                )
    return None


def diagnose(
    text: str, catalog: tuple[KnownFailure, ...] | None = None, prefixes: tuple[Path, ...] = ()
) -> Diagnosis | None:
    """diagnose_tail of output held in memory."""
    return diagnose_tail(tail_of_text(text), catalog, prefixes)


# pip's own wrapping around a failed build: never the cause itself.
PIP_BOILERPLATE = re.compile(
    r"subprocess-exited-with-error|Failed (building wheel|to build)|finished with status "
    r"'error'|This error originates from a subprocess|^\s*error: metadata-generation-failed"
)
# `\wError: ` finds what `\w+Error: ` does, without retrying a long word from every start (quadratic).
ERROR_LINE = re.compile(r"\berror\b|\wError: |\bfatal\b", re.IGNORECASE)


def first_error_line(tail: LogTail) -> str | None:
    """The first line that looks like an error and is not pip's wrapping: usually the root cause."""
    return next(
        (
            printable(piece.text.strip())
            for piece in tail.pieces
            if ERROR_LINE.search(piece.text) and not PIP_BOILERPLATE.search(piece.text)
        ),
        None,
    )


def describe(tail: LogTail, prefixes: tuple[Path, ...] = ()) -> str:
    """One line for a failed build step: the diagnosis, else the first error line."""
    found = diagnose_tail(tail, prefixes=prefixes)
    if found:
        return found.one_line()
    first = first_error_line(tail)
    return first[:300] if first else "no error line found"


def explain(text: str) -> str:
    """describe() of output held in memory (a pip install or import that failed)."""
    return describe(tail_of_text(text))


def explain_file(path: Path, prefixes: tuple[Path, ...] = ()) -> str:
    """describe() of a log file, read bounded (a build's log can be very long)."""
    return describe(read_tail(path), prefixes)


def explain_log(path: Path, prefixes: tuple[Path, ...] = ()) -> str:
    """One line: the diagnosis of a log file, or its first error line when the failure is not catalogued."""
    tail = read_tail(path)
    where = printable(display_path(Path(path)))
    found = diagnose_tail(tail, prefixes=prefixes)
    if found:
        return f"{where}: {found.one_line()}"
    first = first_error_line(tail)
    hint = f"; first error line: {first[:300]}" if first else ""
    partial = f"; only its last {TAIL_BYTES >> 20} MB were read" if tail.skipped else ""
    raise ToolkitError(
        f"{where}: no known failure matched "
        f"(add it to toolkit/knowledge/build_failures.yaml{hint}{partial})"
    )


def explain_command(args: argparse.Namespace) -> int:
    print(explain_log(args.log, tuple(args.search_prefix or ())))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain",
        description="Match a log (a failed `toolkit build`, pip or import output) against "
        "toolkit/knowledge/build_failures.yaml and print the cause and the fix in one line. "
        f"A log longer than {TAIL_BYTES >> 20} MB is explained from its end.",
    )
    parser.add_argument("log", type=Path, metavar="LOG", help="the log file")
    parser.add_argument(
        "--search-prefix",
        type=Path,
        action="append",
        metavar="DIR",
        help="an environment the build used, searched to tell a missing header from one it did "
        "not look for (default: the prefixes of the -I paths the log shows; repeatable)",
    )
    add_renamed_option(
        parser, "--prefix", "`--search-prefix DIR`"
    )  # --prefix is an environment to use elsewhere
    parser.set_defaults(func=explain_command)

"""`toolkit knowledge check-updates`: is the knowledge current? Names every release the indexes list that it does not cover.

Asks PyPI's JSON API (the packages the knowledge pins: torch, the attention packages, NVIDIA's wheels) and PyTorch's per-line
wheel indexes, as toolkit/knowledge/upstream.yaml says, and judges each release against the knowledge files.
`--recorded DIR` answers from files recorded earlier (tests, offline); `--record DIR` writes what it fetched,
trimmed, with the URL and date, into a new folder, so a test can replay today's answers.

A live answer and a recorded one are the same untrusted bytes: each is read bounded (a FIFO or /dev/zero is
refused, never read), a recorded file is named by a plain file name inside DIR, and every PyPI answer is
typed (`PypiAnswer`) before a field is used, so an answer of another shape is one line, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Annotated, Final, Literal

import pydantic
from packaging.version import Version

from toolkit.base.atomic import write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError, first_problem, shown
from toolkit.base.jsonfile import MAX_JSON_BYTES, parse_json, read_json
from toolkit.base.paths import display_path, folder_argument
from toolkit.base.typed import adapter
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import Knowledge, load_knowledge, minor_of

PYPI_JSON = "https://pypi.org/pypi/{package}/json"
RECORD_INDEX = "index.json"
ANSWER_FIX = "the index answered something else: check again later, or record the answers again with --record"
# The largest answer read, live or recorded: PyPI's JSON for torch (every file of every release) is a few MB.
MAX_ANSWER_BYTES = MAX_JSON_BYTES


@dataclass(frozen=True)
class Release:
    package: str
    version: str
    uploaded: str  # ISO date of its first file ("" when the index does not say)
    source: str  # the URL that listed it


@dataclass(frozen=True)
class Finding:
    """A release (or a group of them) the knowledge does not cover, with the file to add it to."""

    package: str
    versions: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{self.package} {', '.join(self.versions)}: {self.message}"


Fetch = Callable[[str], bytes]


# ---------------------------------------------------------------- answers from the indexes


@dataclass(frozen=True)
class PypiFile:
    """The fields read of one file of a release in PyPI's JSON API (the others are ignored)."""

    filename: str = ""
    upload_time: str = ""
    yanked: bool = False


@dataclass(frozen=True)
class PypiInfo:
    name: str
    version: str


@dataclass(frozen=True)
class PypiAnswer:
    """What /pypi/<name>/json must hold for the check to read it; anything else is refused by name."""

    info: PypiInfo
    releases: dict[str, list[PypiFile]] = field(default_factory=dict)


def _plain_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", name):
        raise ValueError(
            f"{shown(name)} is not a file name inside the recording's folder (no / or leading .)"
        )
    return name


PlainName = Annotated[str, pydantic.AfterValidator(_plain_name)]


@dataclass(frozen=True)
class RecordedAnswer:
    """One entry of a recording's index.json: the file inside the folder that holds the URL's answer."""

    file: PlainName  # a plain name: an absolute or ../ path is never followed out of the folder
    recorded: str = ""
    trimmed: str = ""


RECORD_SCHEMA: Final = 2  # 1 (no `schema`): the index was the URL -> RecordedAnswer map alone


@dataclass(frozen=True)
class Recording:
    """A recording's index.json: its schema and, per URL, the file that holds the answer."""

    answers: dict[str, RecordedAnswer]
    schema: Literal[2] = RECORD_SCHEMA


def recording(data: object, path: Path, fix: str) -> Recording:
    """index.json at schema 2 (a schema-1 index, the URL map alone, is read as its `answers`); another schema
    or shape is one ToolkitError line."""
    if (
        isinstance(data, dict)
        and "schema" in data
        and (data["schema"] != RECORD_SCHEMA or type(data["schema"]) is not int)
    ):
        raise ToolkitError(
            f"{display_path(path)}: an index of recorded answers of schema {shown(data['schema'])}, "
            f"which this toolkit does not read (it reads schemas 1 and {RECORD_SCHEMA}; {fix})"
        )
    try:
        if isinstance(data, dict) and "schema" in data:
            return adapter(Recording).validate_python(data)
        return Recording(
            adapter(dict[str, RecordedAnswer]).validate_python(data)
        )  # schema 1 (or no object at all: refused as one)
    except pydantic.ValidationError as exc:
        raise ToolkitError(
            f"{display_path(path)}: unreadable index of recorded answers ({first_problem(exc)}; "
            f"{fix})"
        ) from None


def live_fetch(url: str) -> bytes:
    """The index's answer, refused (ValueError: "not checked") past MAX_ANSWER_BYTES rather than read whole."""
    request = urllib.request.Request(url, headers={"Accept": "application/json, text/html"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = response.read(MAX_ANSWER_BYTES + 1)
    if len(answer) > MAX_ANSWER_BYTES:
        raise ValueError(f"answer larger than {MAX_ANSWER_BYTES:,} bytes")
    return answer


def recorded_fetch(folder: Path) -> Fetch:
    """Answers recorded by --record: folder/index.json maps each URL to a file in the folder."""
    fix = "record them again with `toolkit knowledge check-updates --record NEW_DIR`"
    path = folder / RECORD_INDEX
    index = recording(read_json(path, "index of recorded answers", fix), path, fix).answers

    def fetch(url: str) -> bytes:
        if url not in index:
            raise OSError("not recorded")
        try:
            return regular_file_bytes(folder / index[url].file, MAX_ANSWER_BYTES)
        except Unreadable as exc:
            reason = exc.reason(MAX_ANSWER_BYTES)
            raise OSError(f"{display_path(folder / index[url].file)}: {reason}") from None

    return fetch


def pypi_answer(answer: bytes, url: str) -> PypiAnswer:
    """A PyPI JSON answer, typed; one ToolkitError line naming the URL and the first field of another shape."""
    data = parse_json(answer, url, "PyPI answer", ANSWER_FIX)
    try:
        return adapter(PypiAnswer).validate_python(data)
    except pydantic.ValidationError as exc:
        raise ToolkitError(
            f"{url}: unreadable PyPI answer ({first_problem(exc)}; {ANSWER_FIX})"
        ) from None


def pypi_releases(package: str, answer: bytes, url: str) -> list[Release]:
    """Every non-yanked release with files, from a PyPI JSON answer."""
    out = []
    for version, files in pypi_answer(answer, url).releases.items():
        live = [f for f in files if not f.yanked]
        if live:
            out.append(Release(package, version, min(f.upload_time for f in live)[:10], url))
    return out


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self._in_a = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._in_a = tag == "a"

    def handle_data(self, data: str) -> None:
        if self._in_a:
            self.texts.append(data.strip())
            self._in_a = False


def index_page_versions(answer: bytes) -> set[str]:
    """Versions of the torch wheels a PEP 503 page links (torch-2.15.0+cu130-cp312-... -> 2.15.0+cu130)."""
    parser = _Anchors()
    parser.feed(answer.decode(errors="replace"))
    found = set()
    for name in parser.texts:
        match = re.match(r"torch-([^-]+)-", name)
        if match and name.endswith(".whl"):
            found.add(match.group(1).replace("%2B", "+"))
    return found


# ---------------------------------------------------------------- coverage rules (table-driven, see upstream.yaml)


def _final(version: str) -> Version | None:
    """The version if it is a final (or pre-) release; None for a dev release or what is no version at all
    (InvalidVersion, or the ValueError of int() on a release number of thousands of digits)."""
    try:
        v = Version(version)
    except ValueError:
        return None
    return None if v.is_devrelease else v


def new_minors(releases: list[Release], known: dict) -> list[tuple[str, list[Release]]]:
    """Final releases whose major.minor is not a key of `known`, grouped by minor, oldest minor first."""
    new: dict[str, list[Release]] = {}
    for r in releases:
        v = _final(r.version)
        if v and not v.is_prerelease and minor_of(r.version) not in known:
            new.setdefault(minor_of(r.version), []).append(r)
    return sorted(new.items(), key=lambda kv: Version(kv[0]))


def torch_minors(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    return [
        Finding(
            "torch",
            tuple(r.version for r in rs),
            f"torch {minor} (released {rs[0].uploaded}) is not in toolkit/knowledge/torch_releases.yaml "
            f"(add it with the CUDA lines and Pythons it ships, and the source)",
        )
        for minor, rs in new_minors(releases, kb.torch_releases)
    ]


def flash_attn_released(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    missing = [r for r in releases if r.version not in kb.fa_released]
    return [
        Finding(
            "flash-attn",
            (r.version,),
            f"released {r.uploaded}, not in toolkit/knowledge/flash_attn_2.yaml "
            f"`released` (add it, and a requirements range / patches.yaml entry if it needs one)",
        )
        for r in missing
    ]


def newest_known(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    known = Version(entry["newest_known"])
    newer = [r for r in releases if Version(r.version) > known]
    if not newer:
        return []
    return [
        Finding(
            entry["package"],
            tuple(r.version for r in newer),
            f"newer than {known} that toolkit/knowledge/upstream.yaml knows (newest uploaded "
            f"{max(r.uploaded for r in newer)}; update the knowledge)",
        )
    ]


def cuda_minors(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    return [
        Finding(
            entry["package"],
            tuple(r.version for r in rs),
            f"CUDA {minor} (first wheel {min(r.uploaded for r in rs)}) is not in "
            f"toolkit/knowledge/cuda_lines.yaml (add its max gcc, archs, driver; and conda_forge_nvcc.yaml "
            f"once conda-forge carries it)",
        )
        for minor, rs in new_minors(releases, kb.cuda_lines)
    ]


COVERAGE: dict[str, Callable[[list[Release], Knowledge, dict], list[Finding]]] = {
    "torch_minors": torch_minors,
    "flash_attn_released": flash_attn_released,
    "newest_known": newest_known,
    "cuda_minors": cuda_minors,
}


def line_gaps(kb: Knowledge, tag: str, cuda: str, versions: set[str]) -> list[Finding]:
    """Torch minors the line's index serves but torch_releases.yaml does not list for that CUDA line."""
    minors = {minor_of(v) for v in versions if _final(v) and not Version(v).is_prerelease}
    gaps = sorted(
        (m for m in minors if m in kb.torch_releases and cuda not in kb.torch_releases[m].cuda),
        key=Version,
    )
    return [
        Finding(
            "torch",
            (m,),
            f"download.pytorch.org serves {tag} wheels of torch {m}, but "
            f"toolkit/knowledge/torch_releases.yaml lists {m} for CUDA "
            f"{', '.join(kb.torch_releases[m].cuda)} only (add {cuda})",
        )
        for m in gaps
    ]


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    unchecked: tuple[str, ...]  # "URL (why)" for each answer that could not be had
    answers: dict  # url -> bytes, what was fetched (for --record)


def watch_list() -> dict:
    return knowledge_files.read("upstream.yaml")


def check_updates(fetch: Fetch, kb: Knowledge | None = None) -> Report:
    kb = kb or load_knowledge()
    watch = watch_list()
    findings: list[Finding] = []
    unchecked: list[str] = []
    answers: dict[str, bytes] = {}

    def get(url: str) -> bytes | None:
        try:
            answers[url] = fetch(url)
        except (OSError, ValueError) as exc:
            unchecked.append(f"{url} ({exc})")
            return None
        return answers[url]

    for entry in watch["pypi"]:
        url = PYPI_JSON.format(package=entry["package"])
        answer = get(url)
        if answer is None:
            continue
        since = Version(entry["since"])
        releases = [
            r
            for r in pypi_releases(entry["package"], answer, url)
            if _final(r.version) and Version(r.version) >= since
        ]
        findings += COVERAGE[entry["covered_by"]](releases, kb, entry)
    for cuda, line in kb.cuda_lines.items():
        if line.torch_index:
            answer = get(watch["torch_index"].format(index=line.torch_index.rstrip("/")))
            if answer is not None:
                findings += line_gaps(kb, line.tag, cuda, index_page_versions(answer))
    return Report(tuple(findings), tuple(unchecked), answers)


def trimmed(url: str, answer: bytes) -> bytes:
    """What --record keeps: per PyPI release one file's upload_time and yanked flag; index pages as they are."""
    if not url.endswith("/json"):
        return answer
    data = pypi_answer(answer, url)
    releases = {v: [asdict(f) for f in files[:1]] for v, files in data.releases.items()}
    return json.dumps(
        {"info": asdict(data.info), "releases": releases}, indent=1, sort_keys=True
    ).encode()


def record_folder(folder: Path) -> Path:
    """--record's folder: a new or empty one, checked before anything is fetched, so that no file of the
    user's (an earlier recording included) is overwritten."""
    folder = folder_argument(folder, "--record")
    if folder.is_dir() and next(folder.iterdir(), None) is not None:
        raise ToolkitError(
            f"--record {display_path(folder)}: not empty (a recording goes into a new or empty "
            f"folder: name one, or remove this one's files first)"
        )
    return folder


def record(folder: Path, answers: dict[str, bytes]) -> None:
    folder = record_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    index = {}
    for url, answer in answers.items():
        name = re.sub(r"[^A-Za-z0-9.]+", "_", url.split("://", 1)[1]).strip("_")
        write_atomic(folder / name, trimmed(url, answer))
        index[url] = RecordedAnswer(
            name,
            now,
            "per release: one file's filename, upload_time, yanked"
            if url.endswith("/json")
            else "as served",
        )
    text = json.dumps(asdict(Recording(index)), indent=1, sort_keys=True)
    write_atomic(folder / RECORD_INDEX, text.encode() + b"\n")


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "knowledge",
        description="`toolkit knowledge check-updates`: ask PyPI and PyTorch's wheel indexes what was released "
        "and name every release toolkit/knowledge/*.yaml does not cover. Exit 1 if any.",
    )
    verbs = parser.add_subparsers(title="steps", metavar="STEP", required=True)
    check = verbs.add_parser(
        "check-updates",
        help="name releases the knowledge does not cover",
        description="Name every newer release (torch, the attention packages, NVIDIA's CUDA "
        "wheels, torch per CUDA line) the knowledge does not cover.",
    )
    check.add_argument(
        "--recorded", type=Path, metavar="DIR", help="answer from recorded files (DIR/index.json)"
    )
    check.add_argument(
        "--record", type=Path, metavar="DIR", help="also write what was fetched, trimmed, into DIR"
    )
    check.set_defaults(func=knowledge_check_updates_command)


def knowledge_check_updates_command(args: argparse.Namespace) -> int:
    if args.record:
        record_folder(args.record)  # before fetching: a run that cannot record refuses at once
    fetch = recorded_fetch(args.recorded) if args.recorded else live_fetch
    report = check_updates(fetch)
    if args.record:
        record(args.record, report.answers)
    for finding in report.findings:
        print(finding)
    for where in report.unchecked:
        print(f"not checked: {where}")
    if not report.findings and not report.unchecked:
        print(f"knowledge covers every release listed ({len(report.answers)} index answers)")
    return 1 if report.findings or report.unchecked else 0

"""`toolkit knowledge check-updates`: is the knowledge current? Names every release the indexes list that it does not cover.

Asks PyPI's JSON API (torch, flash-attn, flash-attn-4, NVIDIA's nvcc/runtime wheels) and PyTorch's per-line
wheel indexes, as toolkit/knowledge/upstream.yaml says, and judges each release against the knowledge files.
`--recorded DIR` answers from files recorded earlier (tests, offline); `--record DIR` writes what it fetched,
trimmed, with the URL and date, so a test can replay today's answers.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

from packaging.version import InvalidVersion, Version

from toolkit import knowledge_files
from toolkit.atomic import write_atomic
from toolkit.jsonfile import parse_json, read_json
from toolkit.knowledge import Knowledge, load_knowledge, minor_of

PYPI_JSON = "https://pypi.org/pypi/{package}/json"
RECORD_INDEX = "index.json"
ANSWER_FIX = "the index answered something else: check again later, or record the answers again with --record"


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


def live_fetch(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json, text/html"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def recorded_fetch(folder: Path) -> Fetch:
    """Answers recorded by --record: folder/index.json maps each URL to its file."""
    index = read_json(folder / RECORD_INDEX, "index of recorded answers",
                      f"record them with `toolkit knowledge check-updates --record {folder}`")

    def fetch(url: str) -> bytes:
        if url not in index:
            raise OSError("not recorded")
        return (folder / index[url]["file"]).read_bytes()

    return fetch


def pypi_releases(package: str, answer: bytes, url: str) -> list[Release]:
    """Every non-yanked release with files, from a PyPI JSON answer."""
    data = parse_json(answer, url, "PyPI answer", ANSWER_FIX)
    out = []
    for version, files in data.get("releases", {}).items():
        live = [f for f in files if not f.get("yanked")]
        if live:
            out.append(Release(package, version, min(f.get("upload_time", "") for f in live)[:10], url))
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
    try:
        v = Version(version)
    except InvalidVersion:
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
    return [Finding("torch", tuple(r.version for r in rs),
                    f"torch {minor} (released {rs[0].uploaded}) is not in toolkit/knowledge/torch_releases.yaml "
                    f"(add it with the CUDA lines and Pythons it ships, and the source)")
            for minor, rs in new_minors(releases, kb.torch_releases)]


def flash_attn_released(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    missing = [r for r in releases if r.version not in kb.fa_released]
    return [Finding("flash-attn", (r.version,), f"released {r.uploaded}, not in toolkit/knowledge/flash_attn.yaml "
                    f"`released` (add it, and a requirements range / patches.yaml entry if it needs one)")
            for r in missing]


def newest_known(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    known = Version(entry["newest_known"])
    newer = [r for r in releases if Version(r.version) > known]
    if not newer:
        return []
    return [Finding(entry["package"], tuple(r.version for r in newer),
                    f"newer than {known} that toolkit/knowledge/upstream.yaml knows (newest uploaded "
                    f"{max(r.uploaded for r in newer)}; update the knowledge)")]


def cuda_minors(releases: list[Release], kb: Knowledge, entry: dict) -> list[Finding]:
    return [Finding(entry["package"], tuple(r.version for r in rs),
                    f"CUDA {minor} (first wheel {min(r.uploaded for r in rs)}) is not in "
                    f"toolkit/knowledge/cuda_lines.yaml (add its max gcc, archs, driver; and conda_forge_nvcc.yaml "
                    f"once conda-forge carries it)")
            for minor, rs in new_minors(releases, kb.cuda_lines)]


COVERAGE: dict[str, Callable[[list[Release], Knowledge, dict], list[Finding]]] = {
    "torch_minors": torch_minors,
    "flash_attn_released": flash_attn_released,
    "newest_known": newest_known,
    "cuda_minors": cuda_minors,
}


def line_gaps(kb: Knowledge, tag: str, cuda: str, versions: set[str]) -> list[Finding]:
    """Torch minors the line's index serves but torch_releases.yaml does not list for that CUDA line."""
    minors = {minor_of(v) for v in versions if _final(v) and not Version(v).is_prerelease}
    gaps = sorted((m for m in minors if m in kb.torch_releases and cuda not in kb.torch_releases[m].cuda),
                  key=Version)
    return [Finding("torch", (m,), f"download.pytorch.org serves {tag} wheels of torch {m}, but "
                    f"toolkit/knowledge/torch_releases.yaml lists {m} for CUDA "
                    f"{', '.join(kb.torch_releases[m].cuda)} only (add {cuda})") for m in gaps]


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
        releases = [r for r in pypi_releases(entry["package"], answer, url)
                    if _final(r.version) and Version(r.version) >= since]
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
    data = parse_json(answer, url, "PyPI answer", ANSWER_FIX)
    releases = {v: [{k: f.get(k) for k in ("filename", "upload_time", "yanked")} for f in files[:1]]
                for v, files in data.get("releases", {}).items()}
    return json.dumps({"info": {"name": data["info"]["name"], "version": data["info"]["version"]},
                       "releases": releases}, indent=1, sort_keys=True).encode()


def record(folder: Path, answers: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    index = {}
    for url, answer in answers.items():
        name = re.sub(r"[^A-Za-z0-9.]+", "_", url.split("://", 1)[1]).strip("_")
        write_atomic(folder / name, trimmed(url, answer))
        index[url] = {"file": name, "recorded": now,
                      "trimmed": "per release: one file's filename, upload_time, yanked" if url.endswith("/json")
                      else "as served"}
    write_atomic(folder / RECORD_INDEX, json.dumps(index, indent=1, sort_keys=True).encode() + b"\n")


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "knowledge", help="keep the compatibility knowledge current",
        description="`toolkit knowledge check-updates`: ask PyPI and PyTorch's wheel indexes what was released "
                    "and name every release toolkit/knowledge/*.yaml does not cover. Exit 1 if any.")
    verbs = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    check = verbs.add_parser("check-updates", help="name releases the knowledge does not cover",
                             description="Name every newer release (torch, flash-attn, flash-attn-4, NVIDIA's CUDA "
                                         "wheels, torch per CUDA line) the knowledge does not cover.")
    check.add_argument("--recorded", type=Path, metavar="DIR", help="answer from recorded files (DIR/index.json)")
    check.add_argument("--record", type=Path, metavar="DIR", help="also write what was fetched, trimmed, into DIR")
    check.set_defaults(func=run_check_updates)


def run_check_updates(args: argparse.Namespace) -> int:
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

"""`toolkit knowledge check-updates`: is the knowledge current? Names every release the indexes list that it does not cover.

Asks PyPI's JSON API (the packages the knowledge pins: torch, the attention packages, NVIDIA's wheels, FA4's closure,
transformers, verl, HF's `kernels`), PyTorch's per-line wheel indexes, GitHub's API (FA3's source, which upstream
ships only from git) and the Hugging Face Hub (the kernels-community builds), as toolkit/knowledge/upstream.yaml
says, and judges each answer against the knowledge files (upstream_answers.py types the answers beyond PyPI's).
Every source gets a line: how many days the knowledge is behind it (from the oldest change it lacks), or
"not checked" with why, so an unreachable source is never a silent pass.
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
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from functools import partial
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
from toolkit.knowledge import fa3_pins, fa4_pins, frameworks
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge import upstream_answers as answers
from toolkit.knowledge.facts import Knowledge, load_knowledge, minor_of
from toolkit.knowledge.upstream_answers import ANSWER_FIX

PYPI_JSON = "https://pypi.org/pypi/{package}/json"
RECORD_INDEX = "index.json"
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
    behind_since: str = (
        ""  # ISO day of the oldest upstream change it names (what "days behind" counts from)
    )

    def __str__(self) -> str:
        return f"{self.package} {', '.join(self.versions)}: {self.message}"


Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class SourceState:
    """One watched source after the check: how far behind the knowledge is, or why it could not be asked."""

    name: str  # "pypi torch", "github Dao-AILab/flash-attention", "hub kernels-community/flash-attn3", ...
    behind_since: str  # ISO day of the oldest change the knowledge lacks ("" none)
    unchecked: str = ""  # "URL (why)" of each answer that could not be had ("" all were)

    def line(self, today: date) -> str:
        if self.unchecked:
            return f"{self.name}: not checked: {self.unchecked}"
        if not self.behind_since:
            return f"{self.name}: current"
        try:
            days = max(0, (today - date.fromisoformat(self.behind_since)).days)
        except ValueError:  # an answer's date is untrusted text
            return (
                f"{self.name}: behind, since a day the answer gives as {shown(self.behind_since)}"
            )
        return f"{self.name}: {days} days behind (since {self.behind_since})"


# ---------------------------------------------------------------- answers from the indexes


@dataclass(frozen=True)
class PypiFile:
    """The fields read of one file of a release in PyPI's JSON API (the others are ignored)."""

    filename: str = ""
    upload_time: str = ""
    yanked: bool = False
    url: str = ""  # absolute or relative to the JSON's URL (a recording keeps it for the newest release only)


@dataclass(frozen=True)
class PypiInfo:
    name: str
    version: str


@dataclass(frozen=True)
class PypiAnswer:
    """What /pypi/<name>/json must hold for the check to read it; anything else is refused by name."""

    info: PypiInfo
    releases: dict[str, list[PypiFile]] = field(default_factory=dict)

    def file_url(self, version: str, suffix: str, url: str) -> str | None:
        """The URL of release `version`'s first live file named *suffix (".whl", ".tar.gz"), None where none."""
        for f in self.releases.get(version, []):
            if f.filename.endswith(suffix) and f.url and not f.yanked:
                return urllib.parse.urljoin(url, f.url)
        return None


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


def recorded_at(folder: Path) -> str:
    """When a recording was made (its newest `recorded`, "" where none says): its "days behind" count to that day,
    and a recording made from it keeps that time."""
    path = folder / RECORD_INDEX
    fix = "record them again with `toolkit knowledge check-updates --record NEW_DIR`"
    index = recording(read_json(path, "index of recorded answers", fix), path, fix).answers
    return max(
        (a.recorded for a in index.values() if re.match(r"\d{4}-\d\d-\d\d", a.recorded)), default=""
    )


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


def _stable(releases: list[Release]) -> list[Release]:
    return [r for r in releases if (v := _final(r.version)) and not v.is_prerelease]


def _oldest(releases: list[Release]) -> str:
    return min((r.uploaded for r in releases if r.uploaded), default="")


def newer_finding(package: str, newer: list[Release], why: str) -> list[Finding]:
    """One finding naming the releases newer than what the knowledge holds, dated by the oldest; none if none."""
    return [Finding(package, tuple(r.version for r in newer), why, _oldest(newer))] if newer else []


class Ask:
    """Fetches each URL once, keeping every answer (for --record) and, per URL that failed, why."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.answers: dict[str, bytes] = {}
        self.failed: list[str] = []

    def __call__(self, url: str) -> bytes | None:
        if url not in self.answers:
            try:
                self.answers[url] = self.fetch(url)
            except (OSError, ValueError) as exc:
                self.failed.append(f"{url} ({exc})")
                return None
        return self.answers[url]


@dataclass(frozen=True)
class PypiSource:
    """One watched package's PyPI answer, what its coverage rule judges."""

    entry: dict  # its upstream.yaml entry
    url: str
    answer: PypiAnswer
    releases: list[Release]  # final and pre-releases from `since` on, yanked ones left out
    kb: Knowledge
    ask: Ask

    @property
    def package(self) -> str:
        return str(self.entry["package"])

    def newer_than(self, known: str) -> list[Release]:
        """Final releases newer than `known`, oldest first (a pre-release is no news to a pin)."""
        return sorted(
            (r for r in _stable(self.releases) if Version(r.version) > Version(known)),
            key=lambda r: Version(r.version),
        )

    def newest_file(self, suffix: str) -> tuple[Release, str, bytes] | None:
        """The newest final release, the URL of its file named *suffix and that file's bytes; None (said as "not
        checked") where there is no such file or it could not be read."""
        stable = _stable(self.releases)
        if not stable:
            return None
        newest = max(stable, key=lambda r: Version(r.version))
        url = self.answer.file_url(newest.version, suffix, self.url)
        if url is None:
            self.ask.failed.append(
                f"{self.url} (no {suffix} file of {self.package} {newest.version} listed)"
            )
            return None
        answer = self.ask(url)
        return None if answer is None else (newest, url, answer)


def new_minors(releases: list[Release], known: dict) -> list[tuple[str, list[Release]]]:
    """Final releases whose major.minor is not a key of `known`, grouped by minor, oldest minor first."""
    new: dict[str, list[Release]] = {}
    for r in _stable(releases):
        if minor_of(r.version) not in known:
            new.setdefault(minor_of(r.version), []).append(r)
    return sorted(new.items(), key=lambda kv: Version(kv[0]))


def torch_minors(src: PypiSource) -> list[Finding]:
    return [
        Finding(
            "torch",
            tuple(r.version for r in rs),
            f"torch {minor} (released {rs[0].uploaded}) is not in toolkit/knowledge/torch_releases.yaml "
            f"(add it with the CUDA lines and Pythons it ships, and the source)",
            _oldest(rs),
        )
        for minor, rs in new_minors(src.releases, src.kb.torch_releases)
    ]


def flash_attn_released(src: PypiSource) -> list[Finding]:
    missing = [r for r in src.releases if r.version not in src.kb.fa_released]
    return [
        Finding(
            "flash-attn",
            (r.version,),
            f"released {r.uploaded}, not in toolkit/knowledge/flash_attn_2.yaml "
            f"`released` (add it, and a requirements range / patches.yaml entry if it needs one)",
            r.uploaded,
        )
        for r in missing
    ]


def newest_known(src: PypiSource) -> list[Finding]:
    known = Version(src.entry["newest_known"])
    newer = [r for r in src.releases if Version(r.version) > known]
    if not newer:
        return []
    return [
        Finding(
            src.package,
            tuple(r.version for r in newer),
            f"newer than {known} that toolkit/knowledge/upstream.yaml knows (newest uploaded "
            f"{max(r.uploaded for r in newer)}; update the knowledge)",
            _oldest(newer),
        )
    ]


def cuda_minors(src: PypiSource) -> list[Finding]:
    return [
        Finding(
            src.package,
            tuple(r.version for r in rs),
            f"CUDA {minor} (first wheel {min(r.uploaded for r in rs)}) is not in "
            f"toolkit/knowledge/cuda_lines.yaml (add its max gcc, archs, driver; and conda_forge_nvcc.yaml "
            f"once conda-forge carries it)",
            _oldest(rs),
        )
        for minor, rs in new_minors(src.releases, src.kb.cuda_lines)
    ]


def fa4_closure(src: PypiSource) -> list[Finding]:
    """A distribution FA4's default release installs beside it (flash_attn_4.yaml `wheels`): newer than its pin?"""
    release = fa4_pins.release()
    pinned = next((w.version for w in release.wheels if w.name == src.package), None)
    if pinned is None:
        return [
            Finding(
                src.package,
                (),
                f"watched as FA4's closure, but flash_attn_4.yaml pins no wheel of it for "
                f"flash-attn-4 {release.version} (drop it from upstream.yaml or pin it)",
            )
        ]
    return newer_finding(
        src.package,
        src.newer_than(pinned),
        f"newer than {pinned}, which toolkit/knowledge/flash_attn_4.yaml pins for flash-attn-4 "
        f"{release.version} (check that release's Requires-Dist allows it; pin its wheels with size and sha256)",
    )


def transformers_names(src: PypiSource) -> list[Finding]:
    """The newest transformers wheel's attn_implementation names against attention_backends.yaml `transformers`
    (whose list holds every backend's name: tests/test_check_updates_sources.py)."""
    known = frameworks.transformers()
    out = newer_finding(
        "transformers",
        src.newer_than(known.version),
        f"newer than {known.version}, whose attn_implementation names toolkit/knowledge/attention_backends.yaml "
        f"`transformers` records (check the names below, then record the release and its source)",
    )
    wheel = src.newest_file(".whl")
    if wheel is None:
        return out
    newest, url, answer = wheel
    read = answers.attn_implementation_names(answer, url)
    if read.problem:
        return [
            *out,
            Finding(
                "transformers",
                (newest.version,),
                f"{read.problem}: read its attn_implementation "
                f"names by hand into attention_backends.yaml",
                newest.uploaded,
            ),
        ]
    gone = [n for n in known.attn_implementations if n not in read.names]
    if gone:
        out.append(
            Finding(
                "transformers",
                (newest.version,),
                f"no longer accepts attn_implementation "
                f"{', '.join(gone)}, which attention_backends.yaml `transformers` lists (a backend that "
                f"uses it needs another name)",
                newest.uploaded,
            )
        )
    new = [
        n
        for n in read.names
        if ("flash" in n or "sdpa" in n) and n not in known.attn_implementations
    ]
    if new:
        out.append(
            Finding(
                "transformers",
                (newest.version,),
                f"accepts attn_implementation {', '.join(new)}, "
                f"which attention_backends.yaml `transformers` does not list (a new backend?)",
                newest.uploaded,
            )
        )
    return out


def verl_routing(src: PypiSource) -> list[Finding]:
    """The newest verl's flash-attn pins and index routing (its sdist's pyproject.toml) against the knowledge's."""
    known = frameworks.verl()
    out = newer_finding(
        "verl",
        src.newer_than(known.version),
        f"newer than {known.version}, which toolkit/knowledge/attention_backends.yaml `verl` was read from "
        f"(read its config keys, its flash-attn pin and index again)",
    )
    sdist = src.newest_file(".tar.gz")
    if sdist is None:
        return out
    newest, url, answer = sdist
    routes = answers.verl_flash_attn(answer, url)
    if set(routes) != set(known.flash_attn):
        said = (
            "; ".join(f"[{r.extra}] flash-attn{r.pin} from {r.index_url or 'PyPI'}" for r in routes)
            or "nothing"
        )
        out.append(
            Finding(
                "verl",
                (newest.version,),
                f"its pyproject.toml asks for {said}, not what "
                f"attention_backends.yaml `verl.flash_attn` says (update it, with the source)",
                newest.uploaded,
            )
        )
    return out


COVERAGE: dict[str, Callable[[PypiSource], list[Finding]]] = {
    "torch_minors": torch_minors,
    "flash_attn_released": flash_attn_released,
    "newest_known": newest_known,
    "cuda_minors": cuda_minors,
    "fa4_closure": fa4_closure,
    "transformers_names": transformers_names,
    "verl_routing": verl_routing,
}


def newest_fa3_pin() -> fa3_pins.Fa3Commit:
    return max(
        (fa3_pins.commit(sha) for sha in fa3_pins.knowledge()["commits"]), key=lambda c: c.date
    )


def fa3_git(entry: dict, ask: Ask, pinned: fa3_pins.Fa3Commit) -> list[Finding]:
    """Each watched path of FA3's repository at the branch against the pinned commit's git ids: a path whose
    tree moved on (or that appeared: the flash_attn_3 package upstream moves hopper/ into) is named with the
    commits since the pin, the oldest dating how far behind the knowledge is."""
    [root] = [a for a in pinned.archives if a.place == ""]
    repo, branch = str(entry["repo"]), str(entry["branch"])
    url = answers.tree_url(repo, branch)
    answer = ask(url)
    if answer is None:
        return []
    tree = answers.github_tree(answer, url)
    out = []
    for path in entry["paths"]:
        there = tree.entry(path)
        if there is None or there.sha == root.pins.get(path):
            continue
        url = answers.commits_url(repo, path, pinned.date)
        answer = ask(url)
        if answer is None:
            continue
        commits = answers.github_commits(answer, url)
        shas = [c.sha for c in commits]
        since = commits[: shas.index(pinned.commit)] if pinned.commit in shas else commits
        newest = (
            f"; newest {since[0].sha[:12]} {since[0].day} {since[0].subject!r}" if since else ""
        )
        many = "100+" if len(commits) == 100 and pinned.commit not in shas else str(len(since))
        was = (
            f"not the {root.pins[path][:12]} flash_attn_3.yaml pins (commit {pinned.commit[:12]}, {pinned.date})"
            if path in root.pins
            else f"a path flash_attn_3.yaml pins for no commit (it builds "
            f"{', '.join(root.pins)} of {pinned.commit[:12]})"
        )
        out.append(
            Finding(
                f"github {repo}",
                (f"{path}/",),
                f"at {branch} is tree {there.sha[:12]}, {was}: {many} commits touch it since{newest} (pin the new "
                f"commit with its archives' git ids)",
                min((c.day for c in since), default=pinned.date),
            )
        )
    return out


def hub_kernel(repo: dict, ask: Ask) -> list[Finding]:
    """A kernels-community build on the Hub: at the revision upstream.yaml says was read, or news."""
    url = answers.HUB_MODEL.format(repo=repo["repo"])
    answer = ask(url)
    if answer is None:
        return []
    model = answers.hub_model(answer, url)
    if model.sha == repo.get("sha"):
        return []
    read = (
        f"the knowledge read {str(repo['sha'])[:12]}"
        if repo.get("sha")
        else "the knowledge has never read it"
    )
    return [
        Finding(
            f"hub {repo['repo']}",
            (model.sha[:12],),
            f"at revision {model.sha} (modified {model.lastModified[:10]}); {read} (read its build's CUDA, torch and "
            f"arch limits into the knowledge and its revision into upstream.yaml `hub`)",
            model.lastModified[:10],
        )
    ]


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
    sources: tuple[SourceState, ...] = ()  # every watched source, in upstream.yaml's order
    today: date = field(default_factory=lambda: datetime.now(timezone.utc).date())


def watch_list() -> dict:
    return knowledge_files.read("upstream.yaml")


def check_updates(fetch: Fetch, kb: Knowledge | None = None, today: date | None = None) -> Report:
    kb = kb or load_knowledge()
    watch = watch_list()
    ask = Ask(fetch)
    findings: list[Finding] = []
    sources: list[SourceState] = []

    def source(name: str, judge: Callable[[], list[Finding]]) -> None:
        before = len(ask.failed)
        found = judge()
        findings.extend(found)
        since = min((f.behind_since for f in found if f.behind_since), default="")
        sources.append(SourceState(name, since, "; ".join(ask.failed[before:])))

    def pypi(entry: dict) -> list[Finding]:
        url = PYPI_JSON.format(package=entry["package"])
        answer = ask(url)
        if answer is None:
            return []
        since = Version(entry["since"])
        releases = [
            r
            for r in pypi_releases(entry["package"], answer, url)
            if _final(r.version) and Version(r.version) >= since
        ]
        return COVERAGE[entry["covered_by"]](
            PypiSource(entry, url, pypi_answer(answer, url), releases, kb, ask)
        )

    def torch_index(cuda: str, tag: str, index: str) -> list[Finding]:
        answer = ask(watch["torch_index"].format(index=index.rstrip("/")))
        return [] if answer is None else line_gaps(kb, tag, cuda, index_page_versions(answer))

    for entry in watch["pypi"]:
        source(f"pypi {entry['package']}", partial(pypi, entry))
    for cuda, line in kb.cuda_lines.items():
        if line.torch_index:
            source(
                f"torch index {line.tag}",
                partial(torch_index, cuda, line.tag, line.torch_index),
            )
    for entry in watch["github"]:
        source(
            f"github {entry['repo']} {', '.join(p + '/' for p in entry['paths'])}",
            partial(fa3_git, entry, ask, newest_fa3_pin()),
        )
    for repo in watch["hub"]["repos"]:
        source(f"hub {repo['repo']}", partial(hub_kernel, repo, ask))
    return Report(
        tuple(findings),
        tuple(ask.failed),
        ask.answers,
        tuple(sources),
        today or datetime.now(timezone.utc).date(),
    )


def trimmed(url: str, answer: bytes) -> bytes:
    """What --record keeps: per PyPI release one file's upload_time and yanked flag (every file of the newest, with
    its URL, which the wheel and sdist readers follow); of a wheel or sdist the one member read; the rest as served."""
    archive = answers.trimmed_archive(url, answer)
    if archive is not None:
        return archive
    if not url.endswith("/json"):
        return answer
    data = pypi_answer(answer, url)
    releases = {
        v: [asdict(f) for f in (files if v == data.info.version else files[:1])]
        for v, files in data.releases.items()
    }
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


def _trimmed_how(url: str) -> str:
    if url.endswith((".whl", ".tar.gz")):
        return "the one member read, in an archive of the same kind"
    if url.endswith("/json"):
        return (
            "per release: one file's filename, upload_time, yanked, url (every file of the newest)"
        )
    return "as served"


def record(folder: Path, answers: dict[str, bytes], at: str = "") -> None:
    """Writes the answers, each marked recorded `at` (now, unless they are a recording's, replayed)."""
    folder = record_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    index = {}
    for url, answer in answers.items():
        name = re.sub(r"[^A-Za-z0-9.]+", "_", url.split("://", 1)[1]).strip("_")
        write_atomic(folder / name, trimmed(url, answer))
        index[url] = RecordedAnswer(name, now, _trimmed_how(url))
    text = json.dumps(asdict(Recording(index)), indent=1, sort_keys=True)
    write_atomic(folder / RECORD_INDEX, text.encode() + b"\n")


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "knowledge",
        description="`toolkit knowledge check-updates`: ask PyPI, PyTorch's wheel indexes, GitHub and the "
        "Hugging Face Hub what was released and name every release toolkit/knowledge/*.yaml does not cover. "
        "Exit 1 if any, or if a source could not be asked.",
    )
    verbs = parser.add_subparsers(title="steps", metavar="STEP", required=True)
    check = verbs.add_parser(
        "check-updates",
        help="name releases the knowledge does not cover",
        description="Name every newer release (torch, the attention packages, NVIDIA's CUDA "
        "wheels, torch per CUDA line, FA4's closure, transformers' attn_implementation names, verl's "
        "flash-attn routing, FA3's git source, the HF kernels builds) the knowledge does not cover, and "
        "how many days behind each source the knowledge is.",
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
    at = recorded_at(args.recorded) if args.recorded else ""
    report = check_updates(fetch, today=date.fromisoformat(at[:10]) if at else None)
    if args.record:
        record(args.record, report.answers, at)
    for finding in report.findings:
        print(finding)
    for where in report.unchecked:
        print(f"not checked: {where}")
    if not report.findings and not report.unchecked:
        print(f"knowledge covers every release listed ({len(report.answers)} index answers)")
    print(f"days behind, per source (as of {report.today}):")
    for state in report.sources:
        print(f"  {state.line(report.today)}")
    return 1 if report.findings or report.unchecked else 0

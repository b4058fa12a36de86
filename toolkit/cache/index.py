"""Reading what a published index offers, from the index alone (its pages, table entries and records), so it
works on a user's machine with no wheelhouse: `toolkit export` and `toolkit doctor` read the index this way.

A wheel counts as published only where the index vouches for it end to end: its page link (with `#sha256=`),
its build record `<wheel>.build.json`, and the table entry `inputs/<the record's inputs key>.json` naming
exactly this wheel, its sha256 and the record's sha256 (signed by the configured key where the cache has one).
The page alone is not trusted: anyone can put a file beside a static index, only the entry is the publisher's.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from toolkit.base.digest import sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import parse_json
from toolkit.base.workspace import wheel_folders
from toolkit.cache.config import CacheSite
from toolkit.cache.publish import REPORTS_SUFFIX
from toolkit.cache.simple import normalize
from toolkit.cache.table import FILES_DIR, TableEntry, check_signature, entry_path

MAX_PAGE_BYTES = 16 << 20
MAX_RECORD_BYTES = 16 << 20
VERIFY_REPORT = "verify.json"


def read_url(url: str, limit: int, what: str, then: str) -> bytes | None:
    """At most `limit` bytes at `url` (file://, http(s)://); None where there is no such file (404, 410, a missing
    file). Anything else is one line naming the URL, `what` it is and `then` (what happens next)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read(limit + 1)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        raise ToolkitError(
            f"{url}: the cache answered HTTP {exc.code} for its {what} (check the cache's URL; "
            f"{then})"
        ) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (FileNotFoundError, NotADirectoryError)):
            return None
        raise ToolkitError(f"{url}: cannot reach the cache ({exc.reason}; {then})") from None
    except (OSError, ValueError) as exc:
        raise ToolkitError(f"{url}: cannot reach the cache ({exc}; {then})") from None
    if len(data) > limit:
        raise ToolkitError(f"{url}: a {what} larger than {limit:,} bytes (refused; {then})")
    return data


@dataclass(frozen=True)
class PageLink:
    """One wheel as a project page lists it."""

    url: str  # absolute
    path: str  # files/<folder>/<wheel>, relative to the index root (unquoted)
    filename: str
    sha256: str
    metadata_sha256: (
        str | None
    )  # PEP 658/714: sha256 of `<wheel>.metadata`, where the page announces one

    @property
    def folder(self) -> str:
        return self.path.split("/")[1]

    @property
    def version(self) -> Version:
        return parse_wheel_filename(self.filename)[1]


@dataclass(frozen=True)
class PublishedRecord:
    """What export, doctor and runtime locks read of a published build record: its inputs and when it finished
    (the wing below build reads the record's JSON itself; the table entry pins its bytes, the inputs hash to its
    key)."""

    inputs_key: str
    inputs: dict[str, Any]
    finished: str = (
        ""  # the build's end (ISO 8601 UTC): the newest of several builds of the same inputs
    )

    @property
    def toolchain(self) -> dict[str, Any]:
        return dict(self.inputs.get("toolchain") or {})

    @property
    def archs(self) -> list[str]:
        return [str(arch) for arch in self.inputs.get("archs") or []]

    @classmethod
    def from_bytes(cls, data: bytes, url: str, then: str) -> PublishedRecord:
        record = parse_json(data, url, "build record", "tell the cache's publisher")
        key, inputs = (
            (record.get("inputs_key"), record.get("inputs"))
            if isinstance(record, dict)
            else (None, None)
        )
        if not isinstance(key, str) or not isinstance(inputs, dict) or sha256_json(inputs) != key:
            raise ToolkitError(
                f"{url}: not a build record whose inputs hash to its inputs key (refused; {then})"
            )
        return cls(key, inputs, str(record.get("finished") or ""))


@dataclass(frozen=True)
class PublishedBuild:
    """A wheel the index vouches for: its page link, table entry and build record, each checked."""

    site: CacheSite
    link: PageLink
    entry: TableEntry
    record: PublishedRecord

    @property
    def project(self) -> str:
        return str(parse_wheel_filename(self.link.filename)[0])

    @property
    def record_url(self) -> str:
        return f"{self.site.url}/{self.entry.record}"

    @property
    def report_url(self) -> str:
        """Where the line's verification report lies beside the wheel (publish puts it there when the line has
        one; report_exists says whether it does)."""
        return f"{self.link.url}{REPORTS_SUFFIX}/{VERIFY_REPORT}"

    def report_exists(self) -> bool:
        then = "the report is not named"
        return read_url(self.report_url, MAX_RECORD_BYTES, "verification report", then) is not None


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def _anchors(url: str, what: str, then: str) -> list[dict[str, str | None]] | None:
    data = read_url(url, MAX_PAGE_BYTES, what, then)
    if data is None:
        return None
    parser = _Anchors()
    parser.feed(data.decode("utf-8", "replace"))
    return parser.anchors


def projects(site: CacheSite, then: str) -> list[str]:
    """The projects simple/index.html lists."""
    found = _anchors(
        f"{site.url}/simple/index.html", "index page", then
    )  # named: file:// has no index files
    if found is None:
        raise ToolkitError(
            f"{site.url}/simple/index.html: no index page (is {site.url} the folder `toolkit publish --to` "
            f"wrote?; {then})"
        )
    return [normalize(href.strip("/")) for anchor in found if (href := anchor.get("href"))]


def project_links(site: CacheSite, project: str, then: str) -> list[PageLink]:
    """The wheels a project page lists; links that are not a wheel under files/ of this index are left out."""
    page = f"{site.url}/simple/{normalize(project)}/index.html"
    root = urlsplit(site.url + "/")
    links = []
    for anchor in _anchors(page, "project page", then) or []:
        href, _, fragment = (anchor.get("href") or "").partition("#")
        absolute = urljoin(page, href)
        parts = urlsplit(absolute)
        if (parts.scheme, parts.netloc) != (root.scheme, root.netloc) or not parts.path.startswith(
            root.path
        ):
            continue  # only files of this index: what its table entries can vouch for
        path = unquote(parts.path[len(root.path) :])
        filename = path.rsplit("/", 1)[-1]
        if (
            not fragment.startswith("sha256=")
            or len(path.split("/")) != 3
            or not path.startswith(f"{FILES_DIR}/")
        ):
            continue
        try:
            parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        metadata = anchor.get("data-core-metadata") or anchor.get("data-dist-info-metadata") or ""
        links.append(
            PageLink(
                absolute,
                path,
                filename,
                fragment.removeprefix("sha256="),
                metadata.removeprefix("sha256=") if metadata.startswith("sha256=") else None,
            )
        )
    return links


def vouched(site: CacheSite, link: PageLink, then: str) -> PublishedBuild:
    """The link's build record and table entry, fetched and checked against each other and the page: a wheel
    the publisher's entry names with the page's sha256, a record of the entry's sha256 and inputs key."""
    record_url = f"{link.url}.build.json"
    data = read_url(record_url, MAX_RECORD_BYTES, "build record", then)
    if data is None:
        raise ToolkitError(
            f"{record_url}: the index lists {link.filename} without its build record (not a "
            f"published build; {then})"
        )
    record = PublishedRecord.from_bytes(data, record_url, then)
    entry_url = f"{site.url}/{entry_path(record.inputs_key)}"
    entry_data = read_url(entry_url, MAX_RECORD_BYTES, "table entry", then)
    if entry_data is None:
        raise ToolkitError(
            f"{entry_url}: no table entry for {link.filename}'s inputs (the index lists a wheel its "
            f"publisher did not; {then})"
        )
    entry = TableEntry.from_json(
        parse_json(entry_data, entry_url, "substitution table entry", "tell the cache's publisher"),
        entry_url,
    )
    differs = (
        "names another wheel"
        if entry.wheel != link.path
        else "pins another sha256 for the wheel than the page"
        if entry.wheel_sha256 != link.sha256
        else "is for other inputs"
        if entry.inputs_key != record.inputs_key
        else "pins another build record"
        if entry.record_sha256 != hashlib.sha256(data).hexdigest()
        else ""
    )
    if differs:
        raise ToolkitError(
            f"{entry_url}: the table entry {differs} ({link.path}; refused: the index does not "
            f"vouch for it; {then})"
        )
    check_signature(entry, site.public_key, entry_url, then)
    return PublishedBuild(site, link, entry, record)


def line_links(site: CacheSite, project: str, line: str, then: str) -> list[PageLink]:
    """The project's links in the line's folders (files/<line>/ and the other implementations' beside it:
    wheel_folders), not yet vouched for."""
    folders = set(wheel_folders(line).values())
    return [link for link in project_links(site, project, then) if link.folder in folders]


def line_builds(site: CacheSite, line: str, then: str) -> list[PublishedBuild]:
    """The line's published wheels (its folders: wheel_folders), the newest version of each project
    with every file of that version, each vouched for."""
    newest: dict[str, list[PageLink]] = {}
    for project in projects(site, then):
        links = line_links(site, project, line, then)
        if links:
            top = max(link.version for link in links)
            newest[project] = [link for link in links if link.version == top]
    if not newest:
        raise ToolkitError(
            f"{site.url}: no published wheels of line {line} (files/{line}/; publish them with "
            f"`toolkit publish {line} --to DIR`)"
        )
    return [vouched(site, link, then) for project in sorted(newest) for link in newest[project]]

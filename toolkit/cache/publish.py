"""Publishing wheels as a static, relocatable, immutable index any web server or shared filesystem serves.

Layout of the folder (`toolkit publish --to DIR`), every path relative so the folder can move:
  simple/index.html, simple/<project>/index.html   PEP 503 pages: `#sha256=` on every link, data-requires-python,
                                                    PEP 658/714 data-core-metadata (and data-dist-info-metadata)
  files/<folder>/<wheel>                            the wheel (folder: the wheelhouse's, base.workspace.wheel_folders)
  files/<folder>/<wheel>.metadata                   its METADATA, so resolvers need not fetch the wheel
  files/<folder>/<wheel>.build.json                 its build record, as the build wrote it
  files/<folder>/<wheel>.provenance.json            in-toto Statement v1 / SLSA provenance v1 (cache/provenance.py)
  files/<folder>/<wheel>.reports/<report>           the line's verification and bench reports, where it has them
  inputs/<inputs key>.json                          the substitution table's entry (cache/table.py)
  kernel-caches/<artifact>, <key id>.kernel-cache.json   FA4's warmed kernel cache (`toolkit fa4 warm`) and its record
  kernel-caches/<key>.json                          its table entry (key: sha256 of the record's key, cache/kernel_cache.py)

Immutable: a published name never changes. Publishing the same files again is a no-op; a different file under
a published name is refused in one line, before anything is written. Readers never see half a publish: each
file is written to a temporary name and renamed, the table entry after the files it names, and the pages
(listing only wheels with an entry) last, swapped in as one folder.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import asdict, dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from urllib.parse import quote

from toolkit.base.atomic import clean_stale, copy_atomic, publish_dir, write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_file, sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import KERNEL_CACHE_RECORD_SUFFIX
from toolkit.cache.provenance import BuildFacts, statement_text
from toolkit.cache.simple import Link, write_pages
from toolkit.cache.table import (
    FILES_DIR,
    INPUTS_DIR,
    KERNEL_CACHES_DIR,
    KernelCacheEntry,
    SignedEntry,
    Signer,
    TableEntry,
    entry_path,
)
from toolkit.fa4.jit import cache_record, key_id

METADATA_MEMBER = re.compile(r"[^/]+\.dist-info/METADATA")
MAX_METADATA_BYTES = 16 << 20
MAX_REPORT_BYTES = 256 << 20
REPORTS_SUFFIX = ".reports"


@dataclass(frozen=True)
class Publication:
    """One recorded wheel of a wheelhouse and what goes beside it."""

    folder: str  # the wheelhouse folder it lies in: files/<folder>/ in the index
    wheel: Path
    wheel_sha256: str  # as its build record says
    record: Path
    inputs_key: str
    facts: BuildFacts  # for the provenance statement
    reports: dict[str, Path]  # report name (verify.json, ...) -> the file


@dataclass(frozen=True)
class Published:
    entry: TableEntry | KernelCacheEntry
    new: bool  # False: this wheel (or kernel cache) was already published with these files (nothing was written)

    @property
    def label(self) -> str:
        """What publish prints of it: the wheel or artifact's path and the key it is looked up by."""
        if isinstance(self.entry, TableEntry):
            return f"{self.entry.wheel} (inputs {self.entry.inputs_key})"
        return f"{self.entry.artifact} (FA4 kernel cache {self.entry.key})"


@dataclass(frozen=True)
class _File:
    path: str  # relative to the index root
    sha256: str
    data: bytes | None = None  # written from memory...
    source: Path | None = None  # ...or copied from this file


def publish(
    dest: Path,
    items: list[Publication],
    signer: Signer | None = None,
    kernel_caches: list[Path] | None = None,
) -> list[Published]:
    """Publish every item (and every FA4 kernel-cache record's artifact) into `dest`, or nothing: each file is
    checked against what `dest` already holds before the first one is written. Publishers take turns (a file
    lock beside inputs/)."""
    dest.mkdir(parents=True, exist_ok=True)
    with locked(dest / INPUTS_DIR):
        plans: list[tuple[list[_File], SignedEntry]] = [_plan(item, signer) for item in items]
        plans += [_plan_kernel_cache(record, signer) for record in kernel_caches or []]
        planned: dict[str, str] = {}
        for files, _entry in plans:
            for file in files:
                if planned.setdefault(file.path, file.sha256) != file.sha256:
                    raise ToolkitError(
                        f"{file.path}: two of the wheels to publish give it different bytes "
                        f"(publish them to different folders)"
                    )
                _refuse_changed(dest, file)
        published = []
        for files, entry in plans:
            new = False
            for file in files:  # the entry, last in `files`, names only files already in place
                target = dest / file.path
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                clean_stale(target.parent)
                if file.source is not None:
                    copy_atomic(file.source, target)
                else:
                    assert file.data is not None
                    write_atomic(target, file.data)
                new = True
            assert isinstance(entry, (TableEntry, KernelCacheEntry))
            published.append(Published(entry, new))
        write_index(dest)
    return published


def _plan(item: Publication, signer: Signer | None) -> tuple[list[_File], TableEntry]:
    """Every file one wheel publishes, each with its sha256, the table entry last."""
    actual = sha256_file(item.wheel)
    if actual != item.wheel_sha256:
        raise ToolkitError(
            f"{display_path(item.wheel)}: sha256 {actual} is not its build record's "
            f"{item.wheel_sha256} (the wheel changed after its build: rebuild it with --force)"
        )
    base = f"{FILES_DIR}/{item.folder}/{item.wheel.name}"
    metadata = wheel_metadata(item.wheel)
    record_sha = sha256_file(item.record)
    provenance = statement_text(item.facts).encode()
    files = [
        _File(base, actual, source=item.wheel),
        _File(f"{base}.metadata", _sha(metadata), data=metadata),
        _File(f"{base}.build.json", record_sha, source=item.record),
        _File(f"{base}.provenance.json", _sha(provenance), data=provenance),
    ]
    for name, report in sorted(item.reports.items()):
        data = _bounded(report, MAX_REPORT_BYTES, "report")
        files.append(_File(f"{base}{REPORTS_SUFFIX}/{name}", _sha(data), data=data))
    entry = TableEntry(
        inputs_key=item.inputs_key,
        wheel=base,
        wheel_sha256=actual,
        wheel_size=item.wheel.stat().st_size,
        record=f"{base}.build.json",
        record_sha256=record_sha,
        provenance=f"{base}.provenance.json",
        provenance_sha256=_sha(provenance),
    )
    if signer is not None:
        entry = signer.sign(entry)
    text = entry.text().encode()
    files.append(_File(entry_path(item.inputs_key), _sha(text), data=text))
    return files, entry


def _plan_kernel_cache(
    record_path: Path, signer: Signer | None
) -> tuple[list[_File], KernelCacheEntry]:
    """An FA4 kernel cache's artifact and record (published under the names its key gives), its entry last."""
    record = cache_record(record_path)  # a damaged record is one line naming it
    artifact = record_path.parent / record.artifact
    try:
        actual = sha256_file(artifact)
    except OSError as exc:
        raise ToolkitError(
            f"{display_path(artifact)}: cannot read the artifact its record "
            f"{display_path(record_path)} names ({exc.strerror or exc}; warm again)"
        ) from None
    if actual != record.sha256:
        raise ToolkitError(
            f"{display_path(artifact)}: sha256 {actual} is not its record's {record.sha256} (the "
            f"artifact changed after `toolkit fa4 warm` packed it: warm again)"
        )
    key = asdict(record.key)
    base = f"{KERNEL_CACHES_DIR}/{key_id(key)}"
    record_sha = sha256_file(record_path)
    entry = KernelCacheEntry(
        key=sha256_json(key),
        artifact=f"{KERNEL_CACHES_DIR}/{record.artifact}",
        artifact_sha256=actual,
        artifact_size=artifact.stat().st_size,
        record=f"{base}{KERNEL_CACHE_RECORD_SUFFIX}",
        record_sha256=record_sha,
    )
    if signer is not None:
        entry = signer.sign(entry)
    text = entry.text().encode()
    files = [
        _File(entry.artifact, actual, source=artifact),
        _File(entry.record, record_sha, source=record_path),
        _File(entry_path(entry.key, KERNEL_CACHES_DIR), _sha(text), data=text),
    ]
    return files, entry


def _refuse_changed(dest: Path, file: _File) -> None:
    target = dest / file.path
    if not target.exists():
        return
    if not target.is_file() or target.is_symlink():
        raise ToolkitError(
            f"{display_path(target)}: not a regular file where the index keeps {file.path} "
            f"(remove it, or publish to a new folder)"
        )
    published = sha256_file(target)
    if published != file.sha256:
        raise ToolkitError(
            f"{display_path(target)}: already published with other bytes (sha256 {published}, "
            f"this publish's {file.sha256}); a published name never changes (publish to a new "
            f"folder, or rebuild under a new version)"
        )


def wheel_metadata(wheel: Path) -> bytes:
    """The wheel's `*.dist-info/METADATA`, served as `<wheel>.metadata` (PEP 658)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [
                info for info in archive.infolist() if METADATA_MEMBER.fullmatch(info.filename)
            ]
            if len(members) != 1 or members[0].file_size > MAX_METADATA_BYTES:
                raise ToolkitError(
                    f"{display_path(wheel)}: a wheel has one *.dist-info/METADATA of at most "
                    f"{MAX_METADATA_BYTES:,} bytes, this one {len(members)} (rebuild it)"
                )
            return archive.read(members[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise ToolkitError(
            f"{display_path(wheel)}: not a readable wheel ({exc}; rebuild it)"
        ) from None


def requires_python(metadata: bytes) -> str | None:
    return BytesHeaderParser().parsebytes(metadata).get("Requires-Python")


def write_index(dest: Path) -> None:
    """(Re)write dest/simple/ from the table's entries: only wheels whose entry is published are listed."""
    links: dict[str, Link] = {}
    for path in sorted((dest / INPUTS_DIR).glob("*.json")):
        entry = TableEntry.from_json(
            read_json(path, "substitution table entry", "remove it and publish again"),
            display_path(path),
        )
        metadata = dest / f"{entry.wheel}.metadata"
        data = _bounded(metadata, MAX_METADATA_BYTES, "core metadata")
        links[entry.wheel] = Link(
            f"../../{quote(entry.wheel)}",
            entry.wheel_name,
            entry.wheel_sha256,
            requires_python(data),
            _sha(data),
        )
    clean_stale(dest)
    with publish_dir(dest / "simple") as staged:
        write_pages(staged, list(links.values()))


def _bounded(path: Path, limit: int, what: str) -> bytes:
    try:
        return regular_file_bytes(path, limit)
    except Unreadable as exc:
        reason = exc.reason(limit)
        raise ToolkitError(
            f"{display_path(path)}: unreadable {what} ({reason}; publish a regular file)"
        ) from None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

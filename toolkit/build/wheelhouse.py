"""The wheelhouse: built wheels per line, a JSON build record beside each, and a PEP 503 index.

Layout:
  wheelhouse/<line>/<wheel>.whl            the wheel
  wheelhouse/<line>/<wheel>.whl.build.json its build record (inputs, outputs); written last
  wheelhouse/<line>/logs/build-*.log       full build logs
  wheelhouse/simple/<project>/index.html   PEP 503 index over every recorded wheel

A record is what says "this wheel was built successfully from these inputs": it is written after the
wheel is in place (atomic.copy_atomic), and removed before a wheel of the same name is replaced, so
an interrupted build never leaves a record that claims a wheel it did not finish. To a reader the pair
is atomic: a wheel without its record is no cache hit, is never indexed, and is removed (by the
interrupted placement itself, or by the next lookup after a SIGKILL). A cache hit (re)writes the index,
so a build killed between its record and its index still ends with one.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.atomic import checkpoint, clean_stale, copy_atomic, publish_dir, write_atomic
from toolkit.base.digest import sha256_file, sha256_json
from toolkit.base.fslock import locked
from toolkit.build.record import RECORD_SUFFIX, BuildRecord


@dataclass(frozen=True)
class CachedBuild:
    wheel: Path
    record_path: Path
    record: BuildRecord


def inputs_key(inputs: dict) -> str:
    """sha256 of the canonical JSON of a build's inputs: what the cache is keyed on."""
    return sha256_json(inputs)


def record_path_for(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + RECORD_SUFFIX)


def records(line_dir: Path) -> list[tuple[Path, BuildRecord]]:
    """Every build record in a line's folder, newest first."""
    found = [(path, BuildRecord.read(path)) for path in line_dir.glob(f"*{RECORD_SUFFIX}")]
    return sorted(found, key=lambda item: item[1].finished, reverse=True)


def find_cached(line_dir: Path, key: str) -> CachedBuild | None:
    """A recorded build with these inputs whose wheel is still there, byte for byte.

    What a killed placement left (a wheel without its record, temporaries) is removed first; a hit
    re-writes the index, which a build killed after its record never wrote."""
    if not line_dir.is_dir():
        return None
    clean_unrecorded(line_dir)
    for path, record in records(line_dir):
        if record.inputs_key != key:
            continue
        wheel = line_dir / record.outputs.wheel
        if wheel.exists() and sha256_file(wheel) == record.outputs.wheel_sha256:
            write_index(line_dir.parent)
            return CachedBuild(wheel, path, record)
    return None


def clean_unrecorded(line_dir: Path) -> None:
    """Remove wheels without a record beside them (a placement killed between the two) and the
    temporaries of killed runs; a placement in progress holds the line's lock, so none is touched."""
    with locked(line_dir):
        clean_stale(line_dir)
        for wheel in line_dir.glob("*.whl"):
            if not record_path_for(wheel).exists():
                wheel.unlink(missing_ok=True)


def place(built_wheel: Path, line_dir: Path, record: BuildRecord) -> Path:
    """Move a finished wheel into the wheelhouse, then write its record: each step atomic, the pair
    atomic to readers (an interrupted placement removes the wheel it placed without a record)."""
    line_dir.mkdir(parents=True, exist_ok=True)
    dest = line_dir / built_wheel.name
    with locked(line_dir):
        record_path_for(dest).unlink(missing_ok=True)  # no record may vouch for a wheel being replaced
        copy_atomic(built_wheel, dest)  # copied, not moved: the build dir may be on another filesystem
        try:
            checkpoint("wheelhouse:record")
            write_atomic(record_path_for(dest), record.text())
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
    return dest


def normalize(project: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", project).lower()


def write_index(wheelhouse: Path) -> Path:
    """(Re)write wheelhouse/simple/: one page per project, linking every recorded wheel with its sha256.

    Only wheels with a record are listed, so `pip install --index-url file://.../simple` never sees a
    wheel whose build did not finish. Builds of several lines finishing together take turns (file lock).
    """
    with locked(wheelhouse / "simple"):
        return _write_index_locked(wheelhouse)


def _write_index_locked(wheelhouse: Path) -> Path:
    projects: dict[str, list[tuple[str, str]]] = {}
    for record_file in sorted(wheelhouse.glob(f"*/*{RECORD_SUFFIX}")):
        outputs = BuildRecord.read(record_file).outputs
        wheel_name = outputs.wheel
        if not (record_file.parent / wheel_name).exists():
            continue
        href = f"../../{record_file.parent.name}/{wheel_name}#sha256={outputs.wheel_sha256}"
        projects.setdefault(normalize(wheel_name.split("-")[0]), []).append((href, wheel_name))
    simple = wheelhouse / "simple"
    clean_stale(wheelhouse)
    with publish_dir(simple) as staged:
        root_links = []
        for project, links in sorted(projects.items()):
            (staged / project).mkdir()
            anchors = "\n".join(f'<a href="{html.escape(href)}">{html.escape(name)}</a><br>'
                                for href, name in sorted(links, key=lambda item: item[1]))
            (staged / project / "index.html").write_text(_page(f"Links for {project}", anchors))
            root_links.append(f'<a href="{project}/">{project}</a><br>')
        (staged / "index.html").write_text(_page("Simple index", "\n".join(root_links)))
    return simple


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n{body}\n</body></html>\n")

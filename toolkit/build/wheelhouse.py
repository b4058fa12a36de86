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

from dataclasses import dataclass, replace
from pathlib import Path

from toolkit.base.atomic import checkpoint, clean_stale, copy_atomic, publish_dir, write_atomic
from toolkit.base.digest import sha256_file, sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.build.record import RECORD_SUFFIX, BuildRecord
from toolkit.cache.simple import Link, write_pages
from toolkit.cache.substitute import Substitute


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
        record_path_for(dest).unlink(
            missing_ok=True
        )  # no record may vouch for a wheel being replaced
        copy_atomic(
            built_wheel, dest
        )  # copied, not moved: the build dir may be on another filesystem
        try:
            checkpoint("wheelhouse:record")
            write_atomic(record_path_for(dest), record.text())
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
    return dest


def place_substitute(found: Substitute, line_dir: Path, key: str) -> CachedBuild:
    """Place a wheel a cache published for inputs `key`, once its record agrees: a record of these inputs (its
    inputs hash to the key) naming this wheel and these bytes. The placed record is the publisher's, saying
    where it came from. Any disagreement is one line and nothing is placed."""
    record = BuildRecord.read(found.record)
    if record.inputs_key != key or inputs_key(record.inputs.to_json()) != key:
        raise ToolkitError(
            f"{found.source}: its build record is of other inputs (inputs key "
            f"{inputs_key(record.inputs.to_json())}, this build's {key}; refused, the build compiles instead)"
        )
    if (record.outputs.wheel, record.outputs.wheel_sha256) != (
        found.entry.wheel_name,
        found.entry.wheel_sha256,
    ):
        raise ToolkitError(
            f"{found.source}: its build record names {record.outputs.wheel} with sha256 "
            f"{record.outputs.wheel_sha256}, the entry {found.entry.wheel_name} with sha256 "
            f"{found.entry.wheel_sha256} (refused; the build compiles instead)"
        )
    record = replace(record, substituted_from=found.source)
    wheel = place(found.wheel, line_dir, record)
    return CachedBuild(wheel, record_path_for(wheel), record)


def write_index(wheelhouse: Path) -> Path:
    """(Re)write wheelhouse/simple/: one page per project, linking every recorded wheel with its sha256.

    Only wheels with a record are listed, so `pip install --index-url file://.../simple` never sees a
    wheel whose build did not finish. Builds of several lines finishing together take turns (file lock).
    """
    with locked(wheelhouse / "simple"):
        return _write_index_locked(wheelhouse)


def _write_index_locked(wheelhouse: Path) -> Path:
    links = []
    for record_file in sorted(wheelhouse.glob(f"*/*{RECORD_SUFFIX}")):
        outputs = BuildRecord.read(record_file).outputs
        if (record_file.parent / outputs.wheel).exists():
            links.append(
                Link(
                    f"../../{record_file.parent.name}/{outputs.wheel}",
                    outputs.wheel,
                    outputs.wheel_sha256,
                )
            )
    simple = wheelhouse / "simple"
    clean_stale(wheelhouse)
    with publish_dir(simple) as staged:
        write_pages(staged, links)
    return simple

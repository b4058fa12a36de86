"""The wheelhouse: built wheels per line, a JSON build record beside each, and a PEP 503 index.

Layout:
  wheelhouse/<line>/<wheel>.whl            the wheel
  wheelhouse/<line>/<wheel>.whl.build.json its build record (inputs, outputs); written last
  wheelhouse/<line>/logs/build-*.log       full build logs
  wheelhouse/simple/<project>/index.html   PEP 503 index over every recorded wheel

A record is what says "this wheel was built successfully from these inputs": it is written after the
wheel is in place (temp file + os.replace), and removed before a wheel of the same name is replaced, so
an interrupted build never leaves a record that claims a wheel it did not finish.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from toolkit.atomic import write_atomic
from toolkit.digest import sha256_file, sha256_json
from toolkit.errors import ToolkitError
from toolkit.fslock import locked
from toolkit.spec import display_path

RECORD_SUFFIX = ".build.json"
RECORD_SCHEMA = 1


@dataclass(frozen=True)
class CachedBuild:
    wheel: Path
    record_path: Path
    record: dict


def inputs_key(inputs: dict) -> str:
    """sha256 of the canonical JSON of a build's inputs: what the cache is keyed on."""
    return sha256_json(inputs)


def record_path_for(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + RECORD_SUFFIX)


def read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ToolkitError(f"{display_path(path)}: unreadable build record ({exc.__class__.__name__}; "
                           f"delete it and rebuild with --force)") from None
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        raise ToolkitError(f"{display_path(path)}: not a build record of schema {RECORD_SCHEMA} "
                           f"(delete it and rebuild with --force)")
    return record


def records(line_dir: Path) -> list[tuple[Path, dict]]:
    """Every build record in a line's folder, newest first."""
    found = [(path, read_record(path)) for path in line_dir.glob(f"*{RECORD_SUFFIX}")]
    return sorted(found, key=lambda item: item[1].get("finished", ""), reverse=True)


def find_cached(line_dir: Path, key: str) -> CachedBuild | None:
    """A recorded build with these inputs whose wheel is still there, byte for byte."""
    for path, record in records(line_dir) if line_dir.is_dir() else []:
        if record.get("inputs_key") != key:
            continue
        wheel = line_dir / record["outputs"]["wheel"]
        if wheel.exists() and sha256_file(wheel) == record["outputs"]["wheel_sha256"]:
            return CachedBuild(wheel, path, record)
    return None


def place(built_wheel: Path, line_dir: Path, record: dict) -> Path:
    """Move a finished wheel into the wheelhouse, then write its record: each step atomic."""
    line_dir.mkdir(parents=True, exist_ok=True)
    dest = line_dir / built_wheel.name
    record_path_for(dest).unlink(missing_ok=True)  # no record may vouch for a wheel being replaced
    partial = line_dir / f".{built_wheel.name}.partial-{os.getpid()}"
    try:
        shutil.copyfile(built_wheel, partial)  # the build dir may be on another filesystem
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    write_atomic(record_path_for(dest), json.dumps(record, indent=2, sort_keys=True) + "\n")
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
        record = read_record(record_file)
        wheel_name = record["outputs"]["wheel"]
        if not (record_file.parent / wheel_name).exists():
            continue
        href = f"../../{record_file.parent.name}/{wheel_name}#sha256={record['outputs']['wheel_sha256']}"
        projects.setdefault(normalize(wheel_name.split("-")[0]), []).append((href, wheel_name))
    simple = wheelhouse / "simple"
    staged = wheelhouse / f".simple.tmp-{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        root_links = []
        for project, links in sorted(projects.items()):
            (staged / project).mkdir()
            anchors = "\n".join(f'<a href="{html.escape(href)}">{html.escape(name)}</a><br>'
                                for href, name in sorted(links, key=lambda item: item[1]))
            (staged / project / "index.html").write_text(_page(f"Links for {project}", anchors))
            root_links.append(f'<a href="{project}/">{project}</a><br>')
        (staged / "index.html").write_text(_page("Simple index", "\n".join(root_links)))
        old = wheelhouse / f".simple.old-{os.getpid()}"
        if simple.exists():
            os.replace(simple, old)
        os.replace(staged, simple)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return simple


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n{body}\n</body></html>\n")

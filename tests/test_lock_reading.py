"""Reading a lock is cheap: one libyaml parse, no conda-lock and no pydantic, and still every check
conda-lock's parser made: whatever conda-lock refuses, read_lock refuses in one line."""

from __future__ import annotations

import copy
import datetime
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from conda_lock.lockfile import parse_conda_lock_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.base.errors import ToolkitError
from toolkit.env import lockfile
from toolkit.env.lockfile import KEY_DIGEST, lock_digest, read_lock

ROOT = Path(__file__).resolve().parent.parent
LARGEST = max((ROOT / "locks").glob("*.conda-lock.yml"), key=lambda p: p.stat().st_size)
PRISTINE = yaml.safe_load(LARGEST.read_text())
NO_CONDA_LOCK = {"conda_lock": None, "conda_lock.lockfile": None, "pydantic": None}  # an import of either fails


def test_reading_a_lock_imports_neither_conda_lock_nor_pydantic():
    """conda-lock's parser (and with it all of conda-lock and pydantic) was imported for every lock read."""
    script = ("import sys\nfrom toolkit.env.lockfile import read_lock\n"
              f"assert len(read_lock({str(LARGEST)!r}).packages) > 30\n"
              "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('conda_lock', 'pydantic')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_a_lock_is_parsed_once_by_libyaml(monkeypatch):
    """One composition by libyaml's loader; PyYAML's pure-Python loading and event scan are never used."""
    assert lockfile.fast_loader() is yaml.CSafeLoader  # libyaml is built into CI's PyYAML
    made = []

    class Counted(yaml.CSafeLoader):
        def __init__(self, stream):
            made.append(stream)
            super().__init__(stream)

    def refused(*args, **kwargs):
        raise AssertionError("a second parse")

    read_lock(LARGEST)  # the knowledge a pypi lock is checked against, read (by its own libyaml load) first
    monkeypatch.setattr(lockfile, "fast_loader", lambda: Counted)
    for name in ("safe_load", "load", "parse", "compose"):
        monkeypatch.setattr(yaml, name, refused)
    with mock.patch.dict(sys.modules, NO_CONDA_LOCK):
        locked = read_lock(LARGEST)
    assert made == [LARGEST.read_text()]
    assert [p.name for p in locked.packages] == [entry["name"] for entry in PRISTINE["package"]]


HOSTILE = st.sampled_from([None, 0, 1, True, 1.5, "", "x", "conda", "pip", [], ["x"], {}, {"a": "b"},
                           {"url": "x", "used_env_vars": []}, datetime.date(2026, 12, 5)])
# Every mapping of the lock an edit may reach: the top, metadata and its parts, a package entry and its parts.
PLACES = [(), ("metadata",), ("metadata", "content_hash"), ("metadata", "custom_metadata"), ("package", 0),
          ("package", 7), ("package", 0, "hash"), ("package", 7, "dependencies")]
KEYS = ["version", "metadata", "package", "content_hash", "channels", "platforms", "sources", "time_metadata",
        "git_metadata", "inputs_metadata", "custom_metadata", "name", "version", "manager", "platform", "url",
        "hash", "md5", "sha256", "dependencies", "optional", "category", "source", "build", "extra", KEY_DIGEST]


@st.composite
def edits(draw):
    """(place, key, how, value): at a mapping of the lock, a key deleted, set to a hostile value, or a list's
    item replaced by one."""
    return draw(st.sampled_from(PLACES)), draw(st.sampled_from(KEYS)), \
        draw(st.sampled_from(["delete", "set", "item"])), draw(HOSTILE)


def edited(edit) -> dict:
    place, key, how, value = edit
    document = copy.deepcopy(PRISTINE)
    target = document
    for step in place:
        target = target[step]
    if how == "delete":
        target.pop(key, None)
    elif how == "item" and isinstance(target.get(key), list) and target[key]:
        target[key][0] = value
    else:
        target[key] = value
    try:
        document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)  # re-signed: the shape decides
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    return document


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=edits())
def test_what_conda_lock_refuses_read_lock_refuses_without_it(tmp_path, edit):
    """conda-lock's own parser is the judge; read_lock runs where it cannot be imported. An edit conda-lock
    refuses (a field missing, one it does not know, a value of another type) is one line from read_lock."""
    path = tmp_path / LARGEST.name
    path.write_text(yaml.safe_dump(edited(edit), sort_keys=False))
    try:
        parse_conda_lock_file(path)
    except Exception:  # any refusal of conda-lock's
        with pytest.raises(ToolkitError) as refused, mock.patch.dict(sys.modules, NO_CONDA_LOCK):
            read_lock(path)
        assert "\n" not in str(refused.value) and path.name in str(refused.value)


@pytest.mark.parametrize("change, says", [
    (lambda d: d["package"][0].pop("optional"), "package[0].optional: missing"),
    (lambda d: d["package"][3].update(extra="x"), "package[3].extra: not a field of a conda-lock file"),
    (lambda d: d["metadata"].pop("content_hash"), "metadata.content_hash: missing"),
    (lambda d: d["package"][1].update(manager="conda", url="https://c.example/linux-64/x-1-0.conda"),
     "package[1].hash.md5: missing (conda package hashes must use MD5)"),
])
def test_a_shape_conda_lock_refuses_is_named_by_its_field(tmp_path, change, says):
    document = copy.deepcopy(PRISTINE)
    change(document)
    document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    path = tmp_path / LARGEST.name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(Exception):  # noqa: B017  # conda-lock's own verdict: refused
        parse_conda_lock_file(path)
    with pytest.raises(ToolkitError) as refused:
        read_lock(path)
    assert f"malformed conda-lock file ({says};" in str(refused.value)


def test_a_lock_toolkit_lock_wrote_reads_the_same_as_conda_lock_reads_it():
    """Every committed lock: the packages read_lock gives are conda-lock's, field for field."""
    for path in sorted((ROOT / "locks").glob("*.conda-lock.yml")):
        ours = {(p.platform, p.manager, p.name): (p.version, p.url, p.sha256) for p in read_lock(path).packages}
        theirs = {(p.platform, p.manager, p.name): (p.version, p.url, p.hash.sha256)
                  for p in parse_conda_lock_file(path).package}
        assert ours == theirs, path.name

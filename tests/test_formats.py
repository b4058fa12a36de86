"""Every committed file of the build and env stages' formats still reads through its typed, versioned reader
(issue 31 item 5): build records, install records, FA4 locks and kernel-cache records under docs/results/ and
locks/. Expected values come from the raw file (json.load) and hashlib, never from the reader; the binary
cache's inputs key of a committed record is the sha256 of its raw inputs, and the typed inputs give it back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.build.record import BuildRecord
from toolkit.build.wheelhouse import inputs_key
from toolkit.env import fa4_lock
from toolkit.env.install_record import PrefixRecord
from toolkit.fa4 import jit

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted(p for p in [*ROOT.glob("docs/results/**/*.json"), *ROOT.glob("locks/*.json")])


def raw(path: Path) -> object:
    return json.loads(path.read_text())


def kind(data: object) -> str | None:
    if not isinstance(data, dict):
        return None
    if "inputs_key" in data:
        return "build record"
    if data.get("kind") in ("fa4-kernel-cache", "fa4-lock"):
        return data["kind"]
    if {"lock_sha256", "input_hash", "platform"} <= data.keys():
        return "install record"
    return None


def of(what: str) -> list[Path]:
    return [path for path in COMMITTED if kind(raw(path)) == what]


def canonical_sha256(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_each_format_has_committed_files_to_walk():
    assert {what: len(of(what)) for what in ("build record", "install record", "fa4-lock", "fa4-kernel-cache")} \
        == {"build record": 12, "install record": 1, "fa4-lock": 2, "fa4-kernel-cache": 3}


@pytest.mark.parametrize("path", of("build record"), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_build_records_read_and_keep_their_inputs_key(path: Path):
    data = raw(path)
    assert isinstance(data, dict)
    record = BuildRecord.read(path)
    assert canonical_sha256(data["inputs"]) == data["inputs_key"]  # as it was written, by hashlib
    assert inputs_key(record.inputs.to_json()) == data["inputs_key"]  # the typed inputs move no key
    assert record.inputs.to_json() == data["inputs"]
    assert record.schedule.to_json() == data.get("schedule", {})
    assert {name: value for name, value in record.to_json().items() if name in data} == data
    assert record.parallelism.jobs == data["parallelism"]["jobs"] and record.parallelism.basis == \
        data["parallelism"]["basis"]
    assert [patch.file for patch in record.patches] == [patch["file"] for patch in data.get("patches", [])]
    toolchain = data["inputs"]["toolchain"]
    assert (record.toolchain.torch, record.toolchain.nvcc) == (toolchain["torch"], toolchain["nvcc"])


@pytest.mark.parametrize("path", of("install record"), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_install_records_read(path: Path):
    data = raw(path)
    assert isinstance(data, dict)
    record = PrefixRecord.from_json(data)
    assert (record.line, record.lock_sha256, record.written) == (data["line"], data["lock_sha256"], data["written"])


@pytest.mark.parametrize("path", of("fa4-lock"), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_fa4_locks_read(path: Path):
    data = raw(path)
    assert isinstance(data, dict)
    rel, cuda_major = fa4_lock.read_fa4_lock(path)
    assert (rel.version, cuda_major) == (data["release"], data["cuda_major"])
    assert sorted(pin.sha256 for pin in rel.wheels_for(cuda_major)) == sorted(w["sha256"] for w in data["wheels"])


@pytest.mark.parametrize("path", of("fa4-kernel-cache"), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_kernel_cache_records_read(path: Path):
    data = raw(path)
    assert isinstance(data, dict)
    record = jit.cache_record(path)
    assert (record.sha256, record.entries, record.schema) == (data["sha256"], data["entries"], 1)
    assert record.key.arch == data["key"]["arch"]


def _newer(data: dict) -> dict:
    return {**data, "schema": 7}


@pytest.mark.parametrize("path, read, command", [
    (of("build record")[0], BuildRecord.read, "toolkit build LINE --force"),
    (of("fa4-kernel-cache")[0], jit.cache_record, "toolkit fa4 warm"),
])
def test_a_schema_this_toolkit_does_not_know_is_one_line_naming_the_command(tmp_path, path, read, command):
    copy = tmp_path / path.name
    copy.write_text(json.dumps(_newer(raw(path))))  # type: ignore[arg-type]
    with pytest.raises(ToolkitError) as caught:
        read(copy)
    message = str(caught.value)
    assert "\n" not in message and "schema 7" in message and command in message and str(copy) in message


def test_an_install_record_of_an_unknown_schema_names_the_fix(tmp_path):
    (tmp_path / "etc" / "fa-envkit").mkdir(parents=True)
    record = raw(of("install record")[0])
    (tmp_path / PrefixRecord.FILE).write_text(json.dumps(_newer(record)))  # type: ignore[arg-type]
    with pytest.raises(ToolkitError, match=r"schema 7; this toolkit reads schema 1; run `toolkit install`"):
        PrefixRecord.load(tmp_path, "run `toolkit install`")


def test_an_fa4_lock_with_a_field_of_another_type_is_refused(tmp_path):
    """The typed model is exact (extra="forbid", strict): a field the lock never had is refused, not dropped."""
    data = raw(of("fa4-lock")[0])
    assert isinstance(data, dict)
    edited = {key: value for key, value in data.items() if key != "digest"}
    edited["note"] = "mine"
    edited["digest"] = canonical_sha256(edited)
    path = tmp_path / "x.fa4-lock.json"
    path.write_text(json.dumps(edited))
    with pytest.raises(ToolkitError, match=r"x.fa4-lock.json: not an FA4 lock this toolkit reads \(note: "):
        fa4_lock.read_fa4_lock(path)

"""The build record model: the records real builds wrote (docs/results/, from the H200 runs) read back
exactly, and a record of another shape is refused in one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.build.record import BuildRecord

ROOT = Path(__file__).resolve().parent.parent
REAL_RECORDS = sorted(ROOT.glob("docs/results/*/build-record.json"))


@pytest.mark.parametrize("path", REAL_RECORDS, ids=lambda p: p.parent.name)
def test_records_of_real_builds_read_back_unchanged(path: Path):
    data = json.loads(path.read_text())
    record = BuildRecord.read(path)
    assert record.sdist.sha256 == data["sdist"]["sha256"] and record.archs == data["inputs"]["archs"]
    assert len(record.outputs.objects) == data["outputs"]["efficiency"]["objects"]
    # the first run's record predates the schedule section; none of them had patches or neutralised NVCC_*, and
    # all are flash-attn 2.x builds (no flash_attn_3 section), none continued an interrupted build or came from a cache;
    # all predate the compile cache (its section is written null for a build without it: test_compile_cache)
    expected = {"schedule": {}, "patches": [], "neutralised_environment": {}, "flash_attn_3": {}, "resumed": {},
                "substituted_from": "", "compile_cache": None,
                **data}
    assert record.to_json() == expected


def test_there_are_real_records_to_check():
    assert len(REAL_RECORDS) >= 3


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["outputs"].pop("wheel_sha256"), "outputs.wheel_sha256"),
    (lambda d: d["sdist"].update(sha256=["not", "text"]), "sdist.sha256"),
    (lambda d: d["outputs"].update(wheel_size="big"), "outputs.wheel_size"),
    (lambda d: d["outputs"]["objects"].append({"name": "x.o"}), "outputs.objects.{objects}.start_s"),
])
def test_a_record_of_another_shape_is_refused_in_one_line(tmp_path: Path, mutate, field):
    data = json.loads(REAL_RECORDS[-1].read_text())
    field = field.format(objects=len(data["outputs"]["objects"]))  # the appended object's index
    mutate(data)
    path = tmp_path / "x.whl.build.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ToolkitError) as caught:
        BuildRecord.read(path)
    message = str(caught.value)
    assert "\n" not in message and f"field {field}:" in message and str(path) in message


@pytest.mark.parametrize("text", ["", "[]", '{"schema": 2}', "\x00\xff", "{"])
def test_what_is_not_a_record_is_refused_in_one_line(tmp_path: Path, text: str):
    path = tmp_path / "x.whl.build.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ToolkitError) as caught:
        BuildRecord.read(path)
    assert "\n" not in str(caught.value) and "rebuild with --force" in str(caught.value)

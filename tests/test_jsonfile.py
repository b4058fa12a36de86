"""The one reader of JSON files a user can edit (hostile review D8): every refusal one line naming the file.

json.loads raises RecursionError (not a ValueError) on deeply nested brackets, and ValueError on a number
of over 4300 digits; a FIFO or a device named *.json would block or fill memory. Each of the toolkit's
file readers is fed such a file here (through the reader's own function, with the file where the toolkit
looks for it) and must give a ToolkitError of one line that names the file.
"""

from __future__ import annotations

import email.message
import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from toolkit.attention import recommend
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import parse_json, read_json
from toolkit.build import ninja_shim
from toolkit.build.record import BuildRecord
from toolkit.doctor import facts as doctor_facts
from toolkit.env import archives, fa4_lock, lock
from toolkit.fa4 import install as fa4
from toolkit.fa4 import wheels as fa4_wheels
from toolkit.knowledge import upstream
from toolkit.site import modules, scaleout
from toolkit.verify import bench
from toolkit.verify import report as verify_report

DEEP = "[" * 100_000 + "]" * 100_000  # one line, 200 KB: the review's repro


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text, text
    return text


def deep(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEEP)
    return path


# ---------------------------------------------------------------- read_json itself


def test_a_good_file_is_read(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"a": [1, 2.5, None, "ü"]}))
    assert read_json(path, "record", "write it again") == {"a": [1, 2.5, None, "ü"]}


@pytest.mark.parametrize("content, reason", [
    (DEEP, "nested too deeply"),
    ("1" * 5000, "a number of more than"),
    ('{"a": 1,\n "b": }', "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    ("", "not JSON"),
])
def test_content_json_cannot_read_is_one_line(tmp_path, content, reason):
    path = tmp_path / "r.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ToolkitError) as caught:
        read_json(path, "cache record", "warm again")
    text = one_line(caught)
    assert text.startswith(f"{path}") and "unreadable cache record" in text and reason in text
    assert text.endswith("warm again)")


def test_a_syntax_error_names_its_line(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"a": 1,\n "b": }')
    with pytest.raises(ToolkitError) as caught:
        read_json(path, "record", "fix it")
    assert one_line(caught).startswith(f"{path}:2: ")


def test_what_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    found: list = []
    reader = threading.Thread(target=lambda: found.append(_refusal(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert found and "a FIFO" in found[0], "read_json blocked on a FIFO"
    assert "a directory" in _refusal(tmp_path)
    assert "a character device" in _refusal(Path("/dev/zero"))
    assert "file not found" in _refusal(tmp_path / "none.json")


def _refusal(path: Path) -> str:
    with pytest.raises(ToolkitError) as caught:
        read_json(path, "record", "fix it")
    return one_line(caught)


def test_a_file_over_the_bound_is_refused_without_reading_all_of_it(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(ToolkitError, match="larger than 1,000 bytes"):
        read_json(path, "record", "fix it", limit=1000)
    assert read_json(path, "record", "fix it", limit=2000) == [0] * 601
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as handle:
        handle.truncate(8 << 30)  # 8 GiB of holes: reading it all would take seconds and 8 GiB of memory
    started = time.monotonic()
    assert "larger than" in _refusal(sparse)
    assert time.monotonic() - started < 2


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=64) | st.text(alphabet="[]{}\":,0-9.eE", max_size=64).map(str.encode))
def test_any_bytes_give_a_value_or_one_line(tmp_path, data):
    path = tmp_path / "any.json"
    path.write_bytes(data)
    try:
        read_json(path, "record", "fix it")
    except ToolkitError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 63) | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON_VALUES)
def test_what_json_dumps_writes_reads_back(tmp_path, value):
    path = tmp_path / "v.json"
    path.write_text(json.dumps(value))
    assert read_json(path, "record", "fix it") == value


def test_text_already_in_memory_is_refused_in_one_line_naming_where_it_came_from():
    with pytest.raises(ToolkitError) as caught:
        parse_json(DEEP.encode(), "https://pypi.org/pypi/x/json", "PyPI answer", "try again")
    assert one_line(caught).startswith("https://pypi.org/pypi/x/json: unreadable PyPI answer (nested too deeply")


# ---------------------------------------------------------------- every reader of a JSON file in the toolkit


def _conda_meta_doctor(tmp: Path) -> Path:
    doctor_facts._conda_packages(tmp / "env")
    return tmp / "env" / "conda-meta" / "x.json"


def _conda_meta_modules(tmp: Path) -> Path:
    modules.conda_packages(tmp / "env")
    return tmp / "env" / "conda-meta" / "x.json"


def _doctor_report(tmp: Path) -> Path:
    doctor_facts.read_report(tmp / "report.json")
    return tmp / "report.json"


def _build_record(tmp: Path) -> Path:
    BuildRecord.read(tmp / "x.build.json")
    return tmp / "x.build.json"


def _bench(tmp: Path) -> Path:
    bench.finish(tmp / "reports", Console(file=io.StringIO()), {})
    return tmp / "reports" / "bench.json"


def _verify_report(tmp: Path) -> Path:
    verify_report.show(tmp / "verify.json", Console(file=io.StringIO()))
    return tmp / "verify.json"


def _shim_outcome(tmp: Path) -> Path:
    ninja_shim.manifest_outcome(tmp)
    return tmp / ninja_shim.MANIFEST_OUTCOME


def _shim_plan(tmp: Path) -> Path:
    (tmp / "build").mkdir()
    (tmp / "build" / "build.ninja").write_text("rule cc\n  command = cc\n")
    ninja_shim.prepare_manifest([str(tmp / "plan.json"), "-C", str(tmp / "build")])
    return tmp / "plan.json"


def _recorded_answers(tmp: Path) -> Path:
    upstream.recorded_fetch(tmp)
    return tmp / upstream.RECORD_INDEX


READERS = {  # reader -> the file it reads, made deep before the call
    "doctor: conda-meta": (_conda_meta_doctor, "env/conda-meta/x.json"),
    "modules: conda-meta": (_conda_meta_modules, "env/conda-meta/x.json"),
    "doctor --fingerprint report": (_doctor_report, "report.json"),
    "build record": (_build_record, "x.build.json"),
    "bench finish": (_bench, "reports/bench.json"),
    "verify show": (_verify_report, "verify.json"),
    "ninja shim outcome": (_shim_outcome, ninja_shim.MANIFEST_OUTCOME),
    "ninja shim plan": (_shim_plan, "plan.json"),
    "upstream recorded answers": (_recorded_answers, upstream.RECORD_INDEX),
    "FA4 lock": (lambda tmp: fa4_lock.read_fa4_lock(tmp / "x.fa4-lock.json"), "x.fa4-lock.json"),
    "FA4 parts manifest": (lambda tmp: fa4_wheels.join_parts(tmp / "w.whl.parts.json", [tmp], tmp / "out"),
                           "w.whl.parts.json"),
    "FA4 install record": (lambda tmp: fa4.load_record(tmp), "fa4-install.json"),
    "recommendation": (lambda tmp: recommend.read_recommendation(tmp / "recommendation.json"), "recommendation.json"),
}


@pytest.mark.parametrize("name", READERS)
def test_every_json_file_reader_refuses_deep_nesting_in_one_line(tmp_path, name):
    reader, relative = READERS[name]
    deep(tmp_path / relative)
    with pytest.raises(ToolkitError) as caught:
        reader(tmp_path)
    text = one_line(caught)
    assert str(tmp_path / relative) in text and "nested too deeply" in text


def test_a_deep_status_file_is_a_task_not_yet_reported(tmp_path):
    """The scale-out watcher reads each task's status file as it appears; an unreadable one is 'no status yet'."""
    assert scaleout.read_status(deep(tmp_path / "status.json")) is None


def test_recorded_or_fetched_pypi_answers_that_are_too_deep_are_one_line(tmp_path):
    url = "https://pypi.org/pypi/flash-attn/json"
    for call in (lambda: upstream.pypi_releases("flash-attn", DEEP.encode(), url),
                 lambda: upstream.trimmed(url, DEEP.encode())):
        with pytest.raises(ToolkitError) as caught:
            call()
        assert one_line(caught).startswith(f"{url}: ")


def test_a_conda_archive_whose_paths_json_is_too_deep_is_one_line(tmp_path):
    archive = tmp_path / "pkg-1.0-0.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        data = DEEP.encode()
        member = tarfile.TarInfo("info/paths.json")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(ToolkitError) as caught:
        archives.check_conda_archive(archive)
    assert "not a readable conda archive" in one_line(caught)


def test_an_index_answering_deep_json_for_the_sdist_pin_is_one_line(monkeypatch):
    """urlopen's answer is a TEST DOUBLE (a BytesIO): the index's JSON is what matters, not the network."""
    def urlopen(request, timeout):
        answer = io.BytesIO(DEEP.encode())
        answer.headers = email.message.Message()  # type: ignore[attr-defined]
        answer.headers["Content-Type"] = "application/vnd.pypi.simple.v1+json"  # the JSON API, as PyPI answers
        return answer

    monkeypatch.setattr(lock.urllib.request, "urlopen", urlopen)
    with pytest.raises(ToolkitError) as caught:
        lock.fetch_sdist_pin("2.8.3.post2", index="https://index.example/simple")
    assert "cannot read flash-attn's release files" in one_line(caught)

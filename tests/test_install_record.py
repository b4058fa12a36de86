"""Install records (toolkit/env/install_record.py): the one reader and writer of etc/fa-envkit/lock.json in a
conda prefix and fa4-install.json in an FA4 target folder. The "earlier" JSON below is exactly what the
toolkit wrote before the records shared one module (install.py's and fa4.py's own `asdict` dumps)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.base.errors import ToolkitError
from toolkit.env.install_record import Fa4Record, PrefixRecord

PREFIX = PrefixRecord(line="cu126", lock="/p/locks/cu126.conda-lock.yml", platform="linux-64",
                      input_hash="ab" * 32, lock_sha256="cd" * 32, prefix="/p/.envs/cu126")
FA4 = Fa4Record("4.0.0b36", "13", "/opt/fa4", "/usr/bin/python3", ["flash-attn-4==4.0.0b36"], {"torch": "2.11.0"},
                ["/opt/fa4", "/opt/fa4/nvidia_cutlass_dsl/dsl_packages"])


@pytest.mark.parametrize("record", [PREFIX, FA4], ids=["prefix", "fa4"])
def test_written_atomically_and_read_back(tmp_path, record):
    path = record.write(tmp_path)
    assert path == tmp_path / record.FILE and json.loads(path.read_text())["schema"] == 1
    assert type(record).read(tmp_path) == record == type(record).load(tmp_path, "fix")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left beside it


def test_records_the_toolkit_wrote_before_still_read(tmp_path):
    (tmp_path / "etc" / "fa-envkit").mkdir(parents=True)
    earlier_prefix = {"line": "cu126", "lock": PREFIX.lock, "platform": "linux-64", "input_hash": "ab" * 32,
                      "lock_sha256": "cd" * 32, "schema": 1}
    (tmp_path / PrefixRecord.FILE).write_text(json.dumps(earlier_prefix, indent=2) + "\n")
    earlier_fa4 = {"release": "4.0.0b36", "cuda_major": "13", "target": "/opt/fa4", "python": "/usr/bin/python3",
                   "installed": ["flash-attn-4==4.0.0b36"], "from_base": {"torch": "2.11.0"},
                   "python_path": FA4.python_path}  # fa4.py wrote no schema number
    (tmp_path / Fa4Record.FILE).write_text(json.dumps(earlier_fa4, indent=2) + "\n")
    assert PrefixRecord.read(tmp_path) == PrefixRecord(**{**vars(PREFIX), "prefix": None})  # no folder named
    assert Fa4Record.read(tmp_path) == FA4


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"schema": 2}', json.dumps({"line": "cu126"}),
                                  FA4.to_json(), PREFIX.to_json().replace('"cu126"', "126")])
def test_anything_else_is_no_record_and_a_one_line_error(tmp_path, text):
    (tmp_path / "etc" / "fa-envkit").mkdir(parents=True)
    (tmp_path / PrefixRecord.FILE).write_text(text)
    assert PrefixRecord.read(tmp_path) is None
    with pytest.raises(ToolkitError) as caught:
        PrefixRecord.load(tmp_path, "reinstall it")
    assert "\n" not in str(caught.value) and re.search(r"lock.json(:1)?: unreadable install record", str(caught.value))
    assert str(caught.value).endswith("reinstall it)")


def test_a_missing_record_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(ToolkitError, match=r"fa4-install.json: unreadable install record .*run `toolkit fa4"):
        Fa4Record.load(tmp_path, "run `toolkit fa4 install` first")


VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.text(max_size=3)),
                   st.dictionaries(st.text(max_size=3), st.text(max_size=3)))
FIELDS = ["line", "lock", "platform", "input_hash", "lock_sha256", "schema", "release", "installed", "extra"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(st.sampled_from(FIELDS), VALUES))
def test_a_record_read_has_its_declared_types_or_is_none(tmp_path, data):
    (tmp_path / "etc" / "fa-envkit").mkdir(parents=True, exist_ok=True)
    (tmp_path / PrefixRecord.FILE).write_text(json.dumps(data))
    record = PrefixRecord.read(tmp_path)
    assert record is None or all(isinstance(getattr(record, name), str)
                                 for name in ("line", "lock", "platform", "input_hash", "lock_sha256"))


def test_the_fa4_env_comes_from_its_python_path():
    assert FA4.env() == {"PYTHONPATH": "/opt/fa4:/opt/fa4/nvidia_cutlass_dsl/dsl_packages"}


@pytest.mark.parametrize("kind", [PrefixRecord, Fa4Record])
def test_a_deeply_nested_record_is_no_record_and_a_one_line_error(tmp_path, kind):
    """Hostile review D8: `[` x 100000 made json.loads raise RecursionError, a traceback in doctor and fa4 env."""
    (tmp_path / kind.FILE).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / kind.FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert kind.read(tmp_path) is None
    with pytest.raises(ToolkitError, match="unreadable install record .nested too deeply") as caught:
        kind.load(tmp_path, "reinstall it")
    assert "\n" not in str(caught.value)

"""The FA2 section's name (issue 31): `flash_attn_2:`, the old `flash_attn:` still read with one notice, and the
input hash of every committed spec what its committed lock recorded (locks and binary-cache keys depend on it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from toolkit.base.errors import ToolkitError
from toolkit.cli import main
from toolkit.spec.envspec import load_spec

ROOT = Path(__file__).resolve().parent.parent
LOCKS = sorted((ROOT / "locks").glob("*.conda-lock.yml"))


def recorded_hash(lock: Path) -> str:
    """The input hash the lock was written with, read from the file itself."""
    return yaml.safe_load(lock.read_text())["metadata"]["custom_metadata"]["fa-envkit.input-hash"]


def line_of(lock: Path) -> str:
    return lock.name.removesuffix(".conda-lock.yml")


def test_every_committed_lock_still_checks(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert LOCKS
    assert main(["lock", "--check", *(line_of(lock) for lock in LOCKS)]) == 0


@pytest.mark.parametrize("lock", LOCKS, ids=line_of)
def test_each_committed_spec_hashes_as_its_lock_recorded(lock):
    assert load_spec(ROOT / "envs" / f"{line_of(lock)}.yaml").input_hash() == recorded_hash(lock)


def old_spelling(tmp_path: Path) -> Path:
    """gpu-machine's spec with its base's `flash_attn_2:` written the old way."""
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    base = (ROOT / "envs" / "base.yaml").read_text()
    assert "\nflash_attn_2:\n" in base
    (envs / "base.yaml").write_text(base.replace("\nflash_attn_2:\n", "\nflash_attn:\n"))
    return envs


def test_the_old_section_name_reads_with_one_notice_and_the_same_hash(tmp_path, capsys):
    envs = old_spelling(tmp_path)
    first = load_spec(envs / "gpu-machine.yaml")
    again = load_spec(envs / "gpu-machine.yaml")
    notices = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(notices) == 1 and str(envs / "base.yaml") in notices[0]
    assert "flash_attn: is now flash_attn_2:" in notices[0]
    assert first.flash_attn_version == again.flash_attn_version == "2.8.3.post2"
    assert first.where("flash_attn_2.version").file == envs / "base.yaml"
    assert first.input_hash() == recorded_hash(ROOT / "locks" / "gpu-machine.conda-lock.yml")


def test_both_names_in_one_file_are_refused_in_one_line(tmp_path):
    envs = old_spelling(tmp_path)
    with (envs / "base.yaml").open("a") as base:
        base.write('flash_attn_2:\n  version: "2.8.3.post2"\n')
    with pytest.raises(ToolkitError, match=r"base\.yaml:\d+: flash_attn: the old name of flash_attn_2"):
        load_spec(envs / "gpu-machine.yaml")

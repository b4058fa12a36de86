"""FA4 kernel-cache warming (issue 16): variants, fresh-process cold/warm first calls, the artifact.

No GPU here: the children are real fresh processes (`python -m toolkit.fa4.jit call --device cpu`) that
import tests/fa4_double as flash_attn.cute, a TEST DOUBLE whose "compile" is a sleep on a variant's
first call unless FA4's cache folder holds the entry (its docstring says what is real). So the
orchestration, the cache merge, the latency records and the artifact/record round trip are exercised;
the compile times themselves are measured on the GPU machine (scripts/gpu_fa4.sh).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from toolkit.base.errors import ToolkitError
from toolkit.env.install_record import Fa4Record
from toolkit.fa4 import jit as fa4_jit

pytestmark = [pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
DOUBLE = Path(__file__).parent / "fa4_double"
COMPILE_S = 3.0  # large against the CPU first-call noise of a loaded machine
CPU_CALL = ("--device", "cpu", "--tokens", "64", "--seqlen", "64")


def test_default_variants_are_what_users_run():
    variants = fa4_jit.default_variants()
    assert len(variants) == 2 * 2 * 2 * 2
    assert {v.head_dim for v in variants} == {64, 128} and {v.mode for v in variants} == {"fwd", "fwd+bwd"}
    assert all(fa4_jit.Variant.parse(v.name) == v for v in variants)
    assert fa4_jit.training_step(variants) == [v for v in variants if v.mode == "fwd+bwd"]


@pytest.mark.parametrize("text", ["fwd-bfloat16", "bwd-bfloat16-d64", "fwd-int8-d64", "fwd-bfloat16-64",
                                  "fwd-bfloat16-d64-causal-x", "fwd;rm -rf-bfloat16-d64"])
def test_a_malformed_variant_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected MODE-DTYPE-dHEADDIM"):
        fa4_jit.Variant.parse(text)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """Two variants warmed through real fresh child processes running the double."""
    tmp = tmp_path_factory.mktemp("warm")
    env = {"PYTHONPATH": f"{DOUBLE}:{ROOT}", "FA4_DOUBLE_COMPILE_S": str(COMPILE_S)}
    variants = [fa4_jit.Variant(64, "bfloat16", False, "fwd"), fa4_jit.Variant(64, "bfloat16", True, "fwd+bwd")]
    latency = fa4_jit.warm(sys.executable, variants, tmp / "cache", env, call_args=CPU_CALL, jobs=2)
    return tmp, env, variants, latency


def test_cold_first_calls_compile_and_warm_ones_load_from_the_cache(warmed):
    _, _, variants, latency = warmed
    assert [row["variant"] for row in latency["variants"]] == [v.name for v in variants] and latency["jobs"] == 2
    for row in latency["variants"]:
        assert "error" not in row["cold"] and "error" not in row["warm"], row
        cold, warm = row["cold"]["calls"][0], row["warm"]["calls"][0]
        assert cold["first_call_s"] >= COMPILE_S and cold["first_call_s"] - warm["first_call_s"] > 0.5 * COMPILE_S
        assert cold["first_call_s"] - cold["second_call_s"] > 0.5 * COMPILE_S  # the in-process cache, as in FA4
        assert row["cache_entries_added"] == 1
    step = latency["training_step"]
    assert step["variants"] == ["fwd+bwd-bfloat16-d64-causal"]
    assert step["cold"]["step_s"] >= COMPILE_S and step["cold"]["step_s"] - step["warm"]["step_s"] > 0.5 * COMPILE_S


def test_the_cache_is_packed_with_a_keyed_record_and_unpacks_for_the_same_key_only(warmed, tmp_path):
    tmp, _, _, latency = warmed
    key = {"flash_attn_4": "4.0.0b36", "cutlass_dsl": "4.8.1", "torch": "2.11.0+cu130", "python": "3.12", "arch": "90"}
    archive, record_path = fa4_jit.pack(tmp / "cache", tmp_path / "wheelhouse", key, latency)
    assert archive.name == "fa4-4.0.0b36-cutlass4.8.1-sm90-torch2.11.0_cu130-py3.12.tar.gz"
    record = json.loads(record_path.read_text())
    assert record["key"] == key and record["entries"] == 2 and len(record["variants"]) == 2
    with tarfile.open(archive) as tar:
        assert all(name.startswith("double-fingerprint/fwd/") and name.endswith(".o") for name in tar.getnames())
    env = fa4_jit.unpack(record_path, key, tmp_path / "env-cache")
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert len(list((tmp_path / "env-cache").rglob("*.o"))) == 2
    with pytest.raises(ToolkitError, match="built for"):
        fa4_jit.unpack(record_path, {**key, "torch": "2.12.0"}, tmp_path / "other")
    archive.write_bytes(archive.read_bytes()[:-10])
    with pytest.raises(ToolkitError, match="sha256 differs"):
        fa4_jit.unpack(record_path, key, tmp_path / "other")


def test_a_child_that_fails_is_an_error_row_not_an_abort(tmp_path):
    row = fa4_jit.run_child(sys.executable, [fa4_jit.Variant(64, "bfloat16", False, "fwd")], tmp_path,
                            {"PYTHONPATH": str(ROOT)}, call_args=CPU_CALL)  # no flash_attn.cute importable
    assert "error" in row and "flash_attn" in row["error"]


def test_merge_skips_locks_and_half_written_exports(tmp_path):
    source = tmp_path / "src" / "fp" / "fwd"
    source.mkdir(parents=True)
    (source / "a.o").write_bytes(b"x")
    (source / "a.lock").write_bytes(b"")
    (source / ".a.123.tmp.o").write_bytes(b"partial")
    assert fa4_jit.merge_cache(tmp_path / "src", tmp_path / "dst") == 1
    assert [p.name for p in (tmp_path / "dst").rglob("*") if p.is_file()] == ["a.o"]
    assert fa4_jit.merge_cache(tmp_path / "src", tmp_path / "dst") == 0


def test_a_spent_budget_lists_the_variants_not_reached(tmp_path):
    variants = fa4_jit.default_variants()[:3]
    latency = fa4_jit.warm(sys.executable, variants, tmp_path / "cache", {"PYTHONPATH": str(ROOT)},
                           call_args=CPU_CALL, budget_s=-1)
    assert [row["cold"]["error"] for row in latency["variants"]] == ["not reached: time budget spent"] * 3
    assert latency["training_step"]["variants"] == []


def test_cache_install_unpacks_an_artifact_only_for_a_matching_install(warmed, tmp_path, capsys):
    """The record's key is read from the install's python; FA4 and cutlass-dsl are dist-info STAND-INS here."""
    from toolkit.cli import main

    tmp, _, _, latency = warmed
    site = tmp_path / "site"
    for name, version in (("flash_attn_4", "4.0.0b36"), ("nvidia_cutlass_dsl", "4.8.1")):
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    record = Fa4Record("4.0.0b36", "13", str(site), sys.executable, [], {}, [str(site)])
    record.write(site)
    key = fa4_jit.cache_key(sys.executable, record.env(), "90")
    assert (key["flash_attn_4"], key["cutlass_dsl"], key["arch"]) == ("4.0.0b36", "4.8.1", "90")
    _, record_path = fa4_jit.pack(tmp / "cache", tmp_path / "wheelhouse", key, latency)
    args = ["fa4", "cache-install", "--target", str(site), "--cache-record", str(record_path), "--dest", str(tmp_path / "c")]
    assert main([*args, "--arch", "90"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and f"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR={tmp_path / 'c'}" in out
    assert main([*args, "--arch", "100"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "built for" in err


def test_a_record_pointing_outside_its_folder_is_refused(tmp_path):
    record = tmp_path / "r.kernel-cache.json"
    key = {"flash_attn_4": "4.0.0b36", "cutlass_dsl": "4.8.1", "torch": "2.11.0+cu130", "python": "3.12", "arch": "90"}
    record.write_text(json.dumps({"kind": "fa4-kernel-cache", "key": key, "artifact": "../../elsewhere.tar.gz",
                                  "sha256": "0" * 64, "entries": 1, "variants": [], "env": []}))
    with pytest.raises(ToolkitError, match="artifact: must be a file name"):
        fa4_jit.unpack(record, {}, tmp_path / "dest")
    record.write_text("{")
    with pytest.raises(ToolkitError, match="unreadable cache record"):
        fa4_jit.unpack(record, {}, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_an_interrupted_pack_keeps_the_old_archive_and_leaves_no_temporary(tmp_path, monkeypatch):
    cache = tmp_path / "cache" / "fp" / "fwd"
    cache.mkdir(parents=True)
    (cache / "a.o").write_bytes(b"kernel a")
    key = {"flash_attn_4": "4.0.0b36", "cutlass_dsl": "4.8.1", "torch": "2.11.0+cu130", "python": "3.12", "arch": "90"}
    latency = {"variants": [{"variant": "fwd-bfloat16-d64"}]}
    archive, _ = fa4_jit.pack(tmp_path / "cache", tmp_path / "wheelhouse", key, latency)
    before = (sorted(p.name for p in archive.parent.iterdir()), archive.read_bytes())
    (cache / "b.o").write_bytes(b"kernel b")

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tarfile.TarFile, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fa4_jit.pack(tmp_path / "cache", tmp_path / "wheelhouse", key, latency)
    assert (sorted(p.name for p in archive.parent.iterdir()), archive.read_bytes()) == before
    assert archive.stat().st_mode & 0o777 == 0o644


def test_an_interrupted_merge_leaves_no_partial_entry(tmp_path, monkeypatch):
    source = tmp_path / "src" / "fp" / "fwd"
    source.mkdir(parents=True)
    (source / "a.o").write_bytes(b"x" * 1000)

    def half_copy(src, dst, *args, **kwargs):
        Path(dst).write_bytes(Path(src).read_bytes()[:500])
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copy2", half_copy)
    with pytest.raises(KeyboardInterrupt):
        fa4_jit.merge_cache(tmp_path / "src", tmp_path / "dst")
    assert list((tmp_path / "dst").rglob("*.*")) == []

"""FA4's warmed kernel cache published and substituted as built wheels are (issue 35, item 2's last sentence and
item 5's "FA4 cache"): `toolkit publish --kernel-cache DIR` puts the artifact `toolkit fa4 warm` packed, its
record and a table entry into the index; `toolkit fa4 cache-install --cache URL` on a fresh machine takes it over
HTTP (127.0.0.1) into an empty folder, every byte checked; `toolkit doctor --cache URL` names the folder in use.

What is real: the artifact and record are made by the toolkit's own `fa4_jit.pack`, from a cache folder laid out
as FA4's (flash_attn/cute/cache_utils.py of the pinned 4.0.0b36: <source fingerprint>/<sha256 of the compile
key>.o, a .lock beside each entry, the CuTe DSL's files under cute-dsl/), with the key and the variants of the
committed H200 runs: the record docs/results/2026-12-01-h200-replica-and-fa4/fa4/
fa4-4.0.0b36-cutlass4.8.1-sm90-torch2.11.0-py3.12.build.json (its key: flash_attn_4 4.0.0b36, cutlass_dsl
4.8.1, torch 2.11.0, arch 90) and docs/results/2026-12-01-h200-hold-3/latency.json (its 16 variants). What is
NOT real: the compiled kernels' bytes (stand-ins: nothing here looks inside them, FA4 loads an entry whose file
is there and compiles only on a miss, so "0 JIT compiles" is shown as every entry of the publisher's cache in
the target with its sha256), the key's python (this interpreter's, since cache-install probes it), and the FA4
install (dist-info stand-ins of the three packages the key names, tests/test_fa4_jit_cache_install.py).
No GPU, no FA4 import.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conda_channel import serve_recording
from test_cache import canonical_key, one_error_line, sha256_of, toolkit
from test_fa4_jit_cache_install import key_packages

from toolkit.env.install_record import Fa4Record
from toolkit.fa4 import jit as fa4_jit

ROOT = Path(__file__).resolve().parent.parent
REAL_RECORD = (ROOT / "docs/results/2026-12-01-h200-replica-and-fa4/fa4/"
               "fa4-4.0.0b36-cutlass4.8.1-sm90-torch2.11.0-py3.12.build.json")
REAL_LATENCY = ROOT / "docs/results/2026-12-01-h200-hold-3/latency.json"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
FINGERPRINT = "5f3c9a0e" * 8  # FA4's source fingerprint folder


def real_key(**changes: str) -> dict:
    """The committed H200 record's key, with this interpreter's python (cache-install probes it)."""
    return {**json.loads(REAL_RECORD.read_text())["key"], "python": PYTHON, **changes}


def warm_cache_folder(folder: Path, salt: bytes = b"") -> dict[str, str]:
    """A cache folder as FA4 leaves it after a warm run: one object per variant of the committed latency report,
    its lock beside it, and the CuTe DSL's own files. Returns the entries pack keeps -> their sha256."""
    variants = [row["variant"] for row in json.loads(REAL_LATENCY.read_text())["variants"]]
    for variant in variants:
        name = hashlib.sha256(f"compile key of {variant}".encode()).hexdigest()
        (folder / FINGERPRINT).mkdir(parents=True, exist_ok=True)
        (folder / FINGERPRINT / f"{name}.o").write_bytes(b"\x7fELF stand-in kernel of " + variant.encode() + salt)
        (folder / FINGERPRINT / f"{name}.lock").write_bytes(b"")
    (folder / "cute-dsl").mkdir(exist_ok=True)
    (folder / "cute-dsl" / "dsl-cache.bin").write_bytes(b"stand-in CuTe DSL cache" + salt)
    return {p.relative_to(folder).as_posix(): sha256_of(p) for p in folder.rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


def packed(tmp_path: Path, key: dict, name: str = "warm", salt: bytes = b"") -> tuple[Path, dict[str, str]]:
    """`fa4_jit.pack` of a warmed folder into tmp_path/<name>/artifacts: the record and the entries' sha256."""
    entries = warm_cache_folder(tmp_path / name / "kernel-cache", salt)
    latency = json.loads(REAL_LATENCY.read_text())
    _, record = fa4_jit.pack(tmp_path / name / "kernel-cache", tmp_path / name / "artifacts", key, latency)
    return record, entries


@pytest.fixture
def install(tmp_path: Path) -> Path:
    """The consumer's `fa4 install` folder (stand-ins of the packages its key names, this python)."""
    site = key_packages(tmp_path / "fa4-site")
    for name, version in (("flash_attn_4", "4.0.0b36"), ("nvidia_cutlass_dsl", "4.8.1"), ("torch", "2.11.0")):
        assert (site / f"{name}-{version}.dist-info").is_dir()  # the committed record's pins
    Fa4Record("4.0.0b36", "13", str(site), sys.executable, [], {}, [str(site)]).write(site)
    return site


def publish(cwd: Path, artifacts: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return toolkit(cwd, "publish", "--kernel-cache", str(artifacts), "--to", str(dest), *extra)


def cache_install(cwd: Path, install: Path, dest: Path, *caches: str, config: str | None = None
                  ) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"FA_ENVKIT_CACHES": str(cwd / "caches.toml")}
    if config is not None:
        (cwd / "caches.toml").write_text(config)
    return toolkit(cwd, "fa4", "cache-install", "--target", str(install), "--arch", "90", "--dest", str(dest),
                   *[a for url in caches for a in ("--cache", url)], env=env)


def dest_files(dest: Path) -> dict[str, str]:
    return {p.relative_to(dest).as_posix(): sha256_of(p) for p in dest.rglob("*")
            if p.is_file() and p.name != fa4_jit.INSTALLED}


def tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_of(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """The publisher's side: (index folder, the packed record, the warmed entries' sha256)."""
    record, entries = packed(tmp_path / "publisher", real_key())
    done = publish(tmp_path / "publisher", record.parent, tmp_path / "index")
    assert done.returncode == 0, done.stderr
    return tmp_path / "index", record, entries


# ---------------------------------------------------------------- publish


def test_publish_puts_the_artifact_record_and_a_keyed_entry_into_the_index(published, tmp_path):
    index, record, _ = published
    key = real_key()
    name = fa4_jit.key_id(key)
    artifact = record.with_name(f"{name}.tar.gz")
    entry_file = index / "kernel-caches" / f"{canonical_key(key)}.json"
    entry = json.loads(entry_file.read_text())
    assert entry == {"kind": "fa-envkit-kernel-cache", "schema": 1, "key": canonical_key(key),
                     "artifact": f"kernel-caches/{name}.tar.gz", "artifact_sha256": sha256_of(artifact),
                     "artifact_size": artifact.stat().st_size,
                     "record": f"kernel-caches/{name}.kernel-cache.json", "record_sha256": sha256_of(record)}
    assert (index / entry["artifact"]).read_bytes() == artifact.read_bytes()
    assert (index / entry["record"]).read_bytes() == record.read_bytes()
    assert json.loads(record.read_text())["sha256"] == sha256_of(artifact)


def test_publishing_again_is_a_no_op_and_another_artifact_of_the_key_is_refused(published, tmp_path):
    index, record, _ = published
    before = tree(index)
    again = publish(tmp_path / "publisher", record.parent, index)
    assert again.returncode == 0 and "already published (no change): kernel-caches/" in again.stdout
    assert tree(index) == before
    rewarmed, _ = packed(tmp_path / "second", real_key(), salt=b" rebuilt")  # same key, other bytes
    line = one_error_line(publish(tmp_path / "second", rewarmed.parent, index))
    assert "already published with other bytes" in line and "kernel-caches/" in line
    assert tree(index) == before


# ---------------------------------------------------------------- substitution


def test_a_fresh_machine_takes_the_published_cache_over_http_byte_for_byte(published, install, tmp_path):
    index, _, entries = published
    dest = tmp_path / "consumer" / "kernel-cache"
    with serve_recording(index) as (url, requested):
        done = cache_install(tmp_path / "consumer", install, dest, url)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"substituted: {fa4_jit.key_id(real_key())}.tar.gz from {url}/kernel-caches/")
    assert f"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR={dest}" in done.stdout.splitlines()
    assert dest_files(dest) == entries  # every kernel the publisher compiled, its bytes: FA4 compiles none
    assert f"/kernel-caches/{canonical_key(real_key())}.json" in requested


def test_a_key_the_cache_never_published_is_a_miss_and_nothing_is_unpacked(published, install, tmp_path):
    index, _, _ = published
    dest = tmp_path / "consumer" / "kernel-cache"
    done = toolkit(tmp_path, "fa4", "cache-install", "--target", str(install), "--arch", "100", "--dest", str(dest),
                   "--cache", index.resolve().as_uri(), env={"FA_ENVKIT_CACHES": str(tmp_path / "none.toml")})
    line = one_error_line(done)
    assert "no published FA4 kernel cache for this install's key" in line
    assert canonical_key(real_key(arch="100")) in line and not dest.exists()


def _tamper_artifact(index: Path, entry: dict) -> None:
    with (index / entry["artifact"]).open("ab") as out:
        out.write(b"\0")


def _tamper_record(index: Path, entry: dict) -> None:
    path = index / entry["record"]
    path.write_text(path.read_text().replace('"entries": ', '"entries": 1'))


def _entry_for_another_artifact(index: Path, entry: dict) -> None:
    """An entry pinning a swapped artifact by its (right) sha256: the record, which pins the warmed one, says no."""
    artifact = index / entry["artifact"]
    with tarfile.open(artifact, "w:gz") as tar:
        tar.add(__file__, arcname=f"{FINGERPRINT}/{'e' * 64}.o")
    _write_entry(index, entry, artifact_sha256=sha256_of(artifact), artifact_size=artifact.stat().st_size)


def _entry_of_another_key(index: Path, entry: dict) -> None:
    _write_entry(index, entry, key=canonical_key(real_key(arch="100")))


def _record_of_another_key(index: Path, entry: dict) -> None:
    """The entry (of this key) pins a record, and its sha256, of another key (arch 100 published beside it)."""
    other = json.loads((index / "kernel-caches" / f"{canonical_key(real_key(arch='100'))}.json").read_text())
    _write_entry(index, entry, record=other["record"], record_sha256=other["record_sha256"])


def _write_entry(index: Path, entry: dict, **changes: object) -> None:
    path = index / "kernel-caches" / f"{entry['key']}.json"
    path.write_text(json.dumps({**entry, **changes}))


@pytest.mark.parametrize(("tamper", "says"), [
    (_tamper_artifact, "kernel-cache artifact: sha256 mismatch"),
    (_tamper_record, "kernel-cache record: sha256 mismatch"),
    (_entry_for_another_artifact, "the record pins another artifact"),
    (_entry_of_another_key, "a table entry for another key"),
    (_record_of_another_key, "a kernel cache built for"),
])
def test_a_tampered_cache_is_refused_in_one_line_and_nothing_is_unpacked(published, install, tmp_path, tamper, says):
    index, _, _ = published
    other, _ = packed(tmp_path / "other", real_key(arch="100"))
    assert publish(tmp_path / "other", other.parent, index).returncode == 0
    entry = json.loads((index / "kernel-caches" / f"{canonical_key(real_key())}.json").read_text())
    tamper(index, entry)
    dest = tmp_path / "consumer" / "kernel-cache"
    with serve_recording(index) as (url, _):
        done = cache_install(tmp_path / "consumer", install, dest, url)
    line = one_error_line(done)
    assert line.startswith("refused: ") and says in line, line
    assert not dest.exists()


def test_a_cache_configured_with_a_key_takes_only_entries_it_signed(tmp_path, install):
    from test_cache import _key_pair

    record, entries = packed(tmp_path / "publisher", real_key())
    public = _key_pair(tmp_path / "key.pem")
    signed = tmp_path / "signed"
    done = publish(tmp_path / "publisher", record.parent, signed, "--sign-key", str(tmp_path / "key.pem"))
    assert done.returncode == 0 and public in done.stdout, done.stderr
    unsigned = tmp_path / "unsigned"
    assert publish(tmp_path / "publisher", record.parent, unsigned).returncode == 0
    with serve_recording(signed) as (url, _), serve_recording(unsigned) as (plain, _):
        config = f'[[cache]]\nurl = "{url}"\npublic_key = "{public}"\n'
        good = cache_install(tmp_path / "a", install, tmp_path / "a" / "cache", config=config)
        assert good.returncode == 0 and "sha256, key and signature verified" in good.stdout, good.stderr
        assert dest_files(tmp_path / "a" / "cache") == entries
        config_plain = f'[[cache]]\nurl = "{plain}"\npublic_key = "{public}"\n'
        line = one_error_line(cache_install(tmp_path / "b", install, tmp_path / "b" / "cache", config=config_plain))
        assert line.startswith("refused: ") and "unsigned" in line and not (tmp_path / "b" / "cache").exists()
        entry_file = signed / "kernel-caches" / f"{canonical_key(real_key())}.json"
        entry = json.loads(entry_file.read_text())
        entry_file.write_text(json.dumps({**entry, "artifact_size": entry["artifact_size"] + 1}))
        line = one_error_line(cache_install(tmp_path / "c", install, tmp_path / "c" / "cache", config=config))
        assert line.startswith("refused: ") and "does not verify" in line and not (tmp_path / "c" / "cache").exists()


# ---------------------------------------------------------------- doctor


def kernel_cache_row(cwd: Path, folder: Path, *caches: str) -> dict | None:
    done = subprocess.run([sys.executable, "-m", "toolkit", "doctor", "--python", sys.executable, "--json",
                           *[a for url in caches for a in ("--cache", url)]], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TOOLKIT_CACHE": str(cwd / ".cache"),
                                            "FA_ENVKIT_CACHES": str(cwd / "none.toml"),
                                            fa4_jit.CACHE_DIR_ENV: str(folder)})
    assert "Traceback" not in done.stderr, done.stderr
    found = [r for r in json.loads(done.stdout)["rows"] if r["check"] == "fa4-kernel-cache-published"]
    return found[0] if found else None


def test_doctor_names_the_kernel_cache_in_use_as_the_published_one_or_unknown(published, install, tmp_path):
    index, _, _ = published
    uri = index.resolve().as_uri()
    dest = tmp_path / "consumer" / "kernel-cache"
    assert cache_install(tmp_path / "consumer", install, dest, uri).returncode == 0
    assert kernel_cache_row(tmp_path, dest) is None  # no cache configured: nothing is asked
    name = fa4_jit.key_id(real_key())
    found = kernel_cache_row(tmp_path, dest, uri)
    assert found == {"check": "fa4-kernel-cache-published", "status": "ok", "fix": "",
                     "value": f"{dest}: the published FA4 kernel cache {uri}/kernel-caches/{name}.tar.gz (key "
                              f"{canonical_key(real_key())}, 17 files, each with its sha256)"}
    changed = next(p for p in sorted(dest.rglob("*.o")))
    changed.write_bytes(b"recompiled here")
    found = kernel_cache_row(tmp_path, dest, uri)
    assert found is not None and found["status"] == "warn"
    assert found["value"].startswith(f"{dest}: an unknown FA4 kernel cache ({changed.relative_to(dest).as_posix()} "
                                     f"differs from the published artifact's")

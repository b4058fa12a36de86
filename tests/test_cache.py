"""The binary cache (issue 35 items 1-2): `toolkit publish` writes a static index that the real pip and uv install
from over HTTP, and `toolkit build --cache` takes a published wheel of the same inputs instead of compiling.

Most tests publish a small real wheel (`pip wheel` of a tiny setuptools project) with a real BuildRecord placed
by the wheelhouse; the end-to-end test at the bottom publishes the fixture build compiled by the real nvcc and
substitutes it into a second checkout. Expected values come from hashlib, zipfile and the files themselves.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

import pytest
from conda_channel import serve_recording
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from rich.console import Console

from toolkit.build.builder import substitute
from toolkit.build.record import BuildInputs, BuildOutputs, BuildRecord, Parallelism
from toolkit.build.wheelhouse import place
from toolkit.cache.config import CacheSite, configured_caches
from toolkit.env.lockfile import LockedSdist
from toolkit.spec.patches import AppliedPatch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "fa-cache-demo"
VERSION = "1.0+cu130torch2.13"
REQUIRES_PYTHON = ">=3.9,<4"
UV = Path(sys.executable).parent / "uv"


def sha256_of(data: bytes | Path) -> str:
    return hashlib.sha256(data.read_bytes() if isinstance(data, Path) else data).hexdigest()


def canonical_key(inputs: dict) -> str:
    """The inputs key as the issue defines it: sha256 of the canonical JSON (independent of toolkit's digest)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def toolkit(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cwd / ".cache"), **(env or {})})


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real wheel from `pip wheel` of a tiny setuptools project (local version tag, Requires-Python)."""
    src = tmp_path_factory.mktemp("tiny")
    (src / "fa_cache_demo").mkdir()
    (src / "fa_cache_demo" / "__init__.py").write_text(f"VERSION = {VERSION!r}\n")
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{PROJECT}"\nversion = "{VERSION}"\nrequires-python = "{REQUIRES_PYTHON}"\n\n'
        f'[tool.setuptools]\npackages = ["fa_cache_demo"]\n')
    out = tmp_path_factory.mktemp("tiny-dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--wheel-dir",
                    str(out), str(src)], check=True, capture_output=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def toolchain(**given: object) -> dict:
    """A build's toolchain inputs, every key the builder writes (build.record.Toolchain), unknown ones null."""
    names = ("kind", "cuda_home", "nvcc", "cxx", "gcc", "python", "python_version", "torch", "torch_cuda", "cxx11_abi",
             "ninja")
    return {name: given.get(name) for name in names}


def demo_inputs(line: str = "demo", archs: tuple[str, ...] = ("80", "90")) -> dict:
    return {"recipe": 2, "line": line, "spec_input_hash": "0" * 64, "lock_sha256": "1" * 64, "archs": list(archs),
            "toolchain": toolchain(kind="external", nvcc="13.0.88", gcc="13.3.0", torch="2.13.0"),
            "local_version": "+cu130torch2.13"}


def demo_record(wheel: Path, inputs: dict) -> BuildRecord:
    return BuildRecord(
        inputs_key=canonical_key(inputs), inputs=BuildInputs.from_json(inputs), files={"spec": "envs/demo.yaml"},
        sdist=LockedSdist("https://example.invalid/flash_attn-2.8.3.tar.gz", "flash_attn-2.8.3.tar.gz", "2" * 64),
        environment={"MAX_JOBS": "2"}, parallelism=Parallelism(2, 2, 32, 200.0, 4.5, "2 jobs x 2 nvcc threads"),
        outputs=BuildOutputs(wheel=wheel.name, version=VERSION, wheel_sha256=sha256_of(wheel),
                             wheel_size=wheel.stat().st_size, modules=[], archs_compiled={}, imported=True,
                             wall_s=612.0, efficiency={}),
        fingerprint={"machine": "x86_64", "cpus": 32, "mem_available_gb": 200.0, "gpus": [], "driver_version": None},
        log="wheelhouse/demo/logs/build.log", started="2026-11-29T10:00:00+00:00",
        finished="2026-11-29T10:10:12+00:00",
        patches=[AppliedPatch(file="fix.patch", sha256="3" * 64, fixes="x", upstream="y", applied=True)])


@dataclass
class Site:
    """A publisher's checkout: a wheelhouse with one recorded wheel and the line's verify report."""

    root: Path
    wheel: Path  # in the wheelhouse
    record: BuildRecord
    record_path: Path

    @property
    def key(self) -> str:
        return self.record.inputs_key


@pytest.fixture
def site(tmp_path: Path, tiny_wheel: Path) -> Site:
    root = tmp_path / "publisher"
    record = demo_record(tiny_wheel, demo_inputs())
    wheel = place(tiny_wheel, root / "wheelhouse" / "demo", record)
    (root / "reports" / "demo").mkdir(parents=True)
    (root / "reports" / "demo" / "verify.json").write_text('{"kind": "verify", "summary": {"failed": 0}}\n')
    return Site(root, wheel, record, wheel.with_name(wheel.name + ".build.json"))


def published(site: Site, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    done = toolkit(site.root, "publish", "demo", "--to", str(dest), *extra)
    assert done.returncode == 0, done.stderr
    return done


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_of(p) for p in sorted(folder.rglob("*")) if p.is_file()}


serve = serve_recording  # test_export and test_runtime_lock import it by this name


# ---------------------------------------------------------------- publish


def test_publish_writes_a_pep503_index_with_metadata_record_provenance_reports_and_table(site, tmp_path):
    dest = tmp_path / "index"
    done = published(site, dest)
    base = dest / "files" / "demo" / site.wheel.name
    assert f"published: files/demo/{site.wheel.name}" in done.stdout
    assert base.read_bytes() == site.wheel.read_bytes()
    with zipfile.ZipFile(site.wheel) as archive:
        metadata = archive.read(f"fa_cache_demo-{VERSION}.dist-info/METADATA")
    assert Path(f"{base}.metadata").read_bytes() == metadata
    assert Path(f"{base}.build.json").read_bytes() == site.record_path.read_bytes()
    assert Path(f"{base}.reports/verify.json").read_bytes() == (site.root / "reports/demo/verify.json").read_bytes()

    page = (dest / "simple" / PROJECT / "index.html").read_text()
    href = f"../../files/demo/{site.wheel.name.replace('+', '%2B')}#sha256={sha256_of(site.wheel)}"
    assert f'href="{href}"' in page
    declared = BytesHeaderParser().parsebytes(metadata)["Requires-Python"]  # setuptools writes "<4,>=3.9"
    assert f'data-requires-python="{html.escape(declared)}"' in page and "&lt;4" in page
    assert f'data-core-metadata="sha256={sha256_of(metadata)}"' in page
    assert f'data-dist-info-metadata="sha256={sha256_of(metadata)}"' in page
    assert f'<a href="{PROJECT}/">' in (dest / "simple" / "index.html").read_text()

    entry = json.loads((dest / "inputs" / f"{site.key}.json").read_text())
    assert entry["inputs_key"] == canonical_key(site.record.inputs.to_json())
    assert (entry["wheel"], entry["wheel_sha256"]) == (f"files/demo/{site.wheel.name}", sha256_of(site.wheel))
    assert entry["record_sha256"] == sha256_of(site.record_path) and "signature" not in entry

    statement = json.loads(Path(f"{base}.provenance.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": site.wheel.name, "digest": {"sha256": sha256_of(site.wheel)}}]
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["inputs"] == site.record.inputs.to_json()
    assert canonical_key(definition["externalParameters"]["inputs"]) == definition["externalParameters"]["inputsKey"]
    assert {"name": "flash_attn-2.8.3.tar.gz", "uri": "https://example.invalid/flash_attn-2.8.3.tar.gz",
            "digest": {"sha256": "2" * 64}} in definition["resolvedDependencies"]
    assert {"name": "fix.patch", "digest": {"sha256": "3" * 64}} in definition["resolvedDependencies"]
    assert definition["internalParameters"]["machine"]["cpus"] == 32
    details = statement["predicate"]["runDetails"]
    assert details["builder"]["id"] and details["metadata"]["startedOn"] == "2026-11-29T10:00:00Z"


def test_publishing_again_is_a_no_op_and_other_bytes_under_a_published_name_are_refused(site, tmp_path):
    dest = tmp_path / "index"
    published(site, dest)
    before = tree(dest)
    again = published(site, dest)
    assert "already published (no change)" in again.stdout and tree(dest) == before

    # the same wheel name rebuilt with other bytes (and its own, consistent record)
    other = tmp_path / "other" / site.wheel.name
    other.parent.mkdir()
    with zipfile.ZipFile(site.wheel) as src, zipfile.ZipFile(other, "w") as out:
        for info in src.infolist():
            out.writestr(info, src.read(info) + (b"# rebuilt\n" if info.filename.endswith(".py") else b""))
    place(other, site.wheel.parent, demo_record(other, demo_inputs()))
    line = one_error_line(toolkit(site.root, "publish", "demo", "--to", str(dest)))
    assert f"files/demo/{site.wheel.name}: already published with other bytes" in line
    assert tree(dest) == before  # nothing written, not even the files that were new


def test_uv_and_pip_install_from_the_served_index_with_hashes(site, tmp_path):
    dest = tmp_path / "index"
    published(site, dest)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"{PROJECT}=={VERSION} --hash=sha256:{sha256_of(site.wheel)}\n")
    isolated = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
                "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with serve(dest) as (url, requested):
        subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(tmp_path / "uv-env")], check=True, env=isolated)
        uv_python = tmp_path / "uv-env" / "bin" / "python"
        done = subprocess.run([str(UV), "pip", "install", "--python", str(uv_python), "--index-url", f"{url}/simple",
                               "--require-hashes", "-r", str(requirements)], capture_output=True, text=True,
                              env=isolated)
        assert done.returncode == 0, done.stderr
        subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "pip-env")], check=True)
        pip_python = tmp_path / "pip-env" / "bin" / "python"
        done = subprocess.run([str(pip_python), "-m", "pip", "install", "--index-url", f"{url}/simple",
                               "--require-hashes", "-r", str(requirements)], capture_output=True, text=True,
                              env=isolated)
        assert done.returncode == 0, done.stderr
        assert any(path.endswith(".whl.metadata") for path in requested)  # PEP 658: the resolver read it alone
    for python in (uv_python, pip_python):
        shown = subprocess.run([str(python), "-c", "import fa_cache_demo; print(fa_cache_demo.VERSION)"],
                               capture_output=True, text=True, check=True)
        assert shown.stdout.strip() == VERSION


def test_pip_refuses_a_tampered_wheel_by_its_index_hash(site, tmp_path):
    dest = tmp_path / "index"
    published(site, dest)
    served = dest / "files" / "demo" / site.wheel.name
    served.write_bytes(served.read_bytes() + b"\0")
    with serve(dest) as (url, _):
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(tmp_path / "t"),
                               "--index-url", f"{url}/simple", f"{PROJECT}=={VERSION}"], capture_output=True,
                              text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull,
                                              "PIP_CACHE_DIR": str(tmp_path / "pip-cache")})
    assert done.returncode != 0 and "hash" in done.stderr.lower() and not (tmp_path / "t").exists()


# ---------------------------------------------------------------- substitution


@dataclass
class Consumer:
    """A second checkout: its own wheelhouse and download cache, and what its console printed."""

    line_dir: Path
    cache: Path
    out: io.StringIO

    def substitute(self, site: CacheSite, key: str):
        return substitute(site, key, self.line_dir, self.cache, Console(file=self.out, width=100_000))

    @property
    def said(self) -> str:
        return self.out.getvalue().strip()

    def placed(self) -> list[str]:
        return sorted(p.name for p in self.line_dir.glob("*")) if self.line_dir.exists() else []


@pytest.fixture
def consumer(tmp_path: Path) -> Consumer:
    return Consumer(tmp_path / "consumer" / "wheelhouse" / "demo", tmp_path / "consumer" / ".cache", io.StringIO())


@pytest.mark.parametrize("served", ["http", "file"])
def test_the_same_inputs_substitute_the_published_wheel_byte_for_byte(site, consumer, tmp_path, served):
    dest = tmp_path / "index"
    published(site, dest)
    with serve(dest) as (url, _):
        root = url if served == "http" else dest.resolve().as_uri()
        hit = consumer.substitute(CacheSite(root), canonical_key(demo_inputs()))
    assert hit is not None and hit.wheel.read_bytes() == site.wheel.read_bytes()
    placed = json.loads(hit.record_path.read_text())
    publisher = json.loads(site.record_path.read_text())
    assert placed.pop("substituted_from") == f"{root}/inputs/{site.key}.json"
    assert placed == {k: v for k, v in publisher.items() if k != "substituted_from"}
    assert BuildRecord.read(hit.record_path).substituted_from.endswith(f"{site.key}.json")


def test_a_changed_input_misses(site, consumer, tmp_path):
    published(site, tmp_path / "index")
    other = canonical_key(demo_inputs(archs=("80",)))
    assert consumer.substitute(CacheSite((tmp_path / "index").as_uri()), other) is None
    assert f"no published build of these inputs ({other})" in consumer.said and consumer.placed() == []


def _tamper_wheel(dest: Path, site: Site) -> None:
    path = dest / "files" / "demo" / site.wheel.name
    path.write_bytes(path.read_bytes() + b"\0")


def _tamper_record(dest: Path, site: Site) -> None:
    path = dest / "files" / "demo" / f"{site.wheel.name}.build.json"
    path.write_text(path.read_text().replace('"wall_s": 612.0', '"wall_s": 1.0'))


def _entry_for_other_inputs(dest: Path, site: Site) -> None:
    """Another build's entry served under this key (its own inputs_key inside)."""
    path = dest / "inputs" / f"{site.key}.json"
    entry = json.loads(path.read_text())
    entry["inputs_key"] = canonical_key(demo_inputs(archs=("80",)))
    path.write_text(json.dumps(entry))


def _record_of_other_inputs(dest: Path, site: Site) -> None:
    """A consistent but lying unsigned cache: the record's inputs changed and the entry re-pinned to it."""
    record = dest / "files" / "demo" / f"{site.wheel.name}.build.json"
    record.write_text(record.read_text().replace('"line": "demo"', '"line": "other"'))
    path = dest / "inputs" / f"{site.key}.json"
    path.write_text(path.read_text().replace(sha256_of(site.record_path), sha256_of(record)))


@pytest.mark.parametrize("tamper, says", [
    (_tamper_wheel, "sha256 mismatch: downloaded file has sha256"),
    (_tamper_record, "sha256 mismatch: downloaded file has sha256"),
    (_entry_for_other_inputs, "a table entry for other inputs"),
    (_record_of_other_inputs, "its build record is of other inputs"),
])
def test_a_tampered_cache_entry_is_refused_in_one_line_and_nothing_is_placed(site, consumer, tmp_path, tamper, says):
    dest = tmp_path / "index"
    published(site, dest)
    tamper(dest, site)
    with serve(dest) as (url, _):
        assert consumer.substitute(CacheSite(url), site.key) is None
    (line,) = consumer.said.splitlines()
    assert line.startswith("refused: ") and says in line
    assert consumer.placed() == []


def _key_pair(path: Path) -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def test_a_cache_configured_with_a_key_takes_only_entries_it_signed(site, consumer, tmp_path, monkeypatch):
    signed, unsigned, stranger = tmp_path / "signed", tmp_path / "unsigned", tmp_path / "stranger"
    public = _key_pair(tmp_path / "key.pem")
    done = published(site, signed, "--sign-key", str(tmp_path / "key.pem"))
    assert f"signed with public key {public}" in done.stdout
    published(site, unsigned)
    _key_pair(tmp_path / "other.pem")
    published(site, stranger, "--sign-key", str(tmp_path / "other.pem"))
    config = tmp_path / "caches.toml"
    monkeypatch.setenv("FA_ENVKIT_CACHES", str(config))

    def configured(folder: Path) -> CacheSite:
        config.write_text(f'[[cache]]\nurl = "{folder.as_uri()}"\npublic_key = "{public}"\n')
        (site_,) = configured_caches([folder.as_uri()])  # --cache of the same URL keeps the file's key
        return site_

    for folder, says in ((unsigned, "unsigned, but this cache is configured with public key"),
                         (stranger, "not by this cache's configured key")):
        consumer.out.seek(0), consumer.out.truncate()
        assert consumer.substitute(configured(folder), site.key) is None
        (line,) = consumer.said.splitlines()
        assert says in line and consumer.placed() == []

    entry = signed / "inputs" / f"{site.key}.json"
    original = entry.read_text()
    entry.write_text(original.replace(f'"wheel_size": {site.wheel.stat().st_size}', '"wheel_size": 1'))
    consumer.out.seek(0), consumer.out.truncate()
    assert consumer.substitute(configured(signed), site.key) is None
    assert "its signature does not verify" in consumer.said and consumer.placed() == []

    entry.write_text(original)
    hit = consumer.substitute(configured(signed), site.key)
    assert hit is not None and hit.wheel.read_bytes() == site.wheel.read_bytes()


def test_a_cache_is_only_consulted_where_configured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FA_ENVKIT_CACHES", raising=False)
    assert configured_caches() == []
    (tmp_path / ".fa-envkit").mkdir()
    (tmp_path / ".fa-envkit" / "caches.toml").write_text('[[cache]]\nurl = "https://wheels.example.org/fa/"\n')
    assert [c.url for c in configured_caches(["file:///srv/cache"])] == ["https://wheels.example.org/fa",
                                                                           "file:///srv/cache"]
    (tmp_path / ".fa-envkit" / "caches.toml").write_text('[[cache]]\nurl = "ftp://x"\n')
    with pytest.raises(Exception, match=r"caches.toml: cache 1: 'ftp://x' is not a cache URL"):
        configured_caches()


# ---------------------------------------------------------------- the real fixture build (nvcc), substituted


@pytest.mark.nvcc
def test_a_second_checkout_builds_the_published_fixture_with_no_compile_and_a_changed_input_compiles(tmp_path):
    """issue 35's 'done when': the fixture compiled by the real nvcc in one checkout and published; a second
    checkout (its own wheelhouse and cache) with --cache gets the publisher's bytes in seconds, and with one input
    changed (the archs) compiles."""
    import time

    from conda_channel import build_simple_index, serve_directory
    from cuda_toolchain import require_nvcc
    from fixtures.fa_fixture_project import (
        make_stub_torch_env,
        pack_fixture_sdist,
        write_external_spec,
    )

    require_nvcc()
    first = tmp_path / "first"
    python = make_stub_torch_env(tmp_path / "venv", "2.13.0", "13.0")
    write_external_spec(first / "envs", "fixture", python, "2.13.0")
    build_simple_index(tmp_path / "sdist-index", [pack_fixture_sdist(tmp_path / "sdist")])
    with serve_directory(tmp_path / "sdist-index") as sdists, serve(tmp_path / "index") as (url, _):
        assert toolkit(first, "lock", "fixture", "--pypi", f"{sdists}/simple").returncode == 0
        built = toolkit(first, "build", "fixture", "--no-install")
        assert built.returncode == 0, built.stderr
        (wheel,) = (first / "wheelhouse" / "fixture").glob("*.whl")
        assert toolkit(first, "publish", "fixture", "--to", str(tmp_path / "index")).returncode == 0

        second = tmp_path / "second"
        shutil.copytree(first / "envs", second / "envs")
        shutil.copytree(first / "locks", second / "locks")
        t0 = time.monotonic()
        taken = toolkit(second, "build", "fixture", "--no-install", "--cache", url)
        seconds = time.monotonic() - t0
        assert taken.returncode == 0, taken.stderr
        placed = second / "wheelhouse" / "fixture" / wheel.name
        assert f"substituted: wheelhouse/fixture/{wheel.name} from {url}/inputs/" in taken.stdout
        assert placed.read_bytes() == wheel.read_bytes()
        assert not list((second / "wheelhouse" / "fixture").glob("logs/build-*.log"))  # no compile ran
        record = json.loads(Path(f"{placed}.build.json").read_text())
        assert record["substituted_from"].startswith(url) and record["outputs"]["wheel_sha256"] == sha256_of(wheel)
        compiled_s = json.loads(Path(f"{wheel}.build.json").read_text())["outputs"]["wall_s"]
        print(f"substitution {seconds:.1f} s (the whole toolkit run) vs the fixture's compile {compiled_s} s")

        changed = toolkit(second, "build", "fixture", "--no-install", "--arch", "90", "--cache", url)
    assert changed.returncode == 0, changed.stderr
    assert "no published build of these inputs" in changed.stderr and "built: " in changed.stdout
    assert list((second / "wheelhouse" / "fixture").glob("logs/build-*.log"))


def test_an_entry_naming_a_file_outside_the_index_or_a_fifo_config_is_one_line(site, consumer, tmp_path, monkeypatch):
    dest = tmp_path / "index"
    published(site, dest)
    entry = dest / "inputs" / f"{site.key}.json"
    entry.write_text(entry.read_text().replace(f'"files/demo/{site.wheel.name}"', '"https://elsewhere.invalid/x.whl"'))
    assert consumer.substitute(CacheSite(dest.as_uri()), site.key) is None
    (line,) = consumer.said.splitlines()
    assert "table entry field wheel: 'https://elsewhere.invalid/x.whl' is not a path under files/" in line
    assert consumer.placed() == []

    fifo = tmp_path / "caches.toml"
    os.mkfifo(fifo)
    monkeypatch.setenv("FA_ENVKIT_CACHES", str(fifo))
    with pytest.raises(Exception, match="caches.toml: unreadable cache configuration \\(a FIFO, not a regular file"):
        configured_caches()


# ---------------------------------------------------------------- the key holds no file path


def test_two_checkouts_of_a_line_at_other_paths_have_one_inputs_key(tmp_path):
    """A locked line installed under two checkouts (.envs/<line> at two absolute paths), and an external line whose
    spec names its toolchain at other paths, key the same build (recipe 3: record.PATH_FREE_RECIPE); another nvcc
    version is another build. Expected: equal / unequal digests of json.dumps, computed here with hashlib."""
    from toolkit.build.builder import RECIPE_VERSION, keyed_inputs
    from toolkit.machine.fingerprint import Fingerprint, TorchInfo
    from toolkit.machine.line_env import LineEnvironment
    from toolkit.spec.envspec import load_spec

    def key(root: Path, nvcc: str = "13.0.88", spec_file: Path = ROOT / "envs" / "cu126.yaml") -> str:
        prefix = root / ".envs" / "cu126"
        env = LineEnvironment("locked", prefix, prefix, prefix / "bin" / "python", prefix / "bin" / "x86_64-conda-linux-gnu-c++",
                              prefix / "bin" / "x86_64-conda-linux-gnu-cc", str(prefix / "bin"), "the line's prefix")
        fp = Fingerprint("host", 2, 20.0, 50.0, str(prefix), str(prefix / "bin" / "nvcc"), nvcc, None, None,
                         str(env.cxx), "13.3.0", str(prefix / "bin" / "ninja"), "1.13.0", str(env.python), "3.11.10",
                         TorchInfo("2.7.1+cu126", "12.6", True, str(prefix / "lib")), None)
        inputs = keyed_inputs(load_spec(spec_file), env, fp, ("80", "90"))
        assert inputs["recipe"] == RECIPE_VERSION >= 3 and str(root) not in json.dumps(inputs)
        return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    assert key(tmp_path / "one") == key(tmp_path / "elsewhere" / "two")
    assert key(tmp_path / "one") != key(tmp_path / "one", nvcc="12.6.85")
    external = {}
    for name, cuda in (("a", "/usr/local/cuda"), ("b", "/opt/site/cuda-13.0")):
        spec = (ROOT / "envs" / "gpu-machine.yaml").read_text().replace("/usr/local/cuda", cuda)
        (tmp_path / name / "envs").mkdir(parents=True)
        for extended in ("gpu-machine.yaml", "cu130.yaml", "base.yaml"):
            shutil.copy(ROOT / "envs" / extended, tmp_path / name / "envs" / extended)
        (tmp_path / name / "envs" / "gpu-machine.yaml").write_text(spec)
        external[name] = load_spec(tmp_path / name / "envs" / "gpu-machine.yaml")
    assert external["a"].input_hash() != external["b"].input_hash()  # the lock's hash: other paths, another spec
    assert external["a"].build_input_hash() == external["b"].build_input_hash()


def test_an_external_line_locked_at_two_sites_keys_its_fa2_sdist_not_its_lock(tmp_path):
    """The machine image's line locked in two checkouts whose specs put CUDA at other paths: the two locks differ
    (their input-hash holds the paths), the FA2 part of the key does not. Expected: the sdist sha256 the lock
    files record (read here with yaml), and the locks' own sha256 (hashlib) unequal."""
    import yaml

    from toolkit.build.fa2 import Fa2Source
    from toolkit.spec.envspec import load_spec

    keys, lock_digests = {}, set()
    for name, cuda in (("a", "/usr/local/cuda"), ("b", "/opt/site/cuda-13.0")):
        shutil.copytree(ROOT / "envs", tmp_path / name / "envs")
        spec_file = tmp_path / name / "envs" / "gpu-machine.yaml"
        spec_file.write_text(spec_file.read_text().replace("/usr/local/cuda", cuda))
        done = toolkit(tmp_path / name, "lock", "gpu-machine")
        assert done.returncode == 0, done.stderr
        lock_file = tmp_path / name / "locks" / "gpu-machine.conda-lock.yml"
        lock_digests.add(hashlib.sha256(lock_file.read_bytes()).hexdigest())
        recorded = yaml.safe_load(lock_file.read_text())["metadata"]["custom_metadata"]
        keys[name] = Fa2Source(load_spec(spec_file), lock_file).key_inputs()
        assert keys[name] == {"sdist_sha256": recorded["fa-envkit.flash-attn-sdist.sha256"]}
    assert len(lock_digests) == 2 and keys["a"] == keys["b"]

"""The install stage: a real py-rattler install of a lock made from the fixture channel, then the pip
layer with pip --require-hashes --no-deps; tampering and interruptions leave nothing behind."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conda_channel import (  # noqa: F401
    build_simple_index,
    channel_dir,
    file_url,
    isolated_caches,
    pip_index,
    pip_index_files,
    serve_directory,
    tamper,
    write_project,
)
from conda_lock.lockfile import parse_conda_lock_file
from rich.console import Console

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env import engine
from toolkit.env.engine import InstallJob, RattlerEngine
from toolkit.env.install import install_line
from toolkit.env.install_record import PrefixRecord
from toolkit.env.lock import lock_line
from toolkit.env.lockfile import LockedPackage
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lock_over_http(tmp_path_factory, channel_dir, pip_index):
    """A full lock whose channel is served over loopback http for the whole module."""
    root = tmp_path_factory.mktemp("project")
    with serve_directory(channel_dir) as channel_url:
        envs = write_project(root, channel_url, pip_index)
        path, _ = lock_line(checked_spec(envs / "cu126.yaml"), backend="rattler", workspace=Workspace(locks=root / "locks"),
                            pypi=pip_index)
        yield path


def leftovers(directory: Path, prefix_name: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{prefix_name}."))


def test_install_creates_the_locked_prefix(lock_over_http, tmp_path, isolated_caches):
    prefix = install_line("cu126", tmp_path / "envs" / "cu126", Workspace(locks=lock_over_http.parent), backend="rattler",
                          platform="linux-64")
    locked = [p for p in parse_conda_lock_file(lock_over_http).package if p.platform == "linux-64"]
    conda = {p.name: p for p in locked if p.manager == "conda"}
    records = {json.loads(f.read_text())["name"]: json.loads(f.read_text()) for f in (prefix / "conda-meta").glob("*.json")}
    assert set(records) == set(conda)
    for name, record in records.items():  # conda-meta names the lock's URL and hash, not the verified copy
        assert record["url"] == conda[name].url and record["sha256"] == conda[name].hash.sha256
    assert (prefix / "bin" / "nvcc").exists() and (prefix / "include" / "cuda_runtime.h").exists()
    assert (prefix / "etc" / "nvcc.profile").read_text() == f"TOP = {prefix}\n"  # placeholder -> final prefix
    assert (prefix / "lib" / "python3.11" / "site-packages" / "pip" / "__init__.py").exists()  # noarch: python
    assert (prefix / "lib" / "python3.11" / "site-packages" / "torch-2.9.1.dist-info").is_dir()  # pip layer
    record = PrefixRecord.read(prefix)  # written by the real install, read back through the one reader
    assert record is not None and (record.line, record.platform) == ("cu126", "linux-64")
    assert leftovers(prefix.parent, prefix.name) == []


def test_tampered_archive_is_refused_and_nothing_is_left(lock_over_http, channel_dir, tmp_path, isolated_caches):
    archive = channel_dir / "linux-64" / "ninja-1.12.1-h0_0.conda"
    original = archive.read_bytes()
    tamper(archive)
    try:
        with pytest.raises(ToolkitError) as caught:
            install_line("cu126", tmp_path / "cu126", Workspace(locks=lock_over_http.parent), backend="rattler",
                         platform="linux-64")
    finally:
        archive.write_bytes(original)
    message = str(caught.value)
    assert "\n" not in message and "ninja 1.12.1: sha256 mismatch" in message
    assert not (tmp_path / "cu126").exists() and leftovers(tmp_path, "cu126") == []


def test_pip_hash_mismatch_is_refused_and_nothing_is_left(channel_dir, tmp_path, isolated_caches):
    index_root = tmp_path / "pypi"
    simple = build_simple_index(index_root, pip_index_files(index_root / "dist"))
    with serve_directory(index_root) as url:
        envs = write_project(tmp_path, file_url(channel_dir), f"{url}/simple")
        lock, _ = lock_line(checked_spec(envs / "cu126.yaml"), backend="rattler", workspace=Workspace(locks=tmp_path / "locks"),
                            pypi=f"{url}/simple")
        tamper(simple / "torch" / "torch-2.9.1-py3-none-any.whl")
        with pytest.raises(ToolkitError) as caught:
            install_line("cu126", tmp_path / "env", Workspace(locks=lock.parent), backend="rattler", platform="linux-64")
    message = str(caught.value)
    assert "\n" not in message and "torch 2.9.1: sha256 mismatch" in message
    assert not (tmp_path / "env").exists() and leftovers(tmp_path, "env") == []


def test_an_interrupted_install_leaves_no_prefix(lock_over_http, tmp_path, isolated_caches, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "install_pip_layer", interrupted)  # stop after the conda layer is in place
    with pytest.raises(KeyboardInterrupt):
        install_line("cu126", tmp_path / "cu126", Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64")
    assert not (tmp_path / "cu126").exists() and leftovers(tmp_path, "cu126") == []


def test_reinstall_replaces_the_old_prefix_and_reuses_verified_archives(lock_over_http, tmp_path, isolated_caches):
    prefix = tmp_path / "cu126"
    install_line("cu126", prefix, Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64")
    (prefix / "etc" / "nvcc.profile").write_text("from an older install")  # a file the old env's installer wrote
    cached = sorted(isolated_caches.rglob("*.conda"))
    install_line("cu126", prefix, Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64")
    assert (prefix / "etc" / "nvcc.profile").read_text() == f"TOP = {prefix}\n" and (prefix / "bin" / "nvcc").exists()
    assert sorted(isolated_caches.rglob("*.conda")) == cached and cached
    assert leftovers(tmp_path, "cu126") == []


def test_a_warm_install_hardlinks_from_the_toolkits_rattler_cache(lock_over_http, tmp_path, isolated_caches):
    """py-rattler's package cache is the toolkit's (beside the verified archives), kept between installs: each
    archive is unpacked into it once, and every environment links the files it does not patch for its prefix
    from there (the same inode), rather than from a throwaway cache removed with the install's work folder."""
    first = install_line("cu126", tmp_path / "a", Workspace(locks=lock_over_http.parent), backend="rattler",
                         platform="linux-64")
    [cached] = (isolated_caches / "fa-envkit" / "rattler-pkgs").glob("*/lib/libcudart.so.fixture")
    unpacked = cached.stat()
    second = install_line("cu126", tmp_path / "b", Workspace(locks=lock_over_http.parent), backend="rattler",
                          platform="linux-64")
    for prefix in (first, second):
        installed = (prefix / "lib" / "libcudart.so.fixture").stat()
        assert (installed.st_ino, installed.st_dev) == (unpacked.st_ino, unpacked.st_dev)
    assert cached.stat().st_nlink == 3 and cached.stat().st_mtime_ns == unpacked.st_mtime_ns  # not unpacked again
    assert (second / "etc" / "nvcc.profile").read_text() == f"TOP = {second}\n"  # patched: a copy of its own


def test_clearing_the_caches_leaves_an_installed_environment_whole(lock_over_http, tmp_path, isolated_caches, capsys):
    """`toolkit caches clear` after an install: the environment's files (hard links into py-rattler's cache, uv's
    wheels) keep their bytes, and the next install downloads and links again."""
    prefix = install_line("cu126", tmp_path / "env", Workspace(locks=lock_over_http.parent), backend="rattler",
                          platform="linux-64")
    files = sorted(p for p in prefix.rglob("*") if p.is_file() and not p.is_symlink())
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    assert (prefix / "lib" / "libcudart.so.fixture").stat().st_nlink == 2  # linked from the cache
    assert main(["caches", "clear"]) == 0
    capsys.readouterr()
    assert not (isolated_caches / "fa-envkit" / "rattler-pkgs").exists()
    assert not (isolated_caches / "fa-envkit" / "conda-pkgs").exists()
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files} == before
    again = install_line("cu126", tmp_path / "again", Workspace(locks=lock_over_http.parent), backend="rattler",
                         platform="linux-64")
    assert (again / "lib" / "libcudart.so.fixture").read_bytes() == (prefix / "lib" / "libcudart.so.fixture").read_bytes()


def test_if_stale_leaves_an_environment_of_the_same_lock_as_it_is(lock_over_http, tmp_path, isolated_caches):
    """A local matrix run installs with --if-stale: the environment a current record names is not rebuilt (the
    same folder, inode and files), while one whose record names another lock digest is."""
    prefix = tmp_path / "cu126"
    assert install_line("cu126", prefix, Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64") == prefix
    before = prefix.stat().st_ino
    (prefix / "etc" / "nvcc.profile").write_text("as the first install left it")
    assert install_line("cu126", prefix, Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64",
                        if_stale=True) is None
    assert prefix.stat().st_ino == before and (prefix / "etc" / "nvcc.profile").read_text() == "as the first install left it"
    record = prefix / "etc" / "fa-envkit" / "lock.json"
    record.write_text(record.read_text().replace('"lock_sha256": "', '"lock_sha256": "0'))  # another lock's
    assert install_line("cu126", prefix, Workspace(locks=lock_over_http.parent), backend="rattler", platform="linux-64",
                        if_stale=True) == prefix
    assert prefix.stat().st_ino != before and (prefix / "etc" / "nvcc.profile").read_text() == f"TOP = {prefix}\n"


def test_cli_install_errors_are_one_line(tmp_path, capsys):
    assert main(["install", "gpu-machine", "--locks", str(ROOT / "locks"), "--prefix", str(tmp_path / "p")]) == 1
    assert "external toolchain" in capsys.readouterr().err
    assert main(["install", "cu126", "--locks", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}/cu126.conda-lock.yml: missing" in err


@pytest.mark.skipif(sys.platform != "linux", reason="installs linux packages")
def test_aarch64_lock_installs_on_this_host_as_files(lock_over_http, tmp_path, isolated_caches):
    """The other platform's conda layer unpacks too (its pip layer needs an aarch64 python, so stop before it)."""
    prefix = tmp_path / "arm"
    locked = [p for p in parse_conda_lock_file(lock_over_http).package if p.platform == "linux-aarch64"]
    conda = [LockedPackage(p.manager, p.name, p.version, p.url, p.hash.sha256) for p in locked
             if p.manager == "conda"]
    staging = tmp_path / ".arm.installing"
    staging.mkdir()
    job = InstallJob(lock_over_http, "linux-aarch64", conda=tuple(conda), pip=(), staging=staging, prefix=prefix)
    RattlerEngine(Console(stderr=True)).install(job)
    assert (staging / "bin" / "aarch64-conda-linux-gnu-g++").exists()


def test_a_warm_install_reads_no_archive_for_its_identity(lock_over_http, tmp_path, isolated_caches, monkeypatch):
    """Each archive's info/index.json is kept beside it once verified (with its stamp): a warm install checks each
    package's identity from there, without unpacking any archive again; an archive changed since (a new ctime) is
    read again."""
    from toolkit.env import archives

    read: list[str] = []
    real = archives._index_json
    monkeypatch.setattr(archives, "_index_json", lambda archive: read.append(Path(archive).name) or real(archive))
    workspace = Workspace(locks=lock_over_http.parent)
    install_line("cu126", tmp_path / "a", workspace, backend="rattler", platform="linux-64")
    files = sorted(p.url.rsplit("/", 1)[-1] for p in parse_conda_lock_file(lock_over_http).package
                   if p.platform == "linux-64" and p.manager == "conda")
    assert sorted(read) == files
    read.clear()
    install_line("cu126", tmp_path / "b", workspace, backend="rattler", platform="linux-64")
    assert read == []
    [touched] = (isolated_caches / "fa-envkit" / "conda-pkgs").glob(f"*/{files[0]}")
    os.utime(touched)  # the same bytes, another ctime: hashed and read again
    install_line("cu126", tmp_path / "c", workspace, backend="rattler", platform="linux-64")
    assert read == [files[0]]


def test_conda_meta_is_py_rattlers_own_record_naming_the_lock_url(lock_over_http, tmp_path, isolated_caches):
    """conda-meta's records are py-rattler's own bytes with the lock's URL line swapped in, not parsed and printed
    again (0.03 s of a 71-package layer): the record py-rattler writes has the one-member-a-line form the swap
    reads, so no record takes the parse-and-print fallback, which fails here. (In a process of its own: this
    one's threads, the fixture's server, make the install's py-rattler a fresh interpreter, not a fork that
    would keep the fallback's replacement.)"""
    prefix = tmp_path / "env"
    script = ("import sys\nfrom pathlib import Path\nfrom toolkit.base.workspace import Workspace\n"
              "from toolkit.env import rattler_link\nfrom toolkit.env.install import install_line\n"
              "def fallback(path, *args):\n    raise SystemExit(f'parsed again: {path}')\n"
              "rattler_link.read_json = fallback\n"
              f"install_line('cu126', Path({str(prefix)!r}), Workspace(locks=Path({str(lock_over_http.parent)!r})), "
              "backend='rattler', platform='linux-64')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "parsed again" not in done.stderr, done.stderr[-3000:]
    conda = {p.name: p for p in parse_conda_lock_file(lock_over_http).package
             if p.platform == "linux-64" and p.manager == "conda"}
    records = list((prefix / "conda-meta").glob("*.json"))
    assert {json.loads(meta.read_text())["name"] for meta in records} == set(conda)
    for meta in records:
        text = meta.read_text()
        record = json.loads(text)
        assert record["url"] == conda[record["name"]].url and text == json.dumps(record, indent=2)


def test_conda_meta_records_of_another_form_are_parsed_and_named_whole(tmp_path):
    """A record not in py-rattler's pretty form (here compact) still ends up naming the lock's URL and channel,
    every other member as it was; one in that form gets both lines swapped (a nested `url` kept); a record of no
    archive of the install is left as it is."""
    from toolkit.env.rattler_link import VerifiedArchive, name_the_lock_urls

    local = tmp_path / "cache" / "abc" / "zlib-1.3-h0_0.conda"
    archive = VerifiedArchive(str(local), "https://example.org/ch/linux-64/zlib-1.3-h0_0.conda",
                              "https://example.org/ch", "0" * 64, 10,
                              json.dumps({"name": "zlib", "version": "1.3", "build": "h0_0"}).encode())
    meta = tmp_path / "conda-meta"
    meta.mkdir()
    written = {"name": "zlib", "version": "1.3", "build": "h0_0", "fn": local.name, "url": local.as_uri(),
               "channel": "somewhere-else", "files": ["lib/libz.so"], "paths_data": {"paths": [{"url": "x"}]}}
    other = {"name": "other", "fn": "other-1-0.conda", "url": "file:///elsewhere/other-1-0.conda"}
    (meta / "zlib-1.3-h0_0.json").write_text(json.dumps(written))
    (meta / "other-1-0.json").write_text(json.dumps(other, indent=2))
    name_the_lock_urls(meta, [archive])
    assert json.loads((meta / "zlib-1.3-h0_0.json").read_text()) == {
        **written, "url": archive.url, "channel": archive.channel}
    assert (meta / "other-1-0.json").read_text() == json.dumps(other, indent=2)
    pretty = {**written, "channel": archive.channel}
    # py-rattler's form: the url line swapped, the record written over in place, longer or shorter than it was
    for url in (archive.url, f"https://example.org/{'c' * 400}/linux-64/zlib-1.3-h0_0.conda", "https://e.org/z.conda"):
        (meta / "zlib-1.3-h0_0.json").write_text(json.dumps(pretty, indent=2))
        name_the_lock_urls(meta, [replace(archive, url=url)])
        assert (meta / "zlib-1.3-h0_0.json").read_text() == json.dumps({**pretty, "url": url}, indent=2)


def test_an_install_imports_neither_the_lock_verb_nor_rich_for_the_engine():
    """Importing the conda engines for an install loaded rich's console through the solve's module (engine.py
    imports it for CondaRequest) and YAML for conda-lock's inputs; the install verb loaded the lock verb's module
    (its pip resolver, urllib's HTTP client) for the one line of a missing lock: 0.03-0.05 s of every install."""
    script = ("import sys\nimport toolkit.env.engine\nprint(*sorted(m for m in sys.modules if m.split('.')[0] in "
              "('rich', 'conda_lock', 'rattler', 'pydantic')))\nimport toolkit.env.install\n"
              "print(*sorted(m for m in sys.modules if m in ('toolkit.env.lock', 'toolkit.env.pypi_lock')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["", ""]


REFUSED_WHILE_PREFORKED = """
import os, sys
import psutil
from pathlib import Path
from rich.console import Console
from toolkit.base.errors import ToolkitError
from toolkit.env.engine import InstallJob, RattlerEngine

def refused(self, job):  # the archive checks refuse, while py-rattler's copy waits for its arguments
    assert [c.pid for c in psutil.Process().children()] != [], "no copy was forked"
    raise ToolkitError("archive.conda: refused")

RattlerEngine.verified = refused
job = InstallJob(Path("x.conda-lock.yml"), "linux-64", (), (), Path(sys.argv[1]), Path(sys.argv[1]))
try:
    RattlerEngine(Console(stderr=True)).install(job)
except ToolkitError as exc:
    print(exc, [c.pid for c in psutil.Process().children()])
"""


def test_a_refused_archive_ends_the_copy_forked_to_link_it(tmp_path):
    """RattlerEngine.install forks py-rattler's copy before it verifies the archives (isolated.prefork); when they
    are refused, the copy is ended and reaped, not left waiting for arguments that never come."""
    done = subprocess.run([sys.executable, "-c", REFUSED_WHILE_PREFORKED, str(tmp_path / "staging")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "archive.conda: refused []"


REFUSED_AFTER_THE_LOCK = """
import sys
import psutil
from pathlib import Path
from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.env import install

def refused(locked_env, platform):  # the spec's checks refuse, while py-rattler's copy imports py-rattler
    print(len(psutil.Process().children()))
    raise ToolkitError("envs/cu126.yaml: changed since the lock")

install.check_current = refused
try:
    install.install_line("cu126", Path(sys.argv[2]), Workspace(locks=Path(sys.argv[1])), backend="rattler",
                         platform="linux-64")
except ToolkitError as exc:
    print(exc, [c.pid for c in psutil.Process().children()])
"""


def test_the_install_verb_forks_the_link_once_the_lock_is_read_and_ends_it_on_a_refusal(lock_over_http, tmp_path):
    """install_line forks py-rattler's copy as soon as the lock says there is a conda layer, so that its import
    of py-rattler runs while the spec, the prefix and the archives are checked; a refusal among those checks
    ends the copy (reaped, not left waiting)."""
    done = subprocess.run([sys.executable, "-c", REFUSED_AFTER_THE_LOCK, str(lock_over_http.parent),
                           str(tmp_path / "cu126")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1", "envs/cu126.yaml: changed since the lock []"]

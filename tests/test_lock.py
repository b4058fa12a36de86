"""The lock stage: conda-lock-format locks from a real local channel, read back, checked for staleness.

Every solve is a real py-rattler solve (or the real `conda-lock lock` CLI, driven through the
micromamba test double in tests/micromamba_standin.py) against the fixture channel of
tests/conda_channel.py, over file:// and loopback http. The pip layer runs real pip-tools, uv and
pip against a loopback index (offline) and against PyPI (marked network)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conda_channel import channel_dir, file_url, pip_index, serve_directory, write_project  # noqa: F401
from conda_lock.lockfile import parse_conda_lock_file
from rich.console import Console

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env.engine import CondaLockEngine, RattlerEngine, choose_engine
from toolkit.env.lock import (
    KEY_DIGEST,
    PYPI_SIMPLE,
    LockedSdist,
    PipTarget,
    check_locks,
    conda_request,
    lock_line,
    lock_pip_requirements,
    read_lock,
    stale_reason,
    write_lock,
)
from toolkit.env.lockfile import lock_path
from toolkit.spec.envspec import load_spec
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "cu126.conda-lock.yml"
CONSOLE = Console(stderr=True, highlight=False)
RATTLER = RattlerEngine(CONSOLE)
FIXED_SDIST = LockedSdist(url="https://files.example/flash_attn-2.8.3.post2.tar.gz",
                          filename="flash_attn-2.8.3.post2.tar.gz", sha256="ab" * 32)


def lock_fixture_line(tmp_path: Path, channel: str, index: str, **kwargs) -> tuple[Path, Path]:
    envs = write_project(tmp_path, channel, index, extra=kwargs.pop("extra", ""))
    path, written = lock_line(checked_spec(envs / "cu126.yaml"), workspace=Workspace(locks=tmp_path / "locks"), pypi=index,
                              **kwargs)
    assert written
    return envs, path


@pytest.fixture(scope="module")
def locked(tmp_path_factory, channel_dir, pip_index):
    """One full lock (both platforms, both layers) over file://, shared by the read-only tests."""
    root = tmp_path_factory.mktemp("project")
    return lock_fixture_line(root, file_url(channel_dir), pip_index, backend="rattler")


def packages_of(lock: Path, platform: str, manager: str) -> dict[str, object]:
    return {p.name: p for p in parse_conda_lock_file(lock).package
            if p.platform == platform and p.manager == manager}


# ---------------------------------------------------------------- the lock file


def test_lock_covers_both_platforms_and_layers_and_reads_back(locked, channel_dir):
    envs, lock = locked
    info = read_lock(lock)
    assert (info.line, info.toolchain_kind, info.platforms) == ("cu126", "locked", ("linux-64", "linux-aarch64"))
    assert stale_reason(load_spec(envs / "cu126.yaml"), info) is None
    for platform in ("linux-64", "linux-aarch64"):
        conda = packages_of(lock, platform, "conda")
        assert {"python", "cuda-version", "cuda-nvcc", "cuda-cudart-dev", "gxx", "ninja", "pip",
                f"gxx_impl_{platform}", f"sysroot_{platform}"} <= set(conda)
        assert conda["cuda-version"].version == "12.6" and conda["python"].version == "3.11.10"
        assert conda["gxx"].version == "13.3.0"  # gxx "13.*" from the spec, not 12.4
        for package in conda.values():  # every hash is the archive's own
            archive = Path(package.url.removeprefix("file://"))
            assert archive.parent.name in (platform, "noarch")
            assert hashlib.sha256(archive.read_bytes()).hexdigest() == package.hash.sha256
            assert hashlib.md5(archive.read_bytes()).hexdigest() == package.hash.md5
        torch = packages_of(lock, platform, "pip")["torch"]
        assert torch.version == "2.9.1" and torch.url.endswith("torch-2.9.1-py3-none-any.whl")
        requirements = Workspace(locks=lock.parent).requirements_file("cu126", platform).read_text()
        assert f"--hash=sha256:{torch.hash.sha256}" in requirements and "toolkit lock cu126" in requirements


def test_lock_says_how_each_platforms_pip_layer_was_resolved(locked):
    """uv resolves every platform's pip layer, the one of the interpreter running the toolkit too (x86_64, 3.11:
    pip-tools did it before, downloading every file of a pinned version the index gave no hash for)."""
    _, lock = locked
    custom = yaml.safe_load(lock.read_text())["metadata"]["custom_metadata"]
    for platform, machine in (("linux-64", "x86_64"), ("linux-aarch64", "aarch64")):
        resolver = custom[f"fa-envkit.pip-resolver.{platform}"]
        assert resolver.startswith("uv ") and f"--python-platform {machine}-manylinux_2_28" in resolver
    assert custom["fa-envkit.flash-attn-sdist.filename"] == "flash_attn-2.8.3.post2.tar.gz"


def test_conda_lock_render_accepts_the_lock(locked, tmp_path):
    _, lock = locked
    template = str(tmp_path / "explicit-{platform}.lock")
    subprocess.run([sys.executable, "-m", "conda_lock", "render", "-k", "explicit", "-p", "linux-aarch64",
                    "--filename-template", template, str(lock)], check=True, capture_output=True)
    explicit = (tmp_path / "explicit-linux-aarch64.lock").read_text()
    assert "@EXPLICIT" in explicit
    for package in packages_of(lock, "linux-aarch64", "conda").values():
        assert package.url in explicit
    torch = packages_of(lock, "linux-aarch64", "pip")["torch"]
    assert f"# pip torch @ {torch.url}#sha256={torch.hash.sha256}" in explicit


def test_relocking_unchanged_inputs_changes_nothing_and_check_finds_stale_locks(locked, pip_index, capsys):
    envs, lock = locked
    before = lock.read_bytes(), lock.stat().st_mtime_ns
    spec = checked_spec(envs / "cu126.yaml")
    assert lock_line(spec, workspace=Workspace(locks=lock.parent), pypi=pip_index) == (lock, False)
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
    assert check_locks([spec], Workspace(locks=lock.parent)) == []
    assert main(["lock", "--check", "cu126", "--envs", str(envs), "--locks", str(lock.parent)]) == 0
    spec_file = envs / "cu126.yaml"
    original = spec_file.read_text()
    try:
        spec_file.write_text(original.replace('archs: ["80", "90"]', 'archs: ["90"]'))
        problems = check_locks([load_spec(spec_file)], Workspace(locks=lock.parent))
        assert len(problems) == 1 and "stale" in problems[0] and "cu126.yaml" in problems[0]
        assert main(["lock", "--check", "--envs", str(envs), "--locks", str(lock.parent)]) == 1
        assert "cu126.conda-lock.yml: stale" in capsys.readouterr().out
    finally:
        spec_file.write_text(original)


def test_forced_relock_of_the_same_inputs_is_byte_identical(locked, pip_index):
    envs, lock = locked
    before = lock.read_bytes()
    lock_line(checked_spec(envs / "cu126.yaml"), backend="rattler", workspace=Workspace(locks=lock.parent), pypi=pip_index,
              force=True)
    assert lock.read_bytes() == before


@pytest.fixture
def micromamba_on_path(tmp_path, monkeypatch) -> Path:
    """The micromamba test double (tests/micromamba_standin.py, which solves with py-rattler), first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "micromamba"
    standin.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "micromamba_standin.py"}" "$@"\n')
    standin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return standin


def test_conda_lock_cli_backend_writes_the_same_file(channel_dir, tmp_path, micromamba_on_path):
    """The real `conda-lock lock` CLI (with the micromamba test double) against the embedded solver."""
    standin = micromamba_on_path
    assert isinstance(choose_engine("auto", None, CONSOLE), CondaLockEngine)  # a micromamba on PATH: conda-lock
    assert isinstance(choose_engine("rattler", None, CONSOLE), RattlerEngine)
    envs = write_project(tmp_path, file_url(channel_dir), "http://127.0.0.1:9/simple")
    spec = checked_spec(envs / "cu126.yaml")
    by_cli = write_lock(spec, CondaLockEngine(str(standin), CONSOLE).solve(conda_request(spec)), [], FIXED_SDIST,
                        Workspace(locks=tmp_path / "cli"))
    by_rattler = write_lock(spec, RATTLER.solve(conda_request(spec)), [], FIXED_SDIST, Workspace(locks=tmp_path / "rattler"))
    assert by_cli.read_text() == by_rattler.read_text()  # content hash included: conda-lock computed the CLI's


def test_toolkit_lock_through_the_conda_lock_cli_writes_the_embedded_solvers_file(channel_dir, pip_index, tmp_path,
                                                                                  micromamba_on_path):
    """`toolkit lock --engine conda-lock`: the CLI's layer is conda-lock's models already, and they travel as they are
    to the lock's writer (pickled: a fork of this process, or a worker interpreter where it has threads, as pytest's
    served index gives it here); the file is the embedded solver's, byte for byte, pip layer included."""
    envs = write_project(tmp_path, file_url(channel_dir), pip_index)
    spec = checked_spec(envs / "cu126.yaml")
    by_cli, _ = lock_line(spec, "conda-lock", str(micromamba_on_path), Workspace(locks=tmp_path / "cli"), pypi=pip_index)
    by_rattler, _ = lock_line(spec, "rattler", workspace=Workspace(locks=tmp_path / "rattler"), pypi=pip_index)
    assert by_cli.read_text() == by_rattler.read_text()
    assert packages_of(by_cli, "linux-64", "pip")["torch"].version == "2.9.1"


# ---------------------------------------------------------------- channels, __cuda, format


def conda_only_lock(tmp_path: Path, channel: str, extra: str = "", cuda: str = "12.6", line: str = "cu126") -> Path:
    envs = write_project(tmp_path, channel, "http://127.0.0.1:9/simple", line=line, cuda=cuda, extra=extra)
    spec = checked_spec(envs / f"{line}.yaml")
    return write_lock(spec, RATTLER.solve(conda_request(spec)), [], FIXED_SDIST, Workspace(locks=tmp_path / "locks"))


def test_a_full_disk_while_the_lock_is_written_is_one_line_and_keeps_the_lock(channel_dir, tmp_path, monkeypatch):
    """The lock's draft (written in the lock's writer) and the files beside it are written in a staging folder: a
    full disk there was a traceback. Now one line naming the file; the lock in place keeps its bytes and no
    staging folder is left."""
    import errno

    lock = conda_only_lock(tmp_path, file_url(channel_dir))
    before, folder = lock.read_bytes(), sorted(p.name for p in lock.parent.iterdir())
    real_write = Path.write_text

    def full_disk(path, *args, **kwargs):
        if path.name == lock.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(ToolkitError) as caught:
        conda_only_lock(tmp_path, file_url(channel_dir))
    message = str(caught.value)
    assert "\n" not in message and f"{lock.name}: cannot write it (No space left on device)" in message
    assert lock.read_bytes() == before and sorted(p.name for p in lock.parent.iterdir()) == folder


def test_http_channel_locks_the_same_packages_as_file_channel(channel_dir, tmp_path):
    by_file = conda_only_lock(tmp_path / "a", file_url(channel_dir))
    with serve_directory(channel_dir) as url:
        by_http = conda_only_lock(tmp_path / "b", url)
    for platform in ("linux-64", "linux-aarch64"):
        over_file, over_http = packages_of(by_file, platform, "conda"), packages_of(by_http, platform, "conda")
        assert {n: p.hash for n, p in over_file.items()} == {n: p.hash for n, p in over_http.items()}
        assert all(p.url.startswith("http://127.0.0.1:") for p in over_http.values())


def test_a_relative_channel_path_is_relative_to_the_spec(channel_dir, tmp_path):
    shutil.copytree(channel_dir, tmp_path / "mirror")
    lock = conda_only_lock(tmp_path, "../mirror")
    urls = [p.url for p in parse_conda_lock_file(lock).package]
    assert urls and all(u.startswith((tmp_path / "mirror").as_uri() + "/") for u in urls)


def test_line_whose_packages_need_a_newer_cuda_does_not_solve(channel_dir, tmp_path):
    with pytest.raises(ToolkitError) as caught:
        conda_only_lock(tmp_path, file_url(channel_dir), extra='conda_packages:\n  cuda-version: "13.0.*"\n')
    message = str(caught.value)
    assert "\n" not in message and "cu126.yaml" in message
    assert "__cuda=12.6" in message and "__cuda >=13" in message


def test_cuda_virtual_package_picks_the_lines_cuda_version(channel_dir, tmp_path):
    """With cuda-version unpinned, __cuda decides: 12.6 for the 12.6 line, 13.0 for the 13.0 line."""
    for cuda, line in (("12.6", "cu126"), ("13.0", "cu130")):
        envs = write_project(tmp_path / line, file_url(channel_dir), "http://127.0.0.1:9/simple", line=line,
                             cuda=cuda, extra='conda_packages:\n  cuda-version: "*"\n')
        layer = RATTLER.solve(conda_request(load_spec(envs / f"{line}.yaml")))
        assert {p.version for p in layer.entries if p.name == "cuda-version"} == {cuda}


GOLDEN_ROOT = "file:///golden"  # the test's own folder, as the golden file spells it


def golden_form(text: str, root: Path) -> str:
    """A lock's text with the test's folder spelled GOLDEN_ROOT and the hashes that cover it (conda-lock's
    content_hash per platform, the lock's digest) as <sha256>: what is the same in every test's folder."""
    text = text.replace(root.as_uri(), GOLDEN_ROOT)
    return re.sub(r"^( +(?:linux-64|linux-aarch64|fa-envkit\.lock-sha256): )[0-9a-f]{64}$", r"\1<sha256>", text,
                  flags=re.MULTILINE)


def test_golden_lock_format(channel_dir, tmp_path):
    """The bytes of a lock from the fixture channel: guards conda-lock's internal APIs (pinned 4.0.3). The channel is
    copied into the test's own folder (a fixed one under /tmp collided between runs), so its path and the hashes
    over it are compared in golden_form; read_lock checks the digest. Regenerate with UPDATE_GOLDEN=1 after a
    deliberate format change."""
    root = tmp_path / "golden"
    shutil.copytree(channel_dir, root / "channel")
    lock = conda_only_lock(root / "project", "../../channel")
    read_lock(lock)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(golden_form(lock.read_text(), root))
    assert golden_form(lock.read_text(), root) == GOLDEN.read_text()


# ---------------------------------------------------------------- reading, tampering, errors


def test_committed_gpu_machine_lock_reads_back_and_matches_its_spec():
    locked = read_lock(lock_path("gpu-machine", ROOT / "locks"))
    spec = load_spec(ROOT / "envs" / "gpu-machine.yaml")
    assert (locked.line, locked.toolchain_kind, locked.platforms) == ("gpu-machine", "external", spec.platforms)
    assert locked.sdist.filename == f"flash_attn-{spec.flash_attn_version}.tar.gz"
    assert locked.sdist.url.startswith("https://files.pythonhosted.org/") and len(locked.sdist.sha256) == 64
    assert stale_reason(spec, locked) is None
    assert [p for p in parse_conda_lock_file(locked.path).package] == []  # the machine provides everything


def test_a_hand_edited_lock_is_refused_with_one_line(tmp_path):
    source = lock_path("gpu-machine", ROOT / "locks")
    edited = tmp_path / source.name
    text = source.read_text()
    sha = yaml.safe_load(text)["metadata"]["custom_metadata"]["fa-envkit.flash-attn-sdist.sha256"]
    edited.write_text(text.replace(sha, "f" * 64))
    with pytest.raises(ToolkitError) as caught:
        read_lock(edited)
    assert "\n" not in str(caught.value) and edited.name in str(caught.value) and KEY_DIGEST in str(caught.value)


def test_missing_and_malformed_locks_are_one_line_errors(tmp_path):
    with pytest.raises(ToolkitError, match="no lock file .*toolkit lock cu126"):
        read_lock(lock_path("cu126", tmp_path))
    broken = lock_path("cu126", tmp_path)
    broken.write_text("version: 1\nmetadata: {platforms: [linux-64]}\npackage: []\n")
    with pytest.raises(ToolkitError, match="malformed conda-lock file"):
        read_lock(broken)


def test_unreachable_torch_index_is_one_line_naming_the_index(channel_dir, pip_index, tmp_path):
    envs = write_project(tmp_path, file_url(channel_dir), "http://127.0.0.1:9/whl/cu126")
    with pytest.raises(ToolkitError) as caught:
        lock_line(checked_spec(envs / "cu126.yaml"), backend="rattler", workspace=Workspace(locks=tmp_path / "locks"),
                  pypi=pip_index)
    message = str(caught.value)
    assert "\n" not in message and "torch.index http://127.0.0.1:9/whl/cu126 is unreachable" in message
    assert "locks/README.md" in message and not (tmp_path / "locks" / "cu126.conda-lock.yml").exists()


def test_unreachable_channel_is_one_line(tmp_path):
    envs = write_project(tmp_path, "http://127.0.0.1:9/conda-forge", "http://127.0.0.1:9/simple")
    with pytest.raises(ToolkitError) as caught:
        RATTLER.solve(conda_request(checked_spec(envs / "cu126.yaml")))
    assert "\n" not in str(caught.value) and "cannot read channels http://127.0.0.1:9/conda-forge" in str(caught.value)


# ---------------------------------------------------------------- the pip layer against PyPI


@pytest.mark.network
@pytest.mark.parametrize("platform, python", [("linux-64", f"{sys.version_info[0]}.{sys.version_info[1]}"),
                                              ("linux-aarch64", "3.12")])
def test_pip_layer_against_pypi(platform, python):
    target = PipTarget(platform, python, "2.28")
    layer = lock_pip_requirements(["psutil", "packaging"], [PYPI_SIMPLE], target, "toolkit lock test")
    assert layer.resolver.startswith("uv ")
    entries = {p.name: p for p in layer.packages}
    assert set(entries) == {"psutil", "packaging"}
    psutil = entries["psutil"]
    assert target.machine in psutil.url and psutil.url.startswith("https://files.pythonhosted.org/")
    for entry in entries.values():  # the chosen artifact is one of the pinned hashes
        assert f"{entry.name}=={entry.version}" in layer.requirements
        assert f"--hash=sha256:{entry.sha256}" in layer.requirements


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files that honour a Range header (bytes=A-B, bytes=-N) as PyPI's file host does; every request is
    recorded as (path, range or None)."""

    def do_GET(self):  # type: ignore[no-untyped-def]
        self.server.requested.append((self.path, self.headers.get("Range")))  # type: ignore[attr-defined]
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range") or "")
        path = Path(self.translate_path(self.path))
        if not wanted or not path.is_file():
            return super().do_GET()
        data = path.read_bytes()
        first, last = wanted.groups()
        start, end = (len(data) - int(last), len(data) - 1) if not first else (int(first), int(last or len(data) - 1))
        start, end = max(start, 0), min(end, len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.wfile.write(data[start:end + 1])

    def log_message(self, format, *args):  # type: ignore[no-untyped-def]
        pass


def serve_with_ranges(directory: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(directory)))
    server.requested = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def dependency_index(root: Path) -> dict[str, Path]:
    """torch (a test double) requiring filelock, typing-extensions >=4.10 and, on aarch64 only, helper, and under
    an extra extra-only; filelock as a py3 wheel and as a linux-64 one (NOT REAL tags: the same tiny wheel renamed),
    so the lock must pick the target's. Files by name."""
    from conda_channel import build_simple_index, make_wheel

    dist = root / "dist"
    files = [make_wheel(dist, "torch", "2.9.1", ("filelock", "typing-extensions>=4.10.0",
                                                 "helper; platform_machine == 'aarch64'", "extra-only; extra == 'x'")),
             make_wheel(dist, "filelock", "3.20.0"), make_wheel(dist, "typing-extensions", "4.16.0"),
             make_wheel(dist, "helper", "1.0"), make_wheel(dist, "extra-only", "1.0")]
    native = dist / "filelock-3.20.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    native.write_bytes(files[1].read_bytes())
    build_simple_index(root, [*files, native])
    return {path.name: path for path in [*files, native]}


@pytest.mark.parametrize("ranges", [True, False], ids=["index-serves-ranges", "plain-file-server"])
def test_pip_entries_are_the_targets_wheels_with_the_dependencies_their_metadata_names(tmp_path, ranges):
    """Each pip entry is the wheel the target installs (filelock's linux-64 wheel on linux-64, its py3 wheel on
    aarch64), with that file's sha256 and, as dependencies, the locked packages its METADATA requires for the target
    (an extra's left out): what pip's install report gave before uv resolved every layer. An index that serves
    ranges gives the METADATA by range requests; a plain file server, by the download."""
    files = dependency_index(tmp_path / "index")
    sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
    server = serve_with_ranges(tmp_path / "index") if ranges else None
    with (contextlib.nullcontext(f"http://127.0.0.1:{server.server_address[1]}") if server
          else serve_directory(tmp_path / "index")) as url:
        try:
            layers = {platform: lock_pip_requirements(["torch==2.9.1"], [f"{url}/simple"], PipTarget(platform, "3.11", "2.28"),
                                                      "toolkit lock test")
                      for platform in ("linux-64", "linux-aarch64")}
        finally:
            if server:
                server.shutdown()
                server.server_close()
    for platform, layer in layers.items():
        assert layer.resolver.startswith("uv ")
        entries = {p.name: p for p in layer.packages}
        helper = {"helper": "*"} if platform == "linux-aarch64" else {}
        assert set(entries) == {"torch", "filelock", "typing-extensions", *helper}
        assert entries["torch"].dependencies == {"filelock": "*", "typing-extensions": ">=4.10.0", **helper}
        filelock = ("filelock-3.20.0-cp311-cp311-manylinux_2_17_x86_64.whl" if platform == "linux-64"
                    else "filelock-3.20.0-py3-none-any.whl")
        assert entries["filelock"].url == f"{url}/simple/filelock/{filelock}"
        for entry in entries.values():
            assert entry.sha256 == sha[entry.url.rsplit("/", 1)[-1]]
            assert f"--hash=sha256:{entry.sha256}" in layer.requirements
    if server:  # each locked wheel's METADATA was read by ranges (uv's own requests aside)
        ranged = {path.rsplit("/", 1)[-1] for path, byte_range in server.requested if byte_range}
        assert {p.url.rsplit("/", 1)[-1] for layer in layers.values() for p in layer.packages} <= ranged


@pytest.mark.parametrize("range_bytes, requests", [(256 << 10, 1), (100, 2)], ids=["small-wheel", "larger-wheel"])
def test_a_plain_file_server_s_whole_small_wheel_is_read_from_its_first_answer(tmp_path, monkeypatch, range_bytes,
                                                                               requests):
    """A server that answers the range request with the whole file has sent a wheel no larger than a range: its
    METADATA is read from that answer (one request, nothing in the download cache); a larger one (a range of 100
    bytes here) is downloaded into the cache, as before (a second request). The requests as the server saw them."""
    from conda_channel import make_wheel, serve_recording

    from toolkit.env import pypi_lock

    monkeypatch.setattr(pypi_lock, "RANGE_BYTES", range_bytes)
    path = make_wheel(tmp_path / "index", "filelock", "3.20.0")
    with serve_recording(tmp_path / "index") as (url, requested):
        wheel = pypi_lock.PylockWheel("filelock", "3.20.0", f"{url}/{path.name}",
                                      hashlib.sha256(path.read_bytes()).hexdigest())
        [found] = pypi_lock.wheel_metadata_of([wheel], tmp_path / "downloads")
    assert (found.name, found.version) == ("filelock", "3.20.0")
    assert requested == [f"/{path.name}"] * requests
    assert (tmp_path / "downloads").exists() == (requests == 2)


def test_a_small_wheel_whose_bytes_are_not_its_pin_is_refused(tmp_path):
    """The whole wheel a plain file server answered with is checked against the sha256 uv's pylock pins, as the
    download cache checks a download: other bytes are refused in the download's line."""
    from conda_channel import make_wheel

    from toolkit.env import pypi_lock

    path = make_wheel(tmp_path / "index", "filelock", "3.20.0")
    pinned = hashlib.sha256(b"other bytes").hexdigest()
    with serve_directory(tmp_path / "index") as url:
        wheel = pypi_lock.PylockWheel("filelock", "3.20.0", f"{url}/{path.name}", pinned)
        with pytest.raises(ToolkitError) as refused:
            pypi_lock.wheel_metadata_of([wheel], tmp_path / "downloads")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert str(refused.value).startswith(
        f"filelock 3.20.0 ({path.name}, for its metadata): sha256 mismatch: downloaded file has sha256 {actual}, "
        f"the index pins {pinned}")


def test_every_platforms_wheels_are_read_once_each_side_by_side(tmp_path, monkeypatch):
    """lock_pip_targets reads the METADATA of every platform's wheels in one go, each file once: a py3 wheel both
    platforms install (the fixture's torch and typing-extensions) is read once, not once a platform."""
    from collections import Counter

    from toolkit.env import pypi_lock
    from toolkit.env.lock import lock_pip_targets

    files = dependency_index(tmp_path / "index")
    reads: Counter[str] = Counter()
    read = pypi_lock._wheel_metadata

    def counted(wheel, downloads):
        reads[wheel.url] += 1
        return read(wheel, downloads)

    monkeypatch.setattr(pypi_lock, "_wheel_metadata", counted)
    server = serve_with_ranges(tmp_path / "index")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        layers = lock_pip_targets(["torch==2.9.1"], [f"{url}/simple"],
                                  [PipTarget(p, "3.11", "2.28") for p in ("linux-64", "linux-aarch64")],
                                  "toolkit lock test")
    finally:
        server.shutdown()
        server.server_close()
    locked = {p.url for layer in layers for p in layer.packages}
    shared = {p.url for p in layers[0].packages} & {p.url for p in layers[1].packages}
    assert set(reads) == locked and set(reads.values()) == {1}
    shared_files = {u.rsplit("/", 1)[-1] for u in shared}  # the fixture's: torch's and typing-extensions' py3 wheels
    assert shared_files == {name for name in files if name.startswith(("torch-", "typing_extensions-"))}


@pytest.mark.network
def test_flash_attn_sdist_pin_from_pypi():
    from toolkit.env.lock import fetch_sdist_pin

    pin = fetch_sdist_pin("2.8.3.post2")
    assert pin.filename == "flash_attn-2.8.3.post2.tar.gz"
    assert pin.url.startswith("https://files.pythonhosted.org/") and pin.url.endswith(pin.filename)
    assert pin.sha256 == read_lock(lock_path("gpu-machine", ROOT / "locks")).sdist.sha256


def test_benchmark_runs_at_a_small_size():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "lock.py"), "--records", "2000"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "py-rattler (embedded)" in result.stdout and "3,179 records" in result.stdout


# ---------------------------------------------------------------- FlashAttention-4 in the pip layer
# Real data: PyPI's PEP 691 JSON of each pinned FA4 project as recorded 2026-12-01 (tests/fixtures/fa4_pypi)
# and the pins of toolkit/knowledge/flash_attn_4.yaml; the conda layer is the fixture channel's.
FA4_PYPI = Path(__file__).parent / "fixtures" / "fa4_pypi"
FA4_LINE = ('extends: base\ncuda: "13.0"\npython: "3.12"\ngcc: 13\nplatforms: [linux-64]\nchannels: [{channel}]\n'
            'pip_packages: null\ntorch:\n  version: "2.9.1"\n  index: http://127.0.0.1:9/simple\narchs: ["90"]\n'
            'flash_attn_4:\n  version: "4.0.0b36"\n  with_flash_attn_2: false\n')


def recorded_fa4_pypi(project: str) -> list[dict]:
    import json

    return json.loads((FA4_PYPI / f"{project}.json").read_text())["files"]


def test_flash_attn_4_wheels_enter_the_pip_layer_exactly_pinned(channel_dir, tmp_path):
    """The lock's pip layer carries FA4's 13 pins as the knowledge has them (libs-cu13 for a CUDA 13 line, never
    the libs-cu12 the meta package requires), with PyPI's URLs; a pin the layer already has is left to it."""
    from dataclasses import replace

    from toolkit.env.lock import PipLayer, with_flash_attn_4
    from toolkit.env.pypi_lock import PipEntry
    from toolkit.knowledge import fa4_pins

    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "base.yaml").write_text((ROOT / "envs" / "base.yaml").read_text())
    (tmp_path / "envs" / "cu130fa4.yaml").write_text(FA4_LINE.format(channel=file_url(channel_dir)))
    spec = checked_spec(tmp_path / "envs" / "cu130fa4.yaml")
    torch_layer = PipLayer("linux-64", "pip-tools (test)", "", [PipEntry(
        "typing-extensions", "4.16.0", "linux-64", "https://files.example/typing_extensions-4.16.0-py3-none-any.whl",
        "ab" * 32)])
    layer = with_flash_attn_4(spec, torch_layer, recorded_fa4_pypi)
    pins = {p.name: p for p in fa4_pins.release("4.0.0b36").wheels_for("13")}  # the release FA4_LINE names
    added = {p.name: p for p in layer.packages[1:]}
    assert set(added) == set(pins) - {"typing-extensions"} and "nvidia-cutlass-dsl-libs-cu12" not in added
    assert all(added[n].sha256 == pins[n].sha256 and added[n].url.endswith(pins[n].file) for n in added)
    assert "flash-attn-4 4.0.0b36: 12 pinned wheels" in layer.resolver
    path = write_lock(spec, RATTLER.solve(conda_request(spec)), [layer], FIXED_SDIST, Workspace(locks=tmp_path / "locks"))
    locked = {p.name: p for p in read_lock(path).packages_for("linux-64") if p.manager == "pip"}
    assert locked["flash-attn-4"].version == "4.0.0b36" and locked["typing-extensions"].version == "4.16.0"
    assert locked["nvidia-cutlass-dsl-libs-cu13"].sha256 == pins["nvidia-cutlass-dsl-libs-cu13"].sha256
    quack = replace(torch_layer.packages[0], name="quack-kernels", version="0.6.4")
    clash = PipLayer("linux-64", "x", "", [quack])
    with pytest.raises(ToolkitError, match="already pins quack-kernels 0.6.4 and flash-attn-4 4.0.0b36 pins 0.6.5"):
        with_flash_attn_4(spec, clash, recorded_fa4_pypi)


def test_a_stale_lock_names_the_lines_file_not_every_file_as_changed():
    """An edit to envs/py-cu130.yaml alone was reported as 'envs/py-cu130.yaml, envs/base.yaml changed': the lock
    records the merged spec's inputs, not which file changed, so base.yaml is named only as where it may be."""
    from dataclasses import replace

    from toolkit.env.lockfile import stale_reason

    spec = load_spec(ROOT / "envs" / "py-cu130.yaml")
    assert [p.name for p in spec.chain] == ["py-cu130.yaml", "base.yaml"]  # the line extends base
    locked = replace(read_lock(ROOT / "locks" / "py-cu130.conda-lock.yml"), input_hash="a" * 64)
    reason = stale_reason(spec, locked) or ""
    assert reason.startswith("envs/py-cu130.yaml or what it extends (envs/base.yaml) changed since this lock was made")
    assert ", envs/base.yaml changed" not in reason


# ---------------------------------------------------------------- what a lock costs (issue 32)


def test_uv_resolves_for_the_target_with_the_toolkits_interpreter_not_one_searched_on_path(pip_index, tmp_path,
                                                                                          monkeypatch):
    """uv was left to find an interpreter: it ran every python on PATH (each pyenv shim: 2-4 s of a 0.05 s resolve
    here). Given the toolkit's own, it runs none of them; the target is still --python-version's."""
    shims, ran = tmp_path / "shims", tmp_path / "ran"
    shims.mkdir()
    for name in ("python", "python3", "python3.12"):
        (shims / name).write_text(f"#!/bin/sh\necho {name} >> {ran}\nexit 127\n")  # a pyenv shim of no version
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    layer = lock_pip_requirements(["torch==2.9.1"], [pip_index], PipTarget("linux-64", "3.12.7", "2.28"), "t")
    assert not ran.exists(), ran.read_text()
    assert [(p.name, p.version) for p in layer.packages] == [("torch", "2.9.1")]
    assert "torch==2.9.1" in layer.requirements


def test_every_platforms_resolves_run_side_by_side_pylocks_first(channel_dir, pip_index, tmp_path, monkeypatch):
    """Each platform's pylock.toml resolve, side by side, then each one's requirements.txt resolve, side by side
    (while the pylocks' wheels are read): two at a time. A wrapper of the real uv notes each start's kind and
    waits until both of that kind have started (a barrier that one-after-another never passes: each then notes
    it ran alone) before running uv; all four started at once note them interleaved, in the jobs' order."""
    from toolkit.env import pypi_lock

    uv, log = pypi_lock.uv_executable(), tmp_path / "uv.log"
    wrapper = tmp_path / "uv"
    wrapper.write_text(f"""#!/bin/sh
case "$*" in *compile*) ;; *) exec {uv} "$@" ;; esac
case "$*" in *pylock.toml*) kind=pylock ;; *) kind=requirements ;; esac
echo $kind >> {log}
i=0
while [ "$(grep -c $kind {log})" -lt 2 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ $i -lt 50 ] || echo alone >> {log}
exec {uv} "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setattr(pypi_lock, "uv_executable", lambda: str(wrapper))
    _, lock = lock_fixture_line(tmp_path, file_url(channel_dir), pip_index, backend="rattler")
    assert log.read_text().split() == ["pylock", "pylock", "requirements", "requirements"]
    assert {(p.platform, p.name) for p in read_lock(lock).packages if p.manager == "pip"} == {
        ("linux-64", "torch"), ("linux-aarch64", "torch")}


def test_writing_a_lock_imports_conda_locks_models_only_and_only_in_its_checker(channel_dir, pip_index, tmp_path):
    """conda-lock's package __init__ imports its whole CLI (conda_lock.conda_lock: its solvers, ensureconda,
    vendored poetry) to re-export `main`, and conda_lock.lockfile's imports its PyPI-name lookup (filelock,
    asyncio) and vendored conda (requests); the check of a written lock needs its models only. And those only in
    the checker's process (forked as the lock starts): the locking process makes the lock's document itself
    (lock_document) and imports no module of conda-lock at all."""
    script = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT / 'tests')!r})
from conda_channel import file_url, write_project
from toolkit.base.workspace import Workspace
from toolkit.env import lock, lock_ahead
from toolkit.spec.rules import checked_spec

def noting(path, document, check=lock_ahead.check_with_conda_lock):  # what the checker's process imported
    check(path, document)
    Path({str(tmp_path / "checker")!r}).write_text(" ".join(str(name in sys.modules) for name in (
        "conda_lock.conda_lock", "conda_lock.lockfile.v2prelim.models", "conda_lock.lookup",
        "conda_lock._vendor.conda.models.match_spec", "conda_lock.models.lock_spec")))

lock_ahead.check_with_conda_lock = noting
envs = write_project(Path({str(tmp_path)!r}), {file_url(channel_dir)!r}, {pip_index!r})
path, written = lock.lock_line(checked_spec(envs / "cu126.yaml"), "rattler",
                               workspace=Workspace(locks=envs.parent / "locks"), pypi={pip_index!r})
print(written, any(name.split(".")[0] == "conda_lock" for name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]  # written, and no conda-lock module in the locking process
    # the checker's: the models, not the CLI, the lookup, the vendored MatchSpec or the source parsers' spec
    assert (tmp_path / "checker").read_text().split() == ["False", "True", "False", "False", "False"]
    parse_conda_lock_file(tmp_path / "locks" / "cu126.conda-lock.yml")  # conda-lock, all of it, reads what was written


def test_the_lock_text_is_conda_locks_writers(locked, tmp_path):
    """The lock's text (lock_document, dumped by lock_text with libyaml's emitter, the digest added) is what
    conda-lock's own writer (write_conda_lock_file, PyYAML's pure-Python emitter) writes for the lock it
    parses from it: both layers, both platforms, the metadata."""
    from conda_lock.lockfile import write_conda_lock_file

    _, lock = locked
    write_conda_lock_file(parse_conda_lock_file(lock), tmp_path / "theirs.yml", metadata_choices=None,
                          include_help_text=False)
    theirs = (tmp_path / "theirs.yml").read_text()
    assert theirs.startswith("version: 1\nmetadata:\n") and "manager: pip" in theirs and "manager: conda" in theirs
    assert lock.read_text().endswith(theirs)  # the header, then the text written


@pytest.mark.parametrize("edit", ["optional dropped", "entry repeated", "version 3", "url a list"])
def test_the_check_after_writing_refuses_what_conda_locks_parser_refuses(locked, tmp_path, edit):
    """check_with_conda_lock validates with conda-lock's models on libyaml's parse, without conda-lock's parser: what
    parse_conda_lock_file refuses it refuses, in one line naming the file."""
    from toolkit.env.lockfile import check_with_conda_lock

    _, lock = locked
    document = yaml.safe_load(lock.read_text())
    if edit == "optional dropped":
        del document["package"][0]["optional"]
    elif edit == "entry repeated":
        document["package"].append(dict(document["package"][0]))
    elif edit == "version 3":
        document["version"] = 3
    else:
        document["package"][1]["url"] = [document["package"][1]["url"]]
    broken = tmp_path / "cu126.conda-lock.yml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(Exception):  # noqa: B017 - conda-lock's own refusal, whatever its type
        parse_conda_lock_file(broken)
    with pytest.raises(ToolkitError) as caught:
        check_with_conda_lock(broken, yaml.safe_load(broken.read_text()))  # safe_dump wrote the repeat as an alias
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"{broken}: malformed conda-lock file")


def test_the_solve_worker_loads_the_solve_not_the_engines_module(channel_dir, pip_index, tmp_path):
    """py-rattler's worker unpickled its job from engine.py (CondaRequest, rattler_fetch_actions), importing all an
    install needs (0.1 s of CPU per lock); its job is now of toolkit/env/rattler_solve.py alone."""
    import pickle

    from toolkit.env.engine import rattler_fetch_actions

    envs = write_project(tmp_path, file_url(channel_dir), pip_index)
    job = tmp_path / "job.pickle"  # what run_isolated hands its worker
    job.write_bytes(pickle.dumps((rattler_fetch_actions.__module__, rattler_fetch_actions.__qualname__,
                                  (conda_request(checked_spec(envs / "cu126.yaml")),))))
    script = (f"import importlib, pickle, sys\nmodule, name, args = pickle.loads(open({str(job)!r}, 'rb').read())\n"
              "getattr(importlib.import_module(module), name)\n"
              "print(*sorted(m for m in sys.modules if m.startswith('toolkit.env.')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["toolkit.env.rattler_solve"]


@pytest.mark.parametrize("verb", ["lock", "install"])
def test_a_lock_or_install_imports_the_cache_wing_only_for_runtime(verb):
    """The entry imported the cache wing's runtime locks (index, publish: 0.1 s of CPU) for every lock and install;
    it is handed down by name and imported when `--runtime` runs."""
    script = (f"import sys\nfrom toolkit.cli import build_parser\nbuild_parser([{verb!r}])\n"
              "print(*sorted(m for m in sys.modules if m.startswith('toolkit.cache')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


ENTRY_FORKS_THE_SOLVER = """
import sys
from pathlib import Path
import psutil
sys.path.insert(0, {tests!r})
import toolkit.env.lock_ahead as lock_ahead
from conda_channel import write_project

seen = []
def noting(name, fork):  # the entry's `ahead` for lock (cli.VERBS) forks both before the lock verb's modules
    def forked():
        seen.append((name, "toolkit.env.lock" in sys.modules))
        return fork()
    return forked
lock_ahead.forked_solver = noting("solver", lock_ahead.forked_solver)
lock_ahead.lock_checker = noting("checker", lock_ahead.lock_checker)
from toolkit.cli import main
envs = write_project(Path({root!r}), {channel!r}, {index!r})
codes = [main(["lock", "cu126", "--engine", "rattler", "--pypi", {index!r}, "--envs", str(envs), "--locks",
               str(envs.parent / "locks")]),
         main(["lock", "--check", "--envs", str(envs), "--locks", str(envs.parent / "locks")])]
for ends_in_the_parser in (["lock", "--help"], ["lock", "--no-such-option"]):
    try:
        main(ends_in_the_parser)
    except SystemExit as exc:
        codes.append(exc.code)
print(seen, codes, [c.pid for c in psutil.Process().children()])
"""


def test_the_entry_forks_the_solver_and_checker_before_the_lock_verbs_modules(channel_dir, pip_index, tmp_path):
    """`toolkit lock` forks py-rattler's solver and the lock's checker before it imports the lock verb (their
    imports of py-rattler and conda-lock's models beside the verb's imports and the spec's checks, and copies of a
    small process); a lock takes them, a refused option (the parser's end) ends them unused, and `lock --check` and
    `lock --help`, which solve nothing, fork none: no copy is left."""
    script = ENTRY_FORKS_THE_SOLVER.format(tests=str(ROOT / "tests"), root=str(tmp_path),
                                           channel=file_url(channel_dir), index=pip_index)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    # the second run's process has imported the verb already, in the first
    assert done.stdout.splitlines()[-1] == (
        "[('solver', False), ('checker', False), ('solver', True), ('checker', True)] [0, 0, 0, 2] []")
    read_lock(tmp_path / "locks" / "cu126.conda-lock.yml")

"""`toolkit install` of a pypi line against bad input: the wrong python, none on PATH, --python for a conda
line, a user's files in the venv, knowledge symlinks that leave CUDA_HOME. Nothing here downloads: the venv
tests install small wheels made here (file:// URLs, sha256 from hashlib) through the real VenvBuild.make.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import yaml
from conda_channel import serve_recording
from rich.console import Console
from test_download import FlakyServer

from toolkit.base.atomic import temp_name
from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.env.engine import install_pip_layer
from toolkit.env.install import check_prefix, install_line
from toolkit.env.install_record import PrefixRecord
from toolkit.env.lockfile import LockedPackage, lock_digest
from toolkit.env.pypi_install import VenvBuild, make_symlinks, site_packages
from toolkit.env.standin import StandIn, copy_in
from toolkit.knowledge.facts import load_knowledge

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def fake_python(tmp_path: Path, version: str) -> Path:
    """An 'interpreter' that answers the version probe with `version`."""
    path = tmp_path / "bin" / "python-fake"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_a_python_of_another_version_is_refused_before_anything_is_written(tmp_path):
    prefix = tmp_path / "env"
    with pytest.raises(ToolkitError) as refused:
        install_line("py-cu130", prefix, Workspace(locks=ROOT / "locks"), python=fake_python(tmp_path, "3.9"))
    assert str(refused.value) == (f"{tmp_path}/bin/python-fake: is python 3.9, the line's spec asks for 3.11 "
                                  f"(install python 3.11, or pass --python PATH)")
    assert not prefix.exists() and os.listdir(tmp_path) == ["bin"]


def test_one_probe_finds_the_python_and_the_pip_it_bundles(monkeypatch):
    """The venv's pip is python's own ensurepip wheel, found by the probe that checks the python's version (each
    python started costs a tenth of a second of an install): one probe, the wheel by hashlib's sha256."""
    import ensurepip

    from toolkit.env import pypi_install

    probes: list[list[str]] = []
    real = pypi_install.run_tied
    monkeypatch.setattr(pypi_install, "run_tied", lambda argv, **kw: probes.append(list(argv)) or real(argv, **kw))
    python, bundled = pypi_install.find_python(f"{sys.version_info[0]}.{sys.version_info[1]}", Path(sys.executable))
    [wheel] = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    assert python == Path(sys.executable) and len(probes) == 1
    assert [(p.name, p.url, p.sha256) for p in bundled] == [
        ("pip", wheel.resolve().as_uri(), hashlib.sha256(wheel.read_bytes()).hexdigest())]


def test_no_python_of_the_specs_version_on_path_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolkitError, match=r"^python3\.11: not on PATH; the line's spec asks for python 3\.11 "
                                           r"\(install python 3\.11, or pass --python PATH\)$"):
        install_line("py-cu130", tmp_path / "env", Workspace(locks=ROOT / "locks"))
    assert not (tmp_path / "env").exists()


def test_python_is_refused_for_a_conda_line(tmp_path):
    """A locked (conda) line's python is the lock's: --python is refused, not ignored."""
    document = yaml.safe_load((ROOT / "locks" / "gpu-machine.conda-lock.yml").read_text())
    document["metadata"]["custom_metadata"]["fa-envkit.toolchain-kind"] = "locked"
    document["metadata"]["custom_metadata"]["fa-envkit.lock-sha256"] = lock_digest(document)
    (tmp_path / "gpu-machine.conda-lock.yml").write_text(yaml.safe_dump(document))
    for option, given in (("python", {"python": Path(sys.executable)}), ("torch-from", {"torch_from": Path(sys.executable)}),
                          ("wheels", {"wheels": tmp_path})):
        with pytest.raises(ToolkitError, match=rf"^--{option}: gpu-machine has a locked toolchain, whose python and "
                                               rf"torch come from .*gpu-machine\.conda-lock\.yml \(drop --{option}; "):
            install_line("gpu-machine", tmp_path / "env", Workspace(locks=tmp_path), **given)
        assert not (tmp_path / "env").exists()


def test_knowledge_symlinks_that_leave_cuda_home_are_refused(tmp_path):
    (tmp_path / "lib").mkdir()
    for link, target in (("../escape", "lib"), ("lib/x.so", "../../../etc/passwd"), ("/abs", "lib")):
        with pytest.raises(ToolkitError, match="is not a path inside CUDA_HOME"):
            make_symlinks(tmp_path, {link: target})
    assert sorted(os.listdir(tmp_path)) == ["lib"]


# ---------------------------------------------------------------- a venv of small wheels


def wheel(directory: Path, name: str, version: str, files: dict[str, bytes]) -> LockedPackage:
    """A real wheel (RECORD with hashes) as a lock entry: file:// URL, sha256 from hashlib."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {**files, f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = "".join(f"{n},sha256={digest(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in {**files, f"{dist}.dist-info/RECORD": record.encode()}.items():
            archive.writestr(n, d)
    return LockedPackage("pip", name, version, path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest(), "linux-64")


def cuda_wheels(wheels: Path) -> tuple[LockedPackage, ...]:
    """The two wheels a pypi line's venv needs at least (nvcc, and the runtime its symlinks name)."""
    return (wheel(wheels, "nvidia-cuda-nvcc", "13.0.88", {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n"}),
            wheel(wheels, "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"\0"}))


def make_venv(prefix: Path, python: Path = Path(sys.executable), extra: tuple[LockedPackage, ...] = (),
              wheels: tuple[LockedPackage, ...] | None = None) -> Path:
    """A pypi line's venv as `toolkit install` leaves it: made by VenvBuild.make in a staging folder beside the
    prefix (named as install's, so the two paths differ as they do there), its record written, moved into place.
    `wheels`: instead of cuda_wheels made beside the prefix."""
    packages = (*(cuda_wheels(prefix.parent / "wheels") if wheels is None else wheels), *extra)
    pypi = load_knowledge().pypi
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    build = VenvBuild(python, version, packages, pypi.lines["13.0.3"], pypi.cuda_home)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = prefix.parent / (temp_name(f"install-{prefix.name}") + "1-x") / "env"
    written = build.make(staging, prefix, Console(quiet=True))
    PrefixRecord("py-cu130", "lock", "linux-64", "0" * 64, "0" * 64, str(prefix), written).write(staging)
    staging.rename(prefix)
    shutil.rmtree(staging.parent)  # pip's requirements file: the rest of install's work folder
    return prefix


@pytest.fixture(scope="module")
def small_venv(tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "env")


def test_the_venv_is_the_toolkits_own_and_names_its_final_folder(small_venv):
    check_prefix(small_venv)  # every file is a wheel's (RECORD) or the toolkit's (its record): a reinstall may replace it
    home = site_packages(small_venv, PYTHON) / "nvidia" / "cu13"
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13" and os.readlink(home / "lib64") == "lib"
    staging = str(small_venv.parent / (temp_name("install-env") + "1-x") / "env")
    assert all(staging not in p.read_text(errors="replace") for p in [small_venv / "pyvenv.cfg",
                                                                       *(small_venv / "bin").glob("activate*")])
    assert f'VIRTUAL_ENV="{small_venv}"' in (small_venv / "bin" / "activate").read_text()


SITE = "lib/python{v}/site-packages"


@pytest.mark.parametrize("user_file", [
    "notes.txt", "include/my.h", f"{SITE}/nvidia/cu13/lib/mine.so", "bin/my-tool",
    # no tree is skipped whole: python's caches, the installers' records and the toolkit's own are checked too
    f"{SITE}/__pycache__/notes.txt", f"{SITE}/pip/__pycache__/notes.txt",
    f"{SITE}/__pycache__/mine.cpython-311.pyc",  # a cache of no installed module
    "etc/fa-envkit/notes.txt", "conda-meta/notes.txt", "conda-meta/mine.json"])  # not named as a package record
def test_a_reinstall_refuses_a_venv_holding_a_users_file(small_venv, user_file):
    path = small_venv / user_file.format(v=PYTHON)
    made = [folder for folder in reversed(path.parents) if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"name": "mine", "version": "1.0", "build": "0", "files": ["notes.txt"]}')
    try:
        with pytest.raises(ToolkitError, match=rf"holds files no installer wrote \({re.escape(user_file.format(v=PYTHON))}\); "
                                               r"reinstalling would delete them"):
            check_prefix(small_venv)
    finally:
        path.unlink()
        for folder in reversed(made):
            folder.rmdir()


def test_pythons_cache_of_an_installed_module_is_no_users_file(small_venv):
    """pip is installed without bytecode (compiled when it first runs): the folder python then makes is no user's."""
    cache = site_packages(small_venv, PYTHON) / "pip" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.opt-1.pyc"
    cache.parent.mkdir()
    cache.write_bytes(b"python -O made this")
    try:
        check_prefix(small_venv)
    finally:
        shutil.rmtree(cache.parent)


def dist_record(venv: Path, name: str) -> Path:
    [record] = site_packages(venv, PYTHON).glob(f"{name}-*.dist-info/RECORD")
    return record


@pytest.mark.parametrize("row", ["../../notes.txt,,", "../../notes.txt,sha256=" + "A" * 43 + ",100",
                                 "../../../bin/notes.txt,,", "nvidia/cu13/lib/notes.txt,,",
                                 "../../../../../notes.txt,,"])
def test_a_record_row_naming_a_users_file_does_not_make_it_installed(small_venv, row):
    """pip keeps the rows of a wheel's RECORD that name no file of the wheel: a row alone owns nothing, only a
    row whose file is the size it records (pip's own rows), and only inside the venv."""
    record = dist_record(small_venv, "nvidia_cuda_runtime")
    before = record.read_bytes()
    user = (site_packages(small_venv, PYTHON) / row.partition(",")[0]).resolve()
    inside = user.is_relative_to(small_venv)
    target = user if inside else small_venv / "notes.txt"  # ../../../../../ leaves the venv: the row names nothing here
    target.write_text("mine")
    record.write_bytes(before + row.encode() + b"\n")
    try:
        named = re.escape(str(target.relative_to(small_venv)))
        with pytest.raises(ToolkitError, match=rf"holds files no installer wrote \({named}\)"):
            check_prefix(small_venv)
    finally:
        record.write_bytes(before)
        target.unlink()


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "sparse 8 GiB"])
def test_a_reinstall_never_hangs_on_or_floods_from_a_record(small_venv, kind):
    """RECORDs are read bounded (bounded_read): a FIFO is never opened for reading, /dev/zero or a sparse file is
    refused after a bounded read. Checked in a child with a memory cap, so today's hang cannot take the machine."""
    record = dist_record(small_venv, "nvidia_cuda_runtime")
    before = record.read_bytes()
    record.unlink()
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "/dev/zero":
        record.symlink_to("/dev/zero")
    else:
        with open(record, "wb") as sparse:
            sparse.truncate(8 << 30)
    code = ("import resource, sys; from pathlib import Path; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from toolkit.env.install import check_prefix; from toolkit.base.errors import ToolkitError\n"
            "try:\n    check_prefix(Path(sys.argv[1]))\nexcept ToolkitError as exc:\n    print(exc)")
    try:
        done = subprocess.run([sys.executable, "-c", code, small_venv], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reinstall's check hung on a {kind} RECORD")
    finally:
        record.unlink()
        record.write_bytes(before)
    reason = {"fifo": "a FIFO, not a regular file", "/dev/zero": "a character device, not a regular file",
              "sparse 8 GiB": "larger than 67,108,864 bytes"}[kind]
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{record}: unreadable ({reason}; move your own files out and remove the environment " \
                          f"yourself, then install again)\n"


def test_a_record_copied_from_another_venv_does_not_make_a_folder_the_toolkits(small_venv, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(small_venv, copy, symlinks=True)
    with pytest.raises(ToolkitError, match=rf"its {PrefixRecord.FILE} was written for '{small_venv}', not this folder"):
        check_prefix(copy)


# ---------------------------------------------------------------- wheels over http: uv's cache, hashes


def served(packages: tuple[LockedPackage, ...], url: str) -> tuple[LockedPackage, ...]:
    return tuple(dataclasses.replace(p, url=f"{url}/{p.filename}") for p in packages)


def test_a_reinstall_of_an_unchanged_lock_downloads_nothing(tmp_path, monkeypatch):
    """The wheels are downloaded once into the toolkit's uv cache: a second venv of the same lock (a reinstall)
    asks the index for nothing, and links the same files."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packages = cuda_wheels(tmp_path / "index")
    with serve_recording(tmp_path / "index") as (url, requests):
        first = make_venv(tmp_path / "first" / "env", wheels=served(packages, url))
        fetched = list(requests)
        second = make_venv(tmp_path / "second" / "env", wheels=served(packages, url))
    assert {path.lstrip("/") for path in fetched} == {p.filename for p in packages}  # the first one downloaded them
    assert requests == fetched  # the second nothing
    nvcc = f"lib/python{PYTHON}/site-packages/nvidia/cu13/bin/nvcc"
    assert (first / nvcc).read_bytes() == (second / nvcc).read_bytes() == b"#!/bin/sh\n"
    check_prefix(second)


@pytest.mark.parametrize("how", ["another wheel", "a byte changed", "from --wheels"])
def test_a_tampered_wheel_is_refused_by_its_hash_and_nothing_is_installed(tmp_path, monkeypatch, how):
    """Other bytes than the lock pins (another wheel of that name, a changed byte inside, served by the index or
    found in a --wheels folder): one line naming the wheel, nothing installed and nothing kept in the caches."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packages = cuda_wheels(tmp_path / "index")
    runtime = tmp_path / "index" / packages[1].filename
    if how == "another wheel":
        wheel(tmp_path / "index", "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"evil"})
    else:
        data = bytearray(runtime.read_bytes())
        data[data.index(b"Metadata-Version")] ^= 1
        runtime.write_bytes(bytes(data))
    actual = hashlib.sha256(runtime.read_bytes()).hexdigest()
    assert actual != packages[1].sha256
    prefix = tmp_path / "venv" / "env"
    with serve_recording(tmp_path / "index") as (url, _), pytest.raises(ToolkitError) as refused:
        make_venv(prefix, wheels=packages if how == "from --wheels" else served(packages, url))
    # named by the lock the entry is from (VenvBuild.lock_file: "lock" where a test gives none); uv hashes the wheel
    # as it streams, and a changed byte inside is caught by the zip's CRC before the hash is complete
    where = runtime.as_uri() if how == "from --wheels" else f"{url}/{runtime.name}"
    seen = ("is not the file locked (Bad CRC (got " if how != "another wheel" else f"has sha256 {actual}, the lock pins "
            f"{packages[1].sha256} (the wheel was changed or the index serves another file); nothing was installed")
    assert str(refused.value).startswith(f"lock: nvidia-cuda-runtime 13.0.96: sha256 mismatch: {where} {seen}")
    assert str(refused.value).endswith("; nothing was installed") and "\n" not in str(refused.value)
    assert not prefix.exists() and not list((tmp_path / "cache").rglob(runtime.name))


@pytest.mark.parametrize("how", ["reset", "cut off"])
def test_a_wheel_whose_first_connection_breaks_is_downloaded_again(tmp_path, monkeypatch, how):
    """uv downloads the wheels: one reset connection (before an answer, or halfway through the body) must not fail
    the install; the wheel is asked for again and installed whole."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    nvcc, runtime = cuda_wheels(tmp_path / "index")
    server = FlakyServer((tmp_path / "index" / runtime.filename).read_bytes(), how, failures=1)
    try:
        flaky = dataclasses.replace(runtime, url=f"http://127.0.0.1:{server.server.server_address[1]}/{runtime.filename}")
        prefix = make_venv(tmp_path / "venv" / "env", wheels=(nvcc, flaky))
    finally:
        server.close()
    assert server.connections == 2
    assert (site_packages(prefix, PYTHON) / "nvidia" / "cu13" / "lib" / "libcudart.so.13").read_bytes() == b"\0"


@pytest.mark.parametrize("terminal", [False, True])
def test_the_install_shows_each_download_and_step(tmp_path, monkeypatch, terminal):
    """An install of wheels says what it does as it goes: each wheel uv downloads (by name and size) and each step,
    in plain lines where the output is no terminal; at one, under a live bar of the step."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packages = (*cuda_wheels(tmp_path / "index"),
                wheel(tmp_path / "index", "bulky", "1.0", {"bulky/data.bin": os.urandom(3 << 20)}))
    shown = io.StringIO()
    console = Console(file=shown, force_terminal=terminal, width=120)
    staging = tmp_path / "work" / "env"
    staging.parent.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", staging], check=True)
    with serve_recording(tmp_path / "index") as (url, _):
        install_pip_layer(list(served(packages, url)), staging, tmp_path / "env", console, Path("lock"))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.getvalue())  # the terminal's colours and cursor moves
    size = len((tmp_path / "index" / packages[2].filename).read_bytes()) / (1 << 20)
    assert f"downloaded bulky ({size:.1f} MiB)" in text
    assert "uv: Prepared 3 packages in " in text and "uv: Installed 3 packages in " in text
    assert ("uv: 3 pip packages: downloading" in text) == terminal  # the live bar's step, at a terminal only


# ---------------------------------------------------------------- --torch-from: the other environment's files


def record_row(name: str, data: bytes, size: int | None = None) -> str:
    """A RECORD row as pip writes it, the hash from hashlib."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data) if size is None else size}"


def other_site(tmp_path: Path, rows: list[str]) -> StandIn:
    """demo 1.0 installed in another site-packages (its module and dist-info, their RECORD rows real), with
    `rows` added to its RECORD."""
    site = tmp_path / "other"
    files = {"demo/__init__.py": b"x = 1\n", "demo-1.0.dist-info/METADATA": b"Name: demo\nVersion: 1.0\n"}
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    lines = [*(record_row(n, d) for n, d in files.items()), *rows, "demo-1.0.dist-info/RECORD,,"]
    (site / "demo-1.0.dist-info" / "RECORD").write_text("\n".join(lines) + "\n")
    return StandIn("demo", "1.0", site / "demo-1.0.dist-info")


def refusal(stand_in: StandIn, site: Path) -> str:
    """copy_in's refusal, waited for in a thread: a FIFO or /dev/zero must neither block it nor run it on."""
    found: list[str] = []

    def copy() -> None:
        try:
            copy_in(stand_in, site)
            found.append("copied")
        except Exception as exc:  # a traceback's exception is reported as such, not lost with the thread
            found.append(str(exc) if isinstance(exc, ToolkitError) else repr(exc))

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(60)
    assert found, "copy_in did not return within 60 s"
    return found[0]


def sparse(path: Path, size: int) -> None:
    """A file of `size` bytes of holes: nothing on disk, endless to a reader that does not stop."""
    with open(path, "wb") as handle:
        handle.truncate(size)


EXTRA = b"import os\n"
FIX = "reinstall demo there, or drop --torch-from"
STAND_IN_CASES = {  # what the other site holds -> the RECORD row naming it, the refusal after the file's path
    "fifo": (lambda site: os.mkfifo(site / "demo/pipe"), record_row("demo/pipe", b""),
             "demo/pipe", f"cannot be copied (a FIFO, not a file; {FIX})"),
    "folder": (None, record_row("demo", b""), "demo", f"cannot be copied (a directory, not a file; {FIX})"),
    "dot": (None, record_row(".", b""), "", f"cannot be copied (a directory, not a file; {FIX})"),
    "dev-zero": (lambda site: (site / "demo/zero").symlink_to("/dev/zero"), record_row("demo/zero", b""),
                 "demo/zero", f"leads out of {{site}} (to /dev/zero; {FIX})"),
    "link-out": (lambda site: (site / "demo/notes").symlink_to(site.parent / "notes.txt"),
                 record_row("demo/notes", b"mine\n"), "demo/notes", f"leads out of {{site}} (to {{tmp}}/notes.txt; {FIX})"),
    "no-hash": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), "demo/extra.py,,", "demo/extra.py",
                f"demo-1.0.dist-info/RECORD lists it without a hash (it cannot be checked; {FIX})"),
    "md5": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), "demo/extra.py,md5=x,10", "demo/extra.py",
            f"demo-1.0.dist-info/RECORD lists it with a 'md5' hash, not a sha256 (it cannot be checked; {FIX})"),
    "no-size": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), record_row("demo/extra.py", EXTRA)[:-2],
                "demo/extra.py", f"demo-1.0.dist-info/RECORD lists it without a size (it cannot be read to its end; {FIX})"),
    "sparse": (lambda site: sparse(site / "demo/big.bin", 64 << 20),
               record_row("demo/big.bin", bytes(10)), "demo/big.bin",
               f"not the file demo-1.0.dist-info/RECORD lists (more than its 10 bytes: changed since it was installed; {FIX})"),
    "size-lie": (lambda site: (site / "demo/extra.py").write_bytes(EXTRA), record_row("demo/extra.py", EXTRA, 15),
                 "demo/extra.py", f"not the file demo-1.0.dist-info/RECORD lists (10 bytes, not 15: changed since it was "
                                  f"installed; {FIX})"),
    "same-size-edit": (lambda site: (site / "demo/extra.py").write_bytes(b"import re\n"), record_row("demo/extra.py", EXTRA),
                       "demo/extra.py", f"not the file demo-1.0.dist-info/RECORD lists (another sha256: changed since it "
                                        f"was installed; {FIX})"),
}


@pytest.mark.parametrize("case", sorted(STAND_IN_CASES))
def test_a_stand_in_file_that_is_not_its_records_is_refused_in_one_line(tmp_path, case):
    """`--torch-from`'s copy: a FIFO row hung it, a folder row (`demo`, `.`) was a traceback, a link to
    /dev/zero copied without end, an unhashed or mis-sized row was copied unchecked. Each is one line naming
    the file, and what is read stays within its RECORD size."""
    make, row, name, problem = STAND_IN_CASES[case]
    (tmp_path / "notes.txt").write_text("mine\n")
    stand_in = other_site(tmp_path, [row])
    site = stand_in.dist_info.parent
    if make:
        make(site)
    venv = tmp_path / "venv"
    shown = site / name if name else site
    assert refusal(stand_in, venv) == f"{shown}: {problem.format(site=site, tmp=tmp_path)}"
    assert not (venv / name).is_file() or (venv / name).stat().st_size <= 11


# ---------------------------------------------------------------- a prefix's path never becomes shell code


HOSTILE_NAMES = {"$(touch MARKER)": "$()", "x;touch MARKER": ";", "x`touch MARKER`": "`", "x\ntouch MARKER": "\n",
                 'x"y': '"', "x'y": "'", "x\\y": "\\", "a:b": ":"}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_prefix_whose_path_the_shell_would_run_is_refused_before_anything_is_written(tmp_path, name):
    """bin/activate writes the venv's path (and its name, the prompt) into shell code: python's venv before the
    fix of CVE-2024-9287 writes it raw in double quotes, so `$(...)` there ran when the venv was activated.
    Refused so for --prefix and for the default .envs/LINE of a checkout so named."""
    python = fake_python(tmp_path, "3.9")  # never reached: the prefix is refused first
    checkout = tmp_path / f"checkout{name}"
    for prefix, given in ((tmp_path / name / "env", {"prefix": tmp_path / name / "env"}),
                          (checkout / ".envs" / "py-cu130", {"workspace": Workspace(locks=ROOT / "locks",
                                                                                     environments=checkout / ".envs")})):
        with pytest.raises(ToolkitError) as refused:
            install_line("py-cu130", **{"workspace": Workspace(locks=ROOT / "locks"), **given}, python=python)
        assert str(refused.value) == (
            f"{str(prefix)!r}: a pypi line's venv cannot go here: its path holds {HOSTILE_NAMES[name]!r}, which its "
            f"bin/activate would hand to the shell; nothing was written (choose a --prefix of letters, digits, "
            f"spaces and ._+@%=,/- only)")
        assert os.listdir(tmp_path) == ["bin"]


def test_venv_build_itself_makes_no_activate_for_such_a_path(tmp_path):
    """VenvBuild.make refuses such a prefix too (its other callers): nothing is made there, so no bin/activate
    exists whose sourcing would run `touch MARKER` (as the one made before this check did)."""
    prefix = tmp_path / "$(touch MARKER)" / "env"
    with pytest.raises(ToolkitError, match="a pypi line's venv cannot go here"):
        make_venv(prefix)
    assert sorted(os.listdir(tmp_path)) == ["$(touch MARKER)"] and os.listdir(prefix.parent) == ["wheels"]


def other_python() -> list[Path]:
    """The interpreters a venv is made with here: this one, and the system's python3 where it has venv and
    ensurepip (Debian's 3.11.2 carries the fix of CVE-2024-9287, whose activate quotes the path with shlex)."""
    found = [Path(sys.executable)]
    system = Path("/usr/bin/python3")
    if system.exists() and subprocess.run([system, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0:
        found.append(system)
    return found


@pytest.mark.parametrize("python", other_python(), ids=str)
def test_a_venv_in_a_folder_with_a_space_runs_its_scripts_and_activates(tmp_path, python):
    """pip writes a #! line for the staging folder's python (no space there); for the final prefix a #! line
    with a space runs nowhere, so the scripts get pip's /bin/sh + exec header instead."""
    hello = wheel(tmp_path / "wheels", "hello-fa", "1.0", {
        "hello_fa.py": b"import sys\ndef main():\n    print('hello from', sys.prefix)\n",
        "hello_fa-1.0.dist-info/entry_points.txt": b"[console_scripts]\nhello-fa = hello_fa:main\n"})
    prefix = make_venv(tmp_path / "fa env", python, (hello,))  # install's staging folder: .fa-envkit-tmp-install-fa_env-*
    done = subprocess.run([prefix / "bin" / "hello-fa"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"hello from {prefix}\n"), done.stderr
    done = subprocess.run([prefix / "bin" / "pip", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and f"from {prefix}/lib/" in done.stdout, done.stderr
    activate = f"source {shlex.quote(str(prefix / 'bin' / 'activate'))} && echo \"$VIRTUAL_ENV\" && command -v pip"
    done = subprocess.run(["bash", "-c", activate], capture_output=True, text=True, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"{prefix}\n{prefix}/bin/pip\n"), done.stderr
    assert (prefix / "bin" / "hello-fa").read_bytes().startswith(
        b"#!/bin/sh\n'''exec' \"" + str(prefix).encode() + b"/bin/python")


@pytest.mark.parametrize("kind, says", [
    ("fifo", "locks/x.runtime.conda-lock.yml: unreadable (a FIFO"),
    ("alias", "locks/x.runtime.conda-lock.yml: uses a YAML alias"),
    ("build lock", "locks/x.runtime.conda-lock.yml: not a runtime lock of x"),
])
def test_install_runtime_refuses_a_hostile_runtime_lock_in_one_line(tmp_path, monkeypatch, capsys, kind, says):
    """`toolkit install LINE --runtime` reads locks/<line>.runtime.conda-lock.yml before anything else: a FIFO
    there must not hang it, an alias not expand, another lock not pass for it; nothing is made."""
    from test_hostile_spec import bounded

    from toolkit.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "locks" / "x.runtime.conda-lock.yml"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "alias":
        path.write_text("a: &a [1, 2]\nb: [*a, *a]\n")
    else:
        shutil.copy(ROOT / "locks" / "py-cu130.conda-lock.yml", path)
    with bounded():
        assert main(["install", "x", "--runtime"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line, line
    assert not (tmp_path / ".envs").exists()

"""FlashAttention-4 (issue 16): the pinned wheels, their fetch/split/join, the install and its two traps.

Real data: the wheels of toolkit/knowledge/flash_attn_4.yaml as downloaded from PyPI by
scripts/fetch_fa4_wheels.sh into .whl-fa4/ (tests that need them skip where that folder is absent),
and a real Python 3.12 (the pinned wheels are cp312) where this machine has one. NOT real: the base
environment's torch, which the install test represents by its dist-info alone (name and version, all
the install reads); `import flash_attn.cute` itself needs torch + CUDA and is checked on the GPU machine
(scripts/gpu_fa4.sh); here `import cutlass`, the import that the .pth trap breaks, is run for real.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.cli import main
from toolkit.env import fa4_lock
from toolkit.env.install_record import Fa4Record
from toolkit.fa4 import install as fa4
from toolkit.fa4 import wheels as fa4_wheels
from toolkit.knowledge import fa4_pins

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
FETCHED = ROOT / ".whl-fa4"


def fetched(part: str) -> Path:
    """A part folder of FA4's pinned wheels; skipped without it, failed where FA_REQUIRE_FA4_WHEELS=1 (.ci/run
    fetches them)."""
    if not (FETCHED / part).is_dir():
        missing(f"needs {FETCHED / part}: run scripts/fetch_fa4_wheels.sh first", "FA_REQUIRE_FA4_WHEELS")
    return FETCHED / part


@pytest.fixture
def fetched_part1() -> Path:
    return fetched("part1")


def fetched_parts() -> list[Path]:
    """Every part folder scripts/fetch_fa4_wheels.sh cut (part1, part2, ...; their number is the split's)."""
    fetched("part1")
    return sorted((d for d in FETCHED.glob("part*") if d.name[4:].isdigit()), key=lambda d: int(d.name[4:]))


def fetched_wheel(prefix: str) -> Path:
    """The real wheel named `prefix`-*.whl, in whichever part folder the split put it."""
    return next(w for part in fetched_parts() for w in part.glob(f"{prefix}-*.whl"))


needs_wheels = pytest.mark.usefixtures("fetched_part1")


def _python312() -> str | None:
    """A Python 3.12 that runs (a pyenv shim may name one that is not active)."""
    candidates = [*map(str, Path("/root/.pyenv/versions").glob("3.12*/bin/python")), shutil.which("python3.12")]
    return next((c for c in candidates if c and subprocess.run([c, "-c", "pass"], capture_output=True).returncode == 0),
                None)


PY312 = _python312()


@pytest.fixture(scope="module")
def joined(tmp_path_factory) -> Path:
    """The carried part folders joined back into one wheel folder, as gpu_fa4.sh's install phase does."""
    dest = tmp_path_factory.mktemp("wheels")
    assert main(["fa4", "join", "--dest", str(dest), *map(str, fetched_parts())]) == 0
    return dest


def test_every_pin_is_exact_and_hash_pinned():
    rel = fa4_pins.release()
    assert rel.version == "4.0.0b40"
    for pin in rel.wheels:
        assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0 and pin.size > 0
        assert pin.file.startswith(pin.name.replace("-", "_") + "-" + pin.version + "-")
    assert {p.name: p.version for p in rel.wheels}["nvidia-cutlass-dsl"] == "4.8.1"


def test_the_cuda_major_picks_the_libs_flavor():
    rel = fa4_pins.release()
    names = {p.name for p in rel.wheels_for("13")}
    assert "nvidia-cutlass-dsl-libs-cu13" in names and "nvidia-cutlass-dsl-libs-cu12" not in names
    with pytest.raises(ToolkitError, match="no CUDA 11 flavor"):
        rel.wheels_for("11")


def test_an_unknown_release_is_one_line():
    with pytest.raises(ToolkitError, match=r"flash-attn-4 9\.9 is not in the knowledge \(known: 4\.0\.0b36"):
        fa4_pins.release("9.9")


def test_if_missing_wheels_are_left_out_when_the_python_has_them():
    rel = fa4_pins.release()
    planned = {p.name for p in fa4.plan(rel, "13", {"cuda-bindings": "13.0.3", "protobuf": "6.31.0"})}
    assert "cuda-bindings" not in planned and "protobuf" not in planned and "cuda-pathfinder" in planned
    assert "flash-attn-4" in planned


@pytest.mark.fa4_wheels
def test_an_old_present_distribution_gets_the_pinned_wheel(joined):
    """protobuf is installed only where missing, unless the python's copy is older than libs-base needs."""
    rel = fa4_pins.release()
    env = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64"}
    read = lambda pin: fa4.wheel_metadata(joined / pin.file)
    fine = {"torch": "2.11.0", "protobuf": "5.29.0", "typing-extensions": "4.15.0", "einops": "0.8.1",
            "cuda-bindings": "13.0.3", "cuda-pathfinder": "1.3.3"}
    assert "protobuf" not in {p.name for p in fa4.plan(rel, "13", fine, env, read)}
    old = {**fine, "protobuf": "3.20.3", "typing-extensions": "4.9.0"}
    chosen = {p.name for p in fa4.plan(rel, "13", old, env, read)}
    assert {"protobuf", "typing-extensions"} <= chosen and "cuda-bindings" not in chosen


@pytest.mark.fa4_wheels
@needs_wheels
def test_fetched_wheels_match_the_pins_and_each_carry_fits(joined):
    """Each part folder is one `run` carry: 64 MiB with the working tree (tracked and untracked files git does
    not ignore) laid beside it, measured here with os.stat."""
    rel = fa4_pins.release()
    for pin in rel.wheels_for("13"):
        fa4_wheels.check_wheel(joined / pin.file, pin)
        assert hashlib.sha256((joined / pin.file).read_bytes()).hexdigest() == pin.sha256
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum(os.stat(ROOT / name).st_size for name in listed if name and (ROOT / name).is_file())
    for part in fetched_parts():
        size = sum(os.stat(f).st_size for f in part.iterdir())
        assert size < 44 * 2 ** 20 and tree + size < 64 * 2 ** 20, (part, size, tree)
    assert gpu_fa4_carries() == [part.name for part in fetched_parts()]  # the GPU script carries each


def test_a_tampered_wheel_is_refused(tmp_path):
    pin = fa4_pins.release().wheels[1]
    (tmp_path / pin.file).write_bytes(b"x" * pin.size)
    with pytest.raises(ToolkitError, match="does not match the pin"):
        fa4_wheels.check_wheel(tmp_path / pin.file, pin)


def test_split_and_join_round_trip_and_a_damaged_part_is_caught(tmp_path):
    data = os.urandom(3 * 1000 + 7)
    (tmp_path / "big.whl").write_bytes(data)
    parts = fa4_wheels.split_file(tmp_path / "big.whl", tmp_path / "parts", part_bytes=1000)
    assert [p.name for p in parts] == [f"big.whl.part00{i}" for i in range(4)]
    manifest = tmp_path / "parts" / "big.whl.parts.json"
    assert fa4_wheels.join_parts(manifest, [tmp_path / "parts"], tmp_path / "out").read_bytes() == data
    parts[2].write_bytes(b"0" * 1000)
    with pytest.raises(ToolkitError, match="sha256 differs"):
        fa4_wheels.join_parts(manifest, [tmp_path / "parts"], tmp_path / "again")
    assert not (tmp_path / "again" / "big.whl").exists()
    parts[1].unlink()
    with pytest.raises(ToolkitError, match="part big.whl.part001 is in none of"):
        fa4_wheels.join_parts(manifest, [tmp_path / "parts"], tmp_path / "again")


@pytest.mark.fa4_wheels
@needs_wheels
def test_the_meta_package_requires_libs_cu12_and_libs_cu13_replaces_it(joined):
    """The trap from the H200: nvidia-cutlass-dsl's METADATA wants libs-cu12 even for CUDA 13."""
    rel = fa4_pins.release()
    pins = rel.wheels_for("13")
    metadata = [fa4.wheel_metadata(joined / p.file) for p in pins]
    available = {p.name: p.version for p in pins} | {"torch": "2.11.0"}
    env = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64",
           "platform_system": "Linux", "implementation_name": "cpython", "os_name": "posix"}
    unmet = fa4.unmet_requirements(metadata, available, {}, env)
    assert unmet == ["nvidia-cutlass-dsl: nvidia-cutlass-dsl-libs-cu12==4.8.1 (not installed and not pinned)"]
    assert fa4.unmet_requirements(metadata, available, {"nvidia-cutlass-dsl-libs-cu12": "libs-cu13"}, env) == []
    old_torch_dlpack = available | {"apache-tvm-ffi": "0.2.0"}
    assert any("apache-tvm-ffi<0.2" in line for line in
               fa4.unmet_requirements(metadata, old_torch_dlpack, {"nvidia-cutlass-dsl-libs-cu12": "x"}, env))


# FA4 beside flash-attn 2.x in one folder. The FA2 install is the package files of the real pinned sdist
# (what its setup.py's find_packages() puts in the wheel) with a RECORD as pip writes one; NOT real: the
# compiled flash_attn_2_cuda extension, absent here (no module of flash_attn/cute's neighbours imports it
# at file level; FA2's import itself is checked on the GPU machine, scripts/gpu_session.sh).
def install_fa2_files(sdist: Path, target: Path) -> Path:
    """Lay flash-attn 2.8.3.post2's package files into `target` as its wheel's install does; its dist-info."""
    import csv
    import hashlib
    import tarfile

    rows = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[1] if "/" in member.name else ""
            if member.isfile() and name.startswith("flash_attn/") and name.endswith(".py"):
                data = tar.extractfile(member).read()
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(data)
                rows.append([name, f"sha256={hashlib.sha256(data).hexdigest()}", str(len(data))])
    dist_info = target / "flash_attn-2.8.3.post2.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3.post2\n")
    with open(dist_info / "RECORD", "w", newline="") as handle:
        csv.writer(handle).writerows([*rows, ["flash_attn-2.8.3.post2.dist-info/METADATA", "", ""],
                                      ["flash_attn-2.8.3.post2.dist-info/RECORD", "", ""]])
    return dist_info


def fa4_wheel_files(dest: Path) -> Path:
    """The files of the real flash_attn_4 wheel, unpacked into a staging folder as pip would."""
    import zipfile

    wheel = fetched_wheel("flash_attn_4")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(dest)
    return dest


@needs_wheels
def test_fa4_takes_over_fa2s_cute_copy_and_fa2_keeps_the_rest(tmp_path, pinned_sdist):
    target = tmp_path / "site"
    dist_info = install_fa2_files(pinned_sdist, target)
    fa2_files = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*.py")}
    fa2_cute = {n for n in fa2_files if n.startswith("flash_attn/cute/")}
    assert len(fa2_cute) == fa4_pins.knowledge()["beside_flash_attn_2"]["2.8.3.post2"]["cute_files"]
    beside = fa4.flash_attn_2_beside(target)
    assert beside == fa4.Fa2Install("2.8.3.post2", dist_info)
    staging = fa4_wheel_files(tmp_path / "staging")
    fa4_cute = {p.relative_to(staging).as_posix(): p.read_bytes() for p in (staging / "flash_attn").rglob("*.py")}

    handed = fa4.hand_over_cute(beside)
    fa4.merge_into(staging, target)

    assert set(handed) == fa2_cute
    now = {p.relative_to(target).as_posix(): p.read_bytes() for p in (target / "flash_attn").rglob("*.py")}
    assert {n: b for n, b in now.items() if n.startswith("flash_attn/cute/")} == fa4_cute  # FA4's, whole, only
    assert all(now[n] == b for n, b in fa2_files.items() if n not in fa2_cute)  # FA2's own files untouched
    record = (dist_info / "RECORD").read_text()
    assert "flash_attn/cute/" not in record and "flash_attn/__init__.py" in record
    assert all((target / row.split(",")[0]).is_file() for row in record.splitlines())  # uninstall = FA2's only
    local = dist_info.rename(target / "flash_attn-2.8.3.post2+cu130torch2.11.dist-info")  # as the toolkit builds it
    assert fa4.flash_attn_2_beside(target) == fa4.Fa2Install("2.8.3.post2+cu130torch2.11", local)
    assert (target / "flash_attn_4-4.0.0b40.dist-info" / "RECORD").is_file()


def test_fa4_beside_an_unread_fa2_or_an_ownerless_package_is_refused(tmp_path):
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("__version__ = '2.8.3'\n")
    with pytest.raises(ToolkitError, match="that no flash-attn dist-info lists"):
        fa4.flash_attn_2_beside(tmp_path)
    (tmp_path / "flash_attn-2.8.3.dist-info").mkdir()
    (tmp_path / "flash_attn-2.8.3.dist-info" / "RECORD").write_text("flash_attn/__init__.py,,\n")
    with pytest.raises(ToolkitError, match="holds flash-attn 2.8.3, whose flash_attn/cute the knowledge has not"):
        fa4.flash_attn_2_beside(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["RECORD", "__init__.py", "flash_attn",
                                                          "flash_attn-2.8.3.dist-info"]  # nothing touched


@pytest.mark.fa4_wheels
def test_a_python_without_torch_is_refused_in_one_line(tmp_path, capsys, joined):
    python = tmp_path / "bare" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    code = main(["fa4", "install", "--wheels", str(joined), "--target", str(tmp_path / "t"), "--python", str(python)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "t").exists()


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_odd_targets_pythons_and_join_folders_are_one_line(tmp_path, capsys):
    (tmp_path / "a-file").write_text("mine\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    wheels = str(tmp_path / "wheels")
    for target in ("a-file", "dangling"):
        assert main(["fa4", "install", "--wheels", wheels, "--target", str(tmp_path / target)]) == 1
        assert "not a folder" in one_error_line(capsys)
    for python, says in (("/nonexistent/python", "cannot be run"), ("/bin/echo", "did not answer as a Python")):
        assert main(["fa4", "install", "--wheels", wheels, "--target", str(tmp_path / "t"), "--python", python]) == 1
        assert says in one_error_line(capsys)
    assert (tmp_path / "a-file").read_text() == "mine\n" and not (tmp_path / "t").exists()
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "w.whl.part000").write_bytes(b"abc")
    (parts / "w.whl.parts.json").write_text('{"file": "w.whl", "parts": ["w.whl.part000"]}')
    assert main(["fa4", "join", "--dest", str(tmp_path / "joined"), str(parts)]) == 1
    assert "not a readable parts manifest" in one_error_line(capsys)
    assert main(["fa4", "join", "--dest", str(tmp_path / "a-file"), str(parts)]) == 1
    assert "not a folder" in one_error_line(capsys)
    assert main(["fa4", "join", "--dest", str(tmp_path / "j"), str(tmp_path / "no-such-folder")]) == 1
    assert "not a folder of parts" in one_error_line(capsys)
    assert main(["fa4", "join", "--dest", str(tmp_path / "j"), str(tmp_path / "wheels-none")]) == 1
    assert "not a folder of parts" in one_error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert main(["fa4", "join", "--dest", str(tmp_path / "j"), str(tmp_path / "empty")]) == 1
    assert "no wheels and no parts manifests" in one_error_line(capsys) and not (tmp_path / "j").exists()


def tampered_lock(tmp_path: Path, edit) -> Path:
    """The committed lock with `edit` applied and its digest recomputed (the digest is a checksum, not a
    signature: anyone can recompute it)."""
    from toolkit.base.digest import sha256_json

    data = json.loads((ROOT / "locks" / "gpu-machine-fa4.fa4-lock.json").read_text())
    data.pop("digest")
    data = edit(data)
    if isinstance(data, dict):
        data["digest"] = sha256_json(data)
    path = tmp_path / "edited.fa4-lock.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edit", [
    lambda d: [1, 2],
    lambda d: {k: v for k, v in d.items() if k != "release"},
    lambda d: {**d, "release": ["4.0.0b36"]},
    lambda d: {**d, "wheels": None},
    lambda d: {**d, "wheels": [{"file": "a.whl"}]},
    lambda d: {**d, "cuda_major": 13},
], ids=["a-list", "no-release", "release-a-list", "wheels-null", "wheel-without-sha256", "cuda-major-a-number"])
def test_a_tampered_fa4_lock_with_a_recomputed_digest_is_one_line(tmp_path, capsys, edit):
    lock = tampered_lock(tmp_path, edit)
    assert main(["fa4", "install", "--lock", str(lock), "--wheels", str(tmp_path), "--target",
                 str(tmp_path / "t")]) == 1
    assert str(lock) in one_error_line(capsys)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda r, t: {**r, "python_path": [f"{t}\nLD_PRELOAD=/tmp/evil.so"]}, "not a plain absolute path"),
    (lambda r, t: {**r, "python_path": [f"{t}:/tmp/evil"]}, "not a plain absolute path"),
    (lambda r, t: {**r, "python_path": ["/etc"]}, "is outside"),
    (lambda r, t: {**r, "target": "/etc"}, "not this folder"),
    (lambda r, t: {**r, "python": "/bin/sh\n"}, "not a plain absolute path"),
], ids=["newline", "pathsep", "outside", "another-target", "python-newline"])
def test_env_refuses_an_edited_record_and_prints_nothing(tmp_path, capsys, edit, says):
    """`fa4 env` output is read by a shell as NAME=VALUE lines: no record value may add a line or an entry."""
    Fa4Record("4.0.0b36", "13", str(tmp_path), sys.executable, [], {}, fa4.python_path(tmp_path)).write(tmp_path)
    path = tmp_path / Fa4Record.FILE
    path.write_text(json.dumps(edit(json.loads(path.read_text()), tmp_path)))
    assert main(["fa4", "env", "--target", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


def python312_base(tmp_path: Path) -> Path:
    """A real Python 3.12 venv as the line's base python: torch a STAND-IN (dist-info metadata only, no code),
    typing_extensions and packaging the real pure-Python modules cutlass and the probe import."""
    if PY312 is None:
        missing("the pinned wheels are cp312 and this machine has no Python 3.12", "FA_REQUIRE_PYTHON312")
    venv = tmp_path / "py312"
    subprocess.run([PY312, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    import packaging
    import typing_extensions

    for name, version in (("torch", "2.11.0+cu130"), ("typing_extensions", "4.15.0")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    shutil.copy(typing_extensions.__file__, site)
    shutil.copytree(Path(packaging.__file__).parent, site / "packaging")
    return python


@pytest.mark.python312
@pytest.mark.fa4_wheels
def test_install_into_a_target_imports_cutlass_only_through_the_toolkit_path(tmp_path, joined):
    """A real --target install for a real Python 3.12; torch is a dist-info stand-in (see the module doc)."""
    python = python312_base(tmp_path)
    target = tmp_path / "fa4"
    record = fa4.install(fa4_pins.release(), "13", joined, target, str(python))
    assert "nvidia-cutlass-dsl-libs-cu13==4.8.1" in record.installed
    assert not any("libs-cu12" in name for name in record.installed)
    assert Fa4Record.read(target) == record  # written (atomically) as returned
    assert (target / "nvidia_cutlass_dsl_packages.pth").is_file()  # pip copies it; nothing processes it
    probe = [str(python), "-c", "import cutlass; print(cutlass.__version__)"]
    plain = subprocess.run(probe, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert plain.returncode != 0 and "No module named 'cutlass'" in plain.stderr  # the trap, reproduced
    fixed = subprocess.run(probe, capture_output=True, text=True, env={**os.environ, **record.env()})
    assert fixed.returncode == 0, fixed.stderr[-500:]
    assert fixed.stdout.strip() == "4.8.1"
    again = fa4.install(fa4_pins.release(), "13", joined, target, str(python))  # a rerun replaces, as --upgrade did
    assert again.installed == record.installed and not list(target.glob(".fa-envkit-tmp-*"))


@pytest.mark.python312
@pytest.mark.fa4_wheels
def test_install_beside_fa2_records_what_fa2_gave_way(tmp_path, joined, pinned_sdist):
    python = python312_base(tmp_path)
    target = tmp_path / "site"
    install_fa2_files(pinned_sdist, target)
    record = fa4.install(fa4_pins.release(), "13", joined, target, str(python))
    assert record.flash_attn_2 == "2.8.3.post2" and len(record.replaced_from_flash_attn_2) == 21
    assert json.loads((target / Fa4Record.FILE).read_text())["flash_attn_2"] == "2.8.3.post2"
    assert (target / "flash_attn" / "flash_attn_interface.py").is_file()
    assert "def flash_attn_varlen_func" in (target / "flash_attn" / "cute" / "interface.py").read_text()


def test_env_verb_prints_data_lines(tmp_path, capsys):
    Fa4Record("4.0.0b36", "13", str(tmp_path), sys.executable, [], {}, fa4.python_path(tmp_path)).write(tmp_path)
    assert main(["fa4", "env", "--target", str(tmp_path), "--cache-dir", str(tmp_path / "c")]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["PYTHONPATH"] == f"{tmp_path}:{tmp_path / 'nvidia_cutlass_dsl' / 'dsl_packages'}"
    assert lines["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert lines["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "c")


def test_env_without_an_install_is_one_line(tmp_path, capsys):
    assert main(["fa4", "env", "--target", str(tmp_path)]) == 1
    assert "unreadable install record" in capsys.readouterr().err


def gpu_fa4_carries() -> list[str]:
    """The part folders scripts/gpu_fa4.sh's header carries, one `carry` call each, in its order."""
    text = (ROOT / "scripts" / "gpu_fa4.sh").read_text()
    return re.findall(r'run\(command="bash scripts/gpu_fa4\.sh carry", carry=\["\.whl-fa4/(part\d+)"\]\)', text)


def test_gpu_script_is_valid_bash_and_names_its_carries(tmp_path):
    """The header's calls: one `carry` per part folder (part1, part2, ...), then `install`, and every phase its
    usage line names. Then the two phases run here (NO_GPU=1, this python): each part folder carry_split cut is
    carried alone in a call of its own, and the install phase's join gives back every file that was split."""
    script = ROOT / "scripts" / "gpu_fa4.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "fetch_fa4_wheels.sh")]).returncode == 0
    text = script.read_text()
    carries = gpu_fa4_carries()
    assert len(carries) >= 3 and carries == [f"part{index}" for index in range(1, len(carries) + 1)]
    assert 'run(command="bash scripts/gpu_fa4.sh install")' in text
    for phase in re.search(r"usage: \$0 ([\w|-]+)", text).group(1).split("|"):
        assert f'bash scripts/gpu_fa4.sh {phase}"' in text, phase

    wheels = [tmp_path / "a.whl", tmp_path / "big.whl"]
    wheels[0].write_bytes(os.urandom(300))
    wheels[1].write_bytes(os.urandom(5000))
    parts = fa4_wheels.carry_split(wheels, tmp_path / "split", limit=2500, part_bytes=1000)
    tree = tmp_path / "tree"  # the working tree a call lays out: the scripts, and the carried folder
    tree.mkdir()
    for name in ("scripts", "locks"):
        (tree / name).symlink_to(ROOT / name)
    env = {**os.environ, "STATE": str(tmp_path / "state"), "PY": sys.executable, "NO_GPU": "1",
           "PYTHONPATH": str(ROOT)}
    for part in parts:
        shutil.rmtree(tree / ".whl-fa4", ignore_errors=True)
        shutil.copytree(part, tree / ".whl-fa4" / part.name)
        env["OUT"] = str(tmp_path / f"out-{part.name}")
        done = subprocess.run(["bash", str(script), "carry"], cwd=tree, env=env, capture_output=True, text=True)
        assert done.returncode == 0 and f"{part.name}: " in done.stdout, done.stdout + done.stderr
    shutil.rmtree(tree / ".whl-fa4")
    env["OUT"] = str(tmp_path / "out-install")
    done = subprocess.run(["bash", str(script), "install"], cwd=tree, env=env, capture_output=True, text=True)
    assert re.search(r" join rc=0 ", (tmp_path / "state" / "results" / "steps.txt").read_text()), done.stdout
    for wheel in wheels:
        joined = tmp_path / "state" / "wheels" / "all" / wheel.name
        assert hashlib.sha256(joined.read_bytes()).digest() == hashlib.sha256(wheel.read_bytes()).digest()


def test_gpu_hold_refuses_to_poll_a_machine_that_did_not_start_its_pipeline(tmp_path):
    """A lent machine goes back 30 s after a call: the next call may reach a fresh one, which must say so at
    once instead of spending the hold polling for a pipeline that is not there."""
    script = ROOT / "scripts" / "gpu_hold.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for phase in ("carry", "fa4", "wait"):
        done = subprocess.run(["bash", str(script), phase], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "STATE": str(tmp_path / "state"), "OUT": str(tmp_path / "out")})
        assert done.returncode == 3 and "FRESH MACHINE" in done.stdout, (phase, done.stdout, done.stderr)


# ---------------------------------------------------------------- the line's FA4 lock
# Real data: PyPI's PEP 691 JSON for each pinned project, recorded 2026-12-01 (flash-attn-4's b40 file on 2026-12-05)
# and trimmed to the pinned files (tests/fixtures/fa4_pypi/<project>.json).
PYPI_FIXTURE = Path(__file__).parent / "fixtures" / "fa4_pypi"


def recorded_pypi(project: str) -> list[dict]:
    return json.loads((PYPI_FIXTURE / f"{project}.json").read_text())["files"]


def test_lock_pins_each_wheel_with_its_pypi_url_and_install_reads_it_back(tmp_path):
    from toolkit.spec.envspec import load_spec

    path = fa4_lock.write_fa4_lock(load_spec(ROOT / "envs" / "gpu-machine-fa4.yaml"), recorded_pypi, Workspace(locks=tmp_path))
    data = json.loads(path.read_text())
    assert path.name == "gpu-machine-fa4.fa4-lock.json" and data["cuda_major"] == "13"
    assert [w["name"] for w in data["wheels"]] == [p.name for p in fa4_pins.release().wheels_for("13")]
    assert all(w["url"].startswith("https://files.pythonhosted.org/") and w["url"].endswith(w["file"])
               for w in data["wheels"])
    assert fa4_lock.read_fa4_lock(path)[0].version == "4.0.0b40"
    assert path.read_text() == (ROOT / "locks" / path.name).read_text()  # the committed lock is this one
    data["wheels"][0]["version"] = "4.0.0b37"
    path.write_text(json.dumps(data))
    with pytest.raises(ToolkitError, match="edited after it was written"):
        fa4_lock.read_fa4_lock(path)


def test_lock_refuses_a_file_whose_index_hash_is_not_the_pin(tmp_path):
    from toolkit.spec.envspec import load_spec

    def replaced(project):
        files = recorded_pypi(project)
        if project == "quack-kernels":
            files = [{**files[0], "hashes": {"sha256": "0" * 64}}]
        return files

    with pytest.raises(ToolkitError, match="quack_kernels-0.6.5-py3-none-any.whl: the index's sha256 000000000000"):
        fa4_lock.write_fa4_lock(load_spec(ROOT / "envs" / "gpu-machine-fa4.yaml"), replaced, Workspace(locks=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_every_fact_in_the_knowledge_names_a_source_that_exists():
    data = fa4_pins.knowledge()
    refs = [*(f["source"] for f in data["features"].values()),
            *(h["source"] for h in data["head_dims"].values()),
            *(h["bwd"]["source"] for h in data["head_dims"].values() if "bwd" in h), *(t["source"] for t in data["targets"]),
            *(r["source"] for r in data["releases"].values())]
    assert refs and set(refs) <= set(data["sources"])
    assert all(len(text) > 40 for text in data["sources"].values())


@pytest.mark.parametrize("manifest", [{"file": "../escape.whl", "parts": ["a"]},
                                      {"file": "x.whl", "parts": ["/etc/passwd"]}, {"file": "x.whl"}, "not json"])
def test_a_hostile_parts_manifest_is_refused_and_nothing_is_written(tmp_path, manifest):
    path = tmp_path / "x.whl.parts.json"
    path.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    with pytest.raises(ToolkitError, match="parts manifest|plain file names"):
        fa4_wheels.join_parts(path, [tmp_path], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.whl").exists()


def test_fa2_installed_over_fa4_is_refused_before_pip_runs(tmp_path):
    """FA2 after FA4 in one --target: pip would swap the whole flash_attn/ folder and FA4's cute with it."""
    from toolkit.build.wheel_check import install_and_import

    (tmp_path / Fa4Record.FILE).write_text("{}")
    with pytest.raises(ToolkitError, match="holds flash-attn-4; pip --target would replace"):
        install_and_import(None, tmp_path / "flash_attn-2.8.3.post2-cp312-linux_x86_64.whl", [], tmp_path,  # type: ignore[arg-type]
                           tmp_path / "log")
    assert not (tmp_path / "log").exists()


def test_an_interrupted_join_leaves_no_partial_file(tmp_path, monkeypatch):
    """Ctrl-C in the middle of joining: the destination holds nothing, not a nameless half wheel."""
    (tmp_path / "big.whl").write_bytes(os.urandom(3000))
    fa4_wheels.split_file(tmp_path / "big.whl", tmp_path / "parts", part_bytes=1000)
    real_append = fa4_wheels._append

    def copy_then_interrupt(source, out, limit):
        real_append(source, out, limit)
        raise KeyboardInterrupt

    monkeypatch.setattr(fa4_wheels, "_append", copy_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        fa4_wheels.join_parts(tmp_path / "parts" / "big.whl.parts.json", [tmp_path / "parts"], tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_joined_wheel_is_readable_by_the_group_as_a_downloaded_one_is(tmp_path):
    (tmp_path / "big.whl").write_bytes(os.urandom(3000))
    fa4_wheels.split_file(tmp_path / "big.whl", tmp_path / "parts", part_bytes=1000)
    saved = os.umask(0o022)
    try:
        out = fa4_wheels.join_parts(tmp_path / "parts" / "big.whl.parts.json", [tmp_path / "parts"], tmp_path / "out")
    finally:
        os.umask(saved)
    assert out.stat().st_mode & 0o777 == 0o644


def folder_sizes(folders: list[Path]) -> list[int]:
    return [sum(os.stat(f).st_size for f in folder.iterdir()) for folder in folders]


def test_carry_split_cuts_as_many_folders_as_needed_each_under_the_limit(tmp_path):
    """Two small wheels and one cut into 5 chunks, 2500 bytes a folder: part1 = the small wheels + the first chunk,
    then the chunks in order, each chunk's folder with the manifest; every folder joined gives back each file."""
    wheels = [tmp_path / "a.whl", tmp_path / "b.whl", tmp_path / "big.whl"]
    for wheel, size in zip(wheels, (300, 300, 5000)):
        wheel.write_bytes(os.urandom(size))
    folders = fa4_wheels.carry_split(wheels, tmp_path / "carry", limit=2500, part_bytes=1000)
    assert [f.name for f in folders] == ["part1", "part2", "part3"]
    assert all(size < 2500 for size in folder_sizes(folders)), folder_sizes(folders)
    chunks = [sorted(f.name[len("big.whl."):] for f in folder.glob("big.whl.part0*")) for folder in folders]
    assert chunks == [["part000"], ["part001", "part002"], ["part003", "part004"]]
    assert {"a.whl", "b.whl"} < {f.name for f in folders[0].iterdir()}
    assert all((folder / "big.whl.parts.json").is_file() for folder in folders)
    out = tmp_path / "joined"
    assert main(["fa4", "join", "--dest", str(out), *map(str, folders)]) == 0
    for wheel in wheels:
        assert hashlib.sha256((out / wheel.name).read_bytes()).digest() == hashlib.sha256(wheel.read_bytes()).digest()


def test_a_carry_over_the_limit_keeps_the_folders_and_a_shorter_split_removes_the_stale_ones(tmp_path):
    big = tmp_path / "big.whl"
    big.write_bytes(os.urandom(5000))
    dest = tmp_path / "carry"
    folders = fa4_wheels.carry_split([big], dest, limit=2500, part_bytes=1000)
    assert [f.name for f in folders] == ["part1", "part2", "part3"]
    for other in ("all", "part2x", "partial"):  # not a split's folder: kept
        (dest / other).mkdir()
    before = {f: f.read_bytes() for folder in folders for f in folder.iterdir()}
    with pytest.raises(ToolkitError, match="over the"):  # one chunk and its manifest are over 900 bytes
        fa4_wheels.carry_split([big], dest, limit=900, part_bytes=1000)
    assert {f: f.read_bytes() for folder in folders for f in folder.iterdir()} == before
    assert [f.name for f in fa4_wheels.carry_split([big], dest, limit=6000, part_bytes=3000)] == ["part1"]
    assert sorted(p.name for p in dest.iterdir()) == ["all", "part1", "part2x", "partial"]
    out = tmp_path / "joined"
    assert main(["fa4", "join", "--dest", str(out), str(dest / "part1")]) == 0
    assert hashlib.sha256((out / "big.whl").read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()


def _stand_in_pip(tmp_path: Path, payload: bytes, name: str) -> list[str]:
    """A `pip download` stand-in (NOT pip): writes `payload` as `name` into --dest, as pip would."""
    script = tmp_path / "pip_stand_in.py"
    script.write_text("import sys\nfrom pathlib import Path\nargs = sys.argv[1:]\n"
                      f"Path(args[args.index('--dest') + 1], {name!r}).write_bytes({payload!r})\n")
    return [sys.executable, str(script)]


def test_fetch_publishes_only_a_wheel_matching_its_pin(tmp_path):
    import hashlib

    good = b"wheel bytes"
    pin = fa4_pins.WheelPin("demo", "1.0", "demo-1.0-py3-none-any.whl", hashlib.sha256(good).hexdigest(), len(good),
                        cuda="12", replaces="demo-cu12")
    rel = fa4_pins.Release("1.0", "3.12", 80, ("80",), ("12",), "2.9", (pin,), ())
    dest = tmp_path / "wheels"
    with pytest.raises(ToolkitError, match="does not match the pin"):
        fa4_wheels.fetch(rel, "12", dest, pip=_stand_in_pip(tmp_path, b"tampered!!!", pin.file))
    assert list(dest.iterdir()) == []
    assert fa4_wheels.fetch(rel, "12", dest, pip=_stand_in_pip(tmp_path, good, pin.file)) == [dest / pin.file]
    assert [p.name for p in dest.iterdir()] == [pin.file] and (dest / pin.file).read_bytes() == good


def test_fetch_beside_another_release_leaves_out_the_wheels_it_carries(tmp_path):
    """`toolkit fa4 fetch --beside`: only the wheels the other release's carried folders lack are downloaded."""
    import hashlib

    own, shared = b"own wheel", b"shared wheel"
    pins = [fa4_pins.WheelPin(name, "1.0", f"{name}-1.0-py3-none-any.whl", hashlib.sha256(data).hexdigest(), len(data),
                              cuda="12", replaces=f"{name}-cu12") for name, data in (("own", own), ("shared", shared))]
    rel = fa4_pins.Release("1.0", "3.12", 80, ("80",), ("12",), "2.9", tuple(pins), ())
    dest = tmp_path / "beside"
    got = fa4_wheels.fetch(rel, "12", dest, pip=_stand_in_pip(tmp_path, own, pins[0].file), leave_out={pins[1].file})
    assert got == [dest / pins[0].file] and [p.name for p in dest.iterdir()] == [pins[0].file]


@needs_wheels
def test_fa2_installed_into_an_env_holding_fa4_gives_fa4_its_files_back(tmp_path, pinned_sdist):
    """A locked line's prefix gets FA4 from the lock's pip layer, then the build pip-installs FA2 over it, which
    writes FA2's old flash_attn/cute over FA4's. The real FA4 wheel (pure Python) in a real venv; FA2 is the
    real pinned sdist's package files laid in as its wheel's install writes them (see install_fa2_files)."""
    import hashlib
    import zipfile

    wheel = fetched_wheel("flash_attn_4")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = str(env / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    install_fa2_files(pinned_sdist, site)  # FA2's pip install: its cute copy now sits where FA4's files were
    with zipfile.ZipFile(wheel) as archive:
        fa4_cute = {n: archive.read(n) for n in archive.namelist() if n.startswith("flash_attn/cute/")}
    assert any((site / n).read_bytes() != b for n, b in fa4_cute.items())  # FA4 is broken now

    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    handed = fa4.restore_after_flash_attn_2(python, wheel.as_uri(), sha, tmp_path / "build.log")

    assert len(handed) == 21
    now = {p.relative_to(site).as_posix(): p.read_bytes() for p in (site / "flash_attn" / "cute").rglob("*.py")}
    assert now == {n: b for n, b in fa4_cute.items() if n.endswith(".py")}  # FA4's cute, whole and only
    assert (site / "flash_attn" / "__init__.py").read_text().startswith('__version__ = "2.8.3.post2"')
    assert "flash_attn/cute/" not in (site / "flash_attn-2.8.3.post2.dist-info" / "RECORD").read_text()
    with pytest.raises(ToolkitError, match="could not be reinstalled"):
        fa4.restore_after_flash_attn_2(python, wheel.as_uri(), "0" * 64, tmp_path / "build.log")  # wrong pin


@pytest.mark.parametrize("linked", ["flash_attn/cute", "flash_attn/cute/sub"])
def test_the_hand_over_never_removes_files_through_a_symlinked_folder(tmp_path, linked):
    """FA2's RECORD names a file under flash_attn/cute; with cute, or a folder inside it, a symlink to another
    folder, nothing there is deleted and the RECORD is left as it was."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.py").write_text("precious\n")
    site = tmp_path / "site"
    (site / linked).parent.mkdir(parents=True)
    (site / "flash_attn" / "__init__.py").write_text("")
    (site / linked).symlink_to(elsewhere)
    dist_info = site / "flash_attn-2.8.3.post2.dist-info"
    dist_info.mkdir()
    record = f"flash_attn/__init__.py,,\n{linked}/x.py,,\n"
    (dist_info / "RECORD").write_text(record)
    with pytest.raises(ToolkitError, match="reached through a symlink"):
        fa4.hand_over_cute(fa4.Fa2Install("2.8.3.post2", dist_info))
    assert (elsewhere / "x.py").read_text() == "precious\n" and (dist_info / "RECORD").read_text() == record


@pytest.mark.parametrize("swapped", ["flash_attn", "flash_attn/cute"])
def test_a_folder_swapped_for_a_symlink_after_the_hand_over_checked_it_deletes_nothing_outside(
        tmp_path, monkeypatch, swapped):
    """The check that no RECORD path passes through a symlink runs first; a folder swapped for a symlink to
    another folder right after it (the last call of the check does the swap) stops the hand-over in one line
    and the other folder's files, named as FA2's cute files are, are all still there."""
    elsewhere = tmp_path / "elsewhere"
    site = tmp_path / "site"
    for root in (site, elsewhere):
        (root / "flash_attn" / "cute" / "__pycache__").mkdir(parents=True)
        (root / "flash_attn" / "cute" / "x.py").write_text("precious\n")
        (root / "flash_attn" / "cute" / "__pycache__" / "x.cpython-312.pyc").write_text("precious\n")
    dist_info = site / "flash_attn-2.8.3.post2.dist-info"
    dist_info.mkdir()
    (dist_info / "RECORD").write_text("flash_attn/__init__.py,,\nflash_attn/cute/x.py,,\n")
    real_check = fa4._through_link

    def check_then_swap(root, name):
        answer = real_check(root, name)
        (site / swapped).rename(tmp_path / "moved-away")
        (site / swapped).symlink_to(elsewhere / swapped)
        return answer

    monkeypatch.setattr(fa4, "_through_link", check_then_swap)
    with pytest.raises(ToolkitError, match="a symlink or not a folder"):
        fa4.hand_over_cute(fa4.Fa2Install("2.8.3.post2", dist_info))
    assert sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*") if p.is_file()) == [
        "flash_attn/cute/__pycache__/x.cpython-312.pyc", "flash_attn/cute/x.py"]


def pip_target(wheels: list[Path], dest: Path) -> Path:
    """What `toolkit fa4 install` stages: pip's --target install of real pinned wheels (pure ones, so this
    python's pip installs them)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                    "--ignore-requires-python", "--target", str(dest), *map(str, wheels)], check=True)
    return dest


@needs_wheels
def test_an_install_replaces_only_what_an_earlier_install_wrote(tmp_path):
    wheels = [fetched_wheel(name) for name in ("flash_attn_4", "einops")]
    staging = pip_target(wheels, tmp_path / "staging")
    target = pip_target(wheels, tmp_path / "target")  # the earlier install of the same wheels
    rel = fa4_pins.release()
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, rel, None)) == []
    (target / "einops" / "mine.py").write_text("a user's file\n")
    (target / "flash_attn" / "cute" / "notes").mkdir()
    (target / "flash_attn" / "cute" / "notes" / "todo.txt").write_text("mine\n")
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, rel, None)) == [
        "einops/mine.py", "flash_attn/cute/notes/todo.txt"]


@needs_wheels
def test_a_users_files_of_the_same_names_are_foreign_and_console_scripts_are_owned(tmp_path):
    """pip --target writes a console script's RECORD row as ../../bin/NAME (apache-tvm-ffi 0.1.15.post2's real
    RECORD: `../../bin/tvm-ffi-config,sha256=g2rW79G5...,233`) and moves it to TARGET/bin/NAME."""
    staging = pip_target([fetched_wheel("einops")], tmp_path / "staging")
    (staging / "bin").mkdir()
    (staging / "bin" / "tvm-ffi-config").write_text("#!/bin/sh\n")
    target = tmp_path / "target"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "tvm-ffi-config").write_text("#!/bin/sh\n")
    (target / "einops").mkdir()
    (target / "einops" / "__init__.py").write_text("someone else's einops\n")
    rel = fa4_pins.release()
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, rel, None)) == [
        "bin/tvm-ffi-config", "einops/__init__.py"]
    dist_info = target / "apache_tvm_ffi-0.1.15.post2.dist-info"
    dist_info.mkdir()
    (dist_info / "RECORD").write_text("../../bin/tvm-ffi-config,sha256=g2rW79G5or37hxv8XmJFaQ5S-CmP_CUm2JG2QrFa0dY,233\n")
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, rel, None)) == ["einops/__init__.py"]


@needs_wheels
def test_beside_fa2_only_its_recorded_cute_files_are_owned(tmp_path, pinned_sdist):
    staging = pip_target([fetched_wheel("flash_attn_4")], tmp_path / "staging")
    target = tmp_path / "site"
    install_fa2_files(pinned_sdist, target)
    beside = fa4.flash_attn_2_beside(target)
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, fa4_pins.release(), beside)) == []
    (target / "flash_attn" / "cute" / "user_extra.py").write_text("mine\n")
    assert fa4.foreign_entries(staging, target, fa4.owned_paths(target, fa4_pins.release(), beside)) == [
        "flash_attn/cute/user_extra.py"]
    (target / "flash_attn" / "cute" / "user_extra.py").unlink()
    moved = tmp_path / "flash_attn-real"
    (target / "flash_attn").rename(moved)
    (target / "flash_attn").symlink_to(moved)
    assert fa4.foreign_entries(staging, target, set()) == ["flash_attn (a symlink)"]


@pytest.mark.python312
@pytest.mark.fa4_wheels
def test_install_into_a_folder_with_a_users_files_of_the_same_name_changes_nothing(tmp_path, joined):
    python = python312_base(tmp_path)
    target = tmp_path / "site"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "my-tool").write_text("precious\n")
    (target / "notes.txt").write_text("kept\n")
    before = sorted(p.relative_to(target).as_posix() for p in target.rglob("*"))
    with pytest.raises(ToolkitError, match="would replace 1 file.*bin/my-tool .*nothing was changed"):
        fa4.install(fa4_pins.release(), "13", joined, target, str(python))
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == before
    assert (target / "bin" / "my-tool").read_text() == "precious\n"


def test_a_release_missing_a_field_is_one_line_naming_the_file(tmp_path):
    """A knowledge entry without `min_arch` (hand-edited) is one line naming the file and the field."""
    import yaml

    data = yaml.safe_load(fa4_pins.KNOWLEDGE_FILE.read_text())
    del data["releases"][fa4_pins.DEFAULT_RELEASE]["min_arch"]
    edited = tmp_path / "flash_attn_4.yaml"
    edited.write_text(yaml.safe_dump(data))
    with pytest.raises(ToolkitError, match=r"flash_attn_4.yaml: min_arch: missing"):
        fa4_pins.release(fa4_pins.DEFAULT_RELEASE, edited)


def test_a_line_with_fa4_instead_of_fa2_builds_nothing_and_says_how_to_install_fa4(tmp_path, capsys, monkeypatch):
    """envs/gpu-machine-fa4.yaml says `flash_attn_4.with_flash_attn_2: false` (its line 7): `toolkit build` compiles
    no flash-attn 2.x for it (20 minutes of a wheel the line does not want) and names FA4's own install."""
    lines = (ROOT / "envs" / "gpu-machine-fa4.yaml").read_text().splitlines()
    assert lines[6].strip() == "with_flash_attn_2: false"
    monkeypatch.chdir(ROOT)  # paths are shown relative to the working directory
    code = main(["build", "gpu-machine-fa4", "--envs", "envs", "--locks", "locks",
                 "--wheelhouse", str(tmp_path / "wheelhouse")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [
        "error: envs/gpu-machine-fa4.yaml:7: line gpu-machine-fa4 builds no wheel "
        "(flash_attn_4.with_flash_attn_2: false: FlashAttention-4 instead of flash-attn 2.x); install FA4 with "
        "`toolkit fa4 install --lock locks/gpu-machine-fa4.fa4-lock.json`"]
    assert not (tmp_path / "wheelhouse").exists()

"""`toolkit modules` under the real module systems: Lmod (Lua tree) and Environment Modules (Tcl tree).

The fixture environment is real enough to load and import from: a `python -m venv` prefix (so its
bin/python finds its own site-packages) carrying conda-meta records and a tiny `flash_attn` package
with its dist-info, as `pip install` leaves it. The lock is a conda-lock file sealed with the lock
stage's own digest; the build record is the build stage's JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from module_systems import MISSING, SYSTEMS

import toolkit.cli
from toolkit.build.record import (
    RECORD_SUFFIX,
    BuildInputs,
    BuildOutputs,
    BuildRecord,
    Parallelism,
    Toolchain,
)
from toolkit.env.lockfile import KEY_DIGEST, LockedSdist, lock_digest
from toolkit.spec.envspec import load_spec, spec_paths

pytestmark = pytest.mark.lmod

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "modules"
FA_VERSION = "2.8.3.post2"
CU126_BUILD = f"{FA_VERSION}+cu126torch2.9"  # the build stage tags each wheel with its line (local version)
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
PY_FULL = f"{PY}.{sys.version_info.micro}"


# ---------------------------------------------------------------- fixtures on disk


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def add_dist(site: Path, name: str, version: str, *, package: bool = False) -> None:
    """What `pip install` leaves: NAME-VERSION.dist-info/METADATA (and, for flash_attn, the package, whose
    __version__ is the public version: the build's local tag is only in the wheel's metadata)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"Home-page: https://github.com/Dao-AILab/flash-attention\n")
    if package:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f'__version__ = "{version.split("+")[0]}"\n')


def make_prefix(prefix: Path, python: str, *, venv: bool, torch: str = "2.9.1") -> Path:
    """A conda-style prefix with flash-attn installed. venv=True makes bin/python a real interpreter."""
    if venv:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = prefix / "lib" / f"python{python[:python.rindex('.')]}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for name, version in (("python", python), ("cuda-nvcc", "12.6.85"), ("cuda-version", "12.6")):
        write_json(prefix / "conda-meta" / f"{name}-{version}-0.json", {"name": name, "version": version,
                                                                        "build": "0"})
    add_dist(site, "torch", torch)
    add_dist(site, "flash_attn", CU126_BUILD, package=True)
    (prefix / "share" / "man" / "man1").mkdir(parents=True)
    return prefix


def seal_lock(path: Path, line: str, kind: str) -> None:
    """A conda-lock file with the lock stage's custom metadata, sealed with its digest."""
    document = {
        "version": 1,
        "metadata": {
            "content_hash": {"linux-64": "ab" * 32},
            "channels": [{"url": "conda-forge", "used_env_vars": []}],
            "platforms": ["linux-64"],
            "sources": [f"envs/{line}.yaml"],
            "custom_metadata": {
                "fa-envkit.line": line, "fa-envkit.input-hash": "cd" * 32, "fa-envkit.toolchain-kind": kind,
                "fa-envkit.flash-attn-sdist.url": f"https://files.pythonhosted.org/flash_attn-{FA_VERSION}.tar.gz",
                "fa-envkit.flash-attn-sdist.filename": f"flash_attn-{FA_VERSION}.tar.gz",
                "fa-envkit.flash-attn-sdist.sha256": "ef" * 32,
            },
        },
        "package": [],
    }
    document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))


def write_build_record(wheelhouse: Path, line: str, python: str, version: str = CU126_BUILD,
                       **outputs: str) -> Path:
    """A build record beside its wheel (wheelhouse/<line>/<wheel>.build.json), made through BuildRecord."""
    tag = "cp" + python.replace(".", "")
    wheel = f"flash_attn-{version}-{tag}-{tag}-linux_x86_64.whl"
    record = BuildRecord(
        inputs_key="56" * 32,
        inputs=BuildInputs(recipe=2, line=line, spec_input_hash="34" * 32, archs=["80", "90"], local_version="",
                           toolchain=Toolchain(kind="locked", cuda_home=None, nvcc="12.6", cxx=None, gcc="13.3.0",
                                               python=None, python_version=None, torch="2.9.1+cu126", torch_cuda=None,
                                               cxx11_abi=True, ninja=None)),
        files={"spec": f"envs/{line}.yaml", "lock": f"locks/{line}.conda-lock.yml"},
        sdist=LockedSdist(filename="flash_attn-2.8.3.post2.tar.gz", sha256="ef" * 32,
                       url="https://files.pythonhosted.org/packages/flash_attn-2.8.3.post2.tar.gz"),
        environment={"FLASH_ATTN_CUDA_ARCHS": "80;90"}, parallelism=Parallelism(4, 1, 4, 16.0, 4.5, "4 jobs"),
        outputs=replace(BuildOutputs(wheel=wheel, version=version, wheel_sha256="12" * 32, wheel_size=62700000,
                                     modules=["flash_attn_2_cuda"], archs_compiled={"flash_attn_2_cuda": ["80", "90"]},
                                     imported=True, wall_s=600.0, efficiency={}), **outputs),
        fingerprint={}, log=f"wheelhouse/{line}/logs/build.log",
        started="2026-11-29T11:50:00+00:00", finished="2026-11-29T12:00:00+00:00")
    path = wheelhouse / line / (wheel + RECORD_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.text())
    return path


SITE_SPEC = """\
extends: cu130
description: Site GPU nodes (CUDA 13.0 module, torch in a venv)
python: "{python}"
torch:
  version: "2.11.0+cu130"
archs: ["90"]
toolchain:
  kind: external
  cuda_home: {cuda_home}
  python_executable: {python_executable}
  nvcc: "13.0"
  gcc: 14
  python: "{python}"
  torch: "2.11.0+cu130"
  cxx11_abi: true
  modules: [cuda/13.0]
"""

SITE_CUDA_MODULES = {
    # A site's CUDA modules, in Tcl so that both systems read them (setenv and prepend-path only: Lmod 8.6
    # mishandles a Tcl pushenv). cuda/12.6 sets CUDA_HOME, as site modules do, for the restore test.
    "cuda/12.6": "#%Module1.0\nsetenv CUDA_HOME /site/cuda-12.6\nprepend-path PATH /site/cuda-12.6/bin\n",
    "cuda/13.0": "#%Module1.0\nsetenv SITE_CUDA_LOADED 13.0\nprepend-path PATH /site/cuda-13.0/bin\n",
}


class Project:
    """A project directory (envs/, .envs/, locks/, wheelhouse/) in tmp_path, used from inside it."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture, *, venv: bool, python: str = PY_FULL):
        self.root = root
        self.capsys = capsys
        self.envs = root / "envs"
        shutil.copytree(REPO / "envs", self.envs)
        self.prefix = make_prefix(root / ".envs" / "cu126", python, venv=venv)
        seal_lock(root / "locks" / "cu126.conda-lock.yml", "cu126", "locked")
        write_build_record(root / "wheelhouse", "cu126", python[:python.rindex(".")])
        self.modules = root / "modulefiles"
        self.site_modules = root / "site-modules"
        for name, text in SITE_CUDA_MODULES.items():
            (self.site_modules / name).parent.mkdir(parents=True, exist_ok=True)
            (self.site_modules / name).write_text(text)
        self.venv: Path | None = None

    def add_external_line(self) -> Path:
        """envs/site.yaml: an external toolchain (a venv with torch) built against the site's cuda/13.0."""
        self.venv = self.root / "site-venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        site = self.venv / "lib" / f"python{PY}" / "site-packages"
        add_dist(site, "torch", "2.11.0+cu130")
        add_dist(site, "flash_attn", f"{FA_VERSION}+cu130torch2.11", package=True)
        (self.envs / "site.yaml").write_text(SITE_SPEC.format(
            python=PY, cuda_home=self.root / "site-cuda", python_executable=self.venv / "bin" / "python"))
        return self.venv

    def toolkit(self, *args: str) -> tuple[int, str]:
        """`toolkit ARGS` in the project directory: (exit code, stdout + stderr)."""
        code = toolkit.cli.main(list(args))
        out = self.capsys.readouterr()
        return code, out.out + out.err

    def publish(self, *args: str) -> str:
        code, output = self.toolkit("modules", "--root", str(self.modules), *args)
        assert code == 0, output
        return output

    def tree(self, system) -> Path:
        return self.modules / system.tree


def module_of(cuda_tag: str, torch_minor: str, python: str = PY) -> str:
    """The default naming scheme, as the issue spells it: flash-attn/VERSION-cuXYZ-torchX.Y-pyXY."""
    return f"flash-attn/{FA_VERSION}-{cuda_tag}-torch{torch_minor}-py{python.replace('.', '')}"


CU126 = module_of("cu126", "2.9")
SITE = module_of("cu130", "2.11")

# Variables the module systems keep for themselves (loaded list, reference counts, saved tables).
BOOKKEEPING = re.compile(r"_ModuleTable\w*|__LMOD_\w+|__MODULES_\w+|_LMFILES_|LOADEDMODULES|_")


def environment(dump: Path) -> dict[str, str]:
    """An `env -0` dump, minus the module systems' own bookkeeping."""
    pairs = (entry.split("=", 1) for entry in dump.read_text().split("\0") if "=" in entry)
    return {name: value for name, value in pairs if not BOOKKEEPING.fullmatch(name)}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Project:
    monkeypatch.chdir(tmp_path)
    return Project(tmp_path, capsys, venv=True)


@pytest.fixture(params=sorted(SYSTEMS))
def system(request: pytest.FixtureRequest):
    found = SYSTEMS[request.param]()
    if found is None:
        pytest.skip(MISSING[request.param])
    return found


# ---------------------------------------------------------------- the files


def normalized(text: str, project: Project) -> str:
    """What does not depend on this machine: the tmp dir, and for the external line this python."""
    text = text.replace(str(project.root), "/PROJECT")
    for spec in spec_paths(project.envs):  # input hashes change whenever envs/ does
        text = text.replace(load_spec(spec).input_hash(), f"<{spec.name} input sha256>")
    if project.venv:
        text = text.replace(PY_FULL, "<X.Y.Z>")
        text = text.replace(f"py{PY.replace('.', '')}", "py<XY>").replace(PY, "<X.Y>")
    return text


def golden_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, *, external: bool) -> Project:
    """cu126 from a prefix with a fixed python (no interpreter needed to write it), or the external line."""
    monkeypatch.chdir(tmp_path)
    project = Project(tmp_path, capsys, venv=False, python="3.12.8")
    if external:
        project.add_external_line()
    return project


@pytest.mark.parametrize("line", ["cu126", "site"])
def test_golden_files(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    project = golden_project(tmp_path, monkeypatch, capsys, external=line == "site")
    project.publish(line, "--default", line)
    name = module_of("cu126", "2.9", "3.12") if line == "cu126" else SITE
    written = {
        f"{line}.lua": project.modules / "lmod" / f"{name}.lua",
        f"{line}.tcl": project.modules / "tcl" / name,
        f"{line}.modulerc.lua": project.modules / "lmod" / "flash-attn" / ".modulerc.lua",
        f"{line}.modulerc": project.modules / "tcl" / "flash-attn" / ".modulerc",
    }
    for golden_name, path in written.items():
        text = normalized(path.read_text(), project)
        golden = GOLDEN / golden_name
        if os.environ.get("UPDATE_GOLDEN"):
            golden.write_text(text)
        assert text == golden.read_text(), f"{path} differs from {golden} (UPDATE_GOLDEN=1 rewrites it)"


def test_same_inputs_same_bytes_safe_modes(project: Project) -> None:
    project.add_external_line()
    project.publish("--default", "cu126")
    first = {p: p.read_bytes() for p in sorted(project.modules.rglob("*"), key=str) if p.is_file()}
    project.publish("--default", "cu126")
    second = {p: p.read_bytes() for p in sorted(project.modules.rglob("*"), key=str) if p.is_file()}
    assert first == second and len(first) == 6  # 2 lines x 2 formats + 2 default markers; no temp files left
    for path in project.modules.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path}: {oct(mode)}"


def test_site_options_prereq_and_ld_library_path(project: Project) -> None:
    elsewhere = project.root / "sw" / "fa-cu126"
    shutil.copytree(project.prefix, elsewhere, symlinks=True)
    project.publish("cu126", "--prefix", str(elsewhere), "--prereq", "gcc/13.3", "--prereq-style", "prereq",
                    "--ld-library-path")
    lua = (project.modules / "lmod" / f"{CU126}.lua").read_text()
    tcl = (project.modules / "tcl" / CU126).read_text()
    assert 'prereq("gcc/13.3")' in lua and 'prereq "gcc/13.3"' in tcl
    assert f'prepend_path("LD_LIBRARY_PATH", "{elsewhere}/lib")' in lua
    assert f'pushenv("FLASH_ATTN_ROOT", "{elsewhere}")' in lua and str(project.prefix) + "/" not in lua
    code, output = project.toolkit("modules", "--root", str(project.modules), "--prefix", str(elsewhere))
    assert code == 1 and output.startswith("error: --prefix:")


def test_lines_without_an_install_are_skipped_or_refused(project: Project) -> None:
    output = project.publish()
    assert f"wrote {project.modules / 'lmod' / CU126}.lua" in output
    assert "skipped cu128:" in output and "toolkit install cu128" in output
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu128")
    assert code == 1 and output.startswith("error: ") and "toolkit install cu128" in output


def test_flash_attn_missing_from_the_prefix_is_reported(project: Project) -> None:
    shutil.rmtree(next(project.prefix.glob("lib/python*/site-packages/flash_attn-*.dist-info")))
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126")
    assert code == 1 and "flash-attn is not installed" in output and "wheelhouse/cu126/" in output


def test_two_lines_with_one_name_are_refused(project: Project) -> None:
    project.add_external_line()
    code, output = project.toolkit("modules", "--root", str(project.modules), "--naming", "flash-attn/{flash_attn}")
    assert code == 1 and "both give flash-attn/2.8.3.post2" in output and "{line}" in output
    assert not project.modules.exists()


def test_help_shows_the_build_of_the_installed_wheel_only(project: Project) -> None:
    """Records of other builds of the line (another local tag) are not the installed wheel's story."""
    other = write_build_record(project.root / "wheelhouse", "cu126", PY, version=f"{FA_VERSION}+cu126torch2.8",
                               wheel_sha256="56" * 32)
    project.publish("cu126", "--format", "lmod")
    text = (project.modules / "lmod" / f"{CU126}.lua").read_text()
    assert "wheel sha256 " + "12" * 32 in text and "56" * 32 not in text
    for record in other.parent.glob(f"*{RECORD_SUFFIX}"):
        if record != other:
            record.unlink()
    project.publish("cu126", "--format", "lmod")
    text = (project.modules / "lmod" / f"{CU126}.lua").read_text()
    assert f"Build:        no record in {project.root}/wheelhouse/cu126 of building flash-attn {CU126_BUILD}" in text


def test_tampered_lock_is_refused(project: Project) -> None:
    lock = project.root / "locks" / "cu126.conda-lock.yml"
    lock.write_text(lock.read_text().replace("cd" * 32, "ee" * 32))
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126")
    assert code == 1 and "cu126.conda-lock.yml: edited after locking" in output


# ---------------------------------------------------------------- injection


INJECTIONS = {
    # spec field -> (a YAML line overriding it in a spec extending cu126/site, where the error must point)
    "description": ('description: x"); os.execute("touch /tmp/pwned") --', "description"),
    "toolchain.modules": ('  modules: [\'cuda/13.0"]; exec touch /tmp/pwned; #\']', "toolchain.modules"),
    "toolchain.cuda_home": ("  cuda_home: /usr/local/cuda$(touch /tmp/pwned)", "toolchain.cuda_home"),
    "toolchain.python_executable": ('  python_executable: "/usr/bin/python3\\n]]"', "toolchain.python_executable"),
}


@pytest.mark.parametrize("field", sorted(INJECTIONS))
def test_injected_spec_value_is_rejected(field: str, project: Project) -> None:
    project.add_external_line()
    yaml_line, named = INJECTIONS[field]
    spec = project.envs / "site.yaml"
    lines = spec.read_text().splitlines()
    key = yaml_line.split(":")[0]
    spec.write_text("\n".join(yaml_line if line.startswith(key) else line for line in lines) + "\n")
    code, output = project.toolkit("modules", "--root", str(project.modules), "site")
    assert code == 1, output
    assert output.startswith("error: envs/site.yaml:") and re.search(rf": {re.escape(named)}(\[\d+\])?: ", output), output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert not project.modules.exists()  # nothing half-written


@pytest.mark.parametrize("args, named", [
    (("--naming", 'flash-attn/{flash_attn}"); os.exit(1) --'), "--naming: module version"),
    (("--naming", "../../etc/{line}"), "--naming: module name"),
    (("--naming", "flash-attn/{nvcc}"), "--naming: bad placeholder"),
    (("--prereq", "gcc/13; rm -rf ~"), "--prereq: site module"),
])
def test_injected_option_is_rejected(args: tuple[str, ...], named: str, project: Project) -> None:
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126", *args)
    assert code == 1 and output.startswith(f"error: {named}"), output
    assert not project.modules.exists()


def test_injected_installed_metadata_is_rejected(project: Project) -> None:
    """What is installed is input too: a package version must not carry code into the modulefile."""
    metadata_file = next(project.prefix.glob("lib/python*/site-packages/flash_attn-*.dist-info/METADATA"))
    metadata_file.write_text(metadata_file.read_text().replace(f"Version: {CU126_BUILD}",
                                                               'Version: 2.8.3"); os.execute("id'))
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126")
    assert code == 1 and "site-packages: flash-attn version" in output, output
    assert not project.modules.exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_installed_metadata_that_is_no_file_is_refused_without_reading_it(project: Project, kind: str) -> None:
    """torch's METADATA as a FIFO hung `toolkit modules` (nobody writes it); as a link to /dev/zero it would
    fill memory. Either is one line naming the file; the command is waited for in a thread, so a hang fails."""
    metadata_file = next(project.prefix.glob("lib/python*/site-packages/torch-*.dist-info/METADATA"))
    metadata_file.unlink()
    if kind == "fifo":
        os.mkfifo(metadata_file)
    else:
        metadata_file.symlink_to("/dev/zero")
    done: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: done.append(project.toolkit("modules", "--root", str(project.modules),
                                                                         "cu126")), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "toolkit modules did not return within 60 s"
    shown = metadata_file.relative_to(project.root)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert done[0] == (1, f"error: {shown}: {what}, not an installed package's metadata (remove it, or reinstall that "
                          f"package)\n"), done[0]
    assert not project.modules.exists()


def test_injected_build_record_value_is_rejected(project: Project) -> None:
    record = write_build_record(project.root / "wheelhouse", "cu126", PY, wheel_sha256='"); os.execute("id") --')
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126")
    assert code == 1 and output.startswith(f"error: wheelhouse/cu126/{record.name}: outputs.wheel_sha256: "), output
    assert not project.modules.exists()


def test_prefix_path_that_would_break_quoting_is_rejected(project: Project) -> None:
    odd = project.root / 'my "envs'
    shutil.copytree(project.prefix, odd / "cu126", symlinks=True)
    code, output = project.toolkit("modules", "--root", str(project.modules), "--env-root", str(odd), "cu126")
    assert code == 1 and "environment prefix" in output and "absolute path of letters" in output, output


# ---------------------------------------------------------------- under the real module systems


def listed_after_rc(output: str) -> list[str]:
    """The flash-attn modules `module -t list` printed after the `echo rc=$?` line."""
    tail = output[output.rindex("rc="):]
    return [line for line in tail.splitlines() if re.fullmatch(r"flash-attn[\w-]*/\S+", line)]


IMPORT_CHECK = "python -c 'import flash_attn, sys; print(\"imported\", flash_attn.__version__, sys.prefix)'"


def test_load_sets_what_is_written_and_unload_restores(project: Project, system) -> None:
    """A site cuda module sets CUDA_HOME; ours overrides it and unloading ours gives it back."""
    project.publish("cu126")
    dumps = project.root / "dumps"
    dumps.mkdir()
    result = system.run(f"""
        module load cuda/12.6 && env -0 > {dumps}/before
        module load {CU126} && env -0 > {dumps}/loaded
        {IMPORT_CHECK}
        module unload {CU126} && env -0 > {dumps}/after
    """, project.site_modules, project.tree(system))
    before, loaded, after = (environment(dumps / name) for name in ("before", "loaded", "after"))
    prefix = str(project.prefix)
    assert f"imported {FA_VERSION} {prefix}" in result.stdout, result.stdout
    assert loaded["PATH"] == f"{prefix}/bin:{before['PATH']}"
    assert loaded["MANPATH"].split(":")[0] == f"{prefix}/share/man"
    assert before["CUDA_HOME"] == "/site/cuda-12.6"
    for variable in ("FLASH_ATTN_ROOT", "CUDA_HOME", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"):
        assert loaded[variable] == prefix, variable
    assert "LD_LIBRARY_PATH" not in loaded  # conda prefixes use RPATH
    assert after == before


def test_external_module_loads_site_prerequisite(project: Project, system) -> None:
    """The external line's module loads cuda/13.0 (toolchain.modules) and points at its interpreter."""
    venv = project.add_external_line()
    project.publish("site")
    dumps = project.root / "dumps"
    dumps.mkdir()
    result = system.run(f"""
        env -0 > {dumps}/before
        module load {SITE} && env -0 > {dumps}/loaded
        module -t list
        {IMPORT_CHECK}
        module unload {SITE} && env -0 > {dumps}/after
        module -t list
    """, project.site_modules, project.tree(system))
    before, loaded, after = (environment(dumps / name) for name in ("before", "loaded", "after"))
    assert f"imported {FA_VERSION} {venv}" in result.stdout, result.stdout
    assert loaded["SITE_CUDA_LOADED"] == "13.0" and "cuda/13.0" in result.stdout
    assert loaded["PATH"].split(":")[0] == f"{venv}/bin"
    assert loaded["CUDA_HOME"] == str(project.root / "site-cuda")
    assert loaded["FLASH_ATTN_ROOT"] == loaded["VIRTUAL_ENV"] == str(venv)
    assert after == before  # cuda/13.0 went with it


def test_external_wheel_in_a_target_dir(project: Project, system) -> None:
    """`pip install --target DIR`: the module puts DIR on PYTHONPATH, the interpreter imports from it."""
    venv = project.add_external_line()
    target = project.root / "site-packages-fa"
    target.mkdir()
    for installed in list(venv.glob("lib/python*/site-packages/flash_attn*")):  # the package and its dist-info
        shutil.move(installed, target / installed.name)
    project.publish("site", "--target", str(target))
    result = system.run(f"""
        module load {SITE} && echo "PYTHONPATH=$PYTHONPATH FLASH_ATTN_ROOT=$FLASH_ATTN_ROOT"
        python -c 'import flash_attn; print("from", flash_attn.__file__)'
    """, project.site_modules, project.tree(system))
    assert f"PYTHONPATH={target} FLASH_ATTN_ROOT={target}" in result.stdout, result.stdout
    assert f"from {target}/flash_attn/__init__.py" in result.stdout


def test_avail_show_help_whatis_list_it(project: Project, system) -> None:
    project.publish("cu126")
    spider = "module spider flash-attn 2>&1; echo '>>>spider'" if system.name == "lmod" else ""
    result = system.run(f"""
        module -t avail 2>&1; echo '>>>avail'
        module show {CU126} 2>&1; echo '>>>show'
        module help {CU126} 2>&1; echo '>>>help'
        module whatis {CU126} 2>&1; echo '>>>whatis'
        {spider}
    """, project.tree(system))
    sections = dict(zip(re.findall(r">>>(\w+)", result.stdout), re.split(r">>>\w+\n?", result.stdout)))
    assert CU126 in sections["avail"]
    assert re.search(rf"prepend[-_]path\W+PATH\W+{re.escape(str(project.prefix))}/bin", sections["show"])
    assert "family" in sections["show"]
    assert "cdcd" * 16 in sections["help"] and "1212" * 16 in sections["help"]  # lock and build hashes
    assert "torch       2.9.1" in sections["help"] and "python      " + PY_FULL in sections["help"]
    assert f"Description: FlashAttention {CU126_BUILD} for CUDA 12.6" in sections["whatis"]
    assert "URL: https://github.com/Dao-AILab/flash-attention" in sections["whatis"]
    if system.name == "lmod":
        assert CU126 in sections["spider"]


def test_two_flash_attn_modules_are_never_loaded_together(project: Project, system) -> None:
    """Same name: Environment Modules refuses the second, Lmod replaces the first (one name, one version)."""
    project.add_external_line()
    project.publish()
    result = system.run(f"""
        module load {CU126}; module load {SITE}; echo "rc=$?"
        module -t list 2>&1
        {IMPORT_CHECK}
    """, project.site_modules, project.tree(system))
    loaded = listed_after_rc(result.stdout)
    if system.name == "envmodules":
        assert "rc=1" in result.stdout and "conflict" in result.stdout
        assert loaded == [CU126] and f"{project.prefix}" in result.stdout
    else:
        assert "rc=0" in result.stdout and loaded == [SITE]


def test_two_differently_named_flash_attn_modules_fail(project: Project, system) -> None:
    """Other names (a per-line scheme): the family refuses the second (Lmod: with LMOD_AUTO_SWAP=no)."""
    project.add_external_line()
    project.publish("--naming", "flash-attn-{line}/{flash_attn}")
    result = system.run("""
        module load flash-attn-cu126; module load flash-attn-site; echo "rc=$?"
        module -t list 2>&1
    """, project.site_modules, project.tree(system), env={"LMOD_AUTO_SWAP": "no"})
    assert "rc=1" in result.stdout, result.stdout
    assert listed_after_rc(result.stdout) == [f"flash-attn-cu126/{FA_VERSION}"]


def test_default_version_marking(project: Project, system) -> None:
    """Without a marker `module load flash-attn` takes the highest version (cu130 > cu126); --default wins."""
    project.add_external_line()
    project.publish()
    script = "module load flash-attn && module -t list 2>&1"
    assert SITE in system.run(script, project.site_modules, project.tree(system)).stdout
    project.publish("--default", "cu126")
    output = system.run(script, project.site_modules, project.tree(system)).stdout
    assert CU126 in output and SITE not in output


H200_RECOMMENDATION = REPO / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4" / "recommendation-per-shape.json"


def test_help_names_the_recommended_attention_and_a_hostile_file_is_refused(project: Project) -> None:
    """reports/<line>/recommendation.json (here the real one from the H200, 2026-12-01) reaches `module help`
    as checked text; a GPU name that would close the Lua string is refused before anything is written."""
    rec = project.root / "reports" / "cu126" / "recommendation.json"
    rec.parent.mkdir(parents=True)
    shutil.copy(H200_RECOMMENDATION, rec)
    project.publish("cu126", "--format", "lmod")
    text = (project.modules / "lmod" / f"{CU126}.lua").read_text()
    assert f"Attention:    fastest verified on NVIDIA H200 2026-12-01 ({rec}):" in text
    assert "bfloat16 d128 fwd: seqlen 0-2047: sdpa-cudnn (attn_implementation=sdpa + " \
           "sdpa_kernel(SDPBackend.CUDNN_ATTENTION)); seqlen 2048+: flash-attn-4 (attn_implementation=flash_attention_4)" in text
    shutil.rmtree(project.modules)
    data = json.loads(rec.read_text())
    data["gpu"] = 'H200"); os.execute("id") --'
    rec.write_text(json.dumps(data))
    code, output = project.toolkit("modules", "--root", str(project.modules), "cu126")
    assert code == 1 and output.count("\n") == 1, output
    assert output.startswith("error: reports/cu126/recommendation.json: not a recommendation"), output
    assert not project.modules.exists()

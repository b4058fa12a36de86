"""`toolkit doctor`: this machine's real output, recorded situations replayed, the pieces behind the rows.

On this machine (no GPU, real nvcc, torch present or not) the rows are checked against facts the test
reads itself. Machines we do not have (old driver, nvcc/torch mismatch, ABI mismatch, a wheel without
the GPU's arch, no nvcc, a healthy H200) are the recorded reports in tests/fingerprints/, replayed
through `--fingerprint`. flash-attn itself cannot be built in test time (it takes hours), so the import
probe is exercised on a small package named flash_attn around a real CUDA extension compiled by nvcc,
and on one whose extension really fails to import with an undefined c10 symbol.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cuda_toolchain import CUDA_HOME, HOST_CONFIG, tool_on_path

from toolkit.base.errors import ToolkitError
from toolkit.build.record import BuildRecord
from toolkit.cli import main
from toolkit.doctor.command import Facts, Row, conda_build, evaluate, gpu_runs
from toolkit.doctor.facts import LineFacts, gather_line, read_report
from toolkit.env.lockfile import KEY_DIGEST, LockedPackage, lock_digest
from toolkit.knowledge.files import KNOWLEDGE_DIR
from toolkit.machine.checks import SPEC_FACTS
from toolkit.machine.fingerprint import TorchInfo
from toolkit.machine.preflight import (
    BUILD_CHECKS,
    PreflightInput,
    problems,
    run_preflight,
    warnings,
)
from toolkit.spec.envspec import load_spec
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "envs"
RECORDED = ROOT / "tests" / "fingerprints"
REPORT_KEYS = {"ok", "line", "rows", "fingerprint", "probe"}
STATUSES = ["fail", "warn", "ok", "info"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory: no locks/, .envs/ or wheelhouse/ unless a test writes them."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def replay(capsys, report: Path | str, *args: str) -> tuple[int, dict]:
    code = main(["doctor", "--fingerprint", str(report), "--envs", str(ENVS), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def row(report: dict, check: str) -> dict:
    found = [r for r in report["rows"] if r["check"] == check]
    assert len(found) == 1, f"{check}: {[r['check'] for r in report['rows']]}"
    return found[0]


def assert_well_formed(report: dict, code: int) -> None:
    """Stable keys, failing rows first, exit code and `ok` agreeing with the rows."""
    assert set(report) == REPORT_KEYS
    statuses = [r["status"] for r in report["rows"]]
    assert statuses == sorted(statuses, key=STATUSES.index)
    assert all(set(r) == {"check", "status", "value", "fix"} for r in report["rows"])
    assert all(r["fix"] for r in report["rows"] if r["status"] == "fail")
    assert report["ok"] == ("fail" not in statuses) == (code == 0)


def run_doctor(cwd: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "toolkit", "doctor", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=120)
    return done, time.monotonic() - started


def shell_env(**changes: str | None) -> dict:
    env = dict(os.environ)
    for key, value in changes.items():
        env.pop(key, None) if value is None else env.__setitem__(key, value)
    return env


def shell_python() -> dict:
    """What the python3 on PATH has, read here without the toolkit: version, torch and its CUDA."""
    code = ("import importlib.util, json, platform; s = importlib.util.find_spec('torch');"
            "print(json.dumps({'version': platform.python_version(),"
            "                  'torch_dir': s and s.submodule_search_locations[0]}))")
    found = json.loads(subprocess.run(["python3", "-c", code], capture_output=True, text=True, check=True).stdout)
    if found["torch_dir"]:
        version_py = runpy.run_path(str(Path(found["torch_dir"]) / "version.py"))
        found["torch"], found["torch_cuda"] = version_py["__version__"], version_py["cuda"]
    return found


# ---------------------------------------------------------------- this machine, for real


@pytest.mark.nvcc
def test_this_machine_real_rows_and_speed(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this test describes a machine without a GPU; one is present here")
    env = shell_env(CUDA_HOME=str(CUDA_HOME), CUDA_PATH=None)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done, elapsed = run_doctor(tmp_path, "--json", env=env)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    # Under 3 s on an idle machine; where other work competes for the cores, the CPU time it needs.
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    assert elapsed < 3.0 or (busy and cpu < 3.0), f"doctor took {elapsed:.2f} s ({cpu:.2f} s CPU) without a GPU"
    report = json.loads(done.stdout)
    assert_well_formed(report, done.returncode)

    nvcc_text = subprocess.run([str(CUDA_HOME / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    gcc = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    python = shell_python()
    assert row(report, "driver")["status"] == "warn" and "no NVIDIA driver" in row(report, "driver")["value"]
    assert row(report, "gpus") == {"check": "gpus", "status": "info", "value": "none", "fix": ""}
    assert row(report, "cuda-home")["value"] == f"{CUDA_HOME} (from CUDA_HOME)"
    nvcc = row(report, "nvcc")
    assert nvcc["status"] == "ok" and nvcc["value"].split()[0] in nvcc_text
    assert row(report, "cuda-headers") == {"check": "cuda-headers", "status": "ok",
                                           "value": f"{CUDA_HOME}/include/cuda.h", "fix": ""}
    assert row(report, "gcc")["value"].startswith(gcc)
    header_cap = (HOST_CONFIG.read_text().split("gcc versions later than ")[1]
                  .split()[0])
    assert f"accepts <= {header_cap})" in row(report, "gcc")["value"]
    assert row(report, "python")["value"].startswith(python["version"])
    if python["torch_dir"] is None:
        torch = row(report, "torch")
        assert torch["status"] == "fail" and "pip install torch" in torch["fix"]
        assert not any(r["check"] == "torch-cuda" for r in report["rows"])
    else:
        assert row(report, "torch")["value"].startswith(python["torch"])
        torch_cuda = row(report, "torch-cuda")
        if python["torch_cuda"] is None:
            cpu_build = f"version.py: torch {python['torch']} is a CPU build (torch.version.cuda is None)"
            assert torch_cuda["status"] == "fail" and torch_cuda["value"].endswith(cpu_build)
            assert "--index-url https://download.pytorch.org/whl/cu" in torch_cuda["fix"]
        else:
            assert torch_cuda["status"] == "warn"  # a CUDA torch on a machine without a driver
    assert report["fingerprint"]["nvcc_version"] in nvcc_text and report["line"] is None


@pytest.mark.nvcc
def test_cuda_home_unset_is_inferred_from_nvcc_like_torch_does(tmp_path):
    """Without CUDA_HOME, torch's extension builder uses the nvcc on PATH's grandparent directory; a
    wrapper script there (as on these machines) leaves it without headers, and the row says so."""
    home = Path(tool_on_path("nvcc")).resolve().parent.parent
    done, _ = run_doctor(tmp_path, "--json", env=shell_env(CUDA_HOME=None, CUDA_PATH=None))
    report = json.loads(done.stdout)
    assert_well_formed(report, done.returncode)
    assert row(report, "cuda-home")["value"] == f"{home} (from nvcc on PATH)"
    headers = row(report, "cuda-headers")
    if (home / "include" / "cuda.h").exists():
        assert headers["status"] == "ok"
    else:
        assert headers["status"] == "fail" and "export CUDA_HOME=" in headers["fix"] and done.returncode == 1


def test_table_output_and_json_agree(workdir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code = main(["doctor", "--fingerprint", str(RECORDED / "abi-mismatch.json")])
    table = capsys.readouterr().out
    _, report = replay(capsys, RECORDED / "abi-mismatch.json")
    assert code == 1
    cells = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    first_lines = [(c[1].strip(), c[2].strip()) for c in cells if c[2].strip()]  # wrapped cells continue below
    assert first_lines == [(r["status"], r["check"]) for r in report["rows"]]
    assert table.rstrip().endswith("2 failing, 0 warnings: something would break a build or a run")


@pytest.mark.nvcc
def test_a_report_replays_to_the_same_rows(tmp_path, capsys, monkeypatch):
    """--json of this machine is itself a recording: replaying it gives the same rows."""
    done, _ = run_doctor(tmp_path, "--json")
    (tmp_path / "report.json").write_text(done.stdout)
    monkeypatch.chdir(tmp_path)
    code, replayed = replay(capsys, tmp_path / "report.json")
    original = json.loads(done.stdout)
    assert replayed["rows"] == original["rows"] and code == done.returncode
    assert replayed["fingerprint"] == original["fingerprint"] and replayed["probe"] == original["probe"]


# ---------------------------------------------------------------- flash_attn probed for real


def _python3_build_facts() -> tuple[str, str]:
    code = "import sysconfig; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    include, suffix = subprocess.run(["python3", "-c", code], capture_output=True, text=True,
                                     check=True).stdout.split()
    return include, suffix


def _site(root: Path, version: str) -> Path:
    """A site dir with a flash_attn package (imports its extension, as upstream's does) and its metadata."""
    (root / "flash_attn").mkdir(parents=True)
    (root / "flash_attn" / "__init__.py").write_text(
        'import flash_attn_2_cuda  # upstream imports it through flash_attn_interface\n__version__ = "2.8.3.post2"\n')
    info = root / f"flash_attn-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n")
    return root


EXTENSION_SOURCE = r"""
#include <Python.h>
__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "flash_attn_2_cuda", nullptr, -1, nullptr};
extern "C" PyObject* PyInit_flash_attn_2_cuda() { return PyModule_Create(&module); }
"""

# What a wheel built for another torch does on import: its extension needs a c10 symbol nobody exports.
BROKEN_SOURCE = r"""
#include <Python.h>
void _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE(void);
PyMODINIT_FUNC PyInit_flash_attn_2_cuda(void) {
    _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE();
    return NULL;
}
"""


@pytest.fixture(scope="module")
def flash_attn_sites(tmp_path_factory):
    """Two site dirs: one whose extension nvcc compiled for sm_80 and sm_90a, one that cannot import."""
    nvcc = tool_on_path("nvcc")
    root = tmp_path_factory.mktemp("flash-attn")
    include, suffix = _python3_build_facts()
    good = _site(root / "good", "2.8.3.post2+cu130torch2.13")
    (root / "ext.cu").write_text(EXTENSION_SOURCE)
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", f"-I{include}", "-gencode", "arch=compute_80,code=sm_80",
                    "-gencode", "arch=compute_90a,code=sm_90a", str(root / "ext.cu"), "-o",
                    str(good / f"flash_attn_2_cuda{suffix}")], check=True, capture_output=True)
    broken = _site(root / "broken", "2.8.3+cu12torch2.7cxx11abiFALSE")
    (root / "broken.c").write_text(BROKEN_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{include}", str(root / "broken.c"), "-o",
                    str(broken / f"flash_attn_2_cuda{suffix}")], check=True, capture_output=True)
    return good, broken


def test_real_extension_archs_are_read_from_the_binary(flash_attn_sites, tmp_path, capsys, monkeypatch):
    good, _ = flash_attn_sites
    done, _ = run_doctor(tmp_path, "--json", env=shell_env(PYTHONPATH=str(good)))
    report = json.loads(done.stdout)
    assert_well_formed(report, done.returncode)
    fa = report["probe"]["flash_attn"]
    assert fa["import_error"] is None and fa["version"] == "2.8.3.post2"
    assert Path(fa["extension"]).parent == good and (fa["cubins"], fa["ptx"]) == (["80", "90a"], [])
    assert row(report, "flash-attn")["status"] == "ok"
    assert row(report, "flash-attn")["value"].startswith("2.8.3.post2+cu130torch2.13 (flash_attn 2.8.3.post2)")
    assert row(report, "flash-attn-archs") == {"check": "flash-attn-archs", "status": "info",
                                               "value": "sm_80, sm_90a (no GPU here to compare)", "fix": ""}

    # The same binary on recorded GPUs: sm_86 runs sm_80 cubins, sm_90 the sm_90a ones, sm_120 neither.
    monkeypatch.chdir(tmp_path)
    for gpus, status in (([("NVIDIA A10", "8.6"), ("NVIDIA H100", "9.0")], "ok"), ([("RTX 5090", "12.0")], "fail")):
        report["fingerprint"]["gpus"] = [{"index": i, "name": n, "compute_capability": c}
                                         for i, (n, c) in enumerate(gpus)]
        (tmp_path / "gpus.json").write_text(json.dumps(report))
        _, replayed = replay(capsys, tmp_path / "gpus.json")
        archs = row(replayed, "flash-attn-archs")
        assert archs["status"] == status
    assert "FLASH_ATTN_CUDA_ARCHS=80;90a;120" in archs["fix"] and "GPU 0 (sm_120)" in archs["value"]


def test_real_undefined_symbol_is_explained_as_a_torch_abi_mismatch(flash_attn_sites, tmp_path):
    _, broken = flash_attn_sites
    done, _ = run_doctor(tmp_path, "--json", env=shell_env(PYTHONPATH=str(broken)))
    report = json.loads(done.stdout)
    assert_well_formed(report, done.returncode)
    error = report["probe"]["flash_attn"]["import_error"]
    assert "undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocation" in error
    fa = row(report, "flash-attn")
    assert fa["status"] == "fail" and done.returncode == 1
    assert "another torch (minor version or C++11 ABI)" in fa["fix"]
    assert "rebuild against the installed torch" in fa["fix"]
    assert row(report, "flash-attn-archs")["value"].startswith("no cubins")  # a gcc-built .so has no device code


# ---------------------------------------------------------------- recorded situations


def test_driver_too_old_for_the_runtime(workdir, capsys):
    code, report = replay(capsys, RECORDED / "driver-too-old.json")
    assert_well_formed(report, code)
    assert code == 1 and report["line"] == "cu130"
    runtime = row(report, "torch-vs-driver")
    assert runtime["status"] == "fail"
    assert runtime["value"] == "torch's runtime: driver 550.54.14 is too old for CUDA 13.0 (needs >= 580.65.06)"
    assert runtime["fix"].startswith("update the NVIDIA driver to >= 580.65.06, or use CUDA <= 12.4")
    assert row(report, "line-driver")["status"] == "fail"
    assert row(report, "driver")["value"] == \
        "550.54.14: runs CUDA <= 12.4, any CUDA 12.x through minor version compatibility"


def test_driver_within_minor_version_compatibility_is_a_warning(workdir, capsys):
    report = json.loads((RECORDED / "driver-too-old.json").read_text())
    report["fingerprint"]["driver_version"] = "535.104.05"
    report["fingerprint"]["torch"] = {**report["fingerprint"]["torch"], "version": "2.9.1+cu126", "cuda": "12.6"}
    (workdir / "r.json").write_text(json.dumps(report))
    _, replayed = replay(capsys, workdir / "r.json")
    runtime = row(replayed, "torch-vs-driver")
    assert runtime["status"] == "warn" and "minor version compatibility" in runtime["value"]
    assert runtime["fix"] == "update the NVIDIA driver to >= 560.28.03"


def test_nvcc_beside_a_torch_of_another_cuda(workdir, capsys):
    code, report = replay(capsys, RECORDED / "nvcc-torch-mismatch.json")
    assert_well_formed(report, code)
    line_cuda = row(report, "line-cuda")
    nvcc = report["fingerprint"]["nvcc_path"]  # the tool the value was read from, named first as build names it
    assert line_cuda["status"] == "fail" and line_cuda["value"] == f"{nvcc}: nvcc 12.4, the line wants 12.6"
    assert "toolkit install cu126" in line_cuda["fix"]
    mismatch = row(report, "torch-vs-nvcc")
    assert mismatch["status"] == "warn" and "torch 2.9.1+cu126 built for CUDA 12.6, nvcc is 12.4" in mismatch["value"]
    assert "torch builds with a warning within a CUDA major" in mismatch["value"]  # torch's cpp_extension policy
    assert mismatch["fix"].startswith("use a CUDA 12.6 nvcc")
    built = row(report, "flash-attn-build")  # the wheel's local tag says cu124
    assert built["status"] == "warn" and built["value"].startswith("built for CUDA 12.4, torch's CUDA is 12.6")
    assert built["fix"] == "rebuild flash-attn against the installed torch 2.9.1+cu126 (toolkit build cu126)"


def test_nvcc_of_another_cuda_major_fails(workdir, capsys):
    report = json.loads((RECORDED / "nvcc-torch-mismatch.json").read_text())
    report["fingerprint"]["nvcc_version"] = "13.0.88"
    (workdir / "r.json").write_text(json.dumps(report))
    _, replayed = replay(capsys, workdir / "r.json")
    assert row(replayed, "torch-vs-nvcc")["status"] == "fail"
    assert "across CUDA majors" in row(replayed, "torch-vs-nvcc")["value"]


def test_abi_mismatch(workdir, capsys):
    code, report = replay(capsys, RECORDED / "abi-mismatch.json")
    assert_well_formed(report, code)
    fa = row(report, "flash-attn")
    assert fa["status"] == "fail" and "undefined symbol: _ZN3c10" in fa["value"]
    assert fa["fix"].startswith("the extension was built against another torch (minor version or C++11 ABI)")
    assert "rebuild against the installed torch" in fa["fix"]
    built = row(report, "flash-attn-build")
    assert built["status"] == "fail"
    assert built["value"] == "built for torch 2.7, installed torch is 2.8.0+cu128; C++11 ABI FALSE, torch's is True"


def test_wheel_without_the_gpus_arch(workdir, capsys):
    code, report = replay(capsys, RECORDED / "wheel-without-gpu-arch.json")
    assert_well_formed(report, code)
    archs = row(report, "flash-attn-archs")
    assert archs["status"] == "fail" and "no kernels for GPU 0 (sm_120)" in archs["value"]
    assert archs["fix"].endswith("(FLASH_ATTN_CUDA_ARCHS=80;90;120)")
    transformers = row(report, "transformers")
    assert transformers["value"] == "4.57.1: attn_implementation works: eager, sdpa, flex_attention"
    assert "flash_attention_2: no kernels for sm_120" in transformers["fix"]


def test_a_line_that_cannot_target_the_gpu(workdir, capsys):
    _, report = replay(capsys, RECORDED / "wheel-without-gpu-arch.json", "cu126")
    archs = row(report, "line-archs")
    assert archs["status"] == "fail" and archs["value"] == "archs 80 90 leave out GPU 0 (sm_120)"
    assert archs["fix"] == (f"add '120' to archs in {ENVS / 'cu126.yaml'} "
                            f"(nvcc 12.6 cannot emit sm_120: use a CUDA 12.8+ line)")


def test_a_lines_archs_no_gpu_here_has_run_are_said(workdir, capsys):
    """issue 34: py-cu132 declares 80 90 100 120; this project's GPUs (gpus.yaml `ran`, read here with yaml) ran
    only some of them, and the doctor names the others as checked in the wheel, never run, rather than implying
    they were verified."""
    ran = yaml.safe_load((KNOWLEDGE_DIR / "gpus.yaml").read_text())["ran"]
    declared = yaml.safe_load((ENVS / "py-cu132.yaml").read_text())["archs"]
    unrun = [a for a in declared if a not in ran]
    assert unrun == ["80", "100", "120"]  # the lent H200 and H100 are sm_90
    _, report = replay(capsys, RECORDED / "wheel-without-gpu-arch.json", "py-cu132")
    said = row(report, "line-archs-unrun")
    assert said["status"] == "info"
    assert said["value"].startswith(f"sm_{', sm_'.join(unrun)}: the build checks that the wheel holds their cubins; "
                                    f"no GPU of these archs has run them here")
    _, report = replay(capsys, RECORDED / "wheel-without-gpu-arch.json", "gpu-machine")
    assert [r for r in report["rows"] if r["check"] == "line-archs-unrun"] == []  # sm_90 only: ran


def test_no_nvcc(workdir, capsys):
    code, report = replay(capsys, RECORDED / "no-nvcc.json")
    assert_well_formed(report, code)
    nvcc = row(report, "nvcc")
    assert nvcc["status"] == "fail" and nvcc["value"] == "PATH: nvcc not found"
    assert nvcc["fix"].startswith("pip's torch ships no nvcc")
    assert row(report, "cuda-home")["status"] == "fail"
    assert not any(r["check"] in ("cuda-headers", "torch-vs-nvcc") for r in report["rows"])


def test_healthy_gpu_machine_exits_0(workdir, capsys):
    code, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert_well_formed(report, code)
    assert code == 0 and report["ok"] is True
    assert {r["status"] for r in report["rows"]} <= {"ok", "info"}
    assert row(report, "line-cxx11-abi")["value"] == "torch C++11 ABI True"
    assert "flash_attention_2" in row(report, "transformers")["value"]


def test_line_differences_from_the_spec(workdir, capsys):
    """Replaying the healthy machine against another line lists every difference, each with its status."""
    code, report = replay(capsys, RECORDED / "healthy-h200.json", "cu126")
    assert code == 1
    nvcc, torch = report["fingerprint"]["nvcc_path"], report["fingerprint"]["torch"]["path"] + "/version.py"
    assert row(report, "line-cuda")["value"] == f"{nvcc}: nvcc 13.0, the line wants 12.6"
    assert row(report, "line-torch")["value"] == f"{torch}: torch 2.11.0, the line wants 2.9.1"
    assert row(report, "line-torch-cuda")["value"] == f"{torch}: torch build cu130, the line wants cu126"
    assert row(report, "line-driver")["status"] == "ok"  # a newer driver runs an older runtime
    assert row(report, "line-gcc")["status"] == "ok" and not any(r["check"] == "line-cxx11-abi" for r in report["rows"])


# ---------------------------------------------------------------- doctor --line X fails exactly where build X refuses


EXTERNAL_SPECS = ("gpu-machine", "gpu-replica", "gpu-machine-fa4")
# doctor's rows of the build's findings: the machine against the spec (SPEC_FACTS) and the shared checks
BUILD_ROWS = {fact.check for fact in SPEC_FACTS} | {"python", "nvcc", "cuda-headers", "gcc", "torch", "torch-cuda",
                                                     "torch-vs-nvcc"}
H200_EDITS = {
    "gcc differs": {"gcc_version": "14.2.0"},
    "nvcc differs": {"nvcc_version": "12.8.93"},
    "python differs": {"python_version": "3.11.9"},
    "torch differs": {"torch": TorchInfo("2.10.0+cu130", "13.0", True, "/t")},
    "torch of another major": {"torch": TorchInfo("2.11.0+cu128", "12.8", True, "/t")},
    "torch of another minor": {"torch": TorchInfo("2.11.0+cu131", "13.1", True, "/t")},
    "cpu torch": {"torch": TorchInfo("2.11.0+cpu", None, True, "/t")},
    "ABI differs": {"torch": TorchInfo("2.11.0+cu130", "13.0", False, "/t")},
    "everything differs": {"gcc_version": "12.3.0", "nvcc_version": "12.6.85",
                           "torch": TorchInfo("2.9.1+cu126", "12.6", False, "/t")},
}
CASES = [(report.stem, {}) for report in sorted(RECORDED.glob("*.json"))] + \
    [("healthy-h200", edit) for edit in H200_EDITS.values()]


@pytest.mark.parametrize("spec_name", EXTERNAL_SPECS)
@pytest.mark.parametrize("recorded, edit", CASES, ids=[r for r, _ in CASES[:-len(H200_EDITS)]] + list(H200_EDITS))
def test_build_refuses_exactly_what_doctor_fails(workdir, recorded, edit, spec_name):
    """Each recorded machine (and the H200 changed one field at a time) against each external spec: the lines
    `build` refuses are doctor's failing rows, word for word (`where: message (fix)`); what build only prints,
    doctor warns about. The build's own questions (ninja, disk, memory, archs, headers) have no row; whether
    the GPU is usable is the run's question, not the build's (the probe is set to usable)."""
    fp, probed, _ = read_report(RECORDED / f"{recorded}.json")
    fp, probed = replace(fp, **edit), replace(probed, cuda_available=True)
    spec = checked_spec(ENVS / f"{spec_name}.yaml")
    p = PreflightInput(spec, fp, spec.archs, 240.0, Path("/tmp"), nvcc_archs=None, gcc_cap=probed.nvcc_max_gcc)
    build_only = {line for check in BUILD_CHECKS if (line := check(p))}
    refused, warned = set(problems(p)) - build_only, set(warnings(p))
    rows = [r for r in evaluate(Facts(fp, probed, gather_line(spec.line, spec, None, fp.machine)))
            if r.check in BUILD_ROWS]
    said = lambda status: {f"{r.value} ({r.fix})" for r in rows if r.status == status}
    assert refused == said("fail")
    assert warned <= said("warn") and not refused & said("warn")
    assert (refused != set()) == (recorded != "healthy-h200" or edit not in ({}, H200_EDITS["torch of another minor"]))


def test_a_gcc_other_than_the_spec_s_fails_doctor_as_it_stops_the_build(workdir, capsys):
    """The H200 image with gcc 14 against gpu-machine (gcc 13): `build` refused it while `doctor LINE`
    warned and exited 0. Now doctor fails with the build's words."""
    report = json.loads((RECORDED / "healthy-h200.json").read_text())
    report["fingerprint"]["gcc_version"] = "14.2.0"
    (workdir / "r.json").write_text(json.dumps(report))
    code, replayed = replay(capsys, workdir / "r.json", "gpu-machine")
    assert code == 1 and replayed["ok"] is False
    gcc = row(replayed, "line-gcc")
    spec = checked_spec(ENVS / "gpu-machine.yaml")
    fp, probed, _ = read_report(workdir / "r.json")
    with pytest.raises(ToolkitError) as refused:
        run_preflight(PreflightInput(spec, fp, spec.archs, 240.0, Path("/tmp"), None, probed.nvcc_max_gcc))
    assert gcc["status"] == "fail" and str(refused.value) == f"{gcc['value']} ({gcc['fix']})"
    assert gcc["value"] == "/usr/bin/g++: gcc 14, the line wants 13"
    assert gcc["fix"] == f"fix the machine or the toolchain section of {ENVS / 'gpu-machine.yaml'}"


# ---------------------------------------------------------------- line files: lock, build record


def _build_record(fingerprint: dict, version: str) -> dict:
    """A record the real H200 build wrote (docs/results/), made through BuildRecord with another wheel."""
    real = BuildRecord.read(ROOT / "docs/results/2026-11-29-h200-seeded-build/build-record.json")
    wheel = f"flash_attn-{version}-cp312-cp312-linux_x86_64.whl"
    return replace(real, finished="2026-11-30T10:00:00+00:00", fingerprint=fingerprint,
                   outputs=replace(real.outputs, wheel=wheel, version=version)).to_json()


def test_build_record_matches_the_installed_wheel(workdir, capsys):
    recorded = json.loads((RECORDED / "healthy-h200.json").read_text())
    folder = workdir / "wheelhouse" / "gpu-machine"
    folder.mkdir(parents=True)
    record = _build_record(recorded["fingerprint"], "2.8.3.post2+cu130torch2.11")
    (folder / (record["outputs"]["wheel"] + ".build.json")).write_text(json.dumps(record))
    code, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert code == 0
    assert row(report, "record")["value"] == f"installed flash-attn is the line's build {record['outputs']['wheel']}"
    assert row(report, "record-toolchain")["status"] == "ok"

    older = _build_record({**recorded["fingerprint"], "gcc_version": "12.3.0",
                           "torch": {**recorded["fingerprint"]["torch"], "version": "2.10.0+cu130"}},
                          "2.8.3.post2+cu130torch2.10")
    older["finished"] = "2026-12-01T10:00:00+00:00"  # the newest record is the one compared
    (folder / (older["outputs"]["wheel"] + ".build.json")).write_text(json.dumps(older))
    code, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert code == 1
    assert row(report, "record")["status"] == "warn"
    assert row(report, "record")["fix"] == f"pip install wheelhouse/gpu-machine/{older['outputs']['wheel']}"
    toolchain = row(report, "record-toolchain")
    assert toolchain["status"] == "fail"
    assert toolchain["value"] == "torch 2.11.0+cu130 (built with 2.10.0+cu130); gcc 13.3.0 (built with 12.3.0)"


def test_unreadable_build_record_is_a_row(workdir, capsys):
    folder = workdir / "wheelhouse" / "gpu-machine"
    folder.mkdir(parents=True)
    (folder / "flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl.build.json").write_text("{not json")
    code, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert code == 1 and row(report, "record")["status"] == "fail"
    assert "unreadable build record" in row(report, "record")["value"]


def test_committed_lock_is_read_and_a_tampered_one_fails(workdir, capsys):
    (workdir / "locks").mkdir()
    lock = workdir / "locks" / "gpu-machine.conda-lock.yml"
    text = (ROOT / "locks" / "gpu-machine.conda-lock.yml").read_text()
    lock.write_text(text)
    _, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert row(report, "lock") == {"check": "lock", "status": "ok", "fix": "",
                                   "value": "locks/gpu-machine.conda-lock.yml: 0 packages, matches the spec"}
    lock.write_text(text.replace("flash_attn-2.8.3.post2.tar.gz\n", "flash_attn-2.8.3.tar.gz\n"))
    code, report = replay(capsys, RECORDED / "healthy-h200.json")
    assert code == 1 and row(report, "lock")["status"] == "fail"
    assert "edited after locking" in row(report, "lock")["value"]


CONDA_FORGE = "https://conda.anaconda.org/conda-forge/linux-64"


def _locked(manager: str, name: str, version: str, url: str) -> LockedPackage:
    return LockedPackage(manager, name, version, url, "0" * 64, "linux-64")


def _facts_with_lock(conda_installed: dict | None, pip_installed: dict) -> Facts:
    fp, probe, _ = read_report(RECORDED / "nvcc-torch-mismatch.json")
    locked = (_locked("conda", "cuda-nvcc", "12.6.85", f"{CONDA_FORGE}/cuda-nvcc-12.6.85-hbd13f7d_0.conda"),
              _locked("conda", "gxx", "13.3.0", f"{CONDA_FORGE}/gxx-13.3.0-h9a4b1e8_1.tar.bz2"),
              _locked("pip", "torch", "2.9.1+cu126", "https://download.pytorch.org/whl/cu126/"
                      "torch-2.9.1%2Bcu126-cp312-cp312-manylinux_2_28_x86_64.whl"),
              _locked("pip", "ninja", "1.13.0", "https://files.pythonhosted.org/packages/ninja-1.13.0-py3-none-"
                      "manylinux_2_17_x86_64.whl"))
    line = LineFacts("cu126", load_spec(ENVS / "cu126.yaml"), None, Path("locks/cu126.conda-lock.yml"), None, locked,
                     Path(".envs/cu126"), Path("wheelhouse/cu126"), None, None)
    return Facts(fp, replace(probe, conda_packages=conda_installed, python_packages=pip_installed), line)


def test_env_packages_compared_with_the_lock():
    facts = _facts_with_lock({"cuda-nvcc": "12.4.131=h1", "gxx": "13.3.0=h9a4b1e8_1"}, {"torch": "2.9.1+cu126"})
    rows = {r.check: r for r in evaluate(facts)}
    assert rows["lock-conda"] == Row("lock-conda", "fail", ".envs/cu126 differs from the lock: cuda-nvcc 12.4.131=h1 "
                                     "(lock: 12.6.85=hbd13f7d_0)", "re-install from the lock: toolkit install cu126")
    assert rows["lock-pip"].status == "fail" and "ninja missing (lock: 1.13.0)" in rows["lock-pip"].value

    same = _facts_with_lock({"cuda-nvcc": "12.6.85=hbd13f7d_0", "gxx": "13.3.0=h9a4b1e8_1"},
                            {"torch": "2.9.1+cu126", "ninja": "1.13.0"})
    rows = {r.check: r for r in evaluate(same)}
    assert rows["lock-conda"].status == rows["lock-pip"].status == "ok"
    rows = {r.check: r for r in evaluate(_facts_with_lock(None, {}))}
    assert rows["lock-conda"] == Row("lock-conda", "info", "no env at .envs/cu126", "toolkit install cu126")


def golden_lock_text() -> str:
    """tests/golden/cu126.conda-lock.yml as a lock read_lock accepts: the golden file spells the hashes that cover
    its test's folder `<sha256>` (tests/test_lock.py golden_form), so they are filled and the digest is made anew
    over what the file then holds (lockfile.lock_digest, as `toolkit lock` makes it)."""
    text = (ROOT / "tests" / "golden" / "cu126.conda-lock.yml").read_text().replace("<sha256>", "a" * 64)
    return text.replace(f"{KEY_DIGEST}: {'a' * 64}", f"{KEY_DIGEST}: {lock_digest(yaml.safe_load(text))}")


def test_line_packages_are_the_verified_lock_of_this_platform(workdir):
    """Doctor reads the lock through toolkit.env.lockfile (digest and strict forms checked), keeping this
    machine's platform: the golden lock written by test_lock has both linux-64 and linux-aarch64."""
    (workdir / "locks").mkdir()
    lock = workdir / "locks" / "cu126.conda-lock.yml"
    text = golden_lock_text()
    lock.write_text(text)
    spec = load_spec(ENVS / "cu126.yaml")
    for machine, platform in (("x86_64", "linux-64"), ("aarch64", "linux-aarch64")):
        locked = gather_line("cu126", spec, None, machine).locked
        assert locked and {p.platform for p in locked} == {platform}
        gxx = next(p for p in locked if p.name == "gxx" and p.manager == "conda")
        assert (gxx.version, conda_build(gxx)) == ("13.3.0", "h0_1")
    assert gather_line("cu126", spec, None, "riscv64").locked == ()  # no platform of the lock: nothing to compare
    lock.write_text(text.replace("gxx-13.3.0-h0_1.conda", "gxx-13.3.0-h9_9.conda"))
    tampered = gather_line("cu126", spec, None, "x86_64")
    assert tampered.locked is None and "edited after locking" in (tampered.lock_problem or "")


def test_the_prefix_s_install_record_is_checked_against_the_lock(workdir):
    """The resolver reads the typed record `toolkit install` leaves (install_record.PrefixRecord): none is a
    prefix made some other way, another digest an install from an older lock, the same digest ok."""
    from toolkit.env.install_record import PrefixRecord
    from toolkit.env.lockfile import read_lock

    (workdir / "locks").mkdir()
    lock = workdir / "locks" / "cu126.conda-lock.yml"
    lock.write_text(golden_lock_text())
    prefix = workdir / ".envs" / "cu126"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    spec = load_spec(ENVS / "cu126.yaml")
    fp, probe, _ = read_report(RECORDED / "nvcc-torch-mismatch.json")

    def install_row():
        line = gather_line("cu126", spec, None, "x86_64")
        return {r.check: r for r in evaluate(Facts(fp, probe, line))}["install-record"]

    assert install_row().status == "warn" and "no toolkit install record" in install_row().value
    digest = read_lock(lock).digest
    PrefixRecord(line="cu126", lock=str(lock), platform="linux-64", input_hash="0" * 64,
                 lock_sha256="f" * 64).write(prefix)
    assert install_row().status == "warn" and f"is now {digest[:12]}" in install_row().value
    PrefixRecord(line="cu126", lock=str(lock), platform="linux-64", input_hash="0" * 64,
                 lock_sha256=digest).write(prefix)
    assert install_row() == Row("install-record", "ok", f"installed by `toolkit install` from this lock (linux-64, "
                                                        f"digest {digest[:12]})")


@pytest.mark.parametrize("file_name, build", [
    ("gxx-13.3.0-h9a4b1e8_1.conda", "h9a4b1e8_1"),
    ("python-3.12.3-h1_0_cpython.tar.bz2", "h1_0_cpython"),
    ("_libgcc_mutex-0.1-conda_forge.tar.bz2", "conda_forge"),
    ("cuda-nvcc-impl-12.6.85-he91c749_0.conda", "he91c749_0"),  # dashes in the name: the build is the last field
])
def test_conda_build_is_the_archive_names_last_field(file_name, build):
    assert conda_build(_locked("conda", "x", "1", f"{CONDA_FORGE}/{file_name}")) == build


# ---------------------------------------------------------------- pieces and bad input


@pytest.mark.parametrize("gpu, cubins, ptx, runs", [
    ("86", ("80",), (), True),       # same major, higher minor runs the sm_80 cubin
    ("89", ("80", "90"), (), True),
    ("80", ("86",), (), False),      # a newer minor does not run on an older one
    ("90", ("90a",), (), True),      # an arch-specific cubin runs on its own sm
    ("100", ("90a",), (), False),    # ... and nowhere else
    ("100", ("80", "90"), (), False),
    ("120", ("80",), ("90",), True),  # PTX is JIT-compiled for newer GPUs
    ("80", (), ("90",), False),      # ... never for older ones
    ("103", ("100f",), (), True),    # a family cubin runs across its family
])
def test_which_kernels_load_on_which_gpu(gpu, cubins, ptx, runs):
    assert gpu_runs(gpu, cubins, ptx) is runs


def test_old_gpu_and_transformers_without_gpu(workdir, capsys):
    report = json.loads((RECORDED / "wheel-without-gpu-arch.json").read_text())
    report["fingerprint"]["gpus"] = [{"index": 0, "name": "Tesla T4", "compute_capability": "7.5"}]
    (workdir / "r.json").write_text(json.dumps(report))
    _, replayed = replay(capsys, workdir / "r.json")
    assert row(replayed, "gpus")["status"] == "fail" and "needs sm_80+" in row(replayed, "gpus")["fix"]
    assert "flash_attention_2: needs sm_80+, GPU is sm_75" in row(replayed, "transformers")["fix"]


def test_probe_of_a_missing_python_is_a_row(workdir, capsys):
    """An external line whose python is not on this machine: a failing row, not a traceback."""
    if Path("/opt/torch/.venv/bin/python3").exists():
        pytest.skip("this is the GPU machine: its python is there")
    code = main(["doctor", "gpu-machine", "--envs", str(ENVS), "--json"])
    report = json.loads(capsys.readouterr().out)
    python = row(report, "python")
    assert code == 1 and python["status"] == "fail" and python["value"].startswith("/opt/torch/.venv/bin/python3")
    assert "toolchain.python_executable" in python["fix"]
    assert row(report, "cuda-home")["value"] == f"/usr/local/cuda (from {ENVS / 'gpu-machine.yaml'} toolchain)"


def test_a_broken_spec_is_a_row_not_an_abort(workdir, capsys):
    envs = workdir / "envs"
    envs.mkdir()
    for name in ("base", "cu126"):
        (envs / f"{name}.yaml").write_text((ENVS / f"{name}.yaml").read_text())
    (envs / "cu126.yaml").write_text((envs / "cu126.yaml").read_text().replace("gcc: 13", "gcc: 15"))
    code = main(["doctor", "--fingerprint", str(RECORDED / "healthy-h200.json"), "cu126", "--envs",
                 str(envs), "--json"])
    report = json.loads(capsys.readouterr().out)
    line = row(report, "line")
    assert code == 1 and line["status"] == "fail" and "gcc 15 is newer than nvcc 12.6 accepts" in line["value"]
    assert line["fix"] == "fix the spec (toolkit check cu126)"
    assert not any(r["check"].startswith("line-") for r in report["rows"])


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("{not json", "unreadable doctor report (not JSON"),
    ('{"fingerprint": {"machine": "x86_64"}, "probe": {}}', "not a doctor report (TypeError"),
])
def test_bad_report_files_are_one_line_errors(workdir, capsys, content, message):
    path = workdir / "report.json"
    if content is not None:
        path.write_text(content)
    assert main(["doctor", "--fingerprint", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "report.json" in err and err.count("\n") == 1


def test_unknown_line_and_missing_prefix_are_one_line_errors(workdir, capsys):
    assert main(["doctor", "cu999", "--envs", str(ENVS)]) == 1
    assert "no spec for line 'cu999'" in capsys.readouterr().err
    assert main(["doctor", "--prefix", str(workdir / "nope")]) == 1
    assert "no such environment prefix" in capsys.readouterr().err


def test_prefix_is_probed_as_a_conda_env(workdir, capsys):
    """A conda-like prefix (bin/python, conda-meta/): its python, no nvcc inside, its packages recorded."""
    prefix = workdir / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(shutil.which("python3"))
    (prefix / "conda-meta").mkdir()
    (prefix / "conda-meta" / "ninja-1.13.0-h297d8ca_0.json").write_text(
        json.dumps({"name": "ninja", "version": "1.13.0", "build": "h297d8ca_0"}))
    code = main(["doctor", "--prefix", str(prefix), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and row(report, "nvcc")["value"] == f"{prefix.absolute()}/bin/nvcc: nvcc not found"
    assert row(report, "cuda-home")["value"] == f"{prefix.absolute()} (from prefix env)"
    assert report["fingerprint"]["python_path"] == str(prefix.absolute() / "bin" / "python")
    assert report["probe"]["conda_packages"] == {"ninja": "1.13.0=h297d8ca_0"}


def test_nox_has_a_doctor_session():
    listed = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True).stdout
    assert any(line.startswith("- doctor ") or line.startswith("* doctor ") for line in listed.splitlines())


def test_a_locked_line_without_its_environment_says_how_to_make_it(workdir, capsys):
    """Nothing installed for cu126: the shell's own nvcc, gcc and python are not what the line builds with,
    so they are neither probed nor compared with the spec; one row says the environment is missing."""
    code = main(["doctor", "cu126", "--envs", str(ENVS), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert_well_formed(report, code)
    env = row(report, "env")
    assert code == 1 and env["status"] == "fail" and ".envs/cu126" in env["value"]
    assert "toolkit lock cu126 && toolkit install cu126" in env["fix"] and "nox -s lock-cu126 env-cu126" in env["fix"]
    checks = {r["check"] for r in report["rows"]}
    judged = {"cuda-home", "nvcc", "cuda-headers", "gcc", "python", "torch", "torch-cuda", "line-cuda",
              "line-python", "line-gcc", "line-torch", "lock-pip", "lock-conda", "record"}
    assert not checks & judged, checks & judged
    assert {"driver", "gpus", "line", "lock"} <= checks
    fingerprint = report["fingerprint"]
    assert fingerprint["nvcc_path"] is None and fingerprint["python_path"] is None and fingerprint["cxx_path"] is None


def test_a_locked_line_with_a_lock_but_no_environment_only_needs_install(workdir, capsys):
    (workdir / "locks").mkdir()
    (workdir / "locks" / "cu126.conda-lock.yml").write_text("not: a real lock\n")
    main(["doctor", "cu126", "--envs", str(ENVS), "--json"])
    env = row(json.loads(capsys.readouterr().out), "env")
    assert env["fix"].startswith("toolkit install cu126") and "nox -s env-cu126" in env["fix"]


H200_RECOMMENDATION = ROOT / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4" / "recommendation-per-shape.json"


def test_the_line_s_recommended_attention_is_a_row(workdir, capsys):
    """reports/<line>/recommendation.json (the real one from the H200): ok on that GPU, a warning on another
    GPU, and a file recommend did not write is a warning row, never an abort."""
    rec = workdir / "reports" / "gpu-machine" / "recommendation.json"
    rec.parent.mkdir(parents=True)
    data = json.loads(H200_RECOMMENDATION.read_text())
    rec.write_text(json.dumps(data))
    _, report = replay(capsys, RECORDED / "healthy-h200.json", "gpu-machine")
    attention = row(report, "attention")
    assert attention["status"] == "ok", attention
    assert "flash-attn-4 (attn_implementation=flash_attention_4)" in attention["value"]
    assert "measured on NVIDIA H200 2026-12-01" in attention["value"]
    rec.write_text(json.dumps({**data, "gpu": "NVIDIA A100-SXM4-80GB"}))
    _, report = replay(capsys, RECORDED / "healthy-h200.json", "gpu-machine")
    assert row(report, "attention")["status"] == "warn"
    assert "toolkit recommend gpu-machine" in row(report, "attention")["fix"]
    rec.write_text(json.dumps({**data, "rules": [{**data["rules"][0], "backend": "$(id)"}]}))
    _, report = replay(capsys, RECORDED / "healthy-h200.json", "gpu-machine")
    assert row(report, "attention")["status"] == "warn" and "not a recommendation" in row(report, "attention")["value"]


# ---------------------------------------------------------------- verl's default attention

HOLD3_RECOMMENDATION = ROOT / "docs" / "results" / "2026-12-01-h200-hold-3" / "recommendation.json"
VERL_KEYS = ("actor_rollout_ref.model.override_config.attn_implementation",  # verl 0.9.1's trainer config
             "critic.model.override_config.attn_implementation")


def _with_verl(workdir: Path, recorded: str, **packages: str | None) -> Path:
    """A recorded report with verl 0.9.1 in the environment (not recorded: the H200 had none) beside the
    transformers verl 0.9.1 requires at least (5.5.3, its METADATA); `packages` adds or removes others."""
    report = json.loads((RECORDED / recorded).read_text())
    installed = {**report["probe"]["python_packages"], "verl": "0.9.1", "transformers": "5.5.3", **packages}
    report["probe"]["python_packages"] = {name: v for name, v in installed.items() if v is not None}
    (workdir / "r.json").write_text(json.dumps(report))
    return workdir / "r.json"


def _recommendation(workdir: Path, source: Path) -> None:
    rec = workdir / "reports" / "gpu-machine" / "recommendation.json"
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(source.read_text())


def test_verl_s_default_is_ok_where_it_loads_and_flash_attn_was_verified(workdir, capsys):
    """Hold 3's real recommendation verified flash-attn (2.8.3.post2, smoke) on the H200, bf16 d128 causal included."""
    _recommendation(workdir, HOLD3_RECOMMENDATION)
    _, report = replay(capsys, _with_verl(workdir, "healthy-h200.json"), "gpu-machine")
    verl = row(report, "verl")
    assert verl["status"] == "ok" and verl["value"].startswith("verl 0.9.1: its default attn_implementation "
                                                               "flash_attention_2 loads here and was verified on "
                                                               "NVIDIA H200"), verl


def test_verl_s_default_unverified_for_the_line_gets_the_recommended_override(workdir, capsys):
    """The replica run's recommendation verified FA4 and torch's kernels, never flash-attn: verl would train with
    an unverified kernel; the fix names FA4 (fastest verified at bf16 d128 causal fwd+bwd 4096) where
    flash-attn-4 is installed, sdpa where it is not."""
    _recommendation(workdir, H200_RECOMMENDATION)
    _, report = replay(capsys, _with_verl(workdir, "healthy-h200.json", **{"flash-attn-4": "4.0.0b36"}), "gpu-machine")
    verl = row(report, "verl")
    assert verl["status"] == "warn" and "flash_attention_2 loads here but flash-attn-2 was not verified on NVIDIA H200" \
        in verl["value"], verl
    assert verl["fix"].endswith(f"set {VERL_KEYS[0]}=flash_attention_4 and {VERL_KEYS[1]}=flash_attention_4")
    assert "toolkit verify gpu-machine && toolkit bench gpu-machine && toolkit recommend gpu-machine" in verl["fix"]
    _, report = replay(capsys, _with_verl(workdir, "healthy-h200.json"), "gpu-machine")
    assert row(report, "verl")["fix"].endswith(f"set {VERL_KEYS[0]}=sdpa and {VERL_KEYS[1]}=sdpa")


def test_verl_s_default_that_would_not_load_is_said_with_the_reason(workdir, capsys):
    """The RTX 5090 report: flash-attn is there but has no sm_120 kernels, so flash_attention_2 cannot run."""
    _, report = replay(capsys, _with_verl(workdir, "wheel-without-gpu-arch.json"), "gpu-machine")
    verl = row(report, "verl")
    assert verl["status"] == "warn" and verl["value"] == ("verl 0.9.1: its default attn_implementation "
                                                          "flash_attention_2 would not load here: no kernels for sm_120")
    assert verl["fix"] == f"set {VERL_KEYS[0]}=sdpa and {VERL_KEYS[1]}=sdpa"
    _, report = replay(capsys, _with_verl(workdir, "healthy-h200.json", **{"flash-attn": None}), "gpu-machine")
    assert "would not load here: needs flash-attn>=2.3.3" in row(report, "verl")["value"]


def test_without_verl_installed_the_verl_row_is_information(workdir, capsys):
    _, report = replay(capsys, _with_verl(workdir, "wheel-without-gpu-arch.json", verl=None), "gpu-machine")
    verl = row(report, "verl")
    assert verl["status"] == "info" and verl["value"].startswith("verl (not installed here): its default")


# ---------------------------------------------------------------- the installed flash-attn against a published cache


@pytest.fixture
def installed_from_cache(tmp_path, wheels):
    """The stand-in flash-attn of tests/test_export.py published by `toolkit publish` and installed by uv into a
    fresh venv from the index served on 127.0.0.1 (with its stand-in torch); yields (published, venv python)."""
    from conda_channel import serve_directory
    from test_cache import UV
    from test_export import publish_standin

    published = publish_standin(tmp_path, wheels)
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_NO_CONFIG": "1"}
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    with serve_directory(published.index) as url, serve_directory(published.torch_index) as torch_url:
        subprocess.run([str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--index-url",
                        f"{torch_url}/simple", "--extra-index-url", f"{url}/simple", f"flash-attn=={FA_VERSION}"],
                       check=True, env=env)
    return published, venv / "bin" / "python"


FA_VERSION = "2.8.3+cu130torch2.13"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    from test_export import standin_wheels

    return standin_wheels(tmp_path_factory)


def published_row(cwd: Path, python: Path, *caches: str) -> dict | None:
    done, _ = run_doctor(cwd, "--python", str(python), "--json", *[a for c in caches for a in ("--cache", c)],
                         env={**os.environ, "TOOLKIT_CACHE": str(cwd / ".cache")})
    assert "Traceback" not in done.stderr, done.stderr
    found = [r for r in json.loads(done.stdout)["rows"] if r["check"] == "flash-attn-published"]
    return found[0] if found else None


def test_doctor_names_the_installed_published_build_and_its_verification_report(installed_from_cache, workdir):
    """Before: doctor said only the version; now the sha256 of every file the published wheel's RECORD lists,
    hashed where it is installed, names the build, its line and report."""
    published, python = installed_from_cache
    index = published.index.resolve().as_uri()
    assert published_row(workdir, python) is None  # no cache configured: nothing is asked
    found = published_row(workdir, python, index)
    wheel_url = f"{index}/files/demo/{published.wheel.name.replace('+', '%2B')}"
    assert found == {"check": "flash-attn-published", "status": "ok", "fix": "",
                     "value": f"flash-attn {FA_VERSION}: the published build {wheel_url} (line demo, inputs "
                              f"{json.loads(published.record.read_text())['inputs_key']}); verification report "
                              f"{wheel_url}.reports/verify.json"}

    # the same version, another build: one installed file's bytes changed
    site = Path(subprocess.run([str(python), "-c", "import flash_attn, os; print(os.path.dirname(flash_attn.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "__init__.py").write_text((site / "__init__.py").read_text() + "# rebuilt\n")
    found = published_row(workdir, python, index)
    assert found["status"] == "warn" and found["value"].startswith(f"flash-attn {FA_VERSION}: an unknown build "
                                                                   f"(flash_attn/__init__.py differs")


def test_doctor_says_unknown_for_a_version_the_cache_never_published(installed_from_cache, workdir, tmp_path):
    published, python = installed_from_cache
    empty = tmp_path / "empty-cache"
    (empty / "simple" / "flash-attn").mkdir(parents=True)
    (empty / "simple" / "index.html").write_text('<a href="flash-attn/">flash-attn</a>')
    (empty / "simple" / "flash-attn" / "index.html").write_text("")
    found = published_row(workdir, python, empty.as_uri())
    assert found["status"] == "warn"
    assert found["value"] == (f"flash-attn {FA_VERSION}: an unknown build (no build of flash-attn {FA_VERSION} is "
                              f"published at {empty.as_uri()})")

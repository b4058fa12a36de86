"""Build preflight: every check fails with one line naming the file and the fix, in well under 2 s.

Fingerprints are probed for real on this machine (nvcc 13.0, gcc, the CPU torch 2.13 installed by
.ci/run) and varied one field at a time where the machine cannot show a situation (another CUDA line,
a too-new gcc); the GPU machine's recorded fingerprint (tests/fingerprints) is replayed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from cuda_toolchain import CUDA_HOME as CUDA
from fixtures.fa_fixture_project import make_stub_torch_env, write_external_spec

from toolkit.base.errors import ToolkitError
from toolkit.doctor.command import Facts, evaluate
from toolkit.doctor.facts import gather_line, read_report
from toolkit.knowledge.facts import load_knowledge
from toolkit.knowledge.nvcc_gcc import host_config_cap
from toolkit.machine.fingerprint import TorchInfo, from_dict, probe
from toolkit.machine.preflight import (
    nvcc_gpu_codes,
    preflight_input,
    problems,
    run_preflight,
    warnings,
)
from toolkit.spec.rules import checked_spec

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.nvcc, pytest.mark.torch]


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory):
    """An environment whose torch (a test double, see tests/fixtures/fa_fixture_project.py) says CUDA 13.0."""
    root = tmp_path_factory.mktemp("preflight")
    python = make_stub_torch_env(root / "venv", "2.13.0", "13.0")
    spec = checked_spec(write_external_spec(root / "envs", "fixture", python, "2.13.0"))
    return spec, probe(str(CUDA), str(python))


def found(spec, fp, archs=None, mem_gb=20.0, build_dir=Path("/tmp")) -> list[str]:
    return problems(preflight_input(spec, fp, tuple(archs or spec.archs), mem_gb, build_dir))


def test_a_matching_toolchain_passes_in_under_two_seconds(stub_env):
    spec, _ = stub_env
    start = time.monotonic()
    fp = probe(str(CUDA), spec.toolchain.python_executable)
    assert found(spec, fp) == []
    assert time.monotonic() - start < 2.0


def test_cpu_torch_is_refused_with_one_line(tmp_path):
    """The real CPU torch 2.13 of this machine (torch.version.cuda is None), through the CLI."""
    fp = probe(str(CUDA), sys.executable)
    if fp.torch is None or fp.torch.cuda is not None:
        pytest.skip(f"needs the CPU torch that .ci/run installs (found {fp.torch})")
    # the spec promises the CUDA build (`check` refuses a toolchain.torch of +cpu); the machine has the CPU one
    write_external_spec(tmp_path / "envs", "cpu", Path(sys.executable), fp.torch.version.split("+")[0])
    env = {**os.environ, "TOOLKIT_CACHE": str(tmp_path / "cache")}
    # a real lock: an external line's build key is its lock's sdist sha256, read before the cache and the preflight
    locked = subprocess.run([sys.executable, "-m", "toolkit", "lock", "cpu"], cwd=tmp_path, capture_output=True,
                            text=True, env=env)
    assert locked.returncode == 0, locked.stderr
    done = subprocess.run([sys.executable, "-m", "toolkit", "build", "cpu"], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    said = (f"torch {fp.torch.version} is a CPU build (torch.version.cuda is None) (flash-attn needs a CUDA build "
            f"of torch: pip install torch=={fp.torch.version.split('+')[0]}+cu130 --index-url "
            f"https://download.pytorch.org/whl/cu130)")  # +cu130: pip takes the installed +cpu for ==2.13.0
    assert any(line.startswith("error: ") and line.endswith(said) and line.split(":")[1].strip().endswith("version.py")
               for line in lines), lines
    assert "Traceback" not in done.stderr


def test_each_broken_piece_is_one_line_naming_the_file_and_fix(stub_env):
    spec, fp = stub_env
    torch = fp.torch
    cases = {
        "nvcc not found": replace(fp, nvcc_path=None, nvcc_version=None),
        "bin/nvcc: nvcc 12.6, the line wants 13.0 (fix the machine or the toolchain section of": replace(
            fp, nvcc_version="12.6.85"),
        "built for CUDA 12.8, nvcc is 13.0: torch refuses": replace(fp, torch=replace(torch, cuda="12.8")),
        "torch is not installed": replace(fp, torch=None),
        "does not run or prints no version for -dumpfullversion": replace(fp, gcc_version=None),
        "g++: no host C++ compiler (g++ on PATH)": replace(fp, gcc_version=None, cxx_path=None),
        "is newer than nvcc 13.0 accepts (max gcc 15": replace(fp, gcc_version="16.1.0"),
        "include/cuda.h: missing": replace(fp, cuda_h=None),
        "crt/host_config.h: missing": replace(fp, host_config_h=None),
        "ninja: not found on PATH": replace(fp, ninja_path=None),
        "GB free, a flash-attn build needs": replace(fp, disk_free_gb=1.0),
    }
    for expected, broken in cases.items():
        lines = found(spec, broken)
        assert any(expected in line for line in lines), (expected, lines)
        assert all("\n" not in line and "(" in line for line in lines)


def test_archs_this_nvcc_or_flash_attention_cannot_build(stub_env):
    spec, fp = stub_env
    (line,) = found(spec, fp, archs=("80", "101"))  # 13.0 renamed sm_101 to sm_110
    assert "cannot compile sm_101" in line and "drop the arch or use a newer CUDA line" in line
    (line,) = found(spec, fp, archs=("75", "90"))  # nvcc 13.0 builds sm_75, FlashAttention-2 does not run there
    assert "sm_75 older than FlashAttention-2 supports" in line


def test_too_little_memory_suggests_mem_gb(stub_env):
    spec, fp = stub_env
    (line,) = found(spec, fp, mem_gb=2.0)
    assert line.startswith("/proc/meminfo: 2.0 GB available") and "--mem-gb" in line


def test_the_gcc_cap_and_archs_come_from_the_real_nvcc():
    kb = load_knowledge().cuda_lines["13.0"]
    assert host_config_cap(str(CUDA / "include/crt/host_config.h")) == kb.max_gcc
    codes = nvcc_gpu_codes(str(CUDA / "bin/nvcc"))
    assert codes == {a for a in kb.archs if a.isdigit()}


def test_missing_nvcc_and_headers_from_a_real_half_toolkit(stub_env, tmp_path):
    spec, _ = stub_env
    empty = probe(str(tmp_path), spec.toolchain.python_executable)
    assert any("bin/nvcc: nvcc not found" in line for line in found(spec, empty))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(CUDA / "bin/nvcc")  # nvcc without the toolkit's headers
    headless = probe(str(tmp_path), spec.toolchain.python_executable)
    assert headless.nvcc_version and not headless.cuda_h
    assert any(f"{tmp_path}/include/cuda.h: missing" in line for line in found(spec, headless))


def test_the_gpu_machine_fingerprint_passes_and_a_changed_image_is_refused():
    spec = checked_spec(ROOT / "envs" / "gpu-machine.yaml")
    h200 = from_dict(json.loads((ROOT / "tests/fingerprints/healthy-h200.json").read_text())["fingerprint"])
    assert found(spec, h200, mem_gb=240.0) == []
    changed = replace(h200, gcc_version="14.2.0", torch=TorchInfo("2.10.0+cu130", "13.0", False, "/x"))
    fix = "(fix the machine or the toolchain section of envs/gpu-machine.yaml)"
    with pytest.raises(ToolkitError) as error:
        run_preflight(preflight_input(spec, changed, spec.archs, 240.0, Path("/tmp")))
    assert str(error.value).split("\nerror: ") == [f"/usr/bin/g++: gcc 14, the line wants 13 {fix}",
                                                   f"/x/version.py: torch 2.10.0, the line wants 2.11.0 {fix}",
                                                   f"/x/version.py: torch C++11 ABI False, the line wants True {fix}"]


@pytest.mark.parametrize("nvcc, status", [("12.6.85", "ok"), ("12.4.131", "warn"), ("13.0.88", "fail")])
def test_torch_nvcc_mismatch_is_one_policy_in_preflight_and_doctor(nvcc, status):
    """torch's own rule (torch/utils/cpp_extension.py `_check_cuda_version`): a CUDA minor mismatch within
    a major builds with a warning, across majors it raises. The build refuses exactly where doctor fails,
    warns where doctor warns; the recorded cu126 torch beside a site nvcc (tests/fingerprints)."""
    recorded, probed, _ = read_report(ROOT / "tests/fingerprints/nvcc-torch-mismatch.json")
    fp = replace(recorded, nvcc_version=nvcc)
    (row,) = [r for r in evaluate(Facts(fp, probed, None)) if r.check == "torch-vs-nvcc"]
    assert row.status == status
    p = preflight_input(checked_spec(ROOT / "envs" / "cu126.yaml"), fp, ("80",), 240.0, Path("/tmp"))
    torch_file = f"{fp.torch.path}/version.py: "
    refused = [line for line in problems(p) if line.startswith(torch_file)]
    warned = [line for line in warnings(p) if line.startswith(torch_file)]
    assert (len(refused), len(warned)) == {"ok": (0, 0), "warn": (0, 1), "fail": (1, 0)}[status]
    assert all(row.value in line and row.fix in line for line in refused + warned)  # the same words in both


def test_a_minor_mismatch_builds_and_prints_a_warning(stub_env, capsys):
    spec, fp = stub_env
    newer_minor = replace(fp, torch=replace(fp.torch, cuda="13.1"))
    run_preflight(preflight_input(spec, newer_minor, spec.archs, 20.0, Path("/tmp")))  # no refusal
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "built for CUDA 13.1, nvcc is 13.0: torch builds with a warning" in err
    with pytest.raises(ToolkitError, match="torch refuses to build extensions across CUDA majors"):
        run_preflight(preflight_input(spec, replace(fp, torch=replace(fp.torch, cuda="12.9")), spec.archs, 20.0,
                                      Path("/tmp")))


# doctor's rows of toolkit/machine/checks.py (torch-cuda: its CPU-build verdict; the H200's probe saw CUDA usable)
SHARED_ROWS = ("python", "nvcc", "cuda-headers", "gcc", "torch", "torch-cuda", "torch-vs-nvcc")


@pytest.mark.parametrize("edit, check, status", [
    ({}, None, "ok"),
    ({"nvcc_path": None, "nvcc_version": None}, "nvcc", "fail"),
    ({"nvcc_version": None}, "nvcc", "fail"),
    ({"cuda_h": None}, "cuda-headers", "fail"),
    ({"host_config_h": None}, "cuda-headers", "fail"),
    ({"gcc_version": "16.1.0"}, "gcc", "fail"),
    ({"gcc_version": None}, "gcc", "fail"),
    ({"gcc_version": None, "cxx_path": None}, "gcc", "fail"),
    ({"torch": TorchInfo("2.11.0+cu130", "12.9", True, "/t")}, "torch-vs-nvcc", "fail"),
    ({"torch": TorchInfo("2.11.0+cu130", "13.1", True, "/t")}, "torch-vs-nvcc", "warn"),
    ({"torch": None}, "torch", "fail"),
    ({"python_version": None, "torch": None}, "python", "fail"),
    ({"torch": TorchInfo("unknown", "13.0", True, "/t")}, "torch", "fail"),
    ({"torch": TorchInfo("2.11.0+cpu", None, True, "/t")}, "torch-cuda", "fail"),
])
def test_doctor_fails_exactly_where_the_build_is_refused(monkeypatch, edit, check, status):
    """The recorded H200 (which passes preflight) broken one field at a time: doctor's rows of the shared
    checks and preflight's lines are the same findings, a `fail` refused and a `warn` printed."""
    monkeypatch.chdir(ROOT)  # doctor --line gpu-machine reads the committed lock (read only)
    recorded, probed, _ = read_report(ROOT / "tests/fingerprints/healthy-h200.json")
    fp = replace(recorded, **edit)
    spec = checked_spec(ROOT / "envs" / "gpu-machine.yaml")
    line = gather_line(spec.line, spec, None, fp.machine)
    rows = {r.check: r for r in evaluate(Facts(fp, probed, line)) if r.check in SHARED_ROWS}
    assert {c: r.status for c, r in rows.items() if r.status != "ok"} == ({check: status} if check else {})
    p = replace(preflight_input(spec, fp, spec.archs, 240.0, Path("/tmp")), gcc_cap=probed.nvcc_max_gcc)
    refused, warned = problems(p), warnings(p)
    for row in rows.values():
        said = f"{row.value} ({row.fix})"
        assert (said in refused, said in warned) == (row.status == "fail", row.status == "warn"), (said, refused)

"""Failure diagnosis: logs produced by the real tools (nvcc 13.0, g++, python, the shell) are matched
against toolkit/knowledge/build_failures.yaml and explained in one line, by `toolkit explain` too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest
import yaml

from toolkit.diagnose import CATALOG, diagnose

NVCC = Path("/usr/local/cuda/bin/nvcc")
needs_nvcc = pytest.mark.skipif(not NVCC.exists(), reason="needs the real nvcc at /usr/local/cuda")
KERNEL = "__global__ void k(float *x, int n) { int i = threadIdx.x; if (i < n) x[i] = x[i] * x[i] + 1.f; }\n"


def output_of(cmd: list[str], **kwargs) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, **kwargs)
    assert done.returncode != 0, f"expected {cmd[0]} to fail"
    return done.stdout + done.stderr


def diagnosed(text: str) -> str:
    found = diagnose(text)
    assert found is not None, text[-2000:]
    return found.failure.id


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    path = tmp_path / "k.cu"
    path.write_text(KERNEL)
    return path


def test_catalog_entries_are_complete_and_sourced():
    data = yaml.safe_load(CATALOG.read_text())
    ids = [entry["id"] for entry in data["failures"]]
    assert len(ids) == len(set(ids))
    for entry in data["failures"]:
        assert {"id", "pattern", "cause", "fix", "source"} <= entry.keys(), entry
        assert entry["source"] in data["sources"], entry["id"]
        groups = re.compile(entry["pattern"]).groups
        for text in (entry["cause"], entry["fix"]):
            assert all(int(n) <= groups for n in re.findall(r"\{(\d)\}", text)), entry["id"]
    seeds = {"oom-killed", "unsupported-gnu-version", "unsupported-gpu-architecture", "cuda-h-missing",
             "nvcc-not-found", "torch-missing-build-isolation", "undefined-symbol"}
    assert seeds <= set(ids)


@needs_nvcc
def test_unsupported_gpu_architecture_from_real_nvcc(kernel):
    text = output_of([str(NVCC), "-gencode", "arch=compute_999,code=sm_999", "-c", str(kernel)])
    found = diagnose(text)
    assert found.failure.id == "unsupported-gpu-architecture" and "compute_999" in found.cause


@needs_nvcc
def test_unsupported_gnu_version_from_real_host_config(kernel):
    # this machine's gcc is accepted, so the host compiler is told it is gcc 16: the real header then refuses it
    text = output_of([str(NVCC), "-Xcompiler", "-U__GNUC__", "-Xcompiler", "-D__GNUC__=16", "-c", str(kernel)])
    found = diagnose(text)
    assert found.failure.id == "unsupported-gnu-version"
    assert "newest allowed 15" in found.cause and "use gcc <= 15" in found.fix


def test_cuda_h_missing_from_real_gcc(tmp_path):
    (tmp_path / "api.cpp").write_text("#include <cuda.h>\n")
    text = output_of(["g++", "-c", str(tmp_path / "api.cpp"), "-o", str(tmp_path / "api.o")])
    assert diagnosed(text) == "cuda-h-missing"


def test_nvcc_not_found_from_a_real_shell():
    text = subprocess.run(["/bin/sh", "-c", "nvcc --version"], capture_output=True, text=True,
                          env={"PATH": "/nonexistent"}).stderr
    assert diagnosed(text) == "nvcc-not-found"


def test_torch_missing_under_isolation_from_real_python():
    text = output_of([sys.executable, "-I", "-S", "-c", "import torch"])  # no site-packages: as in pip's isolation
    assert diagnosed(text) == "torch-missing-build-isolation"


def test_undefined_symbol_on_import_from_a_real_extension(tmp_path):
    """An extension referring to a c10 symbol that is not there, as a wheel built for another torch does."""
    (tmp_path / "broken_ext.cpp").write_text(
        '#include <Python.h>\nnamespace c10 { struct Error { Error(const char *); }; }\n'
        'static PyModuleDef m = {PyModuleDef_HEAD_INIT, "broken_ext", nullptr, -1, nullptr};\n'
        'PyMODINIT_FUNC PyInit_broken_ext() { if (!Py_IsInitialized()) c10::Error("x"); return PyModule_Create(&m); }\n')
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    subprocess.run(["g++", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(tmp_path / "broken_ext.cpp"),
                    "-o", str(tmp_path / f"broken_ext{suffix}")], check=True)
    text = output_of([sys.executable, "-c", "import broken_ext"], cwd=tmp_path)
    found = diagnose(text)
    assert found.failure.id == "undefined-symbol" and "_ZN3c105ErrorC1EPKc" in found.cause


@needs_nvcc
def test_oom_kill_from_a_real_nvcc_whose_cicc_is_killed(kernel):
    """What the kernel's OOM killer does to a build: SIGKILL to cicc; nvcc reports it in its own words."""
    proc = subprocess.Popen([str(NVCC), "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                             "arch=compute_90,code=sm_90", "-c", str(kernel), "-o", os.devnull],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    killed = False
    while not killed and time.monotonic() < deadline and proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.name() == "cicc":
                    child.send_signal(signal.SIGKILL)
                    killed = True
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.005)
    text = proc.communicate(timeout=60)[0]
    if not killed:
        pytest.skip("cicc finished before it could be killed")
    assert diagnosed(text) == "oom-killed", text


def test_the_specific_cause_wins_over_generic_error_lines():
    log = ("  FAILED: /b/flash_fwd.o\n  nvcc error   : 'cicc' died due to signal 9 (Kill signal)\n"
           "  ninja: build stopped: subcommand failed.\n  RuntimeError: Error compiling objects for extension\n"
           "  ModuleNotFoundError: No module named 'torch'\n")
    assert diagnosed(log) == "oom-killed"
    assert diagnose("all good\nnothing failed here\n") is None


def test_explain_cli_prints_cause_and_fix_or_the_first_error(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("noise\nnvcc fatal   : Unsupported gpu architecture 'compute_130'\n")
    done = subprocess.run([sys.executable, "-m", "toolkit", "explain", str(log)], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.count("\n") == 1 and "compute_130" in done.stdout and "newer CUDA line" in done.stdout
    assert "log line 2" in done.stdout
    log.write_text("compiling\nsrc/x.cu(12): error: identifier \"foo\" is undefined\nmore errors later: error: x\n")
    done = subprocess.run([sys.executable, "-m", "toolkit", "explain", str(log)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert 'first error line: src/x.cu(12): error: identifier "foo" is undefined' in done.stderr
    missing = subprocess.run([sys.executable, "-m", "toolkit", "explain", str(tmp_path / "nope.log")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr


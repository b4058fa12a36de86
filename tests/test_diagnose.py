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
from cuda_toolchain import NVCC

from toolkit.build.diagnose import CATALOG, diagnose

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


@pytest.mark.nvcc
def test_unsupported_gpu_architecture_from_real_nvcc(kernel):
    text = output_of([str(NVCC), "-gencode", "arch=compute_999,code=sm_999", "-c", str(kernel)])
    found = diagnose(text)
    assert found.failure.id == "unsupported-gpu-architecture" and "compute_999" in found.cause


@pytest.mark.nvcc
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


@pytest.mark.nvcc
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



# ---------------------------------------------------------------- advice from knowledge, not a fixed string


@pytest.mark.nvcc
@pytest.mark.parametrize("arch, direction, lines", [
    ("compute_70", "older CUDA line (<= 12.9)", "11.8 to 12.9"),  # nvcc 13 dropped sm_50..72
    ("sm_70", "older CUDA line (<= 12.9)", "11.8 to 12.9"),
    ("compute_101", "CUDA 12.8 to 12.9", "12.8 to 12.9"),  # 13.0 calls Thor sm_110
    ("compute_999", "newer CUDA line", "no CUDA line"),
])
def test_arch_advice_comes_from_each_lines_arch_range(kernel, arch, direction, lines):
    flag = ["-arch", arch] if arch.startswith("sm_") else ["-gencode", f"arch={arch},code=sm_{arch.split('_')[1]}"]
    text = output_of([str(NVCC), *flag, "-c", str(kernel)])
    found = diagnose(text)
    assert found.failure.id == "unsupported-gpu-architecture", text
    assert direction in found.fix and lines in found.cause + found.fix, found.one_line()
    if direction.startswith("older"):
        assert "newer" not in found.fix


def test_arch_advice_follows_the_knowledge_files_arch_lists():
    """Every arch some line compiles: the advice names exactly the lines whose `archs` hold it."""
    from toolkit.knowledge.facts import load_knowledge

    kb = load_knowledge()
    for arch in sorted({a for line in kb.cuda_lines.values() for a in line.archs}):
        having = [v for v, line in kb.cuda_lines.items() if arch in line.archs]
        found = diagnose(f"nvcc fatal   : Unsupported gpu architecture 'compute_{arch}'\n")
        named = f"CUDA {having[0]}" + (f" to {having[-1]}" if len(having) > 1 else "")
        assert named in found.cause, (arch, found.cause)


# ---------------------------------------------------------------- the conda-forge toolchain's failures


def gxx_log(tmp_path: Path, source: str, *flags: str) -> str:
    """What a failed ninja step of torch's cpp_extension shows: the command, then g++'s own stderr."""
    (tmp_path / "api.cpp").write_text(source)
    cmd = ["g++", "-c", str(tmp_path / "api.cpp"), "-o", str(tmp_path / "api.o"), *flags]
    return f"FAILED: {tmp_path}/api.o\n{' '.join(cmd)}\n" + output_of(cmd)


@pytest.fixture
def conda_prefix(tmp_path: Path) -> Path:
    """A prefix laid out as conda-forge's cuda-cudart-dev installs it: headers only under
    targets/x86_64-linux/include (recipe: `files: targets/{{ target_name }}/include`), nothing in include/.
    The header is this machine's real CUDA 13.0 cuda_runtime.h (NVIDIA's PyPI wheel)."""
    prefix = tmp_path / "env"
    (prefix / "include").mkdir(parents=True)
    (prefix / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    return prefix


@pytest.mark.parametrize("header", ["cuda_runtime.h", "cublas_v2.h"])
def test_header_under_targets_says_add_isystem_not_install(tmp_path, conda_prefix, header):
    targets = conda_prefix / "targets" / "x86_64-linux" / "include"
    (targets / header).write_text("/* the installed header */\n")
    text = gxx_log(tmp_path, f"#include <{header}>\n", f"-I{conda_prefix}/include")
    found = diagnose(text)
    assert found.failure.id == "cuda-header-under-targets", found.one_line()
    assert f"-isystem {targets}" in found.fix and "install" not in found.fix.split("(")[0]


def test_a_conda_envs_compile_names_its_prefix_by_its_compiler_python_and_torch(tmp_path):
    """torch's cpp_extension in an activated conda env elsewhere (CUDA_HOME another folder): the command names the
    env by its compiler, its python's headers and torch's, never by <prefix>/include; the header is under the env's
    targets/x86_64-linux/include."""
    prefix = tmp_path / "miniforge3" / "envs" / "fa"
    targets = prefix / "targets" / "x86_64-linux" / "include"
    targets.mkdir(parents=True)
    (targets / "cuda_runtime_api.h").write_text("/* installed */\n")
    (tmp_path / "api.cpp").write_text("#include <cuda_runtime_api.h>\n")
    error = output_of(["g++", "-c", str(tmp_path / "api.cpp"), "-o", str(tmp_path / "api.o")])
    command = (f"{prefix}/bin/x86_64-conda-linux-gnu-c++ -MMD -MF api.o.d -DTORCH_EXTENSION_NAME=flash_attn_2_cuda "
               f"-I{prefix}/lib/python3.12/site-packages/torch/include "
               f"-isystem {prefix}/lib/python3.12/site-packages/torch/include/torch/csrc/api/include "
               f"-I/usr/local/cuda-elsewhere/include -isystem {prefix}/include/python3.12 -fPIC -std=c++17 "
               f"-c {tmp_path}/api.cpp -o api.o")
    for log in (f"FAILED: api.o\n{command}\n{error}", f"FAILED: api.o\n{command.split(' -I')[0]}\n{error}",
                f"FAILED: api.o\n/usr/bin/g++ -isystem {prefix}/include/python3.12 -c api.cpp\n{error}"):
        found = diagnose(log)
        assert found is not None and found.failure.id == "cuda-header-under-targets", found and found.one_line()
        assert f"-isystem {targets}" in found.fix


def test_header_missing_everywhere_still_says_install(tmp_path, conda_prefix):
    text = gxx_log(tmp_path, "#include <cuda_runtime.h>\n", f"-I{conda_prefix}/include")
    found = diagnose(text)
    assert found.failure.id == "cuda-h-missing" and "cuda-cudart-dev" in found.fix


@pytest.mark.parametrize("header, package", [
    ("cublas_v2.h", "libcublas-dev"), ("cublasLt.h", "libcublas-dev"), ("cusparse.h", "libcusparse-dev"),
    ("cusolverDn.h", "libcusolver-dev"), ("cusolver_common.h", "libcusolver-dev"),
])
def test_missing_math_library_header_names_its_dev_package(tmp_path, header, package):
    found = diagnose(gxx_log(tmp_path, f"#include <{header}>\n"))
    assert found.failure.id == "cuda-library-header-missing" and f"install {package}" in found.fix


TORCH_214 = Path("/opt/pypi-more/files/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")


@pytest.mark.skipif(not TORCH_214.exists(), reason=f"needs the real torch 2.14.1 wheel at {TORCH_214}")
def test_aten_cxx20_error_from_the_real_torch_header(tmp_path):
    """torch 2.14.1's own ATen/ATen.h (read from its wheel), compiled as flash-attn <= 2.8.3.post2 does: -std=c++17."""
    import zipfile

    include = tmp_path / "include"
    with zipfile.ZipFile(TORCH_214) as wheel:
        wheel.extract("torch/include/ATen/ATen.h", tmp_path)
    (tmp_path / "torch" / "include").rename(include)
    found = diagnose(gxx_log(tmp_path, "#include <ATen/ATen.h>\n", "-std=c++17", f"-I{include}"))
    assert found.failure.id == "aten-needs-cxx20", found.one_line()
    assert "-std=c++17" in found.fix and "2.8.3.post2" in found.fix


def test_ccbin_twice_from_an_activated_conda_env():
    """The message older nvcc stop with (quoted in conda-forge/nvcc-feedstock#34); nvcc 13.0 only warns."""
    log = ("/env/bin/nvcc -ccbin /env/bin/x86_64-conda-linux-gnu-c++ -c flash_fwd.cu\n"
           "nvcc fatal   : redefinition of argument 'compiler-bindir'\n")
    found = diagnose(log)
    assert found.failure.id == "nvcc-ccbin-twice" and "NVCC_PREPEND_FLAGS" in found.fix


@pytest.mark.nvcc
def test_nvcc_13_ccbin_warning_is_not_a_failure(kernel):
    done = subprocess.run([str(NVCC), "-ccbin", "/usr/bin/g++", "-c", str(kernel), "-o", os.devnull],
                          env={**os.environ, "NVCC_PREPEND_FLAGS": "-ccbin=/usr/bin/gcc"}, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "compiler-bindir" in done.stderr
    assert diagnose(done.stderr) is None


def test_explain_prefix_names_the_environment_the_log_does_not_show(tmp_path, conda_prefix):
    """A log without the compile command: `--prefix` says which environment to look in."""
    (conda_prefix / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").write_text("/* installed */\n")
    (tmp_path / "api.cpp").write_text("#include <cuda_runtime.h>\n")
    log = tmp_path / "build.log"
    log.write_text(output_of(["g++", "-c", str(tmp_path / "api.cpp"), "-o", str(tmp_path / "api.o")]))
    plain = subprocess.run([sys.executable, "-m", "toolkit", "explain", str(log)], capture_output=True, text=True)
    assert plain.returncode == 0 and "[cuda-h-missing" in plain.stdout
    told = subprocess.run([sys.executable, "-m", "toolkit", "explain", str(log), "--search-prefix", str(conda_prefix)],
                          capture_output=True, text=True)
    assert told.returncode == 0 and "[cuda-header-under-targets" in told.stdout
    assert f"-isystem {conda_prefix}/targets/x86_64-linux/include" in told.stdout

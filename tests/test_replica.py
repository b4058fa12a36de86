"""The locked path against a replica of conda-forge's CUDA toolchain (tests/conda_forge_replica).

The replica carries conda-forge's real records (a published pixi.lock) and the feedstock recipes' constraints
for every line, and for CUDA 13.0 the real file layout with real payload (this machine's CUDA 13.0 is made of
NVIDIA's wheels): headers only under targets/x86_64-linux/include, conda-forge's nvcc.profile, cuda-nvcc's
activation script. What these tests caught on the code before issue 13 (kept in the report):
  - `toolkit build` of the fixture: `fatal error: cuda_runtime_api.h: No such file or directory` (g++, as torch
    compiles a .cpp), while preflight passed;
  - inside conda-forge's activation, NVCC_PREPEND_FLAGS="-ccbin=$CXX" reaches nvcc beside the build's own -ccbin:
    nvcc 13.0 says `nvcc warning : incompatible redefinition for option 'compiler-bindir', the last value of this
    option was used` (a warning, not the feared fatal error; which compiler wins depends on flag order);
  - cu124 with gcc 13 does not solve (cuda-nvcc-impl 12.4's gcc_impl_linux-64 >=6,<13), `toolkit check` passes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conda_channel import build_channel, build_simple_index, serve_directory
from conda_forge_replica.replica import (
    PayloadRoots,
    channel_folder,
    channels,
    layout_prefix,
    load_records,
    packages,
    patched_profile,
)
from fixtures.fa_fixture_project import make_stub_torch_env, make_torch_double_wheel, pack_fixture_sdist, site_packages
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.env.engine import rattler_solve
from toolkit.env.lock import LockedSdist, conda_request
from toolkit.machine.line_env import include_environment
from toolkit.spec.envspec import load_spec

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "tests" / "conda_forge_replica"
CUDA_ROOT = Path("/usr/local/cuda")
TRIPLE_INCLUDE = "targets/x86_64-linux/include"
FA_SDIST = LockedSdist(  # the pinned sdist, sha256 from PyPI's simple index (as locks/gpu-machine.conda-lock.yml)
    url="https://files.pythonhosted.org/packages/6c/b1/b77625e3d11260d2bd6a4fc249a4be9a3da97ff848e2222e810c4f0e0211/"
        "flash_attn-2.8.3.post2.tar.gz",
    filename="flash_attn-2.8.3.post2.tar.gz", sha256="d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b")
needs_cuda = pytest.mark.skipif(not (CUDA_ROOT / "dist-info").is_dir(),
                                reason="needs /usr/local/cuda made of NVIDIA's wheels (its dist-info/ gives the payload)")
cuda_torch = os.environ.get("FA_CUDA_TORCH")
needs_cuda_torch = pytest.mark.skipif(
    not cuda_torch, reason="set FA_CUDA_TORCH=DIR after tests/conda_forge_replica/install_cuda_torch.sh DIR "
                           "(the real torch 2.14.1+cu130 with NVIDIA's cuBLAS/cuSPARSE/cuSOLVER wheels)")


# ---------------------------------------------------------------- the data


def test_every_record_and_file_names_its_source():
    import yaml

    data = yaml.safe_load((REPLICA / "records.yaml").read_text())
    published = yaml.safe_load((REPLICA / "published.yaml").read_text())
    records = load_records()
    assert {r["source"] for r in records if "url" not in r} <= set(data["sources"])
    assert {r["source"].split(":")[0] for r in records if "url" in r} <= set(published["sources"])
    committed = {e["file"] for r in records for e in r.get("payload", []) if "file" in e}
    assert committed - {"site-packages-README.txt"} <= set(data["files"])
    assert all((REPLICA / "files" / name).is_file() for name in [*committed, *data["files"]])
    real = [r for r in records if "url" in r]
    assert len(real) >= 200 and all(len(r["sha256"]) == 64 and len(r["md5"]) == 32 for r in real)
    # every payload that is not real (wrappers, links to them) says so, and so does its record
    wrappers = [r for r in records if any("wrapper" in e for e in r.get("payload", []))]
    assert wrappers and all(r.get("payload_note") and r.get("stand_in") for r in wrappers)


def test_published_records_are_the_lockfiles_own():
    """A record of published.yaml, checked against the lockfile text it cites (numba-cuda's pixi.lock at the
    cited commit holds the same url with the same sha256): the one the cu130 line solves to on linux-64."""
    import yaml

    entry = next(e for e in yaml.safe_load((REPLICA / "published.yaml").read_text())["records"]
                 if e["url"].endswith("/linux-64/cuda-nvcc_linux-64-13.0.88-hb2fc203_4.conda"))
    # copied by hand from https://github.com/NVIDIA/numba-cuda/blob/fed4b4f1d614/pixi.lock (2026-04-02)
    assert entry["sha256"] == "99e27429c56f1b0120d32cef1996c5124f96f439291ce379dc00ee10b1e576c6"
    assert entry["depends"] == ["__glibc >=2.17,<3.0.a0", "cuda-cudart-dev_linux-64 13.0.*", "cuda-driver-dev_linux-64 13.0.*",
                                "cuda-nvcc-dev_linux-64 13.0.88.*", "cuda-nvcc-impl 13.0.88.*", "cuda-nvcc-tools 13.0.88.*",
                                "sysroot_linux-64 >=2.17,<3.0a0"]


@needs_cuda
def test_nvcc_profile_is_the_wheels_with_conda_forges_patch():
    profile = patched_profile((CUDA_ROOT / "bin" / "nvcc.profile").read_text(),
                              (REPLICA / "files" / "nvcc.profile.patch").read_text())
    assert "TOP              = $(_HERE_)/../$(_TARGET_DIR_)" in profile
    assert '"-I$(TOP)/include"' in profile and "$(TOP)/../../bin" in profile
    with pytest.raises(SystemExit):
        patched_profile("TOP = elsewhere\n", (REPLICA / "files" / "nvcc.profile.patch").read_text())


# ---------------------------------------------------------------- every line's spec against the real constraints


@pytest.fixture(scope="module")
def records_channel(tmp_path_factory) -> Path:
    """Every record of the replica, without payload (a solve needs only repodata): one folder per channel."""
    root = tmp_path_factory.mktemp("replica")
    for channel in channels():
        build_channel(root / channel_folder(channel), packages(PayloadRoots(), with_payload=False, channel=channel))
    return root


def locked_lines() -> list[tuple[str, str]]:
    """(line, platform) for every spec of envs/ whose toolchain is `locked`, for every platform it lists."""
    specs = ((path.stem, load_spec(path)) for path in sorted((ROOT / "envs").glob("*.yaml")) if path.stem != "base")
    return [(line, platform) for line, spec in specs if spec.toolchain.kind == "locked" for platform in spec.platforms]


def solve_line(channel: Path, line: str, platform: str = "linux-64", **overrides: str) -> dict[str, Any]:
    """The line's conda layer solved against the replica: {name: record}. Overrides make a variant line that
    extends the real one (envs/<line>.yaml unchanged)."""
    spec_file = ROOT / "envs" / f"{line}.yaml"
    if overrides:
        folder = channel.parent / f"envs-{line}-{'-'.join(overrides.values())}"
        folder.mkdir(exist_ok=True)
        for name in ("base.yaml", f"{line}.yaml"):
            shutil.copy(ROOT / "envs" / name, folder / name)
        spec_file = folder / "variant.yaml"
        spec_file.write_text(f"extends: {line}\n" + "".join(f"{k}: {v}\n" for k, v in overrides.items()))
    spec = load_spec(spec_file)
    request = conda_request(spec)
    replica = tuple((channel / channel_folder(c)).as_uri() for c in spec.channels)  # the spec's channels, in order
    records = rattler_solve(replica, request.specs, platform, request.virtual_packages[platform])
    return {str(r.name.normalized): r for r in records}


def version(solved: dict[str, Any], name: str) -> str:
    return str(solved[name].version)


# conda-forge's newest cuda-nvcc build per line that has published records here, from cuda-nvcc-feedstock's history
# (recipe/meta.yaml build number at the last commit of each version, sbsa builds +100): 12.8.93 2 (6178aaf), 13.0.88 4
# (20056ce); 13.2.78 0 (327347e), 12.6.77 2 (a22d05c), 12.4.131 1 (58899e2), 12.1.105 1 (260b724)
NEWEST_NVCC = {"cu121": ("12.1.105", 1), "cu124": ("12.4.131", 1), "cu126": ("12.6.77", 2), "cu128": ("12.8.93", 2),
               "cu130": ("13.0.88", 4), "cu132": ("13.2.78", 0)}
ARM = {"linux-64": 0, "linux-aarch64": 100}


@pytest.mark.parametrize("line, platform", locked_lines())
def test_every_locked_line_solves_for_every_platform_it_lists(records_channel, line, platform):
    spec = load_spec(ROOT / "envs" / f"{line}.yaml")
    try:
        solved = solve_line(records_channel, line, platform)
    except ToolkitError as exc:  # a line that cannot solve must be refused by `toolkit check`, with its reason
        checked = subprocess.run([sys.executable, "-m", "toolkit", "check", line], cwd=ROOT, capture_output=True, text=True)
        assert checked.returncode != 0 and f"envs/{line}.yaml" in checked.stdout, f"{exc}\n{checked.stdout}"
        return
    assert version(solved, "cuda-version") == spec.cuda
    assert version(solved, "gxx").split(".")[0] == str(spec.gcc)
    assert version(solved, "python").rsplit(".", 1)[0] == spec.python
    assert {"libcublas-dev", "libcusparse-dev", "libcusolver-dev", "cuda-nvcc", "cuda-cudart-dev", "ninja", "pip"} <= set(solved)
    assert all(str(r.subdir) in (platform, "noarch") for r in solved.values())
    if spec.cuda == "11.8":  # NVIDIA's monolithic package from its label; conda-forge's cuda-nvcc starts at 12.0
        assert str(solved["cuda-nvcc"].channel).rstrip("/").endswith("nvidia-label-cuda-11.8.0")
        return
    nvcc, number = NEWEST_NVCC[line]
    sbsa = ARM[platform] if Version(nvcc) < Version("13.1") else 0  # merged sbsa/tegra builds from 13.1 on: no +100
    assert (version(solved, "cuda-nvcc"), solved["cuda-nvcc"].build_number) == (nvcc, number + sbsa)
    assert version(solved, "cuda-nvcc-impl") == nvcc
    # the real records' shapes: cuda-nvcc_<plat> needs the driver stubs and the sysroot, cuda-cudart its _<plat> part
    target = platform
    assert {f"cuda-driver-dev_{target}", f"cuda-cudart_{target}", f"sysroot_{target}", f"cuda-nvcc-dev_{target}"} <= set(solved)
    if Version(nvcc) >= Version("12.4"):
        assert "cuda-nvvm-impl" in solved and f"cuda-crt-dev_{target}" in solved
    if Version(nvcc) >= Version("12.9"):
        assert {"libnvptxcompiler-dev", f"libnvptxcompiler-dev_{target}"} <= set(solved)
    if platform == "linux-aarch64":
        assert str(solved["arm-variant"].build) == "sbsa"


def test_cu124_with_gcc_13_cannot_solve(records_channel):
    """Every cuda-nvcc-impl 12.4 says gcc_impl_linux-64 >=6,<13: conda-forge's packaging bound, stricter than
    nvcc 12.4's host_config.h (gcc 13 was first allowed by 12.5)."""
    with pytest.raises(ToolkitError) as caught:
        solve_line(records_channel, "cu124", gcc="13")
    assert "gcc" in str(caught.value)
    assert version(solve_line(records_channel, "cu124", gcc="12"), "cuda-nvcc-impl").startswith("12.4.")


def test_cu118_without_nvidias_label_is_refused_by_check_and_cannot_solve(records_channel, tmp_path):
    """conda-forge has no cuda-nvcc 11.8 (its cuda-nvcc starts at 12.0.76): without nvidia/label/cuda-11.8.0 in
    channels the solve fails, and `toolkit check` says so first, in one line naming the file and the fix."""
    with pytest.raises(ToolkitError) as caught:
        solve_line(records_channel, "cu118", channels="[conda-forge]")
    assert "does not solve for linux-64 with __cuda=11.8" in str(caught.value)
    (tmp_path / "envs").mkdir()
    shutil.copy(ROOT / "envs" / "base.yaml", tmp_path / "envs" / "base.yaml")
    (tmp_path / "envs" / "cu118.yaml").write_text((ROOT / "envs" / "cu118.yaml").read_text().replace(
        "channels: [nvidia/label/cuda-11.8.0, conda-forge]", "channels: [conda-forge]"))
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", "cu118"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "nvidia/label/cuda-11.8.0" in line]
    assert len(lines) == 1 and lines[0].startswith("envs/cu118.yaml:")
    assert "channels: [nvidia/label/cuda-11.8.0, conda-forge]" in lines[0]  # the fix


# ---------------------------------------------------------------- the locked path end to end, real nvcc


def toolkit(cwd: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cwd / ".cache"), **env})


@pytest.fixture(scope="module")
def replica_project(tmp_path_factory):
    """`toolkit lock` + `toolkit install` of a CUDA 13.0 line from the replica channel with real payload.

    gcc 12: the replica's compilers wrap this machine's g++ 12 (records.yaml says so), so the line asks for
    what it gets. The torch of the pip layer is the fixture's test double (the fixture does not link torch)."""
    if not (CUDA_ROOT / "dist-info").is_dir():
        pytest.skip("needs /usr/local/cuda made of NVIDIA's wheels")
    tmp = tmp_path_factory.mktemp("replica-e2e")
    channel = build_channel(tmp / "channel", packages(PayloadRoots(CUDA_ROOT.resolve(),
                                                                   Path(cuda_torch) if cuda_torch else None)))
    files = [make_torch_double_wheel(tmp / "dist", "2.13.0", "13.0"), pack_fixture_sdist(tmp / "dist")]
    build_simple_index(tmp / "pypi", files)
    venv_python = make_stub_torch_env(tmp / "venv", None)
    # the packages of the interpreter running the tests (setuptools, wheel): the stub venv's system site is the
    # base interpreter's, which lacks them when the tests themselves run in a venv
    Path(site_packages(venv_python), "test-interpreter.pth").write_text(f"{site_packages(Path(sys.executable))}\n")
    env = {"FIXTURE_PYTHON": str(venv_python), "XDG_CACHE_HOME": str(tmp / "xdg")}
    project = tmp / "project"
    (project / "envs").mkdir(parents=True)
    (project / "envs" / "base.yaml").write_text((ROOT / "envs" / "base.yaml").read_text())
    with serve_directory(tmp / "pypi") as url:
        (project / "envs" / "cu130.yaml").write_text(f"""extends: base
cuda: "13.0"
python: "{sys.version_info.major}.{sys.version_info.minor}"
gcc: 12
channels: [{channel.as_uri()}]
pip_packages: null
torch: {{version: "2.13.0", index: "{url}/simple"}}
archs: ["90"]
""")
        locked = toolkit(project, "lock", "cu130", "--backend", "rattler", "--pypi", f"{url}/simple", env=env)
        assert locked.returncode == 0, locked.stderr
        installed = toolkit(project, "install", "cu130", "--backend", "rattler", env=env)
        assert installed.returncode == 0, installed.stderr
        prefix = project / ".envs" / "cu130"
        purelib = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        Path(site_packages(venv_python), "conda-prefix.pth").write_text(f"{purelib}\n")
        yield project, prefix, env  # the index stays up: the build fetches the locked sdist from it


def test_installed_prefix_has_conda_forges_layout(replica_project):
    _, prefix, _ = replica_project
    assert not (prefix / "include").exists()  # conda-forge puts no CUDA header at the prefix root
    assert (prefix / TRIPLE_INCLUDE / "cuda_runtime.h").is_file() and (prefix / TRIPLE_INCLUDE / "crt").is_dir()
    assert (prefix / "lib" / "libcudart.so").resolve() == (prefix / "targets/x86_64-linux/lib/libcudart.so.13").resolve()
    assert (prefix / "bin" / "nvcc.profile").read_text().startswith("\nTOP              = $(_HERE_)/../$(_TARGET_DIR_)")
    assert (prefix / "etc/conda/activate.d/~cuda-nvcc_activate.sh").is_file()
    conda_meta = {json.loads(p.read_text())["name"] for p in (prefix / "conda-meta").glob("*.json")}
    if cuda_torch:  # the library wheels' headers (without FA_CUDA_TORCH those -dev packages are empty)
        assert (prefix / TRIPLE_INCLUDE / "cublas_v2.h").is_file() and (prefix / TRIPLE_INCLUDE / "cusolverDn.h").is_file()
    assert {"cuda-nvcc-impl", "cuda-nvcc-tools", "cuda-cudart-dev_linux-64", "libcublas-dev"} <= conda_meta


def activated_environment(prefix: Path) -> dict[str, str]:
    """What `conda activate` leaves behind: gxx_linux-64's CXX/CC, then cuda-nvcc's activate.sh (-ccbin=$CXX)."""
    script = (f'export CONDA_PREFIX={prefix} CXX={prefix}/bin/x86_64-conda-linux-gnu-c++ '
              f'CC={prefix}/bin/x86_64-conda-linux-gnu-cc; . "{prefix}/etc/conda/activate.d/~cuda-nvcc_activate.sh"; '
              'env -0')
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith("NVCC_")})
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CXX", "CC", "CONDA_PREFIX")}


@pytest.mark.parametrize("activated", [False, True], ids=["plain", "conda-activated"])
def test_locked_build_of_the_fixture_with_the_real_nvcc(replica_project, activated):
    project, prefix, env = replica_project
    extra = activated_environment(prefix) if activated else {}
    if activated:
        assert "-ccbin=" in extra["NVCC_PREPEND_FLAGS"]
    built = toolkit(project, "build", "cu130", "--force", env={**env, **extra})
    assert built.returncode == 0, built.stderr + built.stdout
    record = json.loads(max((project / "wheelhouse" / "cu130").glob("*.build.json"), key=os.path.getmtime).read_text())
    assert record["inputs"]["toolchain"]["kind"] == "locked"
    assert record["environment"]["CUDA_HOME"] == str(prefix) and record["environment"]["CXX"] == str(prefix / "bin/g++")
    assert record["fingerprint"]["nvcc_path"] == str(prefix / "bin" / "nvcc")
    assert record["outputs"]["wheel"].startswith("fa_fixture-0.1.0+cu130torch2.13-")
    purelib = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert list(purelib.glob("fa_fixture-0.1.0+cu130torch2.13.dist-info"))  # installed into the prefix
    assert str(prefix / TRIPLE_INCLUDE) in record["environment"]["CPATH"].split(os.pathsep)
    assert record["neutralised_environment"].get("NVCC_PREPEND_FLAGS") == extra.get("NVCC_PREPEND_FLAGS")
    log = (project / record["log"]).read_text()
    assert "redefinition for option 'compiler-bindir'" not in log and "redefinition of argument" not in log
    imported = subprocess.run([str(prefix / "bin" / "python"), "-c",
                               "import fa_fixture_cuda as m; print(m.kernels(), m.cuda_runtime_version())"],
                              capture_output=True, text=True, cwd="/", env={**os.environ, **env})
    assert imported.returncode == 0 and "scale_kernel" in imported.stdout and "130" in imported.stdout, imported.stderr


# ---------------------------------------------------------------- flash-attn's flash_api.cpp against the real CUDA torch


def _flash_attn_source(tmp: Path) -> Path:
    from toolkit.build.builder import extract_sdist, fetch_sdist

    sdist = fetch_sdist(FA_SDIST, Path(os.environ.get("FA_SDIST_CACHE", ROOT / ".cache")))
    return extract_sdist(sdist, tmp)[0]


def _torch_include_flags(torch_dir: str, cuda_home: Path) -> list[str]:
    """What torch's cpp_extension gives g++ for a CUDAExtension's .cpp (include_paths(device_type='cuda'))."""
    code = ("from torch.utils import cpp_extension as c; import inspect\n"
            "args = {'device_type': 'cuda'} if 'device_type' in inspect.signature(c.include_paths).parameters "
            "else {'cuda': True}\nprint('\\n'.join(c.include_paths(**args)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": torch_dir, "CUDA_HOME": str(cuda_home)})
    return [f"-I{p}" for p in done.stdout.split()]


@needs_cuda
@needs_cuda_torch
def test_flash_api_cpp_compiles_with_the_build_include_environment(tmp_path):
    """The real flash_api.cpp of the pinned sdist, g++ as torch's cpp_extension runs it, against the real CUDA
    torch 2.14.1+cu130 and the replica's layout: it fails with torch's include paths alone, and compiles with
    the build's CPATH (-std=c++20: torch 2.14's ATen requires it; the sdist's setup.py patch is separate)."""
    import sysconfig

    prefix = tmp_path / "prefix"
    layout_prefix(prefix, PayloadRoots(CUDA_ROOT.resolve(), Path(cuda_torch)))
    src = _flash_attn_source(tmp_path / "src")
    flags = [*_torch_include_flags(cuda_torch, prefix), f"-I{src}/csrc/flash_attn", f"-I{src}/csrc/flash_attn/src",
             f"-I{src}/csrc/cutlass/include", f"-I{sysconfig.get_paths()['include']}"]
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-D_GLIBCXX_USE_CXX11_ABI=1", *flags, f"{src}/csrc/flash_attn/flash_api.cpp"]
    bare = {k: v for k, v in os.environ.items() if k not in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")}
    without = subprocess.run(cmd, capture_output=True, text=True, env=bare)
    assert without.returncode != 0 and "cuda_runtime.h: No such file or directory" in without.stderr
    with_cpath = subprocess.run(cmd, capture_output=True, text=True, env={**bare, **include_environment(prefix)})
    assert with_cpath.returncode == 0, with_cpath.stderr[-3000:]


# ---------------------------------------------------------------- preflight: what the compilers actually see


def header_problem(prefix: Path, spec_version: str, compile_env: dict[str, str]) -> str | None:
    from dataclasses import replace

    from toolkit.machine.fingerprint import probe
    from toolkit.machine.preflight import headers_visible, preflight_input

    spec = load_spec(ROOT / "envs" / "cu130.yaml")
    fp = probe(str(prefix), sys.executable, shutil.which("g++"))
    return headers_visible(preflight_input(replace(spec, flash_attn_version=spec_version), fp, ("90",), 20.0,
                                           prefix, compile_env))


def test_preflight_asks_the_compilers_not_the_filesystem(replica_project):
    """The prefix has cuda_runtime.h (under targets/, where conda-forge puts it): the old glob passed. g++ given
    what torch gives it does not find it, and preflight now says where it is and that g++ cannot see it."""
    _, prefix, _ = replica_project
    bare = {k: v for k, v in os.environ.items() if k not in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")}
    problem = header_problem(prefix, "2.8.3.post2", bare)
    assert problem and "\n" not in problem
    assert f"g++ ({shutil.which('g++')}): cuda_runtime.h is at {prefix / TRIPLE_INCLUDE / 'cuda_runtime.h'}" in problem
    assert "nvcc (" not in problem  # nvcc finds it through conda-forge's nvcc.profile
    assert header_problem(prefix, "2.8.3.post2", {**bare, **include_environment(prefix)}) is None


def test_preflight_wants_the_library_headers_for_flash_attn_that_reaches_them(replica_project):
    """flash-attn <= 2.7.0.post2 includes ATen/cuda/CUDAContext.h (-> cublas_v2.h, cusparse.h, cusolverDn.h)."""
    _, prefix, _ = replica_project
    env = {**os.environ, **include_environment(prefix)}
    problem = header_problem(prefix, "2.6.3", env)
    if cuda_torch:  # the replica's -dev packages carry the real headers from NVIDIA's wheels
        assert problem is None
    else:  # without the wheels those packages are empty here: preflight names the package to install
        assert problem and "cublas_v2.h is not installed (add libcublas-dev to conda_packages)" in problem
    assert header_problem(prefix, "2.8.3.post2", env) is None


# ---------------------------------------------------------------- the build environment's two fixes, alone


def test_include_environment_names_the_target_headers_of_conda_forges_layout(tmp_path):
    for folder in ("targets/x86_64-linux/include/cccl", "targets/sbsa-linux/include", "bin"):
        (tmp_path / folder).mkdir(parents=True)
    cpath = include_environment(tmp_path)["CPATH"].split(os.pathsep)
    assert cpath == [str(tmp_path / "targets/sbsa-linux/include"), str(tmp_path / "targets/x86_64-linux/include"),
                     str(tmp_path / "targets/x86_64-linux/include/cccl")]  # no $PREFIX/include: there is none
    assert include_environment(tmp_path / "bin") == {}


def test_an_activated_envs_nvcc_variables_are_removed_and_recorded():
    from toolkit.build.builder import neutralised, process_environment

    caller = {"NVCC_PREPEND_FLAGS": " -ccbin=/env/bin/x86_64-conda-linux-gnu-c++", "NVCC_CCBIN": "/usr/bin/g++-9",
              "NVCC_APPEND_FLAGS": "-I/env/include", "HOME": "/home/u"}
    build = {"NVCC_APPEND_FLAGS": "-Xcompiler -ffile-prefix-map=/b=/fa-envkit-build", "CPATH": "/env/targets/x/include"}
    env = process_environment(caller, build)
    assert "NVCC_PREPEND_FLAGS" not in env and "NVCC_CCBIN" not in env and env["HOME"] == "/home/u"
    assert env["NVCC_APPEND_FLAGS"] == build["NVCC_APPEND_FLAGS"]
    assert neutralised(caller, build) == {k: v for k, v in caller.items() if k.startswith("NVCC_")}

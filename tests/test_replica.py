"""The locked path against a replica of conda-forge's CUDA toolchain (tests/conda_forge_replica).

The replica carries conda-forge's real records (a published pixi.lock) and the feedstock recipes' constraints
for every line, and for CUDA 13.0 the real file layout with real payload (this machine's CUDA 13.0 is made of
NVIDIA's wheels): headers only under targets/x86_64-linux/include, conda-forge's nvcc.profile, and the real
activation scripts (cuda-nvcc 13.0.88 builds 0 and 4, gcc_linux-64, gxx_linux-64), sourced as `conda activate`
does. What these tests caught on the code before issue 13 (kept in the report):
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
import time
from pathlib import Path
from typing import Any

import pytest
from conda_channel import build_channel, build_simple_index, serve_directory
from conda_forge_replica.replica import (
    PayloadRoots,
    build_number,
    channel_folder,
    channels,
    layout_prefix,
    load_records,
    packages,
    patched_profile,
    payload,
)
from conftest import missing
from fixtures.fa_fixture_project import (
    make_stub_torch_env,
    make_torch_double_wheel,
    pack_fixture_sdist,
    site_packages,
)
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.build.wheel_check import wheel_entries
from toolkit.env.lock import conda_request
from toolkit.env.lockfile import LockedSdist
from toolkit.env.rattler_solve import rattler_solve
from toolkit.machine.line_env import include_environment
from toolkit.spec.envspec import load_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "tests" / "conda_forge_replica"
CUDA_ROOT = Path("/usr/local/cuda")
TRIPLE_INCLUDE = "targets/x86_64-linux/include"
FA_SDIST = LockedSdist(  # the pinned sdist, sha256 from PyPI's simple index (as locks/gpu-machine.conda-lock.yml)
    url="https://files.pythonhosted.org/packages/6c/b1/b77625e3d11260d2bd6a4fc249a4be9a3da97ff848e2222e810c4f0e0211/"
        "flash_attn-2.8.3.post2.tar.gz",
    filename="flash_attn-2.8.3.post2.tar.gz", sha256="d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b")


def require_image_cuda() -> None:
    """The machine image's CUDA 13.0, made of NVIDIA's wheels, gives the replica its payload; skipped without it,
    failed where FA_REQUIRE_IMAGE_CUDA=1 (.ci/run: the CI machine's image has it)."""
    if not (CUDA_ROOT / "dist-info").is_dir():
        missing(f"needs {CUDA_ROOT} made of NVIDIA's wheels (its dist-info/ gives the payload)", "FA_REQUIRE_IMAGE_CUDA")


@pytest.fixture
def image_cuda() -> None:
    require_image_cuda()


needs_cuda = pytest.mark.usefixtures("image_cuda")
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


@pytest.mark.image_cuda
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


def toolkit(cwd: Path, *args: str, env: dict, shell: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m toolkit ARGS` in `shell` (default: the test's environment) with `env` on top."""
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**(os.environ if shell is None else shell), "TOOLKIT_CACHE": str(cwd / ".cache"), **env})


@pytest.fixture(scope="module")
def replica_channel(tmp_path_factory) -> Path:
    """The replica channel with real payload: CUDA 13.0 from /usr/local/cuda, the library headers from FA_CUDA_TORCH."""
    require_image_cuda()
    return build_channel(tmp_path_factory.mktemp("replica-channel") / "channel",
                         packages(PayloadRoots(CUDA_ROOT.resolve(), Path(cuda_torch) if cuda_torch else None)))


def fixture_venv(directory: Path, first: Path | None = None) -> Path:
    """The interpreter the replica's python wrapper runs ($FIXTURE_PYTHON): a venv that sees the test interpreter's
    packages (setuptools, wheel, pip), and `first` ahead of them (a .pth file sorts before the others)."""
    venv_python = make_stub_torch_env(directory, None)
    site = Path(site_packages(venv_python))
    if first:
        (site / "0-first.pth").write_text(f"{first}\n")
    # the packages of the interpreter running the tests (setuptools, wheel): the stub venv's system site is the
    # base interpreter's, which lacks them when the tests themselves run in a venv
    (site / "test-interpreter.pth").write_text(f"{site_packages(Path(sys.executable))}\n")
    return venv_python


def locked_line(project: Path, channel: Path, torch: str, index: str, env: dict[str, str]) -> Path:
    """`toolkit lock` + `toolkit install` of a CUDA 13.0 line from the replica channel, torch and the sdist from the
    loopback index: the installed prefix.

    gcc 12: the replica's compilers wrap this machine's g++ 12 (records.yaml says so), so the line asks for
    what it gets."""
    (project / "envs").mkdir(parents=True)
    (project / "envs" / "base.yaml").write_text((ROOT / "envs" / "base.yaml").read_text())
    (project / "envs" / "cu130.yaml").write_text(f"""extends: base
cuda: "13.0"
python: "{sys.version_info.major}.{sys.version_info.minor}"
gcc: 12
channels: [{channel.as_uri()}]
pip_packages: null
torch: {{version: "{torch}", index: "{index}/simple"}}
archs: ["90"]
""")
    locked = toolkit(project, "lock", "cu130", "--engine", "rattler", "--pypi", f"{index}/simple", env=env)
    assert locked.returncode == 0, locked.stderr
    installed = toolkit(project, "install", "cu130", "--engine", "rattler", env=env)
    assert installed.returncode == 0, installed.stderr
    return project / ".envs" / "cu130"


@pytest.fixture(scope="module")
def replica_project(replica_channel, tmp_path_factory):
    """A CUDA 13.0 line locked and installed from the replica; its sdist is the fixture's, its torch the fixture's
    test double (the fixture does not link torch)."""
    tmp = tmp_path_factory.mktemp("replica-e2e")
    files = [make_torch_double_wheel(tmp / "dist", "2.13.0", "13.0"), pack_fixture_sdist(tmp / "dist")]
    build_simple_index(tmp / "pypi", files)
    venv_python = fixture_venv(tmp / "venv")
    env = {"FIXTURE_PYTHON": str(venv_python), "XDG_CACHE_HOME": str(tmp / "xdg")}
    with serve_directory(tmp / "pypi") as url:
        prefix = locked_line(tmp / "project", replica_channel, "2.13.0", url, env)
        purelib = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        Path(site_packages(venv_python), "conda-prefix.pth").write_text(f"{purelib}\n")
        yield tmp / "project", prefix, env  # the index stays up: the build fetches the locked sdist from it


@pytest.mark.image_cuda
def test_installed_prefix_has_conda_forges_layout(replica_project):
    _, prefix, _ = replica_project
    assert not (prefix / "include").exists()  # conda-forge puts no CUDA header at the prefix root
    assert (prefix / TRIPLE_INCLUDE / "cuda_runtime.h").is_file() and (prefix / TRIPLE_INCLUDE / "crt").is_dir()
    assert (prefix / "lib" / "libcudart.so").resolve() == (prefix / "targets/x86_64-linux/lib/libcudart.so.13").resolve()
    assert (prefix / "bin" / "nvcc.profile").read_text().startswith("\nTOP              = $(_HERE_)/../$(_TARGET_DIR_)")
    activate_d = prefix / "etc" / "conda" / "activate.d"
    assert sorted(p.name for p in activate_d.iterdir()) == [
        "activate-gcc_linux-64.sh", "activate-gxx_linux-64.sh", "~cuda-nvcc_activate.sh"]
    # the newest build of cuda-nvcc 13.0.88 (4, the published records), whose script no longer sets TORCH_CUDA_ARCH_LIST
    builds = {(m["name"], m["build"]) for m in (json.loads(p.read_text()) for p in (prefix / "conda-meta").glob("*.json"))}
    assert ("cuda-nvcc_linux-64", "hb2fc203_4") in builds and ("cuda-nvcc", "hcdd1206_4") in builds
    assert "TORCH_CUDA_ARCH_LIST" not in (activate_d / "~cuda-nvcc_activate.sh").read_text()
    conda_meta = {name for name, _ in builds}
    if cuda_torch:  # the library wheels' headers (without FA_CUDA_TORCH those -dev packages are empty)
        assert (prefix / TRIPLE_INCLUDE / "cublas_v2.h").is_file() and (prefix / TRIPLE_INCLUDE / "cusolverDn.h").is_file()
    assert {"cuda-nvcc-impl", "cuda-nvcc-tools", "cuda-cudart-dev_linux-64", "libcublas-dev"} <= conda_meta


# ---------------------------------------------------------------- a `conda activate`d environment, every variable kept

TRIPLET = "x86_64-conda-linux-gnu"
# ctng-compiler-activation-feedstock conda_build_config.yaml at a36dab2, FINAL_*_linux_64 (-std=c++17 taken out of the
# C++ flags for gcc >= 11 by its build.sh); the values a real activated env shows (e.g. CFLAGS=-march=nocona ...)
GCC_FLAGS = {
    "CPPFLAGS": "-DNDEBUG -D_FORTIFY_SOURCE=2 -O2",
    "CFLAGS": "-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 "
              "-ffunction-sections -pipe",
    "CXXFLAGS": "-fvisibility-inlines-hidden -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize -fPIC "
                "-fstack-protector-strong -fno-plt -O2 -ffunction-sections -pipe",
    "LDFLAGS": "-Wl,-O2 -Wl,--sort-common -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags "
               "-Wl,--gc-sections -Wl,--allow-shlib-undefined",
    "DEBUG_CPPFLAGS": "-D_DEBUG -D_FORTIFY_SOURCE=2 -Og",
    "DEBUG_CFLAGS": "-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-all -fno-plt -Og -g -Wall "
                    "-Wextra -fvar-tracking-assignments -ffunction-sections -pipe",
    "DEBUG_CXXFLAGS": "-fvisibility-inlines-hidden -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize "
                      "-fPIC -fstack-protector-all -fno-plt -Og -g -Wall -Wextra -fvar-tracking-assignments "
                      "-ffunction-sections -pipe",
}
# a shell's own variables (bash sets them) and those a user without CUDA or compilers set up has none of
SHELL_OWN = ("_", "SHLVL", "PWD", "OLDPWD")
CLEAN = ("CUDA_HOME", "CUDA_PATH", "CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "CC", "CXX", "CFLAGS", "CPPFLAGS",
         "CXXFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST", "CUDAARCHS")


def user_shell() -> dict[str, str]:
    """The test's environment as a shell of a user without the toolkit, CUDA or compiler variables, before activation."""
    return {k: v for k, v in os.environ.items() if k not in CLEAN and not k.startswith(("NVCC_", "CONDA_"))}


def conda_activate(prefix: Path, activate_d: Path | None = None) -> dict[str, str]:
    """The environment `conda activate PREFIX` leaves: conda's own variables (CONDA_PREFIX, the prefix's bin/ first
    on PATH), then every etc/conda/activate.d/*.sh sourced in name order as conda does (activate-gcc_linux-64.sh,
    activate-gxx_linux-64.sh, ~cuda-nvcc_activate.sh). All of it, nothing filtered."""
    scripts = sorted((activate_d or prefix / "etc" / "conda" / "activate.d").glob("*.sh"))
    shell = {**user_shell(), "CONDA_PREFIX": str(prefix), "CONDA_DEFAULT_ENV": str(prefix), "CONDA_SHLVL": "1",
             "PATH": f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    script = "".join(f'{{ . "{path}"; }} 1>&2 || exit 1\n' for path in scripts) + "env -0"
    done = subprocess.run(["bash", "-c", script], capture_output=True, env=shell)
    assert done.returncode == 0 and b"ERROR" not in done.stderr, done.stderr.decode()
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k not in SHELL_OWN}


def expected_activation(prefix: Path, build: int) -> dict[str, str]:
    """What the real scripts export, from reading them and their recipes' flags (whitespace collapsed)."""
    def tool(name: str) -> str:
        return f"{prefix}/bin/{TRIPLET}-{name}"

    targets = f"{prefix}/{TRIPLE_INCLUDE.rsplit('/', 1)[0]}"
    cuda_i, cuda_l = f"-I{targets}/include -I{targets}/include/cccl", f"-L{targets}/lib -L{targets}/lib/stubs"
    isystem = f"-isystem {prefix}/include"
    cmake = " ".join([f"-DCMAKE_AR={tool('ar')}", f"-DCMAKE_CXX_COMPILER_AR={tool('gcc-ar')}",
                      f"-DCMAKE_C_COMPILER_AR={tool('gcc-ar')}", f"-DCMAKE_RANLIB={tool('ranlib')}",
                      f"-DCMAKE_CXX_COMPILER_RANLIB={tool('gcc-ranlib')}", f"-DCMAKE_C_COMPILER_RANLIB={tool('gcc-ranlib')}",
                      f"-DCMAKE_LINKER={tool('ld')}", f"-DCMAKE_STRIP={tool('strip')}", "-DCMAKE_BUILD_TYPE=Release"])
    expected = {
        # conda itself
        "CONDA_PREFIX": str(prefix), "CONDA_DEFAULT_ENV": str(prefix), "CONDA_SHLVL": "1",
        "PATH": f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}",
        # activate-gcc_linux-64.sh
        **dict.fromkeys(("HOST", "BUILD", "CONDA_TOOLCHAIN_HOST", "CONDA_TOOLCHAIN_BUILD", "build_alias", "host_alias"),
                        TRIPLET),
        "CC": tool("cc"), "CPP": tool("cpp"), "GCC": tool("gcc"), "GCC_AR": tool("gcc-ar"), "GCC_NM": tool("gcc-nm"),
        "GCC_RANLIB": tool("gcc-ranlib"), "CC_FOR_BUILD": tool("cc"),
        "DEBUG_CPPFLAGS": f"{GCC_FLAGS['DEBUG_CPPFLAGS']} {isystem}", "DEBUG_CFLAGS": f"{GCC_FLAGS['DEBUG_CFLAGS']} {isystem}",
        "CMAKE_PREFIX_PATH": f"{prefix}:{prefix}/{TRIPLET}/sysroot/usr",
        "_CONDA_PYTHON_SYSCONFIGDATA_NAME": "_sysconfigdata_x86_64_conda_cos6_linux_gnu",
        "CONDA_BUILD_SYSROOT": f"{prefix}/{TRIPLET}/sysroot", "MESON_ARGS": "-Dbuildtype=release", "CMAKE_ARGS": cmake,
        # activate-gxx_linux-64.sh
        "CXX": tool("c++"), "GXX": tool("g++"), "CXX_FOR_BUILD": tool("c++"),
        "DEBUG_CXXFLAGS": f"{GCC_FLAGS['DEBUG_CXXFLAGS']} {isystem}",
        # the compilers' flags, then ~cuda-nvcc_activate.sh's on top
        "CPPFLAGS": f"{GCC_FLAGS['CPPFLAGS']} {isystem} {cuda_i}", "CFLAGS": f"{GCC_FLAGS['CFLAGS']} {isystem} {cuda_i}",
        "CXXFLAGS": f"{GCC_FLAGS['CXXFLAGS']} {isystem} {cuda_i}",
        "LDFLAGS": f"{GCC_FLAGS['LDFLAGS']} -Wl,-rpath,{prefix}/lib -Wl,-rpath-link,{prefix}/lib -L{prefix}/lib {cuda_l}",
        # NVCC_APPEND_FLAGS is assigned only under conda-build: `export` of an unset variable exports nothing
        "NVCC_PREPEND_FLAGS": f"-ccbin={tool('c++')}",
    }
    if build == 0:  # cuda-nvcc-feedstock 28aca74: arch defaults for everyone
        expected["CUDAARCHS"] = "75-real;80-real;86-real;89-real;90-real;100-real;103-real;110-real;120-real;121"
        expected["TORCH_CUDA_ARCH_LIST"] = "7.5;8.0;8.6;8.9;9.0;10.0;10.3;11.0;12.0;12.1+PTX"
    else:  # 0d9236b: arch defaults only under conda-build; deactivation restores an unset NVCC_PREPEND_FLAGS
        expected["NVCC_PREPEND_FLAGS_BACKUP"] = "UNSET"
    return expected


def served_nvcc_activation(build: int) -> str:
    """The ~cuda-nvcc_activate.sh that the replica's cuda-nvcc_linux-64 13.0.88 record of `build` installs."""
    wanted = ("cuda-nvcc_linux-64", "13.0.88", "linux-64", build)
    record = next(r for r in load_records() if (r["name"], r["version"], r["subdir"], build_number(r["build"])) == wanted)
    return payload(record, PayloadRoots())[0]["etc/conda/activate.d/~cuda-nvcc_activate.sh"]


def activate_d_of_build(prefix: Path, build: int, folder: Path) -> Path:
    """The prefix's activation scripts with those of the served cuda-nvcc 13.0.88 record of `build` (the solve
    installs build 4)."""
    installed = prefix / "etc" / "conda" / "activate.d"
    if build == 4:
        assert (installed / "~cuda-nvcc_activate.sh").read_text() == served_nvcc_activation(4)
        return installed
    shutil.copytree(installed, folder)
    (folder / "~cuda-nvcc_activate.sh").write_text(served_nvcc_activation(build))
    return folder


@pytest.mark.image_cuda
@pytest.mark.parametrize("build", [0, 4])
def test_conda_activation_exports_every_variable_of_the_real_scripts(replica_project, tmp_path, build):
    """cuda-nvcc 13.0.88's activation (builds 0 and 4 differ: TORCH_CUDA_ARCH_LIST, CUDAARCHS) after conda-forge's
    gcc and g++ activation: every variable they export, with the value they give it, and nothing else."""
    _, prefix, _ = replica_project
    before = user_shell()
    after = conda_activate(prefix, activate_d_of_build(prefix, build, tmp_path / "activate.d"))
    changed = {k: " ".join(v.split()) for k, v in after.items() if before.get(k) != v}
    assert changed == expected_activation(prefix, build)


@pytest.mark.image_cuda
@pytest.mark.parametrize("activated", [False, True], ids=["plain", "conda-activated"])
def test_locked_build_of_the_fixture_with_the_real_nvcc(replica_project, activated):
    """`toolkit build`, in a plain shell and inside `conda activate` (every variable of the real scripts)."""
    project, prefix, env = replica_project
    shell = conda_activate(prefix) if activated else None
    built = toolkit(project, "build", "cu130", "--force", env=env, shell=shell)
    assert built.returncode == 0, built.stderr + built.stdout
    record = json.loads(max((project / "wheelhouse" / "cu130").glob("*.build.json"), key=os.path.getmtime).read_text())
    assert record["inputs"]["toolchain"]["kind"] == "locked"
    assert record["environment"]["CUDA_HOME"] == str(prefix) and record["environment"]["CXX"] == str(prefix / "bin/g++")
    assert record["fingerprint"]["nvcc_path"] == str(prefix / "bin" / "nvcc")
    assert record["outputs"]["wheel"].startswith("fa_fixture-0.1.0+cu130torch2.13-")
    purelib = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert list(purelib.glob("fa_fixture-0.1.0+cu130torch2.13.dist-info"))  # installed into the prefix
    assert str(prefix / TRIPLE_INCLUDE) in record["environment"]["CPATH"].split(os.pathsep)
    assert record["neutralised_environment"].get("NVCC_PREPEND_FLAGS") == (shell or {}).get("NVCC_PREPEND_FLAGS")
    log = (project / record["log"]).read_text()
    assert "redefinition for option 'compiler-bindir'" not in log and "redefinition of argument" not in log
    imported = subprocess.run([str(prefix / "bin" / "python"), "-c",
                               "import fa_fixture_cuda as m; print(m.kernels(), m.cuda_runtime_version())"],
                              capture_output=True, text=True, cwd="/", env={**os.environ, **env})
    assert imported.returncode == 0 and "scale_kernel" in imported.stdout and "130" in imported.stdout, imported.stderr


# ---------------------------------------------------------------- flash-attn's flash_api.cpp against the real CUDA torch


def _flash_attn_source(tmp: Path) -> Path:
    from toolkit.build.fa2 import fetch_sdist
    from toolkit.build.source import extract_sdist

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


@pytest.mark.image_cuda
@needs_cuda
@needs_cuda_torch
def test_flash_api_cpp_needs_the_targets_headers(tmp_path):
    """The real flash_api.cpp of the pinned sdist, g++ as torch's cpp_extension runs it, against the real CUDA torch
    2.14.1+cu130 and the replica's layout: torch's include paths alone do not reach cuda_runtime.h (the builds
    below show what does, with and without a conda activation; -std=c++20: torch 2.14's ATen requires it)."""
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


# ---------------------------------------------------------------- flash_api.cpp both ways: conda-activated, `toolkit build`

PROBE = ROOT / "tests" / "fixtures" / "fa_api_probe"


def probe_sdist(tmp: Path) -> Path:
    """tests/fixtures/fa_api_probe with the pinned flash-attn sdist's csrc/flash_attn and csrc/cutlass/include, packed
    under the name the lock looks up (flash_attn-2.8.3.post2.tar.gz)."""
    src = _flash_attn_source(tmp / "flash-attn")
    tree = tmp / "probe"
    shutil.copytree(PROBE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(src / "csrc" / "flash_attn", tree / "csrc" / "flash_attn")
    shutil.copytree(src / "csrc" / "cutlass" / "include", tree / "csrc" / "cutlass" / "include")
    return pack_fixture_sdist(tmp / "dist", source=tree)


@pytest.fixture(scope="module")
def probe_project(replica_channel, tmp_path_factory):
    """A CUDA 13.0 line (torch 2.14.1) from the replica whose sdist is the flash_api.cpp probe, and whose python sees
    the real torch 2.14.1+cu130 of FA_CUDA_TORCH first. The lock's torch is a test double of that version (the lock
    needs one on the index; installing the real 5.5 GB through `toolkit install` would add nothing here)."""
    if not cuda_torch:
        pytest.skip("set FA_CUDA_TORCH=DIR after tests/conda_forge_replica/install_cuda_torch.sh DIR")
    tmp = tmp_path_factory.mktemp("replica-probe")
    sdist = probe_sdist(tmp)
    build_simple_index(tmp / "pypi", [make_torch_double_wheel(tmp / "dist", "2.14.1", "13.0"), sdist])
    env = {"FIXTURE_PYTHON": str(fixture_venv(tmp / "venv", first=Path(cuda_torch))), "XDG_CACHE_HOME": str(tmp / "xdg")}
    with serve_directory(tmp / "pypi") as url:
        yield tmp / "project", locked_line(tmp / "project", replica_channel, "2.14.1", url, env), env, sdist


@pytest.mark.image_cuda
def test_pip_wheel_in_the_conda_activated_env_compiles_flash_api_cpp(probe_project, tmp_path):
    """The user's way without the toolkit: `conda activate` (every variable of the real scripts), then `pip wheel
    --no-build-isolation` of the sdist, torch's CUDAExtension through ninja. g++ finds cuda_runtime.h under
    targets/ through the -I that cuda-nvcc's activation adds to CPPFLAGS/CFLAGS (distutils hands them to g++):
    no CPATH, no CUDA_HOME (torch finds nvcc on PATH). One arch, as FLASH_ATTN_CUDA_ARCHS asks."""
    _, prefix, env, sdist = probe_project
    shell = conda_activate(prefix)
    assert "CPATH" not in shell and "CUDA_HOME" not in shell
    started = time.monotonic()
    done = subprocess.run(["python", "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-index",
                           "--wheel-dir", str(tmp_path / "dist"), str(sdist)], capture_output=True, text=True,
                          cwd=tmp_path, env={**shell, **env, "FLASH_ATTN_CUDA_ARCHS": "90", "MAX_JOBS": "2"})
    seconds = time.monotonic() - started
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    print(f"\nconda-activated pip wheel (flash_api.cpp + one small kernel): {seconds:.0f} s")
    output = done.stdout + done.stderr  # pip -v passes setup.py's output (ninja -v's command lines) to stderr
    compile_line = next((line for line in output.splitlines() if "flash_api.cpp" in line and " -c " in line), "")
    assert f"{prefix}/bin/{TRIPLET}-c++ " in compile_line, output[-3000:]  # the activation's CXX
    assert f"-I{prefix}/{TRIPLE_INCLUDE}" in compile_line.split()  # from the activation's CPPFLAGS, not from torch
    wheel = next((tmp_path / "dist").glob("fa_api_probe-2.8.3.post2-*.whl"))
    assert {e.arch for found in wheel_entries(wheel, tmp_path / "so")[1].values() for e in found if e.kind == "elf"} == {"90"}


@pytest.mark.image_cuda
def test_toolkit_build_compiles_flash_api_cpp_without_activation(probe_project):
    """`toolkit build` in a plain shell (no conda activation: nothing puts targets/ on the compile line), the probe
    sdist: the build's CPATH is what lets g++ find cuda_runtime.h. Not installed: the probe does not import."""
    project, prefix, env, _ = probe_project
    started = time.monotonic()
    built = toolkit(project, "build", "cu130", "--no-install", env=env, shell=user_shell())
    seconds = time.monotonic() - started
    assert built.returncode == 0, (built.stderr + built.stdout)[-4000:]
    print(f"\ntoolkit build (flash_api.cpp + one small kernel): {seconds:.0f} s")
    record = json.loads(max((project / "wheelhouse" / "cu130").glob("*.build.json"), key=os.path.getmtime).read_text())
    assert record["outputs"]["wheel"].startswith("fa_api_probe-2.8.3.post2+cu130torch2.14-")
    assert record["fingerprint"]["torch"]["version"] == "2.14.1+cu130"  # the real CUDA torch, not the lock's double
    assert str(prefix / TRIPLE_INCLUDE) in record["environment"]["CPATH"].split(os.pathsep)
    log = (project / record["log"]).read_text()
    compile_line = next(line for line in log.splitlines() if "flash_api.cpp" in line and " -c " in line)
    assert f"-I{prefix}/{TRIPLE_INCLUDE}" not in compile_line  # nothing but CPATH names targets/
    assert list(record["outputs"]["archs_compiled"].values()) == [["90"]]


# ---------------------------------------------------------------- preflight: what the compilers actually see


def header_problem(prefix: Path, spec_version: str, compile_env: dict[str, str]) -> str | None:
    from dataclasses import replace

    from toolkit.machine.fingerprint import probe
    from toolkit.machine.preflight import headers_visible, preflight_input

    spec = load_spec(ROOT / "envs" / "cu130.yaml")
    fp = probe(str(prefix), sys.executable, shutil.which("g++"))
    return headers_visible(preflight_input(replace(spec, flash_attn_version=spec_version), fp, ("90",), 20.0,
                                           prefix, compile_env))


@pytest.mark.image_cuda
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


@pytest.mark.image_cuda
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


@pytest.mark.image_cuda
def test_the_build_takes_no_compile_flags_from_a_conda_activation(replica_project):
    """Inside `conda activate` the compilers' scripts export CPPFLAGS (-DNDEBUG -D_FORTIFY_SOURCE=2 -O2 -isystem
    $PREFIX/include, and cuda-nvcc's -I targets/...), which distutils appends to every g++ command of torch's build:
    a wheel built there would not be the one built outside. The build's CFLAGS, CXXFLAGS, LDFLAGS, CC and CXX replace
    the activation's; CPPFLAGS and NVCC_* go, and the record keeps them."""
    from toolkit.build.builder import neutralised, process_environment

    _, prefix, _ = replica_project
    activated = conda_activate(prefix)
    build = {"CFLAGS": "-ffile-prefix-map=/b=/fa-envkit-build", "CXXFLAGS": "-ffile-prefix-map=/b=/fa-envkit-build",
             "LDFLAGS": "-Wl,--discard-all", "CC": str(prefix / "bin" / "gcc"), "CXX": str(prefix / "bin" / "g++")}
    env = process_environment(activated, build)
    flags = ("CFLAGS", "CPPFLAGS", "CXXFLAGS", "LDFLAGS", "CC", "CXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")
    assert {k: env[k] for k in flags if k in env} == build
    assert neutralised(activated, build) == {k: activated[k] for k in ("CPPFLAGS", "NVCC_PREPEND_FLAGS")}

"""Toolchain fingerprint: the versions a build or a run depends on, read from the machine.

One implementation shared by the build preflight, external-toolchain checks and `toolkit doctor`.
Everything here is fast (no torch import by default: versions come from torch's own files), and a
missing tool is recorded as None, never an exception: callers decide what is fatal.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from toolkit.base.children import run_tied

PROBE_TIMEOUT_S = 20


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str  # "9.0"

    @property
    def sm(self) -> str:
        return self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class TorchInfo:
    version: str
    cuda: str | None  # torch.version.cuda, None for CPU builds
    cxx11_abi: bool | None
    path: str
    cuda_available: bool | None = None  # only when probed with import_torch=True


@dataclass(frozen=True)
class Fingerprint:
    """What one toolchain on one machine is: compared against specs, locks and build records."""

    machine: str
    cpus: int
    mem_available_gb: float
    disk_free_gb: float
    cuda_home: str | None
    nvcc_path: str | None
    nvcc_version: str | None  # "13.0.88"
    cuda_h: str | None  # path of cuda.h when present
    host_config_h: str | None  # crt/host_config.h, where nvcc's gcc cap lives
    cxx_path: str | None
    gcc_version: str | None  # "13.3.0"
    ninja_path: str | None
    ninja_version: str | None
    python_path: str | None
    python_version: str | None  # "3.12.3"
    torch: TorchInfo | None
    driver_version: str | None
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    @property
    def nvcc_line(self) -> str | None:
        """'13.0.88' -> '13.0': the CUDA line this nvcc belongs to."""
        return ".".join(self.nvcc_version.split(".")[:2]) if self.nvcc_version else None

    @property
    def gcc_major(self) -> str | None:
        return self.gcc_version.split(".")[0] if self.gcc_version else None

    @property
    def python_minor(self) -> str | None:
        return ".".join(self.python_version.split(".")[:2]) if self.python_version else None

    def to_dict(self) -> dict:
        return asdict(self)


def _run(cmd: list[str], env: dict | None = None) -> str | None:
    """stdout of a probe command, or None when it is missing or fails."""
    try:
        done = run_tied(
            cmd, capture_output=True, text=True, errors="replace", timeout=PROBE_TIMEOUT_S, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# What a version field may hold: a tool printing anything else (a wrapper's banner, garbage) is recorded
# as having no version, so every comparison downstream (int(), packaging's Version, minor_of) is safe.
DOTTED = re.compile(
    r"\d+(\.\d+)*"
)  # g++ -dumpfullversion (13.3.0: its major goes through int()), drivers
MAJOR_MINOR = re.compile(r"\d+\.\d+(\.\d+)*")  # torch.version.cuda
PYTHON = re.compile(
    r"\d+\.\d+(\.\d+)?[a-z0-9+]*"
)  # platform.python_version(): 3.12.3, 3.14.0rc1, 3.13.0a1+
TOOL = re.compile(r"\d+(\.\d+)*[\w.+~-]*")  # ninja --version: 1.13.2.git.kitware.jobserver-pipe-1


def parse_version_output(text: object, form: re.Pattern = DOTTED) -> str | None:
    """The last line of a tool's output that is exactly a version ('13.3.0'), else None: `g++
    -dumpfullversion` behind a wrapper may print a banner first, and a broken tool anything at all."""
    lines = [line.strip() for line in text.splitlines()] if isinstance(text, str) else []
    return next((line for line in reversed(lines) if form.fullmatch(line)), None)


def pep440_or_unknown(text: object) -> str:
    """torch's __version__ as written, when it is a version packaging can compare; else 'unknown'."""
    if not isinstance(text, str):
        return "unknown"
    try:
        Version(text)
    except InvalidVersion:
        return "unknown"
    return text


def parse_nvcc_version(text: str) -> str | None:
    """`nvcc --version` output -> '13.0.88'."""
    match = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", text)
    return match.group(1) if match else None


def _first_existing(*paths: Path) -> str | None:
    return next((str(p) for p in paths if p.exists()), None)


def cuda_include_dirs(cuda_home: Path) -> list[Path]:
    """Where a toolkit keeps its headers: include/ (system CUDA) or targets/<arch>-linux/include (conda)."""
    return [cuda_home / "include", *sorted((cuda_home / "targets").glob("*/include"))]


def _torch_info(python: str, import_torch: bool) -> TorchInfo | None:
    """Read torch's version, CUDA and ABI from its files; import it only when asked (it takes seconds)."""
    if import_torch:
        code = (
            "import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,"
            "'cxx11_abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI), 'path': torch.__path__[0],"
            "'cuda_available': torch.cuda.is_available()}))"
        )
        out = _run([python, "-c", code])
        try:
            found = json.loads(out.strip().splitlines()[-1]) if out and out.strip() else None
        except ValueError:
            return None  # something else printed last: no torch we can describe
        return checked_torch(found) if found else None
    out = _run(
        [
            python,
            "-c",
            "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s else '')",
        ]
    )
    if not out or not out.strip():
        return None
    torch_dir = Path(out.strip()).parent
    version_py = torch_dir / "version.py"
    if not version_py.exists():
        return None
    text = version_py.read_text(errors="replace")
    version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return TorchInfo(
        version=pep440_or_unknown(version.group(1) if version else None),
        cuda=parse_version_output(cuda.group(1), MAJOR_MINOR) if cuda else None,
        cxx11_abi=_torch_cxx11_abi(torch_dir),
        path=str(torch_dir),
    )


def _torch_cxx11_abi(torch_dir: Path) -> bool | None:
    """TorchConfig.cmake's -D_GLIBCXX_USE_CXX11_ABI flag; newer torch (CXX11 ABI only) drops the flag and
    hard-codes `compiled_with_cxx11_abi()` to return True in torch/__init__.py."""
    config = torch_dir / "share/cmake/Torch/TorchConfig.cmake"
    abi = (
        re.search(r"_GLIBCXX_USE_CXX11_ABI=([01])", config.read_text()) if config.exists() else None
    )
    if abi:
        return abi.group(1) == "1"
    init = torch_dir / "__init__.py"
    hard_coded = (
        re.search(
            r'def compiled_with_cxx11_abi\(\)[^:]*:\s*(?:r?"""[^"]*"""\s*)?return True\b',
            init.read_text(),
        )
        if init.exists()
        else None
    )
    return True if hard_coded else None


GPU_ROW = re.compile(r"\s*(\d+)\s*,\s*([^,]*?)\s*,\s*(\d+\.\d+)\s*,\s*(\d+(?:\.\d+)*)\s*(?:,.*)?")


def _gpus() -> tuple[str | None, tuple[Gpu, ...]]:
    """(driver, GPUs) from nvidia-smi; rows not in the queried form (index, name, x.y, driver) are left out."""
    out = _run(
        ["nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version", "--format=csv,noheader"]
    )
    rows = [match for line in (out or "").splitlines() if (match := GPU_ROW.fullmatch(line))]
    gpus = tuple(Gpu(int(r.group(1)), r.group(2), r.group(3)) for r in rows)
    return (rows[0].group(4) if rows else None), gpus


def _mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return 0.0


def probe(
    cuda_home: str | None,
    python: str | None,
    cxx: str | None = None,
    path_env: str | None = None,
    import_torch: bool = False,
    work_dir: Path = Path("."),
) -> Fingerprint:
    """Fingerprint the toolchain made of this CUDA_HOME, python and C++ compiler (defaults: PATH's)."""
    search_path = path_env if path_env is not None else os.environ.get("PATH", "")
    home = Path(cuda_home) if cuda_home else None
    nvcc = (
        _first_existing(home / "bin" / "nvcc") if home else shutil.which("nvcc", path=search_path)
    )
    nvcc_version = parse_nvcc_version(_run([nvcc, "--version"]) or "") if nvcc else None
    if home is None and nvcc:
        home = Path(nvcc).resolve().parent.parent
    include_dirs = cuda_include_dirs(home) if home else []
    cxx_path = cxx or shutil.which("g++", path=search_path)
    gcc_version = parse_version_output(_run([cxx_path, "-dumpfullversion"])) if cxx_path else None
    ninja = shutil.which("ninja", path=search_path)
    python_path = python or shutil.which("python3", path=search_path)
    python_version = (
        parse_version_output(
            _run([python_path, "-c", "import platform; print(platform.python_version())"]), PYTHON
        )
        if python_path
        else None
    )
    driver, gpus = _gpus()
    return Fingerprint(
        machine=platform.machine(),
        cpus=len(os.sched_getaffinity(0)),
        mem_available_gb=round(_mem_available_gb(), 1),
        disk_free_gb=round(shutil.disk_usage(work_dir).free / 1024**3, 1),
        cuda_home=str(home) if home else None,
        nvcc_path=nvcc,
        nvcc_version=nvcc_version,
        cuda_h=_first_existing(*(d / "cuda.h" for d in include_dirs)),
        host_config_h=_first_existing(*(d / "crt" / "host_config.h" for d in include_dirs)),
        cxx_path=cxx_path,
        gcc_version=gcc_version,
        ninja_path=ninja,
        ninja_version=parse_version_output(_run([ninja, "--version"]), TOOL) if ninja else None,
        python_path=python_path,
        python_version=python_version,
        torch=_torch_info(python_path, import_torch) if python_version and python_path else None,
        driver_version=driver,
        gpus=gpus,
    )


def checked_torch(data: dict) -> TorchInfo:
    """TorchInfo from JSON (a probe's or a recorded one), its versions held to the forms probe() writes."""
    return TorchInfo(
        **{
            **data,
            "version": pep440_or_unknown(data.get("version")),
            "cuda": parse_version_output(data.get("cuda"), MAJOR_MINOR),
        }
    )


VERSION_FIELDS = {
    "nvcc_version": DOTTED,
    "gcc_version": DOTTED,
    "ninja_version": TOOL,
    "python_version": PYTHON,
    "driver_version": DOTTED,
}


def from_dict(data: dict) -> Fingerprint:
    """A recorded fingerprint (JSON) back into a Fingerprint: doctor and tests replay situations with it.
    Versions a hand-edited record gives in no version form are read as unknown (None), as probe() would."""
    data = {
        **data,
        **{
            name: parse_version_output(data.get(name), form)
            for name, form in VERSION_FIELDS.items()
        },
    }
    data["torch"] = checked_torch(data["torch"]) if data.get("torch") else None
    data["gpus"] = tuple(
        Gpu(**g)
        for g in data.get("gpus") or ()
        if MAJOR_MINOR.fullmatch(str(g.get("compute_capability")))
    )
    return Fingerprint(**data)

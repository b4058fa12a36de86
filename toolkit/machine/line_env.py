"""Where a line's environment is and what it runs: the one answer build, doctor, verify, bench and modules use.

A line has one of three kinds of toolchain (docs/architecture.md): `locked`, the conda prefix `toolkit install`
made from the lock (`.envs/<line>`, or wherever `--prefix` says), whose bin/ holds nvcc, gcc and python;
`pypi`, the venv `toolkit install` made there from NVIDIA's and PyTorch's wheels, whose CUDA_HOME is
site-packages/nvidia/cu13 and whose host compiler is the machine's gcc (like external, the fingerprint records
it and preflight checks it against this nvcc's crt/host_config.h); or `external`, the CUDA_HOME and python
the spec's toolchain section names. Without a line, doctor looks at a
conda prefix given alone (`prefix`) or at this shell (`shell`: CUDA_HOME, else the nvcc on PATH). `--python`
(verify, bench) replaces the interpreter. Where CUDA lives also decides the compilers' header search path,
so the conda layout's include directories (CPATH) are decided here too.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace
from toolkit.env.install_record import PrefixRecord
from toolkit.env.pypi_install import cuda_home as pypi_cuda_home
from toolkit.machine.fingerprint import Fingerprint, cuda_include_dirs, probe
from toolkit.spec.envspec import EnvSpec


@dataclass(frozen=True)
class LineEnvironment:
    """The environment's place and its tools (None: what this shell's PATH finds)."""

    kind: str  # locked | pypi | external | prefix (a conda env without a line) | shell
    root: Path | None  # the prefix toolkit install made (locked, pypi) or given (prefix)
    cuda_home: Path | None
    python: Path | None
    cxx: Path | None
    cc: Path | None
    path_env: str  # PATH for its tools, their bin directories first
    source: str  # where it came from, as doctor's cuda-home row says it

    @property
    def missing(self) -> bool:
        """A locked or pypi line whose prefix is not installed (no bin/python): it has no tools of its own."""
        return self.kind in ("locked", "pypi") and not (self.python and self.python.exists())

    def install_record(self) -> PrefixRecord | None:
        """The record `toolkit install` leaves in a prefix it made (which lock, which digest), or None: a
        prefix without one was made some other way, and nothing proves it is the lock's."""
        return PrefixRecord.read(self.root) if self.root else None

    def require_installed(self, line: str) -> LineEnvironment:
        """This environment, or the one-line error saying how to install it: where --prefix named the folder,
        installing there (suggesting --prefix again would point back at the same empty folder)."""
        if not self.missing:
            return self
        where = display_path(self.root or Path("."))
        if self.root == DEFAULT.prefix(line).absolute():
            fix = f"run `{self.install_command(line)}` first, or pass --prefix"
        else:
            fix = f"install it there with `{self.install_command(line)}`, or pass the --prefix it was installed with"
        raise ToolkitError(f"{where}: no installed environment for {line} ({fix})")

    def install_command(self, line: str) -> str:
        """The `toolkit install` that makes this environment where it is looked for: --prefix unless it is the
        default place (where --prefix named the folder, suggesting another would point back at an empty one)."""
        if self.root is None or self.root == DEFAULT.prefix(line).absolute():
            return f"toolkit install {line}"
        return f"toolkit install {line} --prefix {shlex.quote(display_path(self.root))}"

    def fingerprint(self, work_dir: Path = Path(".")) -> Fingerprint:
        """The probed toolchain. A missing prefix probes nothing: this shell's tools are not the line's."""
        if self.missing:
            return probe(None, None, None, "", work_dir=work_dir)
        return probe(
            _text(self.cuda_home),
            _text(self.python),
            _text(self.cxx),
            self.path_env,
            work_dir=work_dir,
        )

    def include_environment(self) -> dict[str, str]:
        """CPATH with the toolchain's header directories (see `include_environment`); empty without CUDA_HOME."""
        return include_environment(self.cuda_home) if self.cuda_home else {}


def _text(path: Path | None) -> str | None:
    return str(path) if path else None


def include_environment(cuda_home: Path) -> dict[str, str]:
    """CPATH with the toolchain's header directories. conda-forge installs every CUDA header only under
    $PREFIX/targets/<triple>/include (pytorch/pytorch#144690), which torch's cpp_extension does not add:
    include_paths() of torch 2.0-2.14 gives g++ $CUDA_HOME/include (and, from about 2.4, one $CUDA_INC_PATH).
    gcc reads CPATH whatever the command line says, so g++ (and nvcc's host pass) see the headers under every
    torch release; it is searched after every -I, like -I. CUDA 13 keeps libcu++/CUB/Thrust in include/cccl,
    which nvcc.profile adds for nvcc only (cuda_fp16.h includes <nv/target>)."""
    dirs = [
        d
        for include in cuda_include_dirs(cuda_home)
        for d in (include, include / "cccl")
        if d.is_dir()
    ]
    return {"CPATH": os.pathsep.join(str(d) for d in dirs)} if dirs else {}


def resolve(
    spec: EnvSpec | None,
    prefix: Path | None = None,
    python: Path | None = None,
    workspace: Workspace = DEFAULT,
) -> LineEnvironment:
    """The line's environment (external: the spec's paths; locked, pypi: `prefix`, else the workspace's
    prefix of the line); without a line, the conda env `prefix`, else this shell's. `python` replaces the interpreter."""
    if spec is not None and spec.toolchain.kind == "external":
        found = external(spec)
    elif spec is not None and spec.toolchain.kind == "pypi":
        found = pypi_venv(spec, prefix or workspace.prefix(spec.line))
    elif spec is not None:
        found = conda_prefix("locked", prefix or workspace.prefix(spec.line))
    elif prefix is not None:
        found = conda_prefix("prefix", prefix)
    else:
        found = shell()
    return replace(found, python=python) if python else found


def external(spec: EnvSpec) -> LineEnvironment:
    """The CUDA_HOME and python the spec's toolchain names; compilers from PATH behind their bin directories."""
    if not (
        spec.toolchain.cuda_home and spec.toolchain.python_executable
    ):  # load_spec requires both
        raise ToolkitError(
            f"{spec.where('toolchain')}: an external toolchain needs cuda_home and python_executable"
        )
    cuda_home = Path(spec.toolchain.cuda_home)
    python = Path(spec.toolchain.python_executable)
    path_env = os.pathsep.join(
        [str(cuda_home / "bin"), str(python.parent), os.environ.get("PATH", "")]
    )
    cxx, cc = shutil.which("g++", path=path_env), shutil.which("gcc", path=path_env)
    return LineEnvironment(
        "external",
        None,
        cuda_home,
        python,
        Path(cxx) if cxx else None,
        Path(cc) if cc else None,
        path_env,
        f"{display_path(spec.path)} toolchain",
    )


def pypi_venv(spec: EnvSpec, prefix: Path) -> LineEnvironment:
    """A pypi line's venv: CUDA_HOME inside its site-packages, its python, the machine's compilers from PATH
    (behind CUDA_HOME/bin and the venv's bin, which holds ninja)."""
    root = prefix.absolute()
    cuda_home = pypi_cuda_home(root, spec.python)
    path_env = os.pathsep.join(
        [str(cuda_home / "bin"), str(root / "bin"), os.environ.get("PATH", "")]
    )
    cxx, cc = shutil.which("g++", path=path_env), shutil.which("gcc", path=path_env)
    source = (
        "nothing: the line's environment is missing"
        if not (root / "bin" / "python").exists()
        else f"venv {display_path(root)}"
    )
    return LineEnvironment(
        "pypi",
        root,
        cuda_home,
        root / "bin" / "python",
        Path(cxx) if cxx else None,
        Path(cc) if cc else None,
        path_env,
        source,
    )


def conda_prefix(kind: str, prefix: Path) -> LineEnvironment:
    """A conda prefix: CUDA_HOME is the prefix, its bin/ first on PATH, its own python and compilers."""
    root = prefix.absolute()
    bindir = root / "bin"
    source = (
        "nothing: the line's environment is missing"
        if kind == "locked" and not (bindir / "python").exists()
        else f"prefix {display_path(root)}"
    )
    return LineEnvironment(
        kind,
        root,
        root,
        bindir / "python",
        conda_compiler(bindir, "g++"),
        conda_compiler(bindir, "gcc"),
        os.pathsep.join([str(bindir), os.environ.get("PATH", "")]),
        source,
    )


def conda_compiler(bindir: Path, name: str) -> Path | None:
    """conda's gxx/gcc packages install g++/gcc, or only the triplet-prefixed name (gxx_impl_linux-64)."""
    return next(
        (
            p
            for p in [bindir / name, *sorted(bindir.glob(f"*-conda-linux-gnu-{name}"))]
            if p.exists()
        ),
        None,
    )


def shell() -> LineEnvironment:
    """This shell's: CUDA_HOME (or CUDA_PATH) when set, else what the nvcc on PATH implies; python3 from PATH."""
    variable = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)), None)
    return LineEnvironment(
        "shell",
        None,
        Path(os.environ[variable]) if variable else None,
        None,
        None,
        None,
        os.environ.get("PATH", ""),
        variable or "nvcc on PATH",
    )

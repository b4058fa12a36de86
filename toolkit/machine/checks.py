"""Can this machine build flash-attn? The checks `toolkit build`'s preflight and `toolkit doctor` share.

Each check turns the toolchain fingerprint into a Finding with one policy: preflight refuses a build on
every `fail` (one line each) and prints every `warn`; doctor shows each finding as a row. The policy for
a torch/nvcc CUDA mismatch is torch's own (torch/utils/cpp_extension.py `_check_cuda_version`): across
CUDA majors it raises, within a major it only logs a warning and builds. What the spec says the toolchain
is (nvcc, python, gcc, torch and its build and ABI) is one table, SPEC_FACTS, that `build LINE` and
`doctor LINE` both read, so doctor fails exactly where the build refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from toolkit.base.paths import display_path
from toolkit.knowledge.facts import load_knowledge, minor_of
from toolkit.knowledge.nvcc_gcc import gcc_cap
from toolkit.machine.fingerprint import Fingerprint
from toolkit.spec.envspec import EnvSpec


@dataclass(frozen=True)
class Finding:
    """One verdict on the machine: ok | warn | fail, the file or tool it is about, what is wrong, the fix."""

    status: str
    where: str
    message: str
    fix: str = ""

    def line(self) -> str:
        """The house one-line form, `where: problem (fix)`, as preflight reports it."""
        return f"{self.where}: {self.message}" + (f" ({self.fix})" if self.fix else "")


def cuda_tag(cuda: str) -> str:
    """'12.6' -> 'cu126', the tag of torch's wheel index."""
    return "cu" + cuda.replace(".", "")


def python_runs(fp: Fingerprint, spec: EnvSpec | None, line: str = "LINE") -> Finding:
    """The environment's python runs (everything torch-related is read through it). The fix depends on
    whether the python is a machine's own (an external toolchain) or a locked line's environment."""
    where = fp.python_path or "python3"
    if fp.python_version:
        return Finding("ok", where, f"{fp.python_version} at {fp.python_path}")
    if spec and spec.toolchain.kind == "external":
        fix = f"run on the machine {display_path(spec.path)} describes, or fix its toolchain.python_executable"
    else:
        fix = f"install the environment (toolkit install {spec.line if spec else line}) or put a python3 on PATH"
    return Finding("fail", where, "not found or does not run", fix)


def torch_installed(fp: Fingerprint, install: str) -> Finding | None:
    """torch in the environment's python, with a version it could have: flash-attn's setup.py imports it.
    `install` is the pip command that installs the right one (the line's torch, where a line is known)."""
    if not fp.python_version:
        return None  # no python that runs: its own check says so
    torch = fp.torch
    if torch is None:
        return Finding(
            "fail",
            fp.python_path or "python3",
            "torch is not installed",
            f"flash-attn builds and runs against torch: {install}",
        )
    try:
        Version(torch.version)
    except InvalidVersion:
        return Finding(
            "fail",
            f"{torch.path}/version.py",
            "holds no version torch could have",
            f"reinstall torch: {install}",
        )
    return Finding(
        "ok",
        f"{torch.path}/version.py",
        f"{torch.version}, torch.version.cuda {torch.cuda or 'None (CPU build)'}, "
        f"C++11 ABI {'unknown' if torch.cxx11_abi is None else torch.cxx11_abi}",
    )


def torch_cuda_build(fp: Fingerprint, install: str) -> Finding | None:
    """A CUDA build of torch (torch.version.cuda set): a CPU build cannot compile or run flash-attn."""
    torch = fp.torch
    if torch is None or torch.cuda:
        return None
    return Finding(
        "fail",
        f"{torch.path}/version.py",
        f"torch {torch.version} is a CPU build (torch.version.cuda is None)",
        f"flash-attn needs a CUDA build of torch: {install}",
    )


def torch_vs_nvcc(fp: Fingerprint) -> Finding | None:
    """torch's CUDA against nvcc's, judged as torch's cpp_extension judges them when flash-attn builds."""
    torch, have = fp.torch, fp.nvcc_line
    if not torch or not torch.cuda or not have:
        return None
    want = minor_of(torch.cuda)
    where = f"{torch.path}/version.py"
    if have == want:
        return Finding("ok", where, f"torch {torch.version} and nvcc both CUDA {have}")
    fix = (
        f"use a CUDA {want} nvcc (conda cuda-nvcc {want}.*, or CUDA_HOME of a {want} toolkit), "
        f"or torch's {cuda_tag(have)} build"
    )
    built = f"torch {torch.version} built for CUDA {torch.cuda}, nvcc is {have}"
    if have.split(".")[0] != want.split(".")[0]:
        return Finding(
            "fail", where, f"{built}: torch refuses to build extensions across CUDA majors", fix
        )
    return Finding(
        "warn",
        where,
        f"{built}: torch builds with a warning within a CUDA major; the line's lock "
        f"keeps them equal",
        fix,
    )


def nvcc(fp: Fingerprint, line: str = "LINE") -> Finding:
    """nvcc under CUDA_HOME (or on PATH) that runs: pip's torch ships none, and flash-attn compiles with it."""
    if not fp.nvcc_path:
        where = f"{fp.cuda_home}/bin/nvcc" if fp.cuda_home else "PATH"
        return Finding(
            "fail",
            where,
            "nvcc not found",
            f"pip's torch ships no nvcc: install a CUDA toolkit (toolkit install "
            f"{line}, conda cuda-nvcc) and point CUDA_HOME at it",
        )
    if not fp.nvcc_version:
        return Finding(
            "fail",
            fp.nvcc_path,
            "does not run or prints no version",
            "reinstall the CUDA toolkit (or point CUDA_HOME at a working one)",
        )
    return Finding("ok", fp.nvcc_path, f"{fp.nvcc_version} at {fp.nvcc_path}")


def cuda_headers(fp: Fingerprint) -> Finding | None:
    """cuda.h and nvcc's crt/host_config.h under CUDA_HOME: a toolkit without them fails the first compile."""
    home = fp.cuda_home
    if not home:
        return None
    full = (
        "point CUDA_HOME at a full toolkit, the directory whose include/ has cuda.h "
        "(e.g. export CUDA_HOME=/usr/local/cuda)"
    )
    if not fp.cuda_h:
        return Finding(
            "fail",
            f"{home}/include/cuda.h",
            "missing (a build fails: 'cuda.h: No such file')",
            f"install cuda-cudart-dev, or {full}",
        )
    if not fp.host_config_h:
        return Finding(
            "fail",
            f"{home}/include/crt/host_config.h",
            "missing (nvcc cannot compile without its crt headers)",
            f"install cuda-nvcc's crt headers, or {full}",
        )
    return Finding("ok", fp.cuda_h, fp.cuda_h)


def host_gcc(fp: Fingerprint, host_cap: int | None) -> Finding:
    """A host g++ that runs and that nvcc accepts (nvcc_gcc.gcc_cap: its crt/host_config.h cap where read,
    `host_cap`, else the line's in the knowledge)."""
    if fp.cxx_path and not fp.gcc_version:
        return Finding(
            "fail",
            fp.cxx_path,
            "does not run or prints no version for -dumpfullversion",
            "put a working g++ first on PATH (a compiler wrapper must pass -dumpfullversion through), "
            "or reinstall it",
        )
    if not fp.cxx_path or not fp.gcc_major:
        return Finding(
            "fail",
            fp.cxx_path or "g++",
            "no host C++ compiler (g++ on PATH)",
            "install g++ (conda gxx pinned by the line, or the system's) or put it on PATH",
        )
    cap = gcc_cap(fp.nvcc_line, load_knowledge(), host_cap, fp.host_config_h)
    if cap is None:
        return Finding("ok", fp.cxx_path, f"{fp.gcc_version} at {fp.cxx_path}")
    if not cap.accepts(int(fp.gcc_major)):
        most = cap.max_gcc
        return Finding(
            "fail",
            fp.cxx_path,
            f"gcc {fp.gcc_version} is newer than nvcc {fp.nvcc_line} accepts "
            f"(max gcc {most}, per {cap.source})",
            f"use gcc <= {most}: conda gxx {most}.*, or CC=gcc-{most} CXX=g++-{most}",
        )
    return Finding(
        "ok", fp.cxx_path, f"{fp.gcc_version} (nvcc {fp.nvcc_line} accepts <= {cap.max_gcc})"
    )


# ---------------------------------------------------------------- this machine against the spec


@dataclass(frozen=True)
class SpecFact:
    """One thing the spec says the toolchain is, read from the spec and from the machine. `severity` says what
    a difference means: `fail`, the build refuses and doctor fails; `warn`, the build prints it and goes on."""

    check: str  # doctor's row
    what: str
    wanted: Callable[[EnvSpec], object]  # None: the spec does not say
    have: Callable[
        [Fingerprint], object
    ]  # None: the machine lacks the tool (its own check says so)
    where: Callable[[Fingerprint], str]  # the machine's file or tool the value was read from
    severity: Callable[[str, str], str]  # (wanted, have) -> fail | warn


def _public(version: str) -> str | None:
    """The release without the local build tag (2.11.0+cu130 -> 2.11.0); None for no version torch has."""
    try:
        return Version(version).public
    except InvalidVersion:
        return None  # torch_installed says what is wrong with it


def _line_tag(spec: EnvSpec) -> str | None:
    line = load_knowledge().cuda_lines.get(spec.cuda)
    return line.tag if line else None


def _refused(wanted: str, have: str) -> str:
    return "fail"


def _torch_policy(wanted: str, have: str) -> str:
    """torch's own (torch_vs_nvcc): another CUDA build of the same major builds with a warning (cu131 for
    cu130); another major, or a CPU build, is refused."""
    return "warn" if have != "cpu" and have[:-1] == wanted[:-1] else "fail"


def _torch_file(fp: Fingerprint) -> str:
    return f"{fp.torch.path}/version.py" if fp.torch else "torch"


# Every field an external toolchain promises (spec rules keep toolchain.nvcc/gcc/python/torch equal to the
# spec's cuda/gcc/python/torch, and toolchain.torch's build tag the line's); a locked line's environment is
# made from the same values. A gcc other than the spec's is a toolchain the spec does not describe: refused.
# A torch of another CUDA build within the line's major builds (torch_vs_nvcc, where nvcc is the line's).
SPEC_FACTS: tuple[SpecFact, ...] = (
    SpecFact(
        "line-cuda",
        "nvcc",
        lambda s: s.cuda,
        lambda fp: fp.nvcc_line,
        lambda fp: fp.nvcc_path or "nvcc",
        _refused,
    ),
    SpecFact(
        "line-python",
        "python",
        lambda s: s.python,
        lambda fp: fp.python_minor,
        lambda fp: fp.python_path or "python3",
        _refused,
    ),
    SpecFact(
        "line-gcc",
        "gcc",
        lambda s: s.gcc,
        lambda fp: fp.gcc_major,
        lambda fp: fp.cxx_path or "g++",
        _refused,
    ),
    SpecFact(
        "line-torch",
        "torch",
        lambda s: _public(s.torch_version),
        lambda fp: _public(fp.torch.version) if fp.torch else None,
        _torch_file,
        _refused,
    ),
    SpecFact(
        "line-torch-cuda",
        "torch build",
        _line_tag,
        lambda fp: (cuda_tag(fp.torch.cuda) if fp.torch.cuda else "cpu") if fp.torch else None,
        _torch_file,
        _torch_policy,
    ),
    SpecFact(
        "line-cxx11-abi",
        "torch C++11 ABI",
        lambda s: s.toolchain.cxx11_abi,
        lambda fp: fp.torch.cxx11_abi if fp.torch else None,
        _torch_file,
        _refused,
    ),
)


def spec_fix(spec: EnvSpec) -> str:
    """Where a difference from the spec is fixed: the machine or the spec, or the line's own environment."""
    if spec.toolchain.kind == "external":
        return f"fix the machine or the toolchain section of {display_path(spec.path)}"
    return f"use the line's env: toolkit install {spec.line}, then toolkit doctor {spec.line}"


def against_spec(spec: EnvSpec, fp: Fingerprint) -> list[tuple[str, Finding]]:
    """(doctor's row, finding) for each SPEC_FACTS entry both the spec and the machine have a value for."""
    found = []
    for fact in SPEC_FACTS:
        wanted, have = fact.wanted(spec), fact.have(fp)
        if wanted is None or have is None:
            continue
        if str(wanted) == str(have):
            found.append((fact.check, Finding("ok", fact.where(fp), f"{fact.what} {have}")))
        else:
            found.append(
                (
                    fact.check,
                    Finding(
                        fact.severity(str(wanted), str(have)),
                        fact.where(fp),
                        f"{fact.what} {have}, the line wants {wanted}",
                        spec_fix(spec),
                    ),
                )
            )
    return found

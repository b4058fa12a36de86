"""Build preflight: what would make a flash-attn compile fail, found in under 2 s before it starts.

A failed flash-attn build costs anywhere from minutes to hours, so every cause we can see up front
(wrong nvcc, CPU torch, a gcc nvcc refuses, missing headers or ninja, archs the nvcc cannot emit, too
little RAM or disk) is checked from the toolchain fingerprint first. Each problem is one line naming
the file or tool and the fix; all of them are reported together.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import arch_number, load_knowledge
from toolkit.knowledge.nvcc_gcc import host_config_cap
from toolkit.machine import checks
from toolkit.machine.fingerprint import Fingerprint
from toolkit.spec.envspec import EnvSpec

# Unpacked sdist + objects + wheel of a flash-attn build: about 3 GB for four archs; keep headroom.
DISK_NEEDED_GB = 8.0


@dataclass(frozen=True)
class PreflightInput:
    """Everything the checks look at: the spec, the probed toolchain and what the build will ask for."""

    spec: EnvSpec
    fp: Fingerprint
    archs: tuple[str, ...]
    mem_gb: float  # memory the build is sized against (available RAM or --mem-gb)
    build_dir: Path  # where the sdist is unpacked and compiled (its filesystem's free space counts)
    nvcc_archs: frozenset[str] | None  # `nvcc --list-gpu-code`, None when it could not run
    gcc_cap: int | None  # the newest gcc major this nvcc's crt/host_config.h accepts
    compile_env: dict[str, str] | None = (
        None  # the environment the compilers run in (None: headers not probed)
    )
    archs_given: str | None = (
        None  # the option that chose `archs` ("--arch 75"); None: the spec's archs
    )
    mem_given: str | None = (
        None  # the option that set `mem_gb` ("--mem-gb 1"); None: /proc/meminfo's
    )


@dataclass(frozen=True)
class RequiredHeader:
    """A header a flash-attn build's compilers must find (toolkit/knowledge/compiler_headers.yaml)."""

    name: str
    package: str  # the conda package that ships it
    reached_from: str


@cache
def _compiler_headers() -> dict:
    return knowledge_files.read("compiler_headers.yaml")


def required_headers(flash_attn_version: str) -> tuple[RequiredHeader, ...]:
    """The headers this flash-attn version's sources reach, in the data file's order."""
    data = _compiler_headers()
    names = [
        h
        for entry in data["required"]
        if Version(flash_attn_version) in SpecifierSet(entry["flash_attn"])
        for h in entry["headers"]
    ]
    return tuple(RequiredHeader(name, **data["headers"][name]) for name in dict.fromkeys(names))


def unseen_headers(
    command: list[str], headers: tuple[str, ...], env: dict[str, str], suffix: str
) -> tuple[list[str], str | None]:
    """Which headers the compiler `command` does not find on its include path (`__has_include` in its own
    preprocessor, so -I flags, CPATH and nvcc.profile all count), and the compiler's error when it fails."""
    source = "".join(f"#if !__has_include(<{h}>)\nFA_ENVKIT_MISSING {h}\n#endif\n" for h in headers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"headers{suffix}"
        path.write_text(source)
        try:
            done = run_tied(
                [*command, "-E", str(path)], env=env, capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], f"{command[0]}: did not run ({exc})"
    if done.returncode != 0:
        first = next(
            (line for line in done.stderr.splitlines() if "error" in line),
            done.stderr.strip()[:200],
        )
        return [], first
    return re.findall(r"^FA_ENVKIT_MISSING (\S+)", done.stdout, re.M), None


def nvcc_gpu_codes(nvcc: str | None) -> frozenset[str] | None:
    """The sm numbers this nvcc can emit (`nvcc --list-gpu-code` -> {'75', '80', ...})."""
    if not nvcc:
        return None
    try:
        done = run_tied([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    codes = frozenset(re.findall(r"sm_(\d+)", done.stdout)) if done.returncode == 0 else frozenset()
    return codes or None


# ---------------------------------------------------------------- the checks (each: problem with fix, or None)


def python_present(p: PreflightInput) -> checks.Finding:
    return checks.python_runs(p.fp, p.spec)


def nvcc_present(p: PreflightInput) -> checks.Finding:
    return checks.nvcc(p.fp, p.spec.line)


def _torch_install(spec: EnvSpec) -> str:
    """Pinned to the line's build (+cu130): pip counts an installed 2.13.0+cpu as satisfying torch==2.13.0."""
    line_build = (
        f"{Version(spec.torch_version).public}+{load_knowledge().cuda_lines[spec.cuda].tag}"
    )
    return f"pip install torch=={line_build} --index-url {spec.torch_index}"


def torch_present(p: PreflightInput) -> checks.Finding | None:
    return checks.torch_installed(p.fp, _torch_install(p.spec))


def torch_is_cuda_build(p: PreflightInput) -> checks.Finding | None:
    return checks.torch_cuda_build(p.fp, _torch_install(p.spec))


def torch_cuda_matches_nvcc(p: PreflightInput) -> checks.Finding | None:
    return checks.torch_vs_nvcc(p.fp)


def host_compiler(p: PreflightInput) -> checks.Finding:
    return checks.host_gcc(p.fp, p.gcc_cap)


def cuda_headers_present(p: PreflightInput) -> checks.Finding | None:
    return (
        checks.cuda_headers(p.fp) if p.fp.nvcc_version else None
    )  # without nvcc, nvcc_present says what to install


def _header_compilers(p: PreflightInput) -> list[tuple[str, list[str], str]]:
    """g++ as torch's cpp_extension runs it for a .cpp (-I$CUDA_HOME/include), nvcc as it compiles a kernel."""
    cxx, nvcc, home = p.fp.cxx_path, p.fp.nvcc_path, p.fp.cuda_home
    found = [("g++", [cxx, "-x", "c++", f"-I{home}/include"], ".cpp")] if cxx else []
    return found + ([("nvcc", [nvcc, *(["-ccbin", cxx] if cxx else [])], ".cu")] if nvcc else [])


def _where_missing(home: str, header: RequiredHeader) -> str:
    """The fix for a header a compiler cannot see: it is in the prefix off the include path, or not installed."""
    found = [
        *sorted(Path(home).glob(f"targets/*/include/{header.name}")),
        *Path(home).glob(f"include/{header.name}"),
    ]
    if found:
        return f"{header.name} is at {found[0]} but not on that include path"
    return f"{header.name} is not installed (add {header.package} to conda_packages)"


def headers_visible(p: PreflightInput) -> str | None:
    """Each header the sources reach is on the include path g++ and nvcc get, not only somewhere in the prefix."""
    if p.compile_env is None or not p.fp.cuda_home or not p.fp.nvcc_version:
        return None
    headers = required_headers(p.spec.flash_attn_version)
    names = tuple(h.name for h in headers)
    lines = []
    for who, command, suffix in _header_compilers(p):
        missing, error = unseen_headers(command, names, p.compile_env, suffix)
        if error:
            lines.append(f"{who} ({command[0]}): cannot preprocess a probe: {error}")
        for header in (h for h in headers if h.name in missing):
            lines.append(
                f"{who} ({command[0]}): {_where_missing(p.fp.cuda_home, header)} "
                f"(needed by {header.reached_from})"
            )
    if not lines:
        return None
    cpath = p.compile_env.get("CPATH", "")
    return (
        f"{p.fp.cuda_home}: the compilers cannot see required headers: {'; '.join(lines)} "
        f"(CPATH={cpath or 'unset'}; install the package named, or point CUDA_HOME at a full toolkit)"
    )


def ninja_present(p: PreflightInput) -> str | None:
    if p.fp.ninja_path:
        return None
    return (
        "ninja: not found on PATH (without it torch compiles one file at a time and the build takes "
        "hours: install ninja into the environment)"
    )


def archs_supported(p: PreflightInput) -> str | None:
    kb = load_knowledge()
    too_old = [a for a in p.archs if arch_number(a) < kb.fa_min_arch]
    if too_old:
        where, fix = (
            (p.archs_given, "give those to --arch")
            if p.archs_given
            else (f"{p.spec.where('archs')}: archs", "drop them")
        )
        return (
            f"{where}: sm_{', sm_'.join(too_old)} older than FlashAttention-2 supports (sm_{kb.fa_min_arch} or "
            f"newer: {fix})"
        )
    if not p.fp.nvcc_line:
        return None
    line = kb.cuda_lines.get(p.fp.nvcc_line)
    known = set(line.archs) if line else None
    unsupported = [
        a
        for a in p.archs
        if (p.nvcc_archs is not None and str(arch_number(a)) not in p.nvcc_archs)
        or (known is not None and a not in known)
    ]
    if not unsupported:
        return None
    accepted = sorted(p.nvcc_archs or known or (), key=arch_number)
    return (
        f"{p.fp.nvcc_path}: nvcc {p.fp.nvcc_version} cannot compile sm_{', sm_'.join(unsupported)} "
        f"(it accepts sm_{', sm_'.join(accepted)}: drop the arch or use a newer CUDA line)"
    )


def enough_disk(p: PreflightInput) -> str | None:
    if p.fp.disk_free_gb >= DISK_NEEDED_GB:
        return None
    return (
        f"{p.build_dir}: {p.fp.disk_free_gb:.1f} GB free, a flash-attn build needs about {DISK_NEEDED_GB:.0f} GB "
        f"(free space, or set TOOLKIT_CACHE to a larger filesystem)"
    )


def enough_memory(p: PreflightInput) -> str | None:
    need = p.spec.build.gb_per_nvcc_thread
    if p.mem_gb >= need:
        return None
    if p.mem_given:
        return (
            f"{p.mem_given}: {p.mem_gb:g} GB is less than one nvcc thread needs (about {need} GB): pass at least "
            f"--mem-gb {need:g}, or leave it out to size from this machine's available memory"
        )
    return (
        f"/proc/meminfo: {p.mem_gb:.1f} GB available, one nvcc thread needs about {need} GB "
        f"(free memory, or pass --mem-gb where the machine grows its memory on demand)"
    )


# The shared machine checks (toolkit/machine/checks.py): doctor shows the same findings as rows.
SHARED_CHECKS: tuple[Callable[[PreflightInput], checks.Finding | None], ...] = (
    python_present,
    nvcc_present,
    torch_present,
    torch_is_cuda_build,
    torch_cuda_matches_nvcc,
    host_compiler,
    cuda_headers_present,
)

# What only a build asks (the build's archs, disk and memory, ninja, what its compilers see): doctor has no row.
BUILD_CHECKS: tuple[Callable[[PreflightInput], str | None], ...] = (
    headers_visible,
    ninja_present,
    archs_supported,
    enough_disk,
    enough_memory,
)


def findings(p: PreflightInput) -> list[checks.Finding]:
    """This machine against the spec (checks.SPEC_FACTS), then the shared checks: the findings doctor also shows."""
    return [finding for _, finding in checks.against_spec(p.spec, p.fp)] + [
        finding for check in SHARED_CHECKS if (finding := check(p))
    ]


def problems(p: PreflightInput) -> list[str]:
    """Every preflight problem, in the order a user should fix them: each failing finding, then the build's own."""
    return [finding.line() for finding in findings(p) if finding.status == "fail"] + [
        problem for check in BUILD_CHECKS if (problem := check(p))
    ]


def warnings(p: PreflightInput) -> list[str]:
    """The findings that do not stop a build but should be seen (a CUDA minor mismatch)."""
    return [finding.line() for finding in findings(p) if finding.status == "warn"]


def preflight_input(
    spec: EnvSpec,
    fp: Fingerprint,
    archs: tuple[str, ...],
    mem_gb: float,
    build_dir: Path,
    compile_env: dict[str, str] | None = None,
    archs_given: str | None = None,
    mem_given: str | None = None,
) -> PreflightInput:
    return PreflightInput(
        spec=spec,
        fp=fp,
        archs=archs,
        mem_gb=mem_gb,
        build_dir=build_dir,
        nvcc_archs=nvcc_gpu_codes(fp.nvcc_path),
        gcc_cap=host_config_cap(fp.host_config_h),
        compile_env=compile_env,
        archs_given=archs_given,
        mem_given=mem_given,
    )


def run_preflight(p: PreflightInput) -> None:
    """Raise one ToolkitError whose lines are the problems (the CLI prints each as `error: ...`); print
    each warning to stderr when the build may go on."""
    found = problems(p)
    if not found:
        for warning in warnings(p):
            print(f"warning: {warning}", file=sys.stderr)  # one line each, never wrapped
    if found:
        raise ToolkitError("\nerror: ".join(found))

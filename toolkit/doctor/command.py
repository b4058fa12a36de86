"""`toolkit doctor`: explain a machine or an environment in seconds, with a fix for everything wrong.

Most support questions are answered by a handful of versions (driver, nvcc, gcc, python, torch,
flash-attn) and one comparison. Doctor gathers them once (the shared toolchain fingerprint plus one
run of the environment's own python), then evaluates a table of small checks, each turning those
facts into a Row. A `--json` report carries the gathered facts too, so `--fingerprint REPORT.json`
replays another machine's situation here: that is how bug reports and the tests reproduce it.
The gathering is doctor_facts.py's; this module holds the checks and the command.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from toolkit.attention import backends as attention_backends
from toolkit.attention.recommend import lookup_rules
from toolkit.attention.verl import VerlShape, overrides
from toolkit.base.arguments import add_json, add_line, add_prefix, add_python
from toolkit.base.entry import add_renamed_option
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace, add_workspace_options
from toolkit.cache.config import configured_caches
from toolkit.doctor.facts import (
    CONDA_PLATFORMS,
    PROBED_PACKAGES,
    LineFacts,
    Probe,
    first_line,
    gather_line,
    load_line,
    probe_environment,
    published_builds,
    read_report,
)
from toolkit.env.lockfile import LockedPackage
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import Knowledge, arch_number, load_knowledge, minor_of
from toolkit.machine import checks, line_env
from toolkit.machine.fingerprint import Fingerprint, Gpu, from_dict
from toolkit.spec.envspec import EnvSpec

STATUS_ORDER = {"fail": 0, "warn": 1, "ok": 2, "info": 3}  # failing rows first


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # ok | warn | fail | info
    value: str
    fix: str = ""


# ---------------------------------------------------------------- gathered facts


@dataclass(frozen=True)
class DoctorKnowledge:
    minor_version_compat: dict[str, str]
    attn_implementations: tuple[dict, ...]


@cache
def doctor_knowledge() -> DoctorKnowledge:
    return knowledge_files.typed(
        "doctor.yaml",
        lambda data: DoctorKnowledge(
            minor_version_compat=data["minor_version_compat"],
            attn_implementations=tuple(data["attn_implementations"]),
        ),
    )


@dataclass(frozen=True)
class Facts:
    fingerprint: Fingerprint
    probe: Probe
    line: LineFacts | None
    kb: Knowledge = field(default_factory=load_knowledge)
    dk: DoctorKnowledge = field(default_factory=doctor_knowledge)


# ---------------------------------------------------------------- small helpers over the facts


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def cuda_of_tag(tag: str) -> str:
    """'cu126' -> '12.6', 'cu12' -> '12' (a major-only tag, as upstream's wheels use)."""
    digits = tag[2:]
    return digits if len(digits) <= 2 else f"{digits[:-1]}.{digits[-1]}"


def newest_cuda(driver: str, kb: Knowledge) -> str | None:
    """The newest CUDA line whose GA driver floor this driver meets."""
    fits = [v for v, line in kb.cuda_lines.items() if Version(driver) >= Version(line.min_driver)]
    return max(fits, key=Version) if fits else None


def driver_verdict(driver: str, cuda: str, f: Facts) -> tuple[str, str, str]:
    """(status, value, fix) for running a CUDA `cuda` runtime on this driver: its line's GA driver floor,
    else the floor of minor version compatibility for its major."""
    line = f.kb.cuda_lines.get(minor_of(cuda)) if "." in cuda else None
    compat = f.dk.minor_version_compat.get(cuda.split(".")[0])
    need = line.min_driver if line else compat
    if need is None:
        return "info", f"driver {driver}; CUDA {cuda} is not in toolkit/knowledge", ""
    if Version(driver) >= Version(need):
        return "ok", f"driver {driver} >= {need} (CUDA {cuda})", ""
    update = f"update the NVIDIA driver to >= {need}"
    if compat and Version(driver) >= Version(compat):
        return (
            "warn",
            f"driver {driver} is older than CUDA {cuda} needs ({need}): runs through minor version "
            f"compatibility only (no PTX JIT of newer code)",
            update,
        )
    newest = newest_cuda(driver, f.kb)
    older = f", or use CUDA <= {newest} ({f.kb.cuda_lines[newest].torch_index})" if newest else ""
    return "fail", f"driver {driver} is too old for CUDA {cuda} (needs >= {need})", update + older


def gpu_runs(sm: str, cubins: tuple[str, ...], ptx: tuple[str, ...]) -> bool:
    """Whether kernels built as these cubins/PTX load on a GPU of this sm (CUDA's compatibility rules):
    a cubin runs on its own major with an equal or higher minor (an `a` cubin on its exact sm only);
    PTX is JIT-compiled for any equal or newer sm."""
    gpu = int(sm)
    for arch in cubins:
        base = arch_number(arch)
        if base == gpu or (
            not arch.endswith("a") and base // 10 == gpu // 10 and base % 10 <= gpu % 10
        ):
            return True
    return any(arch_number(arch) <= gpu and not arch.endswith(("a", "f")) for arch in ptx)


def gpus_without_kernels(f: Facts) -> list[Gpu]:
    fa = f.probe.flash_attn
    if not fa or fa.cubins is None:
        return []
    return [gpu for gpu in f.fingerprint.gpus if not gpu_runs(gpu.sm, fa.cubins, fa.ptx or ())]


def explain_import_error(text: str, f: Facts) -> tuple[str, str]:
    """(cause, fix) for a flash_attn import failure, from the known-failures catalog `toolkit explain` uses."""
    from toolkit.build.diagnose import diagnose

    found = diagnose(text)
    if found is None:
        return (
            "flash_attn does not import",
            f"rebuild flash-attn in this environment (toolkit build {_line_name(f)})",
        )
    return found.cause, found.fix.replace("LINE", _line_name(f))


def _line_name(f: Facts) -> str:
    return f.line.name if f.line else "LINE"


def torch_install_hint(f: Facts) -> str:
    spec = f.line.spec if f.line else None
    if spec:
        return f"pip install torch=={spec.torch_version} --index-url {spec.torch_index}"
    line = f.kb.cuda_lines.get(f.fingerprint.nvcc_line or "")
    return (
        f"pip install torch --index-url {line.torch_index}"
        if line
        else "pip install torch (a CUDA build)"
    )


def flash_attn_problem(f: Facts) -> str | None:
    """Why an installed flash_attn cannot run here, or None (whether it is installed is `packages`' to say)."""
    fa = f.probe.flash_attn
    if fa is None:
        return None
    if fa.import_error:
        return "flash_attn does not import"
    missing = gpus_without_kernels(f)
    return f"no kernels for sm_{', sm_'.join(g.sm for g in missing)}" if missing else None


# ---------------------------------------------------------------- machine checks (each: Facts -> Row | None)


def finding_row(check: str, finding: checks.Finding | None) -> Row | None:
    """A shared machine check's finding (toolkit/machine/checks.py, the policy preflight uses) as a row;
    one that is not ok names its file or tool first, as preflight's refusal does."""
    if finding is None:
        return None
    value = finding.message if finding.status == "ok" else f"{finding.where}: {finding.message}"
    return Row(check, finding.status, value, finding.fix)


def check_driver(f: Facts) -> Row:
    driver = f.fingerprint.driver_version
    if not driver:
        return Row(
            "driver",
            "warn",
            "no NVIDIA driver (nvidia-smi not found or no GPU)",
            "building works here; running flash-attn needs a machine with an NVIDIA GPU and driver",
        )
    newest = newest_cuda(driver, f.kb)
    majors = [
        m for m, floor in f.dk.minor_version_compat.items() if Version(driver) >= Version(floor)
    ]
    compat = (
        f", any CUDA {max(majors, key=int)}.x through minor version compatibility" if majors else ""
    )
    if newest is None and not majors:
        oldest = min(f.kb.cuda_lines.values(), key=lambda line: Version(line.min_driver))
        return Row(
            "driver",
            "fail",
            f"{driver}: older than every CUDA line here needs",
            f"update the NVIDIA driver to >= {oldest.min_driver}",
        )
    return Row("driver", "ok", f"{driver}: runs CUDA <= {newest or 'none of the lines'}{compat}")


def check_gpus(f: Facts) -> Row:
    gpus = f.fingerprint.gpus
    if not gpus:
        return Row("gpus", "info", "none")
    value = "; ".join(f"{g.index}: {g.name} (sm_{g.sm})" for g in gpus)
    old = [g for g in gpus if int(g.sm) < f.kb.fa_min_arch]
    if old:
        return Row(
            "gpus",
            "fail",
            value,
            f"FlashAttention-2 needs sm_{f.kb.fa_min_arch}+ (Ampere or newer); GPU "
            f"{', '.join(str(g.index) for g in old)} cannot run it: use attn_implementation='sdpa' there",
        )
    return Row("gpus", "ok", value)


def check_cuda_home(f: Facts) -> Row:
    fp = f.fingerprint
    if not fp.cuda_home:
        return Row(
            "cuda-home",
            "fail",
            "not set, and no nvcc on PATH",
            "install a CUDA toolkit (conda cuda-nvcc, or the system's) and export CUDA_HOME=<its root>",
        )
    return Row("cuda-home", "ok", f"{fp.cuda_home} (from {f.probe.cuda_home_from})")


def check_nvcc(f: Facts) -> Row | None:
    return finding_row("nvcc", checks.nvcc(f.fingerprint, _line_name(f)))


def check_cuda_headers(f: Facts) -> Row | None:
    return finding_row("cuda-headers", checks.cuda_headers(f.fingerprint))


def check_gcc(f: Facts) -> Row | None:
    return finding_row("gcc", checks.host_gcc(f.fingerprint, f.probe.nvcc_max_gcc))


def check_python(f: Facts) -> Row | None:
    fp = f.fingerprint
    if fp.python_version and f.probe.error:
        return Row(
            "python",
            "fail",
            f"{fp.python_version} at {fp.python_path}: probe failed ({f.probe.error})",
            "run the python by hand: `python -c 'import flash_attn'` shows what hangs or crashes",
        )
    return finding_row(
        "python", checks.python_runs(fp, f.line.spec if f.line else None, _line_name(f))
    )


def check_torch(f: Facts) -> Row | None:
    return finding_row("torch", checks.torch_installed(f.fingerprint, torch_install_hint(f)))


def check_torch_cuda(f: Facts) -> Row | None:
    fp, usable = f.fingerprint, f.probe.cuda_available
    if fp.torch is None:
        return None
    if not fp.torch.cuda:
        return finding_row("torch-cuda", checks.torch_cuda_build(fp, torch_install_hint(f)))
    if not fp.driver_version:
        return Row(
            "torch-cuda",
            "warn",
            "no: no NVIDIA driver here",
            "building works; run on a GPU machine",
        )
    if usable:
        return Row(
            "torch-cuda", "ok", f"yes ({len(fp.gpus)} GPU{'s' if len(fp.gpus) != 1 else ''})"
        )
    if usable is False:
        return Row(
            "torch-cuda",
            "fail",
            f"no: torch.cuda.is_available() is False with driver {fp.driver_version}",
            "see the torch-vs-driver row; check CUDA_VISIBLE_DEVICES and `nvidia-smi`",
        )
    return Row("torch-cuda", "info", "not probed")


def check_torch_vs_nvcc(f: Facts) -> Row | None:
    return finding_row("torch-vs-nvcc", checks.torch_vs_nvcc(f.fingerprint))


def check_torch_vs_driver(f: Facts) -> Row | None:
    fp = f.fingerprint
    if not fp.torch or not fp.torch.cuda or not fp.driver_version:
        return None
    status, value, fix = driver_verdict(fp.driver_version, fp.torch.cuda, f)
    return Row("torch-vs-driver", status, f"torch's runtime: {value}", fix)


def check_flash_attn(f: Facts) -> Row:
    fa = f.probe.flash_attn
    if fa is None:
        return Row("flash-attn", "info", "not installed")
    dist = f.probe.python_packages.get("flash-attn", "unknown")
    if fa.import_error:
        cause, fix = explain_import_error(fa.import_error, f)
        return Row(
            "flash-attn",
            "fail",
            f"{dist}: import fails: {first_line(fa.import_error)}",
            f"{cause}: {fix}",
        )
    return Row("flash-attn", "ok", f"{dist} (flash_attn {fa.version}), extension {fa.extension}")


def check_flash_attn_build(f: Facts) -> Row | None:
    """The wheel's local tag (+cu126torch2.9, upstream's +cu12torch2.8cxx11abiTRUE) against the torch here."""
    local = (_version(f.probe.python_packages.get("flash-attn")) or Version("0")).local
    torch = f.fingerprint.torch
    if f.probe.flash_attn is None or torch is None or _version(torch.version) is None:
        return None  # nothing installed to compare, or a torch whose version is unknown (its row says so)
    if not local:
        return Row(
            "flash-attn-build",
            "info",
            "no local version tag (torch/CUDA it was built for not recorded)",
        )
    built_cuda = re.search(r"cu\d+", local)
    built_torch = re.search(r"torch(\d+)\.(\d+)", local)
    built_abi = re.search(r"cxx11abi(true|false)", local)
    torch_minor = minor_of(torch.version)
    fails, warns = [], []
    if built_torch and f"{built_torch.group(1)}.{built_torch.group(2)}" != torch_minor:
        fails.append(
            f"torch {built_torch.group(1)}.{built_torch.group(2)}, installed torch is {torch.version}"
        )
    if (
        built_abi
        and torch.cxx11_abi is not None
        and (built_abi.group(1) == "true") != torch.cxx11_abi
    ):
        fails.append(f"C++11 ABI {built_abi.group(1).upper()}, torch's is {torch.cxx11_abi}")
    if built_cuda and torch.cuda:
        cuda = cuda_of_tag(built_cuda.group(0))
        if cuda.split(".")[0] != torch.cuda.split(".")[0]:
            fails.append(f"CUDA {cuda}, torch's CUDA is {torch.cuda}")
        elif "." in cuda and cuda != minor_of(torch.cuda):
            warns.append(
                f"CUDA {cuda}, torch's CUDA is {torch.cuda} (runs; the lock keeps them equal)"
            )
    if not fails and not warns:
        return Row("flash-attn-build", "ok", f"built for {local}, matches torch {torch.version}")
    return Row(
        "flash-attn-build",
        "fail" if fails else "warn",
        f"built for {'; '.join(fails + warns)}",
        f"rebuild flash-attn against the installed torch {torch.version} (toolkit build {_line_name(f)})",
    )


def check_published(f: Facts, distribution: str) -> Row | None:
    """Whether the installed distribution is a build a configured cache published (by the sha256 of every file
    its wheel's RECORD lists), naming it and its verification report; only where caches are configured."""
    check = f"{distribution}-published"
    if f.probe.installed_builds_error and distribution in f.probe.dist_info:
        return Row(
            check,
            "warn",
            f.probe.installed_builds_error,
            "check the cache's URL (--cache, .fa-envkit/caches.toml)",
        )
    found = [b for b in f.probe.installed_builds if b.distribution == distribution]
    if not found:
        return None
    build = found[0]
    if not build.published:
        return Row(
            check,
            "warn",
            f"{distribution} {build.version}: an unknown build ({build.detail})",
            "install a published build (toolkit export LINE --index URL) or build it here (toolkit build LINE)",
        )
    report = (
        f"verification report {build.report}"
        if build.report
        else "no verification report published"
    )
    return Row(
        check,
        "ok",
        f"{distribution} {build.version}: the published build {build.wheel} (line {build.line}, "
        f"inputs {build.inputs_key}); {report}",
    )


def check_flash_attn_published(f: Facts) -> Row | None:
    return check_published(f, "flash-attn")


def check_flash_attn_3_published(f: Facts) -> Row | None:
    return check_published(f, "flash-attn-3")


def check_fa4_kernel_cache_published(f: Facts) -> Row | None:
    """Whether the FA4 kernel cache in use holds a published artifact's files (by sha256), beside the wheels'
    rows; only where caches are configured and the shell points FA4 at a cache folder."""
    found = f.probe.fa4_kernel_cache
    if found is None:
        return None
    if not found.published:
        return Row(
            "fa4-kernel-cache-published",
            "warn",
            f"{found.folder}: an unknown FA4 kernel cache ({found.detail})",
            "install the published one (toolkit fa4 cache-install --cache URL --target DIR --arch SM --dest "
            "DIR) or warm it here (toolkit fa4 warm)",
        )
    return Row(
        "fa4-kernel-cache-published",
        "ok",
        f"{found.folder}: the published FA4 kernel cache {found.artifact} "
        f"(key {found.key}, {found.files} files, each with its sha256)",
    )


def check_flash_attn_archs(f: Facts) -> Row | None:
    fa = f.probe.flash_attn
    if fa is None or not fa.extension:
        return None
    if fa.cubins is None:
        return Row(
            "flash-attn-archs",
            "warn",
            f"cannot read the archs of {fa.extension}: {fa.archs_error}",
            "reinstall flash-attn (the extension looks damaged)",
        )
    value = (f"sm_{', sm_'.join(fa.cubins)}" if fa.cubins else "no cubins") + (
        f"; PTX compute_{', compute_'.join(fa.ptx)}" if fa.ptx else ""
    )
    if not f.fingerprint.gpus:
        return Row("flash-attn-archs", "info", f"{value} (no GPU here to compare)")
    missing = gpus_without_kernels(f)
    if missing:
        sms = sorted({g.sm for g in missing}, key=int)
        return Row(
            "flash-attn-archs",
            "fail",
            f"{value}: no kernels for GPU {', '.join(f'{g.index} (sm_{g.sm})' for g in missing)} "
            f"('no kernel image is available for execution on the device')",
            f"rebuild with the GPU's arch: add {', '.join(repr(s) for s in sms)} to archs in the line's "
            f"spec (FLASH_ATTN_CUDA_ARCHS={';'.join(list(fa.cubins) + sms)})",
        )
    return Row("flash-attn-archs", "ok", f"{value}: covers every GPU here")


def _satisfies(installed: str | None, specifier: str) -> bool:
    version = _version(installed)
    return version is not None and SpecifierSet(specifier).contains(
        version.public, prereleases=True
    )


def needs_torch(f: Facts, specifier: str) -> str | None:
    torch = f.fingerprint.torch
    return None if torch and _satisfies(torch.version, specifier) else f"needs torch {specifier}"


def needs_packages(f: Facts, wanted: dict[str, str]) -> str | None:
    missing = [
        f"{name}{spec}"
        for name, spec in wanted.items()
        if not _satisfies(f.probe.python_packages.get(name), spec)
    ]
    return f"needs {', '.join(missing)}" if missing else None


def needs_torch_cuda(f: Facts, _: bool) -> str | None:
    return None if f.probe.cuda_available else "torch cannot use a GPU here"


def needs_min_sm(f: Facts, sm: int) -> str | None:
    old = [f"sm_{g.sm}" for g in f.fingerprint.gpus if int(g.sm) < sm]
    return f"needs sm_{sm}+, GPU is {', '.join(old)}" if old else None


# The `needs` keys of knowledge/doctor.yaml's attn_implementations: each returns why not, or None. The
# second argument is that key's YAML value, whose type is the key's (a specifier, a mapping, a number).
REQUIREMENTS: dict[str, Callable[[Facts, Any], str | None]] = {
    "torch": needs_torch,
    "packages": needs_packages,
    "torch_cuda": needs_torch_cuda,
    "min_sm": needs_min_sm,
    "flash_attn_works": lambda f, _: flash_attn_problem(f),
}


def _applying(f: Facts, name: str, transformers: Version) -> dict | None:
    """The first entry of doctor.yaml's table for `name` whose transformers range holds (None: no such value)."""
    return next(
        (
            e
            for e in f.dk.attn_implementations
            if e["name"] == name and SpecifierSet(e["transformers"]).contains(transformers, True)
        ),
        None,
    )


def _unmet(f: Facts, entry: dict) -> str | None:
    return (
        ", ".join(
            reason for key, want in entry["needs"].items() if (reason := REQUIREMENTS[key](f, want))
        )
        or None
    )


def attn_implementation_problem(f: Facts, name: str, transformers: Version) -> str | None:
    """Why attn_implementation `name` would not load here, None where it would."""
    entry = _applying(f, name, transformers)
    return (
        f"transformers {transformers} has no attn_implementation {name}"
        if entry is None
        else _unmet(f, entry)
    )


def attn_implementations(f: Facts, transformers: Version) -> tuple[list[str], list[str]]:
    """(works, ["name: why not", ...]) for the attn_implementation values this transformers has."""
    works, not_working = [], []
    for name in dict.fromkeys(entry["name"] for entry in f.dk.attn_implementations):
        entry = _applying(f, name, transformers)
        if entry is None:
            continue
        problem = _unmet(f, entry)
        if problem:
            not_working.append(f"{name}: {problem}")
        else:
            works.append(name)
    return works, not_working


def check_transformers(f: Facts) -> Row | None:
    version = _version(f.probe.python_packages.get("transformers"))
    if version is None:
        return None
    works, not_working = attn_implementations(f, version)
    if not works and not not_working:
        return Row("transformers", "info", f"{version}: predates attn_implementation (4.36)")
    return Row(
        "transformers",
        "info",
        f"{version}: attn_implementation works: {', '.join(works) or 'none'}",
        "; ".join(not_working),
    )


MACHINE_CHECKS: tuple[Callable[[Facts], Row | None], ...] = (
    check_driver,
    check_gpus,
    check_cuda_home,
    check_nvcc,
    check_cuda_headers,
    check_gcc,
    check_python,
    check_torch,
    check_torch_cuda,
    check_torch_vs_nvcc,
    check_torch_vs_driver,
    check_flash_attn,
    check_flash_attn_build,
    check_flash_attn_archs,
    check_flash_attn_published,
    check_flash_attn_3_published,
    check_fa4_kernel_cache_published,
    check_transformers,
)


# ---------------------------------------------------------------- checks against the LINE given


def check_line(line: LineFacts) -> Row:
    """The LINE's spec, or why it could not be read (then no other line check runs)."""
    if line.spec is None:
        return Row(
            "line",
            "fail",
            line.spec_error or "unreadable spec",
            f"fix the spec (toolkit check {line.name})",
        )
    spec = line.spec
    return Row(
        "line",
        "ok",
        f"{display_path(spec.path)}: CUDA {spec.cuda}, python {spec.python}, gcc {spec.gcc}, "
        f"torch {spec.torch_version}, flash-attn {spec.flash_attn_version}, "
        f"archs {' '.join(spec.archs)}, {spec.toolchain.kind} toolchain",
    )


def line_comparisons(f: Facts, line: LineFacts, spec: EnvSpec) -> list[Row]:
    """This machine against the spec: the table `toolkit build` refuses by (checks.SPEC_FACTS), one row each."""
    return [
        row
        for check, finding in checks.against_spec(spec, f.fingerprint)
        if (row := finding_row(check, finding))
    ]


def check_line_driver(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    driver = f.fingerprint.driver_version
    if not driver:
        return None
    status, value, fix = driver_verdict(driver, spec.cuda, f)
    return Row("line-driver", status, value, fix)


def check_line_archs(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    gpus = f.fingerprint.gpus
    if not gpus:
        return None
    missing = [g for g in gpus if not gpu_runs(g.sm, spec.archs, ())]
    if not missing:
        return Row("line-archs", "ok", f"archs {' '.join(spec.archs)} cover every GPU here")
    sms = sorted({g.sm for g in missing}, key=int)
    untargetable = [sm for sm in sms if sm not in f.kb.cuda_lines[spec.cuda].archs]
    first_line = [
        v for sm in untargetable[:1] for v, line in f.kb.cuda_lines.items() if sm in line.archs
    ]
    needs = (
        f" (nvcc {spec.cuda} cannot emit sm_{untargetable[0]}: use a CUDA {first_line[0]}+ line)"
        if first_line
        else ""
    )
    return Row(
        "line-archs",
        "fail",
        f"archs {' '.join(spec.archs)} leave out GPU "
        f"{', '.join(f'{g.index} (sm_{g.sm})' for g in missing)}",
        f"add {', '.join(repr(s) for s in sms)} to archs in {display_path(spec.path)}{needs}",
    )


def check_line_archs_unrun(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    """Said, not implied: the build proves a cubin per declared arch is in the wheel, only a GPU of that arch
    proves it runs, and this project has run kernels on few archs (toolkit/knowledge/gpus.yaml `ran`)."""
    unrun = f.kb.never_ran(spec.archs)
    if not unrun:
        return None
    ran = ", ".join(f"sm_{a} ({'/'.join(gpus)})" for a, gpus in sorted(f.kb.ran_archs.items()))
    return Row(
        "line-archs-unrun",
        "info",
        f"sm_{', sm_'.join(unrun)}: the build checks that the wheel holds their cubins; no GPU of these archs "
        f"has run them here (this project's GPUs: {ran})",
        f"toolkit verify {spec.line} on such a GPU",
    )


def check_lock(f: Facts, line: LineFacts, spec: EnvSpec) -> Row:
    if line.lock_problem:
        return Row(
            "lock",
            "fail" if line.locked is None else "warn",
            line.lock_problem,
            f"toolkit lock {line.name}",
        )
    if line.locked is None:
        return Row(
            "lock",
            "info",
            f"no lock yet ({display_path(line.lock_file)})",
            f"toolkit lock {line.name}",
        )
    return Row(
        "lock",
        "ok",
        f"{display_path(line.lock_file)}: {len(line.locked)} packages, matches the spec",
    )


def conda_build(package: LockedPackage) -> str:
    """A conda archive's build string, the last dash-field of its file name (gxx-13.3.0-h9a4b1e8_1.conda ->
    h9a4b1e8_1): conda-meta records it, the lock names only the archive."""
    stem = re.sub(r"\.(conda|tar\.bz2)$", "", package.filename)
    return stem.rsplit("-", 2)[-1] if stem.count("-") >= 2 else ""


def _differences(
    locked: list[LockedPackage], installed: dict[str, str], with_build: bool
) -> list[str]:
    diffs = []
    for pkg in locked:
        have = installed.get(pkg.name)
        want = f"{pkg.version}={conda_build(pkg)}" if with_build else pkg.version
        if have is None:
            diffs.append(f"{pkg.name} missing (lock: {pkg.version})")
        elif (have != want) if with_build else (_version(have) != _version(want)):
            diffs.append(f"{pkg.name} {have} (lock: {want})")
    return diffs


def _lock_rows(
    f: Facts, line: LineFacts, manager: str, installed: dict[str, str] | None, where: str
) -> Row | None:
    platform = CONDA_PLATFORMS.get(f.fingerprint.machine)
    locked = [p for p in line.locked or () if p.manager == manager]
    if not locked or installed is None:
        return None
    diffs = _differences(locked, installed, with_build=manager == "conda")
    check = f"lock-{manager}"
    if not diffs:
        return Row(
            check, "ok", f"{len(locked)} {manager} packages of {where} as locked ({platform})"
        )
    more = f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else ""
    return Row(
        check,
        "fail",
        f"{where} differs from the lock: {'; '.join(diffs[:5])}{more}",
        f"re-install from the lock: toolkit install {line.name}",
    )


def check_lock_conda(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    """The conda prefix against the lock's conda packages; nothing for a lock without any (a pypi line's venv)."""
    if (
        line.locked is None
        or line.env_prefix is None
        or not any(p.manager == "conda" for p in line.locked)
    ):
        return None
    if f.probe.conda_packages is None:
        return Row(
            "lock-conda",
            "info",
            f"no env at {display_path(line.env_prefix)}",
            f"toolkit install {line.name}",
        )
    return _lock_rows(f, line, "conda", f.probe.conda_packages, display_path(line.env_prefix))


def check_install_record(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    """Was the line's prefix made by `toolkit install`, and from the lock that is there now?"""
    prefix = line.env_prefix
    if prefix is None or line.lock_digest is None or not (prefix / "bin" / "python").exists():
        return None
    where, record = display_path(prefix), line.install_record
    if record is None:
        return Row(
            "install-record",
            "warn",
            f"{where}: no toolkit install record (etc/fa-envkit/lock.json): not "
            f"made by `toolkit install`, so nothing ties it to the lock",
            f"move it away, then toolkit install {line.name}",
        )
    if record.lock_sha256 != line.lock_digest:
        return Row(
            "install-record",
            "warn",
            f"{where}: installed from a lock with digest {record.lock_sha256[:12]}, "
            f"{display_path(line.lock_file)} is now {line.lock_digest[:12]}",
            f"toolkit install {line.name}",
        )
    return Row(
        "install-record",
        "ok",
        f"installed by `toolkit install` from this lock ({record.platform}, "
        f"digest {record.lock_sha256[:12]})",
    )


def check_lock_pip(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    return _lock_rows(
        f, line, "pip", f.probe.python_packages, f.fingerprint.python_path or "python"
    )


def check_record(f: Facts, line: LineFacts, spec: EnvSpec) -> Row:
    where = display_path(line.wheel_dir)
    if line.record_error:
        return Row(
            "record", "fail", line.record_error, f"rebuild: toolkit build {line.name} --force"
        )
    if line.record is None:
        return Row(
            "record",
            "info",
            f"no build yet (no build record in {where}/)",
            f"toolkit build {line.name}",
        )
    wheel, built = line.record.outputs.wheel, line.record.outputs.version
    installed = f.probe.python_packages.get("flash-attn")
    install = f"pip install {display_path(line.wheel_dir / wheel)}"
    if installed is None:
        return Row("record", "info", f"built {wheel}, not installed in this environment", install)
    if _version(installed) != _version(built):
        return Row(
            "record",
            "warn",
            f"installed flash-attn {installed} is not the line's build {wheel}",
            install,
        )
    return Row("record", "ok", f"installed flash-attn is the line's build {wheel}")


# What a difference from the toolchain in the build record means for the installed wheel: fail where it
# breaks the import (python tag, torch ABI), warn where it only changes how it was built.
RECORD_FIELDS: tuple[tuple[str, Callable[[Fingerprint], object], str], ...] = (
    ("python", lambda fp: fp.python_minor, "fail"),
    ("torch", lambda fp: fp.torch.version if fp.torch else None, "fail"),
    ("torch C++11 ABI", lambda fp: fp.torch.cxx11_abi if fp.torch else None, "fail"),
    ("nvcc", lambda fp: fp.nvcc_version, "warn"),
    ("gcc", lambda fp: fp.gcc_version, "warn"),
)


def check_record_toolchain(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    recorded = line.record.fingerprint if line.record else None
    if not recorded:
        return None
    try:
        built_with = from_dict(recorded)
    except (TypeError, ValueError, AttributeError):  # a hand-edited record
        return Row(
            "record-toolchain",
            "warn",
            "the build record's fingerprint is not one `toolkit build` writes",
            f"rebuild: toolkit build {line.name} --force",
        )
    diffs = [
        (status, f"{what} {have} (built with {want})")
        for what, value_of, status in RECORD_FIELDS
        if (want := value_of(built_with)) is not None
        and (have := value_of(f.fingerprint)) is not None
        and str(want) != str(have)
    ]
    if not diffs:
        return Row("record-toolchain", "ok", "this toolchain is the one the wheel was built with")
    status = "fail" if any(s == "fail" for s, _ in diffs) else "warn"
    return Row(
        "record-toolchain",
        status,
        "; ".join(text for _, text in diffs),
        f"rebuild here (toolkit build {line.name}) or use the toolchain the record names",
    )


def check_env(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    """A locked or pypi line whose environment is not installed: say so and how to make it, instead of judging
    this shell's nvcc, gcc and python, which the line's build never uses. An installed pypi line's venv is
    described: where its python and CUDA_HOME are (line_env's layout) and that the host compiler is the machine's."""
    missing, name = f.probe.env_missing, line.name
    if missing is None:
        return describe_venv(f, line, spec)
    where = "" if Path(missing) == Workspace().prefix(name) else f" --prefix {missing}"
    if line.lock_file.exists():
        fix = f"toolkit install {name}{where} (or nox -s env-{name})"
    else:
        fix = f"toolkit lock {name} && toolkit install {name}{where} (or nox -s lock-{name} env-{name})"
    return Row(
        "env",
        "fail",
        f"{missing}: {name}'s environment is not installed (the toolchain checks need it; "
        "this shell's own tools are not what the line builds with)",
        fix,
    )


def describe_venv(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    if spec.toolchain.kind != "pypi" or line.env_prefix is None:
        return None
    fp, where = f.fingerprint, display_path(line.env_prefix)
    compiler = (
        f"the machine's g++ {fp.cxx_path}"
        if fp.cxx_path
        else "no g++ on PATH (the machine's is used)"
    )
    return Row(
        "env",
        "ok",
        f"venv {where}: python {fp.python_path}, CUDA_HOME {fp.cuda_home} (NVIDIA's wheels), "
        f"host compiler {compiler}",
    )


def check_recommendation(f: Facts, line: LineFacts, spec: EnvSpec) -> Row | None:
    """The fastest verified attention `toolkit recommend LINE` found for this line, when it ran: on
    which GPU, and what to ask transformers for (bf16, head dim 128; the file has every measured shape)."""
    from toolkit.attention.recommend import summary

    if line.recommendation_error:
        return Row(
            "attention", "warn", line.recommendation_error, f"toolkit recommend {line.name} ..."
        )
    rec = line.recommendation
    if rec is None:
        return None
    where = f"{display_path(rec.path)}, measured on {rec.gpu} {rec.date}".rstrip()
    text = "; ".join(summary(rec)) or "no bf16 d128 shape in it"
    here = {gpu.name for gpu in f.fingerprint.gpus}
    if here and rec.gpu not in here:
        return Row(
            "attention",
            "warn",
            f"{text} ({where}; this machine has {', '.join(sorted(here))})",
            f"measure here: toolkit bench {line.name}, then toolkit recommend {line.name}",
        )
    return Row("attention", "ok" if here else "info", f"{text} ({where})")


def check_verl(f: Facts, line: LineFacts, spec: EnvSpec) -> Row:
    """verl loads every model with its default attn_implementation (flash_attention_2) unless the trainer config
    overrides it: whether that loads in this environment and was verified for the line, and, where not, the
    override lines for what does load (the line's recommendation at verl's training shape, else sdpa).
    A warning where verl is installed here, information where it is not."""
    default = attention_backends.verl().default_attn_implementation
    installed = f.probe.python_packages.get("verl")
    who, status = (
        (f"verl {installed}", "warn") if installed else ("verl (not installed here)", "info")
    )
    transformers = _version(f.probe.python_packages.get("transformers"))
    problem = (
        attn_implementation_problem(f, default, transformers)
        if transformers
        else "transformers is not installed"
    )
    fix = f"set {' and '.join(overrides(_verl_instead(f, line, transformers)))}"
    if problem:
        return Row(
            "verl",
            status,
            f"{who}: its default attn_implementation {default} would not load here: {problem}",
            fix,
        )
    unverified = _verl_default_unverified(line, default)
    if unverified:
        return Row(
            "verl",
            status,
            f"{who}: its default attn_implementation {default} loads here but {unverified}",
            f"{_verify_and_recommend(line.name, default)}; or {fix}",
        )
    rec = line.recommendation
    where = f"on {rec.gpu} ({display_path(rec.path)})" if rec else ""
    return Row(
        "verl",
        "ok",
        f"{who}: its default attn_implementation {default} loads here and was verified {where}",
    )


def _verify_and_recommend(name: str, attn_implementation: str) -> str:
    """The commands that verify the backend behind `attn_implementation` for the line and record it."""
    backend = attention_backends.by_attn_implementation(attn_implementation)
    reports = display_path(Workspace().report_dir(name))
    return (
        f"toolkit verify {name} && toolkit bench {name} && toolkit recommend {name} --bench {reports}/bench.json "
        f"--verified {backend.name if backend else attn_implementation}={reports}/verify.json"
    )


def _verl_default_unverified(line: LineFacts, default: str) -> str | None:
    """Why verl's default backend does not count as verified for the line's GPU at verl's shape, or None."""
    backend = attention_backends.by_attn_implementation(default)
    rec, shape = line.recommendation, VerlShape()
    name = backend.name if backend else default
    if rec is None:
        return f"no recommendation says {name} was verified for {line.name} (toolkit recommend {line.name} writes one)"
    verified = rec.verified.get(name)
    if verified is None:
        return f"{name} was not verified on {rec.gpu} ({display_path(rec.path)})"
    if verified.shapes is not None and (shape.dtype, shape.head_dim, shape.causal) not in map(
        tuple, verified.shapes
    ):
        return f"{name}'s verification on {rec.gpu} did not cover verl's training shape ({shape})"
    return None


def _verl_instead(f: Facts, line: LineFacts, transformers: Version | None) -> str:
    """What verl should be told: the line's recommendation at verl's shape where it loads here, else the first of
    torch's own (sdpa, then eager) that does."""
    shape = VerlShape()
    rule = (
        lookup_rules(
            list(line.recommendation.rules),
            shape.dtype,
            shape.head_dim,
            shape.causal,
            shape.mode,
            shape.seqlen,
        )
        if line.recommendation
        else None
    )
    torch_own = [
        attention_backends.backends()[name].attn_implementation
        for name in attention_backends.torch_backends()
    ]
    candidates = [rule.attn_implementation["name"]] if rule else []
    return next(
        (
            name
            for name in [*candidates, *torch_own]
            if transformers and not attn_implementation_problem(f, name, transformers)
        ),
        torch_own[-1],
    )


LineCheck = Callable[[Facts, LineFacts, EnvSpec], Row | list[Row] | None]
LINE_CHECKS: tuple[LineCheck, ...] = (
    check_env,
    line_comparisons,
    check_line_driver,
    check_line_archs,
    check_line_archs_unrun,
    check_lock,
    check_lock_conda,
    check_install_record,
    check_lock_pip,
    check_record,
    check_record_toolchain,
    check_recommendation,
    check_verl,
)
# What can be judged while a locked line's environment is missing: the machine and the line's own files.
WITHOUT_ENV: frozenset[Callable[..., object]] = frozenset(
    {
        check_driver,
        check_gpus,
        check_env,
        check_line_driver,
        check_line_archs,
        check_line_archs_unrun,
        check_lock,
        check_recommendation,
    }
)


def evaluate(f: Facts) -> list[Row]:
    """Every row, failing rows first (stable within a status)."""
    applies: Callable[[Callable[..., object]], bool] = (
        (lambda check: check in WITHOUT_ENV) if f.probe.env_missing else (lambda check: True)
    )
    rows = [row for check in MACHINE_CHECKS if applies(check) and (row := check(f))]
    if f.line:
        rows.append(check_line(f.line))
        if f.line.spec:
            for line_check in filter(applies, LINE_CHECKS):
                found = line_check(f, f.line, f.line.spec)
                rows += found if isinstance(found, list) else [found] if found else []
    return sorted(rows, key=lambda row: STATUS_ORDER[row.status])


# ---------------------------------------------------------------- gathering


def gather(args: argparse.Namespace) -> Facts:
    """This machine's facts, or a recorded report's; plus the line's files when a line is named."""
    line_name = args.line
    if args.fingerprint:
        fp, found, recorded_line = read_report(args.fingerprint)
        line_name = line_name or recorded_line
    workspace = Workspace.from_args(args)
    spec, spec_error = load_line(line_name, workspace) if line_name else (None, None)
    machine = fp.machine if args.fingerprint else platform.machine()
    line = (
        gather_line(line_name, spec, spec_error, machine, workspace, args.prefix)
        if line_name
        else None
    )
    if not args.fingerprint:
        if args.prefix is not None and not args.prefix.is_dir():
            raise ToolkitError(
                f"{args.prefix}: no such environment prefix (pass the directory of a conda env, or of "
                f"a pypi line's venv with its LINE)"
            )
        env = line_env.resolve(spec, args.prefix, python=args.python)
        fp = env.fingerprint()
        locked_pip = tuple(
            p.name for p in (line.locked if line and line.locked else ()) if p.manager == "pip"
        )
        found = probe_environment(fp, env, tuple(dict.fromkeys(PROBED_PACKAGES + locked_pip)))
        try:
            caches = configured_caches(args.cache)
        except ToolkitError as exc:  # a broken cache configuration is a row, not an abort
            found = replace(found, installed_builds_error=str(exc))
        else:
            found = published_builds(found, caches, workspace.cache / "substitutes")
    return Facts(fp, found, line)


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        description="Gather driver, GPUs, CUDA_HOME/nvcc, gcc, python, torch, flash-attn and transformers, "
        "compare them with each other and (given a LINE) with the line's spec, lock and build "
        "record. One row per check with a fix where wrong; failing rows first. Exit 0 when "
        "all is well, 1 when something would break a build or a run.",
    )
    add_line(parser, "also compare with this line's spec, lock and build record", optional=True)
    add_renamed_option(parser, "--line", "`toolkit doctor LINE`")
    add_prefix(
        parser,
        "check this conda env (CUDA_HOME=DIR, DIR/bin/python, DIR/bin first on PATH); with a pypi LINE, "
        "the line's venv there (CUDA_HOME=DIR's site-packages/nvidia/cu13)",
    )
    add_json(
        parser, "print JSON {ok, line, rows, fingerprint, probe} (stable keys) instead of a table"
    )
    add_python(
        parser, "check the environment of this python (a venv's bin/python) instead of the shell's"
    )
    parser.add_argument(
        "--cache",
        action="append",
        metavar="URL",
        help="name the installed flash-attn / FA3 (and the FA4 kernel cache "
        "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR names) against this published cache (besides those "
        "of .fa-envkit/caches.toml): a published build, with its verification report, or an "
        "unknown build",
    )
    parser.add_argument(
        "--fingerprint",
        type=Path,
        metavar="REPORT",
        help="evaluate a recorded `toolkit doctor --json` report instead of this machine",
    )
    add_workspace_options(parser)
    parser.set_defaults(func=doctor_command)


def report(facts: Facts, rows: list[Row]) -> dict:
    return {
        "ok": not any(r.status == "fail" for r in rows),
        "line": facts.line.name if facts.line else None,
        "rows": [asdict(r) for r in rows],
        "fingerprint": facts.fingerprint.to_dict(),
        "probe": asdict(facts.probe),
    }


def print_table(rows: list[Row], facts: Facts) -> None:
    from rich.console import Console
    from rich.table import Table

    colors = {"fail": "bold red", "warn": "yellow", "ok": "green", "info": "dim"}
    title = f"toolkit doctor{' ' + facts.line.name if facts.line else ''}"
    table = Table(title=title)
    for column in ("status", "check", "value", "fix"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(f"[{colors[row.status]}]{row.status}[/]", row.check, row.value, row.fix)
    console = Console()
    console.print(table)
    counts = {s: sum(r.status == s for r in rows) for s in ("fail", "warn")}
    console.print(
        f"{counts['fail']} failing, {counts['warn']} warning{'' if counts['warn'] == 1 else 's'}: "
        f"{'something would break a build or a run' if counts['fail'] else 'all is well'}"
    )


def doctor_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    with Console(stderr=True).status("probing the toolchain and the environment's python"):
        facts = gather(args)
    rows = evaluate(facts)
    if args.json:
        print(json.dumps(report(facts, rows), indent=2))
    else:
        print_table(rows, facts)
    return 0 if not any(r.status == "fail" for r in rows) else 1

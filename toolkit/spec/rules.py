"""Compatibility rules: each one a small generic check over the knowledge data.

A rule reads facts from toolkit/knowledge/*.yaml (never hard-codes them) and returns the
problem and its fix as one sentence, or None. `toolkit check` runs every rule on every spec.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from toolkit.base.arguments import add_lines
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace, add_workspace_options
from toolkit.knowledge.facts import Knowledge, load_knowledge, minor_of
from toolkit.knowledge.nvcc_gcc import gcc_cap, lines_accepting
from toolkit.spec import fa2, fa3, fa4, patches
from toolkit.spec.check import Check
from toolkit.spec.envspec import EnvSpec, Location, load_spec, resolve_spec_arg, spec_paths


@dataclass(frozen=True)
class Violation:
    spec: Path
    field: str
    location: Location
    message: str

    def __str__(self) -> str:
        here = display_path(self.spec)
        if self.location.file.resolve() == self.spec.resolve():
            return f"{self.location}: {self.field}: {self.message}"
        return f"{here}: {self.field}: {self.message} [set in {self.location}]"


@dataclass(frozen=True)
class Rule:
    name: str
    field: str
    check: Callable[[EnvSpec, Knowledge], str | None]


def span(items: list[str]) -> str:
    """['2.0', '2.1', '2.2'] -> '2.0-2.2'; the knowledge lists are ordered, so first-last reads right."""
    if not items:
        return "none"
    return items[0] if len(items) == 1 else f"{items[0]}-{items[-1]}"


# ---------------------------------------------------------------- the rules


def cuda_line_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.cuda in kb.cuda_lines:
        return None
    return f"CUDA {spec.cuda} is not a known CUDA line (known: {', '.join(kb.cuda_lines)})"


def line_name_matches_cuda(spec: EnvSpec, kb: Knowledge) -> str | None:
    match = re.fullmatch(r"cu(\d+)", spec.line)
    if not match or spec.cuda not in kb.cuda_lines:
        return None
    tag = kb.cuda_lines[spec.cuda].tag
    return (
        None
        if tag == spec.line
        else f"file {spec.line}.yaml says CUDA {spec.cuda} ({tag}): rename it or fix cuda"
    )


def torch_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    minor = minor_of(spec.torch_version)
    if minor in kb.torch_releases:
        return None
    return (
        f"torch {minor} is not in the compatibility data (known: {span(list(kb.torch_releases))}); "
        f"add it with its source to toolkit/knowledge/torch_releases.yaml"
    )


def torch_has_build(spec: EnvSpec, kb: Knowledge) -> str | None:
    line = kb.cuda_lines.get(spec.cuda)
    release = kb.torch_releases.get(minor_of(spec.torch_version))
    if not line or not release or spec.cuda in release.cuda:
        return None
    return (
        f"torch {spec.torch_version} has no {line.tag} build "
        f"({line.tag} builds: torch {span(kb.torch_lines(spec.cuda))})"
    )


def _other_build(torch: str | None, spec: EnvSpec, kb: Knowledge) -> str | None:
    """A torch version whose local tag names another build than the line's (+cu128 on cu126, +cpu, +rocm6.2)."""
    local = Version(torch).local if torch else None
    line = kb.cuda_lines.get(spec.cuda)
    if not local or not line or local == line.tag:
        return None
    return (
        f"torch {torch} is a {local} build but the line is {line.tag} (use +{line.tag} or no tag)"
    )


def torch_local_tag(spec: EnvSpec, kb: Knowledge) -> str | None:
    return _other_build(spec.torch_version, spec, kb)


def external_torch_is_line_build(spec: EnvSpec, kb: Knowledge) -> str | None:
    """An external toolchain's torch of another build (+cpu cannot compile flash-attn) is refused by `check`,
    not first by the build's preflight."""
    return (
        _other_build(spec.toolchain.torch, spec, kb) if spec.toolchain.kind == "external" else None
    )


def torch_index_matches(spec: EnvSpec, kb: Knowledge) -> str | None:
    line = kb.cuda_lines.get(spec.cuda)
    served = re.search(r"/whl/(cu\d+)/?$", spec.torch_index)
    if (
        not line or not line.torch_index or not served or served.group(1) == line.tag
    ):  # none: torch-has-build says
        return None
    return (
        f"index serves {served.group(1)} wheels but the line is {line.tag} (use {line.torch_index})"
    )


def channels_provide_toolchain(spec: EnvSpec, kb: Knowledge) -> str | None:
    line = kb.cuda_lines.get(spec.cuda)
    if not line or spec.toolchain.kind != "locked":
        return None
    # A mirror (URL or path) counts when it ends with the channel's name: https://mirror/nvidia/label/...
    missing = [
        c
        for c in line.conda_channels
        if c != "conda-forge"
        and not any(ch == c or ch.rstrip("/").endswith("/" + c) for ch in spec.channels)
    ]
    if not missing:
        return None
    return (
        f"CUDA {spec.cuda}'s nvcc comes from {', '.join(missing)}, which channels lack "
        f"(use channels: [{', '.join(line.conda_channels)}], or a mirror of them)"
    )


def python_has_torch_wheel(spec: EnvSpec, kb: Knowledge) -> str | None:
    release = kb.torch_releases.get(minor_of(spec.torch_version))
    if not release or spec.python in release.python:
        return None
    return (
        f"torch {release.minor} has no wheel for python {spec.python} "
        f"(torch {release.minor} wheels: python {span(list(release.python))})"
    )


def gcc_within_nvcc(spec: EnvSpec, kb: Knowledge) -> str | None:
    cap = gcc_cap(spec.cuda, kb)
    if not cap or cap.accepts(int(spec.gcc)):
        return None
    newer = [
        v
        for v in lines_accepting(int(spec.gcc), kb)
        if spec.toolchain.kind != "locked" or conda_allows(kb, v, int(spec.gcc))
    ]
    alternative = f" or CUDA {newer[0]}+" if newer else ""
    return (
        f"gcc {spec.gcc} is newer than nvcc {spec.cuda} accepts "
        f"(max gcc {cap.max_gcc}: use gcc <= {cap.max_gcc}{alternative})"
    )


def conda_allows(kb: Knowledge, cuda: str, gcc: int) -> bool:
    """True unless the line's nvcc packages are known and none of their builds admits this gcc."""
    packaging = kb.nvcc_packaging.get(cuda)
    return not packaging or not packaging.builds or packaging.allowed_gcc(gcc)


def gcc_allowed_by_conda_nvcc(spec: EnvSpec, kb: Knowledge) -> str | None:
    """conda-forge's cuda-nvcc-impl constrains gcc_impl more tightly than nvcc does: the lock cannot solve.
    Silent where nvcc itself refuses the gcc (gcc-accepted-by-nvcc says so)."""
    cap = gcc_cap(spec.cuda, kb)
    gcc = int(spec.gcc)
    if (
        spec.toolchain.kind != "locked"
        or not cap
        or not cap.accepts(gcc)
        or conda_allows(kb, spec.cuda, gcc)
    ):
        return None
    packaging = kb.nvcc_packaging[spec.cuda]
    allowed = [g for g in range(gcc - 1, 0, -1) if packaging.allowed_gcc(g)]
    newer = [v for v, p in kb.nvcc_packaging.items() if v in kb.cuda_lines and p.allowed_gcc(gcc)]
    versions = ", ".join(dict.fromkeys(b.version for b in packaging.builds))
    bounds = " / ".join(dict.fromkeys(b.gcc for b in packaging.builds))
    fix = f"use gcc {allowed[0]}" if allowed else "no gcc fits"
    return (
        f"gcc {spec.gcc} cannot be installed beside {packaging.channel}'s nvcc {spec.cuda}: every "
        f"cuda-nvcc-impl build ({versions}) has run_constrained gcc_impl {bounds} "
        f"({fix}{f', or CUDA {newer[0]}+ for gcc {gcc}' if newer else ''}; "
        f"see toolkit/knowledge/conda_forge_nvcc.yaml)"
    )


def archs_targetable(spec: EnvSpec, kb: Knowledge) -> str | None:
    line = kb.cuda_lines.get(spec.cuda)
    if not line:
        return None
    bad = [arch for arch in spec.archs if arch not in line.archs]
    if not bad:
        return None
    advice = []
    for arch in bad:
        newer = [v for v, other in kb.cuda_lines.items() if arch in other.archs]
        advice.append(
            f"sm_{arch} needs CUDA {newer[0]}+" if newer else f"sm_{arch} is unknown to every line"
        )
    return (
        f"nvcc {spec.cuda} cannot target {', '.join('sm_' + a for a in bad)} "
        f"({'; '.join(advice)}; {spec.cuda} targets sm_{line.archs[0]}-sm_{line.archs[-1]})"
    )


def _external_equal(
    spec_field: str, toolchain_field: str
) -> Callable[[EnvSpec, Knowledge], str | None]:
    """An external toolchain must provide exactly what the spec builds for."""

    def check(spec: EnvSpec, kb: Knowledge) -> str | None:
        if spec.toolchain.kind != "external":
            return None
        wanted = str(getattr(spec, spec_field))
        have = str(getattr(spec.toolchain, toolchain_field))
        if toolchain_field == "torch":
            have_cmp, wanted_cmp = Version(have).public, Version(wanted).public
        else:
            have_cmp, wanted_cmp = have, wanted
        if have_cmp == wanted_cmp:
            return None
        return (
            f"the external toolchain has {toolchain_field} {have} but the spec builds for "
            f"{spec_field.replace('_version', '')} {wanted} (make them equal)"
        )

    return check


def locked_has_no_external_fields(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.toolchain.kind == "external":
        return None
    extra = [
        k
        for k in ("cuda_home", "python_executable", "nvcc", "gcc", "python", "torch", "cxx11_abi")
        if getattr(spec.toolchain, k) is not None
    ]
    if not extra:
        return None
    return (
        f"{', '.join(extra)} only apply to kind: external (a {spec.toolchain.kind} toolchain comes from the "
        f"lock; remove them or set kind: external)"
    )


# ---------------------------------------------------------------- the `pypi` kind (knowledge/pypi_cuda.yaml)


def pypi_line_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    """Only a CUDA release whose nvcc, crt and nvvm wheels are on PyPI can be a pypi line; CUDA 12's cannot."""
    if spec.toolchain.kind != "pypi" or spec.cuda in kb.pypi.cudas:
        return None
    if spec.cuda.split(".")[0] == "12":
        return (
            f"CUDA {spec.cuda} has {kb.pypi.cuda_12} (use kind: locked, or a pypi line of CUDA "
            f"{span(kb.pypi.cudas)}; toolkit/knowledge/pypi_cuda.yaml)"
        )
    return (
        f"CUDA {spec.cuda} is not a pypi line (pypi lines: {', '.join(kb.pypi.cudas)}; "
        f"toolkit/knowledge/pypi_cuda.yaml)"
    )


def pypi_torch_pairs_with_cuda(spec: EnvSpec, kb: Knowledge) -> str | None:
    """torch's PyPI wheels pin one cuda-toolkit release: the line's torch must be one that pins a release of its CUDA."""
    releases = kb.pypi.releases(spec.cuda)
    if spec.toolchain.kind != "pypi" or not releases or kb.pypi.line(spec.cuda, spec.torch_version):
        return None
    release = kb.torch_releases.get(minor_of(spec.torch_version))
    built = (
        f"torch {release.minor}'s PyPI wheels are CUDA {release.pypi}; "
        if release and release.pypi
        else ""
    )
    pairs = [line.cuda for line in kb.pypi.lines.values() if line.pairs_with(spec.torch_version)]
    paired = [
        f"CUDA {line.cuda} with torch {line.torch[-1]}"
        for line in kb.pypi.lines.values()
        if line.torch
    ]
    advice = f"use CUDA {pairs[0]}" if pairs else f"pypi lines with a torch: {', '.join(paired)}"
    pinned = [line for line in releases if line.torch]
    if not pinned:
        toolkits = " or ".join(line.cuda_toolkit for line in releases)
        return (
            f"no torch on PyPI pins cuda-toolkit {toolkits} (CUDA {spec.cuda}), so torch "
            f"{spec.torch_version} cannot share its environment ({built}{advice}; toolkit/knowledge/pypi_cuda.yaml)"
        )
    by = "; ".join(
        f"cuda-toolkit {line.cuda_toolkit} is pinned by torch {', '.join(line.torch)}"
        for line in pinned
    )
    return (
        f"torch {spec.torch_version} does not pair with CUDA {spec.cuda} from PyPI ({built}CUDA {spec.cuda}'s "
        f"{by}: use torch {pinned[0].torch[-1]}; toolkit/knowledge/pypi_cuda.yaml)"
    )


def pypi_platforms_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    unknown = [p for p in spec.platforms if p not in kb.pypi.platforms]
    if spec.toolchain.kind != "pypi" or not unknown:
        return None
    return (
        f"{', '.join(unknown)}: the pypi lines' wheels were checked for {', '.join(kb.pypi.platforms)} only "
        f"(use platforms: [{', '.join(kb.pypi.platforms)}]; toolkit/knowledge/pypi_cuda.yaml)"
    )


def pypi_has_no_conda_layer(spec: EnvSpec, kb: Knowledge) -> str | None:
    """A pypi line installs wheels into a venv: conda packages and channels would be silently ignored."""
    if spec.toolchain.kind != "pypi" or not (spec.conda_packages or spec.channels):
        return None
    return (
        "a pypi toolchain has no conda layer: its python is the machine's and its CUDA comes from PyPI "
        "(set conda_packages: null and channels: null)"
    )


# The rules of each implementation's spec section, by implementation name: one module each (spec/fa2.py, ...),
# whose CHECKS are (name, field, check) in the order `toolkit check` reports them.
CHECKS: dict[str, tuple[Check, ...]] = {
    "flash-attn-2": fa2.CHECKS,
    "flash-attn-4": fa4.CHECKS,
    "flash-attn-3": fa3.CHECKS,
}

RULES: tuple[Rule, ...] = (
    Rule("cuda-line-known", "cuda", cuda_line_known),
    Rule("line-name-matches-cuda", "cuda", line_name_matches_cuda),
    Rule("torch-known", "torch.version", torch_known),
    Rule("torch-has-build-for-line", "torch.version", torch_has_build),
    Rule("torch-local-tag-matches-line", "torch.version", torch_local_tag),
    Rule("torch-index-serves-line", "torch.index", torch_index_matches),
    Rule("channels-provide-cuda-toolchain", "channels", channels_provide_toolchain),
    Rule("python-has-torch-wheel", "python", python_has_torch_wheel),
    Rule("gcc-accepted-by-nvcc", "gcc", gcc_within_nvcc),
    Rule("gcc-allowed-by-conda-nvcc", "gcc", gcc_allowed_by_conda_nvcc),
    Rule("archs-targetable-by-nvcc", "archs", archs_targetable),
    Rule("locked-toolchain-has-no-external-fields", "toolchain", locked_has_no_external_fields),
    Rule("external-nvcc-is-line", "toolchain.nvcc", _external_equal("cuda", "nvcc")),
    Rule("external-gcc-is-spec-gcc", "toolchain.gcc", _external_equal("gcc", "gcc")),
    Rule("external-python-is-spec-python", "toolchain.python", _external_equal("python", "python")),
    Rule(
        "external-torch-is-spec-torch", "toolchain.torch", _external_equal("torch_version", "torch")
    ),
    Rule("external-torch-is-line-build", "toolchain.torch", external_torch_is_line_build),
    Rule("pypi-line-known", "cuda", pypi_line_known),
    Rule("pypi-torch-pairs-with-cuda", "torch.version", pypi_torch_pairs_with_cuda),
    Rule("pypi-platforms-checked", "platforms", pypi_platforms_known),
    Rule("pypi-has-no-conda-layer", "conda_packages", pypi_has_no_conda_layer),
    # each implementation's own rules (CHECKS), facts in its knowledge/flash_attn_<n>.yaml
    *(Rule(name, field, check) for checks in CHECKS.values() for name, field, check in checks),
)


def violations(spec: EnvSpec, kb: Knowledge | None = None) -> list[Violation]:
    """Every rule's problem with a loaded spec. The rules may parse its versions, sm numbers and gcc as they
    like: load_spec let through only ASCII PEP 440 versions with major.minor, and ASCII digits."""
    kb = kb or load_knowledge()
    found = []
    for rule in RULES:
        message = rule.check(spec, kb)
        if message:
            found.append(Violation(spec.path, rule.field, spec.where(rule.field), message))
    return found


def checked_spec(path: Path) -> EnvSpec:
    """Load a spec and refuse it unless every rule passes: the gate every later stage goes through."""
    spec = load_spec(path)
    problems = violations(spec)
    if problems:
        more = (
            f" (+{len(problems) - 1} more: run `toolkit check {spec.line}`)"
            if len(problems) > 1
            else ""
        )
        raise ToolkitError(f"{problems[0]}{more}")
    return spec


def check_paths(paths: list[Path]) -> list[str]:
    """Every problem of every spec, one line each, in file order; duplicates (a broken base) once."""
    lines: list[str] = []
    for path in paths:
        try:
            spec = load_spec(path)
        except ToolkitError as exc:
            found = [str(exc)]
        else:
            found = [str(v) for v in violations(spec)]
        lines += [line for line in found if line not in lines]
    return lines


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        description="Validate env specs (all of envs/ by default): schema, inheritance and every "
        "compatibility rule. One line per problem; exit 1 if any.",
    )
    add_lines(parser)
    add_workspace_options(parser)
    parser.set_defaults(func=check_command)


def patch_notes(paths: list[Path]) -> list[str]:
    """One line per spec whose build applies our patches: what the build will change in the sdist, and why."""
    notes = []
    for path in paths:
        try:
            spec = load_spec(path)
            selected = patches.spec_plan(spec).patches
        except ToolkitError:
            continue  # already reported as a problem
        notes += [
            f"{display_path(path)}: patch: flash-attn {spec.flash_attn_version} gets toolkit/knowledge/patches/"
            f"{p.file.name} ({p.fixes}, torch {spec.torch_version}; written after {p.upstream})"
            for p in selected
        ]
    return notes


def check_command(args: argparse.Namespace) -> int:
    workspace = Workspace.from_args(args)
    paths = (
        [resolve_spec_arg(s, workspace) for s in args.lines]
        if args.lines
        else spec_paths(workspace.envs)
    )
    problems = check_paths(paths)
    for line in problems + patch_notes(paths):
        print(line)
    if not problems:
        print(f"{len(paths)} spec{'s' if len(paths) != 1 else ''} checked: no problems")
    return 1 if problems else 0

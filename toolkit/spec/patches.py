"""Source patches as data: which sdist needs which of our patches, and applying them before a build.

toolkit/knowledge/patches.yaml holds the facts (`needs`: an sdist range that cannot build under a condition;
`patches`: our patch files, each fixing one need for a version range); toolkit/knowledge/patches/*.patch are the files.
`toolkit check` refuses a line with a need no patch covers; the build applies the selected patches to the
unpacked sdist and records each (file, sha256) in the build record and its cache key.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from toolkit.base.children import run_tied
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.knowledge import files as knowledge_files
from toolkit.spec.envspec import EnvSpec

PATCH_DIR = Path(__file__).parents[1] / "knowledge" / "patches"
PATCHES_YAML = "patches.yaml"  # in toolkit/knowledge/


@dataclass(frozen=True)
class Condition:
    """Which sdist versions (of one package) under which torch versions."""

    package: str
    versions: SpecifierSet
    torch: SpecifierSet

    def matches(self, package: str, version: str, torch: str) -> bool:
        # the torch bound is on the release (2.14.1+cu130 is 2.14.1); sdist post releases count as the release
        return (
            package == self.package
            and self.versions.contains(Version(version), prereleases=True)
            and self.torch.contains(Version(Version(torch).public), prereleases=True)
        )


@dataclass(frozen=True)
class Need:
    id: str
    when: Condition
    why: str


@dataclass(frozen=True)
class Patch:
    file: Path
    fixes: str  # the Need.id it resolves
    when: Condition
    strip: int  # patch -p<strip> from the sdist's top directory
    upstream: str  # the upstream change it was written from
    sdists: dict[str, str]  # version -> sha256 of the published sdist the patch was checked against

    def record(self) -> PatchRecord:
        return PatchRecord(self.file.name, sha256_file(self.file), self.fixes, self.upstream)


@dataclass(frozen=True)
class PatchRecord:
    """What the build record and the cache key hold for one applied patch."""

    file: str
    sha256: str
    fixes: str
    upstream: str


@dataclass(frozen=True)
class AppliedPatch(PatchRecord):
    """What one build did with one selected patch: applied, or left out with the reason."""

    applied: bool
    why: str = ""


@dataclass(frozen=True)
class Plan:
    """The patches one (sdist, torch) pair gets, and the needs nothing covers (then the build cannot work)."""

    patches: tuple[Patch, ...]
    unmet: tuple[Need, ...]


def _condition(entry: dict) -> Condition:
    return Condition(
        entry["package"], SpecifierSet(entry["versions"]), SpecifierSet(entry.get("torch", ""))
    )


@cache
def catalog() -> tuple[tuple[Need, ...], tuple[Patch, ...]]:
    return knowledge_files.typed(PATCHES_YAML, _catalog)


def _catalog(data: dict) -> tuple[tuple[Need, ...], tuple[Patch, ...]]:
    needs = tuple(Need(n["id"], _condition(n), n["why"]) for n in data["needs"])
    patches = tuple(
        Patch(
            PATCH_DIR / p["file"],
            p["fixes"],
            _condition(p),
            int(p["strip"]),
            p["upstream"],
            dict(p["sdists"]),
        )
        for p in data["patches"]
    )
    return needs, patches


def plan(package: str, version: str, torch: str) -> Plan:
    """Every need this sdist has with this torch, each met by the first patch that fixes it for the version."""
    needs, patches = catalog()
    chosen: list[Patch] = []
    unmet: list[Need] = []
    for need in (n for n in needs if n.when.matches(package, version, torch)):
        fix = next(
            (p for p in patches if p.fixes == need.id and p.when.matches(package, version, torch)),
            None,
        )
        if fix is None:
            unmet.append(need)
        elif fix not in chosen:
            chosen.append(fix)
    return Plan(tuple(chosen), tuple(unmet))


def spec_plan(spec: EnvSpec) -> Plan:
    """The line's flash-attn 2.x patches; none where the line builds no FA2 (another implementation instead)."""
    if spec.flash_attn_2_left_out() is not None:
        return Plan((), ())
    return plan("flash-attn", spec.flash_attn_version, spec.torch_version)


def planned_records(spec: EnvSpec) -> list[dict]:
    """The patch records of a spec's build, for its cache key (known before the sdist is unpacked)."""
    return [asdict(p.record()) for p in spec_plan(spec).patches]


def key_inputs(spec: EnvSpec) -> dict:
    """What the patches add to a build's cache key: nothing for an unpatched line (its cached wheels stay valid)."""
    planned = planned_records(spec)
    return {"patches": planned} if planned else {}


def apply(src_dir: Path, spec: EnvSpec, sdist_sha256: str) -> list[AppliedPatch]:
    """Apply the spec's patches to the unpacked sdist; refuse in one line if one does not apply.

    Only to the published sdist each patch was checked against: other bytes under the same version (a test
    fixture, a rebuilt copy) are left alone and the record says so ("applied": false, with the reason)."""
    selected = spec_plan(spec)
    if selected.unmet:
        need = selected.unmet[0]
        raise ToolkitError(
            f"{display_path(spec.path)}: flash_attn_2.version: flash-attn {spec.flash_attn_version} with "
            f"torch {spec.torch_version} cannot build: {need.why} (no patch known; run "
            f"`toolkit check {spec.line}`)"
        )
    applied = []
    for patch in selected.patches:
        checked = patch.sdists.get(spec.flash_attn_version)
        if checked == sdist_sha256:
            _apply_one(src_dir, patch)
            applied.append(AppliedPatch(**asdict(patch.record()), applied=True))
        else:
            applied.append(
                AppliedPatch(
                    **asdict(patch.record()),
                    applied=False,
                    why=f"sdist sha256 {sdist_sha256} is not the published "
                    f"{spec.flash_attn_version} ({checked or 'none recorded'}) the patch "
                    f"was checked against",
                )
            )
    return applied


def _apply_one(src_dir: Path, patch: Patch) -> None:
    """A dry run first, so a patch that does not fit leaves the tree untouched."""
    if shutil.which("patch") is None:
        raise ToolkitError(
            "patch: not found on PATH (install GNU patch: apt install patch / conda install patch)"
        )
    base = [
        "patch",
        f"-p{patch.strip}",
        "--forward",
        "--batch",
        "--silent",
        "--no-backup-if-mismatch",
        "--reject-file=-",
        "-i",
        str(patch.file),
    ]
    for extra in (["--dry-run"], []):
        done = run_tied(base + extra, cwd=src_dir, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stdout + done.stderr).strip().splitlines()
            raise ToolkitError(
                f"{display_path(patch.file)}: does not apply to {src_dir.name} "
                f"({why[-1] if why else f'patch exit {done.returncode}'}; the sdist differs from the "
                f"one the patch was written for: fix toolkit/knowledge/patches.yaml)"
            )


def describe(spec: EnvSpec) -> str:
    """'flash-attn-2.8.3-cxx20.patch' or '-' for `toolkit check` / `toolkit matrix`."""
    return ", ".join(p.file.name for p in spec_plan(spec).patches) or "-"

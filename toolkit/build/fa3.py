"""FlashAttention-3 (Hopper) for `toolkit build`: hopper/ of a pinned commit, built by the shared build (builder.build).

Upstream ships FA3 only from git, so its source is two GitHub archives of commits: flash-attention's and, since
a GitHub archive holds no submodule, NVIDIA/cutlass's at the commit flash-attention's csrc/cutlass points to
(knowledge/flash_attn_3.yaml). Each is fetched into <cache>/flash-attn-3/<commit>/ (or found there: a machine
without network has them put there by hand), unpacked into the build folder and every path the build reads
(hopper/, README.md, cutlass's include/) checked against its git id; only those paths make up the tree that
setup.py builds, cutlass at csrc/cutlass. setup.py runs offline (FLASH_ATTENTION_OFFLINE_BUILD: no nvcc or
ptxas download), with the line's nvcc and the profile's FLASH_ATTENTION_DISABLE_* switches.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.base.digest import git_object_id, sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace
from toolkit.build.source import SourceTree, UnreadableArchive, extract_sdist
from toolkit.env.download import fetch_content_pinned
from toolkit.env.lockfile import LockedSdist
from toolkit.knowledge import fa3_pins
from toolkit.knowledge.object_costs import CostKey
from toolkit.spec.envspec import EnvSpec

CACHE_FOLDER = "flash-attn-3"
KNOWLEDGE = "toolkit/knowledge/flash_attn_3.yaml"
# The environment of every FA3 build on top of the profile's switches.
OFFLINE = {
    "FLASH_ATTENTION_OFFLINE_BUILD": "TRUE",  # else setup.py downloads nvcc 12.6 / ptxas 12.8 for some CUDA
}


def archive_path(cache: Path, archive: fa3_pins.Archive) -> Path:
    """Where an archive lies in the cache (and where to put it by hand on a machine without network)."""
    return Path(cache) / CACHE_FOLDER / archive.commit / archive.filename


def pin_problem(top: Path, archive: fa3_pins.Archive) -> str | None:
    """The first path the build reads that is missing or whose git id is not the pinned one, else None."""
    for inner, pinned in archive.pins.items():
        path = top / inner
        if not path.exists() and not path.is_symlink():
            return f"{inner} is missing (the knowledge pins it at {pinned})"
        actual = git_object_id(path)
        if actual != pinned:
            return f"{inner} has git id {actual}, {KNOWLEDGE} pins {pinned}"
    return None


def unpack_checked(path: Path, archive: fa3_pins.Archive, dest: Path) -> Path:
    """Unpack one archive into dest and check its pins; a file that fails (a truncated or non-gzip one
    included) is removed from the cache, so that the next run downloads it again."""
    fix = f"removed the archive; re-run to download {archive.url} again, or put that archive there"
    try:
        top, _ = extract_sdist(path, dest, f"an archive of {archive.name}", fix)
    except UnreadableArchive:
        path.unlink(missing_ok=True)
        raise
    problem = pin_problem(top, archive)
    if problem:
        path.unlink(missing_ok=True)
        raise ToolkitError(
            f"{display_path(path)}: not {archive.name} at {archive.commit[:12]}: {problem} ({fix})"
        )
    return top


def fetch_archive(archive: fa3_pins.Archive, cache: Path) -> Path:
    """The archive from the cache, downloaded first where absent; a download enters the cache only once
    what it unpacks to matches the pins."""
    entry = archive_path(cache, archive)

    def check(download: Path) -> None:
        with tempfile.TemporaryDirectory(dir=download.parent) as scratch:
            unpack_checked(download, archive, Path(scratch))

    return fetch_content_pinned(
        archive.url, entry, f"FlashAttention-3 {archive.name} archive", check
    )


def assemble(
    paths: list[Path], archives: tuple[fa3_pins.Archive, ...], build_dir: Path
) -> tuple[Path, int]:
    """The source tree setup.py builds, of the pinned paths only: (its root, the newest file time)."""
    root = build_dir / "flash-attention"
    epoch = 0
    for path, archive in zip(paths, archives):
        staging = build_dir / f"unpacked-{archive.name}"
        top = unpack_checked(path, archive, staging)
        epoch = max(epoch, _newest(path))
        for inner in archive.pins:
            target = root / archive.place / inner
            target.parent.mkdir(parents=True, exist_ok=True)
            (top / inner).rename(target)
        shutil.rmtree(staging)
    return root, epoch


def _newest(archive: Path) -> int:
    import tarfile

    with tarfile.open(archive) as tar:
        return int(max(m.mtime for m in tar.getmembers()))


def top_level_names(wheel: Path) -> set[str]:
    """The modules and packages a wheel installs at the top of site-packages (not its .dist-info)."""
    with zipfile.ZipFile(wheel) as zf:
        names = {n.split("/")[0] for n in zf.namelist()}
    return {n.split(".")[0] for n in names if not n.endswith((".dist-info", ".data"))}


def check_beside(wheel: Path, theirs: tuple[str, ...]) -> None:
    """The FA3 wheel installs none of FA2's top-level names, so the two live in one environment."""
    clash = top_level_names(wheel) & set(theirs)
    if clash:
        raise ToolkitError(
            f"{wheel.name}: installs {', '.join(sorted(clash))}, which flash-attn 2.x installs too "
            f"(set flash_attn_3.with_flash_attn_2: false, or build them into separate environments)"
        )


@dataclass
class Fa3Source:
    """hopper/ of a pinned commit with a profile's switches (builder.WheelSource)."""

    spec: EnvSpec
    commit: fa3_pins.Fa3Commit
    profile: fa3_pins.Profile
    paths: list[Path] = field(default_factory=list)
    label: str = "FlashAttention-3"

    @classmethod
    def of(cls, spec: EnvSpec, workspace: Workspace | None = None) -> Fa3Source:
        """The line's FA3 (builder.WHEEL_SOURCES: a line whose compiled_implementations name it; the source is
        fetched by its pinned commit, in no workspace folder)."""
        assert spec.flash_attn_3 is not None
        found = fa3_pins.commit(spec.flash_attn_3.commit)
        chosen = fa3_pins.profile(spec.flash_attn_3.profile)
        return cls(
            spec,
            found,
            chosen,
            label=f"FlashAttention-3 {found.version} at {found.commit[:12]} "
            f"(profile {chosen.name}, {found.objects.get(chosen.name, '?')} objects)",
        )

    def line_dir(self, workspace: Workspace) -> Path:
        return workspace.wheel_dir(self.spec.line, "flash-attn-3")

    def key_inputs(self) -> dict[str, Any]:
        return {
            "flash_attn_3": {
                "commit": self.commit.commit,
                "profile": self.profile.name,
                "switches": sorted(self.profile.switches),
                "archives": [
                    {"name": a.name, "commit": a.commit, "place": a.place, "pins": a.pins}
                    for a in self.commit.archives
                ],
            }
        }

    def threads_per_object(self, archs: tuple[str, ...]) -> int:
        return 1  # setup.py gives each *_sm90.cu one -gencode (sm_90a), whatever the line's archs

    def fetch(self, cache: Path) -> None:
        self.paths = [fetch_archive(archive, cache) for archive in self.commit.archives]

    def unpack(self, build_dir: Path, archs: tuple[str, ...]) -> SourceTree:
        root, epoch = assemble(self.paths, self.commit.archives, build_dir)
        main = self.commit.archives[0]
        section = {
            "commit": self.commit.commit,
            "version": self.commit.version,
            "profile": self.profile.name,
            "switches": list(self.profile.switches),
            "archives": [
                {
                    "name": a.name,
                    "url": a.url,
                    "filename": a.filename,
                    "sha256": sha256_file(p),
                    "commit": a.commit,
                    "place": a.place,
                    "pins": a.pins,
                }
                for a, p in zip(self.commit.archives, self.paths)
            ],
        }
        theirs = fa3_pins.fa2_top_level(self.spec.flash_attn_version) or ()
        return SourceTree(
            project_dir=root / "hopper",
            epoch=epoch,
            pin=LockedSdist(main.url, main.filename, sha256_file(self.paths[0])),
            wheel_archs=(f"{self.commit.required_arch}a", *(("80",) if self.profile.sm80 else ())),
            files={
                "spec": display_path(self.spec.path),
                "knowledge": KNOWLEDGE,
                **{a.name: display_path(p) for a, p in zip(self.commit.archives, self.paths)},
            },
            source_root=root,
            costs_key=CostKey("fa3", self.commit.commit, self.profile.name),
            # setup.py runs `git submodule update --init ../csrc/cutlass`: no repository above the build folder
            environment={
                **OFFLINE,
                **self.profile.environment(),
                "GIT_CEILING_DIRECTORIES": str(build_dir.parent),
            },
            imports=fa3_pins.installs()[1],
            record_section=section,
            check_wheel=lambda wheel: check_beside(wheel, theirs),
        )

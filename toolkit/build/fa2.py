"""flash-attn 2.x for `toolkit build`: the line's locked sdist, with the patches the line needs
(toolkit/spec/patches.py), built by the shared build (builder.build) behind source.WheelSource."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace
from toolkit.build import fa4_hooks
from toolkit.build.source import SourceTree, extract_sdist, settle_times
from toolkit.env.download import fetch_verified
from toolkit.env.lockfile import LockedEnv, LockedSdist, read_lock, stale_reason
from toolkit.knowledge.facts import arch_number
from toolkit.knowledge.object_costs import CostKey
from toolkit.spec import patches
from toolkit.spec.envspec import EnvSpec


def fetch_sdist(sdist: LockedSdist, cache: Path) -> Path:
    """The locked sdist from .cache/sdist/<sha256>/<filename>, downloading it only when absent
    (toolkit/env/download.py: the hash-verified cache that conda archives use too)."""
    return fetch_verified(sdist, Path(cache) / "sdist", f"flash-attn sdist {sdist.filename}")


def read_current_lock(spec: EnvSpec, lock_file: Path) -> LockedEnv:
    """The verified lock, refused when it no longer matches the spec."""
    try:
        locked = read_lock(lock_file)
    except ImportError as exc:  # the lock reader validates with conda-lock's own models
        raise ToolkitError(
            f"{display_path(lock_file)}: reading it needs the Python package {exc.name} "
            f"(pip install conda-lock into the toolkit's environment)"
        ) from None
    stale = stale_reason(spec, locked)
    if stale:
        raise ToolkitError(f"{display_path(lock_file)}: {stale}")
    return locked


def setup_py_archs(src_dir: Path) -> set[str] | None:
    """The archs a flash-attn setup.py knows (`if "90" in cuda_archs()`); None when it takes any.

    flash-attn 2.8.3 emits -gencode only for 80, 90, 100 and 120 and skips other requested archs
    without a word, so asking for 86 would cost a full build before the arch check noticed."""
    try:
        text = (src_dir / "setup.py").read_text(errors="replace")
    except OSError:
        return None
    known = set(re.findall(r"""["'](\d+[af]?)["']\s+in\s+cuda_archs\(\)""", text))
    return known or None


@dataclass
class Fa2Source:
    """flash-attn 2.x from the line's locked sdist, with the patches the line needs (toolkit/spec/patches.py)."""

    spec: EnvSpec
    lock_file: Path
    locked: LockedEnv | None = None
    sdist: Path | None = None
    label: str = "flash-attn"

    @classmethod
    def of(cls, spec: EnvSpec, workspace: Workspace) -> Fa2Source:
        return cls(spec, workspace.lock_file(spec.line))

    def line_dir(self, workspace: Workspace) -> Path:
        return workspace.wheel_dir(self.spec.line)

    def key_inputs(self) -> dict[str, Any]:
        """The lock's sha256 pins the sdist and the toolchain's packages; each patch the build applies is part
        of the key too. An external line's lock pins only the sdist, beside its spec's hash with the
        toolchain's paths in it, so its key takes the sdist's sha256: the same machine image at another
        site's paths finds the same published build (keyed_inputs holds the versions)."""
        if not self.lock_file.exists():
            raise ToolkitError(
                f"{display_path(self.lock_file)}: no lock file (run `toolkit lock {self.spec.line}` "
                f"first)"
            )
        if self.spec.toolchain.kind == "external":
            pin = {"sdist_sha256": read_current_lock(self.spec, self.lock_file).sdist.sha256}
        else:
            pin = {"lock_sha256": sha256_file(self.lock_file)}
        return {**pin, **patches.key_inputs(self.spec)}

    def threads_per_object(self, archs: tuple[str, ...]) -> int:
        return len(archs)  # flash-attn 2.x compiles every object for every arch

    def fetch(self, cache: Path) -> None:
        self.locked = read_current_lock(self.spec, self.lock_file)
        self.sdist = fetch_sdist(self.locked.sdist, cache)
        self.label = self.locked.sdist.filename

    def unpack(self, build_dir: Path, archs: tuple[str, ...]) -> SourceTree:
        assert self.locked is not None and self.sdist is not None  # fetch() came first
        src_dir, epoch = extract_sdist(self.sdist, build_dir)
        applied = patches.apply(
            src_dir, self.spec, self.locked.sdist.sha256
        )  # patches hook (patches.yaml)
        settle_times(
            src_dir, epoch
        )  # a resumed build's kept objects stay newer than every patched file
        known = setup_py_archs(src_dir)
        if known is not None and not set(archs) <= known:
            skipped = ", sm_".join(a for a in archs if a not in known)
            raise ToolkitError(
                f"{display_path(self.sdist)}: its setup.py compiles only "
                f"sm_{', sm_'.join(sorted(known, key=arch_number))} and would skip sm_{skipped} "
                f"silently (drop them from archs / --arch)"
            )
        return SourceTree(
            src_dir,
            epoch,
            self.locked.sdist,
            archs,
            {"spec": display_path(self.spec.path), "lock": display_path(self.lock_file)},
            source_root=src_dir,
            costs_key=CostKey("fa2", self.locked.sdist.sha256),
            patches=[asdict(p) for p in applied],
            after_install=fa4_hooks.restore_after_flash_attn_2(self.locked),
        )

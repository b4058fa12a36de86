"""FlashAttention-4's pins: which release, which exact wheels (name, version, sha256) per CUDA flavor, read
from knowledge/flash_attn_4.yaml; what every FA4 stage (lock, install, rules, verify, recommend) asks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.knowledge import files as knowledge_files

KNOWLEDGE_FILE = knowledge_files.KNOWLEDGE_DIR / "flash_attn_4.yaml"
DEFAULT_RELEASE = "4.0.0b40"
DSL_PACKAGES = Path("nvidia_cutlass_dsl") / "dsl_packages"  # where `cutlass` lives (knowledge: pth)


@dataclass(frozen=True)
class WheelPin:
    name: str
    version: str
    file: str
    sha256: str
    size: int
    cuda: str | None = None  # only for this CUDA major
    if_missing: bool = False  # only when the target python lacks the distribution
    replaces: str | None = (
        None  # the requirement this wheel satisfies instead (libs-cu12 -> libs-cu13)
    )


@dataclass(frozen=True)
class Release:
    version: str
    python: str
    min_arch: int
    archs: tuple[str, ...]
    cuda_majors: tuple[str, ...]
    torch: str
    wheels: tuple[WheelPin, ...]
    from_base: tuple[str, ...]
    platforms: tuple[str, ...] = ("linux-64",)  # the conda platforms the compiled pins are for

    @property
    def pinned_cuda_majors(self) -> tuple[str, ...]:
        """The CUDA majors whose libs flavor is pinned (a wheel limited to that major)."""
        return tuple(sorted({w.cuda for w in self.wheels if w.cuda and w.replaces}))

    def wheels_for(self, cuda_major: str) -> list[WheelPin]:
        """The wheels of this release for one CUDA major, in install order."""
        if cuda_major not in self.pinned_cuda_majors:
            raise ToolkitError(
                f"{KNOWLEDGE_FILE.name}: flash-attn-4 {self.version} has no CUDA {cuda_major} "
                f"flavor pinned (pinned: {', '.join(self.pinned_cuda_majors)}; use such a CUDA line "
                f"or pin the flavor)"
            )
        return [w for w in self.wheels if w.cuda in (None, cuda_major)]


@cache
def knowledge(path: Path = KNOWLEDGE_FILE) -> dict:
    return knowledge_files.read(path)


def _wheel_pin(entry: dict) -> WheelPin:
    """One `wheels:` entry; YAML reads versions like 13 or 4.8 as numbers, pins keep them as text."""
    return WheelPin(
        name=entry["name"],
        version=str(entry["version"]),
        file=entry["file"],
        sha256=entry["sha256"],
        size=int(entry["size"]),
        cuda=None if entry.get("cuda") is None else str(entry["cuda"]),
        if_missing=bool(entry.get("if_missing", False)),
        replaces=entry.get("replaces"),
    )


def release(version: str = DEFAULT_RELEASE, path: Path = KNOWLEDGE_FILE) -> Release:
    """The release's pins, every field checked by the knowledge reader (a missing one names the file)."""
    releases = knowledge(path)["releases"]
    if version not in releases:
        raise ToolkitError(
            f"{path.name}: flash-attn-4 {version} is not in the knowledge (known: {', '.join(releases)}; "
            f"add it with its wheels' sha256)"
        )
    return knowledge_files.typed(path, lambda data: _release(version, data["releases"][version]))


def _release(version: str, entry: dict) -> Release:
    return Release(
        version,
        entry["python"],
        int(entry["min_arch"]),
        tuple(entry["archs"]),
        tuple(entry["cuda_majors"]),
        entry["torch"],
        tuple(_wheel_pin(w) for w in entry["wheels"]),
        tuple(entry["from_base"]),
        tuple(entry["platforms"]),
    )


def wheel_fits_python(filename: str, python: str) -> bool:
    """Does a wheel's tag run on CPython `python` ("3.12")? cpXY exactly, py3, or abi3 from cpXY on."""
    from packaging.utils import parse_wheel_filename

    major, minor = (int(part) for part in python.split(".")[:2])
    for tag in parse_wheel_filename(filename)[3]:
        if tag.interpreter in ("py3", f"py{major}", f"cp{major}{minor}"):
            return True
        if (
            tag.abi == "abi3"
            and tag.interpreter.startswith(f"cp{major}")
            and int(tag.interpreter[3:] or 0) <= minor
        ):
            return True
    return False

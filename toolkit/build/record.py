"""The build record (`<wheel>.build.json`): the one reader and writer of what a build made and from what.

The build stage writes it beside the wheel; the wheel cache, the PEP 503 index, doctor, modules, matrix
runs and bench/build_efficiency.py read it. Every one of them goes through `BuildRecord`, so a field is
spelled once and a record of another shape is refused in one line instead of being half read. Validation
is pydantic's (types and required fields), over plain dataclasses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import BUILD_RECORD_SUFFIX, KERNEL_CACHE_RECORD_SUFFIX
from toolkit.env.lockfile import LockedSdist

RECORD_SCHEMA = 1
RECORD_SUFFIX = BUILD_RECORD_SUFFIX


@dataclass(frozen=True)
class ObjectTime:
    """One object of the compile, from ninja's log: when it started and how long it took."""

    name: str
    start_s: float
    seconds: float


@dataclass(frozen=True)
class BuildOutputs:
    wheel: str  # file name, beside the record
    version: str  # as the wheel's METADATA says, local tag included
    wheel_sha256: str
    wheel_size: int
    modules: list[str]  # extension modules found in the wheel
    archs_compiled: dict[str, list[str]]  # extension file -> sm archs read back from it
    imported: bool
    wall_s: float
    efficiency: dict[str, Any]  # build.efficiency(): figures for reports, not read back by the toolkit
    objects: list[ObjectTime] = field(default_factory=list)


@dataclass(frozen=True)
class BuildRecord:
    """What one successful build made (outputs) from what (inputs, keyed by inputs_key) and how."""

    inputs_key: str  # sha256 of the canonical JSON of `inputs`: the cache key
    inputs: dict[str, Any]  # line, archs, lock digest, toolchain, ...: hashed as they are
    files: dict[str, str]  # spec and lock, as display paths
    sdist: LockedSdist  # the lock's pin of the sdist the build compiled
    environment: dict[str, str]  # the variables the build ran with
    parallelism: dict[str, Any]
    outputs: BuildOutputs
    fingerprint: dict[str, Any]
    log: str
    started: str
    finished: str
    schedule: dict[str, Any] = field(default_factory=dict)  # object order; records before 2026-11-29 run 2 have none
    patches: list[dict[str, Any]] = field(default_factory=list)  # patches.AppliedPatch: file, sha256, applied
    neutralised_environment: dict[str, Any] = field(default_factory=dict)  # NVCC_*, CPPFLAGS of an activated env, removed
    # FlashAttention-3 builds: commit, profile, its DISABLE switches, each archive with its sha256 and git ids
    flash_attn_3: dict[str, Any] = field(default_factory=dict)
    # a wheel taken from a binary cache instead of compiled here: its table entry's URL (cache/substitute.py);
    # everything else is the publisher's record. Older records have none: compiled where they lie.
    substituted_from: str = ""
    # a build that continued an interrupted one: objects_kept from it, objects_compiled by this one, folder
    resumed: dict[str, Any] = field(default_factory=dict)
    status: str = "success"
    schema: int = RECORD_SCHEMA

    @property
    def archs(self) -> list[str]:
        return [str(arch) for arch in self.inputs.get("archs") or []]

    @property
    def toolchain(self) -> dict[str, Any]:
        return dict(self.inputs.get("toolchain") or {})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, where: str) -> BuildRecord:
        if isinstance(data, dict) and data.get("kind") == "fa4-kernel-cache":  # named so by `fa4 warm` before
            raise ToolkitError(f"{where}: a kernel cache's record (`toolkit fa4 warm`), not a build record (rename "
                               f"it to {where.removesuffix(RECORD_SUFFIX)}{KERNEL_CACHE_RECORD_SUFFIX})")
        if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
            raise ToolkitError(f"{where}: not a build record of schema {RECORD_SCHEMA} "
                               f"(delete it and rebuild with --force)")
        try:
            return _ADAPTER.validate_python(data)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(part) for part in first["loc"])
            raise ToolkitError(f"{where}: build record field {at}: {first['msg'].lower()} "
                               f"(delete it and rebuild with --force)") from None

    @classmethod
    def read(cls, path: Path) -> BuildRecord:
        data = read_json(path, "build record", "delete it and rebuild with --force")
        return cls.from_json(data, display_path(path))

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


_ADAPTER = pydantic.TypeAdapter(BuildRecord)

"""The build record (`<wheel>.build.json`): the one reader and writer of what a build made and from what.

The build stage writes it beside the wheel; the wheel cache, the PEP 503 index, doctor, modules, matrix
runs and bench/build_efficiency.py read it. Every one of them goes through `BuildRecord`, so a field is
spelled once and a record of another shape is refused in one line instead of being half read. Validation
is pydantic's (types and required fields), over plain dataclasses.

Schema 1 (every record so far, docs/results/ among them) types the inputs, parallelism, schedule and patches;
a record of a schema this toolkit does not know is refused in one line (a later schema adds its upgrade from
this one to `FORMAT`). The inputs are hashed into the binary cache's key as written, so reading refuses inputs
the typed model would not give back unchanged: typing never moves a key, and a record reads back as written.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from toolkit.base.digest import sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.typed import adapter
from toolkit.base.versioned import Format
from toolkit.base.workspace import BUILD_RECORD_SUFFIX, KERNEL_CACHE_RECORD_SUFFIX
from toolkit.env.lockfile import LockedSdist
from toolkit.spec.patches import AppliedPatch, PatchRecord

RECORD_SCHEMA = 1
RECORD_SUFFIX = BUILD_RECORD_SUFFIX
REBUILD = "delete it and rebuild with --force: `toolkit build LINE --force`"
EXACT = pydantic.ConfigDict(
    extra="forbid"
)  # the inputs are hashed: a key the model would drop is refused


PATH_FREE_RECIPE = 3  # builder.RECIPE_VERSION from which a key holds no file path (Toolchain)


@dataclass(frozen=True)
class Toolchain:
    """The toolchain the wheel was compiled with, as the cache key holds it (builder.keyed_inputs): versions and the
    compiler's file name. Keys of recipes before PATH_FREE_RECIPE also held cuda_home and python as absolute paths
    (and cxx as one), so the same toolchain in another checkout missed the cache; their records still read."""

    __pydantic_config__ = EXACT
    kind: str
    nvcc: str | None
    cxx: str | None
    gcc: str | None
    python_version: str | None
    torch: str | None
    torch_cuda: str | None
    cxx11_abi: bool | None
    ninja: str | None
    cuda_home: str | None = None  # recipes before PATH_FREE_RECIPE only
    python: str | None = None  # recipes before PATH_FREE_RECIPE only


@dataclass(frozen=True)
class Fa3Archive:
    """One of FlashAttention-3's pinned archives, as its build's key holds it (by git ids, not the file's sha256)."""

    __pydantic_config__ = EXACT
    name: str
    commit: str
    place: str
    pins: dict[str, str]  # path inside the archive -> git object id


@dataclass(frozen=True)
class Fa3Inputs:
    __pydantic_config__ = EXACT
    commit: str
    profile: str
    switches: list[str]
    archives: list[Fa3Archive]


@dataclass(frozen=True)
class BuildInputs:
    """What the wheel's bytes follow from: hashed as `to_json()` gives it into the binary cache's inputs key."""

    __pydantic_config__ = EXACT
    recipe: int
    line: str
    spec_input_hash: str
    toolchain: Toolchain
    archs: list[str]
    local_version: str
    lock_sha256: str | None = (
        None  # the lock that pins an FA2 sdist (FA3's sources are pinned by flash_attn_3)
    )
    sdist_sha256: str | None = (
        None  # an external line's FA2 sdist, in place of its lock (fa2.Fa2Source)
    )
    patches: list[PatchRecord] | None = (
        None  # only a patched sdist has them: an unpatched line's key stays as it was
    )
    flash_attn_3: Fa3Inputs | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildInputs:
        """The builder's inputs, typed (pydantic.ValidationError on another shape)."""
        return adapter(cls).validate_python(data)

    def to_json(self) -> dict[str, Any]:
        """As written: the optional sections only where the build had them (absent, not null, in the key)."""
        data = asdict(self)
        if self.recipe >= PATH_FREE_RECIPE:
            data["toolchain"] = {
                name: value
                for name, value in data["toolchain"].items()
                if name not in ("cuda_home", "python")
            }
        return {
            name: value
            for name, value in data.items()
            if value is not None
            or name not in ("lock_sha256", "sdist_sha256", "patches", "flash_attn_3")
        }


@dataclass(frozen=True)
class Parallelism:
    jobs: int  # ninja -j (MAX_JOBS)
    nvcc_threads: int  # threads inside one nvcc, one per -gencode target (NVCC_THREADS)
    cpus: int
    mem_gb: float  # the memory the build is sized against
    gb_per_nvcc_thread: float
    basis: str  # how the numbers were chosen, for the log and the record


class Schedule(pydantic.BaseModel):
    """Which order the build started its objects in (timing.Order) and what the ninja shim did to build.ninja
    (ninja_shim.manifest_outcome; None where it never ran). Written as set: the records of the first builds hold
    a part of it (none before 2026-11-29's second run; `seeded` and `from_record` in the next two)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    order: str | None = None  # "record", "knowledge" or "build.ninja"
    from_record: str | None = None
    from_knowledge: str | None = None
    nvcc_objects_seeded: int | None = None
    edges_ordered: int | None = None
    objects_without_cost: int | None = None
    seeded: bool | None = None  # the first seeded builds' word for order "record"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


@dataclass(frozen=True)
class ObjectTime:
    """One object of the compile, from ninja's log: when it started and how long it took."""

    name: str
    start_s: float
    seconds: float


@dataclass(frozen=True)
class CompileCacheUse:
    """What the compile cache did for one build (build/compile_cache.py): sccache's counts, by its stage names
    (CUDA, CUDA (Device code), PTX, CUBIN, C/C++: one nvcc object is several cached compiles)."""

    tool: str  # "sccache 0.16.0"
    location: str  # its storage, as configured
    requests: int  # compiles sent to it: one per object
    hits: dict[str, int]
    misses: dict[str, int]
    not_cached: (
        int  # compiles it ran without caching (a step it does not cache, an unsupported call)
    )
    errors: int  # cache read/write errors and failed compiles

    def hit_rate(self, stages: tuple[str, ...] | None = None) -> float | None:
        """Hits over hits and misses, of the given stages (None: all); None where there were none."""
        hits = sum(n for s, n in self.hits.items() if stages is None or s in stages)
        misses = sum(n for s, n in self.misses.items() if stages is None or s in stages)
        return hits / (hits + misses) if hits + misses else None


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
    efficiency: dict[
        str, Any
    ]  # build.efficiency(): figures for reports, not read back by the toolkit
    objects: list[ObjectTime] = field(default_factory=list)


@dataclass(frozen=True)
class BuildRecord:
    """What one successful build made (outputs) from what (inputs, keyed by inputs_key) and how."""

    inputs_key: str  # sha256 of the canonical JSON of `inputs`: the cache key
    inputs: BuildInputs  # line, archs, lock digest, toolchain, ...: hashed as they are
    files: dict[str, str]  # spec and lock, as display paths
    sdist: LockedSdist  # the lock's pin of the sdist the build compiled
    environment: dict[str, str]  # the variables the build ran with
    parallelism: Parallelism
    outputs: BuildOutputs
    # machine.fingerprint.Fingerprint as JSON, kept as written: doctor reads it leniently (from_dict), so that a
    # hand-edited one is its record-toolchain row rather than a refused record
    fingerprint: dict[str, Any]
    log: str
    started: str
    finished: str
    schedule: Schedule = field(default_factory=Schedule)  # object order
    patches: list[AppliedPatch] = field(
        default_factory=list
    )  # what the build did with each selected patch
    neutralised_environment: dict[str, Any] = field(
        default_factory=dict
    )  # NVCC_*, CPPFLAGS of an activated env, removed
    # FlashAttention-3 builds: commit, profile, its DISABLE switches, each archive with its sha256 and git ids
    flash_attn_3: dict[str, Any] = field(default_factory=dict)
    # a wheel taken from a binary cache instead of compiled here: its table entry's URL (cache/substitute.py);
    # everything else is the publisher's record. Older records have none: compiled where they lie.
    substituted_from: str = ""
    # a build that continued an interrupted one: objects_kept from it, objects_compiled by this one, folder
    resumed: dict[str, Any] = field(default_factory=dict)
    # the compile cache's hits and misses in this build; None: compiled without it (or before it existed)
    compile_cache: CompileCacheUse | None = None
    status: str = "success"
    schema: int = RECORD_SCHEMA

    @property
    def archs(self) -> list[str]:
        return list(self.inputs.archs)

    @property
    def toolchain(self) -> Toolchain:
        return self.inputs.toolchain

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "inputs": self.inputs.to_json(),
            "schedule": self.schedule.to_json(),
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> BuildRecord:
        if (
            isinstance(data, dict) and data.get("kind") == "fa4-kernel-cache"
        ):  # named so by `fa4 warm` before
            raise ToolkitError(
                f"{where}: a kernel cache's record (`toolkit fa4 warm`), not a build record (rename "
                f"it to {where.removesuffix(RECORD_SUFFIX)}{KERNEL_CACHE_RECORD_SUFFIX})"
            )
        try:
            current = FORMAT.current(data)
        except ValueError as exc:
            raise ToolkitError(f"{where}: {exc} ({REBUILD})") from None
        try:
            record = adapter(BuildRecord).validate_python(current)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(part) for part in first["loc"])
            raise ToolkitError(
                f"{where}: build record field {at}: {first['msg'].lower()} ({REBUILD})"
            ) from None
        if sha256_json(record.inputs.to_json()) != sha256_json(current["inputs"]):
            raise ToolkitError(
                f"{where}: build record field inputs: not as `toolkit build` writes them ({REBUILD})"
            )
        return record

    @classmethod
    def read(cls, path: Path) -> BuildRecord:
        data = read_json(path, "build record", "delete it and rebuild with --force")
        return cls.from_json(data, display_path(path))

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


FORMAT = Format("build record", RECORD_SCHEMA)

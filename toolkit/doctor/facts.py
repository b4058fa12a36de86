"""What `toolkit doctor` gathers before it judges: the environment's own python asked once, the line's files.

The toolchain fingerprint (fingerprint.py) says what the tools are; this adds what only the environment's
python can say (package versions, the flash_attn import and its extension's archs, whether torch sees a GPU),
the conda prefix's packages and the line's lock and newest build record, each tolerated absent. A recorded
`toolkit doctor --json` report is read back here, so another machine's situation replays.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from toolkit.attention.recommend import Recommendation, read_if_any
from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace
from toolkit.build.record import BuildRecord
from toolkit.cache.config import CacheSite
from toolkit.cache.installed import InstalledBuild, identify
from toolkit.cache.kernel_cache import InstalledKernelCache, identify_kernel_cache
from toolkit.env.install_record import PrefixRecord
from toolkit.env.lockfile import LockedPackage
from toolkit.fa4.jit import CACHE_DIR_ENV
from toolkit.knowledge.facts import arch_number
from toolkit.knowledge.nvcc_gcc import host_config_cap
from toolkit.machine import line_env
from toolkit.machine.fingerprint import Fingerprint, from_dict
from toolkit.machine.line_env import LineEnvironment
from toolkit.spec.envspec import EnvSpec, resolve_spec_arg

PROBE_TIMEOUT_S = 120  # importing flash_attn imports torch: seconds, more on a network filesystem
CONDA_PLATFORMS = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}

# Distributions whose versions the checks read (the lock's pip packages are added per line).
PROBED_PACKAGES = ("torch", "flash-attn", "flash-attn-3", "flash-attn-4", "transformers", "verl")

# Runs in the environment's own python (not the toolkit's): versions of the named distributions, the
# flash_attn import and, only where torch could see a GPU, torch.cuda.is_available(). Prints JSON last.
PROBE_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, sys
out = {"python_packages": {}, "flash_attn": None, "cuda_available": None}
for name in sys.argv[2:]:
    try:
        out["python_packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        pass
if importlib.util.find_spec("flash_attn") is not None:
    fa = {"version": None, "extension": None, "import_error": None}
    try:
        spec = importlib.util.find_spec("flash_attn_2_cuda")
        fa["extension"] = spec.origin if spec else None
    except (ImportError, ValueError):
        pass
    try:
        import flash_attn
        fa["version"] = getattr(flash_attn, "__version__", None)
    except Exception as exc:
        fa["import_error"] = f"{type(exc).__name__}: {exc}"
    out["flash_attn"] = fa
out["dist_info"] = {}
for name in ("flash-attn", "flash-attn-3"):  # where their RECORDs lie: doctor hashes the files they list
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    record = [f for f in dist.files or () if f.name == "RECORD" and f.parent.name.endswith(".dist-info")]
    if record:
        out["dist_info"][name] = str(dist.locate_file(record[0]).parent)
if sys.argv[1] == "1" or "torch" in sys.modules:
    try:
        import torch
        out["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:
        out["cuda_available"] = False
print("\n" + json.dumps(out))
"""


@dataclass(frozen=True)
class FlashAttnProbe:
    version: str | None  # flash_attn.__version__ (None when the import failed)
    extension: str | None  # path of flash_attn_2_cuda*.so
    import_error: str | None  # "ImportError: ...undefined symbol: _ZN3c10..."
    cubins: tuple[str, ...] | None = (
        None  # sm archs with machine code in the extension (None: unread)
    )
    ptx: tuple[str, ...] | None = None  # archs with PTX the driver can JIT-compile
    archs_error: str | None = None


@dataclass(frozen=True)
class Probe:
    """What the environment says beyond the fingerprint: read once, recorded in --json, replayable."""

    cuda_home_from: str  # where CUDA_HOME came from: --prefix, the spec, CUDA_HOME, nvcc on PATH
    python_packages: dict[str, str] = field(default_factory=dict)  # probed distribution -> version
    cuda_available: bool | None = (
        None  # torch.cuda.is_available(), False for CPU torch or no driver
    )
    flash_attn: FlashAttnProbe | None = None
    nvcc_max_gcc: int | None = None  # from nvcc's crt/host_config.h
    conda_packages: dict[str, str] | None = (
        None  # name -> "version=build" of the conda prefix, if any
    )
    error: str | None = None  # the probe itself failed (timeout, broken python)
    env_missing: str | None = (
        None  # the locked line's prefix, not installed: its toolchain was not probed
    )
    dist_info: dict[str, str] = field(
        default_factory=dict
    )  # flash-attn / flash-attn-3 -> its .dist-info folder
    installed_builds: tuple[
        InstalledBuild, ...
    ] = ()  # each one's published build, where caches are configured
    installed_builds_error: str | None = None  # the caches could not be asked (one line)
    fa4_kernel_cache: InstalledKernelCache | None = (
        None  # the FA4 kernel cache in use, where caches are configured
    )

    @staticmethod
    def from_dict(data: dict) -> Probe:
        data = dict(data)
        fa = data.get("flash_attn")
        if fa:
            fa = {**fa, "cubins": _tuple(fa.get("cubins")), "ptx": _tuple(fa.get("ptx"))}
        data["flash_attn"] = FlashAttnProbe(**fa) if fa else None
        data["installed_builds"] = tuple(
            InstalledBuild(**build) for build in data.get("installed_builds") or ()
        )
        kernel_cache = data.get("fa4_kernel_cache")
        data["fa4_kernel_cache"] = InstalledKernelCache(**kernel_cache) if kernel_cache else None
        return Probe(**data)


def _tuple(items: list | None) -> tuple | None:
    return None if items is None else tuple(items)


@dataclass(frozen=True)
class LineFacts:
    """A line's spec and whatever its later stages left on disk (lock, env, build record)."""

    name: str
    spec: EnvSpec | None
    spec_error: str | None
    lock_file: Path
    lock_problem: str | None  # unreadable / stale lock; None when fine or absent
    locked: tuple[LockedPackage, ...] | None  # None: no lock
    env_prefix: Path | None  # the conda prefix a locked line installs into
    wheel_dir: Path  # wheelhouse/<line>: built wheels and their build records
    record: BuildRecord | None  # the newest build record
    record_error: str | None
    install_record: PrefixRecord | None = (
        None  # what `toolkit install` recorded in the line's prefix
    )
    lock_digest: str | None = None  # the lock file's own digest, to compare with the record's
    recommendation: Recommendation | None = (
        None  # reports/<line>/recommendation.json (toolkit recommend)
    )
    recommendation_error: str | None = None


def _conda_packages(prefix: Path | None) -> dict[str, str] | None:
    meta = prefix / "conda-meta" if prefix else None
    if meta is None or not meta.is_dir():
        return None
    packages = {}
    for record in sorted(meta.glob("*.json")):
        data = read_json(record, "conda package record", "re-install the env")
        try:
            packages[data["name"]] = f"{data['version']}={data['build']}"
        except (KeyError, TypeError) as exc:
            raise ToolkitError(
                f"{record}: unreadable conda package record ({exc.__class__.__name__}; "
                f"re-install the env)"
            ) from None
    return packages


def _extension_archs(extension: str | None) -> dict:
    if not extension:
        return {}
    from toolkit.knowledge.archs import (
        fatbin_entries,
    )  # reads the .so's .nv_fatbin section, no cuobjdump needed

    try:
        entries = fatbin_entries(Path(extension))
    except ToolkitError as exc:
        return {"archs_error": str(exc)}
    return {
        name: tuple(sorted({e.arch for e in entries if e.kind == kind}, key=arch_number))
        for name, kind in (("cubins", "elf"), ("ptx", "ptx"))
    }


def probe_environment(fp: Fingerprint, env: LineEnvironment, packages: tuple[str, ...]) -> Probe:
    """One run of the environment's python: package versions, the flash_attn import, CUDA usability."""
    facts = Probe(
        cuda_home_from=env.source,
        nvcc_max_gcc=host_config_cap(fp.host_config_h),
        conda_packages=None if env.missing else _conda_packages(env.root),
        env_missing=display_path(env.root) if env.missing and env.root else None,
    )
    if not fp.python_version or not fp.python_path:
        return facts
    could_see_gpu = bool(fp.torch and fp.torch.cuda and fp.driver_version)
    try:
        done = run_tied(
            [fp.python_path, "-c", PROBE_SCRIPT, "1" if could_see_gpu else "0", *packages],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return replace(facts, error=f"timed out after {PROBE_TIMEOUT_S} s")
    except OSError as exc:
        return replace(facts, error=str(exc))
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (
        ValueError,
        IndexError,
    ):  # it crashed (a segfault in an extension's import, a broken site-packages)
        return replace(
            facts,
            error=first_line(
                done.stderr.strip().splitlines()[-1]
                if done.stderr.strip()
                else f"exit status {done.returncode}"
            ),
        )
    fa = found["flash_attn"]
    flash_attn = (
        FlashAttnProbe(**fa, **_extension_archs(fa["extension"])) if fa is not None else None
    )
    cuda = (
        found["cuda_available"]
        if found["cuda_available"] is not None
        else (False if fp.torch else None)
    )
    return replace(
        facts,
        python_packages=found["python_packages"],
        cuda_available=cuda,
        flash_attn=flash_attn,
        dist_info=found.get("dist_info") or {},
    )


def published_builds(probe: Probe, caches: list[CacheSite], downloads: Path) -> Probe:
    """The probe with each installed flash-attn / FA3, and the FA4 kernel cache in use, named against the
    configured caches (none: unchanged)."""
    if not caches:
        return probe
    probe = replace(probe, fa4_kernel_cache=published_kernel_cache(caches, downloads))
    if not probe.dist_info:
        return probe
    try:
        found = tuple(
            identify(Path(path), caches, downloads) for _, path in sorted(probe.dist_info.items())
        )
    except ToolkitError as exc:
        return replace(probe, installed_builds_error=str(exc))
    return replace(probe, installed_builds=found)


def published_kernel_cache(caches: list[CacheSite], downloads: Path) -> InstalledKernelCache | None:
    """The FA4 kernel cache folder this shell points FA4 at ($FLASH_ATTENTION_CUTE_DSL_CACHE_DIR, what the
    environment's python reads), named against the caches; None where none is set."""
    folder = os.environ.get(CACHE_DIR_ENV)
    if not folder:
        return None
    if not Path(folder).is_dir():
        return InstalledKernelCache(folder, False, detail=f"${CACHE_DIR_ENV} names no folder")
    try:
        return identify_kernel_cache(Path(folder), caches, downloads)
    except ToolkitError as exc:
        return InstalledKernelCache(folder, False, detail=f"could not be told: {exc}")


def gather_line(
    name: str,
    spec: EnvSpec | None,
    spec_error: str | None,
    machine: str,
    workspace: Workspace = DEFAULT,
    prefix: Path | None = None,
) -> LineFacts:
    """The line's lock, env prefix (`prefix`, else the workspace's) and build record, each tolerated absent."""
    from toolkit.build.wheelhouse import records
    from toolkit.env.lockfile import read_lock, stale_reason

    lock_file, wheel_dir = workspace.lock_file(name), workspace.wheel_dir(name)
    lock_problem, locked, lock_digest = None, None, None
    if lock_file.exists():
        try:
            lock = read_lock(lock_file)
            lock_digest = lock.digest
            locked = tuple(lock.packages_for(CONDA_PLATFORMS.get(machine, "")))
            lock_problem = stale_reason(spec, lock) if spec else None
        except ToolkitError as exc:
            lock_problem = str(exc)
    record, record_error = None, None
    if wheel_dir.is_dir():
        try:
            found = records(wheel_dir)
            record = found[0][1] if found else None
        except ToolkitError as exc:
            record_error = str(exc)
    env = line_env.resolve(spec, prefix, workspace=workspace) if spec else None
    env_prefix, install_record = (env.root, env.install_record()) if env else (None, None)
    recommendation, recommendation_error = None, None
    try:
        recommendation = read_if_any(workspace.recommendation_file(name))
    except ToolkitError as exc:
        recommendation_error = str(exc)
    return LineFacts(
        name,
        spec,
        spec_error,
        lock_file,
        lock_problem,
        locked,
        env_prefix,
        wheel_dir,
        record,
        record_error,
        install_record,
        lock_digest,
        recommendation,
        recommendation_error,
    )


def load_line(name: str, workspace: Workspace) -> tuple[EnvSpec | None, str | None]:
    """The checked spec, or the first problem as text (a broken spec is a row, not an abort)."""
    from toolkit.spec.rules import checked_spec

    path = resolve_spec_arg(name, workspace)
    try:
        return checked_spec(path), None
    except ToolkitError as exc:
        return None, str(exc)


def read_report(path: Path) -> tuple[Fingerprint, Probe, str | None]:
    """A recorded `toolkit doctor --json` report: its fingerprint, probe and line."""
    data = read_json(path, "doctor report", "pass a report written by `toolkit doctor --json`")
    try:
        return from_dict(data["fingerprint"]), Probe.from_dict(data["probe"]), data.get("line")
    except (AttributeError, ValueError, KeyError, TypeError) as exc:
        raise ToolkitError(
            f"{path}: not a doctor report ({exc.__class__.__name__}: {first_line(str(exc), 80)}; "
            f"write one with `toolkit doctor --json > FILE`)"
        ) from None


def first_line(text: str, limit: int = 160) -> str:
    """The first line of an error or a traceback's tail, cut to fit a row."""
    first = text.strip().splitlines()[0] if text.strip() else text
    return first if len(first) <= limit else first[: limit - 3] + "..."

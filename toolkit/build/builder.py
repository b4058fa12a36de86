"""`toolkit build LINE`: a flash-attn wheel from its hash-pinned sdist, compiled by exactly the line's toolchain.

Flow: spec + lock -> toolchain (the locked conda prefix, or the machine's own for `external`) ->
fingerprint -> cache lookup (the wheelhouse, then each configured binary cache: docs/binary-cache.md) ->
preflight -> sdist (sha256-checked, cached) -> `pip wheel --no-build-isolation --no-deps` with every knob set
explicitly -> verify (local tag, compiled archs, install + import) -> wheel and record into wheelhouse/<line>/
atomically -> PEP 503 index.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from toolkit.base.arguments import add_arch, add_line, add_prefix
from toolkit.base.atomic import clean_stale, run_temporaries
from toolkit.base.children import kill_group, popen_tied
from toolkit.base.digest import sha256_file
from toolkit.base.entry import add_renamed_option
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options
from toolkit.build import compile_cache, fa2, fa3, fa4_hooks
from toolkit.build.build_dirs import (
    SCHEDULE,
    BuildFolder,
    compile_slot,
    keyed_build_folder,
    prune,
    put_back_slot,
)
from toolkit.build.diagnose import explain_file
from toolkit.build.estimate import (
    NINJA_STATUS,
    CompileProgress,
    ManifestObjects,
    Sizing,
    estimate_line,
    filled,
    in_cpu_seconds,
)
from toolkit.build.ninja_shim import (
    BUILD_DIR_ALIAS,
    MANIFEST_OBJECTS,
    ManifestPlan,
    install_ninja_shim,
    manifest_outcome,
    write_plan,
)
from toolkit.build.record import (
    BuildInputs,
    BuildOutputs,
    BuildRecord,
    CompileCacheUse,
    ObjectTime,
    Parallelism,
    Schedule,
)
from toolkit.build.slurm_steps import (
    Allocation,
    mounts_text,
    shared_filesystem_problem,
    srun_words,
    step_mem_mb,
    step_temp_dir,
)
from toolkit.build.source import SourceTree, WheelSource
from toolkit.build.timing import (
    ScheduleOrder,
    children_cpu_s,
    describe,
    efficiency,
    ninja_objects,
    order_record,
    schedule_order,
)
from toolkit.build.wheel_check import install_and_import, verify_wheel
from toolkit.build.wheelhouse import (
    CachedBuild,
    find_cached,
    inputs_key,
    place,
    place_substitute,
    record_path_for,
    records,
    write_index,
)
from toolkit.cache.config import CacheSite, configured_caches
from toolkit.cache.substitute import fetch_substitute
from toolkit.env.lock import missing_lock
from toolkit.knowledge.facts import minor_of
from toolkit.machine import line_env
from toolkit.machine.fingerprint import Fingerprint
from toolkit.machine.line_env import LineEnvironment
from toolkit.machine.preflight import preflight_input, run_preflight
from toolkit.spec.envspec import EnvSpec, resolve_spec_arg
from toolkit.spec.patches import AppliedPatch
from toolkit.spec.rules import checked_spec

# Bump when the build recipe (environment, flags) or the key's shape changes: cached wheels of the old recipe are
# rebuilt. 3: the key holds no file path (record.PATH_FREE_RECIPE, EnvSpec.build_input_hash).
RECIPE_VERSION = 3
# Variables of an activated conda env that would change the compile behind the toolkit's back. conda-forge's
# cuda-nvcc activate.sh exports NVCC_PREPEND_FLAGS="... -ccbin=${CXX}" and torch adds its own -ccbin: nvcc 13.0
# warns "incompatible redefinition for option 'compiler-bindir', the last value of this option was used" (so
# flag order picks the host compiler). Its gcc activation exports CPPFLAGS="-DNDEBUG -D_FORTIFY_SOURCE=2 -O2
# -isystem $PREFIX/include" (cuda-nvcc's adds -I $PREFIX/targets/<triple>/include), which distutils appends to
# every g++ command (CFLAGS, CXXFLAGS, LDFLAGS the build sets itself). The build removes (or overrides) them; the
# record keeps what it removed. A caller's NINJA_STATUS would change the [n/N] lines the progress bar reads.
NEUTRALISED_VARIABLES = (
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "CPPFLAGS",
    "NINJA_STATUS",
)
REFERENCE_CPUS = (
    32  # the estimate line also says how long the build takes on a machine of this many cores
)
PLAIN_STEP = 0.05  # without a terminal, a progress line every 5 % of the objects
ARCH_ARG = re.compile(r"\d{2,3}[af]?")


@dataclass(frozen=True)
class BuildOptions:
    workspace: Workspace = DEFAULT  # the lock it builds from, the wheelhouse it places the wheel in
    cache: Path | None = None  # None: the workspace's cache ($TOOLKIT_CACHE or .cache)
    prefix: Path | None = (
        None  # locked toolchain's conda prefix (default: the workspace's .envs/<line>)
    )
    arch: str | None = None  # "native", "80,90" or None (the spec's archs)
    jobs: int | None = None
    nvcc_threads: int | None = None
    mem_gb: float | None = None
    force: bool = False
    keep_build_dir: bool = False
    install: bool = True
    install_target: Path | None = None
    order_from: Path | None = (
        None  # a build record whose object times order this build (default: the newest)
    )
    caches: tuple[
        CacheSite, ...
    ] = ()  # binary caches asked, in order, before compiling (cache/config.py)
    slurm: bool = (
        False  # every compile a job step of the Slurm allocation it runs in (slurm_steps.py)
    )
    # the compile cache every compile goes through (build/compile_cache.py): on, in <cache>/sccache by default
    compile_cache: compile_cache.CompileCacheConfig = compile_cache.CompileCacheConfig()


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    record_path: Path
    record: BuildRecord
    cached: bool
    substituted_from: str = ""  # taken from a binary cache: its table entry's URL


# ---------------------------------------------------------------- inputs


def resolve_archs(spec: EnvSpec, arch_arg: str | None, fp: Fingerprint) -> tuple[str, ...]:
    """The spec's archs; `--arch native` the GPUs present; `--arch 80,90` exactly those."""
    if arch_arg is None:
        return spec.archs
    if arch_arg == "native":
        found = tuple(sorted({gpu.sm for gpu in fp.gpus}, key=int))
        if not found:
            raise ToolkitError(
                "nvidia-smi: no GPU visible for --arch native (name the archs instead: --arch 80,90)"
            )
        return found
    archs = tuple(a.strip() for a in re.split(r"[,;\s]+", arch_arg) if a.strip())
    bad = [a for a in archs if not ARCH_ARG.fullmatch(a)]
    if bad or not archs:
        raise ToolkitError(
            f"--arch {arch_arg}: not an arch list (use native or sm numbers like 80,90,90a)"
        )
    return archs


def size_parallelism(
    cpus: int,
    mem_gb: float,
    gb_per_thread: float,
    threads_per_cpu: float,
    n_archs: int,
    jobs: int | None,
    nvcc_threads: int | None,
) -> Parallelism:
    """Jobs x threads from cores and RAM: each nvcc thread compiles one arch and peaks near gb_per_thread.

    The thread budget is min(cores x threads_per_cpu, RAM / gb_per_thread). A few more threads than cores
    keep every core busy while the last, longest objects finish (the kernel shares the cores; see
    envs/base.yaml). One nvcc thread per arch (so an object's archs compile side by side and the slowest
    object finishes sooner), and as many jobs as the budget then allows. Explicit values (spec or command
    line) win.
    """
    budget = max(1, min(math.floor(cpus * threads_per_cpu), math.floor(mem_gb / gb_per_thread)))
    threads = nvcc_threads or max(1, min(n_archs, budget))
    jobs = jobs or max(1, budget // threads)
    basis = (
        f"{cpus} cores x {threads_per_cpu:g}, {mem_gb:.0f} GB / {gb_per_thread:g} GB per nvcc thread -> "
        f"budget {budget} threads; {jobs} jobs x {threads} nvcc threads "
        f"(peak about {jobs * threads * gb_per_thread:.0f} GB)"
    )
    return Parallelism(jobs, threads, cpus, mem_gb, gb_per_thread, basis)


def local_version(spec: EnvSpec) -> str:
    """'+cu130torch2.11': flash-attn's setup.py puts FLASH_ATTN_LOCAL_VERSION into the wheel's version."""
    return f"cu{spec.cuda.replace('.', '')}torch{minor_of(spec.torch_version)}"


def torch_arch_list(archs: tuple[str, ...]) -> str:
    """'80', '90a' -> '8.0;9.0a' (TORCH_CUDA_ARCH_LIST's spelling), for setup.py paths that use torch's flags."""
    return ";".join(
        f"{a.rstrip('af')[:-1]}.{a.rstrip('af')[-1]}{a[len(a.rstrip('af')) :]}" for a in archs
    )


def neutralised(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The caller's NEUTRALISED_VARIABLES that the build removes or overrides (for the record)."""
    return {
        name: environ[name]
        for name in NEUTRALISED_VARIABLES
        if name in environ and environ[name] != env.get(name)
    }


def process_environment(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The build process's environment: the caller's without NEUTRALISED_VARIABLES, then the build's own."""
    return {**{k: v for k, v in environ.items() if k not in NEUTRALISED_VARIABLES}, **env}


def build_environment(
    tc: LineEnvironment,
    archs: tuple[str, ...],
    par: Parallelism,
    local: str,
    epoch: int,
    build_dir: Path,
) -> dict[str, str]:
    """Every variable the build sees on top of the caller's environment, each set for a reason."""
    prefix_map = f"-ffile-prefix-map={build_dir}={BUILD_DIR_ALIAS}"
    env = {
        **tc.include_environment(),
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",  # else setup.py first downloads a prebuilt wheel it guesses
        "FLASH_ATTN_CUDA_ARCHS": ";".join(archs),
        "TORCH_CUDA_ARCH_LIST": torch_arch_list(archs),
        "MAX_JOBS": str(par.jobs),
        "NVCC_THREADS": str(par.nvcc_threads),
        "FLASH_ATTN_LOCAL_VERSION": local,  # into METADATA, not only the file name
        # torch's cpp_extension (2.13 and 2.14.1 here) puts a ccache or sccache found on PATH before every compiler
        # (torch/utils/cpp_extension.py _wrap_compiler); the build's own launcher (compile_cache.py, after
        # --slurm's srun) owns that place, so torch's, a second sccache with another server, is turned off
        "TORCH_NO_COMPILER_WRAPPER": "1",
        "CUDA_HOME": str(tc.cuda_home),
        "CUDA_PATH": str(tc.cuda_home),
        "PATH": tc.path_env,
        # reproducibility: fixed timestamps, no build paths or nvcc's pid-named temp files in the objects
        "SOURCE_DATE_EPOCH": str(epoch),
        "CFLAGS": prefix_map,
        "CXXFLAGS": prefix_map,
        "NVCC_APPEND_FLAGS": f"-Xcompiler {prefix_map}",
        "LDFLAGS": "-Wl,--discard-all",  # drops local symbols, among them nvcc's tmpxft_<pid> file names
        "PYTHONHASHSEED": "0",
        "TZ": "UTC",
        "LC_ALL": "C",  # English compiler messages, which the failure catalog matches
        "PYTHONUNBUFFERED": "1",  # live [n/N] lines
        "NINJA_STATUS": NINJA_STATUS,  # the [n/N] lines the progress reads, whatever the caller's
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }
    if tc.cc:
        env["CC"] = str(tc.cc)  # torch passes it to nvcc as -ccbin
    if tc.cxx:
        env["CXX"] = str(tc.cxx)
    return env


def keyed_inputs(
    spec: EnvSpec, tc: LineEnvironment, fp: Fingerprint, archs: tuple[str, ...]
) -> dict:
    """What determines the wheel's bytes besides its source's pins (WheelSource.key_inputs: a lock's sha256, a
    commit and its archives), known without reading the lock (so a cache hit stays fast): the environment
    follows from these, and jobs/threads change only the speed, so neither is part of the key; nor are file
    paths (the same inputs from another working directory are the same build)."""
    torch = fp.torch
    return {
        "recipe": RECIPE_VERSION,
        "line": spec.line,
        "spec_input_hash": spec.build_input_hash(),
        "toolchain": {
            "kind": tc.kind,
            "nvcc": fp.nvcc_version,
            "cxx": Path(fp.cxx_path).name if fp.cxx_path else None,
            "gcc": fp.gcc_version,
            "python_version": fp.python_version,
            "torch": torch.version if torch else None,
            "torch_cuda": torch.cuda if torch else None,
            "cxx11_abi": torch.cxx11_abi if torch else None,
            "ninja": fp.ninja_version,
        },
        "archs": list(archs),
        "local_version": local_version(spec),
    }


# ---------------------------------------------------------------- running pip with progress


class EtaColumn(ProgressColumn):
    """The bar's ETA, by the object costs of what is left (CompileProgress), counting down between objects."""

    def __init__(self, progress: CompileProgress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        return Text(self.progress.eta_text())


def run_logged(
    cmd: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    console: Console,
    compile_progress: CompileProgress,
) -> int:
    """Run the build with its full output in log_path and a live bar of objects compiled (plain lines every
    PLAIN_STEP of them when not a terminal), its total known from the start where costs or an interrupted
    build's object list give it, else from build.ninja once the ninja shim has read it."""
    tracker = compile_progress
    columns = (
        TextColumn("compiling"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("objects"),
        TimeElapsedColumn(),
        EtaColumn(tracker),
    )
    next_report = 0.0

    def report() -> None:
        nonlocal next_report
        if (
            console.is_terminal
            or tracker.total is None
            or tracker.completed / max(1, tracker.total) < next_report
        ):
            return
        kept = f" ({tracker.kept} kept from the interrupted build)" if tracker.kept else ""
        console.print(
            f"compiling {tracker.completed}/{tracker.total} objects{kept}, "
            f"{progress.tasks[0].elapsed or 0:.0f} s, {tracker.eta_text()}"
        )
        next_report = tracker.completed / max(1, tracker.total) + PLAIN_STEP

    with (
        open(log_path, "w", buffering=1) as log,
        Progress(*columns, console=console, transient=False) as progress,
    ):
        task = progress.add_task("compile", total=tracker.total, completed=tracker.completed)
        report()
        log.write(f"$ {' '.join(cmd)}\n")
        # pip and every compiler below it die with this process, even when it is killed with SIGKILL
        with popen_tied(  # its pipe closed on the way out, whichever way that is
            cmd,
            cwd=cwd,
            env=process_environment(dict(os.environ), env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            umask=0o022,
        ) as proc:
            try:
                assert proc.stdout is not None  # stdout=PIPE
                for line in proc.stdout:
                    log.write(line)
                    if tracker.feed(line):
                        progress.update(task, completed=tracker.completed, total=tracker.total)
                        report()
                return proc.wait()
            except BaseException:
                kill_group(proc)
                raise


# ---------------------------------------------------------------- the wheel sources

# The implementations `toolkit build` compiles, by the names EnvSpec.compiled_implementations gives: each
# module's WheelSource of a line.
WHEEL_SOURCES: dict[str, Callable[[EnvSpec, Workspace], WheelSource]] = {
    "flash-attn-2": fa2.Fa2Source.of,
    "flash-attn-3": fa3.Fa3Source.of,
}
DEFAULT_SOURCE = fa2.Fa2Source.of  # what build() compiles when handed no source


def sources_of(spec: EnvSpec, workspace: Workspace) -> list[WheelSource]:
    """What `toolkit build LINE` makes: the WheelSource of each implementation the line compiles."""
    return [WHEEL_SOURCES[name](spec, workspace) for name in spec.compiled_implementations()]


def first_estimate(
    spec: EnvSpec,
    source: WheelSource,
    archs: tuple[str, ...],
    par: Parallelism,
    order: ScheduleOrder,
    interrupted: ManifestObjects | None,
    shim_dir: Path,
    console: Console,
) -> CompileProgress:
    """Print the estimate line (the objects left, by their costs, at this sizing and on REFERENCE_CPUS cores)
    and return the progress it starts the bar with. A resumed build knows its objects and which of them are
    done from the interrupted build's object list; a first one its costs from the schedule's order."""
    per_object = source.threads_per_object(archs)
    here = Sizing(par.jobs, min(par.nvcc_threads, per_object), par.cpus)
    ref = size_parallelism(
        REFERENCE_CPUS,
        REFERENCE_CPUS * spec.build.threads_per_cpu * spec.build.gb_per_nvcc_thread,
        spec.build.gb_per_nvcc_thread,
        spec.build.threads_per_cpu,
        per_object,
        None,
        None,
    )
    reference = Sizing(ref.jobs, min(ref.nvcc_threads, per_object), REFERENCE_CPUS)
    if interrupted is not None:
        finished, costs = interrupted.finished(), filled(interrupted.costs)
        left = None if costs is None else [c for name, c in costs.items() if name not in finished]
        console.print(
            estimate_line(
                left, len(finished), here, "the interrupted build's object costs", reference
            )
        )
        return CompileProgress(shim_dir, len(interrupted.costs), len(finished), here, left)
    known = list(order.object_seconds.values() or order.source_seconds.values()) or None
    basis = (
        "the previous build's times on this machine"
        if order.kind == "record"
        else "the knowledge's object costs, measured on another machine's CPUs"
    )
    console.print(estimate_line(known, 0, here, basis, reference))
    return CompileProgress(shim_dir, len(known) if known else None, 0, here, known)


# ---------------------------------------------------------------- the build, as a table of named steps


@dataclass
class BuildRun:
    """One build's state: each step of BUILD_STEPS reads what the steps before it set."""

    spec: EnvSpec
    options: BuildOptions
    console: Console
    source: WheelSource
    folders: ExitStack  # the keyed build folder, held until the build ends
    workspace: Workspace = field(init=False)
    cache: Path = field(init=False)
    line_dir: Path = field(init=False)
    tc: LineEnvironment = field(init=False)
    build_parent: Path = field(init=False)
    fp: Fingerprint = field(init=False)
    archs: tuple[str, ...] = field(init=False)
    inputs: dict[str, Any] = field(init=False)
    key: str = field(init=False)
    mem_gb: float = field(init=False)
    folder: BuildFolder = field(init=False)
    par: Parallelism = field(init=False)
    allocation: Allocation | None = field(init=False)  # --slurm's
    started: datetime = field(init=False)
    log_path: Path = field(init=False)
    tree: SourceTree = field(init=False)
    env: dict[str, str] = field(init=False)
    order: ScheduleOrder = field(init=False)
    shim_dir: Path = field(init=False)
    plan: ManifestPlan = field(init=False)
    cache_server: compile_cache.CompileCache | None = field(init=False, default=None)
    cache_use: CompileCacheUse | None = field(init=False, default=None)
    interrupted: ManifestObjects | None = field(init=False)
    before: dict[str, dict[str, Any]] = field(init=False)
    built: Path = field(init=False)
    wall: float = field(init=False)
    cpu_s: float = field(init=False)
    version: str = field(init=False)
    modules: list[str] = field(init=False)
    so_archs: dict[str, list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.workspace = self.options.workspace
        self.cache = self.options.cache or self.workspace.cache
        self.line_dir = self.source.line_dir(self.workspace)

    @property
    def build_dir(self) -> Path:
        return self.folder.path


def step_toolchain(run: BuildRun) -> BuildResult | None:
    """The --order-from record read first (a bad one is refused before anything starts), then the line's
    toolchain, the machine's fingerprint and the archs to compile."""
    if run.options.order_from:
        order_record(run.options.order_from)
    spec, workspace = run.spec, run.workspace
    run.allocation = Allocation.from_environment(os.environ) if run.options.slurm else None
    found = line_env.resolve(spec, run.options.prefix, workspace=workspace)
    if (
        found.missing and not workspace.lock_file(spec.line).exists()
    ):  # the cause, not `run toolkit install` first
        raise ToolkitError(missing_lock(spec, workspace))
    run.tc = found.require_installed(spec.line)
    run.build_parent = run.cache / "build"
    run.build_parent.mkdir(parents=True, exist_ok=True)
    clean_stale(run.build_parent)  # what killed builds left
    put_back_slot(run.build_parent)  # the folder of a build killed in the compile slot
    run.fp = run.tc.fingerprint(work_dir=run.build_parent)
    run.archs = resolve_archs(spec, run.options.arch, run.fp)
    return None


def step_inputs(run: BuildRun) -> BuildResult | None:
    """The cache key: the build's inputs and the source's own (WheelSource.key_inputs)."""
    run.inputs = {**keyed_inputs(run.spec, run.tc, run.fp, run.archs), **run.source.key_inputs()}
    run.key = inputs_key(run.inputs)
    return None


def step_cache(run: BuildRun) -> BuildResult | None:
    """The wheel of these inputs from the wheelhouse, then from each binary cache; ends the build when found."""
    if run.options.force:
        return None
    hit = find_cached(run.line_dir, run.key)
    if hit:
        return BuildResult(hit.wheel, hit.record_path, hit.record, cached=True)
    for site in run.options.caches:
        hit = substitute(site, run.key, run.line_dir, run.cache, run.console)
        if hit:
            write_index(run.workspace.wheelhouse)
            return BuildResult(
                hit.wheel,
                hit.record_path,
                hit.record,
                cached=True,
                substituted_from=hit.record.substituted_from,
            )
    return None


def step_preflight(run: BuildRun) -> BuildResult | None:
    """Old build folders pruned, then the toolchain checked before anything is fetched or compiled."""
    options = run.options
    prune(
        run.build_parent, in_use=run.key
    )  # build folders unused for long, or beyond the disk budget
    run.mem_gb = options.mem_gb or run.fp.mem_available_gb
    compile_env = process_environment(
        dict(os.environ), {**run.tc.include_environment(), "PATH": run.tc.path_env, "LC_ALL": "C"}
    )
    run_preflight(
        preflight_input(
            run.spec,
            run.fp,
            run.archs,
            run.mem_gb,
            run.build_parent,
            compile_env,
            archs_given=None if options.arch is None else f"--arch {options.arch}",
            mem_given=None if options.mem_gb is None else f"--mem-gb {options.mem_gb:g}",
        )
    )
    return None


def step_fetch(run: BuildRun) -> BuildResult | None:
    """Every pinned file of the source in the cache, checked."""
    run.source.fetch(run.cache)
    return None


def step_folder(run: BuildRun) -> BuildResult | None:
    """The build folder of these inputs (an interrupted build's, to continue) and the compile cache's server,
    held until the build ends; with the server, the folder is in the compile slot meanwhile (build_dirs.py:
    every line's compiles then see the same paths, and their nvcc stages hit across lines)."""
    folders = run.folders
    keyed = folders.enter_context(
        keyed_build_folder(
            run.build_parent, run.key, fresh=run.options.force, keep=run.options.keep_build_dir
        )
    )
    run.cache_server = folders.enter_context(
        compile_cache.serving(
            cache_config(run), run.cache, dict(os.environ), keyed.path / SCHEDULE, run.console
        )
    )
    run.folder = keyed
    if run.cache_server is not None:
        run.folder = folders.enter_context(compile_slot(run.build_parent, keyed))
        run.console.print(
            f"compiling in {display_path(run.folder.path)} (the compile slot: the same paths for every line)"
            if run.folder.home
            else f"compiling in {display_path(keyed.path)}: the compile slot is in use by another build, so "
            "nvcc's stages hit the cache only for this line's inputs"
        )
    return None


def step_size(run: BuildRun) -> BuildResult | None:
    """Jobs x nvcc threads from cores and memory (an interrupted build's threads, which its commands carry);
    with --slurm, threads from one node of the allocation and as many jobs as its nodes hold side by side."""
    spec, options, folder, allocation = run.spec, run.options, run.folder, run.allocation
    resumed_threads = (
        folder.previous.nvcc_threads if folder.previous else None
    )  # its compile commands'
    per_node_mem_gb = (
        min(allocation.mem_per_node_mb) / 1024
        if allocation and allocation.mem_per_node_mb
        else run.mem_gb
    )
    par = size_parallelism(
        min(allocation.cpus_per_node) if allocation else run.fp.cpus,
        per_node_mem_gb,
        spec.build.gb_per_nvcc_thread,
        spec.build.threads_per_cpu,
        run.source.threads_per_object(run.archs),
        options.jobs or spec.build.jobs,
        options.nvcc_threads or spec.build.nvcc_threads or resumed_threads,
    )
    if allocation is not None:
        par = slurm_parallelism(allocation, par, options.jobs or spec.build.jobs)
    elif par.jobs * par.nvcc_threads * par.gb_per_nvcc_thread > run.mem_gb:
        run.console.print(
            f"warning: {par.jobs} jobs x {par.nvcc_threads} threads may need more than "
            f"{run.mem_gb:.0f} GB (about {par.gb_per_nvcc_thread:g} GB per nvcc thread): the OOM "
            f"killer may stop the build"
        )
    run.par = par
    return None


def slurm_parallelism(allocation: Allocation, par: Parallelism, jobs: int | None) -> Parallelism:
    """ninja's -j for compiles that are job steps: as many as the allocation's nodes hold side by side, each
    on par's nvcc threads and their memory (explicit jobs win; Slurm queues the steps beyond)."""
    mem_mb = step_mem_mb(par.nvcc_threads, par.gb_per_nvcc_thread)
    fits = allocation.jobs(par.nvcc_threads, mem_mb)
    if fits < 1:
        raise ToolkitError(
            f"--slurm: {allocation.describe()}: no node holds one compile of {par.nvcc_threads} CPUs and "
            f"{mem_mb} MB (ask for more CPUs or memory per node"
            f"{', or pass --nvcc-threads 1' if par.nvcc_threads > 1 else ''})"
        )
    jobs = jobs or fits
    cpus = sum(allocation.cpus_per_node)
    mem_gb = sum(allocation.mem_per_node_mb) / 1024 if allocation.mem_per_node_mb else par.mem_gb
    basis = (
        f"{allocation.describe()}; each compile a job step of {par.nvcc_threads} CPUs and {mem_mb} MB "
        f"-> {jobs} jobs x {par.nvcc_threads} nvcc threads across the nodes"
    )
    return replace(par, jobs=jobs, cpus=cpus, mem_gb=mem_gb, basis=basis)


def step_unpack(run: BuildRun) -> BuildResult | None:
    """The source unpacked into the build folder and the environment the compile runs with."""
    (run.line_dir / "logs").mkdir(parents=True, exist_ok=True)
    run.started = datetime.now(timezone.utc)
    run.log_path = (
        run.line_dir / "logs" / f"build-{run.started.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}.log"
    )
    run.tree = run.folder.unpacked(run.source, run.archs, run.par.nvcc_threads)
    run.env = {
        **build_environment(
            run.tc, run.archs, run.par, run.inputs["local_version"], run.tree.epoch, run.build_dir
        ),
        **run.tree.environment,
    }
    return None


def step_schedule(run: BuildRun) -> BuildResult | None:
    """The object order (the previous build's times or the knowledge's costs), in the ninja shim."""
    run.order = in_cpu_seconds(
        schedule_order(
            run.options.order_from, run.line_dir, run.tree.pin, run.archs, run.tree.costs_key
        ),
        run.source.threads_per_object,
    )
    run.shim_dir = run.build_dir / SCHEDULE
    run.interrupted = ManifestObjects.read(
        run.shim_dir
    )  # the object list of the build that stopped here
    (run.shim_dir / MANIFEST_OBJECTS).unlink(missing_ok=True)  # this build's shim writes its own
    launcher = slurm_launcher(run) if run.allocation else []
    plan = ManifestPlan(
        str(run.build_dir),
        run.order.object_seconds,
        str(run.tree.source_root),
        run.order.source_seconds,
        "previous build's times" if run.order.kind == "record" else "the knowledge's object costs",
        launcher,
    )
    run.plan = plan
    if not install_ninja_shim(run.shim_dir, plan, run.env["PATH"]):
        raise ToolkitError(
            f"{run.tc.path_env.split(os.pathsep)[0]}: no ninja on the build's PATH "
            "(install ninja into the environment)"
        )
    return None


def slurm_launcher(run: BuildRun) -> list[str]:
    """srun's words for every compile, once the build folder and the toolchain are known to be on a
    filesystem the allocation's nodes share."""
    assert run.allocation is not None
    toolchain = {"the toolchain's python": run.tc.python, "the CUDA toolkit": run.tc.cuda_home}
    where = {"the build folder": run.build_dir, **{k: p for k, p in toolchain.items() if p}}
    problem = shared_filesystem_problem(run.allocation, where, mounts_text())
    if problem:
        raise ToolkitError(problem)
    temp = step_temp_dir(run.build_dir)
    temp.mkdir(exist_ok=True)
    par = run.par
    return srun_words(par.nvcc_threads, step_mem_mb(par.nvcc_threads, par.gb_per_nvcc_thread), temp)


def cache_config(run: BuildRun) -> compile_cache.CompileCacheConfig:
    """The compile cache the options ask for, off where compiles run on other nodes: the build's sccache
    server listens on a socket of this node only (compile_cache.serving)."""
    if run.allocation is not None and run.allocation.nodes > 1:
        return compile_cache.CompileCacheConfig(
            False, where=f"--slurm over {run.allocation.nodes} nodes: no shared sccache server yet"
        )
    return run.options.compile_cache


def step_compile(run: BuildRun) -> BuildResult | None:
    """`pip wheel --no-build-isolation` with a live bar; Ctrl-C keeps the finished objects for the next build."""
    spec, console, par = run.spec, run.console, run.par
    out_dir = run.build_dir / "dist"
    cmd = [
        str(run.tc.python),
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "--wheel-dir",
        str(out_dir),
        str(run.tree.project_dir),
    ]
    console.print(
        f"building {run.source.label} for {spec.line}: archs {', '.join(run.archs)}; {par.basis}"
    )
    console.print(f"log: {display_path(run.log_path)}")
    console.print(f"schedule: {run.order.summary()}")
    tracker = first_estimate(
        spec, run.source, run.archs, par, run.order, run.interrupted, run.shim_dir, console
    )
    run.before = {o["name"]: o for o in ninja_objects(run.tree.project_dir)}
    t0, cpu0 = time.monotonic(), children_cpu_s()
    run_env = {**run.env, "PATH": f"{run.shim_dir}{os.pathsep}{run.env['PATH']}"}
    cache = run.cache_server
    if cache is not None:  # every compile through it, after the plan's own launcher words
        write_plan(run.shim_dir, replace(run.plan, launcher=[*run.plan.launcher, *cache.launcher]))
        run_env = {**run_env, **cache.client_env}
    try:
        rc = run_logged(cmd, run_env, run.build_dir, run.log_path, console, tracker)
        if cache is not None:
            run.cache_use = cache.use()
            cache.stop()  # waited for now: the compiles it ran count in children_cpu_s below
    except KeyboardInterrupt:
        done = ManifestObjects.read(run.shim_dir)
        console.print(
            f"stopped: {len(done.finished()) if done else 0} finished objects kept in "
            f"{display_path(run.folder.kept_at)}; `toolkit build {spec.line}` continues from them"
        )
        raise
    run.wall, run.cpu_s = time.monotonic() - t0, children_cpu_s() - cpu0
    if rc != 0:
        raise ToolkitError(
            f"{display_path(run.log_path)}: build failed (pip exit {rc}): "
            f"{explain_file(run.log_path, (run.tc.cuda_home,) if run.tc.cuda_home else ())}"
        )
    built = next(out_dir.glob("*.whl"), None)
    if built is None:
        raise ToolkitError(
            f"{display_path(run.log_path)}: pip reported success but wrote no wheel (see the log)"
        )
    run.built = built
    return None


def step_check(run: BuildRun) -> BuildResult | None:
    """The wheel's local tag and archs, the source's own check, then its install and import."""
    tree = run.tree
    checked = verify_wheel(
        run.built,
        tree.wheel_archs,
        run.inputs["local_version"],
        run.build_dir / "verify",
        run.log_path,
        run.tc.path_env,  # the toolchain's own cuobjdump first
    )
    run.version, run.modules, run.so_archs = checked.version, checked.modules, checked.so_archs
    run.console.print(f"device code: {checked.coverage.summary()}", markup=False)
    if tree.check_wheel:
        tree.check_wheel(run.built)
    if run.options.install:
        install_and_import(
            run.tc,
            run.built,
            [*run.modules, *tree.imports],
            run.options.install_target,
            run.log_path,
            tree.after_install,
        )
    return None


def step_record(run: BuildRun) -> BuildResult | None:
    """The build record, the wheel and the record placed in the wheelhouse, the index rewritten."""
    par, tree, built = run.par, run.tree, run.built
    objects = ninja_objects(tree.project_dir)
    compiled = [
        o for o in objects if run.before.get(o["name"]) != o
    ]  # by this run: efficiency is its own
    record = BuildRecord(
        inputs_key=run.key,
        inputs=BuildInputs.from_json(run.inputs),
        files=tree.files,
        sdist=tree.pin,
        patches=[
            AppliedPatch(**patch) for patch in tree.patches
        ],  # patches hook: file, sha256, applied
        flash_attn_3=tree.record_section,  # the record's one implementation section (formats: build/record.py)
        environment=run.env,
        neutralised_environment=neutralised(dict(os.environ), run.env),
        parallelism=replace(par, mem_gb=round(par.mem_gb, 1)),
        schedule=Schedule.model_validate(
            {**run.order.record_fields(), **manifest_outcome(run.shim_dir)}
        ),
        outputs=BuildOutputs(
            wheel=built.name,
            version=run.version,
            wheel_sha256=sha256_file(built),
            wheel_size=built.stat().st_size,
            modules=run.modules,
            archs_compiled=run.so_archs,
            imported=run.options.install,
            wall_s=round(run.wall, 1),
            efficiency=efficiency(compiled, par.jobs, run.wall, run.cpu_s, par.cpus),
            objects=[ObjectTime(**o) for o in objects],
        ),
        resumed=(
            {
                "objects_kept": len(objects) - len(compiled),
                "objects_compiled": len(compiled),
                "folder": display_path(run.folder.kept_at),
            }
            if len(compiled) < len(objects)
            else {}
        ),
        compile_cache=run.cache_use,
        fingerprint=run.fp.to_dict(),
        log=display_path(run.log_path),
        started=run.started.isoformat(timespec="seconds"),
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    wheel = place(built, run.line_dir, record)
    write_index(run.workspace.wheelhouse)
    if run.options.keep_build_dir:
        run.console.print(f"build directory kept: {display_path(run.folder.kept_at)}")
    return BuildResult(wheel, record_path_for(wheel), record, cached=False)


# The build, step by step: each step either hands the next what it found (in BuildRun) or ends the build with
# its result (a cached wheel; the placed one). A step's name is how messages, timings and docs refer to it.
BUILD_STEPS: tuple[tuple[str, Callable[[BuildRun], BuildResult | None]], ...] = (
    ("toolchain", step_toolchain),
    ("inputs", step_inputs),
    ("cache", step_cache),
    ("preflight", step_preflight),
    ("fetch", step_fetch),
    ("folder", step_folder),
    ("size", step_size),
    ("unpack", step_unpack),
    ("schedule", step_schedule),
    ("compile", step_compile),
    ("check", step_check),
    ("record", step_record),
)


def build(
    spec: EnvSpec, options: BuildOptions, console: Console, source: WheelSource | None = None
) -> BuildResult:
    """Build (or find in the cache) one wheel of a line (DEFAULT_SOURCE when none is given): BUILD_STEPS in order."""
    with ExitStack() as folders:
        run = BuildRun(
            spec, options, console, source or DEFAULT_SOURCE(spec, options.workspace), folders
        )
        for _name, step in BUILD_STEPS:
            result = step(run)
            if result is not None:
                return result
    raise AssertionError("the last build step returns the result")  # step_record always does


def substitute(
    site: CacheSite, key: str, line_dir: Path, cache: Path, console: Console
) -> CachedBuild | None:
    """The cache's wheel for these inputs, placed; None on a miss or a refusal (one line), and the build compiles."""
    try:
        found = fetch_substitute(site, key, cache / "substitutes")
        if found is None:
            console.print(
                f"{site.url}: no published build of these inputs ({key}); compiling", markup=False
            )
            return None
        return place_substitute(found, line_dir, key)
    except ToolkitError as exc:
        console.print(f"refused: {exc}", markup=False)
        return None


# ---------------------------------------------------------------- CLI


def build_command(args: argparse.Namespace) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    workspace = Workspace.from_args(args)
    spec = checked_spec(resolve_spec_arg(args.line, workspace))
    options = BuildOptions(
        workspace=workspace,
        prefix=args.prefix,
        arch=args.arch,
        jobs=args.jobs,
        nvcc_threads=args.nvcc_threads,
        mem_gb=args.mem_gb,
        force=args.force,
        keep_build_dir=args.keep_build_dir,
        install=not args.no_install,
        install_target=args.install_target,
        order_from=args.order_from,
        caches=tuple(configured_caches(args.cache)),
        slurm=args.slurm,
        compile_cache=(
            compile_cache.CompileCacheConfig(False, where="--no-compile-cache")
            if args.no_compile_cache
            else compile_cache.read_config(compile_cache.config_file())
        ),
    )
    sources = sources_of(spec, workspace)
    if not sources:
        raise ToolkitError(fa4_hooks.nothing_to_build(spec, workspace))
    for source in sources:
        t0 = time.monotonic()
        with run_temporaries("build"):  # pip's, nvcc's and the checks' temporary files
            result = build(spec, options, console, source)
        if result.substituted_from:
            print(
                f"substituted: {display_path(result.wheel)} from {result.substituted_from} (no compile; sha256 "
                f"and inputs verified, {time.monotonic() - t0:.2f} s; --force compiles)"
            )
            continue
        if result.cached:
            print(
                f"cached: {display_path(result.wheel)} (same inputs, sha256 verified, "
                f"{time.monotonic() - t0:.2f} s; --force rebuilds)"
            )
            continue
        print(f"built: {display_path(result.wheel)}")
        for text in describe(result.record):
            print(f"  {text}")
        print(
            f"  record: {display_path(result.record_path)}; index: "
            f"{(workspace.wheelhouse / 'simple').absolute().as_uri()}"
        )
    return 0


def build_report_command(args: argparse.Namespace) -> int:
    """The newest build record's figures: wall time, parallelism, the slowest objects."""
    workspace = Workspace.from_args(args)
    spec = checked_spec(resolve_spec_arg(args.line, workspace))
    line_dir = workspace.wheel_dir(spec.line)
    found = records(line_dir) if line_dir.is_dir() else []
    if not found:
        raise ToolkitError(
            f"{display_path(line_dir)}: no build records (run `toolkit build {spec.line}` first)"
        )
    path, record = found[0]
    print(f"{display_path(path)}:")
    for text in describe(record):
        print(f"  {text}")
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        description="Fetch the lock's hash-pinned flash-attn sdist, preflight the toolchain, compile it with "
        "`pip wheel --no-build-isolation` against the line's nvcc/gcc/torch, verify the wheel "
        "(local tag, archs, import) and place it with a build record in wheelhouse/LINE/.",
    )
    add_line(parser)
    add_workspace_options(parser)
    add_prefix(parser, "installed environment of a locked line (default: .envs/LINE)")
    add_arch(
        parser,
        "archs to compile: `native` (the GPUs present) or a list like 80,90 (default: the spec's archs)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        metavar="N",
        help="parallel compile jobs (MAX_JOBS; default: sized)",
    )
    parser.add_argument(
        "--nvcc-threads",
        type=_positive_int,
        metavar="N",
        help="threads per nvcc (NVCC_THREADS; default: sized)",
    )
    parser.add_argument(
        "--mem-gb",
        type=_positive_float,
        metavar="GB",
        help="memory to size jobs against (default: MemAvailable; machines that grow memory "
        "on demand show less than they have)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild from scratch even when a cached wheel matches (an interrupted build's "
        "objects are dropped too)",
    )
    parser.add_argument(
        "--keep-build-dir",
        action="store_true",
        help="keep the unpacked sdist and objects in .cache/build/KEY/ after a successful build "
        "(an interrupted one keeps them anyway, and the next build continues from them)",
    )
    parser.add_argument(
        "--no-install", action="store_true", help="do not install and import the built wheel"
    )
    parser.add_argument(
        "--install-target",
        type=Path,
        metavar="DIR",
        help="install into this directory (pip --target) instead",
    )
    parser.add_argument(
        "--order-from",
        type=Path,
        metavar="RECORD",
        help="start objects longest first by the times in this build record of the same sdist "
        "(default: the newest record in wheelhouse/LINE/; without one, the object costs "
        "in toolkit/knowledge/object_costs.yaml)",
    )
    parser.add_argument(
        "--cache",
        action="append",
        metavar="URL",
        help="a binary cache (`toolkit publish --to` folder: file://, http:// or https://) to take "
        "a published wheel of the same inputs from instead of compiling; repeatable, after "
        "the caches of .fa-envkit/caches.toml ($FA_ENVKIT_CACHES), which may also name their "
        "signing keys (docs/binary-cache.md)",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="inside a Slurm allocation (salloc or an sbatch script): run every compile as a job step "
        "(srun) across the allocation's nodes, the link and the wheel here; the build folder and the "
        "toolchain must be on a filesystem every node sees (TOOLKIT_CACHE)",
    )
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every object without the compile cache (sccache; on by default, in the cache's "
        "sccache/ folder or where .fa-envkit/compile-cache.toml says: docs/building.md)",
    )
    add_renamed_option(parser, "--report", "`toolkit build-report LINE`")
    parser.set_defaults(func=build_command)
    report = subparsers.add_parser(
        "build-report",
        description="Print the figures of the newest build record in wheelhouse/LINE/: "
        "wall time, jobs x nvcc threads and why, parallel efficiency.",
    )
    add_line(report)
    add_workspace_options(report)
    report.set_defaults(func=build_report_command)

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
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from toolkit.base.arguments import add_arch, add_line, add_prefix
from toolkit.base.atomic import clean_stale, run_temporaries
from toolkit.base.children import kill_group, popen_tied
from toolkit.base.digest import sha256_file
from toolkit.base.entry import add_renamed_option
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options
from toolkit.build.build_dirs import SCHEDULE, keyed_build_folder, prune
from toolkit.build.diagnose import explain_file
from toolkit.build.estimate import NINJA_STATUS, CompileProgress, ManifestObjects, Sizing, estimate_line, filled
from toolkit.build.fa3 import Fa3Source
from toolkit.build.ninja_shim import (
    BUILD_DIR_ALIAS,
    MANIFEST_OBJECTS,
    ManifestPlan,
    install_ninja_shim,
    manifest_outcome,
)
from toolkit.build.record import BuildInputs, BuildOutputs, BuildRecord, ObjectTime, Parallelism, Schedule
from toolkit.build.source import SourceTree, WheelSource, extract_sdist, settle_times
from toolkit.build.timing import ScheduleOrder, children_cpu_s, describe, efficiency, ninja_objects, schedule_order
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
from toolkit.env.download import fetch_verified
from toolkit.env.lock import missing_lock
from toolkit.env.lockfile import LockedEnv, LockedSdist, read_lock, stale_reason
from toolkit.knowledge.facts import arch_number, minor_of
from toolkit.knowledge.object_costs import CostKey
from toolkit.machine import line_env
from toolkit.machine.fingerprint import Fingerprint
from toolkit.machine.line_env import LineEnvironment
from toolkit.machine.preflight import preflight_input, run_preflight
from toolkit.spec import patches
from toolkit.spec.envspec import EnvSpec, resolve_spec_arg
from toolkit.spec.rules import checked_spec

# Bump when the build recipe (environment, flags) changes: cached wheels of the old recipe are rebuilt.
RECIPE_VERSION = 2
# Variables of an activated conda env that would change the compile behind the toolkit's back. conda-forge's
# cuda-nvcc activate.sh exports NVCC_PREPEND_FLAGS="... -ccbin=${CXX}" and torch adds its own -ccbin: nvcc 13.0
# warns "incompatible redefinition for option 'compiler-bindir', the last value of this option was used" (so
# flag order picks the host compiler). Its gcc activation exports CPPFLAGS="-DNDEBUG -D_FORTIFY_SOURCE=2 -O2
# -isystem $PREFIX/include" (cuda-nvcc's adds -I $PREFIX/targets/<triple>/include), which distutils appends to
# every g++ command (CFLAGS, CXXFLAGS, LDFLAGS the build sets itself). The build removes (or overrides) them; the
# record keeps what it removed. A caller's NINJA_STATUS would change the [n/N] lines the progress bar reads.
NEUTRALISED_VARIABLES = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPPFLAGS", "NINJA_STATUS")
REFERENCE_CPUS = 32  # the estimate line also says how long the build takes on a machine of this many cores
PLAIN_STEP = 0.05  # without a terminal, a progress line every 5 % of the objects
ARCH_ARG = re.compile(r"\d{2,3}[af]?")


@dataclass(frozen=True)
class BuildOptions:
    workspace: Workspace = DEFAULT  # the lock it builds from, the wheelhouse it places the wheel in
    cache: Path | None = None  # None: the workspace's cache ($TOOLKIT_CACHE or .cache)
    prefix: Path | None = None  # locked toolchain's conda prefix (default: the workspace's .envs/<line>)
    arch: str | None = None  # "native", "80,90" or None (the spec's archs)
    jobs: int | None = None
    nvcc_threads: int | None = None
    mem_gb: float | None = None
    force: bool = False
    keep_build_dir: bool = False
    install: bool = True
    install_target: Path | None = None
    order_from: Path | None = None  # a build record whose object times order this build (default: the newest)
    caches: tuple[CacheSite, ...] = ()  # binary caches asked, in order, before compiling (cache/config.py)


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    record_path: Path
    record: BuildRecord
    cached: bool
    substituted_from: str = ""  # taken from a binary cache: its table entry's URL


# ---------------------------------------------------------------- inputs


def fetch_sdist(sdist: LockedSdist, cache: Path) -> Path:
    """The locked sdist from .cache/sdist/<sha256>/<filename>, downloading it only when absent
    (toolkit/env/download.py: the hash-verified cache that conda archives use too)."""
    return fetch_verified(sdist, Path(cache) / "sdist", f"flash-attn sdist {sdist.filename}")


def resolve_archs(spec: EnvSpec, arch_arg: str | None, fp: Fingerprint) -> tuple[str, ...]:
    """The spec's archs; `--arch native` the GPUs present; `--arch 80,90` exactly those."""
    if arch_arg is None:
        return spec.archs
    if arch_arg == "native":
        found = tuple(sorted({gpu.sm for gpu in fp.gpus}, key=int))
        if not found:
            raise ToolkitError("nvidia-smi: no GPU visible for --arch native (name the archs instead: --arch 80,90)")
        return found
    archs = tuple(a.strip() for a in re.split(r"[,;\s]+", arch_arg) if a.strip())
    bad = [a for a in archs if not ARCH_ARG.fullmatch(a)]
    if bad or not archs:
        raise ToolkitError(f"--arch {arch_arg}: not an arch list (use native or sm numbers like 80,90,90a)")
    return archs


def size_parallelism(cpus: int, mem_gb: float, gb_per_thread: float, threads_per_cpu: float, n_archs: int,
                     jobs: int | None, nvcc_threads: int | None) -> Parallelism:
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
    basis = (f"{cpus} cores x {threads_per_cpu:g}, {mem_gb:.0f} GB / {gb_per_thread:g} GB per nvcc thread -> "
             f"budget {budget} threads; {jobs} jobs x {threads} nvcc threads "
             f"(peak about {jobs * threads * gb_per_thread:.0f} GB)")
    return Parallelism(jobs, threads, cpus, mem_gb, gb_per_thread, basis)


def local_version(spec: EnvSpec) -> str:
    """'+cu130torch2.11': flash-attn's setup.py puts FLASH_ATTN_LOCAL_VERSION into the wheel's version."""
    return f"cu{spec.cuda.replace('.', '')}torch{minor_of(spec.torch_version)}"


def torch_arch_list(archs: tuple[str, ...]) -> str:
    """'80', '90a' -> '8.0;9.0a' (TORCH_CUDA_ARCH_LIST's spelling), for setup.py paths that use torch's flags."""
    return ";".join(f"{a.rstrip('af')[:-1]}.{a.rstrip('af')[-1]}{a[len(a.rstrip('af')):]}" for a in archs)


def neutralised(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The caller's NEUTRALISED_VARIABLES that the build removes or overrides (for the record)."""
    return {name: environ[name] for name in NEUTRALISED_VARIABLES
            if name in environ and environ[name] != env.get(name)}


def process_environment(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The build process's environment: the caller's without NEUTRALISED_VARIABLES, then the build's own."""
    return {**{k: v for k, v in environ.items() if k not in NEUTRALISED_VARIABLES}, **env}


def build_environment(tc: LineEnvironment, archs: tuple[str, ...], par: Parallelism, local: str, epoch: int,
                      build_dir: Path) -> dict[str, str]:
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


def keyed_inputs(spec: EnvSpec, tc: LineEnvironment, fp: Fingerprint, archs: tuple[str, ...]) -> dict:
    """What determines the wheel's bytes besides its source's pins (WheelSource.key_inputs: the lock's sha256,
    FA3's commit and archives), known without reading the lock (so a cache hit stays fast): the environment
    follows from these, and jobs/threads change only the speed, so neither is part of the key; nor are file
    paths (the same inputs from another working directory are the same build)."""
    torch = fp.torch
    return {
        "recipe": RECIPE_VERSION,
        "line": spec.line,
        "spec_input_hash": spec.input_hash(),
        "toolchain": {
            "kind": tc.kind, "cuda_home": str(tc.cuda_home), "nvcc": fp.nvcc_version, "cxx": fp.cxx_path,
            "gcc": fp.gcc_version, "python": fp.python_path, "python_version": fp.python_version,
            "torch": torch.version if torch else None, "torch_cuda": torch.cuda if torch else None,
            "cxx11_abi": torch.cxx11_abi if torch else None, "ninja": fp.ninja_version,
        },
        "archs": list(archs),
        "local_version": local_version(spec),
    }


def read_current_lock(spec: EnvSpec, lock_file: Path) -> LockedEnv:
    """The verified lock, refused when it no longer matches the spec."""
    try:
        locked = read_lock(lock_file)
    except ImportError as exc:  # the lock reader validates with conda-lock's own models
        raise ToolkitError(f"{display_path(lock_file)}: reading it needs the Python package {exc.name} "
                           f"(pip install conda-lock into the toolkit's environment)") from None
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


# ---------------------------------------------------------------- running pip with progress


class EtaColumn(ProgressColumn):
    """The bar's ETA, by the object costs of what is left (CompileProgress), counting down between objects."""

    def __init__(self, progress: CompileProgress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        return Text(self.progress.eta_text())


def run_logged(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, console: Console,
               compile_progress: CompileProgress) -> int:
    """Run the build with its full output in log_path and a live bar of objects compiled (plain lines every
    PLAIN_STEP of them when not a terminal), its total known from the start where costs or an interrupted
    build's object list give it, else from build.ninja once the ninja shim has read it."""
    tracker = compile_progress
    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TextColumn("objects"),
               TimeElapsedColumn(), EtaColumn(tracker))
    next_report = 0.0

    def report() -> None:
        nonlocal next_report
        if console.is_terminal or tracker.total is None or tracker.completed / max(1, tracker.total) < next_report:
            return
        kept = f" ({tracker.kept} kept from the interrupted build)" if tracker.kept else ""
        console.print(f"compiling {tracker.completed}/{tracker.total} objects{kept}, "
                      f"{progress.tasks[0].elapsed or 0:.0f} s, {tracker.eta_text()}")
        next_report = tracker.completed / max(1, tracker.total) + PLAIN_STEP

    with open(log_path, "w", buffering=1) as log, Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("compile", total=tracker.total, completed=tracker.completed)
        report()
        log.write(f"$ {' '.join(cmd)}\n")
        # pip and every compiler below it die with this process, even when it is killed with SIGKILL
        proc = popen_tied(cmd, cwd=cwd, env=process_environment(dict(os.environ), env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, umask=0o022)
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


# ---------------------------------------------------------------- the build


@dataclass
class Fa2Source:
    """flash-attn 2.x from the line's locked sdist, with the patches the line needs (toolkit/spec/patches.py)."""

    spec: EnvSpec
    lock_file: Path
    locked: LockedEnv | None = None
    sdist: Path | None = None
    label: str = "flash-attn"

    def line_dir(self, workspace: Workspace) -> Path:
        return workspace.wheel_dir(self.spec.line)

    def key_inputs(self) -> dict[str, Any]:
        """The lock's sha256 pins the sdist; each patch the build applies is part of the key too."""
        if not self.lock_file.exists():
            raise ToolkitError(f"{display_path(self.lock_file)}: no lock file (run `toolkit lock {self.spec.line}` "
                               f"first)")
        return {"lock_sha256": sha256_file(self.lock_file), **patches.key_inputs(self.spec)}

    def threads_per_object(self, archs: tuple[str, ...]) -> int:
        return len(archs)  # flash-attn 2.x compiles every object for every arch

    def fetch(self, cache: Path) -> None:
        self.locked = read_current_lock(self.spec, self.lock_file)
        self.sdist = fetch_sdist(self.locked.sdist, cache)
        self.label = self.locked.sdist.filename

    def unpack(self, build_dir: Path, archs: tuple[str, ...]) -> SourceTree:
        assert self.locked is not None and self.sdist is not None  # fetch() came first
        src_dir, epoch = extract_sdist(self.sdist, build_dir)
        applied = patches.apply(src_dir, self.spec, self.locked.sdist.sha256)  # patches hook (patches.yaml)
        settle_times(src_dir, epoch)  # a resumed build's kept objects stay newer than every patched file
        known = setup_py_archs(src_dir)
        if known is not None and not set(archs) <= known:
            skipped = ", sm_".join(a for a in archs if a not in known)
            raise ToolkitError(f"{display_path(self.sdist)}: its setup.py compiles only "
                               f"sm_{', sm_'.join(sorted(known, key=arch_number))} and would skip sm_{skipped} "
                               f"silently (drop them from archs / --arch)")
        fa4_pin = next((p for p in self.locked.packages if p.manager == "pip" and p.name == "flash-attn-4"), None)
        return SourceTree(src_dir, epoch, self.locked.sdist, archs,
                          {"spec": display_path(self.spec.path), "lock": display_path(self.lock_file)},
                          source_root=src_dir, costs_key=CostKey("fa2", self.locked.sdist.sha256),
                          patches=[asdict(p) for p in applied], fa4_pin=fa4_pin)


def sources_of(spec: EnvSpec, workspace: Workspace) -> list[WheelSource]:
    """What `toolkit build LINE` makes: FA2 unless the line builds FA3 instead of it, and FA3 where it asks."""
    wanted: list[WheelSource] = []
    if spec.flash_attn_2_left_out() is None:
        wanted.append(Fa2Source(spec, workspace.lock_file(spec.line)))
    if spec.flash_attn_3 is not None:
        wanted.append(Fa3Source.of(spec))
    return wanted


def first_estimate(spec: EnvSpec, source: WheelSource, archs: tuple[str, ...], par: Parallelism,
                   order: ScheduleOrder, interrupted: ManifestObjects | None, shim_dir: Path,
                   console: Console) -> CompileProgress:
    """Print the estimate line (the objects left, by their costs, at this sizing and on REFERENCE_CPUS cores)
    and return the progress it starts the bar with. A resumed build knows its objects and which of them are
    done from the interrupted build's object list; a first one its costs from the schedule's order."""
    per_object = source.threads_per_object(archs)
    here = Sizing(par.jobs, min(par.nvcc_threads, per_object), par.cpus)
    ref = size_parallelism(REFERENCE_CPUS, REFERENCE_CPUS * spec.build.threads_per_cpu * spec.build.gb_per_nvcc_thread,
                           spec.build.gb_per_nvcc_thread, spec.build.threads_per_cpu, per_object, None, None)
    reference = Sizing(ref.jobs, min(ref.nvcc_threads, per_object), REFERENCE_CPUS)
    if interrupted is not None:
        finished, costs = interrupted.finished(), filled(interrupted.costs)
        left = None if costs is None else [c for name, c in costs.items() if name not in finished]
        console.print(estimate_line(left, len(finished), here, "the interrupted build's object costs", reference))
        return CompileProgress(shim_dir, len(interrupted.costs), len(finished), here, left)
    known = list(order.object_seconds.values() or order.source_seconds.values()) or None
    basis = ("the previous build's times on this machine" if order.kind == "record"
             else "the knowledge's object costs, measured on another machine's CPUs")
    console.print(estimate_line(known, 0, here, basis, reference))
    return CompileProgress(shim_dir, len(known) if known else None, 0, here, known)


def build(spec: EnvSpec, options: BuildOptions, console: Console, source: WheelSource | None = None) -> BuildResult:
    """Build (or find in the cache) one wheel of a line (FA2 by default); see the module docstring for the steps."""
    workspace = options.workspace
    source = source or Fa2Source(spec, workspace.lock_file(spec.line))
    cache = options.cache or workspace.cache
    line_dir = source.line_dir(workspace)
    found = line_env.resolve(spec, options.prefix, workspace=workspace)
    if found.missing and not workspace.lock_file(spec.line).exists():  # the cause, not `run toolkit install` first
        raise ToolkitError(missing_lock(spec, workspace))
    tc = found.require_installed(spec.line)
    build_parent = cache / "build"
    build_parent.mkdir(parents=True, exist_ok=True)
    clean_stale(build_parent)  # what killed builds left
    fp = tc.fingerprint(work_dir=build_parent)
    archs = resolve_archs(spec, options.arch, fp)
    inputs = {**keyed_inputs(spec, tc, fp, archs), **source.key_inputs()}
    key = inputs_key(inputs)
    if not options.force:
        hit = find_cached(line_dir, key)
        if hit:
            return BuildResult(hit.wheel, hit.record_path, hit.record, cached=True)
        for site in options.caches:
            hit = substitute(site, key, line_dir, cache, console)
            if hit:
                write_index(workspace.wheelhouse)
                return BuildResult(hit.wheel, hit.record_path, hit.record, cached=True,
                                   substituted_from=hit.record.substituted_from)

    prune(build_parent, in_use=key)  # build folders unused for long, or beyond the disk budget
    mem_gb = options.mem_gb or fp.mem_available_gb
    compile_env = process_environment(dict(os.environ), {**tc.include_environment(), "PATH": tc.path_env,
                                                         "LC_ALL": "C"})
    run_preflight(preflight_input(spec, fp, archs, mem_gb, build_parent, compile_env,
                                  archs_given=None if options.arch is None else f"--arch {options.arch}",
                                  mem_given=None if options.mem_gb is None else f"--mem-gb {options.mem_gb:g}"))
    source.fetch(cache)
    with keyed_build_folder(build_parent, key, fresh=options.force, keep=options.keep_build_dir) as folder:
        resumed_threads = folder.previous.nvcc_threads if folder.previous else None  # its compile commands'
        par = size_parallelism(fp.cpus, mem_gb, spec.build.gb_per_nvcc_thread, spec.build.threads_per_cpu,
                               source.threads_per_object(archs), options.jobs or spec.build.jobs,
                               options.nvcc_threads or spec.build.nvcc_threads or resumed_threads)
        if par.jobs * par.nvcc_threads * par.gb_per_nvcc_thread > mem_gb:
            console.print(f"warning: {par.jobs} jobs x {par.nvcc_threads} threads may need more than {mem_gb:.0f} GB "
                          f"(about {par.gb_per_nvcc_thread:g} GB per nvcc thread): the OOM killer may stop the build")
        (line_dir / "logs").mkdir(parents=True, exist_ok=True)
        started = datetime.now(timezone.utc)
        log_path = line_dir / "logs" / f"build-{started.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}.log"
        build_dir = folder.path
        tree = folder.unpacked(source, archs, par.nvcc_threads)
        env = {**build_environment(tc, archs, par, inputs["local_version"], tree.epoch, build_dir), **tree.environment}
        order = schedule_order(options.order_from, line_dir, tree.pin, archs, tree.costs_key)
        shim_dir = build_dir / SCHEDULE
        interrupted = ManifestObjects.read(shim_dir)  # the object list of the build that stopped here
        (shim_dir / MANIFEST_OBJECTS).unlink(missing_ok=True)  # this build's shim writes its own
        plan = ManifestPlan(str(build_dir), order.object_seconds, str(tree.source_root), order.source_seconds,
                            "previous build's times" if order.kind == "record" else "the knowledge's object costs")
        if not install_ninja_shim(shim_dir, plan, env["PATH"]):
            raise ToolkitError(f"{tc.path_env.split(os.pathsep)[0]}: no ninja on the build's PATH "
                               "(install ninja into the environment)")
        out_dir = build_dir / "dist"
        cmd = [str(tc.python), "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-index",
               "--wheel-dir", str(out_dir), str(tree.project_dir)]
        console.print(f"building {source.label} for {spec.line}: archs {', '.join(archs)}; {par.basis}")
        console.print(f"log: {display_path(log_path)}")
        console.print(f"schedule: {order.summary()}")
        tracker = first_estimate(spec, source, archs, par, order, interrupted, shim_dir, console)
        before = {o["name"]: o for o in ninja_objects(tree.project_dir)}
        t0, cpu0 = time.monotonic(), children_cpu_s()
        run_env = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}"}
        try:
            rc = run_logged(cmd, run_env, build_dir, log_path, console, tracker)
        except KeyboardInterrupt:
            done = ManifestObjects.read(shim_dir)
            console.print(f"stopped: {len(done.finished()) if done else 0} finished objects kept in "
                          f"{display_path(build_dir)}; `toolkit build {spec.line}` continues from them")
            raise
        wall, cpu_s = time.monotonic() - t0, children_cpu_s() - cpu0
        if rc != 0:
            raise ToolkitError(f"{display_path(log_path)}: build failed (pip exit {rc}): "
                               f"{explain_file(log_path, (tc.cuda_home,) if tc.cuda_home else ())}")
        built = next(out_dir.glob("*.whl"), None)
        if built is None:
            raise ToolkitError(f"{display_path(log_path)}: pip reported success but wrote no wheel (see the log)")
        version, modules, so_archs = verify_wheel(built, tree.wheel_archs, inputs["local_version"],
                                                  build_dir / "verify", log_path)
        if tree.check_wheel:
            tree.check_wheel(built)
        if options.install:
            install_and_import(tc, built, [*modules, *tree.imports], options.install_target, log_path, tree.fa4_pin)
        objects = ninja_objects(tree.project_dir)
        compiled = [o for o in objects if before.get(o["name"]) != o]  # by this run: efficiency is its own
        record = BuildRecord(
            inputs_key=key,
            inputs=BuildInputs.from_json(inputs),
            files=tree.files,
            sdist=tree.pin,
            patches=[patches.AppliedPatch(**patch) for patch in tree.patches],  # patches hook: file, sha256, applied
            flash_attn_3=tree.record_section,
            environment=env,
            neutralised_environment=neutralised(dict(os.environ), env),
            parallelism=replace(par, mem_gb=round(par.mem_gb, 1)),
            schedule=Schedule.model_validate({**order.record_fields(), **manifest_outcome(shim_dir)}),
            outputs=BuildOutputs(
                wheel=built.name, version=version, wheel_sha256=sha256_file(built),
                wheel_size=built.stat().st_size, modules=modules, archs_compiled=so_archs,
                imported=options.install, wall_s=round(wall, 1),
                efficiency=efficiency(compiled, par.jobs, wall, cpu_s, par.cpus),
                objects=[ObjectTime(**o) for o in objects]),
            resumed=({"objects_kept": len(objects) - len(compiled), "objects_compiled": len(compiled),
                      "folder": display_path(build_dir)} if len(compiled) < len(objects) else {}),
            fingerprint=fp.to_dict(),
            log=display_path(log_path),
            started=started.isoformat(timespec="seconds"),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        wheel = place(built, line_dir, record)
        write_index(workspace.wheelhouse)
        if options.keep_build_dir:
            console.print(f"build directory kept: {display_path(build_dir)}")
        return BuildResult(wheel, record_path_for(wheel), record, cached=False)


def substitute(site: CacheSite, key: str, line_dir: Path, cache: Path, console: Console) -> CachedBuild | None:
    """The cache's wheel for these inputs, placed; None on a miss or a refusal (one line), and the build compiles."""
    try:
        found = fetch_substitute(site, key, cache / "substitutes")
        if found is None:
            console.print(f"{site.url}: no published build of these inputs ({key}); compiling", markup=False)
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
    options = BuildOptions(workspace=workspace, prefix=args.prefix, arch=args.arch, jobs=args.jobs,
                           nvcc_threads=args.nvcc_threads, mem_gb=args.mem_gb, force=args.force,
                           keep_build_dir=args.keep_build_dir, install=not args.no_install,
                           install_target=args.install_target, order_from=args.order_from,
                           caches=tuple(configured_caches(args.cache)))
    sources = sources_of(spec, workspace)
    if not sources:  # FA4 instead of FA2: nothing to compile, FA4 is pinned wheels
        raise ToolkitError(f"{spec.where('flash_attn_4.with_flash_attn_2')}: line {spec.line} builds no wheel "
                           f"({spec.flash_attn_2_left_out()}: FlashAttention-4 instead of flash-attn 2.x); install "
                           f"FA4 with `toolkit fa4 install --lock {display_path(workspace.fa4_lock_file(spec.line))}`")
    for source in sources:
        t0 = time.monotonic()
        with run_temporaries("build"):  # pip's, nvcc's and the checks' temporary files
            result = build(spec, options, console, source)
        if result.substituted_from:
            print(f"substituted: {display_path(result.wheel)} from {result.substituted_from} (no compile; sha256 "
                  f"and inputs verified, {time.monotonic() - t0:.2f} s; --force compiles)")
            continue
        if result.cached:
            print(f"cached: {display_path(result.wheel)} (same inputs, sha256 verified, "
                  f"{time.monotonic() - t0:.2f} s; --force rebuilds)")
            continue
        print(f"built: {display_path(result.wheel)}")
        for text in describe(result.record):
            print(f"  {text}")
        print(f"  record: {display_path(result.record_path)}; index: "
              f"{(workspace.wheelhouse / 'simple').absolute().as_uri()}")
    return 0


def build_report_command(args: argparse.Namespace) -> int:
    """The newest build record's figures: wall time, parallelism, the slowest objects."""
    workspace = Workspace.from_args(args)
    spec = checked_spec(resolve_spec_arg(args.line, workspace))
    line_dir = workspace.wheel_dir(spec.line)
    found = records(line_dir) if line_dir.is_dir() else []
    if not found:
        raise ToolkitError(f"{display_path(line_dir)}: no build records (run `toolkit build {spec.line}` first)")
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
        "build", help="build the flash-attn wheel of a line from its locked sdist",
        description="Fetch the lock's hash-pinned flash-attn sdist, preflight the toolchain, compile it with "
                    "`pip wheel --no-build-isolation` against the line's nvcc/gcc/torch, verify the wheel "
                    "(local tag, archs, import) and place it with a build record in wheelhouse/LINE/.")
    add_line(parser)
    add_workspace_options(parser)
    add_prefix(parser, "installed environment of a locked line (default: .envs/LINE)")
    add_arch(parser, "archs to compile: `native` (the GPUs present) or a list like 80,90 (default: the spec's archs)")
    parser.add_argument("--jobs", type=_positive_int, metavar="N", help="parallel compile jobs (MAX_JOBS; default: sized)")
    parser.add_argument("--nvcc-threads", type=_positive_int, metavar="N",
                        help="threads per nvcc (NVCC_THREADS; default: sized)")
    parser.add_argument("--mem-gb", type=_positive_float, metavar="GB",
                        help="memory to size jobs against (default: MemAvailable; machines that grow memory "
                             "on demand show less than they have)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild from scratch even when a cached wheel matches (an interrupted build's "
                             "objects are dropped too)")
    parser.add_argument("--keep-build-dir", action="store_true",
                        help="keep the unpacked sdist and objects in .cache/build/KEY/ after a successful build "
                             "(an interrupted one keeps them anyway, and the next build continues from them)")
    parser.add_argument("--no-install", action="store_true", help="do not install and import the built wheel")
    parser.add_argument("--install-target", type=Path, metavar="DIR", help="install into this directory (pip --target) instead")
    parser.add_argument("--order-from", type=Path, metavar="RECORD",
                        help="start objects longest first by the times in this build record of the same sdist "
                             "(default: the newest record in wheelhouse/LINE/; without one, the object costs "
                             "in toolkit/knowledge/object_costs.yaml)")
    parser.add_argument("--cache", action="append", metavar="URL",
                        help="a binary cache (`toolkit publish --to` folder: file://, http:// or https://) to take "
                             "a published wheel of the same inputs from instead of compiling; repeatable, after "
                             "the caches of .fa-envkit/caches.toml ($FA_ENVKIT_CACHES), which may also name their "
                             "signing keys (docs/binary-cache.md)")
    add_renamed_option(parser, "--report", "`toolkit build-report LINE`")
    parser.set_defaults(func=build_command)
    report = subparsers.add_parser("build-report", help="the newest build record's wall time and parallel efficiency",
                                   description="Print the figures of the newest build record in wheelhouse/LINE/: "
                                               "wall time, jobs x nvcc threads and why, parallel efficiency.")
    add_line(report)
    add_workspace_options(report)
    report.set_defaults(func=build_report_command)

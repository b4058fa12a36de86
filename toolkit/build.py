"""`toolkit build LINE`: a flash-attn wheel from its hash-pinned sdist, compiled by exactly the line's toolchain.

Flow: spec + lock -> toolchain (the locked conda prefix, or the machine's own for `external`) ->
fingerprint -> cache lookup -> preflight -> sdist (sha256-checked, cached) -> `pip wheel
--no-build-isolation --no-deps` with every knob set explicitly -> verify (local tag, compiled archs,
install + import) -> wheel and record into wheelhouse/<line>/ atomically -> PEP 503 index.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from toolkit import patches
from toolkit.archs import compiled_archs, missing_archs
from toolkit.atomic import Terminated, write_atomic
from toolkit.build_record import BuildOutputs, BuildRecord, ObjectTime, SdistPin
from toolkit.diagnose import explain, explain_file
from toolkit.digest import sha256_file
from toolkit.download import fetch_verified
from toolkit.errors import ToolkitError
from toolkit.fingerprint import Fingerprint, cuda_include_dirs, probe
from toolkit.knowledge import arch_number, minor_of
from toolkit.lock import LockedEnv, LockedSdist, read_lock, stale_reason
from toolkit.preflight import preflight_input, run_preflight
from toolkit.rules import checked_spec
from toolkit.spec import EnvSpec, display_path, resolve_spec_arg
from toolkit.wheelhouse import find_cached, inputs_key, place, record_path_for, records, write_index
from toolkit.workspace import Workspace, add_workspace_options

# Inside compiled objects the temporary build directory is renamed to this, so wheels built in
# different directories are byte-identical (gcc's -ffile-prefix-map, for host code and nvcc's host pass).
BUILD_DIR_ALIAS = "/fa-envkit-build"
# Bump when the build recipe (environment, flags) changes: cached wheels of the old recipe are rebuilt.
RECIPE_VERSION = 2
# Variables of an activated conda env that would change the compile behind the toolkit's back. conda-forge's
# cuda-nvcc activate.sh exports NVCC_PREPEND_FLAGS="... -ccbin=${CXX}" and torch adds its own -ccbin: nvcc 13.0
# warns "incompatible redefinition for option 'compiler-bindir', the last value of this option was used" (so
# flag order picks the host compiler). The build removes (or overrides) them; the record keeps what it removed.
NEUTRALISED_VARIABLES = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
NINJA_STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]\s")
ARCH_ARG = re.compile(r"\d{2,3}[af]?")


@dataclass(frozen=True)
class BuildToolchain:
    """The concrete compilers and interpreter one build uses."""

    kind: str  # locked | external
    cuda_home: Path
    python: Path
    cxx: Path | None
    cc: Path | None
    path_env: str  # PATH for the build: the toolchain's bin directories first


@dataclass(frozen=True)
class Parallelism:
    jobs: int  # ninja -j (MAX_JOBS)
    nvcc_threads: int  # threads inside one nvcc, one per -gencode target (NVCC_THREADS)
    cpus: int
    mem_gb: float  # the memory the build is sized against
    gb_per_nvcc_thread: float
    basis: str  # how the numbers were chosen, for the log and the record


@dataclass(frozen=True)
class BuildOptions:
    wheelhouse: Path = Workspace.wheelhouse
    cache: Path | None = None  # None: Workspace().cache ($TOOLKIT_CACHE or .cache)
    prefix: Path | None = None  # locked toolchain's conda prefix (default .envs/<line>)
    arch: str | None = None  # "native", "80,90" or None (the spec's archs)
    jobs: int | None = None
    nvcc_threads: int | None = None
    mem_gb: float | None = None
    force: bool = False
    keep_build_dir: bool = False
    install: bool = True
    install_target: Path | None = None
    order_from: Path | None = None  # a build record whose object times order this build (default: the newest)


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    record_path: Path
    record: BuildRecord
    cached: bool


# ---------------------------------------------------------------- inputs


def fetch_sdist(sdist: LockedSdist, cache: Path) -> Path:
    """The locked sdist from .cache/sdist/<sha256>/<filename>, downloading it only when absent
    (toolkit/download.py: the hash-verified cache that conda archives use too)."""
    return fetch_verified(sdist, Path(cache) / "sdist", f"flash-attn sdist {sdist.filename}")


def extract_sdist(sdist: Path, dest: Path) -> tuple[Path, int]:
    """Unpack into dest; returns the source tree and its newest file time (the SOURCE_DATE_EPOCH)."""
    try:
        with tarfile.open(sdist) as tar:
            members = tar.getmembers()
            tops = {m.name.split("/")[0] for m in members}
            if len(tops) != 1:
                raise ToolkitError(f"{display_path(sdist)}: not an sdist (expected one top directory, found "
                                   f"{len(tops)}; re-lock)")
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise ToolkitError(f"{display_path(sdist)}: cannot unpack ({exc}; delete it and re-run)") from None
    return dest / tops.pop(), int(max(m.mtime for m in members))


def resolve_toolchain(spec: EnvSpec, prefix: Path | None) -> BuildToolchain:
    """Locked: everything from the installed conda prefix. External: the paths the spec names."""
    if spec.toolchain.kind == "external":
        if not (spec.toolchain.cuda_home and spec.toolchain.python_executable):  # load_spec requires both
            raise ToolkitError(f"{spec.where('toolchain')}: an external toolchain needs cuda_home and python_executable")
        cuda_home = Path(spec.toolchain.cuda_home)
        python = Path(spec.toolchain.python_executable)
        path_env = os.pathsep.join([str(cuda_home / "bin"), str(python.parent), os.environ.get("PATH", "")])
        cxx, cc = shutil.which("g++", path=path_env), shutil.which("gcc", path=path_env)
        return BuildToolchain("external", cuda_home, python, Path(cxx) if cxx else None, Path(cc) if cc else None,
                              path_env)
    root = Path(prefix or Workspace().prefix(spec.line)).absolute()
    python = root / "bin" / "python"
    if not python.exists():
        raise ToolkitError(f"{display_path(root)}: no installed environment for {spec.line} "
                           f"(run `toolkit install {spec.line}` first, or pass --prefix)")
    bindir = root / "bin"

    def compiler(name: str) -> Path | None:
        """conda's gxx/gcc packages install g++/gcc or only the triplet-prefixed name."""
        return next((p for p in [bindir / name, *sorted(bindir.glob(f"*-conda-linux-gnu-{name}"))] if p.exists()),
                    None)

    return BuildToolchain("locked", root, python, compiler("g++"), compiler("gcc"),
                          os.pathsep.join([str(bindir), os.environ.get("PATH", "")]))


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


def include_environment(cuda_home: Path) -> dict[str, str]:
    """CPATH with the toolchain's header directories. conda-forge installs every CUDA header only under
    $PREFIX/targets/<triple>/include (pytorch/pytorch#144690), which torch's cpp_extension does not add:
    include_paths() of torch 2.0-2.14 gives g++ $CUDA_HOME/include (and, from about 2.4, one $CUDA_INC_PATH).
    gcc reads CPATH whatever the command line says, so g++ (and nvcc's host pass) see the headers under every
    torch release; it is searched after every -I, like -I. CUDA 13 keeps libcu++/CUB/Thrust in include/cccl,
    which nvcc.profile adds for nvcc only (cuda_fp16.h includes <nv/target>)."""
    dirs = [d for include in cuda_include_dirs(cuda_home) for d in (include, include / "cccl") if d.is_dir()]
    return {"CPATH": os.pathsep.join(str(d) for d in dirs)} if dirs else {}


def neutralised(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The caller's NEUTRALISED_VARIABLES that the build removes or overrides (for the record)."""
    return {name: environ[name] for name in NEUTRALISED_VARIABLES
            if name in environ and environ[name] != env.get(name)}


def process_environment(environ: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The build process's environment: the caller's without NEUTRALISED_VARIABLES, then the build's own."""
    return {**{k: v for k, v in environ.items() if k not in NEUTRALISED_VARIABLES}, **env}


def build_environment(tc: BuildToolchain, archs: tuple[str, ...], par: Parallelism, local: str, epoch: int,
                      build_dir: Path) -> dict[str, str]:
    """Every variable the build sees on top of the caller's environment, each set for a reason."""
    prefix_map = f"-ffile-prefix-map={build_dir}={BUILD_DIR_ALIAS}"
    env = {
        **include_environment(tc.cuda_home),
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
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }
    if tc.cc:
        env["CC"] = str(tc.cc)  # torch passes it to nvcc as -ccbin
    if tc.cxx:
        env["CXX"] = str(tc.cxx)
    return env


def keyed_inputs(spec: EnvSpec, lock_sha256: str, tc: BuildToolchain, fp: Fingerprint,
                 archs: tuple[str, ...]) -> dict:
    """What determines the wheel's bytes, known without reading the lock (so a cache hit stays fast):
    the lock's sha256 pins the sdist; the environment follows from these, and jobs/threads change only
    the speed, so neither is part of the key; nor are file paths (the same inputs from another
    working directory are the same build)."""
    torch = fp.torch
    return {
        "recipe": RECIPE_VERSION,
        "line": spec.line,
        "spec_input_hash": spec.input_hash(),
        "lock_sha256": lock_sha256,
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


def _stop(proc: subprocess.Popen) -> None:
    """Stop pip and every compiler it started (they share its process group)."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, console: Console) -> int:
    """Run the build with its full output in log_path and a live [n/N] bar (plain lines when not a TTY)."""
    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    next_report = 0.0
    with open(log_path, "w", buffering=1) as log, Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("compile", total=None)
        log.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=cwd, env=process_environment(dict(os.environ), env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                start_new_session=True, umask=0o022)
        try:
            assert proc.stdout is not None  # stdout=PIPE
            for line in proc.stdout:
                log.write(line)
                step = NINJA_STEP.match(line)
                if step:
                    done, total = int(step.group(1)), int(step.group(2))
                    progress.update(task, completed=done, total=total)
                    if not console.is_terminal and done / total >= next_report:
                        console.print(f"[{done}/{total}] {progress.tasks[0].elapsed:.0f} s")
                        next_report = done / total + 0.1
            return proc.wait()
        except BaseException:
            _stop(proc)
            raise


def ninja_objects(src_dir: Path) -> list[dict]:
    """Per-object compile times from ninja's .ninja_log (start/end ms since the build started)."""
    objects = []
    for log in src_dir.glob("build/**/.ninja_log"):
        for row in log.read_text().splitlines():
            fields = row.split("\t")
            if len(fields) >= 4 and fields[3].endswith(".o"):
                start, end = int(fields[0]), int(fields[1])
                objects.append({"name": Path(fields[3]).name, "start_s": start / 1000, "seconds": (end - start) / 1000})
    return sorted(objects, key=lambda o: o["start_s"])


# ---------------------------------------------------------------- build.ninja: reproducible device code, longest first
#
# torch writes build.ninja and runs `ninja` from PATH; a small `ninja` placed first on the build's PATH
# rewrites that manifest before running the real one, for two reasons:
#
# Reproducible device code. nvcc names internal-linkage device symbols (anonymous namespaces, the
# cuda::std customisation points every flash-attn kernel pulls in) `_INTERNAL_<hash of the source's
# absolute path>_..._<random>`, inside the fatbinary where -ffile-prefix-map does not reach: two builds
# of flash-attn 2.8.3.post2 differed in 1026 bytes of one object. Each CUDA compile edge gets its own
# `-frandom-seed` (nvcc's documented option; "users are responsible for assigning different seed to
# different files") and the source path under BUILD_DIR_ALIAS as the name cudafe++ and cicc hash
# (`--orig_src_path_name`, the value nvcc itself passes them, given again so the later one wins).
#
# Longest first. ninja 1.12/1.13 do not read durations from .ninja_log for scheduling:
# EdgeWeightHeuristic (src/build.cc) weighs every non-phony edge 1 (the log feeds only the ETA), and among
# ready edges of equal critical-path weight the lowest edge id, i.e. the earliest `build` line, starts
# first (EdgePriorityLess, src/graph.h). So with an earlier record's object times, the object lines are
# sorted longest first. The link line keeps its own object order, so the wheel's bytes do not change.

BUILD_EDGE = re.compile(r"^build ((?:[^\s:$]|\$.)+):\s*(\S+)\s+((?:[^\s$|]|\$.)+)")  # output, rule, first input
NVCC_RULE_COMMAND = re.compile(r"^\s+command\s*=\s*\$nvcc\b")


@dataclass(frozen=True)
class ManifestPlan:
    """What the ninja shim does to build.ninja: the build directory's alias and the objects' times."""

    build_dir: str
    object_seconds: dict[str, float]  # empty: no earlier record, file order


def previous_object_times(candidates: list[tuple[Path, BuildRecord]],
                          sdist_sha256: str) -> tuple[Path, dict[str, float]] | None:
    """Per-object compile seconds of the first of these records that built the same sdist, with its path."""
    for path, record in candidates:
        objects = record.outputs.objects
        if record.sdist.sha256 == sdist_sha256 and objects:
            return path, {o.name: o.seconds for o in objects}
    return None


def schedule_candidates(order_from: Path | None, line_dir: Path) -> list[tuple[Path, BuildRecord]]:
    """The record named by --order-from (a committed one, on a fresh machine), else the line's, newest first."""
    if order_from:
        if not order_from.is_file():
            raise ToolkitError(f"{display_path(order_from)}: no such build record (--order-from takes a "
                               f"wheelhouse/LINE/*.build.json file)")
        return [(order_from, BuildRecord.read(order_from))]
    return records(line_dir) if line_dir.is_dir() else []


def _unescape(ninja_path: str) -> str:
    return re.sub(r"\$(.)", r"\1", ninja_path)


def _nvcc_rules(lines: list[str]) -> set[str]:
    """Rules whose command starts with $nvcc (torch's cuda_compile)."""
    rules, current = set(), None
    for line in lines:
        if line.startswith("rule "):
            current = line.split()[1]
        elif current and NVCC_RULE_COMMAND.match(line):
            rules.add(current)
        elif line and not line[0].isspace():
            current = None
    return rules


def seeded_nvcc_binding(source: str, build_dir: str) -> str:
    """The edge binding that makes one CUDA object's device symbol names independent of path and run."""
    alias = BUILD_DIR_ALIAS + source[len(build_dir):] if source.startswith(build_dir + "/") else source
    quoted = shlex.quote(alias).replace("$", "$$")
    return f"  nvcc = $nvcc -frandom-seed={quoted} -Xcudafe --orig_src_path_name={quoted} " \
           f"-Xcicc --orig_src_path_name={quoted}"


def prepared_manifest(manifest: str, plan: ManifestPlan) -> tuple[str, int, int]:
    """build.ninja with every CUDA compile seeded and the timed object lines longest first, within the
    lines they held; with the number of each."""
    lines = manifest.split("\n")
    nvcc_rules = _nvcc_rules(lines)
    seeded, timed = 0, []  # timed: (line index, edge text with its binding, seconds) of the edges that may move
    for i, line in enumerate(lines):
        match = BUILD_EDGE.match(line)
        if not match:
            continue
        own_bindings = i + 1 < len(lines) and lines[i + 1][:1].isspace()  # they would not move with it
        if match.group(2) in nvcc_rules and match.group(1).endswith(".o"):
            lines[i] = f"{line}\n{seeded_nvcc_binding(_unescape(match.group(3)), plan.build_dir)}"
            seeded += 1
        seconds = plan.object_seconds.get(Path(_unescape(match.group(1))).name)
        if seconds is not None and not own_bindings:
            timed.append((i, lines[i], seconds))
    for (i, _, _), (_, text, _) in zip(timed, sorted(timed, key=lambda edge: -edge[2])):
        lines[i] = text
    return "\n".join(lines), seeded, len(timed)


def install_ninja_shim(shim_dir: Path, plan: ManifestPlan, path_env: str) -> bool:
    """Write shim_dir/ninja: prepares the manifest it is about to build (`-C DIR` or the working
    directory), then runs the real ninja from path_env. False (and nothing written) when there is none."""
    real = shutil.which("ninja", path=path_env)
    if real is None:
        return False
    shim_dir.mkdir(parents=True, exist_ok=True)
    plan_file = shim_dir / "manifest-plan.json"
    plan_file.write_text(json.dumps(asdict(plan), indent=1, sort_keys=True))
    toolkit_root = str(Path(__file__).resolve().parent.parent)  # importable whatever the build's PYTHONPATH
    prepare = (f"import sys; sys.path.insert(0, {toolkit_root!r}); "
               "from toolkit.build import prepare_manifest; prepare_manifest(sys.argv[1:])")
    (shim_dir / "ninja").write_text(
        "#!/bin/sh\n# toolkit build: seed nvcc per object, longest objects first (toolkit/build.py)\n"
        f'case "$1" in --version) exec {shlex.quote(real)} "$@";; esac\n'
        f'{shlex.quote(sys.executable)} -c {shlex.quote(prepare)} {shlex.quote(str(plan_file))} "$@" '
        '|| echo "toolkit: could not prepare build.ninja; building it unchanged" >&2\n'
        f'exec {shlex.quote(real)} "$@"\n')
    (shim_dir / "ninja").chmod(0o755)
    return True


MANIFEST_OUTCOME = "manifest-outcome.json"


def manifest_outcome(shim_dir: Path) -> dict[str, int | None]:
    """What the shim did to build.ninja, for the record (None: it never ran or could not)."""
    path = shim_dir / MANIFEST_OUTCOME
    return json.loads(path.read_text()) if path.exists() else {"nvcc_objects_seeded": None, "edges_ordered": None}


def prepare_manifest(args: list[str]) -> None:
    """The shim's step: args are the plan file, then ninja's own arguments."""
    plan_file, ninja_args = Path(args[0]), args[1:]
    directory = ninja_args[ninja_args.index("-C") + 1] if "-C" in ninja_args[:-1] else "."
    manifest = Path(directory) / "build.ninja"
    if manifest.exists():
        plan = ManifestPlan(**json.loads(plan_file.read_text()))
        text, seeded, timed = prepared_manifest(manifest.read_text(), plan)
        write_atomic(manifest, text)
        write_atomic(plan_file.with_name(MANIFEST_OUTCOME),
                     json.dumps({"nvcc_objects_seeded": seeded, "edges_ordered": timed}))
        print(f"toolkit: {manifest}: {seeded} nvcc objects seeded for reproducible device code, "
              f"{timed} object edges ordered longest first (previous build's times)", flush=True)


def children_cpu_s() -> float:
    """CPU seconds of every finished child process of this one (and theirs: each waits for its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def efficiency(objects: list[dict], jobs: int, build_wall_s: float, cpu_s: float, cpus: int) -> dict:
    """How close the compile came to its lower bound max(sum of object times / job slots, longest object),
    and how busy the build kept the CPUs (its processes' CPU time / (wall x CPUs)).

    The first is the issue's figure; with more jobs than CPUs every object's time stretches and it flatters
    the build, so the CPU figure is the one that cannot be gamed."""
    busy = {"cpus": cpus, "cpu_s": round(cpu_s, 1),
            "cpu_utilization": round(cpu_s / (build_wall_s * cpus), 3) if build_wall_s else None}
    if not objects:
        return {"objects": 0, "build_wall_s": round(build_wall_s, 1), **busy}
    compile_wall = max(o["start_s"] + o["seconds"] for o in objects) - min(o["start_s"] for o in objects)
    total = sum(o["seconds"] for o in objects)
    longest = max(objects, key=lambda o: o["seconds"])
    slot_bound = total / jobs
    return {
        "objects": len(objects),
        "build_wall_s": round(build_wall_s, 1),
        "compile_wall_s": round(compile_wall, 1),
        "sum_object_s": round(total, 1),
        "job_slots": jobs,
        "slot_bound_s": round(slot_bound, 1),
        "longest_object": longest["name"],
        "longest_object_s": round(longest["seconds"], 1),
        "efficiency_vs_slots": round(slot_bound / compile_wall, 3) if compile_wall else None,
        "efficiency_vs_longest": round(longest["seconds"] / compile_wall, 3) if compile_wall else None,
        "parallel_efficiency": round(max(slot_bound, longest["seconds"]) / compile_wall, 3) if compile_wall else None,
        **busy,
    }


# ---------------------------------------------------------------- verifying the wheel


def wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        match = re.search(r"^Version: (\S+)", zf.read(name).decode(), re.M)
    return match.group(1) if match else ""


def wheel_archs(wheel: Path, scratch: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Top-level extension modules of the wheel, and the archs compiled into each of its .so files."""
    archs: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as zf:
        libraries = [n for n in zf.namelist() if n.endswith(".so") or ".so." in n]
        for name in libraries:
            path = Path(zf.extract(name, scratch))
            archs[name] = sorted(compiled_archs(path))
    modules = [n.split(".")[0] for n in libraries if "/" not in n]
    return modules, archs


def verify_wheel(wheel: Path, archs: tuple[str, ...], local: str, scratch: Path,
                 log_path: Path) -> tuple[str, list[str], dict[str, list[str]]]:
    """The wheel's version carries the local tag and its .so files hold a cubin for every requested arch."""
    version = wheel_version(wheel)
    if not version.endswith("+" + local):
        raise ToolkitError(f"{wheel.name}: METADATA says version {version}, without +{local} "
                           f"(the sdist's setup.py ignored FLASH_ATTN_LOCAL_VERSION)")
    modules, so_archs = wheel_archs(wheel, scratch)
    lacking = missing_archs(archs, {a for found in so_archs.values() for a in found})
    if lacking:
        raise ToolkitError(f"{wheel.name}: no sm_{', sm_'.join(lacking)} code in {', '.join(so_archs) or 'any .so'} "
                           f"(nvcc skipped them: check `toolkit explain {display_path(log_path)}`)")
    return version, modules, so_archs


def install_and_import(tc: BuildToolchain, wheel: Path, modules: list[str], target: Path | None,
                       log_path: Path) -> None:
    """Install the wheel into the environment (or --install-target) and import its extension modules."""
    cmd = [str(tc.python), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)]
    if target:
        cmd += ["--target", str(target), "--upgrade"]
    elif tc.kind == "locked":
        cmd += ["--prefix", str(tc.cuda_home)]  # the conda prefix is the environment, whatever python it runs
    code = ("import importlib, importlib.util, sys\n"
            "if importlib.util.find_spec('torch'): import torch  # extensions resolve c10/at symbols from it\n"
            "for name in sys.argv[1:]: importlib.import_module(name)\n")
    env = {**os.environ, "PATH": tc.path_env, "LC_ALL": "C", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if target:
        env["PYTHONPATH"] = str(target)
    with tempfile.TemporaryDirectory() as neutral:  # not the source tree: it would shadow the installed module
        for step, command in (("install", cmd), ("import", [str(tc.python), "-c", code, *modules])):
            done = subprocess.run(command, cwd=neutral, env=env, capture_output=True, text=True, errors="replace")
            with open(log_path, "a") as log:
                log.write(f"\n$ {' '.join(command)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                raise ToolkitError(f"{wheel.name}: {step} in {tc.python} failed: {explain(done.stdout + done.stderr)} "
                                   f"(full output in {display_path(log_path)})")


# ---------------------------------------------------------------- the build


def build(spec: EnvSpec, lock_file: Path, options: BuildOptions, console: Console) -> BuildResult:
    """Build (or find in the cache) the wheel for one line; see the module docstring for the steps."""
    cache = options.cache or Workspace().cache
    line_dir = Workspace(wheelhouse=options.wheelhouse).wheel_dir(spec.line)
    tc = resolve_toolchain(spec, options.prefix)
    build_parent = cache / "build"
    build_parent.mkdir(parents=True, exist_ok=True)
    fp = probe(str(tc.cuda_home), str(tc.python), str(tc.cxx) if tc.cxx else None, tc.path_env, work_dir=build_parent)
    archs = resolve_archs(spec, options.arch, fp)
    if not lock_file.exists():
        raise ToolkitError(f"{display_path(lock_file)}: no lock file (run `toolkit lock {spec.line}` first)")
    inputs = keyed_inputs(spec, sha256_file(lock_file), tc, fp, archs)
    inputs.update(patches.key_inputs(spec))  # patches hook: each patch the build applies is part of the key
    key = inputs_key(inputs)
    if not options.force:
        hit = find_cached(line_dir, key)
        if hit:
            return BuildResult(hit.wheel, hit.record_path, hit.record, cached=True)

    mem_gb = options.mem_gb or fp.mem_available_gb
    compile_env = process_environment(dict(os.environ), {**include_environment(tc.cuda_home), "PATH": tc.path_env,
                                                         "LC_ALL": "C"})
    run_preflight(preflight_input(spec, fp, archs, mem_gb, build_parent, compile_env))
    locked = read_current_lock(spec, lock_file)
    sdist = fetch_sdist(locked.sdist, cache)
    par = size_parallelism(fp.cpus, mem_gb, spec.build.gb_per_nvcc_thread, spec.build.threads_per_cpu, len(archs),
                           options.jobs or spec.build.jobs, options.nvcc_threads or spec.build.nvcc_threads)
    if par.jobs * par.nvcc_threads * par.gb_per_nvcc_thread > mem_gb:
        console.print(f"warning: {par.jobs} jobs x {par.nvcc_threads} threads may need more than {mem_gb:.0f} GB "
                      f"(about {par.gb_per_nvcc_thread:g} GB per nvcc thread): the OOM killer may stop the build")
    (line_dir / "logs").mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    log_path = line_dir / "logs" / f"build-{started.strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}.log"
    build_dir = Path(tempfile.mkdtemp(prefix=f"{spec.line}-", dir=build_parent)).absolute()
    try:
        src_dir, epoch = extract_sdist(sdist, build_dir)
        applied_patches = patches.apply(src_dir, spec, locked.sdist.sha256)  # patches hook (patches.yaml)
        known = setup_py_archs(src_dir)
        if known is not None and not set(archs) <= known:
            skipped = ", sm_".join(a for a in archs if a not in known)
            raise ToolkitError(f"{display_path(sdist)}: its setup.py compiles only "
                               f"sm_{', sm_'.join(sorted(known, key=arch_number))} and would skip sm_{skipped} "
                               f"silently (drop them from archs / --arch)")
        env = build_environment(tc, archs, par, inputs["local_version"], epoch, build_dir)
        previous = previous_object_times(schedule_candidates(options.order_from, line_dir), locked.sdist.sha256)
        if options.order_from and previous is None:
            raise ToolkitError(f"{display_path(options.order_from)}: records no object times of "
                               f"{locked.sdist.filename}; it cannot order this build (drop --order-from)")
        shim_dir = build_dir / "schedule"
        plan = ManifestPlan(str(build_dir), previous[1] if previous else {})
        if not install_ninja_shim(shim_dir, plan, env["PATH"]):
            raise ToolkitError(f"{tc.path_env.split(os.pathsep)[0]}: no ninja on the build's PATH "
                               "(install ninja into the environment)")
        from_record = display_path(previous[0]) if previous else None
        out_dir = build_dir / "dist"
        cmd = [str(tc.python), "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-index",
               "--wheel-dir", str(out_dir), str(src_dir)]
        console.print(f"building {locked.sdist.filename} for {spec.line}: archs {', '.join(archs)}; {par.basis}")
        console.print(f"log: {display_path(log_path)}")
        if from_record:
            console.print(f"schedule: longest objects first, by the times in {from_record}")
        t0, cpu0 = time.monotonic(), children_cpu_s()
        run_env = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}"}
        rc = run_logged(cmd, run_env, build_dir, log_path, console)
        wall, cpu_s = time.monotonic() - t0, children_cpu_s() - cpu0
        if rc != 0:
            raise ToolkitError(f"{display_path(log_path)}: build failed (pip exit {rc}): "
                               f"{explain_file(log_path, (tc.cuda_home,))}")
        built = next(out_dir.glob("*.whl"), None)
        if built is None:
            raise ToolkitError(f"{display_path(log_path)}: pip reported success but wrote no wheel (see the log)")
        version, modules, so_archs = verify_wheel(built, archs, inputs["local_version"], build_dir / "verify", log_path)
        if options.install:
            install_and_import(tc, built, modules, options.install_target, log_path)
        objects = ninja_objects(src_dir)
        record = BuildRecord(
            inputs_key=key,
            inputs=inputs,
            files={"spec": display_path(spec.path), "lock": display_path(lock_file)},
            sdist=SdistPin(filename=locked.sdist.filename, sha256=locked.sdist.sha256, url=locked.sdist.url),
            patches=[asdict(p) for p in applied_patches],  # patches hook: file, sha256, applied
            environment=env,
            neutralised_environment=neutralised(dict(os.environ), env),
            parallelism={"jobs": par.jobs, "nvcc_threads": par.nvcc_threads, "cpus": par.cpus,
                         "mem_gb": round(par.mem_gb, 1), "gb_per_nvcc_thread": par.gb_per_nvcc_thread,
                         "basis": par.basis},
            schedule={"from_record": from_record, **manifest_outcome(shim_dir)},
            outputs=BuildOutputs(
                wheel=built.name, version=version, wheel_sha256=sha256_file(built),
                wheel_size=built.stat().st_size, modules=modules, archs_compiled=so_archs,
                imported=options.install, wall_s=round(wall, 1),
                efficiency=efficiency(objects, par.jobs, wall, cpu_s, par.cpus),
                objects=[ObjectTime(**o) for o in objects]),
            fingerprint=fp.to_dict(),
            log=display_path(log_path),
            started=started.isoformat(timespec="seconds"),
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        wheel = place(built, line_dir, record)
        write_index(options.wheelhouse)
        return BuildResult(wheel, record_path_for(wheel), record, cached=False)
    finally:
        if options.keep_build_dir:
            console.print(f"build directory kept: {display_path(build_dir)}")
        else:
            shutil.rmtree(build_dir, ignore_errors=True)


# ---------------------------------------------------------------- CLI


def describe(record: BuildRecord) -> list[str]:
    """The build figures of a record, for the end of a build and `--report`."""
    out = record.outputs
    eff = out.efficiency
    lines = [f"wheel: {out.wheel} ({out.wheel_size / 1e6:.1f} MB, sha256 {out.wheel_sha256[:16]}...)",
             f"archs compiled: {', '.join(sorted({a for v in out.archs_compiled.values() for a in v}))}; "
             f"{record.parallelism['basis']}"]
    if eff.get("objects"):
        lines.append(
            f"build {eff['build_wall_s']} s, compile {eff['compile_wall_s']} s for {eff['objects']} objects; "
            f"bound by slots {eff['slot_bound_s']} s (sum {eff['sum_object_s']} s / {eff['job_slots']} jobs), "
            f"longest object {eff['longest_object_s']} s ({eff['longest_object']}); "
            f"parallel efficiency {eff['parallel_efficiency']:.0%} "
            f"(vs slots {eff['efficiency_vs_slots']:.0%}, vs longest {eff['efficiency_vs_longest']:.0%})")
    if eff.get("cpu_utilization") is not None:
        lines.append(f"CPU time {eff['cpu_s']} s over {eff['build_wall_s']} s x {eff['cpus']} CPUs: "
                     f"{eff['cpu_utilization']:.0%} busy")
    return lines


def cmd_build(args: argparse.Namespace) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    workspace = Workspace.from_args(args)
    spec = checked_spec(resolve_spec_arg(args.line, workspace.envs))
    if args.report:
        line_dir = workspace.wheel_dir(spec.line)
        found = records(line_dir) if line_dir.is_dir() else []
        if not found:
            raise ToolkitError(f"{display_path(line_dir)}: no build records (run `toolkit build {spec.line}` first)")
        path, record = found[0]
        print(f"{display_path(path)}:")
        for text in describe(record):
            print(f"  {text}")
        return 0
    options = BuildOptions(wheelhouse=workspace.wheelhouse, prefix=args.prefix, arch=args.arch, jobs=args.jobs,
                           nvcc_threads=args.nvcc_threads, mem_gb=args.mem_gb, force=args.force,
                           keep_build_dir=args.keep_build_dir, install=not args.no_install,
                           install_target=args.install_target, order_from=args.order_from)
    t0 = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = build(spec, workspace.lock_file(spec.line), options, console)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.cached:
        print(f"cached: {display_path(result.wheel)} (same inputs, sha256 verified, {time.monotonic() - t0:.2f} s; "
              f"--force rebuilds)")
    else:
        print(f"built: {display_path(result.wheel)}")
        for text in describe(result.record):
            print(f"  {text}")
        print(f"  record: {display_path(result.record_path)}; index: "
              f"{(workspace.wheelhouse / 'simple').absolute().as_uri()}")
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a killed nox session, a batch scheduler) unwinds like Ctrl-C: pip's group is stopped."""
    raise Terminated()


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
    parser.add_argument("line", help="line name (cu126) or spec file")
    add_workspace_options(parser)
    parser.add_argument("--prefix", type=Path, help="installed environment of a locked line (default: .envs/LINE)")
    parser.add_argument("--arch", help="archs to compile: `native` (the GPUs present) or a list like 80,90 "
                                       "(default: the spec's archs)")
    parser.add_argument("--jobs", type=_positive_int, help="parallel compile jobs (MAX_JOBS; default: sized)")
    parser.add_argument("--nvcc-threads", type=_positive_int, help="threads per nvcc (NVCC_THREADS; default: sized)")
    parser.add_argument("--mem-gb", type=_positive_float,
                        help="memory to size jobs against (default: MemAvailable; machines that grow memory "
                             "on demand show less than they have)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached wheel matches")
    parser.add_argument("--keep-build-dir", action="store_true", help="keep the unpacked sdist and objects")
    parser.add_argument("--no-install", action="store_true", help="do not install and import the built wheel")
    parser.add_argument("--install-target", type=Path, help="install into this directory (pip --target) instead")
    parser.add_argument("--order-from", type=Path, metavar="RECORD",
                        help="start objects longest first by the times in this build record of the same sdist "
                             "(default: the newest record in wheelhouse/LINE/)")
    parser.add_argument("--report", action="store_true", help="print the newest build record's figures and exit")
    parser.set_defaults(func=cmd_build)

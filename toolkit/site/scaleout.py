"""`toolkit matrix run`: every selected line's lock -> install -> build -> verify, fanned out as batch jobs.

The plan becomes readable batch scripts in runs/<timestamp>/ (one job array for the builds, one job per
line for its verification, after its build). The same scripts run on Slurm (sbatch, dependencies
`afterok`) or on this machine (bash, a few at a time), so an admin can read and re-submit what ran.
Each script writes a status file per line and phase; the waiting side reads those plus `squeue`
(no accounting database needed) and ends with one summary table and summary.json.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from toolkit.base.atomic import write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.children import kill_group, popen_tied, run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace
from toolkit.build.wheelhouse import records
from toolkit.knowledge import files as knowledge_files
from toolkit.spec.envspec import EnvSpec

if TYPE_CHECKING:  # rich's table is imported where the progress is drawn
    from rich.table import Table

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_STAGES = TEMPLATES / "matrix-stages.yaml"
MAX_STAGES_BYTES = (
    64 * 1024
)  # a stages file is a few lines; /dev/zero or a FIFO given to --stages is refused
SLURM_STATES = Path(__file__).parents[1] / "knowledge" / "slurm_job_states.yaml"
LINE_LOCKS = (
    DEFAULT.line_locks
)  # <line>.lock: one job per line at a time (see matrix-stage-functions.sh)
HEADROOM_GB = 2  # python, pip and the linker beside the nvcc processes
LOST_GRACE_S = (
    10.0  # a job squeue calls ended may take this long to show its status on a shared filesystem
)
SQUEUE_PATIENCE_S = 60.0  # squeue failing this long in a row means the controller is gone
EXECUTORS = ("slurm", "local")
VERIFY_MODES = ("always", "if-gpu", "never")
PHASES = ("build", "verify")
PLACEHOLDERS = ("python", "line", "spec", "jobs", "nvcc_threads", "sizing", "workspace")
BATCH_CPUS, BATCH_NVCC_THREADS = (
    8,
    2,
)  # a batch job's build sizing for `auto` lines without --cpus/--nvcc-threads
FINAL_STATES = ("done", "failed", "skipped", "not run")
KINDS = (None, "locked", "external")  # a stage's `toolchain:` condition (None: every line)

# What may reach an `#SBATCH` line. To bash (which runs the same script locally and on the node) those
# lines are comments, so a newline in a value would start a command; none of these admits a newline,
# space, quote, backslash, $ or backtick (as toolkit.site.modules.SAFE does for modulefiles). Forms: sbatch(1).
SLURM_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
SLURM_GRES = r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*"
SITE_VALUES = {
    "partition": (
        rf"{SLURM_NAME}(,{SLURM_NAME})*",
        "partition names (letters, digits, ._+-; comma-separated)",
    ),
    "account": (SLURM_NAME, "an account name (letters, digits, ._+-)"),
    "time": (
        r"(\d+-)?\d+(:\d+){0,2}|(?i:unlimited|infinite)",
        "a Slurm time limit (MINUTES, HH:MM:SS, D-HH[:MM[:SS]] or UNLIMITED)",
    ),
    "gres": (rf"({SLURM_GRES}(,{SLURM_GRES})*)?", "a gres list like gpu:1 or gpu:a100:2"),
}
SITE_OPTIONS = {
    "partition": "partition",
    "verify_partition": "partition",
    "account": "account",
    "time": "time",
    "verify_time": "time",
    "gres": "gres",
}
SBATCH_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(=[A-Za-z0-9_.,:/@%+=&|!*^~-]+)?")
# sbatch options the scripts set themselves (the machinery depends on them) or that have their own flag.
OWN_SBATCH_OPTIONS = {
    "array": None,
    "chdir": None,
    "output": None,
    "error": None,
    "wrap": None,
    "dependency": None,
    "parsable": None,
    "kill-on-invalid-dep": None,
    "job-name": None,
    "cpus-per-task": None,
    "mem": None,
    "partition": "--partition",
    "account": "--account",
    "time": "--time",
    "gres": "--gres",
    "nodes": "--nodes",
}


# ---------------------------------------------------------------- plan


@dataclass(frozen=True)
class RunOptions:
    """What `toolkit matrix run` was asked for (the CLI's flags; defaults shown in --help)."""

    executor: str = "slurm"
    verify: str = "if-gpu"
    stages: Path = DEFAULT_STAGES
    runs_dir: Path = Workspace.runs
    cpus: int | None = (
        None  # build jobs for a line whose build.jobs is auto (None: BATCH_CPUS; local: sized)
    )
    nvcc_threads: int | None = None  # for a line whose build.nvcc_threads is auto (None: as cpus)
    verify_cpus: int = 4
    verify_mem_gb: float = 32
    gres: str = "gpu:1"
    partition: str | None = None
    verify_partition: str | None = None
    account: str | None = None
    time: str | None = None
    verify_time: str | None = None
    sbatch: tuple[str, ...] = ()  # more sbatch options for every job
    max_parallel: int = 1
    poll: float = 0.5
    # each build over this many nodes, its compiles job steps (`toolkit build --slurm`); None: one node, no steps
    nodes: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "cpus",
            "nvcc_threads",
            "nodes",
            "verify_cpus",
            "verify_mem_gb",
            "max_parallel",
            "poll",
        ):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ToolkitError(
                    f"toolkit matrix run: --{name.replace('_', '-')} must be positive, "
                    f"got {getattr(self, name)}"
                )
        for name, kind in SITE_OPTIONS.items():
            check_site_value(name, getattr(self, name), kind)
        for option in self.sbatch:
            check_sbatch_option(option)
        if self.nodes is not None and self.executor != "slurm":
            raise ToolkitError(
                f"toolkit matrix run: --nodes {self.nodes}: a build spreads over the nodes of a Slurm "
                f"allocation, which --executor {self.executor} has none of (use --executor slurm, or leave "
                "--nodes out)"
            )


def check_site_value(name: str, value: str | None, kind: str) -> None:
    """A site option (--account, --time, ...) that is safe on an `#SBATCH` line, or a one-line refusal."""
    pattern, what = SITE_VALUES[kind]
    if value is not None and not re.fullmatch(pattern, value):
        raise ToolkitError(
            f"toolkit matrix run: --{name.replace('_', '-')}: {value!r} is not {what} "
            "(it is written into the batch scripts; fix the value)"
        )


def check_sbatch_option(option: str) -> None:
    """--sbatch takes `--name` or `--name=value` with a plain value; not an option the scripts set themselves."""
    match = (
        SBATCH_OPTION.fullmatch(option) if isinstance(option, str) else None
    )  # argparse makes `--sbatch=--` []
    if not match:
        raise ToolkitError(
            f"toolkit matrix run: --sbatch: {option!r} is not one sbatch option written --name or "
            "--name=value (value of letters, digits and _.,:/@%+=&|!*^~-; no spaces, quotes, $ "
            "or newlines: it is written into the batch scripts), e.g. --sbatch=--qos=long"
        )
    if match.group(1) in OWN_SBATCH_OPTIONS:
        own = OWN_SBATCH_OPTIONS[match.group(1)]
        raise ToolkitError(
            f"toolkit matrix run: --sbatch: {option!r}: "
            + (
                f"use `toolkit matrix run {own}` instead"
                if own
                else "the batch scripts set this option themselves (from the build sizing and --cpus, "
                "--verify-cpus, --verify-mem-gb; leave it out)"
            )
        )


@dataclass(frozen=True)
class Stage:
    name: str
    command: str  # bash, placeholders already filled in


@dataclass(frozen=True)
class StageTemplate:
    command: str  # bash with {placeholders}
    toolchain: str | None = None  # run only for lines whose toolchain.kind is this


@dataclass(frozen=True)
class StageTemplates:
    """The stages file: per phase, stage name -> command template."""

    path: Path
    build: dict[str, StageTemplate]
    verify: dict[str, StageTemplate]


@dataclass(frozen=True)
class Resources:
    cpus: int
    mem_mb: int


@dataclass(frozen=True)
class LinePlan:
    line: str
    task: int  # index in the build job array
    spec: str  # spec file as the stage commands name it
    jobs: int
    nvcc_threads: int
    build_resources: Resources
    build_stages: tuple[Stage, ...]
    verify_stages: tuple[Stage, ...]


@dataclass(frozen=True)
class MatrixPlan:
    run_dir: Path  # absolute: the scripts name it, and jobs may start in any directory
    workdir: Path  # the project directory the jobs run in
    command: str
    executor: str
    verify_mode: str
    lines: tuple[LinePlan, ...]
    build_resources: Resources  # the array's: the largest of the lines'
    verify_resources: Resources
    build_options: tuple[
        str, ...
    ]  # more `#SBATCH` options per phase: partition, account, time, gres, --sbatch
    verify_options: tuple[str, ...]
    workspace: Workspace = DEFAULT  # the folders the stages read and write, relative to workdir

    @property
    def verifies(self) -> bool:
        return self.verify_mode != "never"

    @property
    def build_script(self) -> Path:
        return self.run_dir / "build.sbatch"

    def verify_script(self, line: str) -> Path:
        return self.run_dir / f"verify-{line}.sbatch"

    def status_file(self, line: str, phase: str) -> Path:
        return self.run_dir / "status" / f"{line}.{phase}.json"

    def log_file(self, line: str, phase: str) -> Path:
        return self.run_dir / "logs" / f"{line}.{phase}.log"

    def tasks(self) -> list[tuple[str, str]]:
        """(line, phase) of every job this plan runs."""
        return [
            (p.line, phase)
            for p in self.lines
            for phase in PHASES
            if phase == "build" or self.verifies
        ]


def load_stage_templates(path: Path) -> StageTemplates:
    """Read and check a stages file, so a typo fails here and not an hour into a build."""
    where = display_path(path)
    try:
        data = yaml.safe_load(regular_file_bytes(Path(path), MAX_STAGES_BYTES))
    except Unreadable as exc:
        raise ToolkitError(
            {
                "missing": f"{where}: stages file not found (pass an existing file to --stages)",
                "error": f"{where}: cannot read the stages file ({exc.detail})",
                "special": f"{where}: not a regular file ({exc.detail}; pass a YAML stages file to --stages)",
                "large": f"{where}: larger than {MAX_STAGES_BYTES // 1024} KiB (a stages file is a few lines: is "
                f"this the right file?)",
            }[exc.why]
        ) from None
    except yaml.YAMLError as exc:
        raise ToolkitError(
            f"{where}: cannot read the stages file ({str(exc).splitlines()[0]})"
        ) from None
    if (
        not isinstance(data, dict)
        or set(data) - set(PHASES)
        or not isinstance(data.get("build"), dict)
    ):
        raise ToolkitError(
            f"{where}: expected a mapping with `build:` and optional `verify:`, each of "
            "stage name -> bash command (see toolkit/site/templates/matrix-stages.yaml)"
        )
    phases = {}
    for phase in PHASES:
        stages = data.get(phase) or {}
        if not isinstance(stages, dict):
            raise ToolkitError(
                f"{where}: {phase}: expected a mapping of stage name -> bash command"
            )
        phases[phase] = {
            str(name): stage_template(str(name), value, f"{where}: {phase}.{name}")
            for name, value in stages.items()
        }
    return StageTemplates(Path(path), phases["build"], phases["verify"])


def stage_template(name: str, value: object, where: str) -> StageTemplate:
    """`name: command`, or `name: {run: command, toolchain: locked|external}` for one kind of line only."""
    command, toolchain = value, None
    if (
        isinstance(value, dict)
        and set(value) <= {"run", "toolchain"}
        and value.get("toolchain") in KINDS
    ):
        command, toolchain = value.get("run"), value.get("toolchain")
    if (
        not re.fullmatch(r"[A-Za-z][\w-]*", name)
        or not isinstance(command, str)
        or not command.strip()
    ):
        raise ToolkitError(
            f"{where}: expected a stage name (letters, digits, - or _) mapped to a bash command, "
            f"or to {{run: COMMAND, toolchain: {' or '.join(k for k in KINDS if k)}}}"
        )
    fill_placeholders(command, {p: "" for p in PLACEHOLDERS}, where)
    return StageTemplate(command, toolchain)


def fill_placeholders(command: str, values: dict[str, str], where: str) -> str:
    try:
        return command.format_map(values)
    except (KeyError, ValueError, IndexError) as exc:
        allowed = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
        raise ToolkitError(
            f"{where}: bad placeholder ({exc}; allowed: {allowed}; write a literal brace "
            "as {{ or }})"
        ) from None


def build_sizing(spec: EnvSpec, options: RunOptions) -> tuple[int, int, Resources]:
    """(jobs, nvcc threads, resources) of one line's build: the spec's knobs, or the run's defaults for `auto`."""
    jobs = spec.build.jobs or options.cpus or BATCH_CPUS
    threads = spec.build.nvcc_threads or options.nvcc_threads or BATCH_NVCC_THREADS
    mem_gb = jobs * threads * spec.build.gb_per_nvcc_thread + HEADROOM_GB
    return jobs, threads, Resources(cpus=jobs, mem_mb=math.ceil(mem_gb * 1024))


def build_sizing_options(spec: EnvSpec, options: RunOptions, jobs: int, threads: int) -> str:
    """The build stage's --jobs/--nvcc-threads ({sizing}). A Slurm job's cpus and memory are derived from
    them, so the build must keep to them. A local build sizes itself from this machine's cores and
    MemAvailable, as `toolkit build` does (the batch defaults would run 8 x 2 nvcc threads on any laptop),
    and takes only what the run's --cpus / --nvcc-threads say."""
    if options.nodes is not None:  # the jobs are what the allocation's nodes hold side by side
        return f" --nvcc-threads={threads} --slurm"
    if options.executor != "local":
        return f" --jobs={jobs} --nvcc-threads={threads}"
    given = {
        "--jobs": None if spec.build.jobs else options.cpus,
        "--nvcc-threads": None if spec.build.nvcc_threads else options.nvcc_threads,
    }
    return "".join(f" {flag}={value}" for flag, value in given.items() if value)


def plan_line(
    task: int,
    spec: EnvSpec,
    options: RunOptions,
    stages: StageTemplates,
    workspace: Workspace = DEFAULT,
) -> LinePlan:
    jobs, threads, resources = build_sizing(spec, options)
    words = {
        "python": sys.executable,
        "line": spec.line,
        "spec": display_path(spec.path),
        "jobs": str(jobs),
        "nvcc_threads": str(threads),
    }
    values = {
        name: shlex.quote(word) for name, word in words.items()
    }  # each one shell word, whatever the path
    values["workspace"] = "".join(
        f" {shlex.quote(word)}" for word in workspace.options()
    )  # "" by default
    values["sizing"] = build_sizing_options(spec, options, jobs, threads)

    def filled(phase: str, templates: dict[str, StageTemplate]) -> tuple[Stage, ...]:
        where = f"{display_path(stages.path)}: {phase}"
        return tuple(
            Stage(name, fill_placeholders(t.command, values, f"{where}.{name}"))
            for name, t in templates.items()
            if t.toolchain in (None, spec.toolchain.kind)
        )

    return LinePlan(
        spec.line,
        task,
        words["spec"],
        jobs,
        threads,
        resources,
        filled("build", stages.build),
        filled("verify", stages.verify),
    )


def plan_matrix(
    specs: list[EnvSpec],
    options: RunOptions,
    verify_gres: str | None,
    command: str,
    workspace: Workspace = DEFAULT,
) -> MatrixPlan:
    """The whole run: per-line stages and resources, the array's resources, each phase's extra #SBATCH options."""
    if not specs:
        raise ToolkitError(
            "envs/: no lines selected (name some lines, or add envs/<line>.yaml files)"
        )
    for spec in specs:  # line names become shell words, file names and job names
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", spec.line):
            raise ToolkitError(
                f"{display_path(spec.path)}: line name {spec.line!r} has characters a batch script "
                "cannot carry (rename the file to letters, digits, '.', '-', '_')"
            )
    for path, what in [(s.path, "spec file") for s in specs] + [
        (options.stages, "--stages file"),
        (Path(sys.executable), "toolkit's interpreter"),
    ]:
        if re.search(
            r"[\x00-\x1f\x7f]", str(path)
        ):  # quoted, a newline is harmless, but not in `# Written by:`
            raise ToolkitError(
                f"{str(path)!r}: the {what}'s path has a control character (a newline?), which a "
                "batch script's comment line cannot carry (rename it)"
            )
    for folder in (Path.cwd(), Path(options.runs_dir).resolve()):
        if re.search(r"[\s'\"$`\\]", str(folder)):
            raise ToolkitError(
                f"{folder}: the path has spaces or quotes, which #SBATCH lines cannot carry "
                "(run from, and pass --runs-dir, a path without them)"
            )
    stages = load_stage_templates(options.stages)
    lines = tuple(
        plan_line(task, spec, options, stages, workspace) for task, spec in enumerate(specs)
    )
    array = Resources(
        cpus=max(p.build_resources.cpus for p in lines),
        mem_mb=max(p.build_resources.mem_mb for p in lines),
    )
    verify = Resources(cpus=options.verify_cpus, mem_mb=math.ceil(options.verify_mem_gb * 1024))

    def site_options(
        partition: str | None, time_limit: str | None, gres: str | None
    ) -> tuple[str, ...]:
        named = {
            "partition": partition,
            "account": options.account,
            "time": time_limit,
            "gres": gres,
        }
        return tuple(f"--{k}={v}" for k, v in named.items() if v) + tuple(options.sbatch)

    nodes = (f"--nodes={options.nodes}",) if options.nodes is not None else ()

    return MatrixPlan(
        run_dir=new_run_dir(options.runs_dir),
        workdir=Path.cwd().resolve(),
        command=command,
        executor=options.executor,
        verify_mode=options.verify,
        lines=lines,
        build_resources=array,
        verify_resources=verify,
        build_options=nodes + site_options(options.partition, options.time, None),
        verify_options=site_options(
            options.verify_partition or options.partition,
            options.verify_time or options.time,
            verify_gres,
        ),
        workspace=workspace,
    )


def new_run_dir(runs_dir: Path) -> Path:
    """runs/<timestamp>[-N]/, created now so two runs started in one second never share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 100):
        run_dir = (Path(runs_dir) / (stamp if attempt == 1 else f"{stamp}-{attempt}")).resolve()
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            continue
        except OSError as exc:
            raise ToolkitError(
                f"{display_path(run_dir)}: cannot create the run directory ({exc.strerror}; "
                "pass a writable --runs-dir)"
            ) from None
    raise ToolkitError(
        f"{display_path(Path(runs_dir))}: too many runs started this second (wait a second)"
    )


# ---------------------------------------------------------------- batch scripts


def render(template: str, values: dict[str, object]) -> str:
    """Fill the {{name}} slots of a template in toolkit/site/templates/ (every slot must be given)."""
    text = (TEMPLATES / template).read_text()
    return re.sub(r"\{\{(\w+)\}\}", lambda m: str(values[m.group(1)]), text)


def stage_lines(stages: tuple[Stage, ...], indent: str) -> str:
    return "\n".join(f"{indent}stage {s.name} {shlex.quote(s.command)}" for s in stages)


def common_slots(plan: MatrixPlan, script: Path, options: tuple[str, ...]) -> dict[str, object]:
    functions = render(
        "matrix-stage-functions.sh",
        {
            "status_dir": shlex.quote(str(plan.run_dir / "status")),
            "line_locks": shlex.quote(str(plan.workdir / LINE_LOCKS)),
        },
    )
    return {
        "run_name": plan.run_dir.name,
        "command": plan.command,
        "run_dir": plan.run_dir,
        "script": script,
        "workdir": plan.workdir,
        "site_options": "\n".join(f"#SBATCH {o}" for o in options),
        "stage_functions": functions.rstrip("\n"),
    }


def build_script_text(plan: MatrixPlan) -> str:
    cases = "\n".join(
        f"    {p.line})\n{stage_lines(p.build_stages, ' ' * 8)}\n        ;;" for p in plan.lines
    )
    return render(
        "matrix-build.sbatch",
        {
            **common_slots(plan, plan.build_script, plan.build_options),
            "task_list": " ".join(f"{p.task}={p.line}" for p in plan.lines),
            "headroom_gb": HEADROOM_GB,
            "last_task": len(plan.lines) - 1,
            "cpus": plan.build_resources.cpus,
            "mem_mb": plan.build_resources.mem_mb,
            "lines": " ".join(p.line for p in plan.lines),
            "line_stages": cases,
        },
    )


def verify_script_text(plan: MatrixPlan, line: LinePlan) -> str:
    script = plan.verify_script(line.line)
    return render(
        "matrix-verify.sbatch",
        {
            **common_slots(plan, script, plan.verify_options),
            "line": line.line,
            "task": line.task,
            "cpus": plan.verify_resources.cpus,
            "mem_mb": plan.verify_resources.mem_mb,
            "skip_without_gpu": "true" if plan.verify_mode == "if-gpu" else "false",
            "stages": stage_lines(line.verify_stages, ""),
        },
    )


def sbatch_args(script: Path, dependency: str | None = None) -> list[str]:
    return [
        "sbatch",
        "--parsable",
        *([f"--dependency={dependency}"] if dependency else []),
        str(script),
    ]


def submit_script_text(plan: MatrixPlan) -> str:
    """submit.sh: the sbatch commands of the run, in order, with the build array's id in $BUILD."""
    verify = []
    for p in plan.lines if plan.verifies else ():
        # "@BUILD@" survives shlex quoting unquoted, so it can become the shell's ${BUILD} afterwards
        command = shlex.join(sbatch_args(plan.verify_script(p.line), f"afterok:@BUILD@_{p.task}"))
        verify.append(f'echo "verify {p.line}: $({command.replace("@BUILD@", "${BUILD}")})"')
    return "\n".join(
        [
            "#!/bin/bash",
            f"# What `toolkit matrix run` submitted for run {plan.run_dir.name}, in this order.",
            f"# Re-submit the whole run: bash {shlex.quote(str(plan.run_dir / 'submit.sh'))}",
            "set -euo pipefail",
            f"BUILD=$({shlex.join(sbatch_args(plan.build_script))})",
            "BUILD=${BUILD%%;*}  # --parsable prints JOBID[;CLUSTER]",
            'echo "build array: $BUILD"',
            *verify,
            "",
        ]
    )


def write_run_dir(plan: MatrixPlan) -> None:
    """The scripts, plan.json and the empty logs/ and status/ folders the jobs write into."""
    try:
        for folder in (plan.run_dir / "logs", plan.run_dir / "status", plan.workdir / LINE_LOCKS):
            folder.mkdir(parents=True, exist_ok=True)
        write_atomic(
            plan.run_dir / "plan.json", json.dumps(asdict(plan), indent=2, default=str) + "\n"
        )
        write_atomic(plan.build_script, build_script_text(plan), 0o755)
        for line in plan.lines if plan.verifies else ():
            write_atomic(plan.verify_script(line.line), verify_script_text(plan, line), 0o755)
        write_atomic(
            plan.run_dir / "submit.sh", submit_script_text(plan), 0o755
        )  # for Slurm, even after a local run
    except OSError as exc:
        raise ToolkitError(
            f"{display_path(plan.run_dir)}: cannot write the run's scripts ({exc.strerror}; "
            "pass a writable --runs-dir)"
        ) from None


# ---------------------------------------------------------------- executors


@dataclass(frozen=True)
class Scheduled:
    """Where the scheduler has a job: queued, running or ended; with Slurm's state and reason, if any."""

    where: str
    slurm_state: str = ""
    reason: str = ""  # why a job waits: Dependency, Resources, Priority, ...


Task = tuple[str, str]  # (line, phase)


def run_command(args: list[str], fix: str) -> str:
    """stdout of a Slurm command; a missing one or a refusal (with `fix`) is one ToolkitError line."""
    try:
        done = run_tied(args, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ToolkitError(
            f"{args[0]}: not found on PATH (run on a Slurm login node, or use --executor local)"
        ) from None
    if done.returncode != 0:
        message = (
            done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
        ).splitlines()[-1]
        raise ToolkitError(f"{args[0]}: {message} ({fix})")
    return done.stdout


def cluster_gres_names() -> set[str]:
    """Generic resources (gpu, ...) some node of the cluster offers, from `sinfo -o %G`."""
    out = run_command(
        ["sinfo", "-h", "-o", "%G"],
        "is slurmctld up, and SLURM_CONF right? or use --executor local",
    )
    return {
        item.split(":")[0]
        for row in out.split()
        for item in row.split(",")
        if item and item != "(null)"
    }


def verification_gres(options: RunOptions) -> str | None:
    """The gres the verification jobs ask for; None when they run without one (and skip if no GPU is visible)."""
    if options.executor != "slurm":
        return None
    offered = (
        cluster_gres_names()
    )  # and so the cluster answers before anything is written or submitted
    if options.verify == "never" or not options.gres:
        return None
    name = options.gres.split(":")[0]
    if name in offered:
        return options.gres
    if options.verify == "if-gpu":
        return None
    raise ToolkitError(
        f"sinfo: no node of this cluster offers gres '{name}' for --gres {options.gres} "
        "(use --verify if-gpu to report 'skipped (no GPU)', --verify never, or --gres '' "
        "when a --verify-partition gives GPUs without gres)"
    )


@cache
def slurm_state_groups() -> dict[str, str]:
    return knowledge_files.typed(
        SLURM_STATES,
        lambda data: {
            state: where for where in ("queued", "running", "ended") for state in data[where]
        },
    )


class SlurmExecutor:
    """Submits the scripts with sbatch (verifications `afterok` their build task) and reads squeue."""

    def __init__(self, plan: MatrixPlan):
        self.plan = plan
        self.job_ids: dict[Task, str] = {}
        self.squeue_failing_since: float | None = None
        self.last_seen: dict[Task, Scheduled] = {}

    def start(self) -> None:
        build = self.submit(sbatch_args(self.plan.build_script))
        for p in self.plan.lines:
            self.job_ids[(p.line, "build")] = f"{build}_{p.task}"
        for p in self.plan.lines if self.plan.verifies else ():
            self.job_ids[(p.line, "verify")] = self.submit(
                sbatch_args(self.plan.verify_script(p.line), f"afterok:{build}_{p.task}")
            )

    def submit(self, args: list[str]) -> str:
        try:
            out = run_command(
                args,
                f"check the #SBATCH lines of {display_path(Path(args[-1]))} against the "
                "cluster: --cpus, --verify-cpus, --verify-mem-gb, --partition, --account, "
                "--time, --sbatch",
            )
        except ToolkitError:
            self.cancel()  # nothing half-submitted: no build array waits without its verifications
            raise
        return out.strip().split(";")[0]

    def submitted(self) -> list[str]:
        """The submitted job ids: the build array once, then each verification."""
        return sorted({job.split("_")[0] for job in self.job_ids.values()}, key=int)

    def cancel(self) -> None:
        if self.job_ids:
            run_tied(["scancel", *self.submitted()], capture_output=True, check=False)

    def describe(self) -> str:
        return f"Slurm jobs {', '.join(self.submitted())}"

    def detach(self) -> str:
        """After Ctrl-C: the jobs belong to the cluster now; say how to stop them."""
        return f"the jobs keep running: `scancel {' '.join(self.submitted())}` stops them"

    def scheduled(self) -> dict[Task, Scheduled]:
        """One `squeue` for all jobs (array tasks one per row); a job it no longer lists has ended."""
        done = run_tied(
            ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(self.submitted()), "-o", "%i %T %r"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            return self.keep_last_seen(done.stderr.strip() or f"exit {done.returncode}")
        self.squeue_failing_since = None
        rows = {
            row[0]: (row[1], row[2] if len(row) > 2 else "")  # a reason may hold spaces
            for row in (line.split(maxsplit=2) for line in done.stdout.splitlines())
            if len(row) > 1
        }
        groups = slurm_state_groups()
        self.last_seen = {}
        for task, job in self.job_ids.items():
            state, reason = rows.get(job, ("", ""))
            self.last_seen[task] = Scheduled(
                groups.get(state, "ended"), state, "" if reason == "None" else reason
            )
        return self.last_seen

    def keep_last_seen(self, error: str) -> dict[Task, Scheduled]:
        """A busy controller may miss a poll; one that stays silent a minute has gone away."""
        now = time.monotonic()
        self.squeue_failing_since = self.squeue_failing_since or now
        if now - self.squeue_failing_since > SQUEUE_PATIENCE_S:
            raise ToolkitError(
                f"squeue: {error.splitlines()[-1]} (for {SQUEUE_PATIENCE_S:.0f} s; is slurmctld "
                f"up? the jobs keep writing into {display_path(self.plan.run_dir)})"
            )
        return self.last_seen


class LocalExecutor:
    """Runs the same scripts with bash on this machine: each line's build, then its verification."""

    def __init__(self, plan: MatrixPlan, max_parallel: int):
        self.plan = plan
        self.max_parallel = max_parallel
        self.job_ids: dict[Task, str] = {}  # no scheduler ids here
        self.states: dict[Task, Scheduled] = {task: Scheduled("queued") for task in plan.tasks()}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="matrix")
        self.running: dict[
            Task, subprocess.Popen
        ] = {}  # the scripts now running, for detach to stop
        self.detached = False

    def start(self) -> None:
        for p in self.plan.lines:
            self.pool.submit(self.run_line, p)
        self.pool.shutdown(wait=False)

    def run_line(self, line: LinePlan) -> None:
        built = self.run_script(
            (line.line, "build"), self.plan.build_script, {"SLURM_ARRAY_TASK_ID": str(line.task)}
        )
        if built and self.plan.verifies:
            self.run_script((line.line, "verify"), self.plan.verify_script(line.line), {})

    def run_script(self, task: Task, script: Path, env: dict[str, str]) -> bool:
        """bash SCRIPT; it writes its own status file. Whatever happens, the task ends (the watcher
        reports one that ended without a status as failed)."""
        self.set_state(task, "running")
        try:
            with open(self.plan.log_file(*task), "a") as log, self.lock:
                if self.detached:
                    return False
                self.running[task] = popen_tied(
                    ["bash", str(script)],
                    cwd=self.plan.workdir,
                    env={**os.environ, **env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            return self.running[task].wait() == 0
        finally:
            self.set_state(task, "ended")

    def set_state(self, task: Task, where: str) -> None:
        with self.lock:
            self.states[task] = Scheduled(where)

    def detach(self) -> str:
        """After Ctrl-C: start no more lines, and stop the running scripts (they run in a session of their own,
        base/children, so the terminal's Ctrl-C did not reach them) and all they started."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            self.detached = True
            running = list(self.running.values())
        for proc in running:
            kill_group(proc)
        return "the running lines were stopped, lines not yet started will not start"

    def describe(self) -> str:
        return f"this machine, {self.max_parallel} line{'s' if self.max_parallel > 1 else ''} at a time"

    def scheduled(self) -> dict[Task, Scheduled]:
        with self.lock:
            return dict(self.states)


# ---------------------------------------------------------------- waiting


@dataclass(frozen=True)
class TaskView:
    """One job as the progress table and the summary show it."""

    state: str  # queued | running | done | failed | skipped | not run
    detail: str = ""
    started: float | None = None
    finished: float | None = None
    job: str = ""

    @property
    def seconds(self) -> float | None:
        return (
            None if self.started is None or self.finished is None else self.finished - self.started
        )


def read_status(path: Path) -> dict | None:
    try:
        return read_json(path, "task status", "its task rewrites it")
    except ToolkitError:
        return None  # not written yet (it is replaced whole, never seen half-written)


@dataclass
class Watcher:
    """Turns scheduler states and status files into TaskViews; remembers when a job was first seen ended."""

    plan: MatrixPlan
    job_ids: dict[Task, str]
    ended_without_status: dict[Task, float] = field(default_factory=dict)

    def views(self, scheduled: dict[Task, Scheduled]) -> dict[Task, TaskView]:
        views: dict[Task, TaskView] = {}
        for line, phase in self.plan.tasks():
            views[(line, phase)] = self.view(
                (line, phase),
                scheduled.get((line, phase), Scheduled("queued")),
                views.get((line, "build")),
            )
        if not self.plan.verifies:
            views.update(
                {(p.line, "verify"): TaskView("skipped", "--verify never") for p in self.plan.lines}
            )
        return views

    def view(self, task: Task, scheduled: Scheduled, build: TaskView | None) -> TaskView:
        status = read_status(self.plan.status_file(*task))
        job = self.job_ids.get(task, "")
        if status and status["state"] in FINAL_STATES:
            detail = {
                "done": "",
                "skipped": status["stage"],
                "failed": f"{status['stage']}, exit {status['exit_code']}",
            }[status["state"]]
            return TaskView(status["state"], detail, status["started"], status["finished"], job)
        if build is not None and build.state == "failed":
            return TaskView("not run", "build failed", job=job)
        started = status["started"] if status else None
        if scheduled.where != "ended":
            return TaskView(
                "running" if status else scheduled.where, scheduled.reason, started, job=job
            )
        first_seen = self.ended_without_status.setdefault(task, time.monotonic())
        if time.monotonic() - first_seen < LOST_GRACE_S:
            return TaskView("running", "ending", started, job=job)
        stage = status["stage"] if status else "start"
        how = f" ({scheduled.slurm_state})" if scheduled.slurm_state else ""
        return TaskView(
            "failed", f"{stage}, job ended{how} without a status; see its log", started, job=job
        )


def clock(seconds: float | None) -> str:
    return "" if seconds is None else f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def elapsed(view: TaskView) -> str:
    """A finished job's duration, a running one's time so far."""
    if view.finished is not None:
        return clock(view.seconds)
    return clock(None if view.started is None else time.time() - view.started)


STATE_STYLE = {
    "queued": "dim",
    "running": "cyan",
    "done": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "not run": "yellow",
}


def progress_table(plan: MatrixPlan, views: dict[Task, TaskView], title: str) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for column in ("line", "build", "verify"):
        table.add_column(column)
    for p in plan.lines:
        cells = []
        for phase in PHASES:
            v = views[(p.line, phase)]
            text = " ".join(
                part for part in (v.state, elapsed(v), f"({v.detail})" if v.detail else "") if part
            )
            cells.append(f"[{STATE_STYLE[v.state]}]{text}[/]")
        table.add_row(p.line, *cells)
    return table


def watch(
    plan: MatrixPlan, executor: SlurmExecutor | LocalExecutor, poll: float
) -> dict[Task, TaskView]:
    """Poll until every job is final; a live table in a terminal, one line per change everywhere."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True, highlight=False)
    watcher = Watcher(plan, executor.job_ids)
    title = f"toolkit matrix run: {display_path(plan.run_dir)} on {executor.describe()}"
    shown: dict[Task, str] = {}
    with Live(console=console, auto_refresh=False, transient=True) as live:
        while True:
            views = watcher.views(executor.scheduled())
            for (line, phase), v in views.items():
                if shown.get((line, phase)) != v.state:
                    shown[(line, phase)] = v.state
                    live.console.print(
                        f"{line} {phase}: {v.state}" + (f" ({v.detail})" if v.detail else "")
                    )
            live.update(progress_table(plan, views, title), refresh=True)
            if all(v.state in FINAL_STATES for v in views.values()):
                return views
            time.sleep(poll)


# ---------------------------------------------------------------- summary


@dataclass(frozen=True)
class LineResult:
    line: str
    build: str
    build_detail: str
    build_seconds: float | None
    wheel: str | None
    wheel_cached: bool  # the build stage found it in the wheelhouse instead of compiling
    verify: str
    verify_detail: str
    build_log: str
    verify_log: str
    build_job: str
    verify_job: str

    @property
    def ok(self) -> bool:
        return self.build == "done" and self.verify in ("done", "skipped")


def built_wheel(
    workdir: Path, line: str, build_started: float | None, workspace: Workspace = DEFAULT
) -> tuple[str | None, bool]:
    """The newest recorded wheel in wheelhouse/<line>/, and whether it is older than this build (a cache hit)."""
    line_dir = workdir / workspace.wheel_dir(line)
    try:
        found = records(line_dir) if line_dir.is_dir() else []
    except ToolkitError:
        return None, False  # the build stage said what is wrong with the record in its log
    if not found:
        return None, False
    record = found[0][1]
    finished = datetime.fromisoformat(record.finished).timestamp()
    return record.outputs.wheel, build_started is not None and finished < build_started


def line_results(plan: MatrixPlan, views: dict[Task, TaskView]) -> list[LineResult]:
    results = []
    for p in plan.lines:
        build, verify = views[(p.line, "build")], views[(p.line, "verify")]
        done = build.state == "done"
        wheel, cached = (
            built_wheel(plan.workdir, p.line, build.started, plan.workspace)
            if done
            else (None, False)
        )
        results.append(
            LineResult(
                p.line,
                build.state,
                build.detail,
                build.seconds,
                wheel,
                cached,
                verify.state,
                verify.detail,
                str(plan.log_file(p.line, "build")),
                str(plan.log_file(p.line, "verify")) if plan.verifies else "",
                build.job,
                verify.job,
            )
        )
    return results


def write_summary(plan: MatrixPlan, results: list[LineResult]) -> dict:
    summary = {
        "run_dir": str(plan.run_dir),
        "executor": plan.executor,
        "verify": plan.verify_mode,
        "ok": all(r.ok for r in results),
        "lines": [{**asdict(r), "ok": r.ok} for r in results],
    }
    write_atomic(plan.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


VERIFY_WORDS = {"done": "passed", "failed": "failed", "skipped": "skipped", "not run": "not run"}


def print_summary(plan: MatrixPlan, results: list[LineResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"toolkit matrix run: {display_path(plan.run_dir)}")
    for column in ("line", "build", "time", "wheel", "verification"):
        table.add_column(column)
    for r in results:
        build = r.build if r.build == "done" else f"{r.build} ({r.build_detail})"
        verify = VERIFY_WORDS[r.verify] + (f" ({r.verify_detail})" if r.verify_detail else "")
        style = "green" if r.ok else "bold red"
        wheel = (r.wheel or "") + (" (cached)" if r.wheel_cached else "")
        table.add_row(r.line, f"[{style}]{build}[/]", clock(r.build_seconds), wheel, verify)
    console = Console(highlight=False)
    console.print(table)
    failed = [r for r in results if not r.ok]
    for r in failed:
        log = r.build_log if r.build != "done" else r.verify_log
        console.print(f"{r.line}: see {display_path(Path(log))}")
    console.print(
        f"{len(results) - len(failed)} of {len(results)} lines ok; summary: "
        f"{display_path(plan.run_dir / 'summary.json')}"
    )


def run_plan(plan: MatrixPlan, options: RunOptions, as_json: bool) -> int:
    """Write the scripts, start the jobs, wait, summarize; exit 1 when any line failed."""
    write_run_dir(plan)
    executor = (
        SlurmExecutor(plan)
        if plan.executor == "slurm"
        else LocalExecutor(plan, options.max_parallel)
    )
    executor.start()
    try:
        views = watch(plan, executor, options.poll)
    except KeyboardInterrupt:
        raise ToolkitError(
            f"{display_path(plan.run_dir)}: interrupted while waiting ({executor.detach()}; "
            "status files and logs land there)",
            exit_code=130,
        ) from None
    results = line_results(plan, views)
    summary = write_summary(plan, results)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(plan, results)
    return 0 if summary["ok"] else 1

"""`toolkit matrix [show]`: the lines side by side (a table, JSON, a GitHub Actions matrix); `matrix run` builds them all.

`toolkit matrix run [LINE...]` hands the lines to toolkit.site.scaleout, which runs each line's stages as
Slurm jobs (or on this machine); this module is only the command line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import textwrap
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from toolkit.base.arguments import add_json, add_lines
from toolkit.base.entry import add_verb_with_default_step
from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace, add_workspace_options
from toolkit.knowledge.facts import Knowledge, load_knowledge, minor_of
from toolkit.site.scaleout import (
    BATCH_CPUS,
    BATCH_NVCC_THREADS,
    EXECUTORS,
    VERIFY_MODES,
    RunOptions,
    plan_matrix,
    run_plan,
    verification_gres,
)
from toolkit.spec import patches
from toolkit.spec.envspec import EnvSpec, resolve_spec_arg, spec_paths
from toolkit.spec.rules import checked_spec


@dataclass(frozen=True)
class MatrixRow:
    line: str
    cuda: str
    python: str
    torch: str
    torch_experimental: bool  # upstream marks this release's wheels for the line experimental
    gcc: str
    flash_attn: str
    archs: list[str]
    driver_floor: str
    toolchain: str
    platforms: list[str]
    patches: list[
        str
    ]  # our patch files the build applies to the sdist (toolkit/knowledge/patches.yaml)
    status: str  # current | old stack
    status_note: str  # why, from the torch release knowledge
    never_ran: list[
        str
    ]  # declared archs whose cubins the build checks but no GPU of this project has run


# The table's words for toolchain.kind: where nvcc comes from ("locked" read as "has a lock", which a fresh
# clone's conda-forge lines do not)
TOOLCHAIN_FROM = {"locked": "conda", "external": "machine", "pypi": "PyPI"}


def line_status(spec: EnvSpec, kb: Knowledge) -> tuple[str, str]:
    """Current: the line builds the newest torch that ships its CUDA line, and that torch is one of the two
    newest releases known (PyTorch keeps shipping both). Otherwise it is kept for an old stack."""
    minors = list(kb.torch_releases)
    serving = kb.torch_lines(spec.cuda)
    tag = kb.cuda_lines[spec.cuda].tag
    if not serving:
        return "old stack", f"no torch release ships {tag}"
    newest = serving[-1]
    if minor_of(spec.torch_version) != newest:
        return (
            "old stack",
            f"torch {newest} ships {tag} (this line keeps torch {minor_of(spec.torch_version)})",
        )
    if newest not in minors[-2:]:
        return (
            "old stack",
            f"torch {newest} is the last with {tag} wheels (newest torch: {minors[-1]})",
        )
    return "current", f"torch {newest} is the newest with {tag} wheels"


def matrix_row(spec: EnvSpec) -> MatrixRow:
    kb = load_knowledge()
    line = kb.cuda_lines[spec.cuda]
    experimental = spec.cuda in kb.torch_releases[minor_of(spec.torch_version)].experimental
    status, note = line_status(spec, kb)
    return MatrixRow(
        spec.line,
        spec.cuda,
        spec.python,
        spec.torch_version,
        experimental,
        spec.gcc,
        spec.flash_attn_version,
        list(spec.archs),
        line.min_driver,
        spec.toolchain.kind,
        list(spec.platforms),
        [p.file.name for p in patches.spec_plan(spec).patches],
        status,
        note,
        kb.never_ran(spec.archs),
    )


def selected_specs(names: list[str], workspace: Workspace) -> list[EnvSpec]:
    paths = [resolve_spec_arg(n, workspace) for n in names] if names else spec_paths(workspace.envs)
    return [checked_spec(p) for p in paths]


def github_matrix(specs: list[EnvSpec]) -> dict:
    """The `strategy.matrix` of a GitHub Actions workflow that builds these lines (one job per line)."""
    return {
        "include": [
            {
                "line": s.line,
                "cuda": s.cuda,
                "python": s.python,
                "torch": s.torch_version,
                "archs": ";".join(s.archs),
            }
            for s in specs
        ]
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    verbs = add_verb_with_default_step(
        subparsers,
        "matrix",
        "show",
        description="`toolkit matrix [show] [LINE...]`: one row per CUDA line (`show` is the default step: "
        "`toolkit matrix --json` is `toolkit matrix show --json`). `toolkit matrix run [LINE...]`: "
        "lock (if stale) -> install -> build -> verify for each line as Slurm jobs (or here, with "
        "--executor local) and a summary.",
    )
    show = verbs.add_parser(
        "show",
        help="every line side by side (a table, JSON, a GitHub Actions matrix)",
        description="One row per CUDA line: status (current, or old stack kept for older torch), CUDA, python, torch, "
        "gcc, flash-attn, the patches its build applies, archs, driver floor, and where its nvcc comes "
        "from (toolchain.kind: conda for locked, from the spec's channels; machine for external; PyPI for pypi).",
    )
    add_lines(show, "lines (default: all)")
    add_json(show)
    show.add_argument(
        "--github",
        action="store_true",
        help='print a GitHub Actions matrix, one JSON line: {"include": [{line, cuda, python, '
        "torch, archs}]} (for `matrix=$(...)` in $GITHUB_OUTPUT)",
    )
    add_workspace_options(show)
    add_run_options(show, hidden=True)  # given here, refused with the verb they belong to
    show.set_defaults(func=matrix_show_command)
    run = verbs.add_parser(
        "run",
        help="build and verify the lines as Slurm jobs (or here) and print a summary",
        description="Run lock (if stale) -> install -> build -> verify for each line as Slurm jobs (or here, "
        "with --executor local) and print a summary.",
    )
    add_lines(run, "lines (default: all)")
    add_json(run, "print the summary as JSON instead of a table")
    run.add_argument(
        "--github", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    add_workspace_options(run)
    add_run_options(run)
    run.set_defaults(func=matrix_run_command)


def add_run_options(parser: argparse.ArgumentParser, hidden: bool = False) -> None:
    """Options of `toolkit matrix run`; left out of the namespace unless given (see RunOptions for defaults).
    `hidden`: on `matrix show`, out of its --help, so that given there they are refused naming `matrix run`."""
    group = parser.add_argument_group("matrix run", "options of `toolkit matrix run [LINE...]`")
    d = RunOptions()

    def option(flag: str, help: str, **kwargs: Any) -> None:
        group.add_argument(
            flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS if hidden else help, **kwargs
        )

    option(
        "--executor",
        choices=EXECUTORS,
        metavar="EXECUTOR",
        help="slurm: a build job array and per-line verification jobs "
        f"after it; local: the same batch scripts on this machine (default: {d.executor})",
    )
    option(
        "--verify",
        choices=VERIFY_MODES,
        metavar="MODE",
        help="always: verification must pass; if-gpu: where no GPU is "
        "visible it is 'skipped (no GPU)', not a failure; never: build only "
        f"(default: {d.verify})",
    )
    option(
        "--stages",
        type=Path,
        metavar="FILE",
        help="stage commands per phase (default: the toolkit's "
        "toolkit/site/templates/matrix-stages.yaml: lock if stale, install, build; verify)",
    )
    option(
        "--runs-dir",
        type=Path,
        metavar="DIR",
        help=f"where runs/<timestamp>/ goes (default: {d.runs_dir})",
    )
    option(
        "--cpus",
        type=int,
        metavar="N",
        help="build jobs = cpus per build task, for lines whose "
        f"build.jobs is auto (default: {BATCH_CPUS} for Slurm; local: sized from this machine, as `toolkit "
        "build` does)",
    )
    option(
        "--nvcc-threads",
        type=int,
        metavar="N",
        help="threads per nvcc, for lines whose build.nvcc_threads "
        f"is auto (default: {BATCH_NVCC_THREADS} for Slurm; local: sized from this machine)",
    )
    option(
        "--verify-cpus",
        type=int,
        metavar="N",
        help=f"cpus of a verification job (default: {d.verify_cpus})",
    )
    option(
        "--verify-mem-gb",
        type=float,
        metavar="GB",
        help=f"memory of a verification job (default: {d.verify_mem_gb:g})",
    )
    option(
        "--gres",
        metavar="GRES",
        help="what a verification job asks for, '' for nothing, e.g. when a "
        f"--verify-partition has GPUs without gres (default: {d.gres})",
    )
    option(
        "--partition",
        metavar="NAME",
        help="Slurm partition of every job (default: the cluster's default)",
    )
    option(
        "--verify-partition",
        metavar="NAME",
        help="partition of the verification jobs (default: --partition)",
    )
    option("--account", metavar="NAME", help="Slurm account to charge")
    option("--time", metavar="LIMIT", help="time limit of every job, e.g. 2:00:00")
    option(
        "--verify-time", metavar="LIMIT", help="time limit of a verification job (default: --time)"
    )
    option(
        "--sbatch",
        action="append",
        metavar="OPTION",
        help="one more sbatch option for every job, written as --sbatch=--qos=long or --sbatch=--exclusive "
        "(repeatable; a plain value: letters, digits and _.,:/@%%+=&|!*^~-)",
    )
    option(
        "--nodes",
        type=int,
        metavar="N",
        help="spread each line's build over N nodes: its batch task asks for N nodes of --cpus each and "
        "runs `toolkit build --slurm`, every compile a job step, the link on the first node (needs a "
        "filesystem the nodes share; default: one node, no job steps)",
    )
    option(
        "--max-parallel",
        type=int,
        metavar="N",
        help=f"--executor local: lines built at the same time (default: {d.max_parallel})",
    )
    option(
        "--poll",
        type=float,
        metavar="SECONDS",
        help=f"seconds between progress checks (default: {d.poll:g})",
    )


def run_options(args: argparse.Namespace) -> RunOptions:
    given = {f.name: getattr(args, f.name) for f in fields(RunOptions) if hasattr(args, f.name)}
    if "sbatch" in given:
        given["sbatch"] = tuple(given["sbatch"])
    return RunOptions(**given)


def command_line(lines: list[str], options: RunOptions, workspace: Workspace) -> str:
    """The `toolkit matrix run` command that asks for exactly these options (written into the scripts)."""
    words = ["toolkit", "matrix", "run", *lines, *workspace.options()]
    default = RunOptions()
    for f in fields(RunOptions):
        value = getattr(options, f.name)
        if value != getattr(default, f.name):
            words += [
                f"--{f.name.replace('_', '-')}={v}"
                for v in (value if isinstance(value, tuple) else (value,))
            ]
    return shlex.join(words)


def matrix_show_command(args: argparse.Namespace) -> int:
    misplaced = [
        "--" + f.name.replace("_", "-") for f in fields(RunOptions) if hasattr(args, f.name)
    ]
    if misplaced:
        raise ToolkitError(
            f"toolkit matrix show: {', '.join(misplaced)} belong to `toolkit matrix run` "
            "(write `toolkit matrix run [LINE...]`)"
        )
    specs = selected_specs(args.lines, Workspace.from_args(args))
    if args.github:
        print(json.dumps(github_matrix(specs)))
        return 0
    rows = [matrix_row(spec) for spec in specs]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    print_table(rows)
    return 0


def print_table(rows: list[MatrixRow]) -> None:
    """The table fits an 80-column terminal (rich cut every line name to `cu1…` there): status and patches go
    to the notes under it, columns are one space apart, torch's local label and experimental mark go on a
    second line, and only torch and archs wrap; the line name and the other single values are never cut."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title="FlashAttention build matrix",
        box=box.SIMPLE_HEAD,
        padding=0,
        show_edge=False,
        collapse_padding=True,
    )
    for column in (
        "line",
        "CUDA",
        "python",
        "torch",
        "gcc",
        "flash-attn",
        "archs",
        "driver >=",
        "nvcc from",
    ):
        table.add_column(column, no_wrap=column not in ("torch", "archs"))
    for r in rows:
        torch = r.torch.replace("+", "\n+", 1) + ("\n(exp.)" if r.torch_experimental else "")
        table.add_row(
            r.line,
            r.cuda,
            r.python,
            torch,
            r.gcc,
            r.flash_attn,
            " ".join(r.archs),
            r.driver_floor,
            TOOLCHAIN_FROM[r.toolchain],
        )
    console.print(table)
    for r in rows:
        note = (
            f"{r.line}: {r.status}: {r.status_note}"
            + (f"; patches {', '.join(r.patches)}" if r.patches else "")
            + (
                f"; sm_{', sm_'.join(r.never_ran)} checked in its wheel, never run on a GPU here"
                if r.never_ran
                else ""
            )
        )
        print(
            textwrap.fill(
                note,
                width=console.width,
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )


def matrix_run_command(args: argparse.Namespace) -> int:
    if hasattr(args, "github"):
        raise ToolkitError(
            "toolkit matrix run: --github prints the matrix for CI and runs nothing "
            "(write `toolkit matrix show --github`)"
        )
    options = run_options(args)
    workspace = Workspace.from_args(args)
    specs = selected_specs(args.lines, workspace)
    plan = plan_matrix(
        specs,
        options,
        verification_gres(options),
        command_line(args.lines, options, workspace),
        workspace,
    )
    return run_plan(plan, options, args.json)

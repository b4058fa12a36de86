"""What the benchmarks measure with, in one place: a job's wall and CPU seconds, the rounds of sides in turn,
their medians, and the header of a results file.

Each bench under bench/ had spelled its own copy of these (getrusage deltas, a subprocess timer, the alternating
loop, the machine line), copies that had already drifted apart (which environment a child runs in, how the machine
is described). One copy here keeps the figures of every bench measured the same way.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class Run:
    """One job measured: wall seconds, CPU seconds of it and everything it started and waited for."""

    wall_s: float
    cpu_s: float


def children_cpu() -> float:
    """CPU seconds (user + system) of every child this process has waited for: a job's cost is the difference
    around it, its own children included (the kernel adds a grandchild when its parent waits for it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(command: Sequence[str | Path], env: Mapping[str, str] | None = None, cwd: Path | None = None, *,
             pycache: Path | None = None) -> Run:
    """Run `command` to its end and measure it; a failure ends the bench with the command and its stderr's tail.

    env: variables set over this process's environment. The child writes and runs compiled bytecode, as an
    installed toolkit does, whatever PYTHONDONTWRITEBYTECODE says here (without bytecode, an editable checkout
    compiles every module it imports on every run, a cost no user pays); pycache: the folder it goes to
    (PYTHONPYCACHEPREFIX, a folder of the run), else beside the sources."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if pycache is not None:
        environment["PYTHONPYCACHEPREFIX"] = str(pycache)
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, env={**environment, **(env or {})}, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    cpu = children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command[:6]))}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return Run(wall, cpu)


def in_turn(sides: Sequence[str], turn: int) -> list[str]:
    """The sides in the order of round `turn`: each goes first in its turn, so that neither side is always the one
    that runs on caches the other warmed, or on a machine the other left busy."""
    first = turn % len(sides)
    return [*sides[first:], *sides[:first]]


def alternating(rows: Mapping[str, Mapping[str, Callable[[int], Run]]], repeat: int) -> dict[str, dict[str, list[Run]]]:
    """Every side's job of every row `repeat` times (each job is given the round), the sides of a row one after the
    other in turn: each row's sides measured under the same load, minutes apart at most."""
    runs: dict[str, dict[str, list[Run]]] = {row: {side: [] for side in jobs} for row, jobs in rows.items()}
    for turn in range(repeat):
        for row, jobs in rows.items():
            for side in in_turn(list(jobs), turn):
                runs[row][side].append(jobs[side](turn))
    return runs


def median(runs: Sequence[Run]) -> Run:
    """The median wall and the median CPU seconds of these runs, each taken on its own."""
    return Run(statistics.median(r.wall_s for r in runs), statistics.median(r.cpu_s for r in runs))


def side_figures(row: Mapping[str, Sequence[Run]]) -> dict[str, float]:
    """Each side's medians as a results row names them: toolkit_wall_s, toolkit_cpu_s, library_wall_s, ..."""
    figures = {}
    for side, runs in row.items():
        middle = median(runs)
        figures.update({f"{side}_wall_s": middle.wall_s, f"{side}_cpu_s": middle.cpu_s})
    return figures


def as_pairs(row: Mapping[str, Sequence[Run]]) -> dict[str, list[tuple[float, float]]]:
    """Each side's runs as a results file keeps them: [wall seconds, CPU seconds] each."""
    return {side: [(r.wall_s, r.cpu_s) for r in runs] for side, runs in row.items()}


def machine() -> str:
    """This machine as a result names it: host, platform, cores, python, and the load when it was said (the
    2-core machine is shared: a loaded run's wall times are inflated)."""
    return (f"{platform.node()}: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f}")


def run_metadata(script: str, argv: Sequence[str], **extra: object) -> dict[str, object]:
    """The header of a bench's results.json: when, where, the command that made it (`python bench/SCRIPT ARGV`,
    as one would type it again), and the bench's own settings."""
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
            "command": " ".join(["python", f"bench/{script}", *argv]), **extra}

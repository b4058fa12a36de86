"""How long a build takes here: before it compiles (one line) and while it compiles (the bar's ETA).

Both come from the objects' CPU costs (toolkit/build/timing.py's ScheduleOrder: the previous build's times on this
machine, wall seconds under its sizing turned into CPU seconds by in_cpu_seconds, else
toolkit/knowledge/object_costs.yaml's CPU seconds, measured on another machine's CPUs) run through
the model of ninja's list scheduling that bench/build_efficiency.py checks against committed builds: objects
longest first, `jobs` at a time, each keeping min(nvcc threads, its -gencode targets) CPUs busy, the CPUs shared
evenly when more threads run than there are. While the build runs, the model's figure for what is left is
scaled by how the finished objects' measured times (ninja's .ninja_log) compare with what it predicted for
them, so another machine's CPUs, or a loaded one, correct the estimate within the first objects. A source
without costs (the test fixture) falls back to a count-based ETA, unknown until the first objects finish.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.build.ninja_shim import MANIFEST_OBJECTS
from toolkit.build.timing import ScheduleOrder, ninja_log

# The output of the edge ninja reports in a status line: `[n/N] <command ... -o OUT ...>` (ninja prints an
# edge's line when it finishes, its command with -v or when the rule has no description, as torch's have none)
NINJA_STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]\s")
COMMAND_OUTPUT = re.compile(r"\s-o\s+(\S+)")
# ninja's status line format the build sets (ninja's own default), whatever NINJA_STATUS the caller has
NINJA_STATUS = "[%f/%t] "


def simulated_log(
    names: list[str], seconds: list[float], jobs: int, cpus: int | None = None, threads: int = 1
) -> list[dict]:
    """ninja's list scheduling as a .ninja_log: each object, in the given order, starts when one of `jobs`
    slots is free and keeps `threads` CPUs busy (nvcc's threads, one per arch). With more threads than CPUs
    the kernel shares the CPUs evenly: a running object advances at min(1, cpus / (running x threads))
    seconds of its own time per second."""
    cpus = cpus or jobs * threads
    pending, done, now = list(zip(names, seconds)), [], 0.0
    running: list[list[Any]] = []  # [name, start, seconds of its own time left]
    pending.reverse()  # popped from the end: the first name first
    while pending or running:
        while pending and len(running) < jobs:
            name, left = pending.pop()
            running.append([name, now, left])
        rate = min(1.0, cpus / (len(running) * threads))
        step = min(r[2] for r in running) / rate
        now += step
        for r in running:
            r[2] -= step * rate
        done += [
            {"name": r[0], "start_s": r[1], "seconds": now - r[1]} for r in running if r[2] <= 1e-9
        ]
        running = [r for r in running if r[2] > 1e-9]
    return done


def compile_wall(cpu_costs: Sequence[float], jobs: int, threads: int, cpus: int) -> float:
    """Wall seconds to compile objects of these CPU costs longest first, `jobs` at a time, each on `threads`
    CPUs (min of nvcc's threads and the object's -gencode targets), on `cpus` CPUs."""
    if not cpu_costs:
        return 0.0
    durations = sorted((cost / threads for cost in cpu_costs), reverse=True)
    log = simulated_log([str(i) for i in range(len(durations))], durations, jobs, cpus, threads)
    return max(o["start_s"] + o["seconds"] for o in log)


def duration_text(seconds: float) -> str:
    """'42 s', '35 min', '9.8 h': as a person reads a build's length."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Sizing:
    """The parallelism the model runs a compile under (builder.Parallelism's figures)."""

    jobs: int
    threads: int  # CPUs one object keeps busy: min(nvcc threads, the object's -gencode targets)
    cpus: int

    def stretch(self) -> float:
        """How much longer one object takes than its CPU cost / threads while every slot runs."""
        return max(1.0, self.jobs * self.threads / self.cpus)


def in_cpu_seconds(
    order: ScheduleOrder, threads_per_object: Callable[[tuple[str, ...]], int]
) -> ScheduleOrder:
    """The order with a record's times as CPU seconds, as the knowledge's costs are: the estimate line, the
    shim's object costs and the bar's ETA all take CPU seconds. A record's times are wall seconds under its
    own sizing (.ninja_log's); the model's time of one object, cost / threads x stretch, turned round. Taken
    as costs, an estimate at the record's sizing came out `threads` times too short."""
    if order.recorded is None or not order.object_seconds:
        return order
    then, archs = order.recorded
    busy = min(then.jobs, len(order.object_seconds))  # the slots its objects kept busy at once
    sizing = Sizing(busy, min(then.nvcc_threads, threads_per_object(archs)), then.cpus)
    factor = sizing.threads / sizing.stretch()
    return replace(
        order,
        object_seconds={name: s * factor for name, s in order.object_seconds.items()},
        recorded=None,
    )


def filled(costs: dict[str, float | None]) -> dict[str, float] | None:
    """Every object's cost, one the source has none for taken as the median of the others; None: none known."""
    known = [c for c in costs.values() if c is not None]
    if not known:
        return None
    median = statistics.median(known)
    return {name: median if cost is None else cost for name, cost in costs.items()}


def estimate_line(
    costs: Sequence[float] | None,
    kept: int,
    here: Sizing,
    basis: str,
    reference: Sizing | None = None,
) -> str:
    """The one line before compiling: how long the objects left take here, and on a reference machine."""
    if costs is None:
        return (
            "estimate: unknown (no earlier record of this source, no object costs of it in the knowledge); "
            "the ETA shows once the first objects finish"
        )
    resumed = f", {kept} kept from the interrupted build" if kept else ""
    line = (
        f"estimate: about {duration_text(compile_wall(costs, here.jobs, here.threads, here.cpus))} here for "
        f"{len(costs)} objects{resumed} ({here.jobs} jobs x {here.threads} nvcc threads on {here.cpus} CPUs, "
        f"by {basis})"
    )
    if reference is not None and reference.cpus > here.cpus:
        wall = compile_wall(costs, reference.jobs, reference.threads, reference.cpus)
        line += f"; about {duration_text(wall)} on {reference.cpus} cores"
    return line


@dataclass(frozen=True)
class ManifestObjects:
    """The compile objects of the build.ninja ninja runs (written by the ninja shim), with their costs."""

    directory: Path  # where ninja runs and keeps .ninja_log
    costs: dict[str, float | None]  # object file name -> CPU seconds (None: no cost known)

    @classmethod
    def read(cls, shim_dir: Path) -> ManifestObjects | None:
        """The shim's file, None when it has not written one (yet) or it cannot be read."""
        path = shim_dir / MANIFEST_OBJECTS
        if not path.exists():
            return None
        try:
            data = read_json(path, "ninja shim's object list", "build again")
            return cls(
                Path(data["directory"]),
                {str(k): (None if v is None else float(v)) for k, v in data["objects"].items()},
            )
        except (ToolkitError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a half-written or foreign file: the bar counts without it

    def finished(self) -> dict[str, float]:
        """Objects ninja logged as built whose file is there, with their measured seconds."""
        found = {}
        for output, (start, end) in ninja_log(self.directory / ".ninja_log").items():
            name = Path(output).name
            if name in self.costs and (self.directory / output).exists():
                found[name] = end - start
        return found


class CompileProgress:
    """What the build's bar shows: objects done of all the manifest's (those an interrupted build left
    count as done), and the time left by the costs of the objects not yet built, corrected by how long
    the finished ones took against the model's figure for them."""

    def __init__(
        self,
        shim_dir: Path,
        total: int | None,
        kept: int,
        sizing: Sizing,
        costs_left: Sequence[float] | None,
    ) -> None:
        self.shim_dir = shim_dir
        self.total, self.kept, self.sizing = total, kept, sizing
        self.manifest: ManifestObjects | None = None
        self.done: set[str] = set()  # compiled by this run
        self.started: float | None = None  # when ninja started (the shim's file appeared)
        # the ETA computed at eta_at: until ninja starts, the estimate line's
        self.eta_s = (
            None
            if costs_left is None
            else compile_wall(costs_left, sizing.jobs, sizing.threads, sizing.cpus)
        )
        self.eta_at = time.monotonic()

    @property
    def completed(self) -> int:
        return self.kept + len(self.done)

    def feed(self, line: str) -> bool:
        """Take one line of the build's output; True when the figures changed."""
        if self.manifest is None:
            self.manifest = ManifestObjects.read(self.shim_dir)
            if self.manifest is not None:
                self.started = time.monotonic()
                self.total = len(self.manifest.costs)
                self.kept = len(self.manifest.finished())
                self._estimate()
                return True
        if self.manifest is None or not NINJA_STEP.match(line):
            return False
        outputs = [Path(out).name for out in COMMAND_OUTPUT.findall(line)]
        new = [name for name in outputs if name in self.manifest.costs and name not in self.done]
        if not new:
            return False
        self.done.update(new)
        self._estimate()
        return True

    def _estimate(self) -> None:
        assert self.manifest is not None and self.started is not None
        now = time.monotonic()
        measured = self.manifest.finished()
        left = [
            name for name in self.manifest.costs if name not in measured and name not in self.done
        ]
        costs = filled(self.manifest.costs)
        if costs is None:  # count-based: this run's pace so far
            if self.done or not left:
                self.eta_s = (now - self.started) / max(1, len(self.done)) * len(left)
            elif self.eta_s is not None:
                return  # the estimate line's figure, counting down, until an object of this build.ninja finishes
        else:
            timed = [name for name in self.done if name in measured]
            predicted = sum(costs[n] / self.sizing.threads * self.sizing.stretch() for n in timed)
            ratio = sum(measured[n] for n in timed) / predicted if timed and predicted > 0 else 1.0
            s = self.sizing
            self.eta_s = ratio * compile_wall([costs[n] for n in left], s.jobs, s.threads, s.cpus)
        self.eta_at = now

    def eta_text(self) -> str:
        if self.eta_s is None:
            return "ETA unknown until the first objects finish"
        counted = (
            0.0 if self.started is None else time.monotonic() - self.eta_at
        )  # ninja runs: count down
        return f"ETA about {duration_text(max(0.0, self.eta_s - counted))}"

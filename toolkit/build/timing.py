"""How fast a build was and how the next one is ordered: per-object times, parallel efficiency, CPU use.

The build reads ninja's .ninja_log after the compile and records each object's time; the next build of the
same sdist starts its objects longest first by them (toolkit/build/ninja_shim.py), and `toolkit build --report`
and bench/build_efficiency.py print the figures. A first build of an sdist (no record of it here, no
--order-from) takes the measured object costs of toolkit/knowledge/object_costs.yaml instead (FA2 by the sdist's
sha256, FA3 by its commit and profile), and keeps build.ninja's order only for a source the knowledge has not
measured.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.build.record import BuildRecord, Parallelism
from toolkit.build.wheelhouse import records
from toolkit.env.lockfile import LockedSdist
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.object_costs import KNOWLEDGE_NAME, CostKey, load_object_costs

OrderKind = Literal["record", "knowledge", "build.ninja"]


def ninja_log(path: Path) -> dict[str, tuple[float, float]]:
    """Each output's (start, end) seconds in ninja's .ninja_log, since the start of the ninja run that built it;
    its last row (ninja appends one per build of an edge, and a resumed build's run its own); {} without one."""
    rows: dict[str, tuple[float, float]] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return rows
    for row in text.splitlines():
        fields = row.split("\t")
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            rows[fields[3]] = (int(fields[0]) / 1000, int(fields[1]) / 1000)
    return rows


def ninja_objects(src_dir: Path) -> list[dict]:
    """Per-object compile times from ninja's .ninja_log (start/end since the start of the ninja run)."""
    objects = [
        {"name": Path(output).name, "start_s": start, "seconds": round(end - start, 3)}
        for log in src_dir.glob("build/**/.ninja_log")
        for output, (start, end) in ninja_log(log).items()
        if output.endswith(".o")
    ]
    return sorted(objects, key=lambda o: o["start_s"])


@dataclass(frozen=True)
class ScheduleOrder:
    """Where a build's object order comes from: an earlier record's times (by object file name), the
    knowledge's costs (by source path inside the sdist), or neither (build.ninja's own order)."""

    kind: OrderKind
    origin: str | None  # the record, or the knowledge file and release, as shown to the user
    object_seconds: dict[str, float] = field(default_factory=dict)
    source_seconds: dict[str, float] = field(default_factory=dict)
    # the record's sizing and archs: its object_seconds are wall seconds under them, not CPU seconds
    recorded: tuple[Parallelism, tuple[str, ...]] | None = None

    def summary(self) -> str:
        if self.kind == "build.ninja":
            return "build.ninja's order (no earlier record of this sdist, no object costs of it in the knowledge)"
        what = "the times in" if self.kind == "record" else "the object costs in"
        return f"longest objects first, by {what} {self.origin}"

    def record_fields(self) -> dict[str, str | None]:
        """The build record's `schedule` entries that say which order the build used."""
        return {
            "order": self.kind,
            "from_record": self.origin if self.kind == "record" else None,
            "from_knowledge": self.origin if self.kind == "knowledge" else None,
        }


def record_key(record: BuildRecord) -> CostKey:
    """What a record built, as costs are keyed: FA2 by its sdist's sha256, FA3 by commit and profile (the same
    source from another machine's archive, GitHub's or `git archive`'s, has another sha256)."""
    fa3 = record.flash_attn_3
    if fa3:
        return CostKey("fa3", str(fa3.get("commit")), str(fa3.get("profile")))
    return CostKey("fa2", record.sdist.sha256)


def previous_record(
    candidates: list[tuple[Path, BuildRecord]], costs_key: CostKey
) -> tuple[Path, BuildRecord] | None:
    """The first of these records that built the same source and timed its objects, with its path."""
    for path, record in candidates:
        if record_key(record) == costs_key and record.outputs.objects:
            return path, record
    return None


def order_record(order_from: Path) -> BuildRecord:
    """The record --order-from names, read: the build reads it before anything starts, so a missing or
    unreadable one is its only line (no compile cache or slot set up first)."""
    if not order_from.is_file():
        raise ToolkitError(
            f"{display_path(order_from)}: no such build record (--order-from takes a "
            f"wheelhouse/LINE/*.build.json file)"
        )
    return BuildRecord.read(order_from)


def schedule_candidates(order_from: Path | None, line_dir: Path) -> list[tuple[Path, BuildRecord]]:
    """The record named by --order-from (a committed one, on a fresh machine), else the line's, newest first."""
    if order_from:
        return [(order_from, order_record(order_from))]
    return records(line_dir) if line_dir.is_dir() else []


def schedule_order(
    order_from: Path | None,
    line_dir: Path,
    sdist: LockedSdist,
    archs: tuple[str, ...],
    costs_key: CostKey,
) -> ScheduleOrder:
    """--order-from's record, else the line's newest record of this sdist, else the knowledge's costs under
    costs_key (a first build), else build.ninja's order. A record measured this machine; the knowledge
    measured another, so it comes only where no record is."""
    previous = previous_record(schedule_candidates(order_from, line_dir), costs_key)
    if order_from and previous is None:
        raise ToolkitError(
            f"{display_path(order_from)}: records no object times of {sdist.filename}; it "
            f"cannot order this build (drop --order-from)"
        )
    if previous:
        path, record = previous
        return ScheduleOrder(
            "record",
            display_path(path),
            object_seconds={o.name: o.seconds for o in record.outputs.objects},
            recorded=(record.parallelism, tuple(record.inputs.archs)),
        )
    costs = load_object_costs().measured(costs_key)
    if costs is None:
        return ScheduleOrder("build.ninja", None)
    origin = (
        f"{display_path(knowledge_files.KNOWLEDGE_DIR / KNOWLEDGE_NAME)} (flash-attn {costs.version} {costs.key.label()}, "
        f"measured on sm_{costs.arch}: {costs.source})"
    )
    return ScheduleOrder("knowledge", origin, source_seconds=costs.seconds_for(archs))


def children_cpu_s() -> float:
    """CPU seconds of every finished child process of this one (and theirs: each waits for its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def efficiency(
    objects: list[dict], jobs: int, build_wall_s: float, cpu_s: float, cpus: int
) -> dict:
    """How close the compile came to its lower bound max(sum of object times / job slots, longest object),
    and how busy the build kept the CPUs (its processes' CPU time / (wall x CPUs)).

    The first is the issue's figure; with more jobs than CPUs every object's time stretches and it flatters
    the build, so the CPU figure is the one that cannot be gamed."""
    busy = {
        "cpus": cpus,
        "cpu_s": round(cpu_s, 1),
        "cpu_utilization": round(cpu_s / (build_wall_s * cpus), 3) if build_wall_s else None,
    }
    if not objects:
        return {"objects": 0, "build_wall_s": round(build_wall_s, 1), **busy}
    compile_wall = max(o["start_s"] + o["seconds"] for o in objects) - min(
        o["start_s"] for o in objects
    )
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
        "efficiency_vs_longest": round(longest["seconds"] / compile_wall, 3)
        if compile_wall
        else None,
        "parallel_efficiency": round(max(slot_bound, longest["seconds"]) / compile_wall, 3)
        if compile_wall
        else None,
        **busy,
    }


def describe(record: BuildRecord) -> list[str]:
    """The build figures of a record, for the end of a build and `--report`."""
    out = record.outputs
    eff = out.efficiency
    lines = [
        f"wheel: {out.wheel} ({out.wheel_size / 1e6:.1f} MB, sha256 {out.wheel_sha256[:16]}...)",
        f"archs compiled: {', '.join(sorted({a for v in out.archs_compiled.values() for a in v}))}; "
        f"{record.parallelism.basis}",
    ]
    if eff.get("objects"):
        lines.append(
            f"build {eff['build_wall_s']} s, compile {eff['compile_wall_s']} s for {eff['objects']} objects; "
            f"bound by slots {eff['slot_bound_s']} s (sum {eff['sum_object_s']} s / {eff['job_slots']} jobs), "
            f"longest object {eff['longest_object_s']} s ({eff['longest_object']}); "
            f"parallel efficiency {eff['parallel_efficiency']:.0%} "
            f"(vs slots {eff['efficiency_vs_slots']:.0%}, vs longest {eff['efficiency_vs_longest']:.0%})"
        )
    schedule = record.schedule
    if schedule.order:
        lines.append(
            f"schedule: {schedule.order}, from "
            f"{schedule.from_record or schedule.from_knowledge or 'build.ninja'}; "
            f"{schedule.edges_ordered} object edges ordered longest first, "
            f"{schedule.objects_without_cost} without a cost first"
        )
    if eff.get("cpu_utilization") is not None:
        lines.append(
            f"CPU time {eff['cpu_s']} s over {eff['build_wall_s']} s x {eff['cpus']} CPUs: "
            f"{eff['cpu_utilization']:.0%} busy"
        )
    return lines

"""How fast a build was and how the next one is ordered: per-object times, parallel efficiency, CPU use.

The build reads ninja's .ninja_log after the compile and records each object's time; the next build of the
same sdist starts its objects longest first by them (toolkit/build/ninja_shim.py), and `toolkit build --report`
and bench/build_efficiency.py print the figures.
"""

from __future__ import annotations

import resource
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.build.record import BuildRecord
from toolkit.build.wheelhouse import records


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

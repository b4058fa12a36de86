"""Benchmark (not a test): how well a flash-attn build used its job slots, from its build record.

`toolkit build` records every object's compile interval (ninja's .ninja_log) and the job count. This
prints the compile's wall time against its lower bound max(sum of object times / jobs, longest object),
how busy the build kept the CPUs (its processes' CPU time / (wall x CPUs): with more jobs than CPUs the
first figure flatters, this one cannot) and a model of other schedules from the same object times, and
draws the schedule: one row per job slot, one bar per object, so idle slots and a long tail show.

    python bench/build_efficiency.py gpu-machine                 # newest record in wheelhouse/gpu-machine/
    python bench/build_efficiency.py path/to/wheel.whl.build.json --png build.png

Target: parallel efficiency and CPUs busy >= 90 %.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit.base.workspace import Workspace  # noqa: E402
from toolkit.build.builder import describe  # noqa: E402
from toolkit.build.record import BuildRecord, ObjectTime  # noqa: E402
from toolkit.build.wheelhouse import records  # noqa: E402

TARGET = 0.90


def find_record(arg: str, wheelhouse: Path) -> tuple[Path, BuildRecord]:
    path = Path(arg)
    if path.suffix == ".json":
        return path, BuildRecord.read(path)
    found = records(wheelhouse / arg) if (wheelhouse / arg).is_dir() else []
    if not found:
        raise SystemExit(f"{wheelhouse / arg}: no build records (run `toolkit build {arg}` first)")
    return found[0]


def slot_rows(objects: list[ObjectTime]) -> list[int]:
    """Give each object the first slot free at its start (what ninja's scheduler did, reconstructed)."""
    free_at: list[float] = []
    rows = []
    for obj in sorted(objects, key=lambda o: o.start_s):
        row = next((i for i, end in enumerate(free_at) if end <= obj.start_s + 1e-3), len(free_at))
        if row == len(free_at):
            free_at.append(0.0)
        free_at[row] = obj.start_s + obj.seconds
        rows.append(row)
    return rows


def simulated_wall(seconds: list[float], jobs: int, cpus: int | None = None) -> float:
    """ninja's list scheduling: each object, in the given order, starts when one of `jobs` slots is free.
    With more jobs than CPUs the kernel shares the CPUs evenly: a running object advances at
    min(1, cpus / running) seconds of its own time per second."""
    cpus = cpus or jobs
    pending, running, wall = list(seconds), [], 0.0
    while pending or running:
        while pending and len(running) < jobs:
            running.append(pending.pop(0))
        rate = min(1.0, cpus / len(running))
        step = min(running) / rate
        wall += step
        running = [left - step * rate for left in running if left - step * rate > 1e-9]
    return wall


def schedule_estimates(record: BuildRecord) -> dict:
    """Compile wall time predicted from this build's own object times: in its order, longest first, and
    longest first with more jobs than CPUs (what `threads_per_cpu` in envs/base.yaml sizes).

    A model, not a measurement: it takes each recorded time as the object's work on one CPU of its own,
    which holds for a build that ran no more jobs than CPUs, and object times change with what runs
    beside them. Its file-order figure is printed next to the measured one so the model's error shows.
    """
    objects = sorted(record.outputs.objects, key=lambda o: o.start_s)
    jobs, cpus = record.outputs.efficiency["job_slots"], record.parallelism["cpus"]
    times = [o.seconds for o in objects]
    longest_first = sorted(times)[::-1]
    sweep = {n: simulated_wall(longest_first, n, cpus) for n in range(cpus, 2 * cpus + 1, max(1, cpus // 8))}
    return {"file_order_s": simulated_wall(times, jobs, cpus), "longest_first_s": simulated_wall(longest_first, jobs, cpus),
            "cpus": cpus, "work_s": sum(times), "jobs_sweep_s": sweep}


def plot(record: BuildRecord, png: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objects = sorted(record.outputs.objects, key=lambda o: o.start_s)
    eff = record.outputs.efficiency
    rows = slot_rows(objects)
    fig, ax = plt.subplots(figsize=(11, 0.25 * max(rows, default=0) + 2.5))
    for obj, row in zip(objects, rows):
        ax.barh(row, obj.seconds, left=obj.start_s, height=0.8, color="tab:blue", edgecolor="white")
    ax.axvline(eff["slot_bound_s"], color="tab:green", linestyle="--", label=f"sum / jobs = {eff['slot_bound_s']} s")
    ax.axvline(eff["longest_object_s"], color="tab:orange", linestyle=":",
               label=f"longest object = {eff['longest_object_s']} s")
    ax.set_xlabel("seconds since the first compile started")
    ax.set_ylabel("job slot")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    busy = f", CPUs {eff['cpu_utilization']:.0%} busy" if eff.get("cpu_utilization") else ""
    ax.set_title(f"{record.outputs.wheel}\n{eff['objects']} objects, {eff['job_slots']} jobs on "
                 f"{record.parallelism['cpus']} CPUs, compile {eff['compile_wall_s']} s, "
                 f"parallel efficiency {eff['parallel_efficiency']:.0%}{busy}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="line name (newest record of wheelhouse/LINE) or a .build.json file")
    parser.add_argument("--wheelhouse", type=Path, default=Workspace.wheelhouse)
    parser.add_argument("--png", type=Path, help="schedule plot (default: beside the record)")
    args = parser.parse_args()
    path, record = find_record(args.record, args.wheelhouse)
    eff = record.outputs.efficiency
    print(f"{path}:")
    for line in describe(record):
        print(f"  {line}")
    if not eff.get("objects"):
        print("  no per-object times in this record")
        return 1
    par = record.parallelism
    if par["jobs"] * par["nvcc_threads"] <= par["cpus"]:
        estimate = schedule_estimates(record)
        bound = max(eff["slot_bound_s"], eff["longest_object_s"])
        print(f"  model from these object times: file order {estimate['file_order_s']:.1f} s "
              f"(measured {eff['compile_wall_s']} s), longest first {estimate['longest_first_s']:.1f} s "
              f"(efficiency {bound / estimate['longest_first_s']:.0%})")
        print(f"  longest first with more jobs than the {estimate['cpus']} CPUs (CPUs busy = work / (CPUs x wall)):")
        for n, wall in estimate["jobs_sweep_s"].items():
            print(f"    {n:4d} jobs: {wall:7.1f} s, {estimate['work_s'] / (estimate['cpus'] * wall):.0%} busy")
    else:
        print("  no model: this build ran more nvcc threads than CPUs, so its object times are not each "
              "object's work on one CPU")
    png = args.png or path.with_name(path.name.removesuffix(".json").removesuffix(".build") + ".schedule.png")
    plot(record, png)
    figures = [eff["parallel_efficiency"]] + ([eff["cpu_utilization"]] if eff.get("cpu_utilization") else [])
    met = min(figures) >= TARGET
    print(f"  {'meets' if met else 'misses'} the {TARGET:.0%} target (parallel efficiency"
          f"{' and CPUs busy' if len(figures) > 1 else ''}); schedule plot: {png}")
    return 0 if met else 1

if __name__ == "__main__":
    raise SystemExit(main())

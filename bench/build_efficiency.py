"""Benchmark (not a test): how well a flash-attn build used its job slots, from its build record.

`toolkit build` records every object's compile interval (ninja's .ninja_log) and the job count. This
prints the compile's wall time against its lower bound max(sum of object times / jobs, longest object)
and draws the schedule: one row per job slot, one bar per object, so idle slots and a long tail show.

    python bench/build_efficiency.py gpu-machine                 # newest record in wheelhouse/gpu-machine/
    python bench/build_efficiency.py path/to/wheel.whl.build.json --png build.png

Target: parallel efficiency >= 90 %.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit.build import describe  # noqa: E402
from toolkit.wheelhouse import read_record, records  # noqa: E402

TARGET = 0.90


def find_record(arg: str, wheelhouse: Path) -> tuple[Path, dict]:
    path = Path(arg)
    if path.suffix == ".json":
        return path, read_record(path)
    found = records(wheelhouse / arg) if (wheelhouse / arg).is_dir() else []
    if not found:
        raise SystemExit(f"{wheelhouse / arg}: no build records (run `toolkit build {arg}` first)")
    return found[0]


def slot_rows(objects: list[dict]) -> list[int]:
    """Give each object the first slot free at its start (what ninja's scheduler did, reconstructed)."""
    free_at: list[float] = []
    rows = []
    for obj in sorted(objects, key=lambda o: o["start_s"]):
        row = next((i for i, end in enumerate(free_at) if end <= obj["start_s"] + 1e-3), len(free_at))
        if row == len(free_at):
            free_at.append(0.0)
        free_at[row] = obj["start_s"] + obj["seconds"]
        rows.append(row)
    return rows


def simulated_wall(seconds: list[float], jobs: int) -> float:
    """List scheduling as ninja does it: each object, in the given order, starts on the first free slot."""
    free_at = [0.0] * jobs
    for duration in seconds:
        slot = min(range(jobs), key=free_at.__getitem__)
        free_at[slot] += duration
    return max(free_at)


def schedule_estimates(record: dict) -> dict[str, float]:
    """Compile wall time predicted from this build's own object times, in its order and longest first.

    A model, not a measurement: object times change with what runs beside them. Its file-order figure
    is printed next to the measured one so the model's error shows.
    """
    objects = sorted(record["outputs"]["objects"], key=lambda o: o["start_s"])
    jobs = record["outputs"]["efficiency"]["job_slots"]
    times = [o["seconds"] for o in objects]
    return {"file_order_s": simulated_wall(times, jobs), "longest_first_s": simulated_wall(sorted(times)[::-1], jobs)}


def plot(record: dict, png: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objects = sorted(record["outputs"]["objects"], key=lambda o: o["start_s"])
    eff = record["outputs"]["efficiency"]
    rows = slot_rows(objects)
    fig, ax = plt.subplots(figsize=(11, 0.25 * max(rows, default=0) + 2.5))
    for obj, row in zip(objects, rows):
        ax.barh(row, obj["seconds"], left=obj["start_s"], height=0.8, color="tab:blue", edgecolor="white")
    ax.axvline(eff["slot_bound_s"], color="tab:green", linestyle="--", label=f"sum / jobs = {eff['slot_bound_s']} s")
    ax.axvline(eff["longest_object_s"], color="tab:orange", linestyle=":",
               label=f"longest object = {eff['longest_object_s']} s")
    ax.set_xlabel("seconds since the first compile started")
    ax.set_ylabel("job slot")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title(f"{record['outputs']['wheel']}: {eff['objects']} objects, {eff['job_slots']} jobs, "
                 f"compile {eff['compile_wall_s']} s, parallel efficiency {eff['parallel_efficiency']:.0%}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="line name (newest record of wheelhouse/LINE) or a .build.json file")
    parser.add_argument("--wheelhouse", type=Path, default=Path("wheelhouse"))
    parser.add_argument("--png", type=Path, help="schedule plot (default: beside the record)")
    args = parser.parse_args()
    path, record = find_record(args.record, args.wheelhouse)
    eff = record["outputs"]["efficiency"]
    print(f"{path}:")
    for line in describe(record):
        print(f"  {line}")
    if not eff.get("objects"):
        print("  no per-object times in this record")
        return 1
    estimate = schedule_estimates(record)
    bound = max(eff["slot_bound_s"], eff["longest_object_s"])
    print(f"  model from these object times: file order {estimate['file_order_s']:.1f} s "
          f"(measured {eff['compile_wall_s']} s), longest first {estimate['longest_first_s']:.1f} s "
          f"(efficiency {bound / estimate['longest_first_s']:.0%}; what `toolkit build` orders on the next build)")
    png = args.png or path.with_name(path.name.removesuffix(".json").removesuffix(".build") + ".schedule.png")
    plot(record, png)
    verdict = "meets" if eff["parallel_efficiency"] >= TARGET else "misses"
    print(f"  {verdict} the {TARGET:.0%} target; schedule plot: {png}")
    return 0 if eff["parallel_efficiency"] >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())

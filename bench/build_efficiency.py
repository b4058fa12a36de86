"""Benchmark (not a test): how well a flash-attn build used its job slots, from its build record.

`toolkit build` records every object's compile interval (ninja's .ninja_log) and the job count. This
prints the compile's wall time against its lower bound max(sum of object times / jobs, longest object),
how busy the build kept the CPUs (its processes' CPU time / (wall x CPUs): with more jobs than CPUs the
first figure flatters, this one cannot) and a model of other schedules from the same object times, and
draws the schedule: one row per job slot, one bar per object, so idle slots and a long tail show.

    python bench/build_efficiency.py gpu-machine                 # newest record in wheelhouse/gpu-machine/
    python bench/build_efficiency.py path/to/wheel.whl.build.json --png build.png
    python bench/build_efficiency.py --first-build               # a first build's schedule, modelled

Target: parallel efficiency and CPUs busy >= 90 %.

--first-build models a build with no record of its sdist: the objects' costs from
toolkit/knowledge/object_costs.yaml, sized as `toolkit build` sizes it (envs/gpu-machine.yaml's build values) on
the lent H200 machines of 16, 32, 64 and 128 CPUs, for 1 and 4 archs, in three orders: longest first by the
knowledge (what `toolkit build` now does), build.ninja's own (a committed build.ninja of the same sdist) and by
name. It prints and writes (JSON, PNG) the project's parallel efficiency of each, against the 95 % target, and
where no order can keep the CPUs 95 % busy, the bound every order is held to. Target: >= 95 %.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit.base.workspace import Workspace  # noqa: E402
from toolkit.build.builder import describe, size_parallelism  # noqa: E402
from toolkit.build.estimate import simulated_log  # noqa: E402
from toolkit.build.record import BuildRecord, ObjectTime  # noqa: E402
from toolkit.build.timing import efficiency  # noqa: E402
from toolkit.build.wheelhouse import records  # noqa: E402
from toolkit.knowledge.object_costs import ReleaseCosts, load_object_costs  # noqa: E402
from toolkit.spec.envspec import load_spec  # noqa: E402

TARGET = 0.90
FIRST_BUILD_TARGET = 0.95
# (CPUs, GiB) of the lent H200 machines, 1, 2, 4 and 8 GPUs (the device tool's descriptions, 2026-12-02)
MACHINES = ((16, 128), (32, 256), (64, 512), (128, 560))
FOUR_ARCHS = ("80", "90", "100", "120")  # every arch flash-attn 2.8.3's setup.py compiles
# torch's build.ninja of flash_attn-2.8.3.post2 as written, before any record ordered it (the shim's seeds aside)
TORCH_ORDER = ROOT / "docs/results/2026-12-01-h200-replica-and-fa4/replica/build.ninja"


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
    """The compile's wall time under simulated_log's model (one CPU per object)."""
    log = simulated_log([str(i) for i in range(len(seconds))], seconds, jobs, cpus)
    return max(o["start_s"] + o["seconds"] for o in log)


def schedule_estimates(record: BuildRecord) -> dict:
    """Compile wall time predicted from this build's own object times: in its order, longest first, and
    longest first with more jobs than CPUs (what `threads_per_cpu` in envs/base.yaml sizes).

    A model, not a measurement: it takes each recorded time as the object's work on one CPU of its own,
    which holds for a build that ran no more jobs than CPUs, and object times change with what runs
    beside them. Its file-order figure is printed next to the measured one so the model's error shows.
    """
    objects = sorted(record.outputs.objects, key=lambda o: o.start_s)
    jobs, cpus = record.outputs.efficiency["job_slots"], record.parallelism.cpus
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
                 f"{record.parallelism.cpus} CPUs, compile {eff['compile_wall_s']} s, "
                 f"parallel efficiency {eff['parallel_efficiency']:.0%}{busy}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


# the other committed records of the same sdist and arch: another run's times, to test the order against
OTHER_RUNS = tuple(ROOT / "docs/results" / run / "build-record.json" for run in
                   ("2026-11-29-h200-build-schedule", "2026-11-29-h200-seeded-build", "2026-12-01-h200-hold-3/replica"))
RANDOM_ORDERS = 51  # the median of this many shuffles (seeded) stands for "any order"


def torch_sources(ninja: Path = TORCH_ORDER) -> dict[str, str]:
    """object file name -> source path inside the sdist, in the `build` lines' order of a committed build.ninja
    of flash_attn-2.8.3.post2."""
    edges = re.findall(r"^build (\S+\.o): \S+ \S+?/flash_attn-2\.8\.3\.post2/(\S+)$", ninja.read_text(), re.M)
    return {Path(obj).name: source for obj, source in edges}


def run_costs(record: Path, sources: dict[str, str]) -> dict[str, float]:
    """Another committed run's object times, by source path."""
    return {sources[o.name]: o.seconds for o in BuildRecord.read(record).outputs.objects}


def modelled(order: list[str], durations: dict[str, float], jobs: int, cpus: int, threads: int,
             work: float) -> dict:
    """One order's simulated compile, with the project's figures (toolkit/build/timing.py's efficiency)."""
    log = simulated_log(order, [durations[p] for p in order], jobs, cpus, threads)
    wall = max(o["start_s"] + o["seconds"] for o in log)
    figures = efficiency(log, jobs, wall, work, cpus)
    return {"wall_s": round(wall, 1), "parallel_efficiency": figures["parallel_efficiency"],
            "cpu_utilization": figures["cpu_utilization"]}


def first_build_case(costs: ReleaseCosts, files: list[str], cpus: int, gib: float, archs: tuple[str, ...],
                     others: list[dict[str, float]]) -> dict:
    """A first build of these archs on this machine, sized as `toolkit build` sizes it, in each order.

    Each object's CPU cost is the knowledge's for the archs (additive per arch); its nvcc threads compile
    its archs side by side, so alone it takes cost / threads. No order can end before the longest object,
    nor before the total work spread over every CPU the slots can use: that is the bound. `other runs`:
    the knowledge's order timed with another committed run's object times (the order is fixed before the
    build; the times it meets are a new run's)."""
    spec = load_spec(ROOT / "envs" / "gpu-machine.yaml")
    par = size_parallelism(cpus, gib, spec.build.gb_per_nvcc_thread, spec.build.threads_per_cpu, len(archs),
                           None, None)
    knowledge = sorted(costs.cpu_seconds, key=lambda p: -costs.cpu_seconds[p])
    shuffles = [random.Random(seed).sample(files, len(files)) for seed in range(RANDOM_ORDERS)]

    def run(order: list[str], per_arch: dict[str, float]) -> dict:
        cost = {path: seconds * len(archs) for path, seconds in per_arch.items()}
        durations = {path: seconds / min(par.nvcc_threads, len(archs)) for path, seconds in cost.items()}
        work = sum(cost.values())
        bound = max(max(durations.values()), work / min(cpus, par.jobs * par.nvcc_threads))
        result = modelled(order, durations, par.jobs, cpus, par.nvcc_threads, work)
        return {**result, "ratio_to_bound": round(bound / result["wall_s"], 3), "bound_s": round(bound, 1),
                "cpu_utilization_ceiling": round(min(1.0, work / (cpus * bound)), 3),
                "longest_object_s": round(max(durations.values()), 1), "work_cpu_s": round(work, 1)}

    results = {"knowledge": run(knowledge, costs.cpu_seconds), "build.ninja": run(files, costs.cpu_seconds),
               "name": run(sorted(files), costs.cpu_seconds),
               "random": sorted((run(order, costs.cpu_seconds) for order in shuffles),
                                key=lambda r: r["wall_s"])[RANDOM_ORDERS // 2]}
    fixed = results["knowledge"]
    return {"cpus": cpus, "mem_gb": gib, "archs": list(archs), "jobs": par.jobs, "nvcc_threads": par.nvcc_threads,
            "objects": len(files), **{k: fixed[k] for k in ("work_cpu_s", "longest_object_s", "bound_s",
                                                            "cpu_utilization_ceiling")},
            "orders": {label: {k: r[k] for k in ("wall_s", "parallel_efficiency", "cpu_utilization",
                                                  "ratio_to_bound")} for label, r in results.items()},
            "knowledge_on_other_runs": [run(knowledge, times)["ratio_to_bound"] for times in others]}


def first_build_table(costs: ReleaseCosts) -> list[dict]:
    sources = torch_sources()
    files = list(sources.values())
    if sorted(files) != sorted(costs.cpu_seconds):
        raise SystemExit(f"{TORCH_ORDER}: its objects are not the knowledge's {costs.version} objects")
    others = [run_costs(record, sources) for record in OTHER_RUNS]
    return [first_build_case(costs, files, cpus, gib, archs, others) for cpus, gib in MACHINES
            for archs in ((costs.arch,), FOUR_ARCHS)]


def print_first_build(costs: ReleaseCosts, table: list[dict]) -> bool:
    print(f"first build of flash-attn {costs.version} ({costs.key.profile}), object costs from "
          f"toolkit/knowledge/object_costs.yaml ({costs.source}); modelled, sized as `toolkit build` sizes it")
    print("  parallel efficiency = max(sum of object times / jobs, longest object) / compile wall (docs/building.md);"
          " CPUs busy = work / (CPUs x wall);")
    print("  bound = max(longest object, work / CPUs the slots can use): no order ends sooner; ceiling = CPUs busy "
          "at the bound")
    missed = []
    for case in table:
        knowledge = case["orders"]["knowledge"]
        if knowledge["parallel_efficiency"] < FIRST_BUILD_TARGET:
            missed.append(f"{case['cpus']} CPUs x {len(case['archs'])} arch ({knowledge['parallel_efficiency']:.1%}, "
                          f"{knowledge['ratio_to_bound']:.1%} of the bound)")
        print(f"  {case['cpus']:3d} CPUs, {len(case['archs'])} arch{'s' if len(case['archs']) > 1 else ' '}: "
              f"{case['jobs']:3d} jobs x {case['nvcc_threads']} nvcc threads, {case['objects']} objects, "
              f"bound {case['bound_s']:.0f} s, CPUs-busy ceiling {case['cpu_utilization_ceiling']:.0%}")
        for label, result in case["orders"].items():
            print(f"      {label:12s} {result['wall_s']:7.0f} s  parallel efficiency "
                  f"{result['parallel_efficiency']:.1%}  CPUs busy {result['cpu_utilization']:.1%}  "
                  f"ratio to bound {result['ratio_to_bound']:.1%}")
        print(f"      knowledge's order with the other runs' times: ratio to bound "
              f"{', '.join(f'{r:.1%}' for r in case['knowledge_on_other_runs'])}")
        if case["cpu_utilization_ceiling"] < FIRST_BUILD_TARGET:
            print(f"      no order keeps these {case['cpus']} CPUs {FIRST_BUILD_TARGET:.0%} busy: "
                  f"{case['objects']} objects, the longest {case['longest_object_s']:.0f} s, "
                  f"{case['work_cpu_s']:.0f} CPU s of work")
    print(f"  the knowledge's order: parallel efficiency >= {FIRST_BUILD_TARGET:.0%} "
          + (f"everywhere but {'; '.join(missed)}" if missed else "at every size"))
    return not missed


def plot_first_build(table: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arch_counts = sorted({len(c["archs"]) for c in table})
    fig, axes = plt.subplots(2, len(arch_counts), figsize=(12, 7), sharey=True, squeeze=False)
    labels = list(table[0]["orders"])
    for col, n in enumerate(arch_counts):
        cases = [c for c in table if len(c["archs"]) == n]
        for row, figure in enumerate(("parallel_efficiency", "cpu_utilization")):
            ax = axes[row][col]
            width = 0.8 / len(labels)
            for k, label in enumerate(labels):
                ax.bar([i + (k - (len(labels) - 1) / 2) * width for i in range(len(cases))],
                       [c["orders"][label][figure] for c in cases], width=width, label=label)
            if figure == "cpu_utilization":
                ax.plot(range(len(cases)), [c["cpu_utilization_ceiling"] for c in cases], "k_", markersize=30,
                        label="ceiling (any order)")
            ax.axhline(FIRST_BUILD_TARGET, color="grey", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(cases)), [f"{c['cpus']} CPUs\n{c['jobs']}x{c['nvcc_threads']}" for c in cases])
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{n} arch{'s' if n > 1 else ''}: {figure.replace('_', ' ')}")
    handles, names = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=9)
    fig.suptitle("first build of flash-attn 2.8.3.post2, modelled from the knowledge's object costs "
                 "(dashed: 95 % target)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(png, dpi=110)


def first_build_main(args: argparse.Namespace) -> int:
    costs = next((r for r in load_object_costs().releases if r.version == args.release and r.key.profile == "fa2"), None)
    if costs is None:
        raise SystemExit(f"toolkit/knowledge/object_costs.yaml: no fa2 costs of flash-attn {args.release}")
    table = first_build_table(costs)
    met = print_first_build(costs, table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"release": costs.version, "profile": costs.key.profile, "source": costs.source,
                                     "target": FIRST_BUILD_TARGET, "cases": table}, indent=1) + "\n")
    png = args.png or args.json.with_suffix(".png")
    plot_first_build(table, png)
    print(f"  json: {args.json}; plot: {png}")
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", nargs="?", help="line name (newest record of wheelhouse/LINE) or a .build.json file")
    parser.add_argument("--wheelhouse", type=Path, default=Workspace.wheelhouse)
    parser.add_argument("--png", type=Path, help="schedule plot (default: beside the record, or the JSON)")
    parser.add_argument("--first-build", action="store_true",
                        help="model a first build's schedule from the knowledge's object costs instead")
    parser.add_argument("--release", default="2.8.3.post2", help="flash-attn release of --first-build")
    parser.add_argument("--json", type=Path, default=Path("reports/build-efficiency/first-build.json"),
                        help="--first-build's figures (default: %(default)s, the plot beside it)")
    args = parser.parse_args()
    if args.first_build:
        return first_build_main(args)
    if not args.record:
        parser.error("name a record (or a line), or pass --first-build")
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

"""Benchmark (a model, not a measurement): how long one build's compiles take spread over 1-8 nodes by
`toolkit build LINE --slurm`, from the measured object costs.

Every compile is one Slurm job step of one CPU (one arch: the measured builds compiled sm_90 / sm_90a only), so
an allocation of N nodes of C cores is N x C slots, and ninja with -j N x C starts the objects longest first
(the ninja shim's order) on whichever slot is free: list scheduling, toolkit/build/estimate.py's compile_wall.
Nothing here ran on several nodes: the figures are what the measured object costs give under that schedule,
for the compile phase only (setup.py's link and the wheel, on one node, come on top; so does each step's srun
start, well under a second against objects of minutes).

    python bench/multinode.py --out docs/results/2026-12-05-multinode-model

Objects and their costs (CPU seconds of one object on one CPU):
  FA2: flash-attn 2.8.3.post2's 73 objects, toolkit/knowledge/object_costs.yaml's fa2 entry (32 jobs on 32
       CPUs: each time is one object's own CPU work).
  FA3 full: the 293 sources of hopper/setup.py with no FLASH_ATTENTION_DISABLE_* switch (the vendored excerpt
       tests/data/fa3/hopper_setup_excerpt.txt, evaluated as tests/test_fa3.py does). 30 of them are measured
       (the fa3 entry, hopper-training-fp8: wall seconds of 20 compiles on 16 CPUs, scaled to CPU seconds by that
       record's cpu_s / sum of object seconds); every other one costs the mean of the measured objects of its
       direction (backward, forward), as docs/fa3.md's table assumes: head dims 96-256 untimed.
For each profile and node size: the makespan on 1-8 nodes, the bound no number of nodes beats (the longest
object), and where more nodes stop helping: the first node count whose makespan is within 5 % of the bound
(or, where none is, the last count that still cut the makespan by 5 % or more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # test_fa3's evaluation of the vendored setup.py excerpt

from test_fa3 import setup_py_sources  # noqa: E402

from toolkit.build.estimate import compile_wall  # noqa: E402
from toolkit.knowledge import fa3_pins  # noqa: E402
from toolkit.knowledge.object_costs import ReleaseCosts, load_object_costs  # noqa: E402

NODES = range(1, 9)
CORES = (16, 32, 64, 128)
NEAR_BOUND = 1.05  # within 5 % of the longest object: more nodes cannot help
WORTH_IT = 0.05  # a node count that cuts the makespan by less than this over the one before does not help
FA3_RECORD = ROOT / "docs/results/2026-12-02-h200-fa3/build-record.json"


def release(profile: str) -> ReleaseCosts:
    (found,) = [r for r in load_object_costs().releases if r.key.profile == profile]
    return found


def fa2_costs() -> dict[str, float]:
    return dict(release("fa2").cpu_seconds)


def fa3_full_costs() -> tuple[dict[str, float], dict[str, object]]:
    """Every source of the full profile with its CPU seconds, and how they were made."""
    measured = release("fa3")
    record = json.loads(FA3_RECORD.read_text())["outputs"]["efficiency"]
    to_cpu = record["cpu_s"] / record["sum_object_s"]  # 20 compiles shared 16 CPUs
    known = {path.removeprefix("hopper/"): s * to_cpu for path, s in measured.cpu_seconds.items()}
    mean = {
        kind: statistics.mean(s for path, s in known.items() if ("_bwd_" in path) == (kind == "bwd"))
        for kind in ("bwd", "fwd")
    }
    sources = setup_py_sources(set(fa3_pins.profile("full").switches))
    costs = {s: known.get(s, mean["bwd" if "_bwd_" in s else "fwd"]) for s in sources}
    basis = {
        "measured_objects": sum(1 for s in sources if s in known),
        "cpu_per_wall_second": round(to_cpu, 3),
        "mean_cpu_s_backward": round(mean["bwd"], 1),
        "mean_cpu_s_forward": round(mean["fwd"], 1),
    }
    return costs, basis


def model(costs: dict[str, float]) -> dict[str, object]:
    """Makespans on 1-8 nodes of each size, the bound and where more nodes stop helping."""
    seconds = list(costs.values())
    bound = max(seconds)
    rows = []
    for cores in CORES:
        walls = [compile_wall(seconds, nodes * cores, 1, nodes * cores) for nodes in NODES]
        near = next((n for n, w in zip(NODES, walls) if w <= NEAR_BOUND * bound), None)
        helping = [n for n, before, w in zip(NODES[1:], walls, walls[1:]) if w < (1 - WORTH_IT) * before]
        rows.append(
            {
                "cores_per_node": cores,
                "makespan_s": {str(n): round(w, 1) for n, w in zip(NODES, walls)},
                "speedup_8_over_1": round(walls[0] / walls[-1], 2),
                "nodes_within_5pct_of_bound": near,
                "last_node_count_that_helps": max(helping, default=1),
            }
        )
    return {
        "objects": len(seconds),
        "cpu_s": round(sum(seconds), 0),
        "bound_s": round(bound, 1),
        "longest_object": max(costs, key=costs.__getitem__),
        "rows": rows,
    }


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f}"


def print_table(name: str, result: dict) -> None:
    print(
        f"\n{name}: {result['objects']} objects, {result['cpu_s']:.0f} CPU s, bound {minutes(result['bound_s'])} "
        f"min (longest object {result['longest_object']}); compile minutes on N nodes:"
    )
    print(
        "cores/node " + " ".join(f"{n:>5}" for n in NODES) + "   8/1 x   near bound at   last helping"
    )
    for row in result["rows"]:
        walls = " ".join(minutes(row["makespan_s"][str(n)]) for n in NODES)
        near = row["nodes_within_5pct_of_bound"]
        print(
            f"{row['cores_per_node']:>10} {walls}   {row['speedup_8_over_1']:>5}   "
            f"{(str(near) + ' node(s)') if near else 'beyond 8':>13}   {row['last_node_count_that_helps']:>12}"
        )


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2))
    for ax, (name, result) in zip(axes, results.items()):
        for row in result["rows"]:
            walls = [row["makespan_s"][str(n)] / 60 for n in NODES]
            ax.plot(list(NODES), walls, marker="o", label=f"{row['cores_per_node']} cores/node")
        ax.axhline(result["bound_s"] / 60, color="k", linestyle="--", label="bound: the longest object")
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("compile minutes (model)")
        ax.set_title(f"{name}: {result['objects']} objects, {result['cpu_s'] / 3600:.1f} CPU h")
        ax.legend(fontsize=8)
    fig.suptitle("toolkit build --slurm, modelled from measured object costs (not a multi-node run)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for multinode.json and multinode.png")
    args = parser.parse_args()
    fa3_costs, fa3_basis = fa3_full_costs()
    results = {"FA2 2.8.3.post2": model(fa2_costs()), "FA3 full profile": model(fa3_costs)}
    results["FA3 full profile"]["costs_basis"] = fa3_basis
    print("MODEL from measured object costs (toolkit/knowledge/object_costs.yaml), not a multi-node measurement")
    for name, result in results.items():
        print_table(name, result)
    print(
        f"\nFA3 full: {fa3_basis['measured_objects']} of 293 objects measured; the others cost the measured "
        f"mean of their direction (backward {fa3_basis['mean_cpu_s_backward']} CPU s, forward "
        f"{fa3_basis['mean_cpu_s_forward']} CPU s)"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        document = {
            "kind": "model from measured object costs, not a measurement",
            "schedule": "longest first, one object per CPU, nodes x cores slots (estimate.compile_wall)",
            "near_bound": NEAR_BOUND,
            "worth_it": WORTH_IT,
            "results": results,
        }
        (args.out / "multinode.json").write_text(json.dumps(document, indent=1) + "\n")
        plot(results, args.out / "multinode.png")
        print(f"written: {args.out / 'multinode.json'}, {args.out / 'multinode.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

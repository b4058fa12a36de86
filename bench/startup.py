"""Benchmark (not a test): the everyday verbs' start-up and reading a lock, against the libraries on the same files.

Rows, each job a fresh process (wall seconds, and CPU seconds of it and all it started), the sides alternating
which goes first, repeated --repeat times (median reported), after one unmeasured run of each (so each side's
bytecode is written and used: PYTHONDONTWRITEBYTECODE is cleared for the children):

- `toolkit --help` against `pip --help` (the same python);
- `toolkit check LINE` against libyaml (yaml.CSafeLoader) loading the line's spec files, the files check reads;
- reading the largest committed lock (toolkit.env.lockfile.read_lock: parsed, verified, typed) against one
  yaml.CSafeLoader load of the same file.

With --before DIR (a checkout of an earlier commit, e.g. `git worktree add /tmp/before main`), the toolkit of DIR
runs each toolkit job too, as a third side of the same rows.

    python bench/startup.py --repeat 7 --out docs/results/2026-12-05-everyday-startup
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from timing import Run, alternating, as_pairs, measured, run_metadata, side_figures

ROOT = Path(__file__).resolve().parent.parent
# The goals set for these jobs, CPU seconds of the whole process.
GOALS = {"toolkit --help": 0.15, "toolkit check LINE": 0.5, "read a lock": 0.15}

READ_LOCK = "import sys\nfrom toolkit.env.lockfile import read_lock\nread_lock(sys.argv[1])\n"
LOAD_YAML = "import sys, yaml\nfor p in sys.argv[1:]:\n    yaml.load(open(p).read(), Loader=yaml.CSafeLoader)\n"


def jobs(line: str, lock: Path) -> dict[str, dict[str, list[str]]]:
    """Each row's command per side; "toolkit" commands run with the toolkit of PYTHONPATH."""
    spec_files = [ROOT / "envs" / f"{line}.yaml", ROOT / "envs" / "base.yaml"]
    python = sys.executable
    return {
        "toolkit --help": {"toolkit": [python, "-m", "toolkit", "--help"], "library": [python, "-m", "pip", "--help"]},
        "toolkit check LINE": {"toolkit": [python, "-m", "toolkit", "check", line],
                               "library": [python, "-c", LOAD_YAML, *map(str, spec_files)]},
        "read a lock": {"toolkit": [python, "-c", READ_LOCK, str(lock)], "library": [python, "-c", LOAD_YAML, str(lock)]},
    }


def run(args: argparse.Namespace, lock: Path) -> dict[str, dict[str, list[Run]]]:
    # Each side's toolkit (none for the library's), which its jobs run in the folder of: `python -m` puts the working
    # folder first on sys.path.
    sides: dict[str, Path | None] = {"toolkit": ROOT, "library": None}
    if args.before:
        sides["before"] = args.before.resolve()

    def job(command: list[str], toolkit: Path | None) -> Callable[[int], Run]:
        return lambda _turn: measured(command, {"PYTHONPATH": str(toolkit)} if toolkit else {}, toolkit or ROOT)

    rows = {name: {side: job(commands["toolkit" if toolkit else "library"], toolkit) for side, toolkit in sides.items()}
            for name, commands in jobs(args.line, lock).items()}
    for row in rows.values():
        for each in row.values():  # unmeasured: bytecode written, caches filled
            each(0)
    return alternating(rows, args.repeat)


def summary(rows: dict[str, dict[str, list[Run]]]) -> dict:
    out = {}
    for name, row in rows.items():
        figures = side_figures(row)
        out[name] = {
            **figures,
            "cpu_ratio": figures["toolkit_cpu_s"] / figures["library_cpu_s"],
            "wall_ratio": figures["toolkit_wall_s"] / figures["library_wall_s"],
            "goal_cpu_s": GOALS[name],
            "goal_met": figures["toolkit_cpu_s"] <= GOALS[name],
            "runs": as_pairs(row),
        }
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    sides = [s for s in ("before", "toolkit", "library") if f"{s}_cpu_s" in results[names[0]]]
    labels = {"before": "toolkit before", "toolkit": "toolkit now", "library": "library (pip / libyaml)"}
    width = 0.8 / len(sides)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for k, side in enumerate(sides):
        xs = [i + (k - (len(sides) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [results[n][f"{side}_cpu_s"] for n in names], width, label=labels[side])
    for i, n in enumerate(names):
        ax.hlines(results[n]["goal_cpu_s"], i - 0.45, i + 0.45, colors="black", linestyles="dashed")
    ax.plot([], [], "k--", label="goal")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("CPU seconds per process (median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--line", default="py-cu130", help="the line `toolkit check` checks")
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit, measured as a third side")
    parser.add_argument("--out", type=Path, help="folder for results.json and startup.png")
    args = parser.parse_args()
    lock = max((ROOT / "locks").glob("*.conda-lock.yml"), key=lambda p: p.stat().st_size)
    results = summary(run(args, lock))
    for name, r in results.items():
        before = f"before {r['before_cpu_s']:5.2f} s CPU | " if "before_cpu_s" in r else ""
        print(f"{name:19s} {before}toolkit {r['toolkit_wall_s']:5.2f} s wall {r['toolkit_cpu_s']:5.2f} s CPU | "
              f"library {r['library_wall_s']:5.2f} s wall {r['library_cpu_s']:5.2f} s CPU | ratio "
              f"{r['cpu_ratio']:.2f}x CPU | goal <= {r['goal_cpu_s']} s CPU: {'met' if r['goal_met'] else 'MISSED'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = run_metadata("startup.py", sys.argv[1:], lock=lock.name, line=args.line, repeat=args.repeat)
        (args.out / "results.json").write_text(json.dumps({**meta, "rows": results}, indent=1) + "\n")
        plot(results, args.out / "startup.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

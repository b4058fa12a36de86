"""`toolkit matrix`: the lines side by side, as a terminal table or JSON for CI."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.knowledge import load_knowledge
from toolkit.rules import checked_spec
from toolkit.spec import EnvSpec, resolve_spec_arg, spec_paths


@dataclass(frozen=True)
class MatrixRow:
    line: str
    cuda: str
    python: str
    torch: str
    gcc: str
    flash_attn: str
    archs: list[str]
    driver_floor: str
    toolchain: str
    platforms: list[str]


def matrix_row(spec: EnvSpec) -> MatrixRow:
    line = load_knowledge().cuda_lines[spec.cuda]
    return MatrixRow(spec.line, spec.cuda, spec.python, spec.torch_version, spec.gcc, spec.flash_attn_version,
                     list(spec.archs), line.min_driver, spec.toolchain.kind, list(spec.platforms))


def selected_specs(names: list[str], envs_dir: Path) -> list[EnvSpec]:
    paths = [resolve_spec_arg(n, envs_dir) for n in names] if names else spec_paths(envs_dir)
    return [checked_spec(p) for p in paths]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "matrix", help="show every line's versions side by side",
        description="One row per CUDA line: CUDA, python, torch, gcc, flash-attn, archs, driver floor, toolchain.")
    parser.add_argument("lines", nargs="*", metavar="LINE", help="lines to show (default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON (a list of rows) instead of a table")
    parser.add_argument("--envs", type=Path, default=Path("envs"), help="spec directory (default: envs)")
    parser.set_defaults(func=run_matrix)


def run_matrix(args: argparse.Namespace) -> int:
    rows = [matrix_row(spec) for spec in selected_specs(args.lines, args.envs)]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="FlashAttention build matrix")
    for column in ("line", "CUDA", "python", "torch", "gcc", "flash-attn", "archs", "driver >=", "toolchain"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.line, r.cuda, r.python, r.torch, r.gcc, r.flash_attn, " ".join(r.archs), r.driver_floor,
                      r.toolchain)
    Console().print(table)
    return 0

"""`toolkit verify LINE`: check the installed flash-attn on a GPU against an fp32 reference attention.

Levels: `smoke` (every API and feature once, under 30 s), `full` (the whole grid plus transformers
parity, under 5 min on one H200), `parity` (only the transformers check). Reports go to
reports/<line>/verify.json and verify.xml; the exit status is non-zero on any failure.
This module stays light (no torch at import): the CLI loads it to register the verb.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from toolkit.base.entry import program

# torch warns "Failed to initialize NumPy" when it is imported where numpy is missing (a line's venv need not
# have it: attention never converts to numpy); the warning came before verify's own answer and read as the
# cause. Every measuring entry (python -m toolkit.verify, .bench, .fa3, .fa4) imports this package first.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

LEVELS = ("smoke", "full", "parity")


WITH_PARITY = ("full", "parity")
BACKENDS = ("flash-attn", "flash-attn-3")  # attention_backends.yaml's names of what `toolkit verify` can check
DEVICE = "cuda"  # the CPU tests point this at the CPU and hand in a test double for flash-attn


def register(subparsers: argparse._SubParsersAction) -> None:
    from toolkit.verify.machine import add_line_arguments

    parser = subparsers.add_parser(
        "verify", help="check flash-attn on a GPU against an fp32 reference attention",
        description="Run the verification suite against the flash-attn installed in the line's environment: "
                    "every API, fwd+bwd, fp16/bf16, head dims 32-256, masks, GQA, softcap, ALiBi, dropout, "
                    "deterministic backward; the full level adds transformers parity. Writes "
                    "reports/LINE/verify.json and verify.xml; exit 1 on any failure or without a GPU.")
    add_line_arguments(parser)
    parser.add_argument("--level", choices=LEVELS, default="smoke", help="how much to run (default: smoke)")
    parser.add_argument("--backend", choices=BACKENDS, default="flash-attn",
                        help="flash-attn (2.x, default) or flash-attn-3: the line's FlashAttention-3 build, the cases "
                             "its flash_attn_3 profile leaves out recorded as unsupported; reports go to "
                             "reports/LINE/flash-attn-3/ unless --report-dir says otherwise")
    parser.set_defaults(func=verify_command)


def verify_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.verify import machine, report

    if args.backend == "flash-attn-3":
        return verify_fa3_command(args)
    command = f"toolkit verify {args.line} --level {args.level}"
    code, written = machine.measure_for_line(
        args, machine.checked_line_spec(args), "toolkit.verify", ["--level", args.level, "--command", command],
        lambda line, report_dir: measure(line, args.level, report_dir, command), "verification", "verify.json")
    if written:
        report.show(written, Console())
    return code


def verify_fa3_command(args: argparse.Namespace) -> int:
    """FlashAttention-3 of a line with a flash_attn_3 section, judged for the cases its profile builds."""
    from rich.console import Console

    from toolkit.base.errors import ToolkitError
    from toolkit.base.workspace import Workspace
    from toolkit.verify import fa3, machine, report

    if args.level == "parity":
        raise ToolkitError("toolkit verify --backend flash-attn-3: no transformers parity for FA3 yet "
                           "(use --level smoke or full)")
    spec = machine.checked_line_spec(args)
    profile = fa3.line_profile(spec)
    args.report_dir = args.report_dir or Workspace.from_args(args).backend_report_dir(spec.line, "flash-attn-3")
    command = f"toolkit verify {args.line} --backend flash-attn-3 --level {args.level}"
    code, written = machine.measure_for_line(
        args, spec, "toolkit.verify.fa3", ["--level", args.level, "--profile", profile, "--command", command],
        lambda line, report_dir: fa3.measure(line, args.level, report_dir, command, profile),
        "verification", "verify.json")
    if written:
        report.show(written, Console())
    return code


def measure(line: str, level: str, report_dir: Path, command: str) -> int:
    """The GPU side, in the environment's own python: run, write the reports, return the exit status."""
    from toolkit.verify import machine, report
    from toolkit.verify.cases import LEVELS as CASES

    machine.require_cuda("verification")
    from toolkit.verify.parity import run_parity
    from toolkit.verify.runner import run_suite

    flash_attn, import_error = machine.import_flash_attn()
    environment = machine.environment_info(flash_attn, command)
    start = time.perf_counter()
    results, parity = [], []
    if flash_attn is not None:
        cases = CASES[level]() if level in CASES else []
        with machine.progress(len(cases), f"verify {line} ({level})") as advance:
            results = run_suite(flash_attn, cases, DEVICE, lambda result: advance(
                "" if result.status == "passed" else f"{result.status}: {result.name}: {result.message}"))
        if level in WITH_PARITY:
            parity = run_parity(DEVICE)
    data = report.build_report(line, level, environment, results, parity, time.perf_counter() - start, import_error)
    if level in WITH_PARITY:
        data["recommended"] = parity_recommendation(line)
    report.write_reports(data, report_dir)
    return 0 if report.passed(data) else 1


def parity_recommendation(line: str) -> dict | None:
    """The attn_implementation the line's recommendation names for the parity model's shape (head dim 64,
    causal, bf16, the parity's seqlen), recorded beside the parity rows."""
    from toolkit.attention.recommend import for_parity
    from toolkit.base.workspace import Workspace
    from toolkit.verify.parity import PARITY

    return for_parity(Workspace().recommendation_file(line), PARITY.head_dim, PARITY.seqlen)


@program
def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.verify LINE`: the measurement alone, as re-executed under the line's python."""
    parser = argparse.ArgumentParser(prog="python -m toolkit.verify")
    parser.add_argument("line", metavar="LINE")
    parser.add_argument("--level", choices=LEVELS, default="smoke")
    parser.add_argument("--report-dir", type=Path, required=True)
    parser.add_argument("--command", default="python -m toolkit.verify")
    args = parser.parse_args(argv)
    return measure(args.line, args.level, args.report_dir, args.command)

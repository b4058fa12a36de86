"""`toolkit verify LINE [--impl NAME]`: check an attention implementation on a GPU against an fp32 reference.

Levels: `smoke` (every API and feature once, under 30 s), `full` (the whole grid, plus transformers parity for
flash-attn-2, under 5 min on one H200), `parity` (only the transformers check). Each implementation's suite is
a module behind the Suite protocol (toolkit/verify/suite.py), named in SUITES; everything else lives here once:
the verb, the run (GPU gate, import, environment, progress, reports written as it goes) and the child
`python -m toolkit.verify LINE --impl NAME` re-executed under the line's python. The exit status is non-zero on
any failure. This module stays light (no torch at import): the CLI loads it to register the verb.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from toolkit.attention import backends
from toolkit.base.arguments import add_arch, add_line, add_report_dir
from toolkit.base.entry import add_option_alias, program, renamed_choice
from toolkit.verify import fa2, fa3, fa4
from toolkit.verify.suite import Run, Suite

SUITES: dict[str, Suite] = {"flash-attn-2": fa2, "flash-attn-3": fa3, "flash-attn-4": fa4}
DEFAULT = "flash-attn-2"
LEVELS = ("smoke", "full", "parity")


def add_suite_options(parser: argparse.ArgumentParser, prog: str) -> None:
    """--impl, --level and --arch: what the verb and its child share."""
    parser.add_argument(
        "--impl",
        choices=tuple(SUITES),
        default=DEFAULT,
        metavar="NAME",
        type=renamed_choice(tuple(SUITES), backends.renamed(), prog),  # earlier names, still read
        help=f"the implementation to verify: {', '.join(SUITES)} (default: {DEFAULT}); each one's "
        "cases its build or GPU cannot take are recorded as unsupported",
    )
    parser.add_argument(
        "--level",
        choices=LEVELS,
        default="smoke",
        metavar="LEVEL",
        help="smoke: every API and feature once; full: the whole grid; parity: transformers' "
        "tiny-Llama logits alone (default: smoke)",
    )
    add_arch(
        parser,
        type=int,
        help="the sm to judge the cases for, as an integer, e.g. 90 (default: the GPU's; "
        "flash-attn-3 and flash-attn-4 take the cases their knowledge lists for it)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    from toolkit.verify.machine import add_line_arguments

    parser = subparsers.add_parser(
        "verify",
        description="Run the verification suite against the implementation installed in the line's environment "
        "(--impl, default flash-attn-2): every API, fwd+bwd, fp16/bf16, head dims 32-256, masks, GQA, "
        "softcap, ALiBi, dropout, deterministic backward, each where the implementation has it; "
        "flash-attn-2's full level adds transformers parity. Writes verify.json and verify.xml to "
        "reports/LINE/ (flash-attn-2) or the implementation's folder in it, where `toolkit recommend` "
        "looks (unless --report-dir says otherwise); exit 1 on any failure or without a GPU.",
    )
    add_line_arguments(parser)
    add_suite_options(parser, parser.prog)
    add_option_alias(parser, "--backend", "--impl")
    parser.set_defaults(func=verify_command)


def verify_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.base.workspace import Workspace
    from toolkit.verify import machine, report

    suite = checked_suite(args.impl, args.level)
    spec = machine.checked_line_spec(args)
    profile = suite.build_profile(spec)
    args.report_dir = args.report_dir or Workspace.from_args(args).backend_report_dir(
        spec.line, args.impl
    )
    command = " ".join(["toolkit verify", args.line, *reproduce(args.impl, args.level, args.arch)])
    child = [
        "--impl",
        args.impl,
        "--level",
        args.level,
        *(["--profile", profile] if profile else []),
        *(["--arch", str(args.arch)] if args.arch else []),
        "--command",
        command,
    ]
    code, written = machine.measure_for_line(
        args,
        spec,
        "toolkit.verify",
        child,
        lambda line, report_dir: measure(
            args.impl, line, args.level, report_dir, command, args.arch, profile
        ),
        "verification",
        "verify.json",
    )
    if written:
        report.show(written, Console())
    return code


def checked_suite(impl: str, level: str) -> Suite:
    """The suite of `impl`, or a one-line refusal of a level it does not have."""
    from toolkit.base.errors import ToolkitError

    suite = SUITES[impl]
    why = suite.refusal(level)
    if why:
        raise ToolkitError(f"toolkit verify --impl {impl}: {why}")
    return suite


def reproduce(impl: str, level: str, arch: int | None) -> list[str]:
    """The options that repeat a run, as its report records them (the default implementation left out)."""
    return [
        *([] if impl == DEFAULT else ["--impl", impl]),
        "--level",
        level,
        *(["--arch", str(arch)] if arch else []),
    ]


def measure(
    impl: str,
    line: str,
    level: str,
    report_dir: Path,
    command: str,
    arch: int | None = None,
    profile: str | None = None,
) -> int:
    """The GPU side, in the environment's own python: run the suite, the report rewritten after every case (a
    killed run keeps what it judged), then parity; return the exit status."""
    from toolkit.verify import machine, report

    suite = checked_suite(impl, level)
    machine.require_cuda("verification")
    run = Run(line, level, report_dir, command, arch, profile)
    module, import_error = suite.import_implementation()
    environment = {**machine.environment_info(module, command), **suite.environment(module, run)}
    label = suite.LEVEL_PREFIX + level
    start = time.perf_counter()
    results: list = []
    parity: list = []

    def write(label: str, recommended: bool = False) -> dict:
        data = report.build_report(
            line, label, environment, results, parity, time.perf_counter() - start, import_error
        )
        if recommended:
            data["recommended"] = parity_recommendation(line)
        report.write_reports(data, report_dir)
        return data

    if module is not None:
        cases = suite.cases(level)
        if cases:
            title = f"verify {line} {impl} ({level}{f', {profile}' if profile else ''})"
            machine.judge_with_partial_reports(
                results,
                len(cases),
                label,
                title,
                write,
                lambda on_result: suite.judge(module, cases, run, on_result),
            )
        parity += suite.parity(level)
    return 0 if report.passed(write(label, recommended=level in suite.WITH_PARITY)) else 1


def parity_recommendation(line: str) -> dict[str, Any] | None:
    """The attn_implementation the line's recommendation names for the parity model's shape (head dim 64,
    causal, bf16, the parity's seqlen), recorded beside the parity rows."""
    from toolkit.attention.recommend import for_parity
    from toolkit.base.workspace import Workspace
    from toolkit.verify.parity import PARITY

    return for_parity(Workspace().recommendation_file(line), PARITY.head_dim, PARITY.seqlen)


@program
def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.verify LINE --impl NAME`: the measurement alone, in this python (as `toolkit verify`
    re-executes it under the line's python); run by hand, it shows the report as the verb does."""
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.verify",
        description="The measuring half of `toolkit verify`, in this python, without reading the line's spec.",
    )
    add_line(parser, "the line's name, recorded in the report")
    add_suite_options(parser, parser.prog)
    add_report_dir(parser, "where the reports go", required=True)
    parser.add_argument(
        "--profile", metavar="NAME", help="the build profile the line's spec names (flash-attn-3)"
    )
    parser.add_argument(
        "--command", metavar="TEXT", help="the command recorded in the report (default: this one)"
    )
    args = parser.parse_args(argv)
    command = args.command or " ".join(
        ["python -m toolkit.verify", args.line, *reproduce(args.impl, args.level, args.arch)]
    )
    code = measure(
        args.impl, args.line, args.level, args.report_dir, command, args.arch, args.profile
    )
    if args.command is None:  # run by hand: show it; under `toolkit verify` the parent shows it
        from rich.console import Console

        from toolkit.verify import report

        report.show(args.report_dir / "verify.json", Console())
    return code

"""Verification reports: the JSON record, JUnit XML for CI dashboards, and the console tables.

The JSON is the source of truth; the XML and the tables are rendered from it, so a report written by
a child process (the line's own python) is shown the same way by the parent.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.attention import formats
from toolkit.base.atomic import write_atomic
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json

if TYPE_CHECKING:  # no torch needed to render a report
    from rich.console import Console

    from toolkit.verify.parity import ParityResult
    from toolkit.verify.runner import CaseResult

STATUSES = (
    "passed",
    "failed",
    "error",
    "unsupported",
)  # unsupported: not listed for the GPU or the build


def build_report(
    line: str,
    level: str,
    environment: dict,
    results: list[CaseResult],
    parity: list[ParityResult],
    duration_s: float,
    setup_error: str = "",
) -> dict:
    """The whole run as plain data. `setup_error` is set when nothing could run (flash-attn won't import)."""
    cases = [asdict(r) for r in results]
    parity_rows = [asdict(r) for r in parity]
    everything = cases + parity_rows
    summary: dict[str, object] = {
        status: sum(1 for row in everything if row["status"] == status) for status in STATUSES
    }
    summary.update(total=len(everything), duration_s=round(duration_s, 2), setup_error=setup_error)
    return {
        "kind": "verify",
        "schema": formats.SCHEMA,
        "line": line,
        "level": level,
        **environment,
        "summary": summary,
        "cases": cases,
        "parity": parity_rows,
    }


def passed(report: dict) -> bool:
    summary = report["summary"]
    return (
        not summary["setup_error"]
        and summary["failed"] == 0
        and summary["error"] == 0
        and summary["total"] > 0
    )


def write_reports(report: dict, report_dir: Path) -> tuple[Path, Path]:
    json_path, xml_path = report_dir / "verify.json", report_dir / "verify.xml"
    write_atomic(json_path, json.dumps(report, indent=2) + "\n")
    write_atomic(xml_path, junit_xml(report))
    return json_path, xml_path


# ---------------------------------------------------------------- JUnit


def _suite(
    parent: ET.Element, name: str, rows: list[dict], report: dict, classname: Callable[[dict], str]
) -> None:
    suite = ET.SubElement(
        parent,
        "testsuite",
        name=name,
        tests=str(len(rows)),
        failures=str(sum(r["status"] == "failed" for r in rows)),
        errors=str(sum(r["status"] == "error" for r in rows)),
        skipped=str(sum(r["status"] == "unsupported" for r in rows)),
        time=f"{sum(r['duration_s'] for r in rows):.3f}",
        timestamp=report["date"],
        hostname=report["hostname"],
    )
    properties = ET.SubElement(suite, "properties")
    for key in ("line", "level", "gpu", "torch", "cuda", "python", "command"):
        ET.SubElement(properties, "property", name=key, value=str(report.get(key)))
    ET.SubElement(
        properties, "property", name="flash_attn", value=str(report["flash_attn"]["version"])
    )
    for row in rows:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=classname(row),
            name=row["name"],
            time=f"{row['duration_s']:.3f}",
        )
        if row["status"] == "failed":
            failure = ET.SubElement(case, "failure", message=row["message"], type="criterion")
            failure.text = json.dumps(row.get("checks", []), indent=1)
        elif row["status"] == "error":
            error = ET.SubElement(
                case, "error", message=row["message"], type=row["message"].split(":")[0]
            )
            error.text = row["traceback"]
        elif row["status"] == "unsupported":
            ET.SubElement(case, "skipped", message=row["message"])


def junit_xml(report: dict) -> str:
    root = ET.Element("testsuites", name=f"toolkit verify {report['line']} ({report['level']})")
    if report["summary"]["setup_error"]:
        setup = {
            "name": "import flash_attn",
            "status": "error",
            "duration_s": 0.0,
            "message": report["summary"]["setup_error"],
            "traceback": report["summary"]["setup_error"],
        }
        _suite(root, "setup", [setup], report, lambda row: "verify.setup")
    if report["cases"]:
        _suite(root, "attention", report["cases"], report, lambda row: f"flash_attn.{row['api']}")
    if report["parity"]:
        _suite(root, "parity", report["parity"], report, lambda row: "transformers.llama")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


# ---------------------------------------------------------------- console


def worst_ratio(case: dict) -> float | None:
    """The tightest check of a case: error / bound (1.0 = at the limit), over checks with a bound."""
    ratios = [c["error"] / c["bound"] for c in case.get("checks", []) if c["bound"] > 0]
    return max(ratios) if ratios else None


def summary_line(report: dict, report_dir: Path) -> str:
    s = report["summary"]
    head = f"verify {report['line']} ({report['level']}): "
    if s["setup_error"]:
        return head + f"flash-attn did not import: {s['setup_error']}; reports in {report_dir}/"
    unsupported = (
        f", {s['unsupported']} unsupported (not listed for the GPU)" if s.get("unsupported") else ""
    )
    return head + (
        f"{s['passed']} passed, {s['failed']} failed, {s['error']} errors{unsupported} in {s['duration_s']:.1f} s "
        f"on {report['gpu'] or 'no GPU'}; reports in {report_dir}/ (verify.json, verify.xml)"
    )


def print_tables(report: dict, console: Console) -> None:
    """Per-API summary, every failure with its reason, and the parity results."""
    from rich.table import Table

    if report["cases"]:
        print_case_summary(report, console)
    problems = [
        row for row in report["cases"] + report["parity"] if row["status"] in ("failed", "error")
    ]
    if problems:
        failures = Table(title="failures", show_lines=False)
        for column in ("case", "status", "why"):
            failures.add_column(column, overflow="fold")
        for row in problems:
            failures.add_row(row["name"], row["status"], row["message"])
        console.print(failures)
    if report["parity"]:
        parity = Table(title="transformers parity (tiny Llama, logits vs eager fp32)")
        for column in ("scenario/implementation", "max |logit diff|", "bound", "status"):
            parity.add_column(column)
        for row in report["parity"]:
            parity.add_row(row["name"], _number(row["error"]), _number(row["bound"]), row["status"])
        console.print(parity)


def print_case_summary(report: dict, console: Console) -> None:
    """One row per (API, dtype): counts and the tightest error/bound ratio."""
    from rich.table import Table

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for case in report["cases"]:
        groups[(case["api"], case["params"]["dtype"])].append(case)
    table = Table(
        title=f"flash-attn {report['flash_attn']['version']} vs fp32 reference on {report['gpu']}"
    )
    for column in (
        "api",
        "dtype",
        "cases",
        "passed",
        "failed",
        "errors",
        "unsupported",
        "worst error/bound",
    ):
        table.add_column(column, justify="left" if column in ("api", "dtype") else "right")
    for (api, dtype), cases in groups.items():
        counts = [sum(c["status"] == status for c in cases) for status in STATUSES]
        ratios = [r for r in map(worst_ratio, cases) if r is not None]
        table.add_row(
            api, dtype, str(len(cases)), *map(str, counts), f"{max(ratios):.2f}" if ratios else "-"
        )
    console.print(table)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def show(report_path: Path, console: Console) -> None:
    path = Path(report_path)
    report = formats.current(
        read_json(path, "verify report", "pass the verify.json a `toolkit verify` run wrote"),
        path,
        formats.VERIFY,
    )
    if not isinstance(report, dict):
        raise ToolkitError(
            f"{path}: not a verify report: a JSON {type(report).__name__} (run the verification again)"
        )
    print_tables(report, console)
    console.print(summary_line(report, Path(report_path).parent))
    line = recommended_line(report)
    if line:
        console.print(line, markup=False)


def recommended_line(report: dict) -> str:
    """The parity report's "recommended" entry as one line ("" where the run recorded none)."""
    rec = report.get("recommended")
    if not rec:
        return ""
    if "error" in rec:
        return f"recommended attention: {rec['error']}"
    return (
        f"recommended attention for {rec['shape']} on {rec['gpu']} ({rec['from']}): {rec['backend']}, "
        f"{rec['how']}"
    )

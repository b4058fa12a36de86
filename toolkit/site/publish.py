"""`toolkit publish [LINE...] --to DIR`: the wheelhouse's recorded wheels into a static binary cache.

This side knows the wheelhouse (its records, folders and the lines' reports); the index's format, its
immutability and the substitution table are cache/publish.py's. See docs/binary-cache.md.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from toolkit.base.arguments import add_lines
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import (
    KERNEL_CACHE_RECORD_SUFFIX,
    Workspace,
    add_workspace_options,
    folder_line,
    wheel_folders,
)
from toolkit.build.record import RECORD_SUFFIX, BuildRecord
from toolkit.build.wheelhouse import records
from toolkit.cache.provenance import BuildFacts, Dependency
from toolkit.cache.publish import Publication, publish
from toolkit.cache.table import Signer

# what `toolkit verify`, `toolkit bench` and `toolkit recommend` leave in a report folder (Workspace.backend_report_dir)
REPORT_NAMES = ("verify.json", "verify.xml", "bench.json", "bench.png", "recommendation.json")
MACHINE_FIELDS = ("machine", "cpus", "mem_available_gb", "gpus", "driver_version")


def folders(workspace: Workspace, lines: list[str], required: bool = True) -> list[Path]:
    """Each named line's wheel folders (one per implementation: wheel_folders) that hold records; every such
    folder without lines (none at all is refused when `required`: nothing else is published)."""
    if not lines:
        found = sorted({path.parent for path in workspace.wheelhouse.glob(f"*/*{RECORD_SUFFIX}")})
        if not found and required:
            raise ToolkitError(
                f"{display_path(workspace.wheelhouse)}: no build records to publish "
                f"(run `toolkit build LINE` first)"
            )
        return found
    chosen = []
    for line in lines:
        present = [
            d
            for d in (
                workspace.wheel_dir(line, implementation) for implementation in wheel_folders(line)
            )
            if any(d.glob(f"*{RECORD_SUFFIX}"))
        ]
        if not present:
            raise ToolkitError(
                f"{display_path(workspace.wheel_dir(line))}: no build records of line {line} to "
                f"publish (run `toolkit build {line}` first)"
            )
        chosen += present
    return chosen


def reports_of(workspace: Workspace, folder: Path) -> dict[str, Path]:
    report_dir = workspace.backend_report_dir(*folder_line(folder.name))
    return {name: report_dir / name for name in REPORT_NAMES if (report_dir / name).is_file()}


def facts_of(record: BuildRecord) -> BuildFacts:
    """The provenance statement's facts, from the record: its inputs, the sources it compiled by sha256
    (sdist or FA3's archives, each patch), the machine and how the build ran there."""
    dependencies = [Dependency(record.sdist.filename, record.sdist.sha256, record.sdist.url)]
    for archive in record.flash_attn_3.get("archives") or []:
        if archive.get("filename") != record.sdist.filename:
            dependencies.append(
                Dependency(
                    str(archive.get("filename")),
                    str(archive.get("sha256")),
                    str(archive.get("url") or ""),
                )
            )
    dependencies += [
        Dependency(patch.file, patch.sha256) for patch in record.patches if patch.applied
    ]
    return BuildFacts(
        wheel_name=record.outputs.wheel,
        wheel_sha256=record.outputs.wheel_sha256,
        inputs_key=record.inputs_key,
        inputs=record.inputs.to_json(),
        dependencies=dependencies,
        machine={name: record.fingerprint.get(name) for name in MACHINE_FIELDS},
        run={"parallelism": asdict(record.parallelism), "wall_s": record.outputs.wall_s},
        started=record.started,
        finished=record.finished,
        recipe=str(record.inputs.recipe),
        substituted_from=record.substituted_from,
    )


def publications(workspace: Workspace, folder: Path) -> list[Publication]:
    """Every recorded wheel of a folder whose wheel is there; the line's reports go with the newest one (the
    build they were most likely made from)."""
    found: list[Publication] = []
    for path, record in records(folder):  # newest first
        wheel = folder / record.outputs.wheel
        if not wheel.is_file():
            continue
        reports = reports_of(workspace, folder) if not found else {}
        found.append(
            Publication(
                folder.name,
                wheel,
                record.outputs.wheel_sha256,
                path,
                record.inputs_key,
                facts_of(record),
                reports,
            )
        )
    return found


def kernel_cache_records(line_folders: list[Path], given: list[Path]) -> list[Path]:
    """FA4's kernel-cache records to publish: those in the published lines' wheel folders (where `toolkit fa4 warm
    --artifacts wheelhouse/<line>` puts them) and in each `--kernel-cache DIR` (any --artifacts folder)."""
    for folder in given:
        if not folder.is_dir():
            raise ToolkitError(
                f"--kernel-cache {display_path(folder)}: not a folder (pass the --artifacts folder of "
                f"`toolkit fa4 warm`)"
            )
    found = [
        path for folder in given for path in sorted(folder.glob(f"*{KERNEL_CACHE_RECORD_SUFFIX}"))
    ]
    if given and not found:
        raise ToolkitError(
            f"--kernel-cache {', '.join(map(display_path, given))}: no *{KERNEL_CACHE_RECORD_SUFFIX} "
            f"record there (run `toolkit fa4 warm --artifacts DIR` first)"
        )
    found += [
        path
        for folder in line_folders
        for path in sorted(folder.glob(f"*{KERNEL_CACHE_RECORD_SUFFIX}"))
    ]
    return list(dict.fromkeys(path.absolute() for path in found))


def publish_command(args: argparse.Namespace) -> int:
    workspace = Workspace.from_args(args)
    signer = Signer.from_pem(args.sign_key) if args.sign_key else None
    chosen = folders(workspace, args.lines, required=not args.kernel_cache)
    items = [item for folder in chosen for item in publications(workspace, folder)]
    for done in publish(args.to, items, signer, kernel_cache_records(chosen, args.kernel_cache)):
        state = "published" if done.new else "already published (no change)"
        print(f"{state}: {done.label}")
    index = args.to.absolute() / "simple"
    print(
        f"index: {index} (serve {display_path(args.to)} with any web server: pip/uv --index-url URL/simple; "
        f"toolkit build --cache URL; toolkit fa4 cache-install --cache URL)"
    )
    if signer:
        print(
            f"signed with public key {signer.public_key} (consumers put it in .fa-envkit/caches.toml)"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "publish",
        description="Copy each recorded wheel of the lines (default: every line in the wheelhouse) into DIR: a "
        "static, relocatable, immutable PEP 503 index with PEP 658 metadata, the build record, an "
        "in-toto/SLSA provenance statement and the line's reports beside each wheel, and "
        "inputs/<inputs key>.json for `toolkit build --cache`. Serve DIR with any web server.",
    )
    add_lines(parser, "line names (default: every line with records)")
    parser.add_argument(
        "--to", type=Path, required=True, metavar="DIR", help="the index folder to publish into"
    )
    parser.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="ed25519 private key (PEM: `openssl genpkey -algorithm ed25519 -out KEY`) signing "
        "each table entry",
    )
    parser.add_argument(
        "--kernel-cache",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="also publish the FA4 kernel caches `toolkit fa4 warm --artifacts DIR` packed there (those "
        "in the lines' wheelhouse folders are published without it), for `toolkit fa4 "
        "cache-install --cache URL`",
    )
    add_workspace_options(parser)
    parser.set_defaults(func=publish_command)

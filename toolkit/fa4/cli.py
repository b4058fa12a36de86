"""The `toolkit fa4` verbs (fetch, join, lock, install, env, warm, cache-install) and `python -m toolkit.fa4`'s
entry. `toolkit fa4 recommend` became `toolkit recommend` (toolkit/attention/recommend.py): it is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from toolkit.base.arguments import add_arch, add_line, add_python
from toolkit.base.atomic import clean_stale, run_temporaries, write_atomic
from toolkit.base.digest import sha256_file
from toolkit.base.entry import add_renamed_option, add_renamed_verb, parse_verb_args, program
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path, folder_argument
from toolkit.base.workspace import Workspace, add_workspace_options
from toolkit.env.fa4_lock import read_fa4_lock, write_fa4_lock
from toolkit.fa4.install import import_check, install, load_record, python_argument
from toolkit.fa4.jit import (
    Variant,
    cache_entries,
    cache_key,
    cache_record,
    default_variants,
    pack,
    summary_lines,
    unpack,
    warm,
)
from toolkit.fa4.wheels import (
    CARRY_LIMIT,
    carried_wheel,
    carry_check,
    carry_split,
    check_join,
    fetch,
    parts_of,
    write_joined,
)
from toolkit.knowledge.fa4_pins import DEFAULT_RELEASE, release


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fa4",
        description="FlashAttention-4 (flash-attn-4) from the pinned wheels of "
        "knowledge/flash_attn_4.yaml.",
    )
    verbs = parser.add_subparsers(dest="fa4_verb", title="steps", metavar="STEP", required=True)
    fetch_parser = verbs.add_parser(
        "fetch",
        help="download the pinned wheels from PyPI and check their hashes",
        description="Download the flash-attn-4 wheels knowledge/flash_attn_4.yaml pins for --release and --cuda-major "
        "from PyPI (exact versions, binary only, no dependencies) into --dest and check each sha256; "
        "--split-into also cuts them into as many folders as they need, each one carry with the "
        f"working tree (under {CARRY_LIMIT // 2**20} MiB), for a machine they must be carried to "
        "(`toolkit fa4 join` puts them back together).",
    )
    _release_options(fetch_parser)
    fetch_parser.add_argument(
        "--dest", type=Path, required=True, metavar="DIR", help="the folder the wheels go to"
    )
    fetch_parser.add_argument(
        "--split-into",
        type=Path,
        metavar="DIR",
        help="also cut the wheels into carryable folders DIR/part1, DIR/part2, ... (each printed)",
    )
    fetch_parser.add_argument(
        "--beside",
        metavar="VERSION",
        help="only the wheels of --release that VERSION's pins lack (e.g. --release 4.0.0b36 "
        "--beside 4.0.0b40: b36's own flash-attn-4 wheel), one carryable folder for a "
        "second install next to VERSION's joined wheels",
    )
    fetch_parser.set_defaults(func=fa4_fetch_command)
    lock_parser = verbs.add_parser(
        "lock",
        help="write locks/LINE.fa4-lock.json: the line's exact wheels + URLs",
        description="Write locks/LINE.fa4-lock.json: the exact, hash-pinned flash-attn-4 wheels (and their URLs) of "
        "the release the line's flash_attn_4 section names, for the line's CUDA major and python; "
        "`toolkit fa4 install --lock` installs from it.",
    )
    add_line(lock_parser, "line name (cu130) or its spec file, with a flash_attn_4 section")
    add_workspace_options(lock_parser)
    lock_parser.add_argument(
        "--locks-dir", dest="locks", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )  # the earlier spelling of --locks
    lock_parser.set_defaults(func=fa4_lock_command)
    install_parser = verbs.add_parser(
        "install",
        help="install the pinned wheels into a --target folder",
        description="Install the pinned flash-attn-4 wheels from --wheels into the --target folder for --python "
        "(pip --target, no dependencies), after checking that the interpreter already has what FA4 takes "
        "from it (torch and the rest of the release's base); beside an installed flash-attn 2 its "
        "flash_attn/cute files give way to FA4's. Writes the install's record, prints the PYTHONPATH "
        "that uses it and checks `import flash_attn.cute` (exit 1 if it fails).",
    )
    _release_options(install_parser)
    install_parser.add_argument(
        "--lock",
        type=Path,
        metavar="LOCK",
        help="a `toolkit fa4 lock` file (sets release and CUDA major)",
    )
    install_parser.add_argument(
        "--wheels", type=Path, required=True, metavar="DIR", help="folder with the pinned wheels"
    )
    add_target_option(install_parser)
    add_python(
        install_parser,
        "interpreter the install is for (default: this one)",
        type=str,
        default=sys.executable,
    )
    install_parser.set_defaults(func=fa4_install_command)
    join_parser = verbs.add_parser(
        "join",
        help="reassemble split wheels (folders of parts) into one folder",
        description="Reassemble the wheels `toolkit fa4 fetch --split-into` cut into parts (whole wheels beside "
        "them are copied) into --dest: the parts are checked against their manifests before the first "
        "write, each joined wheel against its sha256 as it is written.",
    )
    join_parser.add_argument(
        "--dest", type=Path, required=True, metavar="DIR", help="the folder the joined wheels go to"
    )
    join_parser.add_argument(
        "parts",
        type=Path,
        nargs="+",
        metavar="PARTS_DIR",
        help="folders holding parts and manifests",
    )
    join_parser.set_defaults(func=fa4_join_command)
    env_parser = verbs.add_parser(
        "env",
        help="print NAME=VALUE lines an install (and its kernel cache) needs",
        description="Print the NAME=VALUE lines (PYTHONPATH, and with --cache-dir the kernel cache's variables) that "
        "make a python use the --target install, one a line, for a shell to read as data "
        "(`while IFS== read -r name value`), never to eval.",
    )
    add_target_option(env_parser)
    env_parser.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="the warmed kernel cache folder to use"
    )
    env_parser.set_defaults(func=fa4_env_command)
    _register_cache_verbs(verbs)
    add_renamed_verb(
        verbs,
        "recommend",
        "`toolkit recommend LINE --bench BENCH_JSON --verified BACKEND=VERIFY_JSON` "
        "(it chooses among every verified backend, not FA4 alone)",
    )


def add_target_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target", type=Path, required=True, metavar="DIR", help="the `toolkit fa4 install` folder"
    )


def _release_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--release",
        default=DEFAULT_RELEASE,
        metavar="VERSION",
        help=f"flash-attn-4 version (default {DEFAULT_RELEASE})",
    )
    parser.add_argument(
        "--cuda-major",
        default="13",
        metavar="N",
        help="CUDA major of the line (picks the libs-cuN flavor; default 13)",
    )


def fa4_fetch_command(args: argparse.Namespace) -> int:
    rel = release(args.release)
    if args.beside and args.split_into:
        raise ToolkitError(
            "--beside and --split-into: pass one (--beside writes one small carryable folder)"
        )
    carried = (
        {p.file for p in release(args.beside).wheels_for(args.cuda_major)} if args.beside else set()
    )
    paths = fetch(rel, args.cuda_major, args.dest, leave_out=carried)
    for path in paths:
        print(f"ok {path.name} sha256 {sha256_file(path)[:16]}")
    if args.split_into:
        carry_split(paths, args.split_into)
    if args.beside:
        carry_check(paths, args.dest)
    return 0


def fa4_join_command(args: argparse.Namespace) -> int:
    missing = next((folder for folder in args.parts if not folder.is_dir()), None)
    if missing is not None:
        raise ToolkitError(f"{missing}: not a folder of parts (pass every carried part folder)")
    dest = folder_argument(args.dest, "--dest")
    manifests = {m.name: m for folder in args.parts for m in folder.glob("*.parts.json")}
    wheels = [w for folder in args.parts for w in sorted(folder.glob("*.whl"))]
    if not manifests and not wheels:
        raise ToolkitError(
            f"{', '.join(map(str, args.parts))}: no wheels and no parts manifests there "
            f"(pass the folders scripts/fetch_fa4_wheels.sh wrote)"
        )
    items = [
        *map(carried_wheel, wheels),
        *(parts_of(m, list(args.parts)) for m in manifests.values()),
    ]
    check_join(items, dest)  # everything refused before the first write
    dest.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)  # what a killed join left
    for item in items:
        out = write_joined(item, dest)
        if item.sha256:
            print(f"joined {display_path(out)}")
    return 0


def fa4_env_command(args: argparse.Namespace) -> int:
    """For a shell to read as data (`while IFS== read -r name value`), never to eval."""
    from toolkit.fa4.jit import cache_env

    env = load_record(args.target).env()  # its values checked there
    if args.cache_dir and not str(args.cache_dir.absolute()).isprintable():
        raise ToolkitError(
            f"--cache-dir {str(args.cache_dir.absolute())!r}: holds a control character (pass a "
            f"plain folder path)"
        )
    env.update(cache_env(args.cache_dir.absolute()) if args.cache_dir else {})
    for name, value in env.items():
        print(f"{name}={value}")
    return 0


def fa4_lock_command(args: argparse.Namespace) -> int:
    from toolkit.spec.envspec import resolve_spec_arg
    from toolkit.spec.rules import checked_spec

    workspace = Workspace.from_args(args)
    path = write_fa4_lock(checked_spec(resolve_spec_arg(args.line, workspace)), workspace=workspace)
    print(f"wrote {path}")
    return 0


def fa4_install_command(args: argparse.Namespace) -> int:
    rel, cuda_major = (
        read_fa4_lock(args.lock) if args.lock else (release(args.release), args.cuda_major)
    )
    with run_temporaries(
        "fa4-install"
    ):  # pip's own temporaries: removed by the next run if this one is killed
        record = install(rel, cuda_major, args.wheels, args.target, args.python)
    print(f"installed {', '.join(record.installed)} into {record.target}")
    print(f"from the base python: {', '.join(f'{k}=={v}' for k, v in record.from_base.items())}")
    print(f"PYTHONPATH={os.pathsep.join(record.python_path)}")
    if record.flash_attn_2:
        print(
            f"beside flash-attn {record.flash_attn_2}: its {len(record.replaced_from_flash_attn_2)} flash_attn/cute "
            f"files gave way to FA4's (and left its RECORD)"
        )
    ok, line = import_check(record)
    print(f"import flash_attn.cute: {'ok' if ok else 'FAILED'}: {line}")
    return 0 if ok else 1


def _register_cache_verbs(verbs: argparse._SubParsersAction) -> None:
    """warm and cache-install: FA4's kernel cache (fa4_jit)."""
    parser = verbs.add_parser(
        "warm",
        help="compile FA4's kernel variants into a persistent cache and time first calls cold vs warm, each "
        "in a fresh process",
        description="Per kernel variant, a cold first call (a fresh process, an empty cache of its own) and a warm "
        "one (a fresh process reading --cache-dir), --jobs variants at a time; the latency report grows "
        "row by row in --report. Then the cache is packed as an artifact with its .kernel-cache.json "
        "record, keyed by the install, its python and --arch, for `toolkit fa4 cache-install`. "
        "Exit 1 if a variant failed.",
    )
    _target_and_arch(parser)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="the persistent cache folder to fill",
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        required=True,
        metavar="DIR",
        help="the folder the cache artifact and its .kernel-cache.json record go to",
    )
    parser.add_argument(
        "--report", type=Path, required=True, metavar="FILE", help="latency JSON to write"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        type=Variant.parse,
        metavar="VARIANT",
        help="MODE-DTYPE-dHEADDIM[-causal], e.g. fwd+bwd-bfloat16-d128-causal (default: d64/128 x "
        "bf16/fp16 x causal x fwd, fwd+bwd)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        metavar="SECONDS",
        help="start no new variant after this many seconds",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="variants warmed at a time (default 1)"
    )
    parser.set_defaults(func=fa4_warm_command)
    use = verbs.add_parser(
        "cache-install",
        help="unpack a warmed cache artifact for an install whose key matches",
        description="Unpack a `toolkit fa4 warm` artifact into --dest when its record's key matches the --target "
        "install, its python and --arch (refused otherwise), all or nothing, and print the NAME=VALUE "
        "lines that make FA4 use the cache. Without --cache-record, the artifact `toolkit publish` "
        "published for this key is taken from --cache URL (and the caches of .fa-envkit/caches.toml), "
        "its sha256, key and signature checked; a miss or a refusal is one line, nothing is unpacked "
        "and the exit is 1 (then `toolkit fa4 warm` compiles).",
    )
    _target_and_arch(use)
    use.add_argument(
        "--cache-record",
        type=Path,
        metavar="RECORD",
        help="the artifact's .kernel-cache.json record (a local artifact)",
    )
    use.add_argument(
        "--cache",
        action="append",
        metavar="URL",
        help="a published binary cache (file://, http(s)://) to take this key's kernel cache from "
        "(besides those of .fa-envkit/caches.toml)",
    )
    add_renamed_option(
        use, "--record", "--cache-record (--record is check-updates' recording folder)"
    )
    use.add_argument(
        "--dest",
        type=Path,
        required=True,
        metavar="DIR",
        help="the cache folder the env will use: new, empty, or "
        "one an earlier cache-install filled",
    )
    use.set_defaults(func=fa4_cache_install_command)


def fa4_warm_command(args: argparse.Namespace) -> int:
    record = load_record(args.target, python_argument(args.python))
    env = record.env()
    key = cache_key(record.python, env, args.arch)
    ok, line = import_check(record)
    if not ok:  # every child would fail the same way: say it once
        raise ToolkitError(
            f"{args.target}: `import flash_attn.cute` fails: {line} (fix the install first)"
        )
    variants = args.variants or default_variants()
    rows: list[dict] = []

    def on_row(
        row: dict,
    ) -> None:  # the report grows row by row: a killed run keeps what it measured
        rows.append(row)
        write_atomic(
            args.report,
            json.dumps({"key": key, "variants": rows, "partial": True}, indent=2) + "\n",
        )
        print(summary_lines({"variants": [row]})[0], flush=True)

    with run_temporaries(
        "fa4-warm"
    ):  # the cold runs' caches: removed by the next run if this one is killed
        latency = warm(
            record.python,
            variants,
            args.cache_dir,
            env,
            on_row=on_row,
            budget_s=args.budget_s,
            jobs=args.jobs,
        )
    latency.update(
        key=key,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        cache_dir=str(args.cache_dir),
    )
    archive, record_path = pack(args.cache_dir, args.artifacts, key, latency)
    latency.update(artifact=str(archive), record=str(record_path))
    write_atomic(args.report, json.dumps(latency, indent=2) + "\n")
    for line in summary_lines(latency)[-1:]:
        print(line)
    print(
        f"cache artifact {archive} ({archive.stat().st_size / 2**20:.1f} MiB), record {record_path}"
    )
    failed = [
        row["variant"]
        for row in latency["variants"]
        if "error" in row["cold"] or "error" in row["warm"]
    ]
    return 1 if failed else 0


def _target_and_arch(parser: argparse.ArgumentParser) -> None:
    add_target_option(parser)
    add_arch(parser, "the GPU's sm, e.g. 90 (part of the cache's key)", required=True)
    add_python(
        parser,
        "the interpreter of the install (its record must name it; default: this one)",
        type=str,
        default=sys.executable,
    )


def fa4_cache_install_command(args: argparse.Namespace) -> int:
    if args.cache_record and args.cache:
        raise ToolkitError(
            "cache-install: --cache-record (a local artifact) or --cache URL (a published one), not "
            "both"
        )
    record = load_record(args.target, python_argument(args.python))
    folder_argument(args.dest, "--dest")
    if args.cache_record is None:
        # the cache wing's (above this one): toolkit/cli.py hands it down
        substitute = getattr(args, "kernel_cache_command", None)
        if substitute is None:
            raise ToolkitError(
                "cache-install: pass --cache-record (`python -m toolkit.fa4` takes no --cache: run "
                "`toolkit fa4 cache-install --cache URL`)"
            )
        return int(
            substitute(
                args, cache_key(record.python, record.env(), args.arch), args.dest.absolute()
            )
        )
    cache_record(args.cache_record)  # a damaged record is refused before any program runs
    env = unpack(
        args.cache_record, cache_key(record.python, record.env(), args.arch), args.dest.absolute()
    )
    print(
        f"unpacked {args.cache_record.name} into {args.dest}: {len(cache_entries(args.dest))} entries"
    )
    for name, value in env.items():
        print(f"{name}={value}")
    return 0


@program
def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.fa4 STEP ...`: the fa4 verbs without loading every other stage."""
    parser = argparse.ArgumentParser(prog="python -m toolkit.fa4")
    register(parser.add_subparsers())
    args = parse_verb_args(parser, ["fa4", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)

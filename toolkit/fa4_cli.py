"""The `toolkit fa4` verbs (fetch, join, lock, install, env, warm, cache-install, recommend) and
`python -m toolkit.fa4`'s entry.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from toolkit.atomic import clean_stale, run_temporaries
from toolkit.digest import sha256_file
from toolkit.errors import ToolkitError
from toolkit.fa4 import import_check, install, load_record
from toolkit.fa4_lock import read_lock, write_lock
from toolkit.fa4_pins import DEFAULT_RELEASE, release
from toolkit.fa4_wheels import carried_wheel, carry_split, check_join, fetch, parts_of, write_joined
from toolkit.paths import display_path, folder_argument
from toolkit.workspace import Workspace, add_workspace_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from toolkit import fa4_jit
    from toolkit.attention import recommend

    parser = subparsers.add_parser("fa4", help="FlashAttention-4: fetch, install, warm its kernel cache",
                                   description="FlashAttention-4 (flash-attn-4) from the pinned wheels of "
                                               "knowledge/flash_attn_4.yaml.")
    verbs = parser.add_subparsers(dest="fa4_verb", metavar="STEP", required=True)
    fetch_parser = verbs.add_parser("fetch", help="download the pinned wheels from PyPI and check their hashes")
    _release_options(fetch_parser)
    fetch_parser.add_argument("--dest", type=Path, required=True)
    fetch_parser.add_argument("--split-into", type=Path, help="also cut the wheels into two carryable folders")
    fetch_parser.set_defaults(func=_fetch_command)
    lock_parser = verbs.add_parser("lock", help="write locks/LINE.fa4-lock.json: the line's exact wheels + URLs")
    lock_parser.add_argument("line", metavar="LINE", help="line name or spec file (with a flash_attn_4 section)")
    add_workspace_options(lock_parser)
    lock_parser.add_argument("--locks-dir", dest="locks", type=Path, default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)  # the earlier spelling of --locks
    lock_parser.set_defaults(func=_lock_command)
    install_parser = verbs.add_parser("install", help="install the pinned wheels into a --target folder")
    _release_options(install_parser)
    install_parser.add_argument("--lock", type=Path, help="a `toolkit fa4 lock` file (sets release and CUDA major)")
    install_parser.add_argument("--wheels", type=Path, required=True, help="folder with the pinned wheels")
    add_target_option(install_parser)
    install_parser.add_argument("--python", default=sys.executable, help="interpreter the install is for")
    install_parser.set_defaults(func=_install_command)
    join_parser = verbs.add_parser("join", help="reassemble split wheels (folders of parts) into one folder")
    join_parser.add_argument("--dest", type=Path, required=True)
    join_parser.add_argument("parts", type=Path, nargs="+", help="folders holding parts and manifests")
    join_parser.set_defaults(func=_join_command)
    env_parser = verbs.add_parser("env", help="print NAME=VALUE lines an install (and its kernel cache) needs")
    add_target_option(env_parser)
    env_parser.add_argument("--cache-dir", type=Path, help="the warmed kernel cache folder to use")
    env_parser.set_defaults(func=_env_command)
    fa4_jit.register(verbs)
    recommend.register(verbs)


def add_target_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, required=True, help="the `toolkit fa4 install` folder")


def _release_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--release", default=DEFAULT_RELEASE, help=f"flash-attn-4 version (default {DEFAULT_RELEASE})")
    parser.add_argument("--cuda-major", default="13", help="CUDA major of the line (picks the libs-cuN flavor)")


def _fetch_command(args: argparse.Namespace) -> int:
    rel = release(args.release)
    paths = fetch(rel, args.cuda_major, args.dest)
    for path in paths:
        print(f"ok {path.name} sha256 {sha256_file(path)[:16]}")
    if args.split_into:
        carry_split(paths, args.split_into)
    return 0


def _join_command(args: argparse.Namespace) -> int:
    missing = next((folder for folder in args.parts if not folder.is_dir()), None)
    if missing is not None:
        raise ToolkitError(f"{missing}: not a folder of parts (pass the carried part1/part2 folders)")
    dest = folder_argument(args.dest, "--dest")
    manifests = {m.name: m for folder in args.parts for m in folder.glob("*.parts.json")}
    wheels = [w for folder in args.parts for w in sorted(folder.glob("*.whl"))]
    if not manifests and not wheels:
        raise ToolkitError(f"{', '.join(map(str, args.parts))}: no wheels and no parts manifests there "
                           f"(pass the folders scripts/fetch_fa4_wheels.sh wrote)")
    items = [*map(carried_wheel, wheels), *(parts_of(m, list(args.parts)) for m in manifests.values())]
    check_join(items, dest)  # everything refused before the first write
    dest.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)  # what a killed join left
    for item in items:
        out = write_joined(item, dest)
        if item.sha256:
            print(f"joined {display_path(out)}")
    return 0


def _env_command(args: argparse.Namespace) -> int:
    """For a shell to read as data (`while IFS== read -r name value`), never to eval."""
    from toolkit.fa4_jit import cache_env

    env = load_record(args.target).env()  # its values checked there
    if args.cache_dir and not str(args.cache_dir.absolute()).isprintable():
        raise ToolkitError(f"--cache-dir {str(args.cache_dir.absolute())!r}: holds a control character (pass a "
                           f"plain folder path)")
    env.update(cache_env(args.cache_dir.absolute()) if args.cache_dir else {})
    for name, value in env.items():
        print(f"{name}={value}")
    return 0


def _lock_command(args: argparse.Namespace) -> int:
    from toolkit.rules import checked_spec
    from toolkit.spec import resolve_spec_arg

    workspace = Workspace.from_args(args)
    path = write_lock(checked_spec(resolve_spec_arg(args.line, workspace.envs)), locks_dir=workspace.locks)
    print(f"wrote {path}")
    return 0


def _install_command(args: argparse.Namespace) -> int:
    rel, cuda_major = read_lock(args.lock) if args.lock else (release(args.release), args.cuda_major)
    with run_temporaries("fa4-install"):  # pip's own temporaries: removed by the next run if this one is killed
        record = install(rel, cuda_major, args.wheels, args.target, args.python)
    print(f"installed {', '.join(record.installed)} into {record.target}")
    print(f"from the base python: {', '.join(f'{k}=={v}' for k, v in record.from_base.items())}")
    print(f"PYTHONPATH={os.pathsep.join(record.python_path)}")
    if record.flash_attn_2:
        print(f"beside flash-attn {record.flash_attn_2}: its {len(record.replaced_from_flash_attn_2)} flash_attn/cute "
              f"files gave way to FA4's (and left its RECORD)")
    ok, line = import_check(record)
    print(f"import flash_attn.cute: {'ok' if ok else 'FAILED'}: {line}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.fa4 STEP ...`: the fa4 verbs without loading every other stage."""
    parser = argparse.ArgumentParser(prog="python -m toolkit.fa4")
    register(parser.add_subparsers())
    args = parser.parse_args(["fa4", *(argv if argv is not None else sys.argv[1:])])
    try:
        return args.func(args)
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

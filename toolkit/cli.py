"""`toolkit` / `python -m toolkit`: one verb per pipeline stage; every failure is one line."""

from __future__ import annotations

import argparse
import importlib

from toolkit import __version__
from toolkit.base.entry import parse_verb_args, program

# Each wing module exposes register(verbs); each verb it adds sets `func` to its handler, named for the verb's
# words: `toolkit matrix show` -> matrix_show_command(args) -> int (tests/test_cli.py walks the tree).
STAGE_MODULES = (
    "toolkit.spec.rules",
    "toolkit.site.matrix",
    "toolkit.env.lock",
    "toolkit.env.install",
    "toolkit.site.modules",
    "toolkit.site.publish",
    "toolkit.cache.export",
    "toolkit.doctor.command",
    "toolkit.build.builder",
    "toolkit.build.diagnose",
    "toolkit.verify.command",
    "toolkit.verify.bench",
    "toolkit.attention.recommend",
    "toolkit.knowledge.upstream",
    "toolkit.fa4.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolkit",
        description="Declarative, locked, verified FlashAttention build environments for every CUDA line.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="verbs", metavar="VERB", required=True)
    for name in STAGE_MODULES:
        importlib.import_module(name).register(subparsers)
    hand_down_runtime_locks(subparsers)
    hand_down_kernel_cache(subparsers)
    return parser


def hand_down_runtime_locks(subparsers: argparse._SubParsersAction) -> None:
    """`toolkit lock --runtime` and `toolkit install --runtime` are env's verbs running the cache wing's runtime
    locks (they read a published index); env sits below cache, so the entry hands the handlers down as
    `args.runtime_command` instead of env importing upward (tests/test_wings.py)."""
    from toolkit.cache.runtime_lock import install_runtime_command, lock_runtime_command

    for verb, command in (("lock", lock_runtime_command), ("install", install_runtime_command)):
        if (
            verb in subparsers.choices
        ):  # a parser of some verbs only (tests register a few) has nothing to hand
            subparsers.choices[verb].set_defaults(runtime_command=command)


def hand_down_kernel_cache(subparsers: argparse._SubParsersAction) -> None:
    """`toolkit fa4 cache-install --cache URL` is fa4's verb taking the cache wing's published kernel cache; fa4
    sits below cache, so the entry hands the handler down as `args.kernel_cache_command`."""
    from toolkit.cache.kernel_cache import install_kernel_cache_command

    if "fa4" in subparsers.choices:
        subparsers.choices["fa4"].set_defaults(kernel_cache_command=install_kernel_cache_command)


@program
def main(argv: list[str] | None = None) -> int:
    args = parse_verb_args(build_parser(), argv)  # the stages' modules are imported here
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

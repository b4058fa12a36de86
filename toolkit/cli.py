"""`toolkit` / `python -m toolkit`: one verb per pipeline stage; every failure is one line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit import __version__
from toolkit.base.entry import parse_verb_args, program

if TYPE_CHECKING:
    from pathlib import Path

    from toolkit.base.workspace import Workspace
    from toolkit.env.lock_ahead import Ahead


@dataclass(frozen=True)
class Verb:
    """A verb as `toolkit --help` lists it. Its wing module is imported only when the verb runs (or its
    --help is asked): importing every wing made each run, `--help` included, pay for all of them."""

    module: str  # exposes register(verbs), which adds the verb's parser (and any other verb listed here with it)
    help: str  # its line in `toolkit --help` (the wing's parser carries the description)
    # "module:function" of a light module, called before the wing is imported, whose result reaches the handler
    # as args.ahead (None for every other verb): processes forked to import what the verb needs meanwhile, which
    # the entry ends (`cancel()`) once the verb has run
    ahead: str | None = None
    ahead_not_for: tuple[str, ...] = ()  # options after which the verb needs nothing `ahead` starts


# Each verb's parser sets `func` to its handler, named for the verb's words: `toolkit matrix show` ->
# matrix_show_command(args) -> int (tests/test_cli.py walks the tree).
VERBS: dict[str, Verb] = {
    "check": Verb("toolkit.spec.rules", "validate env specs against the compatibility knowledge"),
    "matrix": Verb(
        "toolkit.site.matrix",
        "the lines side by side (`matrix [show]`), or built and verified (`matrix run`)",
    ),
    "lock": Verb(
        "toolkit.env.lock",
        "lock lines' conda + pip layers into locks/<line>.conda-lock.yml",
        # py-rattler's solver and the lock's checker, importing their modules while the verb's are
        ahead="toolkit.env.lock_ahead:forked_early",
        # no solve: which locks are stale, a runtime lock, the help
        ahead_not_for=("--check", "--runtime", "-h", "--help"),
    ),
    "install": Verb("toolkit.env.install", "create a line's environment from its lock"),
    "caches": Verb(
        "toolkit.env.caches",
        "the toolkit's caches on this machine: their sizes (`caches [show]`), `caches prune`, `caches clear`",
    ),
    "modules": Verb("toolkit.site.modules", "write Lmod / Tcl modulefiles for the installed lines"),
    "publish": Verb(
        "toolkit.site.publish",
        "publish the wheelhouse's built wheels as a static binary cache (PEP 503 index)",
    ),
    "export": Verb(
        "toolkit.cache.export",
        "print what a project pastes to install a line's published wheels (uv, pip, pixi)",
    ),
    "doctor": Verb(
        "toolkit.doctor.command", "explain this machine/environment: versions, mismatches, fixes"
    ),
    "build": Verb(
        "toolkit.build.builder", "build the flash-attn wheel of a line from its locked sdist"
    ),
    "build-report": Verb(
        "toolkit.build.builder", "the newest build record's wall time and parallel efficiency"
    ),
    "explain": Verb(
        "toolkit.build.diagnose",
        "diagnose a build or import log against the catalog of known failures",
    ),
    "verify": Verb(
        "toolkit.verify.command",
        "check an attention implementation on a GPU against an fp32 reference attention",
    ),
    "bench": Verb(
        "toolkit.verify.bench",
        "TFLOP/s of each installed FlashAttention vs torch SDPA backends and eager, on a GPU",
    ),
    "recommend": Verb(
        "toolkit.attention.recommend",
        "per GPU and shape, the fastest verified attention backend (and verl's override lines for it)",
    ),
    "knowledge": Verb("toolkit.knowledge.upstream", "keep the compatibility knowledge current"),
    "fa4": Verb("toolkit.fa4.cli", "FlashAttention-4: fetch, install, warm its kernel cache"),
}


def build_parser(verbs: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser with every verb listed and the parsers of `verbs` (None: of every verb, as the tests walk
    them) read from their wings; a verb not loaded is listed only."""
    parser = argparse.ArgumentParser(
        prog="toolkit",
        description="Declarative, locked, verified FlashAttention build environments for every CUDA line.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="verbs", metavar="VERB", required=True)
    for name, verb in VERBS.items():
        subparsers.add_parser(name, help=verb.help)
    wanted = VERBS if verbs is None else [name for name in verbs if name in VERBS]
    loaded = set()
    for module in dict.fromkeys(VERBS[name].module for name in wanted):
        loaded |= load_wing(module, parser.prog, subparsers)
    if {"lock", "install"} & loaded:
        hand_down_runtime_locks(subparsers)
    if "fa4" in loaded:
        hand_down_kernel_cache(subparsers)
    return parser


def load_wing(module: str, prog: str, subparsers: argparse._SubParsersAction) -> set[str]:
    """The verbs `module` registers, put in place of their listed stand-ins (in the listing's order); a verb
    the table does not give to `module` is a bug, named here rather than left unlisted."""
    scratch = argparse.ArgumentParser(prog=prog).add_subparsers()
    importlib.import_module(module).register(scratch)
    for name, verb_parser in scratch.choices.items():
        if name not in VERBS or VERBS[name].module != module:
            raise AssertionError(f"{module} registers {name!r}, which cli.VERBS does not give it")
        subparsers.choices[name] = verb_parser
    return set(scratch.choices)


def verb_of(words: list[str]) -> list[str]:
    """The verb the command line's words name (its first word that is no option: the entry's own options, -h and
    --version, take no value), or none."""
    return [next((w for w in words if not w.startswith("-")), "")]


def hand_down_runtime_locks(subparsers: argparse._SubParsersAction) -> None:
    """`toolkit lock --runtime` and `toolkit install --runtime` are env's verbs running the cache wing's runtime
    locks (they read a published index); env sits below cache, so the entry hands the handlers down as
    `args.runtime_command` instead of env importing upward (tests/test_wings.py). The cache wing is imported
    when one runs: every other lock and install spent 0.1 s of CPU importing it."""
    for verb, command in (("lock", lock_runtime), ("install", install_runtime)):
        subparsers.choices[verb].set_defaults(runtime_command=command)


def lock_runtime(args: argparse.Namespace, workspace: Workspace, paths: list[Path]) -> int:
    from toolkit.cache.runtime_lock import lock_runtime_command

    return lock_runtime_command(args, workspace, paths)


def install_runtime(line: str, args: argparse.Namespace, workspace: Workspace) -> int:
    from toolkit.cache.runtime_lock import install_runtime_command

    return install_runtime_command(line, args, workspace)


def hand_down_kernel_cache(subparsers: argparse._SubParsersAction) -> None:
    """`toolkit fa4 cache-install --cache URL` is fa4's verb taking the cache wing's published kernel cache; fa4
    sits below cache, so the entry hands the handler down as `args.kernel_cache_command`."""
    from toolkit.cache.kernel_cache import install_kernel_cache_command

    subparsers.choices["fa4"].set_defaults(kernel_cache_command=install_kernel_cache_command)


def started_ahead(verb: str, words: list[str]) -> Ahead | None:
    """The verb's `ahead` (cli.VERBS), started before its wing is imported; None for a verb without one, or where
    the command line's words name one of its `ahead_not_for` options."""
    listed = VERBS.get(verb)
    if listed is None or listed.ahead is None or set(words) & set(listed.ahead_not_for):
        return None
    module, _, function = listed.ahead.partition(":")
    return getattr(importlib.import_module(module), function)()


@program
def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    verb = verb_of(words)
    # a copy forked ahead dies with this process, whatever ends it
    ahead = started_ahead(verb[0], words)
    try:
        args = parse_verb_args(build_parser(verb), argv)  # the verb's wing is imported here
        args.ahead = ahead
        return args.func(args)
    finally:  # taken by the verb or not (--help, a refused option, an error): it ends here
        if ahead is not None:
            ahead.cancel()


if __name__ == "__main__":
    raise SystemExit(main())

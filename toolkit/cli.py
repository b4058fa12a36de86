"""`toolkit` / `python -m toolkit`: one verb per pipeline stage; every failure is one line."""

from __future__ import annotations

import argparse
import importlib
import sys

from toolkit import __version__
from toolkit.atomic import Terminated, terminate_like_interrupt
from toolkit.errors import ToolkitError

# Each stage module exposes register(subparsers); its verbs set `func` to a handler returning an exit code.
STAGE_MODULES = (
    "toolkit.rules",
    "toolkit.matrix",
    "toolkit.lock",
    "toolkit.install",
    "toolkit.modules",
    "toolkit.doctor",
    "toolkit.build",
    "toolkit.diagnose",
    "toolkit.verify",
    "toolkit.bench",
    "toolkit.upstream",
    "toolkit.fa4",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolkit",
        description="Declarative, locked, verified FlashAttention build environments for every CUDA line.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="verbs", metavar="VERB", required=True)
    for name in STAGE_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with terminate_like_interrupt():
            return args.func(args)
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        by = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        print(f"error: interrupted by {by} (this run's temporary files were removed; re-run the same command)",
              file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130


if __name__ == "__main__":
    raise SystemExit(main())

"""`toolkit` / `python -m toolkit`: one verb per pipeline stage; every failure is one line."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from toolkit import __version__
from toolkit.base.atomic import Terminated, terminate_like_interrupt
from toolkit.base.errors import ToolkitError

# Each stage module exposes register(subparsers); its verbs set `func` to a handler returning an exit code.
STAGE_MODULES = (
    "toolkit.spec.rules",
    "toolkit.site.matrix",
    "toolkit.env.lock",
    "toolkit.env.install",
    "toolkit.site.modules",
    "toolkit.doctor.command",
    "toolkit.build.builder",
    "toolkit.build.diagnose",
    "toolkit.verify",
    "toolkit.verify.bench",
    "toolkit.knowledge.upstream",
    "toolkit.fa4.cli",
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


def declared_requirements() -> list[Requirement]:
    """fa-envkit's dependencies, extras included: the installed distribution's metadata, else (run from a
    checkout) pyproject.toml beside the package."""
    try:
        lines = metadata.requires("fa-envkit") or []
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        if sys.version_info < (3, 11) or not pyproject.is_file():
            return []
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        lines = [*project["dependencies"],
                 *(f"{r}; extra == '{extra}'" for extra, rs in project["optional-dependencies"].items() for r in rs)]
    return [Requirement(line) for line in lines]


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The one line for a declared dependency that is not installed (a lazy import failed mid-run), naming
    the distribution and the install command; None for any other missing module (a bug: its traceback)."""
    module = (exc.name or "").partition(".")[0]
    for req in declared_requirements():
        name = canonicalize_name(req.name)
        if module in {name.replace("-", "_"), name.replace("-", ""), name.removeprefix("py-").replace("-", "_"),
                      name.removeprefix("py")}:  # conda_lock, piptools, rattler (py-rattler), yaml (pyyaml)
            extra = re.search(r"extra == ['\"]([\w.-]+)", str(req.marker or ""))
            wanted = f"{req.name} (its {extra.group(1)} extra)" if extra else req.name
            return (f"fa-envkit needs {wanted}, which this python lacks (no module {module!r}): "
                    f"{sys.executable} -m pip install '{req.name}{req.specifier}'")
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # the stages' modules are imported here
        with terminate_like_interrupt():
            return args.func(args)
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        missing = missing_dependency(exc)
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        by = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        print(f"error: interrupted by {by} (this run's temporary files were removed; re-run the same command)",
              file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130


if __name__ == "__main__":
    raise SystemExit(main())

"""What verify and bench share about the machine: the GPU gate, which python runs, what gets recorded.

The measuring code runs in the line's own environment, the python that holds torch and the built
flash-attn wheel. When `toolkit` itself runs under another interpreter, the measurement re-executes
as `python -m toolkit.verify` / `python -m toolkit.verify.bench` under the environment's python. That python
(a pypi line's venv holds the line's packages only) may lack the toolkit's own dependencies (PyYAML, rich,
packaging): run_under lends them, behind the environment's own packages. This module imports only the
standard library at the top (the spec, for the parent side, is loaded inside checked_line_spec).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.base.arguments import add_line, add_python, add_report_dir
from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace, add_workspace_options

if TYPE_CHECKING:
    from toolkit.spec.envspec import EnvSpec

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the toolkit package
NO_GPU = "no CUDA GPU visible ({why}): run {what} on a GPU machine"


def require_cuda(what: str) -> ModuleType:
    """torch with a visible CUDA device, or a one-line ToolkitError saying why not."""
    try:
        import torch
    except ImportError:
        raise ToolkitError(
            f"{sys.executable}: torch is not importable here (install the line's environment, "
            f"or pass --python PATH of one that has torch and flash-attn)"
        ) from None
    if not torch.cuda.is_available():
        raise ToolkitError(NO_GPU.format(why="torch.cuda.is_available() is False", what=what))
    return torch


def import_flash_attn() -> tuple[ModuleType | None, str]:
    """(flash_attn module, "") or (None, why it does not import): a broken wheel is a verification finding."""
    try:
        import flash_attn
    except (
        Exception
    ) as exc:  # ImportError, or an undefined symbol from a wheel built for another torch
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return flash_attn, ""


def environment_info(flash_attn: ModuleType | None, command: str) -> dict:
    """Where and with what a report was produced: enough to tell two runs apart."""
    import torch

    cuda = torch.cuda.is_available()
    extension = sys.modules.get("flash_attn_2_cuda")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "command": command,
        "python": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        "flash_attn": {
            "version": getattr(flash_attn, "__version__", None),
            "path": getattr(flash_attn, "__file__", None),
            "extension": getattr(extension, "__file__", None),
        },
    }


@contextmanager
def progress(total: int, label: str) -> Iterator[Callable[[str], None]]:
    """Yields advance(note): one step done; a non-empty note (a failure) is printed above the bar.
    A rich bar where rich is installed (the line's environment may not have it), else the notes alone."""
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text
    except ImportError:

        def print_note(note: str = "") -> None:
            if note:
                print(note, flush=True)

        yield print_note
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns) as bar:
        task = bar.add_task(label, total=total)

        def advance(note: str = "") -> None:
            bar.advance(task)
            if note:
                bar.console.print(Text(note, style="red"))

        yield advance


def judge_with_partial_reports(
    results: list,
    total: int,
    label: str,
    title: str,
    write: Callable[[str], dict],
    run: Callable[[Callable], object],
) -> None:
    """`run(on_result)` with a progress bar, the report rewritten after every case (`write(label)`): a killed
    run keeps what it judged. `results` is the list `write` reports from."""
    with progress(total, title) as advance:

        def on_result(result: Any) -> None:
            results.append(result)
            write(f"{label} (partial: {len(results)} of {total})")
            advance(
                ""
                if result.status in ("passed", "unsupported")
                else f"{result.status}: {result.name}: {result.message}"
            )

        run(on_result)


# ---------------------------------------------------------------- which python measures


def is_current_interpreter(python: Path) -> bool:
    """Same environment as this process? A venv's python is a symlink to the base interpreter, so compare
    the environments (the folder above bin/), not the executables."""
    return os.path.realpath(Path(python).absolute().parent.parent) == os.path.realpath(sys.prefix)


# Runs under the environment's python: the module, as it would run with the toolkit installed there and nothing
# else of the toolkit's. `toolkit` itself comes from where it is installed, ahead of all (it is the program that runs;
# a PYTHONPATH of its folder would put everything installed beside it, a wheel install's torch too, ahead of the
# line's). The toolkit's own dependencies are lent behind everything the environment has (a finder appended to
# sys.meta_path asks only after the environment's sys.path found nothing), for their top-level names only, and only
# to the code that runs the measurement (the toolkit's modules, and the lent ones for their own dependencies): the
# line's code importing one of those names sees what the environment has, as it would in use. Only where both
# interpreters share one SOABI: pydantic-core and PyYAML's _yaml are built for one. A dependency still missing is
# one line.
FALLBACK_RUNNER = r"""
import importlib.machinery, json, runpy, sys, sysconfig
given, module = json.loads(sys.argv[1]), sys.argv[2]
shared = (sysconfig.get_config_var("SOABI") or "") == given["soabi"]
borrowers = {"toolkit", *given["names"]}

def importer():
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_globals.get("__name__", "").startswith("importlib")):
        frame = frame.f_back
    if frame is None:
        return ""
    return getattr(frame.f_globals.get("__spec__"), "name", None) or frame.f_globals.get("__name__", "")

class TheToolkit:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [given["root"]]) if name == "toolkit" else None

class ToolkitDependencies:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is None and name in given["names"] and importer().partition(".")[0] in borrowers:
            return importlib.machinery.PathFinder.find_spec(name, given["dirs"])
        return None

sys.meta_path.insert(0, TheToolkit)
if shared:
    sys.meta_path.append(ToolkitDependencies)
sys.argv = sys.argv[2:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except ModuleNotFoundError as exc:
    top = (exc.name or "").partition(".")[0]
    if shared or top not in given["names"]:
        raise
    here = "%d.%d" % sys.version_info[:2]
    print(f"error: {sys.executable}: python {here} lacks {given['names'][top]} (module {top!r}), which the toolkit "
          f"needs, and the toolkit's own are for python {given['python']} ({given['soabi']}), not lent across "
          f"versions (run toolkit itself under a python {here} that has its dependencies: "
          f"python{here} -m pip install {given['root']})", file=sys.stderr)
    sys.exit(1)
"""

# What the measuring code (verify, bench and what they import) imports beyond the standard library, torch and the
# line's attention packages: PyYAML and pydantic for the knowledge files, packaging for versions, rich for the
# progress bar and tables. Only these, and what they need, are lent: not the toolkit's other dependencies (pip,
# setuptools, requests, conda-lock...), which the line's code must not find where it would not in use.
RUNNER_NEEDS = ("pyyaml", "pydantic", "packaging", "rich")


def toolkit_dependencies() -> dict:
    """What FALLBACK_RUNNER needs of this interpreter: where the toolkit is, its SOABI, and the folders and
    top-level module names (-> distribution) of RUNNER_NEEDS and their own dependencies, as installed here."""
    import sysconfig
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def wanted(req: Requirement, extras: set[str]) -> bool:
        return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""})

    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(name) for name in RUNNER_NEEDS]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = found[name] = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (a broken install): nothing to lend
        todo += [r for r in map(Requirement, dist.requires or []) if wanted(r, set(req.extras))]
    names = {
        module: ours[0]
        for module, dists in metadata.packages_distributions().items()
        if (ours := [d for d in dists if canonicalize_name(d) in found]) and module.isidentifier()
    }
    dirs = dict.fromkeys(str(Path(str(d.locate_file(""))).resolve()) for d in found.values())
    return {
        "soabi": sysconfig.get_config_var("SOABI") or "",
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "names": names,
        "dirs": list(dirs),
        "root": str(PROJECT_ROOT),
    }


def run_under(python: Path, module: str, args: list[str], spec_path: Path, what: str) -> int:
    """Re-run `python -m module args` under the environment's interpreter, the toolkit itself importable and its
    dependencies lent where the environment lacks them (FALLBACK_RUNNER); tied to this process (base/children)."""
    if not Path(python).exists():
        if not glob.glob("/dev/nvidia[0-9]*"):  # say the more basic problem first
            raise ToolkitError(NO_GPU.format(why="no /dev/nvidia* device", what=what))
        raise ToolkitError(
            f"{spec_path}: environment python {python} does not exist "
            f"(install the line's environment first, or pass --python PATH)"
        )
    runner = [str(python), "-c", FALLBACK_RUNNER, json.dumps(toolkit_dependencies()), module, *args]
    return run_tied(runner).returncode


def add_line_arguments(parser: argparse.ArgumentParser) -> None:
    """LINE, --python, --report-dir and the workspace options: what verify and bench need to find the environment."""
    add_line(parser, "line name (gpu-machine, cu126) or spec file")
    add_python(parser, "interpreter holding torch + flash-attn (default: the line's)")
    add_report_dir(parser, f"where reports go (default: {Workspace.reports}/LINE)")
    add_workspace_options(parser)


def checked_line_spec(args: argparse.Namespace) -> EnvSpec:
    """The spec of `args.line` (a line name or a spec file), through `toolkit check`'s rules: what the verbs that
    measure a line (verify, bench) read once and hand to measure_for_line."""
    from toolkit.spec.envspec import resolve_spec_arg
    from toolkit.spec.rules import checked_spec

    return checked_spec(resolve_spec_arg(args.line, Workspace.from_args(args)))


def measure_for_line(
    args: argparse.Namespace,
    spec: EnvSpec,
    module: str,
    child_args: list[str],
    here: Callable[[str, Path], int],
    what: str,
    report_name: str,
) -> tuple[int, Path | None]:
    """Run the measurement for the line in this process, or as `python -m module` under the line's python.

    Returns the exit status and the report this run wrote (None when it wrote none, e.g. without a GPU).
    """
    from toolkit.machine import line_env

    report_dir = args.report_dir or Workspace.from_args(args).report_dir(spec.line)
    python = line_env.resolve(spec, python=args.python).python
    if (
        python is None
    ):  # a line always names one (its prefix's bin/python or the toolchain's); kept for the type
        raise ToolkitError(
            f"{display_path(spec.path)}: the line's environment has no python (pass --python)"
        )
    report = report_dir / report_name
    before = report.stat().st_mtime_ns if report.exists() else None
    if is_current_interpreter(python):
        code = here(spec.line, report_dir)
    else:
        code = run_under(
            python,
            module,
            [spec.line, "--report-dir", str(report_dir), *child_args],
            spec.path,
            what,
        )
    written = report.exists() and report.stat().st_mtime_ns != before
    return code, report if written else None

"""What `toolkit build` checks of the wheel pip wrote, before it enters the wheelhouse: its version carries
the line's local tag, its .so files hold a cubin for every arch the line declares (anything more is said, not
refused), and it installs and imports in the line's environment."""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.build import fa4_hooks
from toolkit.build.diagnose import explain
from toolkit.knowledge.archs import ArchCoverage, FatbinEntry, compiled_entries
from toolkit.machine.line_env import LineEnvironment


def wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        match = re.search(r"^Version: (\S+)", zf.read(name).decode(), re.M)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class CheckedWheel:
    """What verify_wheel read back from a built wheel (the build record's outputs)."""

    version: str  # METADATA's, local tag included
    modules: list[str]  # top-level extension modules
    so_archs: dict[str, list[str]]  # each .so -> the sm archs it holds cubins for
    coverage: ArchCoverage  # all .so files together against the declared archs


def wheel_entries(
    wheel: Path, scratch: Path, search_path: str | None = None
) -> tuple[list[str], dict[str, list[FatbinEntry]]]:
    """Top-level extension modules of the wheel, and the fatbin entries of each of its .so files (cuobjdump's
    reading where `search_path` or PATH has it)."""
    entries: dict[str, list[FatbinEntry]] = {}
    with zipfile.ZipFile(wheel) as zf:
        libraries = [n for n in zf.namelist() if n.endswith(".so") or ".so." in n]
        for name in libraries:
            entries[name] = compiled_entries(Path(zf.extract(name, scratch)), search_path)
    modules = [n.split(".")[0] for n in libraries if "/" not in n]
    return modules, entries


def _cubins(entries: dict[str, list[FatbinEntry]]) -> dict[str, list[str]]:
    return {
        name: sorted({e.arch for e in found if e.kind == "elf"}) for name, found in entries.items()
    }


def verify_wheel(
    wheel: Path,
    archs: tuple[str, ...],
    local: str,
    scratch: Path,
    log_path: Path,
    search_path: str | None = None,
) -> CheckedWheel:
    """The wheel's version carries the local tag and its .so files hold a cubin for every declared arch
    (refused, naming the missing ones); cubins or PTX beyond them are said by the coverage's summary."""
    version = wheel_version(wheel)
    if not version.endswith("+" + local):
        raise ToolkitError(
            f"{wheel.name}: METADATA says version {version}, without +{local} "
            f"(the sdist's setup.py ignored FLASH_ATTN_LOCAL_VERSION)"
        )
    modules, entries = wheel_entries(wheel, scratch, search_path)
    coverage = ArchCoverage.of(archs, [e for found in entries.values() for e in found])
    if coverage.missing:
        raise ToolkitError(
            f"{wheel.name}: no sm_{', sm_'.join(coverage.missing)} code in {', '.join(entries) or 'any .so'} "
            f"(declared {', '.join(archs)}; nvcc skipped them: check `toolkit explain {display_path(log_path)}`)"
        )
    return CheckedWheel(version, modules, _cubins(entries), coverage)


def install_and_import(
    tc: LineEnvironment,
    wheel: Path,
    modules: list[str],
    target: Path | None,
    log_path: Path,
    after_install: Callable[[str, Path], None] | None = None,
) -> None:
    """Install the wheel into the environment (or --install-target) and import its extension modules.
    `after_install(python, log_path)`: the source's step between the install and the import in the environment
    (FA2's: FA4's files back, fa4_hooks); a --target folder is handed over by `toolkit fa4 install` instead."""
    if target:
        fa4_hooks.refuse_target_holding_fa4(target)
    cmd = [
        str(tc.python),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--force-reinstall",
        str(wheel),
    ]
    if target:
        cmd += ["--target", str(target), "--upgrade"]
    elif tc.kind == "locked":
        cmd += [
            "--prefix",
            str(tc.cuda_home),
        ]  # the conda prefix is the environment, whatever python it runs
    code = (
        "import importlib, importlib.util, sys\n"
        "if importlib.util.find_spec('torch'): import torch  # extensions resolve c10/at symbols from it\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
    )
    env = {**os.environ, "PATH": tc.path_env, "LC_ALL": "C", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if target:
        env["PYTHONPATH"] = str(target)
    with (
        tempfile.TemporaryDirectory() as neutral
    ):  # not the source tree: it would shadow the installed module

        def run(step: str, command: list[str]) -> None:
            done = run_tied(
                command, cwd=neutral, env=env, capture_output=True, text=True, errors="replace"
            )
            with open(log_path, "a") as log:
                log.write(f"\n$ {' '.join(command)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                raise ToolkitError(
                    f"{wheel.name}: {step} in {tc.python} failed: {explain(done.stdout + done.stderr)} "
                    f"(full output in {display_path(log_path)})"
                )

        run("install", cmd)
        if after_install and not target:
            after_install(str(tc.python), log_path)
        run("import", [str(tc.python), "-c", code, *modules])

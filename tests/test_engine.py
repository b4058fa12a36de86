"""The conda engine interface (toolkit/env/engine.py): chosen once from --engine, and each engine answers a
request with the packages the channel's contents call for. The CLI engine runs the real `conda-lock` code
with the micromamba test double (tests/micromamba_standin.py, which solves with py-rattler); py-rattler is
real; the channel is tests/conda_channel.py's."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from conda_channel import channel_dir, file_url, write_project  # noqa: F401
from rich.console import Console

from toolkit.base.errors import ToolkitError
from toolkit.env.engine import CondaLockEngine, RattlerEngine, choose_engine
from toolkit.env.lock import conda_request
from toolkit.spec.envspec import load_spec
from toolkit.spec.rules import checked_spec

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = Console(stderr=True, highlight=False)


@pytest.fixture
def no_conda_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_auto_is_rattler_without_a_conda_executable(no_conda_on_path):
    assert isinstance(choose_engine("auto", None, CONSOLE), RattlerEngine)
    assert RattlerEngine.relocates and not CondaLockEngine.relocates


def test_an_explicit_conda_executable_chooses_the_cli(no_conda_on_path):
    engine = choose_engine("auto", "/opt/micromamba/bin/micromamba", CONSOLE)
    assert isinstance(engine, CondaLockEngine) and engine.conda_exe == "/opt/micromamba/bin/micromamba"
    assert isinstance(choose_engine("rattler", "/opt/micromamba/bin/micromamba", CONSOLE), RattlerEngine)


def test_conda_lock_without_an_executable_is_one_line_with_the_fix(no_conda_on_path):
    with pytest.raises(ToolkitError) as caught:
        choose_engine("conda-lock", None, CONSOLE)
    assert "\n" not in str(caught.value) and "--engine rattler" in str(caught.value)


def test_an_external_toolchain_needs_no_solver_in_either_engine():
    """Nothing to solve: the CLI engine must not run conda-lock (its executable here fails if run)."""
    request = conda_request(load_spec(ROOT / "envs" / "gpu-machine.yaml"))
    assert request.specs == ()
    by_cli = CondaLockEngine("/bin/false", CONSOLE).solve(request)
    by_rattler = RattlerEngine(CONSOLE).solve(request)
    assert by_cli.entries == by_rattler.entries == ()
    assert by_cli.content_hash == by_rattler.content_hash and set(by_cli.content_hash) == set(request.platforms)


def expected_solution(channel: Path, platform: str) -> set[tuple[str, str, str]]:
    """What cu126 (python 3.11.*, cuda-version 12.6.*, gxx 13.*, ...; write_project's spec) must solve to in
    the fixture channel, worked out from the channel's contents (toolchain_packages) and not by a solver:
    the 12.6 line of CUDA (not 13.0), gcc 13.3.0 (not 12.4.0), python 3.11.10 (not 3.12.7), with the
    packages they depend on. (subdir, archive, sha256 by hashlib of the archive itself.)"""
    noarch = ["cuda-version-12.6-h0_3.tar.bz2", "pip-24.2-pyh0_0.tar.bz2", f"sysroot_{platform}-2.28-h0_0.tar.bz2"]
    native = [f"{name}-12.6.85-h0_0.conda" for name in ("cuda-cudart", "cuda-cudart-dev", "cuda-nvcc",
                                                           "libcublas-dev", "libcusolver-dev", "libcusparse-dev")]
    native += [f"{name}-13.3.0-h0_1.conda" for name in ("gxx", "libgcc", f"gcc_impl_{platform}",
                                                          f"gxx_impl_{platform}")]
    native += ["ninja-1.12.1-h0_0.conda", "python-3.11.10-h0_0_cpython.conda"]
    return {(subdir, name, hashlib.sha256((channel / subdir / name).read_bytes()).hexdigest())
            for subdir, names in (("noarch", noarch), (platform, native)) for name in names}


def test_both_engines_solve_a_locked_line_to_the_expected_packages(channel_dir, tmp_path, monkeypatch):
    """The CLI engine runs conda-lock's real `lock` code, but its micromamba is a stand-in that solves with
    py-rattler too (no conda binary can be installed here): agreeing with each other proves nothing about
    the solve, so each engine's answer is checked against the channel's own files."""
    standin = tmp_path / "bin" / "micromamba"
    standin.parent.mkdir()
    standin.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "micromamba_standin.py"}" "$@"\n')
    standin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{standin.parent}{os.pathsep}{os.environ['PATH']}")
    spec = checked_spec(write_project(tmp_path, file_url(channel_dir), "http://127.0.0.1:9/simple") / "cu126.yaml")
    request = conda_request(spec)
    by_cli = choose_engine("auto", None, CONSOLE).solve(request)
    by_rattler = choose_engine("rattler", None, CONSOLE).solve(request)
    for engine, layer in (("conda-lock", by_cli), ("rattler", by_rattler)):
        for platform in ("linux-64", "linux-aarch64"):
            solved = {(p.url.split("/")[-2], p.url.split("/")[-1], p.sha256)
                      for p in layer.entries if p.platform == platform}
            assert solved == expected_solution(channel_dir, platform), (engine, platform)
    assert by_cli.content_hash == by_rattler.content_hash and set(by_cli.content_hash) == set(request.platforms)


def test_lock_and_install_declare_the_engine_options_once():
    from toolkit.cli import build_parser

    parser = build_parser()
    for verb in ("lock", "install"):
        args = parser.parse_args([verb, "cu126", "--engine", "conda-lock", "--conda", "/opt/mm/bin/micromamba"])
        assert (args.engine, args.conda) == ("conda-lock", "/opt/mm/bin/micromamba")
        assert parser.parse_args([verb, "cu126"]).engine == "auto"
        with pytest.raises(SystemExit):
            parser.parse_args([verb, "cu126", "--engine", "mamba-cli"])


@pytest.mark.parametrize("verb", ["lock", "install"])
def test_backend_is_the_old_spelling_of_engine(verb, capsys):
    """--backend named the conda engine of lock and install; it now names an attention implementation
    (`toolkit verify`), so the engine is --engine. The old spelling reads as the new one after one notice."""
    from toolkit.cli import build_parser

    parser = build_parser()
    by_old = parser.parse_args([verb, "cu126", "--backend", "rattler"])
    assert capsys.readouterr().err == f"toolkit {verb}: --backend is now --engine; the old spelling still works\n"
    assert vars(by_old) == vars(parser.parse_args([verb, "cu126", "--engine", "rattler"]))
    assert by_old.engine == "rattler" and not hasattr(by_old, "backend")
    with pytest.raises(SystemExit):
        parser.parse_args([verb, "cu126", "--backend", "mamba-cli"])
    assert "--backend" not in parser._subparsers._group_actions[0].choices[verb].format_help()


CONDA_COMMON_THEN_CLI = """
import sys
from toolkit.env.lockfile import conda_common
conda_common().conda_spec_to_versioned_dep("python 3.12.*", "main")
print("conda_lock.pypi_solver" in sys.modules)  # the source parsers were not imported
from conda_lock.src_parser import make_lock_spec  # and the package is whole for whoever imports it next
from conda_lock.conda_lock import render_lockfile_for_platform
print("ok")
"""


def test_conda_common_leaves_conda_locks_source_parsers_importable_in_the_same_process():
    import subprocess

    done = subprocess.run([sys.executable, "-c", CONDA_COMMON_THEN_CLI], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert (done.returncode, done.stdout) == (0, "False\nok\n"), done.stderr

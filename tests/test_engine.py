"""The conda engine interface (toolkit/engine.py): chosen once from --backend, and the two engines answer
the same request the same way. The CLI engine runs the real `conda-lock` code with the micromamba test
double (tests/micromamba_standin.py); py-rattler is real; the channel is tests/conda_channel.py's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conda_channel import channel_dir, file_url, write_project  # noqa: F401
from rich.console import Console

from toolkit.engine import CondaLockEngine, RattlerEngine, choose_engine
from toolkit.errors import ToolkitError
from toolkit.lock import conda_request
from toolkit.rules import checked_spec
from toolkit.spec import load_spec

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
    assert "\n" not in str(caught.value) and "--backend rattler" in str(caught.value)


def test_an_external_toolchain_needs_no_solver_in_either_engine():
    """Nothing to solve: the CLI engine must not run conda-lock (its executable here fails if run)."""
    request = conda_request(load_spec(ROOT / "envs" / "gpu-machine.yaml"))
    assert request.specs == ()
    by_cli = CondaLockEngine("/bin/false", CONSOLE).solve(request)
    by_rattler = RattlerEngine(CONSOLE).solve(request)
    assert by_cli.packages == by_rattler.packages == []
    assert by_cli.content_hash == by_rattler.content_hash and set(by_cli.content_hash) == set(request.platforms)


def test_both_engines_solve_a_locked_line_to_the_same_packages(channel_dir, tmp_path, monkeypatch):
    standin = tmp_path / "bin" / "micromamba"
    standin.parent.mkdir()
    standin.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).parent / "micromamba_standin.py"}" "$@"\n')
    standin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{standin.parent}{os.pathsep}{os.environ['PATH']}")
    spec = checked_spec(write_project(tmp_path, file_url(channel_dir), "http://127.0.0.1:9/simple") / "cu126.yaml")
    request = conda_request(spec)
    by_cli = choose_engine("auto", None, CONSOLE).solve(request)
    by_rattler = choose_engine("rattler", None, CONSOLE).solve(request)
    assert by_cli.packages and by_cli.content_hash == by_rattler.content_hash
    assert sorted((p.platform, p.name, p.hash.sha256) for p in by_cli.packages) == \
        sorted((p.platform, p.name, p.hash.sha256) for p in by_rattler.packages)


def test_lock_and_install_declare_the_engine_options_once():
    from toolkit.cli import build_parser

    parser = build_parser()
    for verb in ("lock", "install"):
        args = parser.parse_args([verb, "cu126", "--backend", "conda-lock", "--conda", "/opt/mm/bin/micromamba"])
        assert (args.backend, args.conda) == ("conda-lock", "/opt/mm/bin/micromamba")
        assert parser.parse_args([verb, "cu126"]).backend == "auto"
        with pytest.raises(SystemExit):
            parser.parse_args([verb, "cu126", "--backend", "mamba-cli"])

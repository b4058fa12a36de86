"""Line names become file names in envs/, locks/, .envs/ and wheelhouse/: every verb refuses one that is a
path, an option or shell, in one line, before touching anything; spec files with such a name too."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_modules import Project, module_of, write_build_record

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options, checked_line
from toolkit.build.record import RECORD_SUFFIX, BuildRecord
from toolkit.cli import build_parser, main
from toolkit.env.lockfile import lock_path
from toolkit.site.scaleout import RunOptions, built_wheel, plan_matrix
from toolkit.spec.rules import checked_spec

ROOT = Path(__file__).resolve().parent.parent
FINGERPRINTS = ROOT / "tests" / "fingerprints"
HOSTILE_NAMES = ["../../etc/passwd", "cu126;touch x", "", "-rf", "a..b", "cu126\nid", "$(id)", "a b", "x" * 65, "/abs"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_workspace_paths_refuse_names_that_are_not_plain(name: str):
    for where in (Workspace().spec_file, Workspace().lock_file, Workspace().prefix, Workspace().wheel_dir):
        with pytest.raises(ToolkitError) as caught:
            where(name)
        assert "\n" not in str(caught.value) and "is not a line name" in str(caught.value)


@pytest.mark.parametrize("name", ["cu126", "gpu-machine", "cu12.6_site", "A1"])
def test_plain_names_pass(name: str):
    assert checked_line(name) == name


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    return tmp_path


@pytest.mark.parametrize("verb", ["check", "lock", "install", "build", "modules --root m"])
@pytest.mark.parametrize("name", ["../../etc/passwd", "cu126;touch x", "$(touch y)"])
def test_every_verb_refuses_a_hostile_line_name_in_one_line(project: Path, verb: str, name: str):
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    done = subprocess.run([sys.executable, "-m", "toolkit", *verb.split(), name], cwd=project,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a line name" in lines[0] and "Traceback" not in done.stderr
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before


def test_a_spec_file_named_like_shell_is_refused(project: Path):
    hostile = project / "envs" / "cu126;touch x.yaml"
    shutil.copy(project / "envs" / "cu126.yaml", hostile)
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", str(hostile)], cwd=project,
                          capture_output=True, text=True, timeout=60)
    # `check` reports problems on stdout, one line each, like every other problem it finds
    assert done.returncode == 1 and "is not a line name" in done.stdout and "rename the file" in done.stdout
    assert not (project / "x").exists()


# ---------------------------------------------------------------- one set of workspace options, honoured


def verb_parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(verb words, parser) of every verb and sub-verb the CLI has (`fa4 lock` is ("fa4", "lock"))."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*words, name), sub
                yield from verb_parsers(sub, (*words, name))


def workspace_actions(parser: argparse.ArgumentParser) -> dict[str, tuple]:
    """What a parser declares for --envs/--locks/--wheelhouse: (flags, default, type, metavar, help)."""
    return {flag: (tuple(a.option_strings), a.default, a.type, a.metavar, a.help)
            for a in parser._actions for flag in a.option_strings if flag in ("--envs", "--locks", "--wheelhouse")}


# Verbs that read or write no workspace folder take none of the options (`fa4 warm` names the folder its
# kernel-cache artifact goes to --artifacts: --wheelhouse is the workspace's, everywhere).
NO_WORKSPACE = {("explain",), ("matrix",), ("knowledge",), ("knowledge", "check-updates"), ("fa4",), ("fa4", "fetch"),
                ("fa4", "install"), ("fa4", "join"), ("fa4", "env"), ("fa4", "cache-install"),
                ("fa4", "recommend"), ("fa4", "warm"), ("recommend",),  # fa4 recommend: only refused now
                ("export",),  # export reads a published index alone: no spec, lock or wheelhouse of this checkout
                ("caches",), ("caches", "show"), ("caches", "prune"), ("caches", "clear")}  # the user's caches only


def test_every_verb_declares_the_workspace_options_once_with_one_help_text():
    reference = argparse.ArgumentParser()
    add_workspace_options(reference)
    expected = workspace_actions(reference)
    verbs = dict(verb_parsers(build_parser()))
    assert set(verbs) - NO_WORKSPACE >= {("check",), ("matrix", "show"), ("matrix", "run"), ("lock",), ("install",),
                                         ("modules",), ("doctor",), ("build",), ("build-report",), ("verify",),
                                         ("bench",), ("fa4", "lock")}
    for words, parser in verbs.items():
        if words in NO_WORKSPACE:
            continue
        assert workspace_actions(parser) == expected, words
        shown = " ".join(parser.format_help().split())  # --help, unwrapped
        for flag, (_, _, _, _, text) in expected.items():
            assert f"{flag} DIR {' '.join(text.split())}" in shown, (words, flag)
    assert not workspace_actions(verbs[("explain",)]) and not workspace_actions(verbs[("fa4", "warm")])


def test_workspace_from_args_keeps_the_defaults_and_names_only_what_was_moved():
    parser = argparse.ArgumentParser()
    add_workspace_options(parser)
    assert Workspace.from_args(parser.parse_args([])) == DEFAULT and DEFAULT.options() == []
    moved = Workspace.from_args(parser.parse_args(["--wheelhouse", "/x/wh", "--locks", "l2"]))
    assert moved.wheel_dir("cu126") == Path("/x/wh/cu126") and moved.lock_file("cu126") == Path("l2/cu126.conda-lock.yml")
    assert moved.options() == ["--locks=l2", "--wheelhouse=/x/wh"]
    assert lock_path("cu126", Path("l2")) == moved.lock_file("cu126")  # the lock model's name delegates


def record_elsewhere(wheelhouse: Path, line: str, python: str, **outputs: str) -> Path:
    """A build record (made through BuildRecord) in a wheelhouse that is not ./wheelhouse, with the sizing
    basis `toolkit build --report` prints."""
    path = write_build_record(wheelhouse, line, python, **outputs)
    record = BuildRecord.read(path)
    path.write_text(replace(record, parallelism=replace(record.parallelism, basis="4 jobs x 1 nvcc thread")).text())
    return path


def test_build_report_reads_the_given_wheelhouse(project: Path, monkeypatch, capsys):
    monkeypatch.chdir(project)
    record = record_elsewhere(project / "elsewhere", "cu126", "3.12")
    assert main(["build-report", "cu126"]) == 1
    assert "wheelhouse/cu126: no build records" in capsys.readouterr().err
    assert main(["build-report", "cu126", "--wheelhouse", "elsewhere"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"elsewhere/cu126/{record.name}:") and "4 jobs x 1 nvcc thread" in out


def test_doctor_reads_the_build_record_of_the_given_wheelhouse(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    record = record_elsewhere(tmp_path / "elsewhere", "gpu-machine", "3.12")
    wheel = record.name.removesuffix(RECORD_SUFFIX)
    replay = ["doctor", "--fingerprint", str(FINGERPRINTS / "healthy-h200.json"), "--envs", str(ROOT / "envs"),
              "--json"]
    main(replay)
    assert "no build record in wheelhouse/gpu-machine/" in row_of(capsys, "record")["value"]
    main([*replay, "--wheelhouse", "elsewhere"])
    found = row_of(capsys, "record")
    assert wheel in found["value"] and f"elsewhere/gpu-machine/{wheel}" in found["fix"]


def row_of(capsys, check: str) -> dict:
    return next(r for r in json.loads(capsys.readouterr().out)["rows"] if r["check"] == check)


def test_modules_read_the_build_record_of_the_given_wheelhouse(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    project = Project(tmp_path, capsys, venv=False, python="3.12.8")
    (tmp_path / "wheelhouse").rename(tmp_path / "elsewhere")
    module = project.modules / "lmod" / f"{module_of('cu126', '2.9', '3.12')}.lua"
    project.publish("cu126", "--format", "lmod")
    assert f"no record in {tmp_path}/wheelhouse/cu126" in module.read_text()
    project.publish("cu126", "--format", "lmod", "--wheelhouse", "elsewhere")
    assert f"Build:        {tmp_path}/elsewhere/cu126/flash_attn-" in module.read_text()


def test_matrix_run_passes_the_workspace_to_its_stages_and_reads_wheels_there(project: Path, monkeypatch):
    monkeypatch.chdir(project)
    moved = Workspace(locks=Path("my locks"), wheelhouse=Path("elsewhere"))
    plan = plan_matrix([checked_spec(project / "envs" / "cu126.yaml")], RunOptions(runs_dir=project / "runs"),
                       None, "toolkit matrix run", moved)
    commands = [s.command for s in (*plan.lines[0].build_stages, *plan.lines[0].verify_stages)]
    assert all("'--locks=my locks' --wheelhouse=elsewhere" in c for c in commands), commands
    record = record_elsewhere(project / "elsewhere", "cu126", "3.12")
    assert built_wheel(project, "cu126", None, moved)[0] == record.name.removesuffix(RECORD_SUFFIX)
    assert built_wheel(project, "cu126", None)[0] is None
    default = plan_matrix([checked_spec(project / "envs" / "cu126.yaml")], RunOptions(runs_dir=project / "runs"),
                          None, "toolkit matrix run")
    assert not any("--wheelhouse" in s.command for s in default.lines[0].build_stages)


def test_caches_follow_their_variables_and_the_line_locks_stay_in_the_project(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("TOOLKIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert DEFAULT.cache == Path(".cache") and DEFAULT.line_locks == Path(".cache/lines")
    assert DEFAULT.conda_package_cache == tmp_path / "xdg" / "fa-envkit" / "conda-pkgs"
    monkeypatch.setenv("TOOLKIT_CACHE", str(tmp_path / "scratch"))
    assert DEFAULT.cache == tmp_path / "scratch" and DEFAULT.line_locks == Path(".cache/lines")

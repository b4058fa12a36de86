"""Line names become file names in envs/, locks/, .envs/ and wheelhouse/: every verb refuses one that is a
path, an option or shell, in one line, before touching anything; spec files with such a name too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.errors import ToolkitError
from toolkit.workspace import Workspace, checked_line

ROOT = Path(__file__).resolve().parent.parent
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

"""The one resolver of a line's environment (toolkit/machine/line_env.py) and the verbs that ask it.

The prefixes here are laid out as conda-forge's packages lay them out: tests/conda_forge_replica/records.yaml
(gcc_impl_linux-64 / gxx_impl_linux-64 install only bin/x86_64-conda-linux-gnu-gcc / -g++; the `gcc` / `gxx`
packages add the plain bin/gcc / bin/g++ links). NOT REAL: the files are symlinks to this machine's
python3, gcc and g++, not conda's binaries; the resolver only looks at their names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.doctor.facts import gather_line
from toolkit.machine import line_env
from toolkit.spec.rules import checked_spec
from toolkit.verify import machine

ROOT = Path(__file__).resolve().parent.parent
LOCKED = ROOT / "envs" / "cu126.yaml"
EXTERNAL = ROOT / "envs" / "gpu-machine.yaml"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def conda_env(root: Path, *tools: str) -> Path:
    """A prefix with bin/python and the named tools, each a link to this machine's program of that role."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    for tool in tools:
        real = shutil.which("g++" if tool.endswith("g++") else "gcc") or "/bin/true"
        (root / "bin" / tool).symlink_to(real)
    return root


def test_a_locked_line_is_its_workspace_prefix_with_its_own_tools(workdir):
    prefix = conda_env(workdir / ".envs" / "cu126", "x86_64-conda-linux-gnu-g++", "x86_64-conda-linux-gnu-gcc")
    env = line_env.resolve(checked_spec(LOCKED))
    assert env.kind == "locked" and not env.missing
    assert env.root == env.cuda_home == prefix.absolute()
    assert env.python == prefix.absolute() / "bin" / "python"
    # gxx_impl alone: only the triplet-prefixed names exist, and they are the line's compilers
    assert env.cxx == prefix.absolute() / "bin" / "x86_64-conda-linux-gnu-g++"
    assert env.cc == prefix.absolute() / "bin" / "x86_64-conda-linux-gnu-gcc"
    assert env.path_env.split(os.pathsep)[0] == str(prefix.absolute() / "bin")
    assert env.source == "prefix .envs/cu126"


def test_plain_compiler_names_win_over_the_triplet_ones(tmp_path):
    prefix = conda_env(tmp_path / "env", "g++", "x86_64-conda-linux-gnu-g++")
    env = line_env.resolve(checked_spec(LOCKED), prefix)
    assert env.cxx == prefix / "bin" / "g++" and env.cc is None


def test_prefix_and_env_root_move_the_locked_environment(workdir):
    spec = checked_spec(LOCKED)
    assert line_env.resolve(spec, Path("elsewhere")).root == workdir / "elsewhere"
    moved = Workspace(environments=Path("/site/envs"))
    assert line_env.resolve(spec, workspace=moved).root == Path("/site/envs/cu126")


def test_a_missing_locked_environment_probes_nothing_and_says_how_to_install(workdir):
    env = line_env.resolve(checked_spec(LOCKED))
    assert env.missing and env.source == "nothing: the line's environment is missing"
    with pytest.raises(ToolkitError) as raised:
        env.require_installed("cu126")
    assert str(raised.value) == (".envs/cu126: no installed environment for cu126 "
                                 "(run `toolkit install cu126` first, or pass --prefix)")
    fp = env.fingerprint(workdir)  # this shell has nvcc, g++ and python3 on PATH: none of them is the line's
    assert (fp.nvcc_path, fp.cxx_path, fp.python_path, fp.cuda_home) == (None, None, None, None)


def test_an_external_line_is_the_spec_s_paths(monkeypatch):
    spec = checked_spec(EXTERNAL)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", "/usr/bin")
    env = line_env.resolve(spec)
    assert (env.kind, env.root) == ("external", None)
    assert env.cuda_home == Path(spec.toolchain.cuda_home) and env.python == Path(spec.toolchain.python_executable)
    assert env.path_env.split(os.pathsep) == [f"{spec.toolchain.cuda_home}/bin", str(env.python.parent), "/usr/bin"]
    assert env.cxx == (Path(found) if (found := shutil.which("g++", path=env.path_env)) else None)
    assert env.source == "envs/gpu-machine.yaml toolchain"
    assert not env.missing  # an external toolchain is the machine's: whether it runs is the checks' to say


def test_python_replaces_only_the_interpreter(workdir):
    spec = checked_spec(LOCKED)
    env = line_env.resolve(spec, python=Path("/opt/other/bin/python"))
    assert env.python == Path("/opt/other/bin/python") and env.root == workdir / ".envs" / "cu126"


def test_without_a_line_a_prefix_or_this_shell(tmp_path, monkeypatch):
    prefix = conda_env(tmp_path / "env")
    env = line_env.resolve(None, prefix)
    assert (env.kind, env.root, env.python) == ("prefix", prefix, prefix / "bin" / "python")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("CUDA_PATH", "/opt/cuda-12.6")
    shell = line_env.resolve(None)
    assert (shell.kind, shell.cuda_home, shell.python, shell.source) == ("shell", Path("/opt/cuda-12.6"), None,
                                                                         "CUDA_PATH")
    assert shell.path_env == os.environ["PATH"]
    monkeypatch.delenv("CUDA_PATH")
    assert (line_env.resolve(None).cuda_home, line_env.resolve(None).source) == (None, "nvcc on PATH")


def test_include_environment_is_empty_without_cuda_home(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert line_env.resolve(None).include_environment() == {}


# ---------------------------------------------------------------- the verbs ask the same resolver


def test_doctor_compares_the_lock_with_the_prefix_it_was_given(tmp_path, workdir):
    """Before: doctor probed --prefix but named (and compared the lock with) .envs/<line>."""
    prefix = conda_env(tmp_path / "moved")
    line = gather_line("cu126", checked_spec(LOCKED), None, "x86_64", prefix=prefix)
    assert line.env_prefix == prefix
    assert gather_line("cu126", checked_spec(LOCKED), None, "x86_64").env_prefix == workdir / ".envs" / "cu126"
    assert gather_line("gpu-machine", checked_spec(EXTERNAL), None, "x86_64").env_prefix is None


def test_verify_and_bench_run_under_the_resolved_python(workdir, monkeypatch):
    """measure_for_line (verify and bench) re-executes under the python the resolver names for the line."""
    prefix = conda_env(workdir / ".envs" / "cu126")
    ran = []
    monkeypatch.setattr(machine, "run_under", lambda python, *rest: ran.append(python) or 0)
    args = argparse.Namespace(line=str(LOCKED), python=None, report_dir=workdir / "reports", envs=ROOT / "envs")
    code, written = machine.measure_for_line(args, machine.checked_line_spec(args), "toolkit.verify", [], lambda *a: 1,
                                             "verification", "verify.json")
    assert (code, written) == (0, None)
    assert ran == [line_env.resolve(checked_spec(LOCKED)).python] == [prefix.absolute() / "bin" / "python"]

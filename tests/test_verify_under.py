"""verify and bench re-run under a line's python (toolkit/verify/machine.py run_under): a pypi line's venv holds the
line's packages only, so the toolkit's own dependencies are lent behind them.

The venvs here are real (`python -m venv --without-pip`, empty, as a pypi line's venv is of everything but the
line's wheels). The `packaging` copied into one is this interpreter's real package with its __version__ line
changed (NOT REAL: that version was never published), so the test can tell which copy was imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import packaging
from conftest import missing

from toolkit.verify import machine

ROOT = Path(__file__).resolve().parent.parent
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"

# Run as a module from the working folder (sys.path[0]): what each import resolved to in the child.
WHICH = """
import importlib.util, json, packaging, rich, yaml
print(json.dumps({"packaging": [packaging.__version__, packaging.__file__], "yaml": yaml.__file__,
                  "rich": rich.__file__, "pytest": importlib.util.find_spec("pytest") is not None}))
"""


def bare_venv(where: Path, python: str = sys.executable) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python"


def site_of(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())


def test_a_bare_venv_runs_a_toolkit_module_that_needs_its_dependencies(tmp_path, capfd):
    """Before: ModuleNotFoundError: No module named 'packaging' (then yaml, rich, pydantic) in the line's venv."""
    python = bare_venv(tmp_path / "env")
    code = machine.run_under(python, "toolkit", ["check", str(ROOT / "envs" / "cu126.yaml")], tmp_path, "verification")
    out, err = capfd.readouterr()
    assert (code, out, err) == (0, "1 spec checked: no problems\n", "")


def test_the_environments_own_packages_win_and_only_the_toolkits_dependencies_are_lent(tmp_path, capfd, monkeypatch):
    python = bare_venv(tmp_path / "env")
    theirs = site_of(python) / "packaging"
    shutil.copytree(Path(packaging.__file__).parent, theirs)
    init = theirs / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{packaging.__version__}"', '__version__ = "0.0.1+env"'))
    (tmp_path / "which_copies.py").write_text(WHICH)
    monkeypatch.chdir(tmp_path)
    assert machine.run_under(python, "which_copies", [], tmp_path, "verification") == 0
    seen = json.loads(capfd.readouterr().out)
    assert seen["packaging"] == ["0.0.1+env", str(init)]
    lent = Path(str(metadata.distribution("PyYAML").locate_file(""))).resolve()
    assert Path(seen["yaml"]).resolve().is_relative_to(lent) and Path(seen["rich"]).resolve().is_relative_to(lent)
    assert importlib.util.find_spec("pytest") is not None and seen["pytest"] is False  # a test extra: not lent


def other_python() -> str | None:
    """A python of another X.Y on this machine, one that runs and can make a venv."""
    for minor in range(10, 16):
        found = shutil.which(f"python3.{minor}")
        if found and f"3.{minor}" != HERE:
            done = subprocess.run([found, "-c", "import venv, sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == f"3.{minor}":
                return found
    return None


def test_another_python_version_is_refused_in_one_line_naming_the_missing_dependency(tmp_path, capfd):
    other = other_python()
    if other is None:
        missing(f"no python 3.x other than {HERE} on PATH", "FA_REQUIRE_PYTHON312")
    python = bare_venv(tmp_path / "env", other)
    there = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    code = machine.run_under(python, "toolkit", ["check", str(ROOT / "envs" / "cu126.yaml")], tmp_path, "verification")
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"error: {python}: python {there} lacks packaging (module 'packaging'), which the toolkit "
                          f"needs, and the toolkit's own are for python {HERE}")
    assert err.endswith(f"python{there} -m pip install {ROOT})\n")


def test_a_python_of_another_abi_is_not_lent_the_toolkits_compiled_dependencies(tmp_path, capfd, monkeypatch):
    """The same refusal without a second interpreter: the toolkit's side says its SOABI is another one (NOT REAL:
    no python 3.99 exists), so the venv of this python must not be lent packages built for it."""
    real = machine.toolkit_dependencies()
    monkeypatch.setattr(machine, "toolkit_dependencies", lambda: {**real, "soabi": "cpython-399-x86_64-linux-gnu",
                                                                   "python": "3.99"})
    python = bare_venv(tmp_path / "env")
    code = machine.run_under(python, "toolkit", ["check", str(ROOT / "envs" / "cu126.yaml")], tmp_path, "verification")
    assert (code, capfd.readouterr().err) == (1, (
        f"error: {python}: python {HERE} lacks packaging (module 'packaging'), which the toolkit needs, and the "
        f"toolkit's own are for python 3.99 (cpython-399-x86_64-linux-gnu), not lent across versions (run toolkit "
        f"itself under a python {HERE} that has its dependencies: python{HERE} -m pip install {ROOT})\n"))


def test_the_toolkits_dependencies_are_not_lent_ahead_of_pythonpath(tmp_path, capfd, monkeypatch):
    """A PYTHONPATH the user set still comes before the environment and the lent dependencies."""
    python = bare_venv(tmp_path / "env")
    mine = tmp_path / "mine" / "packaging"
    mine.mkdir(parents=True)
    (mine / "__init__.py").write_text('__version__ = "0.0.2+pythonpath"\n')
    (tmp_path / "which_copies.py").write_text(WHICH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    assert machine.run_under(python, "which_copies", [], tmp_path, "verification") == 0
    assert json.loads(capfd.readouterr().out)["packaging"][0] == "0.0.2+pythonpath"
    assert os.environ["PYTHONPATH"] == str(tmp_path / "mine")  # the parent's own environment untouched

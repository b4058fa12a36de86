"""verify and bench re-run under a line's python (toolkit/verify/machine.py run_under): a pypi line's venv holds the
line's packages only, so the toolkit's own dependencies are lent behind them, to the toolkit's code only.

The venvs here are real (`python -m venv --without-pip`, empty, as a pypi line's venv is of everything but the
line's wheels). The toolkit runs from a copy of its package in a folder of its own with a `torch` beside it, as a
non-editable install of the toolkit (with its verify extra) lays it out in its site-packages. The `packaging` copied
into a venv is this interpreter's real package with its __version__ line changed, and every `torch` here is a
one-line module saying whose it is (NOT REAL: neither was ever published), so the test can tell which copy was
imported.
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
import pytest
from conftest import missing

from toolkit.verify import machine

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"

# A module of the toolkit, run under the line's python: the line's own code first (`linecode`, in the venv), then
# what the measuring code imports; prints what each import resolved to.
WHICH = """
import importlib.util, json, sys, linecode, torch, packaging, rich.progress, yaml
from toolkit.attention import recommend
from toolkit.knowledge import files
files.read("gpus.yaml")
print(json.dumps({"packaging": [packaging.__version__, packaging.__file__], "yaml": yaml.__file__,
                  "rich": rich.__file__, "pydantic": sys.modules["pydantic"].__file__, "torch": torch.WHOSE,
                  "line's code found": linecode.FOUND,
                  "pytest": importlib.util.find_spec("pytest") is not None,
                  "requests": importlib.util.find_spec("requests") is not None}))
"""
# The line's own code: optional imports, as a library makes them.
LINECODE = """
import importlib
FOUND = {}
for name in ("yaml", "requests", "rich"):
    try:
        importlib.import_module(name)
        FOUND[name] = True
    except ImportError:
        FOUND[name] = False
"""


def bare_venv(where: Path, python: str = sys.executable) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python"


def site_of(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())


def fake_torch(site: Path, whose: str) -> None:
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(f"WHOSE = {whose!r}\n")


@pytest.fixture
def installed(tmp_path, monkeypatch) -> Path:
    """The toolkit installed as a wheel installs it (its package in a site-packages, with a torch beside it), the
    probe WHICH one of its modules; run_under runs this copy. Returns that site-packages."""
    site = tmp_path / "toolkit-site"
    shutil.copytree(ROOT / "toolkit", site / "toolkit", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "toolkit" / "which_copies.py").write_text(WHICH)
    fake_torch(site, "the toolkit's")
    monkeypatch.setattr(machine, "PROJECT_ROOT", site)
    monkeypatch.chdir(tmp_path)
    return site


def line_venv(where: Path) -> Path:
    """A line's venv with its own torch and the line's code."""
    python = bare_venv(where)
    fake_torch(site_of(python), "the line's")
    (site_of(python) / "linecode.py").write_text(LINECODE)
    return python


def test_a_bare_venv_runs_the_measuring_module_up_to_its_need_of_torch(tmp_path, capfd):
    """Before: ModuleNotFoundError: No module named 'packaging' (then yaml, rich, pydantic) in the line's venv."""
    python = bare_venv(tmp_path / "env")
    code = machine.run_under(python, "toolkit.verify", ["cu126", "--report-dir", str(tmp_path / "reports")], tmp_path,
                             "verification")
    out, err = capfd.readouterr()
    assert (code, out, err) == (1, "", f"error: {python}: torch is not importable here (install the line's environment, "
                                       f"or pass --python PATH of one that has torch and flash-attn)\n")


def test_the_environments_own_packages_win_and_only_the_runners_dependencies_are_lent(tmp_path, capfd, installed):
    """The line's torch, not the one installed beside the toolkit (before: the toolkit's folder went first on
    PYTHONPATH); the venv's packaging; PyYAML, rich and pydantic lent from the toolkit's own; requests, a dependency
    of the toolkit that the measuring code never imports, not lent (before: 78 modules were)."""
    assert importlib.util.find_spec("requests") is not None and importlib.util.find_spec("pytest") is not None
    python = line_venv(tmp_path / "env")
    theirs = site_of(python) / "packaging"
    shutil.copytree(Path(packaging.__file__).parent, theirs)
    init = theirs / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{packaging.__version__}"', '__version__ = "0.0.1+env"'))
    assert machine.run_under(python, "toolkit.which_copies", [], tmp_path, "verification") == 0
    seen = json.loads(capfd.readouterr().out)
    assert seen["torch"] == "the line's"
    assert seen["packaging"] == ["0.0.1+env", str(init)]
    lent = Path(str(metadata.distribution("PyYAML").locate_file(""))).resolve()
    assert all(Path(seen[name]).resolve().is_relative_to(lent) for name in ("yaml", "rich", "pydantic"))
    assert (seen["pytest"], seen["requests"]) == (False, False)  # a test extra, a dependency the runner never imports


def test_the_lines_own_code_is_lent_nothing(tmp_path, capfd, installed):
    """An optional import in the line's code finds what the venv has, as in use: not PyYAML or rich, which the
    runner is lent, nor requests (before: all three imported)."""
    python = line_venv(tmp_path / "env")
    assert machine.run_under(python, "toolkit.which_copies", [], tmp_path, "verification") == 0
    assert json.loads(capfd.readouterr().out)["line's code found"] == {"yaml": False, "requests": False, "rich": False}


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


@pytest.mark.python312
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


def test_the_toolkits_dependencies_are_not_lent_ahead_of_pythonpath(tmp_path, capfd, monkeypatch, installed):
    """A PYTHONPATH the user set still comes before the environment and the lent dependencies."""
    python = line_venv(tmp_path / "env")
    mine = tmp_path / "mine" / "packaging"
    mine.mkdir(parents=True)
    (mine / "__init__.py").write_text('__version__ = "0.0.2+pythonpath"\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    assert machine.run_under(python, "toolkit.which_copies", [], tmp_path, "verification") == 0
    assert json.loads(capfd.readouterr().out)["packaging"][0] == "0.0.2+pythonpath"
    assert os.environ["PYTHONPATH"] == str(tmp_path / "mine")  # the parent's own environment untouched


@pytest.mark.torch
def test_torchs_numpy_warning_never_comes_before_verifys_answer(tmp_path):
    """A line's venv without numpy: torch's import warns "Failed to initialize NumPy" (seen here with numpy hidden,
    as torch itself reports it), which printed before verify's one line and read as its cause."""
    pytest.importorskip("torch")
    code = ("import sys; sys.modules['numpy'] = None\n"
            "{first}import torch\n"
            "print('imported')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bare = subprocess.run([sys.executable, "-c", code.format(first="")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert "Failed to initialize NumPy" in bare.stderr  # the warning is real: torch gives it without the toolkit
    under = subprocess.run([sys.executable, "-c", code.format(first="import toolkit.verify\n")], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    assert under.stdout == "imported\n" and "NumPy" not in under.stderr, under.stderr

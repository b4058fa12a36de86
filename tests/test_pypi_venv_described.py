"""`toolkit doctor LINE` and `toolkit modules` on a pypi line: its venv (bin/python, CUDA_HOME in site-packages/nvidia/cu13,
the machine's gcc), not a conda prefix.

The venv is made by the real VenvBuild.make (tests/test_hostile_pypi_install.py's small wheels: RECORD hashes from
hashlib). NOT REAL: the nvidia-cuda-nvcc wheel holds a stand-in nvcc script, not NVIDIA's binary (its version,
13.0.88, is the lock's: locks/py-cu130.conda-lock.yml), and torch and flash-attn are dist-info only, as
tests/test_modules.py's add_dist leaves them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import yaml
from module_systems import MISSING, SYSTEMS
from rich.console import Console
from test_hostile_pypi_install import wheel
from test_modules import add_dist

import toolkit.cli
from toolkit.doctor.command import evaluate, gather
from toolkit.env.install_record import PrefixRecord
from toolkit.env.pypi_install import VenvBuild
from toolkit.knowledge.facts import load_knowledge

ROOT = Path(__file__).resolve().parent.parent
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
LINE = "py-cu130"
NVCC = next(p["version"] for p in yaml.safe_load((ROOT / "locks" / f"{LINE}.conda-lock.yml").read_text())["package"]
            if p["name"] == "nvidia-cuda-nvcc")
pytestmark = pytest.mark.skipif(PY != yaml.safe_load((ROOT / "envs" / f"{LINE}.yaml").read_text())["python"],
                                reason=f"{LINE}'s venv is made with this python, which must be the line's")


def pypi_venv(prefix: Path) -> Path:
    """The line's venv as `toolkit install` leaves it (made in staging, record written, moved in), plus the
    torch and flash-attn `pip install` would add."""
    wheels = prefix.parent / "wheels"
    packages = (wheel(wheels, "nvidia-cuda-nvcc", NVCC, {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n"}),
                wheel(wheels, "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"\0"}))
    pypi = load_knowledge().pypi
    staging = prefix.parent / "staging" / prefix.name
    written = VenvBuild(Path(sys.executable), PY, packages, pypi.lines["13.0.3"], pypi.cuda_home).make(
        staging, prefix, Console(quiet=True))
    PrefixRecord(LINE, "lock", "linux-64", "0" * 64, "0" * 64, str(prefix), written).write(staging)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(prefix)
    site = prefix / "lib" / f"python{PY}" / "site-packages"
    add_dist(site, "torch", "2.14.1")
    add_dist(site, "flash_attn", "2.8.3.post2+cu130torch2.14", package=True)
    return prefix


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def toolkit_run(capsys, *args: str) -> tuple[int, str]:
    code = toolkit.cli.main([*args, "--envs", str(ROOT / "envs"), "--locks", str(ROOT / "locks")])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_modules_writes_the_venv_and_its_cuda_home(project, capsys):
    venv = pypi_venv(project / ".envs" / LINE)
    home = venv / "lib" / f"python{PY}" / "site-packages" / "nvidia" / "cu13"
    code, output = toolkit_run(capsys, "modules", LINE, "--root", str(project / "mods"), "--format", "lmod")
    assert code == 0, output
    lua = (project / "mods" / "lmod" / "flash-attn" / f"2.8.3.post2-cu130-torch2.14-py{PY.replace('.', '')}.lua").read_text()
    assert (f'prepend_path("PATH", "{venv}/bin")\nprepend_path("PATH", "{home}/bin")\n'
            f'pushenv("FLASH_ATTN_ROOT", "{venv}")\npushenv("CUDA_HOME", "{home}")\npushenv("VIRTUAL_ENV", "{venv}")') in lua
    assert f"  CUDA        {NVCC}\n" in lua and f"Installed in: {venv}/lib/python{PY}/site-packages\n" in lua
    assert (f"Environment:  {venv} (venv installed from the lock's wheels; CUDA from NVIDIA's wheels, gcc the "
            f"machine's)\n") in lua and "CONDA_PREFIX" not in lua


@pytest.fixture(params=sorted(SYSTEMS))
def system(request):
    found = SYSTEMS[request.param]()
    if found is None:
        pytest.skip(MISSING[request.param])
    return found


def test_the_module_loads_the_venvs_python_and_nvcc(project, capsys, system):
    venv = pypi_venv(project / ".envs" / LINE)
    assert toolkit_run(capsys, "modules", LINE, "--root", str(project / "mods"))[0] == 0
    name = f"flash-attn/2.8.3.post2-cu130-torch2.14-py{PY.replace('.', '')}"
    result = system.run(f"""
        module load {name} && command -v nvcc && echo "CUDA_HOME=$CUDA_HOME"
        python -c 'import flash_attn, sys; print("imported", flash_attn.__version__, sys.prefix)'
    """, project / "mods" / system.tree)
    home = venv / "lib" / f"python{PY}" / "site-packages" / "nvidia" / "cu13"
    assert f"{home}/bin/nvcc\nCUDA_HOME={home}\nimported 2.8.3.post2 {venv}\n" in result.stdout, result.stdout


def test_a_missing_venv_is_no_environment_with_the_install_that_makes_it(project, capsys):
    """Before: 'no conda environment here' for a line that has no conda environment at all."""
    code, output = toolkit_run(capsys, "modules", LINE, "--root", str(project / "mods"))
    assert (code, output) == (1, f"error: .envs/{LINE}: no environment here (run `toolkit install {LINE}`, or pass "
                                 f"--env-root/--prefix where it is)\n")
    code, output = toolkit_run(capsys, "modules", LINE, "--root", str(project / "mods"), "--prefix", "sw/fa")
    assert (code, output) == (1, f"error: sw/fa: no environment here (run `toolkit install {LINE} --prefix sw/fa`, "
                                 f"or pass --env-root/--prefix where it is)\n")


def doctor_rows(line: str, prefix: Path | None = None) -> dict:
    args = argparse.Namespace(line=line, fingerprint=None, prefix=prefix, python=None, cache=None, envs=ROOT / "envs",
                              locks=ROOT / "locks",
                              wheelhouse=Path("wheelhouse"))
    facts = gather(args)
    return {row.check: row for row in evaluate(facts)}, facts


def test_doctor_describes_the_venv_and_compares_no_conda_layer(project):
    """Before: a lock-conda row 'no env at .envs/py-cu130' (fix: toolkit install) for an installed venv."""
    venv = pypi_venv(project / ".envs" / LINE)
    rows, facts = doctor_rows(LINE)
    home = venv / "lib" / f"python{PY}" / "site-packages" / "nvidia" / "cu13"
    assert "lock-conda" not in rows
    assert facts.fingerprint.cuda_home == str(home) and facts.fingerprint.python_path == str(venv / "bin" / "python")
    gxx = facts.fingerprint.cxx_path
    compiler = f"the machine's g++ {gxx}" if gxx else "no g++ on PATH (the machine's is used)"
    assert rows["env"].status == "ok" and rows["env"].value == (
        f"venv .envs/{LINE}: python {venv}/bin/python, CUDA_HOME {home} (NVIDIA's wheels), host compiler {compiler}")
    assert rows["cuda-home"].value == f"{home} (from venv .envs/{LINE})"

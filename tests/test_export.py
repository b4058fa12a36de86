"""`toolkit export LINE --index URL --for uv|pip|pixi|requirements` (issue 35 item 4): the snippets a user pastes,
installed by the real uv and pip from a published index served on 127.0.0.1 into fresh environments.

The published wheel is a real `pip wheel` of a stand-in `flash-attn` (module flash_attn, depending on torch) with
a real build record, published by `toolkit publish`. torch itself is gigabytes, so the torch pin is satisfied by a
stand-in `torch` wheel (2.13.0+cu130, no dependencies) on a second local PEP 503 index given as --torch-index and
as the installers' default index: the whole snippet, torch routing included, runs offline with the real tools.
pixi cannot run here (not on PyPI): its snippet is parsed as TOML and its tables and keys checked against pixi's
documented manifest (https://pixi.sh/latest/reference/pixi_manifest/, the pypi-options table and
pypi-dependencies). Expected values come from hashlib, zipfile and the files themselves.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conda_channel import build_simple_index
from test_cache import (
    UV,
    canonical_key,
    demo_record,
    one_error_line,
    serve,
    sha256_of,
    toolchain,
    toolkit,
)

from toolkit.build.wheelhouse import place

pytestmark = pytest.mark.slow

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10 reads TOML through tomli (a dependency there)
    import tomli as tomllib

LINE = "demo"
FA_VERSION = "2.8.3+cu130torch2.13"
TORCH = "2.13.0+cu130"


def pip_wheel(src: Path, out: Path, name: str, version: str, module: str, dependencies: list[str]) -> Path:
    """A real wheel from `pip wheel` of a tiny setuptools project."""
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\nrequires-python = ">=3.9"\n'
        f'dependencies = {json.dumps(dependencies)}\n\n[tool.setuptools]\npackages = ["{module}"]\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--wheel-dir",
                    str(out), str(src)], check=True, capture_output=True)
    (wheel,) = out.glob(f"{module}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return standin_wheels(tmp_path_factory)


def standin_wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the stand-in flash-attn wheel, the stand-in torch wheel)."""
    root = tmp_path_factory.mktemp("wheels")
    fa = pip_wheel(root / "fa-src", root / "out", "flash-attn", FA_VERSION, "flash_attn", ["torch"])
    torch = pip_wheel(root / "torch-src", root / "out", "torch", TORCH, "torch", [])
    return fa, torch


def line_inputs() -> dict:
    return {"recipe": 2, "line": LINE, "spec_input_hash": "0" * 64, "lock_sha256": "1" * 64, "archs": ["90"],
            "toolchain": toolchain(kind="external", nvcc="13.0.88", gcc="13.3.0", torch=TORCH, torch_cuda="13.0",
                                   python_version="3.11.9"),
            "local_version": "cu130torch2.13"}


@dataclasses.dataclass
class Published:
    index: Path  # the folder publish wrote
    torch_index: Path  # a plain PEP 503 index holding the stand-in torch
    wheel: Path  # the published flash-attn wheel (the publisher's wheelhouse copy)
    record: Path


@pytest.fixture
def published(tmp_path: Path, wheels: tuple[Path, Path]) -> Published:
    return publish_standin(tmp_path, wheels)


def publish_standin(tmp_path: Path, wheels: tuple[Path, Path]) -> Published:
    """The stand-in flash-attn with a real build record and verify report, published by `toolkit publish`; the
    stand-in torch on a plain PEP 503 index beside it."""
    fa, torch = wheels
    root = tmp_path / "publisher"
    record = demo_record(fa, line_inputs())
    record = dataclasses.replace(record, outputs=dataclasses.replace(record.outputs, version=FA_VERSION))
    wheel = place(fa, root / "wheelhouse" / LINE, record)
    (root / "reports" / LINE).mkdir(parents=True)
    (root / "reports" / LINE / "verify.json").write_text('{"kind": "verify", "summary": {"failed": 0}}\n')
    done = toolkit(root, "publish", LINE, "--to", str(tmp_path / "index"))
    assert done.returncode == 0, done.stderr
    build_simple_index(tmp_path / "torch-index", [torch])
    return Published(tmp_path / "index", tmp_path / "torch-index", wheel, Path(f"{wheel}.build.json"))


def export(cwd: Path, url: str, form: str, *extra: str) -> str:
    done = toolkit(cwd, "export", LINE, "--index", url, "--for", form, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def isolated(tmp_path: Path, default_index: str) -> dict[str, str]:
    """The installers' own settings off, their caches in tmp_path, and their default index the local torch
    index (standing in for PyPI: nothing is fetched from the internet)."""
    return {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
            "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "UV_DEFAULT_INDEX": default_index, "PIP_INDEX_URL": default_index, "UV_PYTHON": sys.executable,
            "UV_PYTHON_DOWNLOADS": "never"}


def imported(python: Path) -> tuple[str, str, str]:
    """flash_attn's version and file, torch's version, as the environment's own python imports them."""
    done = subprocess.run([str(python), "-c", "import flash_attn, torch; "
                           "print(flash_attn.__version__, flash_attn.__file__, torch.__version__)"],
                          capture_output=True, text=True, check=True)
    version, where, torch = done.stdout.split()
    return version, where, torch


def test_the_uv_snippet_routes_flash_attn_to_the_published_index_and_pins_the_builds_torch(published, tmp_path):
    with serve(published.index) as (url, requested), serve(published.torch_index) as (torch_url, _):
        snippet = export(tmp_path, url, "uv", "--torch-index", f"{torch_url}/simple")
        toml = tomllib.loads(snippet)["tool"]["uv"]
        assert toml["index"] == [{"name": "fa-envkit", "url": f"{url}/simple", "explicit": True},
                                 {"name": "pytorch-cu130", "url": f"{torch_url}/simple", "explicit": True}]
        assert toml["sources"] == {"flash-attn": {"index": "fa-envkit"}, "torch": {"index": "pytorch-cu130"}}
        assert f'uv add "torch==2.13.0" "flash-attn=={FA_VERSION}"' in snippet
        assert f"{published.wheel.name}: sha256 {sha256_of(published.wheel)}; built against torch {TORCH}" in snippet
        assert f"verification report {url}/files/{LINE}/{published.wheel.name.replace('+', '%2B')}.reports/" \
               f"verify.json" in snippet

        # a scratch project: the snippet pasted, the pins added with uv add, synced into a fresh .venv
        project = tmp_path / "scratch"
        project.mkdir()
        (project / "pyproject.toml").write_text('[project]\nname = "scratch"\nversion = "0"\n'
                                                'requires-python = ">=3.11"\ndependencies = []\n\n' + snippet)
        env = isolated(tmp_path, f"{torch_url}/simple")
        env["UV_DEFAULT_INDEX"] = f"{tmp_path.as_uri()}/empty"  # nothing may come from the default index
        (tmp_path / "empty").mkdir()
        for command in (["add", "torch==2.13.0", f"flash-attn=={FA_VERSION}"], ["sync"]):
            done = subprocess.run([str(UV), *command], cwd=project, capture_output=True, text=True, env=env)
            assert done.returncode == 0, done.stderr
        assert any(path.endswith(".whl.metadata") for path in requested)
    lock = tomllib.loads((project / "uv.lock").read_text())
    (fa,) = [p for p in lock["package"] if p["name"] == "flash-attn"]
    assert fa["source"] == {"registry": f"{url}/simple"}
    assert [w["hash"] for w in fa["wheels"]] == [f"sha256:{sha256_of(published.wheel)}"]
    version, where, torch = imported(project / ".venv" / "bin" / "python")
    assert (version, torch) == (FA_VERSION, TORCH) and where.startswith(str(project / ".venv"))


def test_the_pip_snippet_installs_the_published_wheel_by_hash_with_pip_and_uv_pip(published, tmp_path):
    with serve(published.index) as (url, _), serve(published.torch_index) as (torch_url, _):
        snippet = export(tmp_path, url, "pip", "--torch-index", f"{torch_url}/simple")
        lines = [line for line in snippet.splitlines() if not line.startswith("#")]
        assert lines == [f"--extra-index-url {url}/simple", f"flash-attn=={FA_VERSION} \\",
                         f"    --hash=sha256:{sha256_of(published.wheel)}"]
        assert f'pip install "torch==2.13.0" --index-url {torch_url}/simple' in snippet
        requirements = tmp_path / "requirements-flash-attn.txt"
        requirements.write_text(snippet)
        env = isolated(tmp_path, f"{torch_url}/simple")

        subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "pip-env")], check=True)
        pip_python = tmp_path / "pip-env" / "bin" / "python"
        for step in (["torch==2.13.0", "--index-url", f"{torch_url}/simple"], ["-r", str(requirements)]):
            done = subprocess.run([str(pip_python), "-m", "pip", "install", *step], capture_output=True, text=True,
                                  env=env)
            assert done.returncode == 0, done.stderr

        subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(tmp_path / "uv-env")], check=True, env=env)
        uv_python = tmp_path / "uv-env" / "bin" / "python"
        for step in (["torch==2.13.0", "--index-url", f"{torch_url}/simple"], ["-r", str(requirements)]):
            done = subprocess.run([str(UV), "pip", "install", "--python", str(uv_python), *step], capture_output=True,
                                  text=True, env=env)
            assert done.returncode == 0, done.stderr
    for python in (pip_python, uv_python):
        version, _, torch = imported(python)
        assert (version, torch) == (FA_VERSION, TORCH)


def test_the_requirements_snippet_is_pinned_lines_with_hashes_for_any_installer(published, tmp_path):
    with serve(published.index) as (url, _), serve(published.torch_index) as (torch_url, _):
        snippet = export(tmp_path, url, "requirements", "--torch-index", f"{torch_url}/simple")
        lines = [line for line in snippet.splitlines() if not line.startswith("#")]
        assert lines == [f"flash-attn=={FA_VERSION} \\", f"    --hash=sha256:{sha256_of(published.wheel)}"]
        requirements = tmp_path / "requirements.txt"
        requirements.write_text(snippet)
        env = isolated(tmp_path, f"{torch_url}/simple")
        subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(tmp_path / "env")], check=True, env=env)
        python = tmp_path / "env" / "bin" / "python"
        for step in (["torch==2.13.0"], ["--extra-index-url", f"{url}/simple", "-r", str(requirements)]):
            done = subprocess.run([str(UV), "pip", "install", "--python", str(python), *step], capture_output=True,
                                  text=True, env=env)
            assert done.returncode == 0, done.stderr
    assert imported(python)[0] == FA_VERSION


# pixi's documented manifest (https://pixi.sh/latest/reference/pixi_manifest/): the keys of [pypi-options] and
# of a [pypi-dependencies] entry; written out here, independent of the exporter's own lists
PIXI_PYPI_OPTIONS = {"index-url", "extra-index-urls", "find-links", "no-build-isolation", "no-build", "no-binary",
                     "index-strategy"}
PIXI_PYPI_DEPENDENCY = {"version", "extras", "index", "git", "rev", "branch", "tag", "subdirectory", "path",
                        "editable", "url"}


def test_the_pixi_snippet_holds_only_pixis_documented_tables_and_keys(published, tmp_path):
    """pixi cannot run here (it is not on PyPI): the snippet is checked against pixi's documented schema."""
    url = published.index.resolve().as_uri()
    snippet = export(tmp_path, url, "pixi", "--torch-index", "https://mirror.example.org/whl/cu130")
    manifest = tomllib.loads(snippet)
    assert set(manifest) == {"pypi-options", "pypi-dependencies"}
    assert set(manifest["pypi-options"]) <= PIXI_PYPI_OPTIONS
    assert manifest["pypi-options"]["extra-index-urls"] == [f"{url}/simple"]
    for entry in manifest["pypi-dependencies"].values():
        assert set(entry) <= PIXI_PYPI_DEPENDENCY
    assert manifest["pypi-dependencies"] == {
        "torch": {"version": "==2.13.0", "index": "https://mirror.example.org/whl/cu130"},
        "flash-attn": {"version": f"=={FA_VERSION}", "index": f"{url}/simple"}}


def test_the_torch_index_defaults_to_pytorchs_index_of_the_builds_cuda(published, tmp_path):
    snippet = export(tmp_path, published.index.resolve().as_uri(), "uv")
    (torch_index,) = [i for i in tomllib.loads(snippet)["tool"]["uv"]["index"] if i["name"] == "pytorch-cu130"]
    assert torch_index["url"] == "https://download.pytorch.org/whl/cu130"


def _entry(published: Published) -> Path:
    return published.index / "inputs" / f"{canonical_key(line_inputs())}.json"


def test_a_wheel_the_table_does_not_vouch_for_is_refused_in_one_line(published, tmp_path):
    url = published.index.resolve().as_uri()
    entry = _entry(published)
    entry.write_text(entry.read_text().replace(sha256_of(published.wheel), "f" * 64))
    line = one_error_line(toolkit(tmp_path, "export", LINE, "--index", url, "--for", "uv"))
    assert "the table entry pins another sha256 for the wheel than the page" in line and "nothing was exported" in line

    entry.unlink()
    line = one_error_line(toolkit(tmp_path, "export", LINE, "--index", url, "--for", "pip"))
    assert f"{entry.name}: no table entry for {published.wheel.name}'s inputs" in line

    line = one_error_line(toolkit(tmp_path, "export", "other", "--index", url, "--for", "pip"))
    assert "no published wheels of line other" in line
